/* kvpalace.h — libkvpalace, the client library of the kvpalace KV-cache daemon.
 *
 * kvpalaced keeps the attention KV cache of LLM inference processes on one
 * machine so that a prefix computed by one process (a system prompt, a
 * document, earlier turns) is reused by the others instead of recomputed.
 * The daemon owns the metadata; clients own the numbers: they write K/V
 * straight into shared-memory pages the daemon lends them and read K/V
 * straight from pages the daemon pins for them. Nothing is copied on the
 * way.
 *
 * Typical use:
 *
 *	kvp_client *c;   kvp_pool *p;   kvp_session *s;
 *	kvp_connect(NULL, &c);                     // $KVPALACE_SOCKET or default
 *	kvp_pool_open(c, "llama-3-8b", &layout, &p);
 *	kvp_session_create(p, &s);
 *	kvp_append(s, tokens, n);                  // reserve slots
 *	for each new position, layer, head:        // write K and V in place
 *		memcpy(kvp_session_kv(s, pos, layer, 0, head), k, row_bytes);
 *		memcpy(kvp_session_kv(s, pos, layer, 1, head), v, row_bytes);
 *	kvp_commit(s, n);                          // publish
 *
 * and in another process:
 *
 *	kvp_match_prefix(p, prompt, n, &lease);    // longest cached prefix
 *	for pos < kvp_lease_tokens(lease): read kvp_lease_kv(lease, pos, ...)
 *	kvp_lease_release(lease);
 *
 * Errors: every fallible function returns 0 (or a count) on success and a
 * negative errno on failure; out-parameters are written only on success.
 * Errors that any call talking to the daemon may return, besides those it
 * lists:
 *   -ENOTCONN   the connection was lost earlier (every later call fails so)
 *   -EPIPE, -ECONNRESET   the daemon went away during the call
 *   -EPROTO     the daemon's reply was malformed; the connection is closed
 *   -ENOMEM     out of memory in this process or in the daemon
 *   -EIO        the daemon failed internally
 * kvp_strerror() gives a message for the last error the daemon sent.
 *
 * Threads: a kvp_client and everything opened through it (pools, sessions,
 * leases) must be used by one thread at a time; use one client per thread
 * for parallelism. Different clients are independent.
 *
 * fork(): a client belongs to the process that connected it. In a child
 * (fork(), Python's multiprocessing with the "fork" start method) every
 * call that talks to the daemon fails with -ECHILD, since parent and child
 * would share one socket and read each other's replies; the child calls
 * kvp_connect() for a client of its own (and may kvp_disconnect() the
 * inherited one, which closes only the child's copy of the socket: the
 * parent's connection, leases and sessions are untouched). Pointers into
 * the arenas stay valid in the child as in the parent, for as long as
 * the parent holds what they point to.
 *
 * Lifetime: closing the client (kvp_disconnect) ends every lease and every
 * uncommitted reservation it holds, closes every session it created
 * (kvp_session_create, kvp_session_fork, kvp_lease_fork,
 * kvp_session_restore) or adopted that is not persistent, and unmaps its
 * arenas. A process that dies has the same effect: the daemon notices the
 * connection close, and logs what the client left behind. What a session
 * committed is not lost with it: its full pages stay in the pool's prefix
 * index, where any process of the pool matches them (kvp_match_prefix,
 * kvp_lease_fork) — sharing between processes goes through the index, not
 * through a session. A persistent session (kvp_session_create_persistent,
 * kvp_session_set_persistent) outlives its client: it stays in the daemon,
 * reachable by its id (kvp_session_adopt, kvp_admin_checkpoint, the admin
 * socket), until it is closed or, once no open connection owns it, until
 * it has gone unused for the daemon's session-idle-timeout (default one
 * hour; kvpalaced.conf(5)).
 */
#ifndef KVPALACE_H
#define KVPALACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_PUBLIC __attribute__((visibility("default")))

/* Protocol version this library speaks. */
#define KVP_PROTOCOL_VERSION 1

typedef struct kvp_client kvp_client;
typedef struct kvp_pool kvp_pool;
typedef struct kvp_session kvp_session;
typedef struct kvp_lease kvp_lease;

/* Element types of K/V. Values are part of the protocol. */
enum kvp_dtype {
	KVP_DTYPE_F16 = 1,
	KVP_DTYPE_BF16 = 2,
	KVP_DTYPE_F32 = 3,
	KVP_DTYPE_INT8 = 4,	/* with f16 scales per quant_group elements */
	KVP_DTYPE_FP8_E4M3 = 5, /* with f16 scales per quant_group elements */
	KVP_DTYPE_INT4 = 6,	/* two per byte, low nibble first; f16 scales */
	/* An engine's own fp8 cache (vLLM kv_cache_dtype fp8, fp8_e4m3,
	 * fp8_e5m2): one byte per element, scaled by the engine's per-layer
	 * k_scale / v_scale. quant_group 0. Pages keep, after the data,
	 * scales[layer][k|v] (latent: scales[layer]) as f32, written by the
	 * writer like the data (kvp_page_view.scales) and read back with it.
	 * kvpalace stores these bytes exactly as written: never converted,
	 * spilled to disk and checkpointed as they are (a daemon's
	 * spill-dtype and a quantized checkpoint do not apply to them).
	 * The scales are not part of the pool's identity: an engine may
	 * learn them only at its first forward pass (vLLM's
	 * calculate_kv_scales), after it opened the pool, and they are not
	 * known when a scheduler looks a prefix up. So the READER COMPARES:
	 * before using a matched page, read its scales and treat a page
	 * written under other scales than yours as a miss (or rescale);
	 * kvpalace serves the bytes and the scales they were written under,
	 * never one without the other. */
	KVP_DTYPE_E4M3_RAW = 7,
	KVP_DTYPE_E5M2_RAW = 8,
};

/* Page formats (struct kvp_layout.format). Values are part of the protocol. */
enum kvp_format {
	/* K and V per KV head: data[layer][k=0|v=1][kv_head][token][head_dim] */
	KVP_FORMAT_KV = 0,
	/* An opaque per-token vector per layer, no K and V (MLA latents:
	 * DeepSeek-V2/V3, Kimi: kv_lora_rank + qk_rope_head_dim elements):
	 * data[layer][token][head_dim], n_kv_heads 1, head_dim the latent
	 * width. kv is 0 wherever a call takes one (K/V calls with kv 1 fail).
	 * Pages are half the bytes of the same width stored as K and V. */
	KVP_FORMAT_LATENT = 1,
};

/* The shape of one model's KV cache. A page holds block_tokens tokens of
 * every layer laid out as
 *   data[layer][k=0|v=1][kv_head][token][head_dim]   (format KVP_FORMAT_KV)
 *   data[layer][token][head_dim]                     (format KVP_FORMAT_LATENT)
 * then, for quantized types, scales[layer][k|v][kv_head][token][head_dim/quant_group]
 * as f16 (latent: scales[layer][token][head_dim/quant_group]), for the raw
 * fp8 types scales[layer][k|v] (latent: [layer]) as f32, padded to a
 * multiple of 4096 bytes. Every field is part of the pool's identity: two
 * layouts differing in any (format and dtype included) never share a pool
 * or a page. A layout zeroed then filled ({...} of the first six fields)
 * is the KV format. */
struct kvp_layout {
	uint32_t n_layers;     /* 1..1024 */
	uint32_t n_kv_heads;   /* 1..1024, KV heads (GQA/MQA); 1 for latent */
	uint32_t head_dim;     /* 1..1024; the latent width for latent */
	uint32_t block_tokens; /* 1..4096, tokens per page */
	uint32_t dtype;	       /* enum kvp_dtype */
	uint32_t quant_group;  /* divides head_dim for quantized types, else 0 */
	uint32_t format;       /* enum kvp_format; 0: K and V */
};

/* ---- connection --------------------------------------------------------- */

/* Connects to the daemon at socket path `path`; NULL means
 * $KVPALACE_SOCKET, else the default path (kvp_default_socket_path()).
 * Performs the version handshake.
 * Errors: -ENOENT/-ECONNREFUSED no daemon listens there; -EACCES no
 * permission on the socket; -EDQUOT the daemon refused the connection:
 * too many are open (its max-connections, or max-connections-per-user
 * for this user);
 * -EPROTONOSUPPORT the daemon speaks another protocol version;
 * -ENAMETOOLONG path too long for a Unix socket. */
KVP_PUBLIC int kvp_connect(const char *path, kvp_client **ret_client);

/* Closes the connection: ends the client's leases and uncommitted
 * reservations in the daemon, closes its sessions that are not persistent
 * (their committed full pages stay in the prefix index), and frees every
 * pool, session and lease handle opened through it (they must not be used
 * afterwards). NULL is accepted. */
KVP_PUBLIC void kvp_disconnect(kvp_client *c);

/* The default client socket path: $XDG_RUNTIME_DIR/kvpalace/kvpalace.sock
 * when a socket is there (a daemon the user runs, which binds there by
 * default), else /run/kvpalace/kvpalace.sock, the packaged service's (for
 * root, without XDG_RUNTIME_DIR, or with no socket under it). kvp_connect
 * on the default path also tries the service's when the user's socket
 * refuses the connection (left behind by a daemon that ended). Writes at most n bytes (NUL included) to buf and returns the length the
 * full path needs (as snprintf). kvp_default_admin_socket_path() gives the
 * admin socket (admin.sock in the same directory). */
KVP_PUBLIC int kvp_default_socket_path(char *buf, size_t n);
KVP_PUBLIC int kvp_default_admin_socket_path(char *buf, size_t n);

/* This library's version, "major.minor.patch" (also in the three
 * pointers, each may be NULL): the version it was built as, whatever
 * header the caller compiled against. The protocol it speaks is
 * KVP_PROTOCOL_VERSION. */
KVP_PUBLIC const char *kvp_version(unsigned int *ret_major, unsigned int *ret_minor,
				   unsigned int *ret_patch);

/* The daemon's version as its Hello reply gave it ("kvpalaced 0.1.0"):
 * valid as long as the client; NULL for a NULL client. */
KVP_PUBLIC const char *kvp_server_version(const kvp_client *c);

/* Round trip to the daemon (a Hello). Returns 0. */
KVP_PUBLIC int kvp_ping(kvp_client *c);

/* True (1) when the connection came in on the daemon's admin socket. */
KVP_PUBLIC int kvp_is_admin(const kvp_client *c);

/* The message the daemon gave with its last error reply on this client, or
 * a generic text for err when there was none. Valid until the next call on
 * the client. */
KVP_PUBLIC const char *kvp_strerror(const kvp_client *c, int err);

/* ---- pools -------------------------------------------------------------- */

/* The KV layout of a common open model by name, from its published
 * config.json (num_hidden_layers, num_key_value_heads, head_dim or
 * hidden_size / num_attention_heads): "llama-3-8b", "llama-3-70b",
 * "llama-3.1-405b", "mistral-7b", "qwen2.5-72b", "gemma-2-9b", ... and
 * the test model "stories260k", and the MLA models "deepseek-v2-lite" and
 * "deepseek-v3" (num_hidden_layers, kv_lora_rank + qk_rope_head_dim: a
 * latent layout, format KVP_FORMAT_LATENT, n_kv_heads 1, head_dim 576);
 * kvp_layout_name() lists them. The name
 * is matched ignoring case, and the Hugging Face repository id
 * ("meta-llama/Meta-Llama-3-8B") works too; fine-tunes share their base
 * model's shape. dtype and block_tokens are the caller's choice and are
 * copied as given (kvp_pool_open validates them); quant_group is 32 for
 * the quantized dtypes (the whole head where head_dim is no multiple of
 * 32), else 0. Tensor-parallel ranks holding a share of the KV heads
 * divide n_kv_heads themselves. Errors: -EINVAL name or out NULL;
 * -ENOENT no such model. */
KVP_PUBLIC int kvp_layout_named(const char *name, uint32_t dtype, uint32_t block_tokens,
				struct kvp_layout *out);

/* Name i (0, 1, ...) of kvp_layout_named()'s table, and in *ret_hf_id
 * (may be NULL) the Hugging Face repository its numbers come from; NULL
 * past the end. */
KVP_PUBLIC const char *kvp_layout_name(size_t i, const char **ret_hf_id);

/* Finds or creates the pool of (this user, model_id, layout) and maps its
 * host arena. Every process of the same user that opens the same model_id
 * and layout gets the same pool and sees the same pages; other users never
 * do. model_id is 1..127 bytes of printable ASCII.
 * Errors: -EINVAL bad layout or model id; -EDQUOT too many pools;
 * -ENOSPC the daemon cannot make another arena. */
KVP_PUBLIC int kvp_pool_open(kvp_client *c, const char *model_id, const struct kvp_layout *layout,
			     kvp_pool **ret_pool);

/* Options of kvp_pool_open_opts, by the options-struct rule (see
 * "extra keys and options structs" below): zero them, set size and what
 * you need. */
