/* client/api/client.c — the client handle: connecting to kvpalaced, the
 * Hello handshake, ping and disconnecting.
 *
 * Layer: api, the top of libkvpalace (client/README.md): it uses base/
 * for the socket, rpc/ for the Hello and handle/ to free the pools on
 * disconnect.
 *
 * kvp_connect() opens the socket (conn_open) and performs the Hello
 * handshake, which tells the client the daemon's message cap and how many
 * tokens one request may carry; the library then splits long token lists
 * by that number. kvp_disconnect() closes the socket first (the daemon
 * then frees every lease and reservation of the connection) and frees
 * every handle opened through the client. Library code: never logs. Not
 * thread-safe: one thread at a time per client.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "conn.h"
#include "handle.h"
#include "rpc.h"

/* Bytes of a request besides its packed tokens: frame header, request id,
 * operation tag and length, pool/session/lease ids, the tokens' tag and
 * length. Generous on purpose. */
#define CLIENT_REQUEST_OVERHEAD_BYTES 128u
/* A packed uint32 (token id or page slot) takes at most five bytes on the
 * wire. */
#define CLIENT_TOKEN_WIRE_BYTES 5u

/* Sends a Hello and checks the reply; on the first one also learns the
 * daemon's limits. */
static int client_hello(struct kvp_client *c, int first)
{
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__HelloRequest hello = KVPALACE__V1__HELLO_REQUEST__INIT;
	Kvpalace__V1__Response *resp;
	const Kvpalace__V1__HelloResponse *h;
	uint32_t fit;
	int ret;

	hello.protocol_version = KVP_PROTOCOL_VERSION;
	hello.client_name = program_invocation_short_name;
	req.op_case = KVPALACE__V1__REQUEST__OP_HELLO;
	req.hello = &hello;
	ret = rpc_call(c, &req, KVPALACE__V1__RESPONSE__OP_HELLO, &resp, NULL);
	if (ret == -EOPNOTSUPP && first) {
		char why[CONN_ERR_MSG_BYTES];

		memcpy(why, c->err_msg, sizeof(why));
		return conn_break(c, -EPROTONOSUPPORT, "kvpalaced refused protocol version %u: %s",
				  KVP_PROTOCOL_VERSION, why);
	}
	if (ret < 0)
		return ret;
	h = resp->hello;
	if (h->protocol_version != KVP_PROTOCOL_VERSION)
		return conn_break(c, -EPROTONOSUPPORT,
				  "kvpalaced speaks protocol version %u, this library %u",
				  h->protocol_version, KVP_PROTOCOL_VERSION);
	c->match_continues = h->has_match_continues && h->match_continues;
	if (!first)
		return 0;
	if (h->max_message_bytes < FRAME_MIN_MAX_BYTES ||
	    h->max_message_bytes > FRAME_MAX_MAX_BYTES || !h->max_tokens_per_request)
		return conn_break(c, -EPROTO,
				  "kvpalaced announced unusable limits (%u bytes, %u tokens)",
				  h->max_message_bytes, h->max_tokens_per_request);
	c->max_message_bytes = h->max_message_bytes;
	fit = (h->max_message_bytes - CLIENT_REQUEST_OVERHEAD_BYTES) / CLIENT_TOKEN_WIRE_BYTES;
	c->chunk_tokens = h->max_tokens_per_request < fit ? h->max_tokens_per_request : fit;
	/* A reply's fixed fields are no bigger than a request's, so a reply
	 * has room for as many page slots as a request for tokens; a daemon
	 * that bounds a commit's pages would bound them by its per-request
	 * count too. */
	c->reply_pages = c->chunk_tokens;
	snprintf(c->server_version, sizeof(c->server_version), "%s",
		 h->server_version ? h->server_version : "");
	c->admin = !!h->admin;
	c->uid = h->uid;
	c->gpu = h->has_gpu && h->gpu;
	return 0;
}

KVP_PUBLIC int kvp_connect(const char *path, kvp_client **ret_client)
{
	struct kvp_client *c;
	int ret;

	if (!ret_client)
		return -EINVAL;
	ret = conn_open(path, &c);
	if (ret < 0)
		return ret;
	ret = client_hello(c, 1);
	if (ret < 0)
		goto fail;
	*ret_client = c;
	return 0;
fail:
	conn_free(c);
	return ret;
}

KVP_PUBLIC void kvp_disconnect(kvp_client *c)
{
	if (!c)
		return;
	/* Closing the socket first makes the daemon drop our leases and
	 * reservations; the handles then need no round trips. */
	conn_close(c);
	while (!list_empty(&c->pools))
		handle_pool_free(list_entry(c->pools.next, struct kvp_pool, link));
	conn_free(c);
}

KVP_PUBLIC int kvp_ping(kvp_client *c)
{
	int ret;

	if (!c)
		return -EINVAL;
	conn_clear_error(c);
	ret = conn_usable(c);
	if (ret < 0)
		return ret;
	return client_hello(c, 0);
}

KVP_PUBLIC int kvp_is_admin(const kvp_client *c)
{
	return c ? c->admin : 0;
}

KVP_PUBLIC const char *kvp_version(unsigned int *ret_major, unsigned int *ret_minor,
				   unsigned int *ret_patch)
{
	unsigned int v[3] = {0, 0, 0};

	/* KVP_VERSION is meson's project version, "major.minor.patch". */
	sscanf(KVP_VERSION, "%u.%u.%u", &v[0], &v[1], &v[2]);
	if (ret_major)
		*ret_major = v[0];
	if (ret_minor)
		*ret_minor = v[1];
	if (ret_patch)
		*ret_patch = v[2];
	return KVP_VERSION;
}

KVP_PUBLIC const char *kvp_server_version(const kvp_client *c)
{
	return c ? c->server_version : NULL;
}
