/* daemon/core/evpub.c — KV events to a Redis Stream (see evpub.h).
 *
 * Layer: core, beside events.c and rtier.c: reads the cache's event ring
 * and the configuration, calls the remote layer (remote_command), whose
 * answer comes back through remote_cmd.done on the loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "evpub.h"
#include "remote.h"

struct evpub {
	struct cache *c;
	char key[CONFIG_REMOTE_EVENTS_MAX];
	char machine[65];
	struct kv_ring *ring; /* the ring of every event */
	uint64_t next;	      /* its seq to look at next */
	int inflight;
	struct remote_cmd cmd;
	char *buf; /* [EVPUB_BATCH + 1][EVPUB_ENTRY_MAX]: the formatted commands */
	const char *cmds[EVPUB_BATCH + 1];
	size_t lens[EVPUB_BATCH + 1];
	uid_t scope_uid; /* the scope last made (scope_ok) */
	int scope_ok;	 /* 1: scope is scope_uid's, -1: scope_uid has no name */
	char scope[33];
	struct evpub_stats st;
};

static void hex16(const uint8_t b[16], char out[33])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++) {
		out[2 * i] = digits[b[i] >> 4];
		out[2 * i + 1] = digits[b[i] & 15];
	}
	out[32] = 0;
}

static void hash_hex(XXH128_hash_t h, char out[33])
{
	XXH128_canonical_t can;

	XXH128_canonicalFromHash(&can, h);
	hex16(can.digest, out);
}

/* One RESP bulk string at *at in buf (room: end). */
static void bulk(char *buf, size_t *at, size_t end, const char *s)
{
	size_t len = strlen(s);
	int n;

	if (*at >= end)
		return; /* an earlier string did not fit */
	n = snprintf(buf + *at, end - *at, "$%zu\r\n", len);
	if (n < 0 || *at + (size_t)n + len + 2 > end) {
		*at = end + 1; /* does not fit: the caller drops the entry */
		return;
	}
	*at += (size_t)n;
	memcpy(buf + *at, s, len);
	memcpy(buf + *at + len, "\r\n", 2);
	*at += len + 2;
}

/* The XADD of fields[0..2n) into slot i of the batch. Returns 0, or -1
 * when it does not fit in EVPUB_ENTRY_MAX. */
static int format_entry(struct evpub *e, unsigned int i, const char *const *fields, unsigned n)
{
	char *out = e->buf + (size_t)i * EVPUB_ENTRY_MAX, maxlen[16];
	size_t at = 0;
	int k = snprintf(out, EVPUB_ENTRY_MAX, "*%u\r\n", 6 + 2 * n);

	at = (size_t)k;
	snprintf(maxlen, sizeof(maxlen), "%u", EVPUB_MAXLEN);
	bulk(out, &at, EVPUB_ENTRY_MAX, "XADD");
	bulk(out, &at, EVPUB_ENTRY_MAX, e->key);
	bulk(out, &at, EVPUB_ENTRY_MAX, "MAXLEN");
	bulk(out, &at, EVPUB_ENTRY_MAX, "~");
	bulk(out, &at, EVPUB_ENTRY_MAX, maxlen);
	bulk(out, &at, EVPUB_ENTRY_MAX, "*");
	for (unsigned int f = 0; f < 2 * n; f++)
		bulk(out, &at, EVPUB_ENTRY_MAX, fields[f]);
	if (at > EVPUB_ENTRY_MAX)
		return -1;
	e->cmds[i] = out;
	e->lens[i] = at;
	return 0;
}

/* The scope of uid's tenant in hex, or NULL when uid has no name. */
static const char *scope_of(struct evpub *e, uid_t uid)
{
	char name[CONFIG_REMOTE_TENANT_MAX + 1];
	uint8_t d[16];

	if (e->scope_ok && e->scope_uid == uid)
		return e->scope_ok > 0 ? e->scope : NULL;
	e->scope_uid = uid;
	e->scope_ok = -1;
	if (!config_remote_tenant(e->c->cfg, uid, name, sizeof(name)))
		return NULL;
	remote_scope_digest(name, d);
	hex16(d, e->scope);
	e->scope_ok = 1;
	return e->scope;
}