struct kvp_pool_opts {
	size_t size; /* sizeof(struct kvp_pool_opts), or 0 */
	/* Tensor parallelism: rank tp_rank of tp_size holds a share of the
	 * KV heads (layout.n_kv_heads is the rank's count: the model's
	 * divided by tp_size, at least 1). Each rank gets a pool of its own
	 * under the model's identity: model_id "llama-3-70b", rank 1 of 4,
	 * is the pool "llama-3-70b#tp1/4" (kvpalacectl and Stats show that
	 * name). The ranks store and match the same prefix in their pools:
	 * what all of them can serve is the smallest of their matches
	 * (kvp_lookup each pool; one process of the user may open all of
	 * them). Without it, ranks with equal per-rank layouts would share
	 * one pool and read each other's heads as their own. tp_size 0 or 1:
	 * no tensor parallelism (tp_rank must be 0). */
	uint32_t tp_rank;
	uint32_t tp_size;
};

/* Ranks kvp_pool_opts.tp_size may have. */
#define KVP_TP_SIZE_MAX 1024u

/* kvp_pool_open with options (NULL: none, as kvp_pool_open). Errors: those
 * of kvp_pool_open; -EINVAL tp_rank >= tp_size or tp_size over
 * KVP_TP_SIZE_MAX, tp_rank without tp_size, model_id too long for its
 * rank's suffix ("#tp<rank>/<size>" within 127 bytes). */
KVP_PUBLIC int kvp_pool_open_opts(kvp_client *c, const char *model_id,
				  const struct kvp_layout *layout, const struct kvp_pool_opts *opts,
				  kvp_pool **ret_pool);

/* Frees the pool handle and unmaps the arena. Sessions and leases opened
 * through it must be closed first (their handles are freed with it
 * otherwise, and the daemon keeps them until the connection closes).
 * The pool itself stays in the daemon. NULL is accepted. */
KVP_PUBLIC void kvp_pool_close(kvp_pool *p);

/* Sets the cache salt (0..64 bytes; n = 0 clears it) used by later
 * kvp_session_create and kvp_match_prefix calls through this handle. Pages
 * committed under one salt are found only by matches with the same salt:
 * give each trust domain its own. Errors: -EINVAL n > 64. */
KVP_PUBLIC int kvp_pool_set_salt(kvp_pool *p, const void *salt, size_t n);

KVP_PUBLIC uint64_t kvp_pool_id(const kvp_pool *p);
/* Bytes of one page, and of one token's row of head_dim elements. */
KVP_PUBLIC size_t kvp_pool_page_bytes(const kvp_pool *p);
KVP_PUBLIC size_t kvp_pool_row_bytes(const kvp_pool *p);
/* Pages in the host arena. */
KVP_PUBLIC uint32_t kvp_pool_n_pages(const kvp_pool *p);
KVP_PUBLIC const struct kvp_layout *kvp_pool_layout(const kvp_pool *p);

/* ---- sessions (writing) ------------------------------------------------- */

/* Creates an empty exact session in the pool. It belongs to this client's
 * connection and is closed when the connection closes (kvp_disconnect, or
 * the process dying); its committed full pages stay in the prefix index.
 * Errors: -EDQUOT too many sessions in the pool. */
KVP_PUBLIC int kvp_session_create(kvp_pool *p, kvp_session **ret_session);

/* kvp_session_create of a persistent session: one that outlives this
 * connection (a conversation a later process goes on with). Once no open
 * connection owns it, it is closed after the daemon's session-idle-timeout
 * without use (a client's request naming it is a use); until then its id
 * (kvp_session_id) reaches it: kvp_session_adopt by any process of the
 * same user, kvp_admin_checkpoint, the admin socket's listing and drop.
 * Errors as kvp_session_create. */
KVP_PUBLIC int kvp_session_create_persistent(kvp_pool *p, kvp_session **ret_session);

/* ---- extra keys and options structs (issue 18) ---------------------------
 *
 * What the tokens alone do not say about the KV keys its pages too:
 *   - the extra key (1..64 bytes; a LoRA adapter's id), one for a whole
 *     sequence, folded into its hash chain's root beside the salt: pages
 *     made under one extra key are never matched under another, or under
 *     none. The salt isolates trust domains (kvp_pool_set_salt); the
 *     extra key isolates what changes the model's output.
 *   - key spans: tokens [first_token, first_token + n_tokens) (absolute
 *     positions in the sequence, from 0) stand for content key names (an
 *     image's content hash, 1..64 bytes, behind its placeholder tokens).
 *     Every page the span overlaps hashes the key and the span's start
 *     relative to the page, so two images behind the same placeholder
 *     tokens never share a page, and neither does one image at another
 *     position; pages before the span still match. A page that overlaps
 *     no span hashes as without spans. Spans of a call are sorted by
 *     first_token and disjoint (one may start where the one before ends);
 *     the daemon refuses others (-EINVAL, kvp_strerror says why).
 *
 * Options structs: zero-initialize them (= {0}, or memset), then set
 * size = sizeof(struct ...) and the fields wanted. Fields are only ever
 * added at the end, and a zero field means what the call did before it
 * existed; the library reads only the first size bytes (size 0: the
 * struct as first published here), so a program built against this
 * header keeps working with a later library. A NULL opts pointer means
 * all defaults. The memory they point to is only read during the call. */
struct kvp_key_span {
	uint64_t first_token; /* absolute position of its first token */
	uint64_t n_tokens;    /* >= 1 */
	const void *key;      /* key_len bytes, 1..64 */
	size_t key_len;
};

struct kvp_session_opts {
	size_t size;	       /* sizeof(struct kvp_session_opts), or 0 */
	int persistent;	       /* kvp_session_create_persistent's */
	const void *salt;      /* NULL: the pool handle's salt; else salt_len bytes (0..64) */
	size_t salt_len;       /* with salt: 0 is no salt */
	const void *extra_key; /* NULL/0: none; else 1..64 bytes */
	size_t extra_key_len;
};

/* kvp_session_create with options (NULL: kvp_session_create's). The
 * session keeps its salt and extra key for good: its forks, lease forks
 * of its pages and checkpoints have them too. Errors as
 * kvp_session_create, and -EINVAL a salt over 64 bytes or an extra key
 * over 64 bytes. */
KVP_PUBLIC int kvp_session_create_opts(kvp_pool *p, const struct kvp_session_opts *opts,
				       kvp_session **ret_session);

/* Makes s persistent (persistent 1: it outlives this connection, as
 * kvp_session_create_persistent's) or not (0: it is closed when this
 * connection closes), whoever made it; either way it now belongs to this
 * connection. A fork, a lease fork and a restored checkpoint start out
 * not persistent. Errors: -ENOENT the session was closed; -EBUSY another
 * client holds uncommitted tokens of it; -EOPNOTSUPP a daemon too old to
 * know persistent sessions. */
KVP_PUBLIC int kvp_session_set_persistent(kvp_session *s, int persistent);

/* A handle for session session_id of this user in pool p, made by another
 * connection: a persistent session a previous process left, or one an
 * admin restored. This connection takes it over: it is closed with this
 * connection unless persistent (it stays as persistent as it was; see
 * kvp_session_set_persistent). The handle holds all its tokens, committed,
 * as a fork's does. On failure the session stays in the daemon (it may
 * belong to this connection now). Errors: -ENOENT no such session of this
 * user in p; -EBUSY another open connection owns it (sessions are shared
 * between live processes through the prefix index: a lease, a fork of
 * it), or another client holds uncommitted tokens of it;
 * -EEXIST p already has a handle of it; -EOPNOTSUPP a daemon too old to
 * adopt sessions. */
KVP_PUBLIC int kvp_session_adopt(kvp_pool *p, uint64_t session_id, kvp_session **ret_session);

/* Closes the session in the daemon (its pages return to the pool unless a
 * lease still pins them) and frees the handle. NULL is accepted and
 * returns 0. The handle is freed even on error. */
KVP_PUBLIC int kvp_session_close(kvp_session *s);

KVP_PUBLIC uint64_t kvp_session_id(const kvp_session *s);
/* Tokens reserved (committed or not) and tokens committed. */
KVP_PUBLIC uint64_t kvp_session_tokens(const kvp_session *s);
KVP_PUBLIC uint64_t kvp_session_committed(const kvp_session *s);

/* Reserves slots for n tokens after the last reserved one; the caller then
 * writes their K and V through kvp_session_kv() and publishes them with
 * kvp_commit(). Any n is accepted: long lists are split into several
 * requests. When a later chunk fails, the chunks before it stay reserved
 * (kvp_session_tokens() tells how many); they can be written and committed,
 * and like every uncommitted reservation they die with the connection.
 * The new pages' page tables are prefaulted in this process
 * (MADV_POPULATE_READ, Linux 5.14+, one system call per run of
 * neighbouring pages) so that writing them takes no page fault per 4 KiB;
 * only the pages handed out are touched, never the rest of the arena;
 * KVPALACE_PREFAULT=0 in the environment turns it off (for this and for
 * kvp_match_prefix), and kvp_append_tier's KVP_APPEND_NO_PREFAULT for one
 * append whose pages are written with kvp_session_write.
 * Errors: -ENOSPC the host tier is full; -EBUSY another client holds
 * uncommitted reservations on this session; -EDQUOT the session would exceed
 * the daemon's token limit; -ENOENT the session was closed. */
KVP_PUBLIC int kvp_append(kvp_session *s, const uint32_t *tokens, size_t n);

struct kvp_append_opts {
	size_t size;	    /* sizeof(struct kvp_append_opts), or 0 */
	uint32_t tier;	    /* 0 or KVP_TIER_HOST: kvp_append; KVP_TIER_GPU: kvp_append_tier's */
	unsigned int flags; /* KVP_TIER_OR_HOST, KVP_APPEND_NO_PREFAULT (kvp_append_tier) */
	/* Key spans in the session's absolute positions. Each starts at or
	 * after the end of the session's last span (those of earlier
	 * appends) and at or after the first token of the page the first
	 * appended token lands on, and before the end of these tokens; it
	 * may run past them: the tokens after come with later appends (an
	 * image cut by an append boundary), still under it. Truncating the
	 * session inside a span cuts the span there. */
	const struct kvp_key_span *spans;
	size_t n_spans;
};

/* kvp_append with options (NULL: kvp_append). A long list is split into
 * requests as kvp_append's, each carrying the spans that start in it (at
 * most 256 a request: a request ends early before a 257th).
 * Errors as kvp_append_tier, and -EINVAL spans unsorted, overlapping,
 * empty, with a key of 0 or over 64 bytes, or starting where the daemon
 * refuses them (above); -EMSGSIZE more than 256 spans start before the
 * appended tokens' first page ends. */
KVP_PUBLIC int kvp_append_opts(kvp_session *s, const uint32_t *tokens, size_t n,
			       const struct kvp_append_opts *opts);

/* Pointer to element 0 of the head_dim elements of position pos, layer,
 * kv (0 = K, 1 = V; always 0 in a latent layout), kv_head, inside the
 * shared arena. pos must be below kvp_session_tokens(). Returns NULL when
 * an index is out of range (kv 1 in a latent layout included). Valid
 * until the session is closed or truncated below pos, or the client
 * disconnects. Writing committed positions is undefined: other processes
 * may be reading them. */
KVP_PUBLIC void *kvp_session_kv(kvp_session *s, uint64_t pos, uint32_t layer, uint32_t kv,
				uint32_t kv_head);

/* Where one page's K/V lie in this process's mapping of the host arena:
 * what an engine needs to write or read whole runs (a page, a layer's K,
 * a head) instead of one head_dim row per call. Element 0 of (layer, kv,
 * kv_head, token) of the page is at
 *   base + layer * layer_stride + kv * kv_stride + kv_head * head_stride
 *        + token * token_stride
 * (token counts from the page's first token: position first_pos + token),
 * which is where kvp_session_kv / kvp_lease_kv point; row_bytes follow.
 * From the page layout (struct kvp_layout): token_stride = row_bytes,
 * head_stride = block_tokens * row_bytes, kv_stride = n_kv_heads *
 * head_stride, layer_stride = 2 * kv_stride (a latent layout: one plane,
 * layer_stride = kv_stride = block_tokens * row_bytes, kv always 0).
 * So, contiguous:
 *   - a (layer, kv, head): its block_tokens rows, head_stride bytes;
 *   - a layer's K (or V): kv_stride bytes from base + layer * layer_stride;
 *   - a layer's K and V: layer_stride bytes;
 *   - the page's data: data_bytes = n_layers * layer_stride from base;
 * only the first n_tokens rows of each (layer, kv, head) are the page's
 * (a partial last page): rows past them belong to no token yet.
 * Quantized dtypes store their f16 scales after the data, at
 *   scales + layer * scale_layer_stride + kv * scale_kv_stride
 *          + kv_head * scale_head_stride + token * scale_token_stride
 * (scale_row_bytes = head_dim / quant_group * 2 each). The raw fp8 types
 * (KVP_DTYPE_E4M3_RAW, KVP_DTYPE_E5M2_RAW) have one f32 scale per layer
 * and K|V at scales + layer * scale_layer_stride + kv * scale_kv_stride
 * (scale_row_bytes = scale_kv_stride = 4, scale_layer_stride 8, latent
 * 4; the head and token strides 0), written like the data; see
 * KVP_DTYPE_E4M3_RAW for who checks them. scales is NULL and the scale
 * fields 0 for f16, bf16 and f32. page_bytes is the padded page
 * (a multiple of 4096; pages of a run of slots follow each other).
 * The strides are the pool's and the same for every page; base differs. */
