/* client/api/keys.h — extra keys and key spans as requests carry them
 * (issue 18): client-side checks and the wire KeySpan messages.
 *
 * Layer: api (client/README.md). No state: thread-safe.
 */
#ifndef KVPC_KEYS_H
#define KVPC_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "kvpalace.h"
#include "kvpalace.pb-c.h"

/* Spans one request carries (the daemon's PREFIX_INDEX_MAX_SPANS). */
#define KEYS_MAX_PER_REQUEST 256u
#define KEYS_MAX_KEY_BYTES   64u

/* The wire spans of one request: points into the caller's spans. */
struct keys_wire {
	Kvpalace__V1__KeySpan m[KEYS_MAX_PER_REQUEST];
	Kvpalace__V1__KeySpan *p[KEYS_MAX_PER_REQUEST];
	size_t n;
};

/* 0 when spans[0..n) are valid key spans (sorted, disjoint, n_tokens >= 1,
 * keys of 1..64 bytes, no position past 2^48), else -EINVAL with a static
 * reason in *why. */
int keys_check(const struct kvp_key_span *spans, size_t n, const char **why);

/* 0 when an extra key (NULL/0: none) is valid, else -EINVAL. */
int keys_check_extra(const void *key, size_t len);

/* Empties w, then adds spans[lo..hi) (hi - lo <= KEYS_MAX_PER_REQUEST). */
void keys_wire_set(struct keys_wire *w, const struct kvp_key_span *spans, size_t lo, size_t hi);

/* Adds spans[lo..hi) after w's (as many as fit). */
void keys_wire_add(struct keys_wire *w, const struct kvp_key_span *spans, size_t lo, size_t hi);

/* The index of the first of spans[0..n) (sorted) starting at or after pos. */
size_t keys_first_at(const struct kvp_key_span *spans, size_t n, uint64_t pos);

/* The index of the first of spans[0..n) (sorted) ending after pos. */
size_t keys_first_ending_after(const struct kvp_key_span *spans, size_t n, uint64_t pos);

/* Spans one request to a daemon of max_message_bytes may carry: at most
 * KEYS_MAX_PER_REQUEST and max_message_bytes / 64, which the daemon's
 * unpacking arena (8 bytes per message byte, frame_arena_bytes) holds
 * beside the tokens (about 350 bytes a span). */
static inline size_t keys_max_count(uint32_t max_message_bytes)
{
	size_t n = max_message_bytes / 64;

	return n < KEYS_MAX_PER_REQUEST ? n : KEYS_MAX_PER_REQUEST;
}

/* Wire bytes of a span at most (tags, lengths, two 10-byte varints). */
#define KEYS_WIRE_BYTES(k) (26u + (k)->key_len)

/* The spans of spans[lo..n) (sorted) starting before limit that one
 * request may carry: at most keys_max_count and together at most
 * max_message_bytes / 2 wire bytes. Returns the index after the last,
 * their wire bytes in *ret_bytes. */
size_t keys_take(const struct kvp_key_span *spans, size_t n, size_t lo, uint64_t limit,
		 uint32_t max_message_bytes, size_t *ret_bytes);

/* Copies the first size bytes of an options struct (0: first_size) into
 * out (out_size bytes, zeroed first). NULL in: all zeros. */
void keys_opts_copy(void *out, size_t out_size, const void *in, size_t first_size);

/* Normalizes opts (NULL: defaults) into *o and checks its salt, extra
 * key and spans. Returns 0, or -EINVAL with the client's error set. */
int keys_match_opts(kvp_pool *p, const struct kvp_match_opts *opts, struct kvp_match_opts *o);

#endif