static void cmd_done(struct remote_cmd *q)
{
	struct evpub *e = q->user;

	e->inflight = 0;
	e->st.published += q->n_ok;
	e->st.failed += q->n - q->n_ok;
	evpub_pump(e->c); /* what came meanwhile */
}

int evpub_start(struct cache *c)
{
	struct evpub *e;

	if (!c->remote || !c->cfg->remote_events[0])
		return 0;
	e = calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->buf = malloc((size_t)(EVPUB_BATCH + 1) * EVPUB_ENTRY_MAX);
	if (!e->buf || kv_events_subscribe(&c->events, 1, 0, &e->ring) < 0) {
		free(e->buf);
		free(e);
		return -ENOMEM;
	}
	e->c = c;
	snprintf(e->key, sizeof(e->key), "%s", c->cfg->remote_events);
	if (gethostname(e->machine, sizeof(e->machine) - 1) < 0 || !e->machine[0])
		snprintf(e->machine, sizeof(e->machine), "unknown");
	e->next = e->ring->next;
	c->evpub = e;
	return 0;
}

static const char *kind_name(uint8_t kind)
{
	return kind == KV_EVENT_STORED	  ? "stored"
	       : kind == KV_EVENT_REMOVED ? "removed"
					  : "cleared";
}

void evpub_pump(struct cache *c)
{
	struct evpub *e = c->evpub;
	const struct kv_ring *ring;
	uint64_t oldest, seq;
	unsigned int n = 0;

	if (!e || e->inflight || e->next == e->ring->next)
		return;
	ring = e->ring;
	oldest = kv_ring_oldest(ring);
	if (e->next < oldest) {
		char count[24];
		const char *f[] = {"machine", e->machine, "kind", "lost", "count", count};

		snprintf(count, sizeof(count), "%llu", (unsigned long long)(oldest - e->next));
		e->st.lost += oldest - e->next;
		e->next = oldest;
		n += format_entry(e, n, f, 3) == 0;
	}
	for (seq = e->next; seq < ring->next && n < EVPUB_BATCH; seq++) {
		const struct kv_event *k = kv_ring_at(ring, seq);
		const char *scope = scope_of(e, k->uid);
		char hash[33], parent[33];
		char id[24];
		/* The pool's id means nothing elsewhere (its hash chains do:
		 * they name the model and layout); it ties a machine's stored,
		 * removed and cleared events of one pool together. */
		const char *f[14] = {"machine", e->machine, "kind", kind_name(k->kind),
				     "scope",	scope,	    "pool", id};
		unsigned int nf = 4;

		if (!scope)
			continue; /* a uid without a tenant name: local only */
		snprintf(id, sizeof(id), "%llu", (unsigned long long)k->pool_id);
		if (k->kind != KV_EVENT_CLEARED) {
			hash_hex(k->hash, hash);
			f[2 * nf] = "hash";
			f[2 * nf + 1] = hash;
			nf++;
			if (k->has_parent) {
				hash_hex(k->parent, parent);
				f[2 * nf] = "parent";
				f[2 * nf + 1] = parent;
				nf++;
			}
			f[2 * nf] = "tier";
			f[2 * nf + 1] = k->tier == KV_EVENT_DISK ? "disk" : "host";
			nf++;
		}
		if (format_entry(e, n, f, nf) == 0)
			n++;
	}
	e->next = seq;
	if (!n)
		return;
	memset(&e->cmd, 0, sizeof(e->cmd));
	e->cmd.key = e->key;
	e->cmd.key_len = strlen(e->key);
	e->cmd.cmds = e->cmds;
	e->cmd.lens = e->lens;
	e->cmd.n = n;
	e->cmd.done = cmd_done;
	e->cmd.user = e;
	e->inflight = 1;
	if (remote_command(c->remote, &e->cmd) < 0) {
		e->inflight = 0;
		e->st.failed += n;
	}
}

int evpub_busy(const struct cache *c)
{
	return c->evpub && c->evpub->inflight;
}

void evpub_stop(struct cache *c)
{
	struct evpub *e = c->evpub;

	if (!e)
		return;
	kv_events_unsubscribe(&c->events, e->ring);
	free(e->buf);
	free(e);
	c->evpub = NULL;
}

void evpub_stats(const struct cache *c, struct evpub_stats *ret)
{
	*ret = c->evpub ? c->evpub->st : (struct evpub_stats){0};
}