struct kvp_page_view {
	void *base;
	uint64_t first_pos; /* position of the page's token 0: page * block_tokens */
	uint32_t n_tokens;  /* tokens of the page held, 1..block_tokens */
	uint32_t slot;	    /* the page's slot in the arena */
	size_t row_bytes;   /* one token's head_dim elements */
	size_t token_stride;
	size_t head_stride;
	size_t kv_stride;
	size_t layer_stride;
	size_t data_bytes;
	size_t page_bytes;
	void *scales;
	size_t scale_row_bytes;
	size_t scale_token_stride;
	size_t scale_head_stride;
	size_t scale_kv_stride;
	size_t scale_layer_stride;
};

/* Fills *ret with where page `page` of s lies (page i holds positions
 * i * block_tokens onwards; pages below ceil(kvp_session_tokens() /
 * block_tokens) exist). Writing follows kvp_session_kv's rules: only
 * reserved, uncommitted positions. The addresses stay valid as long as
 * kvp_session_kv's for the same positions: until the session is closed,
 * truncated into or below the page, compacted, a commit fills the page
 * (dedup may move it to an identical indexed copy: ask again after
 * kvp_commit), or the client disconnects; n_tokens does not grow with
 * later appends (ask again). Errors: -EINVAL s or ret NULL; -ERANGE no
 * such page; -ENOTCONN the connection was lost (the daemon may have
 * lent the slots to someone else). */
KVP_PUBLIC int kvp_session_page(kvp_session *s, uint64_t page, struct kvp_page_view *ret);

/* Pages [first_page, first_page + n) of s as a block table: in
 * ret_bases[i] the address of page first_page + i in this process's
 * mapping (kvp_page_view.base), in ret_slots[i] its arena slot (base =
 * kvp_arena.base + slot * page_bytes: host slots; device copies have
 * slots of their own, kvp_session_device_kv); either array may be NULL. What an engine hands its
 * kernels in one call instead of a kvp_session_page per page. Valid as
 * kvp_session_page's views are: ask again after kvp_commit (dedup may
 * move a page to an identical indexed copy), truncate or compact.
 * Errors: -EINVAL s NULL, or both arrays NULL with n > 0; -ERANGE pages
 * past the session's (ceil(kvp_session_tokens() / block_tokens));
 * -ENOTCONN the connection was lost. */
KVP_PUBLIC int kvp_session_block_table(const kvp_session *s, uint64_t first_page, size_t n,
				       void **ret_bases, uint32_t *ret_slots);

/* The same for a read lease's whole pages (kvp_lease_tokens() /
 * block_tokens of them), valid until it is released. */
KVP_PUBLIC int kvp_lease_block_table(const kvp_lease *l, uint64_t first_page, size_t n,
				     void **ret_bases, uint32_t *ret_slots);

/* The pool's host arena as this process maps it: page slot s lies at
 * base + s * page_bytes, for s < n_pages (bytes in all). An engine
 * registers it once for asynchronous device copies
 * (cudaHostRegister(base, bytes, ...): then copies from and to any page
 * are DMA, without staging). fd is the arena's memfd (this library's: do
 * not close it; -1 when the daemon sent none), whose offset fd_offset is
 * slot 0, for pread/pwrite or a mapping of one's own; hugetlb is set
 * when the arena is on hugetlbfs. Valid until kvp_pool_close. Errors:
 * -EINVAL p or ret NULL; -ENOTCONN the connection was lost (slots may be
 * another's now). */
struct kvp_arena {
	void *base;
	size_t bytes;
	size_t page_bytes;
	uint32_t n_pages;
	int fd;
	uint64_t fd_offset;
	int hugetlb;
};
KVP_PUBLIC int kvp_pool_arena(const kvp_pool *p, struct kvp_arena *ret);

/* Copies n bytes from src into page `page` of s, starting at byte `off` of
 * the page (the offsets of struct kvp_page_view: layer * layer_stride +
 * kv * kv_stride + ..., the scales after data_bytes, up to page_bytes),
 * through the arena's file with pwrite(2) instead of this process's
 * mapping. For a process that has its K/V in a buffer of its own (a
 * staging copy from the GPU, a file) this is the fast way in: the kernel
 * copies into the shared pages without mapping them here, and a page no
 * process has touched yet is not zeroed first (a fresh writer through
 * the mapping pays a fault and a clear per 4 KiB). Append such pages
 * with kvp_append_tier(..., KVP_APPEND_NO_PREFAULT) so that kvp_append
 * does not map them first. The bytes are visible to kvp_session_kv,
 * kvp_session_page and every other process once the call returns; they
 * are published, as ever, by kvp_commit. Only pages that hold no
 * committed token can be written this way (committed K/V may be read by
 * other processes: write the rest of a partly committed page through
 * kvp_session_page). A hugetlb arena has no write(2): there the bytes
 * go through this process's mapping (faulted per 2 MiB anyway).
 * Errors: -EINVAL s NULL, or src NULL with n > 0;
 * -ERANGE no such page, or off + n past page_bytes; -EROFS the page
 * holds committed tokens; -ENOTCONN the connection was lost; another
 * negative errno from pwrite(2). */
KVP_PUBLIC int kvp_session_write(kvp_session *s, uint64_t page, uint64_t off, const void *src,
				 size_t n);

/* Publishes the next n reserved tokens: afterwards any process of the pool
 * can match and read their full pages. A page this commit fills may be
 * replaced by an identical indexed copy (dedup): pointers obtained from
 * kvp_session_kv() for positions of pages it filled are stale afterwards;
 * ask again. A commit that fills more pages than one reply can list is
 * sent as several requests; when a later one fails, the tokens before it
 * stay committed (kvp_session_committed() tells how many).
 * Errors: -ERANGE n exceeds what is reserved and uncommitted; -ENOENT the
 * session was closed. */
KVP_PUBLIC int kvp_commit(kvp_session *s, uint64_t n);

/* Creates a new session sharing the first n_tokens committed tokens of s
 * (copy-on-write: full pages are shared, the partial last page is copied;
 * neither session can change what the other sees). The new session has the
 * salt of s and no writer, and belongs to this connection (closed with it,
 * not persistent, whatever s is). Errors: -ERANGE n_tokens exceeds the
 * committed tokens; -ENOSPC no free page for the copy; -EDQUOT session
 * limit. */
KVP_PUBLIC int kvp_session_fork(kvp_session *s, uint64_t n_tokens, kvp_session **ret_session);

/* Drops every token of s after the first n_tokens, committed or not
 * (speculative-decoding rollback, edited turns); pages nobody else holds
 * return to the pool. Afterwards kvp_append continues at n_tokens; pointers
 * to dropped positions, and to the new last page, are stale. Errors:
 * -ERANGE n_tokens exceeds kvp_session_tokens(); -EBUSY another client holds
 * uncommitted tokens; -ENOSPC the shared last page could not be copied. */
KVP_PUBLIC int kvp_truncate(kvp_session *s, uint64_t n_tokens);

/* ---- context-cache policies ---------------------------------------------- */

/* A session is exact until it gets a token policy. The policy decides which
 * tokens the session keeps once it outgrows its budget; kvp_session_compact
 * (or a commit, with auto_compact) applies it: the kept tokens' K and V are
 * copied, bytes unchanged, into new pages of the session, in order; the
 * session is then *compacted*: its pages are its own (they never enter the
 * prefix index, so a compacted session never serves a match), and each
 * kept token keeps its original position (kvp_session_meta), which the
 * caller must use for its positional encoding. Pointers from
 * kvp_session_kv are stale after a compaction; ask again. Values of the
 * enums are part of the protocol. */
enum kvp_policy_kind {
	KVP_POLICY_NONE = 0,	   /* exact */
	KVP_POLICY_WINDOW = 1,	   /* the last `budget` tokens */
	KVP_POLICY_SINKS = 2,	   /* the first `sinks` tokens and the last budget - sinks */
	KVP_POLICY_IMPORTANCE = 3, /* sinks, the last `recent`, then the highest scores */
	KVP_POLICY_HIERARCHY = 4,  /* permanent, hot (last turns), temporary (by score) */
};

enum kvp_role {
	KVP_ROLE_NONE = 0,
	KVP_ROLE_SYSTEM = 1,
	KVP_ROLE_USER = 2,
	KVP_ROLE_ASSISTANT = 3,
};
#define KVP_N_ROLES 4

/* Tag flags. */
#define KVP_TAG_PERMANENT 0x1u /* system prompt, user profile, summary: the top layer */
/* A summary span (issue 22): K/V of a summary the caller computed (say, of
 * document chunks the policy will drop), permanent too. Every token policy
 * keeps all summary tokens, before its own rules (sinks, window, scores,
 * role limits), each counting one token of the budget; in a hierarchy
 * they come first in the permanent layer and count in its share. */
#define KVP_TAG_SUMMARY 0x2u

struct kvp_policy {
	uint32_t kind;		  /* enum kvp_policy_kind */
	uint32_t budget;	  /* tokens kept at most; >= 1 unless KVP_POLICY_NONE */
	uint32_t budget_max;	  /* the budget grows with the session up to this (0: fixed) */
	uint32_t grow_pct;	  /* ... by this percent of the tokens beyond the budget */
	uint32_t sinks;		  /* first tokens always kept (SINKS, IMPORTANCE) */
	uint32_t recent;	  /* last tokens always kept (IMPORTANCE) */
	uint32_t hot_turns;	  /* turns in the hot layer (HIERARCHY) */
	uint32_t share_permanent; /* percent of the budget for permanent spans (HIERARCHY) */
	uint32_t share_hot;	  /* percent for the hot layer; the rest is temporary */
	float decay;		  /* λ: scores decay as score·exp(-λ) per importance report */
	int auto_compact;	  /* compact when a commit takes the session past its budget */
	uint32_t role_limit[KVP_N_ROLES]; /* keep at most the last N tokens of a role; 0: all */
	float role_weight[KVP_N_ROLES];	  /* multiplies a role's scores; 0 is read as 1 */
};

/* Fills pol with the daemon's defaults for kind and budget: sinks 4,
 * recent 64, hot_turns 4, shares 10 % permanent / 30 % hot, decay 0.01,
 * no growth, no auto-compaction, no role limits, weights 1. */
KVP_PUBLIC void kvp_policy_init(struct kvp_policy *pol, uint32_t kind, uint32_t budget);

/* Sets the session's policy; *ret_budget (may be NULL) receives the budget
 * for its length now. It applies at the next kvp_session_compact, or at
 * commits with auto_compact. Errors: -EINVAL an inconsistent policy, or a
 * budget below the session's summary tokens (kvp_strerror says what). */
KVP_PUBLIC int kvp_session_set_policy(kvp_session *s, const struct kvp_policy *pol,
				      uint32_t *ret_budget);

/* Tags tokens [first, first + n): role (enum kvp_role), turn (the
 * conversation turn, for the hierarchy's hot layer) and flags
 * (KVP_TAG_PERMANENT, KVP_TAG_SUMMARY). Tokens appended later with
 * kvp_append belong to the last tagged turn (untagged: no summary). Errors:
 * -ERANGE past the session's tokens; -EINVAL an unknown flag, an empty
 * summary span, or one that would make the session's summary tokens more
 * than its policy's budget (kvp_session_set_policy refuses a budget below
 * them, too). */
KVP_PUBLIC int kvp_session_tag(kvp_session *s, uint64_t first, uint64_t n, uint32_t role,
			       uint32_t turn, unsigned int flags);

/* kvp_append, with the new tokens tagged as kvp_session_tag would. */
KVP_PUBLIC int kvp_append_tagged(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t role,
				 uint32_t turn, unsigned int flags);

/* One importance step (H2O): every score of the session decays by
 * exp(-decay), then token first + i gains mass[i] (the attention mass the
 * caller's model gave it, summed over heads; negative or non-finite
 * values count as 0). Errors: -ERANGE past the session's tokens. */
KVP_PUBLIC int kvp_session_report_importance(kvp_session *s, uint64_t first, const float *mass,
					     size_t n);

/* One importance step computed by the daemon: the attention weights of
 * the query q ([n_q_heads][head_dim] f32, before the 1/sqrt(head_dim)
 * scale) over the committed tokens of layer, summed over heads, with the
 * reference kernels (on a worker thread: the daemon serves others
 * meanwhile). Errors: -EINVAL layer or head count wrong for the pool;
 * -E2BIG the session is too long for the daemon to do it (report the
 * masses instead); -ERANGE nothing committed yet; -EBUSY the session
 * changed (appended, truncated, compacted) while it was scored: nothing
 * was applied, try again; -ENOENT it was closed meanwhile. */
KVP_PUBLIC int kvp_session_score_query(kvp_session *s, uint32_t layer, const float *q,
				       uint32_t n_q_heads);

/* Topic relevance for the hierarchy's temporary layer: each span (the
 * tokens of one tagged turn) gets as its tokens' score the cosine
 * similarity between its mean key of layer and the topic vector topic
 * ([n_q_heads][head_dim] f32: say, the current query), computed by the
 * daemon; the scores are replaced, not accumulated. Errors as
 * kvp_session_score_query. */
KVP_PUBLIC int kvp_session_score_topic(kvp_session *s, uint32_t layer, const float *topic,
				       uint32_t n_q_heads);

/* Applies the session's policy now and reads back its page table;
 * *ret_dropped (may be NULL) receives the tokens dropped, 0 when all fit.
 * Errors: -EINVAL no policy set; -EBUSY the session has uncommitted tokens,
 * or changed while the copy ran (nothing was applied: try again);
 * -ENOSPC no free pages for the compacted copy. */
KVP_PUBLIC int kvp_session_compact(kvp_session *s, uint64_t *ret_dropped);

/* 1 when this handle has seen its session compacted (by its compactions
 * or auto-compacting commits, or as a fork of a compacted handle), else 0.
 * kvp_session_meta tells for any session. */
KVP_PUBLIC int kvp_session_compacted(const kvp_session *s);

struct kvp_token_info {
	uint32_t pos;  /* original position in the sequence */
	uint32_t role; /* enum kvp_role */
	uint32_t turn;
	unsigned int flags; /* KVP_TAG_PERMANENT, KVP_TAG_SUMMARY */
	float score;	    /* accumulated, decayed attention mass */
};

/* Metadata of tokens [first, first + n) of the session (n <= its tokens
 * - first), read from the daemon. Errors: -ERANGE past the tokens. */
KVP_PUBLIC int kvp_session_meta(kvp_session *s, uint64_t first, size_t n,
				struct kvp_token_info *out);

/* ---- prefix matching (reading) ------------------------------------------ */

/* Finds the longest prefix of tokens[0..n), in whole pages, that the pool's
 * prefix index holds under the handle's salt (pages committed by any
 * process of this user), and pins its pages under a read lease: they stay
 * valid and unchanged until kvp_lease_release() or disconnect. A lease of 0
 * tokens is a miss (still a valid handle). Every page matched holds exactly
 * the bytes its writer committed: a page whose only copy went to the disk
 * tier quantized (a daemon run with --spill-dtype int8|fp8|int4) is lossy
 * and never matched; the match stops before it, and the caller computes
 * those tokens again. Committing them (an exact commit, or restoring an
 * exact checkpoint) replaces the lossy copy, so later matches find them;
 * it is never shared in place of what was written. Where the arena has
 * transparent huge pages, the matched pages' page tables are prefaulted
 * in this process before it returns (see kvp_append), so a process
 * reading a prefix for the first time takes no fault per huge page (with
 * 4 KiB pages a read fault maps 16 pages already, and prefaulting was
 * measured no faster). Errors: -EDQUOT the client holds too many
 * leases or leased pages, or this user's leases together pin its share
 * of the host tier (kvpalaced(8), --host-tier-size): release some. */
KVP_PUBLIC int kvp_match_prefix(kvp_pool *p, const uint32_t *tokens, size_t n,
				kvp_lease **ret_lease);

/* Starts bringing the pages of tokens[0..n)'s cached prefix that sit in the
 * daemon's disk tier back into host memory, ahead of the kvp_match_prefix
 * that will want them (say, while the request is still being tokenized or
 * queued), and returns at once with the pages on their way in
 * *ret_pages_coming (may be NULL). Only the head of a long prompt counts:
 * the first max-tokens-per-request tokens (Hello says how many). Pins
 * nothing; a match never needs it, it only waits less. */
KVP_PUBLIC int kvp_prefetch(kvp_pool *p, const uint32_t *tokens, size_t n,
			    uint32_t *ret_pages_coming);

struct kvp_match_opts {
	size_t size;	  /* sizeof(struct kvp_match_opts), or 0 */
	const void *salt; /* NULL: the pool handle's salt; else salt_len bytes (0..64) */
	size_t salt_len;
	const void *extra_key; /* NULL/0: none; else 1..64 bytes, as the session's */
	size_t extra_key_len;
	/* Key spans of the prompt (absolute positions), as the writer's
	 * session had them: a page matches only under the same spans. Spans
	 * starting at or past n are ignored. */
	const struct kvp_key_span *spans;
	size_t n_spans;
	uint32_t tier;	    /* 0 or KVP_TIER_HOST; KVP_TIER_GPU: kvp_match_prefix_tier's */
	unsigned int flags; /* KVP_TIER_OR_HOST */
};

/* kvp_match_prefix with options (NULL: kvp_match_prefix): the salt,
 * extra key and key spans the prompt's pages were written under, and a
 * tier. Long prompts go in chunks, each with the spans starting in it.
 * Errors as kvp_match_prefix_tier, and -EINVAL invalid spans or keys. */
KVP_PUBLIC int kvp_match_prefix_opts(kvp_pool *p, const uint32_t *tokens, size_t n,
				     const struct kvp_match_opts *opts, kvp_lease **ret_lease);

/* kvp_prefetch with options (NULL: kvp_prefetch); tier as
 * kvp_prefetch_tier. Only the first request's worth of the prompt (and
 * spans starting there) counts, as for kvp_prefetch. Errors as
 * kvp_match_prefix_opts. */
KVP_PUBLIC int kvp_prefetch_opts(kvp_pool *p, const uint32_t *tokens, size_t n,
				 const struct kvp_match_opts *opts, uint32_t *ret_pages_coming);

/* How much of a prompt the pool holds, asked without changing anything:
 * what an engine's scheduler asks, many times per request, before it
 * decides where a request goes and how many tokens it must compute.
 * tokens/n_tokens: the prompt; salt: NULL for the pool handle's salt
 * (kvp_pool_set_salt), else salt_len bytes (0..64; salt_len 0: no salt)
 * for this query alone; extra_key/extra_key_len and spans/n_spans as
 * struct kvp_match_opts's (NULL/0: none). Zero-initialize a query so
 * fields added later stay 0. */
struct kvp_lookup_query {
	const uint32_t *tokens;
	size_t n_tokens;
	const void *salt;
	size_t salt_len;
	const void *extra_key;
	size_t extra_key_len;
	const struct kvp_key_span *spans; /* absolute positions in tokens */
	size_t n_spans;
};

struct kvp_lookup_result {
	uint64_t matched_tokens; /* whole pages a kvp_match_prefix would find now */
	uint64_t host_tokens;	 /* of them, the leading ones already in host
				    memory (the rest would be read from disk) */
};

/* Fills out[i] for each of queries[0..n): the longest prefix, in whole
 * pages, of the query's tokens in the pool's prefix index, as
 * kvp_match_prefix would match it at this moment (pages only on disk
 * count, lossy ones end it as they end a match). Changes nothing: no
 * page is pinned, promoted or prefetched, no page's recency changes, no
 * hit or miss is counted; so the answer is a moment's: pages may leave
 * before the match that follows (which is what a lease is for). The
 * batch goes in as few requests as the daemon's limits allow (64
 * queries and max-tokens-per-request tokens a request; a long prompt is
 * sent in pieces, invisibly). Errors: -EINVAL p NULL, queries or out
 * NULL with n > 0, a query with n_tokens but no tokens, a salt over 64
 * bytes, an invalid extra key or spans (as kvp_match_prefix_opts), more
 * than 256 spans within one page; -EMSGSIZE one page's tokens do not fit a request to this daemon;
 * -ENOENT the pool is gone; the connection's errors. out is undefined
 * after an error. */
KVP_PUBLIC int kvp_lookup_batch(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				struct kvp_lookup_result *out);

/* kvp_lookup_batch of one prompt under the handle's salt: the tokens a
 * match would find, in *ret_tokens (0 after an error). */
KVP_PUBLIC int kvp_lookup(kvp_pool *p, const uint32_t *tokens, size_t n, uint64_t *ret_tokens);

/* The lease's id in the daemon, 0 for a miss (nothing to hand on). */
KVP_PUBLIC uint64_t kvp_lease_id(const kvp_lease *l);

/* A lease of this client's own on the pages that lease lease_id holds,
 * lease_id being kvp_lease_id() of a lease of the same user, taken by
 * any of its processes in the same pool (model and layout): how an
 * engine's scheduler, which matched a prompt, hands the match to the
 * worker process that loads the pages, without matching again and
 * perhaps finding less. Send the id to the worker any way you like; the
 * worker adopts it, and then either side may release its own lease in
 * any order: the pages stay pinned while either holds them. The new
 * lease has the source's tokens so far (kvp_lease_tokens), its salt and
 * its pages, in the host tier (ask for device copies as for any lease),
 * and is released like any lease (kvp_lease_release, or when this client
 * disconnects). Adopt before the source is released: its holder's
 * release or disconnect ends it. Errors: -EINVAL p or ret_lease NULL,
 * lease_id 0; -ENOENT no such lease in this pool (released, its client
 * gone, another user's: leases never cross users); -EDQUOT this client's
 * limits on leases or leased pages (max-leases-per-client,
 * max-leased-pages-per-client), or this user's leases pin its share of the
 * host tier; the connection's errors. */
KVP_PUBLIC int kvp_lease_adopt(kvp_pool *p, uint64_t lease_id, kvp_lease **ret_lease);

/* ---- submitting without waiting ----------------------------------------- */

/* A scheduler that must not block on one round trip per waiting request
 * submits, goes on, and collects completions when the client's socket
 * polls readable (kvp_client_fd, POLLIN) or whenever it likes:
 *
 *	kvp_lookup_submit(pool, queries, n, results, 7);
 *	... poll(kvp_client_fd(c)) among the engine's own fds ...
 *	n = kvp_complete(c, done, 16, 0);   // done[i].user_data == 7, .result 0
 *
 * At most KVP_ASYNC_MAX requests are in flight per client (-EAGAIN
 * beyond: complete some first). Blocking calls may be made meanwhile on
 * the same client; replies to submitted requests that arrive during them
 * are kept for kvp_complete. A completion's memory (the queries' tokens,
 * salts, results) belongs to the caller and must stay valid until it
 * completes: a long lookup batch sends its later pieces from
 * kvp_complete. Closing the pool (or the client) first drops its
 * operations: they never complete. The client's one-thread-at-a-time
 * rule holds for these calls too. */
#define KVP_ASYNC_MAX 16u

enum kvp_async_op {
	KVP_ASYNC_LOOKUP = 1,
	KVP_ASYNC_PREFETCH = 2,
};

struct kvp_completion {
	uint64_t user_data; /* as submitted */
	int result;	    /* 0 (a lookup: results filled), pages coming (a
			       prefetch), or a negative errno */
	uint32_t op;	    /* enum kvp_async_op */
};

/* The client's socket, for poll/epoll (POLLIN: a reply may be waiting;
 * readiness is a hint, kvp_complete may find nothing complete yet). Do
 * not read, write or close it. Errors: -EINVAL c NULL; -ENOTCONN. */
KVP_PUBLIC int kvp_client_fd(const kvp_client *c);

/* kvp_lookup_batch, submitted: out[0..n) is filled when it completes.
 * Errors (nothing submitted): kvp_lookup_batch's; -EAGAIN KVP_ASYNC_MAX
 * requests in flight. Errors of the lookup itself come as the
 * completion's result. */
KVP_PUBLIC int kvp_lookup_submit(kvp_pool *p, const struct kvp_lookup_query *queries, size_t n,
				 struct kvp_lookup_result *out, uint64_t user_data);

/* kvp_prefetch, submitted: the completion's result is the number of
 * pages coming from disk, or a negative errno. Errors (nothing
 * submitted): -EINVAL, -EAGAIN, the connection's. */
KVP_PUBLIC int kvp_prefetch_submit(kvp_pool *p, const uint32_t *tokens, size_t n,
				   uint64_t user_data);

/* Collects up to max completions of c's submitted operations, waiting up
 * to timeout_ms (poll's: -1 for ever, 0 not at all) for a reply while
 * none has completed. Returns how many it wrote to out (0: none in
 * time, or nothing in flight), or a negative errno: -EINVAL; the
 * connection's errors (it is then broken: what was in flight never
 * completes). */
KVP_PUBLIC int kvp_complete(kvp_client *c, struct kvp_completion *out, size_t max, int timeout_ms);

/* Operations submitted on c that have not completed. */
KVP_PUBLIC size_t kvp_in_flight(const kvp_client *c);

/* Tokens matched by the lease. */
KVP_PUBLIC uint64_t kvp_lease_tokens(const kvp_lease *l);

/* Read-only pointer to element 0 of (pos, layer, kv, kv_head) of a leased
 * token; NULL when out of range (kv must be 0 in a latent layout). Valid
 * until the lease is released. */
KVP_PUBLIC const void *kvp_lease_kv(const kvp_lease *l, uint64_t pos, uint32_t layer, uint32_t kv,
				    uint32_t kv_head);

/* kvp_session_page for page `page` of a lease (below kvp_lease_tokens() /
 * block_tokens; leases hold whole pages, so n_tokens is block_tokens).
 * Read only: the page may be shared with every process of the pool.
 * Valid until the lease is released or the client disconnects. A GPU-tier
 * lease's host view is of no use (its pages are read on the device).
 * Errors: -EINVAL l or ret NULL; -ERANGE no such page (a miss has none);
 * -ENOTCONN the connection was lost (the lease ended with it). */
KVP_PUBLIC int kvp_lease_page(const kvp_lease *l, uint64_t page, struct kvp_page_view *ret);

/* Copies n bytes of page `page` of the lease, from byte `off` of the page
 * (kvp_session_write's offsets), into dst, through the arena's file with
 * pread(2): for a process that wants the K/V in a buffer of its own (a
 * staging copy for the GPU) rather than read in place; it maps nothing
 * in this process. Errors: -EINVAL l NULL, or dst NULL with n > 0;
 * -ERANGE no such page (a miss has none), or off + n past page_bytes;
 * -ENOTCONN the connection was lost; another negative errno from
 * pread(2). */
KVP_PUBLIC int kvp_lease_read(const kvp_lease *l, uint64_t page, uint64_t off, void *dst, size_t n);

/* Creates a session holding the first n_tokens of the lease's match
 * (n_tokens <= kvp_lease_tokens()), sharing its pages copy-on-write as
 * kvp_session_fork does, under the salt the match used: how a process
 * continues from a prefix another process computed, then appends its own
 * tokens. The lease stays valid; the session belongs to this connection
 * as a created one does. Errors: -ERANGE n_tokens exceeds the lease;
 * -ENOENT the lease is a miss (holds no pages); -ENOSPC, -EDQUOT as
 * kvp_session_fork. */
KVP_PUBLIC int kvp_lease_fork(kvp_lease *l, uint64_t n_tokens, kvp_session **ret_session);

/* Ends the lease and frees the handle. NULL is accepted and returns 0. */
KVP_PUBLIC int kvp_lease_release(kvp_lease *l);

/* ---- the GPU tier -------------------------------------------------------- */

/* Where the daemon runs on a machine with a GPU (and was built with CUDA),
 * each pool may also have a device arena: pages the daemon copies to the
 * GPU for a lease, which this process maps and reads in place with its
 * own kernels, as it reads host pages through kvp_lease_kv(). Everything
 * below degrades cleanly: without a GPU (or in a library built without
 * CUDA) the host calls above keep working and these say why they cannot.
 * A process must use the GPU the daemon uses (found by UUID, whatever
 * CUDA_VISIBLE_DEVICES says). Device pages a lease holds come back to the
 * daemon with the lease, and so with the connection when a process dies. */

/* Storage tiers. Values are part of the protocol. */
enum kvp_tier {
	KVP_TIER_GPU = 1,
	KVP_TIER_HOST = 2,
	KVP_TIER_DISK = 3,
};

/* Flag of kvp_match_prefix_tier(): when the GPU tier cannot be had (no
 * GPU in the daemon, no device arena for the pool, this process cannot
 * map it, no free device slot), serve the lease from the host tier
 * instead of failing; kvp_lease_tier() tells which it got. */
#define KVP_TIER_OR_HOST 1u

/* Flag of kvp_append_tier(): do not prefault the new pages' page tables in
 * this process (kvp_append does by default, for writing through the
 * mapping): the pages will be written with kvp_session_write, or by
 * another process. */
#define KVP_APPEND_NO_PREFAULT 2u

/* 1 when the daemon gave the pool a device arena (it has a GPU and
 * gpu-pool-size is not 0), else 0. Says nothing about whether this process
 * can map it: kvp_pool_gpu_open() does. */
KVP_PUBLIC int kvp_pool_has_gpu(const kvp_pool *p);
/* Device page slots of the pool's arena; 0 without one. */
KVP_PUBLIC uint32_t kvp_pool_gpu_pages(const kvp_pool *p);

/* Maps the pool's device arena into this process (CUDA VMM import of the
 * POSIX fd the daemon passes, or a legacy CUDA IPC handle), making the
 * daemon's GPU current on the calling thread. Done once; later calls
 * return 0 at once. kvp_match_prefix_tier() calls it when needed.
 * Errors: -EOPNOTSUPP the pool has no device arena or the library was
 * built without CUDA; -ENODEV this process cannot see the daemon's GPU;
 * -ENOMEM, -EIO the CUDA import failed. */
KVP_PUBLIC int kvp_pool_gpu_open(kvp_pool *p);

/* kvp_match_prefix() asking for a tier: KVP_TIER_HOST is kvp_match_prefix;
 * KVP_TIER_GPU also gives the lease device copies of its pages (the
 * daemon copies them host→device and answers when the copies are done),
 * readable through kvp_lease_device_kv() until the lease is released. The
 * host pages stay pinned too, so kvp_lease_kv() works on any lease.
 * flags: 0 or KVP_TIER_OR_HOST. Errors as kvp_match_prefix(), and
 * -EOPNOTSUPP the GPU tier was asked for without KVP_TIER_OR_HOST and the
 * daemon has none (kvp_strerror() says why: "no GPU: ..."); -ENODEV this
 * process cannot see the daemon's GPU; -ENOSPC the device arena is full
 * of leased pages; -EINVAL an unknown tier or flag. */
KVP_PUBLIC int kvp_match_prefix_tier(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
				     unsigned int flags, kvp_lease **ret_lease);

/* kvp_append() choosing where the new tokens' K/V is written. With
 * KVP_TIER_GPU (and a device arena this process can map) every page the
 * tokens touch also gets a device slot: write their rows on the GPU
 * through kvp_session_device_kv(); kvp_commit() has the daemon copy those
 * rows (only the rows of tokens appended on the GPU) back to their host
 * pages before it publishes them, and returns once they are. Without a
 * device slot to be had: -EOPNOTSUPP (no GPU tier; kvp_strerror() says
 * why), -ENODEV (this process cannot see the GPU) or -ENOSPC (the device
 * arena is full), unless flags has KVP_TIER_OR_HOST: then the tokens are
 * reserved on the host alone and kvp_session_device_kv() returns NULL for
 * them. flags may also have KVP_APPEND_NO_PREFAULT. Errors otherwise as
 * kvp_append(). */
KVP_PUBLIC int kvp_append_tier(kvp_session *s, const uint32_t *tokens, size_t n, uint32_t tier,
			       unsigned int flags);

/* Device address of element 0 of (pos, layer, kv, kv_head) in the device
 * slot of pos's page, when a GPU-tier append gave that page one, else
 * NULL. Rows of positions appended on the GPU tier are written there;
 * others of the same page go through kvp_session_kv(). Valid until the
 * session is closed or truncated below pos. */
KVP_PUBLIC void *kvp_session_device_kv(kvp_session *s, uint64_t pos, uint32_t layer, uint32_t kv,
				       uint32_t kv_head);

/* kvp_prefetch() for a lease of tier `tier` to come: KVP_TIER_GPU is
 * refused with -EOPNOTSUPP where the daemon has no GPU tier for the pool,
 * unless flags has KVP_TIER_OR_HOST. Pages come to the host tier either
 * way (the device copies need the lease of the match). */
KVP_PUBLIC int kvp_prefetch_tier(kvp_pool *p, const uint32_t *tokens, size_t n, uint32_t tier,
				 unsigned int flags, uint32_t *ret_pages_coming);

/* The tier a lease's pages can be read from: KVP_TIER_GPU when it holds
 * device copies, else KVP_TIER_HOST. */
KVP_PUBLIC uint32_t kvp_lease_tier(const kvp_lease *l);

/* Device address (a CUdeviceptr as a pointer) of element 0 of (pos, layer,
 * kv, kv_head) of a leased token, in this process's mapping of the pool's
 * device arena; the page layout is the host page's. NULL when the lease is
 * not on the GPU or an index is out of range. Valid until the lease is
 * released; writing through it is undefined (other processes read it). */
KVP_PUBLIC void *kvp_lease_device_kv(const kvp_lease *l, uint64_t pos, uint32_t layer, uint32_t kv,
				     uint32_t kv_head);

/* ---- engine layouts ------------------------------------------------------ */

/* Inference engines keep their KV cache in paged layouts of their own, per
 * layer; these calls copy whole pages between kvpalace pages (struct
 * kvp_page_view.base of kvp_session_page / kvp_lease_page) and an engine's
 * blocks, for a list of pages in one call, on the CPU. The engine's cache
 * is described by element strides: element c (c < head_dim, contiguous) of
 * (block b, token t, head h) of layer L's K is at byte
 *   k_layers[L] + (b * block_stride + t * token_stride + h * head_stride + c)
 *                 * elem_bytes
 * and of its V at the same offset from v_layers[L], or, when v_layers is
 * NULL, from k_layers[L] + v_offset * elem_bytes (K and V in one tensor).
 * The named layouts (kvp_engine_cache_init), H heads, D head_dim, bs
 * block_size, per layer:
 *   KVP_ENGINE_FLASH_ATTN      vLLM's FlashAttention: one tensor
 *                              [2, num_blocks, bs, H, D], K then V
 *                              (v_offset num_blocks * bs * H * D), or two
 *                              [num_blocks, bs, H, D] given as v_layers
 *   KVP_ENGINE_FLASHINFER_NHD  [num_blocks, 2, bs, H, D]
 *   KVP_ENGINE_FLASHINFER_HND  [num_blocks, 2, H, bs, D]
 *   KVP_ENGINE_SGLANG          a K pool and a V pool [num_blocks * bs, H, D]
 *                              (token slots; block b is slots b * bs ..
 *                              b * bs + bs - 1), v_layers required
 * A latent cache (MLA: one "head" of the latent width) is H = 1; with a
 * latent layout (KVP_FORMAT_LATENT) only the K tensors are written or
 * read (the engine's one latent tensor per layer as k_layers), v_layers
 * and v_offset are not used. Raw fp8 layouts copy 1-byte elements
 * (elem_bytes 1); the pages' scales are not copied (the engine keeps its
 * own k_scale / v_scale: compare them with kvp_page_view.scales). Other
 * layouts: fill the struct yourself (kind 0 means "strides given"). */
enum kvp_engine_kind {
	KVP_ENGINE_FLASH_ATTN = 1,
	KVP_ENGINE_FLASHINFER_NHD = 2,
	KVP_ENGINE_FLASHINFER_HND = 3,
	KVP_ENGINE_SGLANG = 4,
};

/* An engine's paged cache. The layer arrays belong to the caller and must
 * stay valid (and point to the tensors) while the struct is used; nothing
 * is allocated. Strides and v_offset count elements. */
struct kvp_engine_cache {
	uint32_t kind; /* enum kvp_engine_kind, or 0 */
	uint32_t n_layers;
	uint32_t num_blocks;
	uint32_t block_size; /* tokens per block: the pages' block_tokens */
	uint32_t n_heads;    /* KV heads this engine holds */
	uint32_t head_dim;
	uint32_t elem_bytes; /* 1 (raw fp8), 2 (f16, bf16) or 4 (f32): the pages' */
	uint32_t reserved;   /* 0 */
	uint64_t block_stride;
	uint64_t token_stride;
	uint64_t head_stride;
	uint64_t v_offset;     /* when v_layers is NULL */
	void *const *k_layers; /* [n_layers] base of layer L's K (or K and V) */
	void *const *v_layers; /* [n_layers] base of layer L's V, or NULL */
};

/* Fills *ret for one of the named layouts above: k_layers[L] is the base
 * of layer L's tensor (element 0 of its K), v_layers NULL (K and V in one
 * tensor: FlashAttention's [2, ...] and FlashInfer's) or the bases of the
 * layers' V (FlashAttention's split K and V, SGLang's V pools). Errors:
 * -EINVAL ret or k_layers NULL, an unknown kind, a zero dimension,
 * elem_bytes not 1, 2 or 4, v_layers NULL for KVP_ENGINE_SGLANG; -ERANGE a
 * tensor whose extent overflows 63 bits of bytes. Nothing is read
 * through the layer arrays (they may hold device pointers). */
KVP_PUBLIC int kvp_engine_cache_init(struct kvp_engine_cache *ret, uint32_t kind, uint32_t n_layers,
				     void *const *k_layers, void *const *v_layers,
				     uint32_t num_blocks, uint32_t block_size, uint32_t n_heads,
				     uint32_t head_dim, uint32_t elem_bytes);

/* Which layers and heads a copy moves (NULL: every layer and head, the
 * engine then holding exactly the pages' layers and heads): page layer
 * layer_first + i and head head_first + j <-> engine layer
 * engine_layer_first + i and head engine_head_first + j, for i < n_layers,
 * j < n_heads. A tensor-parallel rank holding heads [8r, 8r + 8) of the
 * model's KV heads passes head_first 8r, n_heads 8, engine_head_first 0. */
struct kvp_adapt_range {
	uint32_t layer_first;
	uint32_t n_layers; /* >= 1 */
	uint32_t head_first;
	uint32_t n_heads; /* >= 1 */
	uint32_t engine_layer_first;
	uint32_t engine_head_first;
};

/* Copies, for i < n_pages, the K and V rows (a latent layout: its one
 * plane, to and from k_layers) of the page at page_bases[i]
 * (laid out as layout says, the pool's: kvp_pool_layout) into engine block
 * block_ids[i]: tokens [0, block_tokens) of each page but the last, and
 * [0, last_page_tokens) of the last (a partial page: its view's n_tokens),
 * of the layers and heads of range. Bytes are copied unchanged (the
 * engine's element type is the pages'); nothing else of the engine's
 * cache is written. Writing into pages follows kvp_session_kv's rules
 * (only reserved, uncommitted positions), and pages of different tokens
 * must not be the same page. Thread-safe (no state, no daemon): several
 * threads may copy disjoint lists at once.
 * Errors (checked before anything is written):
 *   -EINVAL   layout, cache, or (n_pages > 0) page_bases, block_ids, a
 *             page base or a layer base NULL; a layout kvp_pool_open
 *             would refuse; a zero cache dimension; elem_bytes, head_dim
 *             or block_size that differ from the layout's; strides under
 *             which two rows of one engine tensor overlap; last_page_tokens
 *             0 or above block_tokens; range with a zero count; no range
 *             while the engine's n_layers or n_heads differ from the
 *             layout's; cache->reserved not 0
 *   -EOPNOTSUPP  a quantized layout (int8, fp8-e4m3, int4)
 *   -ERANGE   a block id < 0 or >= num_blocks; range past the layout's or
 *             the engine's layers or heads; an engine tensor whose extent
 *             overflows 63 bits of bytes or wraps the address space
 * n_pages 0 is a no-op that returns 0 once the geometry checks pass. */
KVP_PUBLIC int kvp_pages_to_engine(const struct kvp_layout *layout,
				   void *const *page_bases /* [n_pages] */, size_t n_pages,
				   uint32_t last_page_tokens, const struct kvp_engine_cache *cache,
				   const int32_t *block_ids /* [n_pages] */,
				   const struct kvp_adapt_range *range);

/* The other way: engine block block_ids[i] into the page at
 * page_bases[i], same rows, same arguments, same errors. */
KVP_PUBLIC int kvp_engine_to_pages(const struct kvp_layout *layout,
				   void *const *page_bases /* [n_pages] */, size_t n_pages,
				   uint32_t last_page_tokens, const struct kvp_engine_cache *cache,
				   const int32_t *block_ids /* [n_pages] */,
				   const struct kvp_adapt_range *range);

/* ---- statistics --------------------------------------------------------- */

struct kvp_pool_stats {
	uint64_t pool_id;
	uint32_t uid;
	char model_id[128];
	struct kvp_layout layout;
	uint64_t page_bytes;
	uint32_t n_pages;
	uint32_t free_pages;
	uint32_t reserved_pages; /* held only by uncommitted reservations */
	uint32_t leased_pages;	 /* pinned by at least one read lease */
	uint32_t n_sessions;
	uint32_t indexed_pages;	  /* held by the prefix index */
	uint32_t evictable_pages; /* indexed leaves nobody else holds */
	/* Index pages evicted since the daemon started: dropped from the
	 * cache, gone from every tier. Pages the host tier hands to the disk
	 * tier are not evicted from the cache: they count in spilled_pages. */
	uint64_t evictions;
	uint64_t dedup_pages; /* committed pages replaced by an indexed copy */
	/* The disk tier; all 0 when the pool has none (has_disk 0). */
	int has_disk;
	uint32_t host_indexed_pages; /* indexed pages with a copy in the host tier */
	uint32_t disk_pages;	     /* indexed pages with a copy in the spill file */
	uint32_t disk_capacity;	     /* pages the spill file may hold */
	uint64_t spilled_pages;	     /* written to disk since start */
	uint64_t promoted_pages;     /* read back from disk and verified */
	uint64_t verify_failures;    /* read back with a wrong checksum: served as misses */
	uint64_t io_errors;	     /* disk reads or writes that failed */
	uint64_t disk_dropped;	     /* disk-only pages dropped for room */
	uint64_t restored_pages;     /* found in the spill file when the daemon started;
				      * grows while the pool's first open after a
				      * start scans the file (pages are matchable as
				      * they are found, misses before) */
	int disk_scanning;	     /* 1 while that scan runs, 0 once every page
				      * of the file is listed */
	uint32_t permanent_pages;    /* indexed pages of permanent spans: leave host last */
	uint64_t quantized_pages;    /* spilled in the daemon's spill-dtype (lossy) */
	/* The GPU tier; all 0 when the pool has no device arena (has_gpu 0). */
	int has_gpu;
	uint32_t device_pages;		   /* slots of its device arena */
	uint32_t device_used_pages;	   /* leased, cached or being copied */
	uint64_t device_copied_pages;	   /* host→device copies since start */
	uint64_t device_dropped_pages;	   /* cached copies dropped (watermark, admin evict) */
	uint64_t device_copied_back_pages; /* device→host copies of GPU appends */
	uint64_t device_copy_errors;	   /* copies that failed, either way */
	/* The disk tier, continued (0 without one). */
	uint64_t disk_gone_pages;      /* disk copies whose data the spill file no longer held
					* (the file was cut short): misses, not I/O errors */
	uint64_t lossy_replaced_pages; /* lossy disk copies (spill-dtype) replaced by an exact
					* commit of the same tokens */
	uint64_t purged_pages;	       /* index pages an admin purged or dropped since start */
	/* Spill writes refused because the user's disk share (disk-tenant-size)
	 * or the tier's (disk-tier-size) was used up by other pools, or the
	 * cache file system reached disk-reserve: those pages were dropped,
	 * not written. */
	uint64_t disk_refused_pages;
	uint32_t persistent_sessions; /* of n_sessions, persistent (kvp_session_set_persistent) */
	uint32_t unowned_sessions;    /* of those, owned by no open connection: they close
					* after the daemon's session-idle-timeout unused */
	/* Disk tier wear (0 without one, or from an older daemon): bytes
	 * written to the spill file (pages and headers), bytes read back and
	 * verified, and host victims dropped instead of written because no
	 * second request had used them (the daemon's disk-admission reused). */
	uint64_t disk_written_bytes;
	uint64_t disk_served_bytes;
	uint64_t disk_unadmitted_pages;
	/* Prewarm (the daemon's host-prewarm-watermark; 0 without it): disk
	 * pages read back ahead of any request, and of them those a request
	 * used before they left the host tier and those that left unused. */
	uint64_t prewarm_pages;
	uint64_t prewarm_used_pages;
	uint64_t prewarm_unused_pages;
};

/* Latency histogram of one request type (struct kvp_stats): bucket i
 * counts the requests answered in more than kvp_latency_bound_ns(i - 1)
 * and at most kvp_latency_bound_ns(i) nanoseconds (not cumulative); the
 * last bucket has no upper bound. */
#define KVP_LATENCY_BUCKETS 20
struct kvp_latency {
	char request[32]; /* the request's name in kvpalace.proto, "MatchPrefix" */
	uint64_t count;	  /* requests answered */
	uint64_t sum_ns;  /* their latencies added up */
	uint64_t buckets[KVP_LATENCY_BUCKETS];
};

/* The upper bound of latency bucket i in nanoseconds: 10 µs, 25 µs, 50 µs,
 * 100 µs, ... (1, 2.5, 5 per decade) up to 10 s for i = 18, and
 * UINT64_MAX for the last bucket (i = KVP_LATENCY_BUCKETS - 1) and beyond. */
KVP_PUBLIC uint64_t kvp_latency_bound_ns(unsigned int i);

struct kvp_stats {
	uint64_t uptime_ms;
	uint64_t connections; /* open now */
	uint64_t requests;
	uint64_t errors;
	uint64_t match_hits;
	uint64_t match_misses;
	uint64_t matched_tokens;
	uint64_t appended_tokens;
	uint64_t committed_tokens;
	uint64_t disconnects_bad; /* connections closed for misbehaviour */
	int gpu;		  /* a GPU tier is available */
	char gpu_status[128];
	size_t n_pools;
	struct kvp_pool_stats *pools; /* n_pools entries */
	int pools_truncated;	      /* more pools exist than fit in one reply */
	uint64_t evictions;	      /* pages evicted (dropped from the cache), every pool */
	uint64_t dedup_pages;	      /* committed pages replaced by an indexed copy */
	char disk_io[48];	      /* disk I/O backend, "" without a disk tier */
	uint64_t spilled_pages;	      /* sums over the pools listed */
	uint64_t promoted_pages;
	uint64_t verify_failures;
	uint64_t io_errors;
	/* Checkpoints since the daemon started, every tenant (0 from a daemon
	 * without checkpoints). */
	uint64_t checkpoints_written;
	uint64_t checkpoints_restored; /* restores and warm-ups that succeeded */
	uint64_t checkpoints_refused;  /* files refused: corrupt, truncated, foreign, newer */
	uint64_t checkpoint_failures;  /* writes that failed: disk full, I/O error */
	uint64_t warmed_up_pages;      /* pages loaded into prefix indexes by warm-up */
	uint64_t checkpoints_removed;  /* kvp_checkpoint_remove calls that removed a file */
	/* Restores and warm-ups that waited for the host tier to write cached
	 * pages to the disk tier before there was room for theirs. */
	uint64_t restore_waits;
	uint64_t purges;       /* kvp_admin_purge() calls served, every tenant */
	uint64_t purged_pages; /* index pages purges and admin drops forgot */
	/* Session lifetime since the daemon started (kvp_session_create). */
	uint64_t sessions_closed_with_connection; /* closed because their connection closed */
	uint64_t sessions_expired; /* persistent, closed after session-idle-timeout unused */
	uint64_t unowned_sessions; /* persistent sessions no open connection owns, now */
	/* Closing sessions of the hierarchy policy whose indexed pages were
	 * placed by their layers (those outside the budget leave the host
	 * tier first), and long ones left where they were because the
	 * tenant had a placement running (it takes a worker). */
	uint64_t placed_sessions;
	uint64_t unplaced_sessions;
	/* MatchPrefix queries: the prompt tokens they asked about and the
	 * whole pages those tokens fill, and the pages served (matched_tokens
	 * counts the tokens served). The token hit ratio is matched_tokens /
	 * queried_tokens, the page hit ratio matched_pages / queried_pages;
	 * match_hits counts queries that found at least one page. All 0 from
	 * a daemon older than these fields. */
	uint64_t queried_tokens;
	uint64_t queried_pages;
	uint64_t matched_pages;
	char version[32]; /* the daemon's version, "" from an older daemon */
	/* How long the daemon took to answer each request type since it
	 * started (the caller's tenant; every tenant on an admin connection),
	 * from the request's arrival to its reply being queued: one entry per
	 * type that was served at least once, in no set order. */
	size_t n_latencies;
	struct kvp_latency *latencies; /* n_latencies entries */
	/* The daemon's event loop: "io_uring", or "epoll" where io_uring is
	 * denied (a container's seccomp profile) or configured off; "" from an
	 * older daemon. */
	char event_loop[16];
	/* kvp_pool_stats' disk wear fields, summed over the caller's pools. */
	uint64_t disk_written_bytes;
	uint64_t disk_served_bytes;
	uint64_t disk_unadmitted_pages;
	/* The remote tier (a Redis Cluster shared by machines), when the
	 * daemon has one (remote_on). The page counts are the caller's
	 * tenant's (every tenant's on an admin connection); the rest is
	 * the daemon's cluster client, on an admin connection only
	 * (remote_client set), else 0. */
	int remote_on;
	int remote_client;
	struct kvp_remote_stats {
		uint32_t nodes_up, nodes_down; /* masters serving slots, as last seen */
		uint64_t pages_written;	       /* handed to the cluster (see remote-write) */
		uint64_t write_failures;       /* of them, not stored */
		uint64_t fetches;	       /* batches asked for past the local tiers */
		uint64_t pages_fetched;	       /* came back verified and listed */
		uint64_t fetch_misses;	       /* asked for and not had, for any reason */
		uint64_t fetched_bytes;
		uint64_t gets, hits, misses, corrupt, timeouts, errors; /* the client's pages */
		uint64_t puts, stored, dropped_puts, dropped_gets;
		uint64_t bytes_in, bytes_out, inflight_bytes;
	} remote;
	/* kvp_pool_stats' prewarm fields, summed over the caller's pools. */
	uint64_t prewarm_pages;
	uint64_t prewarm_used_pages;
	uint64_t prewarm_unused_pages;
};

/* Counters and pools of the caller's tenant (its uid): its requests,
 * connections, matches, tokens and checkpoints, and its own pools; on an
 * admin connection the daemon's counters and every pool. uptime_ms, gpu
 * and disk_io describe the daemon. Free the result with kvp_stats_free(). */
KVP_PUBLIC int kvp_stats(kvp_client *c, struct kvp_stats **ret_stats);
KVP_PUBLIC void kvp_stats_free(struct kvp_stats *st);

struct kvp_session_info {
	uint64_t session_id;
	uint64_t pool_id;
	uint32_t uid;
	uint64_t n_tokens;
	uint64_t committed_tokens;
	uint32_t n_pages;
	uint32_t shared_pages; /* pages another session, lease or the index also holds */
	uint64_t idle_ms;      /* since the session was last used */
	int writing;	       /* a client holds uncommitted tokens */
};

/* Every session of the caller's pools (of every pool on an admin
 * connection), or of pool_id only when it is not 0, in id order: *ret_n
 * entries in a malloc'd array, which is not NULL even when empty. Free the
 * array with free(). Long lists take several requests (up to
 * KVP_LIST_SESSIONS_MAX sessions each, through kvp_list_sessions_page);
 * a session that exists throughout is listed exactly once, sessions
 * created or closed meanwhile may or may not appear. A user's connection
 * lists only its own tenant's sessions; a pool_id of another tenant lists
 * nothing. */
KVP_PUBLIC int kvp_list_sessions(kvp_client *c, uint64_t pool_id,
				 struct kvp_session_info **ret_sessions, size_t *ret_n);

/* The most sessions one ListSessions reply holds: a larger limit is
 * capped to it by the daemon. */
#define KVP_LIST_SESSIONS_MAX 1024u

/* One page of the same listing: the sessions with id above after_id (0:
 * from the first), in id order, at most limit of them (1 or more; capped
 * at KVP_LIST_SESSIONS_MAX, and fewer when the reply would pass the
 * daemon's message cap), in a malloc'd array of *ret_n entries (not NULL
 * even when empty; free() it). *ret_more is 1 when more sessions follow:
 * pass the last id listed as after_id to go on. Ids only grow, so paging
 * this way lists each session that exists throughout exactly once, in
 * order, whatever is created or closed between pages; one created
 * meanwhile may or may not appear (a tenant's new ids are larger than
 * its earlier ones, but an admin's listing may have passed its tenant),
 * one closed meanwhile may have been listed already. A page costs the
 * daemon O(limit + log sessions). Returns 0, -EINVAL (limit 0, a NULL
 * argument), -EPROTO (a reply out of order: connection broken), or a
 * connection error. */
KVP_PUBLIC int kvp_list_sessions_page(kvp_client *c, uint64_t pool_id, uint64_t after_id,
				      uint32_t limit, struct kvp_session_info **ret_sessions,
				      size_t *ret_n, int *ret_more);

/* ---- KV events (for routers) ------------------------------------------- */

/* A router places a request on the machine that holds its prefix. It
 * learns what each machine holds from its daemon's KV events: a page that
 * entered a pool's prefix index (committed, or found on disk at a
 * restart), one that left it (evicted, dropped, purged; moving between
 * the host and disk tiers is no event), and a pool that ended. Pages are
 * named by their hash chain (16 bytes), and a committed page of at most
 * 64 tokens carries its tokens, so a router can key pages by the tokens
 * its own requests carry (as routers that read vLLM's events do).
 *
 * Subscribe on a connection of its own, which is then for events only:
 * after kvp_events_subscribe() only kvp_events_read(), kvp_client_fd()
 * (poll it for readability) and kvp_disconnect() work on it; calls that
 * talk to the daemon fail with -EBUSY. A client socket's subscriber sees
 * its own tenant's pools, one on the admin socket every pool. Events are
 * numbered from 1: on the admin socket across the daemon, on a client
 * socket among the tenant's own events (the pool's, when subscribed to
 * one pool), so that nothing of other tenants' traffic shows. The daemon
 * keeps the last 16384 events of each tenant that has a subscriber for
 * one that reads slowly, so only its own tenant's traffic can push a
 * client socket's subscriber behind; the admin socket's subscribers
 * share the last 16384 events of all tenants. One that falls further
 * behind is told how many of its events it lost (lost; a subscriber of
 * one pool with the first of its events after the gap): what it built
 * from earlier events is stale then. At most 32 tenants have events kept
 * for them at once: a subscriber of another is refused with -EDQUOT
 * until one of theirs has no subscriber left. Events of work the daemon
 * does in the background come within a second. */
enum kvp_event_kind {
	KVP_EVENT_STORED = 1,  /* a page entered the index */
	KVP_EVENT_REMOVED = 2, /* a page left it */
	KVP_EVENT_CLEARED = 3, /* a pool ended: every page of it is gone */
};

struct kvp_event {
	uint32_t kind; /* enum kvp_event_kind */
	uint32_t
		tier; /* STORED: where it is, REMOVED: where it was last (KVP_TIER_*); 0 for CLEARED */
	uint64_t seq;
	uint64_t pool_id;
	uint8_t hash[16];   /* the page's hash chain (XXH3-128: low 64 bits first, little-endian) */
	uint8_t parent[16]; /* STORED: the hash of the page before, when has_parent */
	int has_parent;	    /* 0: a first page (or not STORED) */
	uint32_t block_tokens;
	size_t n_tokens;	/* STORED by a commit: the page's tokens (else 0) */
	const uint32_t *tokens; /* [n_tokens], inside the array kvp_events_read returned */
};

/* Subscribes c to the KV events of pool_id (0: every pool it may see).
 * Returns 0 and the number the first event it gets will have at least in
 * *ret_next_seq (may be NULL); -EEXIST when c subscribes already,
 * -ENOENT no such pool (for c), -EBUSY submitted operations are in flight
 * on c, -EDQUOT the daemon keeps events for 32 other tenants already (try
 * later), -ENOMEM, or a transport error. */
KVP_PUBLIC int kvp_events_subscribe(kvp_client *c, uint64_t pool_id, uint64_t *ret_next_seq);

/* Waits up to timeout_ms (poll's: -1 for ever, 0 not at all) for the next
 * batch of events on a subscribed c. Returns 1 with *ret_n events in
 * *ret_events (free with kvp_events_free; *ret_n may be 0 when only lost
 * is news) and in *ret_lost how many events were lost just before them;
 * 0 when nothing came in time; -EINVAL when c did not subscribe; -EPROTO
 * (the client is broken) for a push that is not well formed, or a
 * transport error. */
KVP_PUBLIC int kvp_events_read(kvp_client *c, int timeout_ms, struct kvp_event **ret_events,
			       size_t *ret_n, uint64_t *ret_lost);

/* Frees what kvp_events_read returned (NULL is fine). */
KVP_PUBLIC void kvp_events_free(struct kvp_event *events);

/* ---- checkpoints -------------------------------------------------------- */

/* A checkpoint is a session's committed tokens and their pages, written
 * durably by the daemon under a name in its tenant's directory
 * (<state-dir>/checkpoints/<uid>/<name>). It outlives the connection and
 * the daemon, and is restored into a pool of the same model id and layout.
 * A name is 1..KVP_CHECKPOINT_NAME_MAX bytes of [A-Za-z0-9._-], the first
 * a letter, a digit or '_'; each tenant has its own names. The daemon
 * answers these calls once the work is done (the file written and
 * fsynced, or read, verified and rebuilt), so they take as long as the
 * disk does; the client's other calls wait for them. Besides the errors
 * each call lists:
 *   -EINVAL     not a valid checkpoint name (checked here, before any
 *               round trip)
 *   -EIO        the daemon has no checkpoint directory, or the disk failed
 *   -EOPNOTSUPP what the checkpoint holds is not supported yet */

#define KVP_CHECKPOINT_NAME_MAX 64

/* 0 when name is a valid checkpoint name, else -EINVAL (NULL included).
 * The calls below check it too; this is for a caller that wants to refuse
 * a name before it connects. */
KVP_PUBLIC int kvp_checkpoint_name_check(const char *name);

/* Writes the committed tokens of s (uncommitted ones are left out) and
 * their pages as checkpoint `name` of the caller's tenant. An older
 * checkpoint of that name is replaced only once the new one is durable:
 * when the write fails the old one stays. *ret_bytes (may be NULL) gets
 * the size of the file. s is unchanged and stays usable.
 * Errors: -ENOENT the session was closed; -ENOSPC the disk is full (or
 * the user's disk quota); -EIO the write failed. */
KVP_PUBLIC int kvp_session_checkpoint(kvp_session *s, const char *name, uint64_t *ret_bytes);

/* kvp_session_checkpoint with the pages stored quantized as dtype
 * (KVP_DTYPE_INT8, KVP_DTYPE_FP8_E4M3 or KVP_DTYPE_INT4, per-token groups
 * of 32 channels): about half (a quarter for int4) of the bytes, lossy
 * within the quantization bounds of kernels/kernels.h; a restore turns
 * them back into the pool's format. Errors as kvp_session_checkpoint, and
 * -EINVAL when the pool's pages cannot take that form (already quantized,
 * or they would not shrink). */
KVP_PUBLIC int kvp_session_checkpoint_as(kvp_session *s, const char *name, uint32_t dtype,
					 uint64_t *ret_bytes);

/* Rebuilds the session saved as checkpoint `name` of the caller's tenant
 * in pool p, which must have the checkpoint's model id and layout: a new
 * session holding its tokens, all committed, with the same K/V and the
 * salt it was written with. Its full pages are shared with the prefix
 * index where the index holds the same content, and enter it otherwise,
 * so later matches find them. The handle works as a fork's
 * (kvp_session_kv, kvp_append, kvp_session_fork, ...) and is freed with
 * the pool or by kvp_session_close; the session belongs to this
 * connection as a created one does (kvp_session_set_persistent keeps it
 * longer). Nothing is restored when the call fails; a client that goes
 * away before the daemon has finished gets no session either (the daemon
 * closes the one it built; its full pages stay in the prefix index). Errors: -ENOENT no checkpoint of that name; -EBADMSG the file is
 * corrupt or truncated (it failed verification), or it is another
 * checkpoint's file (it records another name or owner: copied or renamed
 * over this name); -EPROTONOSUPPORT it was
 * written in a newer format; -EINVAL it holds another model id or layout
 * than p (or an invalid name); -ENOSPC no room in the host tier (its full
 * pages already in p's prefix index take none: they are shared; a host
 * tier full of cached pages being written to disk is waited for); -EDQUOT
 * the pool's session limit or the daemon's token limit; -EOPNOTSUPP a
 * kind of session this daemon cannot rebuild. */
KVP_PUBLIC int kvp_session_restore(kvp_pool *p, const char *name, kvp_session **ret_session);

struct kvp_checkpoint_info {
	char name[KVP_CHECKPOINT_NAME_MAX + 1];
	uint32_t uid;		  /* the tenant it belongs to */
	char model_id[128];	  /* "" when the file cannot be read */
	struct kvp_layout layout; /* zeros when the file cannot be read */
	uint64_t n_tokens;
	uint64_t bytes; /* size of the file */
	uint64_t created_unix_ms;
	const char *error; /* why it cannot be restored, or NULL when it can */
	/* The file's format version (0 when it cannot be read); files of
	 * version 3 and later record the checkpoint's name and are refused
	 * under another (a copy or a rename), older ones are taken to be the
	 * checkpoint their file is named. */
	uint32_t format_version;
	/* 1 when every page was read and checked (KVP_LIST_VERIFY) and the
	 * file restores unless it changes; 0 when only the header was read
	 * and checked: a damaged page then shows only at a restore. */
	int verified;
};

struct kvp_checkpoint_list {
	int truncated; /* more checkpoints exist than fit in one reply */
	size_t n_entries;
	struct kvp_checkpoint_info *entries; /* [n_entries] by uid, then name */
};

/* The checkpoints of the caller's tenant; on the admin socket those of
 * every tenant, or of uid only when has_uid (has_uid is refused with
 * -EPERM on the client socket). A file the daemon cannot read is listed
 * with its error (corrupt, truncated, newer format) instead of its
 * contents. *ret is one allocation (entries and strings included), valid
 * until kvp_checkpoint_list_free(). */
KVP_PUBLIC int kvp_list_checkpoints(kvp_client *c, int has_uid, uint32_t uid,
				    struct kvp_checkpoint_list **ret);
/* Frees a list; NULL is accepted. */
KVP_PUBLIC void kvp_checkpoint_list_free(struct kvp_checkpoint_list *l);

/* kvp_list_checkpoints flag: read and check every page of each file, not
 * only its header (as long as reading the files takes). */
#define KVP_LIST_VERIFY 0x1u

/* kvp_list_checkpoints with flags (KVP_LIST_VERIFY or 0), and, when name
 * is not NULL, only checkpoint `name` (an empty list when there is no
 * such file). Verifying a checkpoint at a time (list, then each name)
 * lets a caller show progress. Errors as kvp_list_checkpoints, and
 * -EINVAL an invalid name or unknown flags. */
KVP_PUBLIC int kvp_list_checkpoints_ex(kvp_client *c, int has_uid, uint32_t uid, const char *name,
				       unsigned int flags, struct kvp_checkpoint_list **ret);

/* Removes checkpoint `name` of the caller's tenant (on the admin socket,
 * of uid's when has_uid) durably: the daemon unlinks the file and fsyncs
 * its directory before it answers. *ret_bytes (may be NULL) gets the size
 * of the file removed. Only the caller's own checkpoints can be named.
 * Errors: -ENOENT no such checkpoint; -EPERM has_uid on the client
 * socket; -EIO the disk failed (when only the directory's fsync failed
 * the name is gone but may come back after a crash). */
KVP_PUBLIC int kvp_checkpoint_remove(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				     uint64_t *ret_bytes);

/* ---- administration (the admin socket only) ----------------------------- */

/* These calls steer the daemon. They need a connection to the admin socket
 * (kvp_connect() on it; kvp_is_admin() says so): on the client socket they
 * fail with -EPERM. Ids name any user's pools and sessions. Results are
 * one allocation each: free() them. */

struct kvp_session_detail {
	struct kvp_session_info info;
	char model_id[128];
	struct kvp_layout layout;
	int salted;		 /* created with a cache salt */
	uint32_t reserved_pages; /* pages holding only uncommitted tokens */
	uint32_t writer_pid;	 /* pid of the client holding uncommitted tokens, 0 if none */
	size_t n_page_slots;	 /* the first pages of the page table, from page 0: */
	uint32_t *page_slots;	 /* [n_page_slots] arena slot of page i */
	uint32_t *page_holders;	 /* [n_page_slots] sessions, leases and index holding it */
	uint32_t policy;	 /* enum kvp_policy_kind */
	uint32_t budget;	 /* tokens the policy keeps at the session's length now */
	int compacted;
	uint64_t dropped_tokens; /* by compactions */
};

/* One session in detail, with the slots of its first max_slots pages
 * (0..4096; fewer when it has fewer, or when they do not fit in one
 * message). Errors: -ENOENT no such session; -EINVAL max_slots > 4096;
 * -EPERM not the admin socket. */
KVP_PUBLIC int kvp_admin_show_session(kvp_client *c, uint64_t session_id, uint32_t max_slots,
				      struct kvp_session_detail **ret_detail);

/* Drop even what is in use: a session a client is writing, a pool with
 * sessions or read leases. */
#define KVP_DROP_FORCE 1u

struct kvp_drop_session_result {
	uint64_t session_id;
	uint64_t pool_id;
	uint64_t n_tokens; /* what the session held */
	uint64_t committed_tokens;
	uint32_t freed_pages; /* pages that went back to the pool's free list */
	int was_writing;      /* a client's uncommitted tokens were rolled back */
};

/* Closes a session of any user, as kvp_session_close() would, and
 * forgets in every tier the prefix-index pages of its prefix that no other
 * session or read lease holds, with every cached page continuing them: no
 * later match finds them, after a restart either (the daemon invalidates
 * their disk copies and syncs before it answers). Pages another holder
 * shares stay indexed (they are that holder's too: kvp_admin_purge()
 * removes them). A session a client is writing (uncommitted tokens) is
 * refused with -EBUSY unless flags has KVP_DROP_FORCE; then its
 * reservation is rolled back, and the writer's later calls on it fail
 * with -ENOENT. *ret (may be NULL) says what went. Errors: -ENOENT,
 * -EBUSY (also: disk I/O of the pool would not finish: try again), -EIO
 * (dropped, but the disk copies could not be invalidated: a restart may
 * find them), -EPERM. */
KVP_PUBLIC int kvp_admin_drop_session(kvp_client *c, uint64_t session_id, unsigned int flags,
				      struct kvp_drop_session_result *ret);

struct kvp_drop_pool_result {
	uint64_t pool_id;
	uint32_t uid;
	char model_id[128];
	uint32_t sessions_closed;
	uint32_t leases_released;
	uint64_t arena_bytes; /* host tier bytes given back */
};

/* Frees a pool of any user: its arena, prefix index, pages and spill file
 * (removed, and the removal synced, before the call returns: a pool of the
 * same identity starts empty, after a restart too). Refused with -EBUSY
 * while it has sessions or read leases, unless flags has KVP_DROP_FORCE:
 * then its sessions are closed and the leases on it released first, and
 * their owners' later calls on them fail with -ENOENT. Processes that
 * mapped the arena keep a valid mapping of memory nobody else uses.
 * Errors: -ENOENT, -EBUSY (also: disk I/O, a checkpoint or the scan of the
 * spill file after a restart in flight),
 * -EIO and others from removing the spill file (nothing dropped; or, for
 * -EIO, dropped but the removal may not survive a crash), -EPERM. */
KVP_PUBLIC int kvp_admin_drop_pool(kvp_client *c, uint64_t pool_id, unsigned int flags,
				   struct kvp_drop_pool_result *ret);

/* kvp_admin_evict's max_bytes for "no limit". */
#define KVP_EVICT_ALL UINT64_MAX

struct kvp_evicted_pool {
	uint64_t pool_id;
	uint64_t pages;
	uint64_t bytes;
};

struct kvp_evict_result {
	uint64_t pages; /* left the tier in this request, every pool */
	uint64_t bytes;
	int more; /* stopped at a limit of the request: ask again */
	size_t n_pools;
	struct kvp_evicted_pool *pools; /* [n_pools] pools that lost pages */
	uint64_t demoted;		/* of pages: still cached in a lower tier */
	uint64_t dropped;		/* of pages: gone from the cache */
};

/* kvp_admin_evict_flags(): drop pages leaving the host tier instead of
 * writing them to the disk tier. */
#define KVP_EVICT_DISCARD 1u

/* One eviction request: moves cached pages that nothing but the prefix
 * index holds (least recently used first) out of tier, pool by pool,
 * oldest pool first (pool_id only, when not 0), until max_bytes (whole
 * pages; KVP_EVICT_ALL for no limit) or max_pages (0: the daemon's limit,
 * 65536) is reached. A large eviction is several calls: go on while
 * result->more, taking what went off max_bytes.
 *  - KVP_TIER_HOST: pages go down to the disk tier, as the watermarks move
 *    them: those with a disk copy at once, the others once written (the
 *    call returns when they are; one call writes in one pool at most).
 *    A page whose parent in the hash chain is not on disk yet takes the
 *    parent along (a child on disk is useless without it), so a call may
 *    move a few pages more than max_bytes or max_pages.
 *    With KVP_EVICT_DISCARD, or in a pool without a disk tier, pages
 *    without a disk copy are dropped instead, leaves of the hash chain
 *    first.
 *  - KVP_TIER_DISK: disk copies go (a page in the host tier keeps its host
 *    copy; a disk-only page leaves the cache, leaves first), for good: the
 *    daemon invalidates their headers and syncs before it answers.
 *  - KVP_TIER_GPU: device copies that no lease holds (their pages stay in
 *    the host or disk tier).
 * kvp_admin_evict() is kvp_admin_evict_flags() with flags 0. Errors:
 * -EOPNOTSUPP the daemon has no such tier; -ENOENT no such pool; -EINVAL
 * max_bytes 0, an unknown tier or flag, KVP_EVICT_DISCARD with another
 * tier than the host's; -EIO disk headers could not be invalidated;
 * -EPERM. */
KVP_PUBLIC int kvp_admin_evict(kvp_client *c, uint32_t tier, uint64_t pool_id, uint64_t max_bytes,
			       uint32_t max_pages, struct kvp_evict_result **ret_result);
KVP_PUBLIC int kvp_admin_evict_flags(kvp_client *c, uint32_t tier, uint64_t pool_id,
				     uint64_t max_bytes, uint32_t max_pages, unsigned int flags,
				     struct kvp_evict_result **ret_result);

/* What kvp_admin_purge() removes: the pages matching every criterion that
 * flags names (at least one). */
#define KVP_PURGE_POOL	       1u  /* of pool pool_id */
#define KVP_PURGE_UID	       2u  /* of pools of user uid */
#define KVP_PURGE_MODEL	       4u  /* of pools of model id model_id */
#define KVP_PURGE_SALT	       8u  /* committed under cache salt salt[0..salt_len) (0: none) */
#define KVP_PURGE_UNUSED_SINCE 16u /* not used since unused_since (time(2) seconds) */

struct kvp_purge_spec {
	unsigned int flags; /* KVP_PURGE_* */
	uint64_t pool_id;
	uint32_t uid;
	const char *model_id;
	const void *salt; /* the bytes a client gave kvp_pool_set_salt() */
	size_t salt_len;  /* 0..64 */
	int64_t unused_since;
	/* With KVP_PURGE_SALT: the pages of that salt under this extra key
	 * (kvp_session_opts; NULL/0: those under none). 1..64 bytes. */
	const void *extra_key;
	size_t extra_key_len;
};

struct kvp_purge_result {
	uint64_t pages;		  /* prefix-index pages forgotten, in every tier */
	uint32_t pools;		  /* pools that lost pages */
	uint64_t host_pages;	  /* of pages: with a copy in the host tier */
	uint64_t disk_pages;	  /* of pages: with a copy in the disk tier */
	uint64_t device_pages;	  /* cached GPU copies forgotten */
	uint64_t held_pages;	  /* host copies sessions or leases still hold */
	uint32_t sessions_marked; /* sessions holding purged pages */
};

/* Purges what may be poisoned (a bad engine build, a leaked salt): forgets
 * for good the prefix-index pages that match spec, with every cached page
 * that continues them in the hash chain (a child is the continuation of
 * its parent's tokens), from every tier at once: no match finds them
 * afterwards, also after a restart (the daemon invalidates their disk
 * copies and syncs before it answers). What counts: a page is one entry
 * of a pool's prefix index (a full page of block_tokens tokens), counted
 * once whatever its copies. A page a session or read lease holds stays
 * with its holder until that ends (held_pages), and is matched no more;
 * such a session (sessions_marked) and forks of such a lease put nothing
 * more into the index, since what they compute rests on the purged page.
 * Pages found on disk at start count as unused since the start unless
 * used since, and as matching every salt when their spill file was written
 * by a daemon that did not record salts. Checkpoint files are left alone.
 * *ret (may be NULL) says what went. Errors: -EINVAL no criterion, an
 * unknown flag, a salt over 64 bytes or a bad model id; -ENOENT no such
 * pool; -EBUSY a pool's disk I/O would not finish (nothing purged: try
 * again); -EIO purged, but the disk copies could not be invalidated (a
 * restart may find them); -EPERM not the admin socket. While the spill
 * file of a pool is still being scanned after a restart the purge waits
 * for the scan's end (a page not listed yet could not be forgotten). */
KVP_PUBLIC int kvp_admin_purge(kvp_client *c, const struct kvp_purge_spec *spec,
			       struct kvp_purge_result *ret);

struct kvp_config_entry {
	const char *key;
	const char *value;  /* as kvpalaced --print-config shows it */
	const char *source; /* "default", "preset", "file" or "command line" */
};

struct kvp_config {
	const char *file;   /* the configuration file read, or NULL */
	const char *preset; /* the preset applied, or NULL */
	int truncated;	    /* entries were left out to fit one message */
	size_t n_entries;
	struct kvp_config_entry *entries; /* [n_entries] in the daemon's order */
};

/* The daemon's effective configuration, each key with its source. */
KVP_PUBLIC int kvp_admin_config_show(kvp_client *c, struct kvp_config **ret_config);

struct kvp_config_reload {
	size_t n_changed;
	const char **changed; /* keys whose value or source changed */
	size_t n_restart_needed;
	const char **restart_needed; /* keys the file changes but only a restart applies */
};

/* Re-reads the configuration as SIGHUP does (file, preset, command line)
 * and applies what may change while serving: log level, watermarks and
 * limits. *ret (may be NULL) says what changed. Errors: -EINVAL the file
 * is bad (kvp_strerror() names the file, line and key; the running
 * configuration stays); -EPERM. */
KVP_PUBLIC int kvp_admin_config_reload(kvp_client *c, struct kvp_config_reload **ret);

/* Writes session session_id of any tenant as checkpoint `name` of its
 * owner's tenant, as kvp_session_checkpoint() does (the same errors). On
 * the client socket the daemon accepts only the caller's own sessions
 * (others are -ENOENT there).
 * *ret_bytes (may be NULL) gets the size of the file. */
KVP_PUBLIC int kvp_admin_checkpoint(kvp_client *c, uint64_t session_id, const char *name,
				    uint64_t *ret_bytes);

struct kvp_restore_info {
	uint64_t session_id;
	uint64_t pool_id;
	uint64_t n_tokens;
	uint32_t n_pages;
	uint32_t shared_pages; /* full pages found in the prefix index already */
};

/* Restores checkpoint `name` of uid's tenant (the caller's when !has_uid)
 * into pool pool_id, which must be that tenant's, or, when pool_id is 0,
 * into the pool of the checkpoint's own model id and layout under that
 * tenant (created if needed). No handle comes back, so the session is
 * persistent and belongs to no connection: it stays in the daemon until
 * closed (kvp_admin_drop_session(), or by its tenant, who may
 * kvp_session_adopt it by id) or until it has gone unused for the
 * daemon's session-idle-timeout; *ret (may be NULL) says what was made. Errors as
 * kvp_session_restore(), and -ENOENT no such pool. On the client socket
 * only the caller's own pools and checkpoints can be named: has_uid is
 * refused with -EPERM and a pool_id of 0 with -EINVAL. */
KVP_PUBLIC int kvp_admin_restore(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				 uint64_t pool_id, struct kvp_restore_info *ret);

struct kvp_warmup_info {
	uint64_t pool_id;
	uint64_t n_tokens;
	uint32_t indexed_pages; /* full pages now in the pool's prefix index */
	uint32_t shared_pages;	/* of which were there already */
};

/* Loads a checkpoint's full pages into the prefix index of its pool
 * (created if needed) without keeping a session, so later prompts with
 * that prefix match it: the checkpoint `name` of uid's tenant when
 * has_uid, else the file `name` of the daemon's warm-up directory (which
 * the daemon also loads at start). Errors as kvp_session_restore(), and
 * -EPERM not the admin socket. */
KVP_PUBLIC int kvp_admin_warmup(kvp_client *c, const char *name, int has_uid, uint32_t uid,
				struct kvp_warmup_info *ret);

#ifdef __cplusplus
}
#endif

#endif
