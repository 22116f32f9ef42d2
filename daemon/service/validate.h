/* daemon/service/validate.h — checks every field of a decoded request before use.
 *
 * protobuf-c has already checked the wire format and required fields; this
 * checks what the schema cannot: which operation is set, counts against the
 * configured limits, model ids, layouts. Pure functions: no state, no
 * logging, thread-safe.
 */
#ifndef KVPD_VALIDATE_H
#define KVPD_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpalace.pb-c.h"
#include "layout.h"

#define VALIDATE_MODEL_ID_MAX 127u
/* Page slots one ShowSession may ask for (admin.h). */
#define VALIDATE_SHOW_SLOTS_MAX 4096u

/* Queries one Lookup may carry: their results (at most 48 bytes each)
 * fit the smallest message cap a daemon may have (FRAME_MIN_MAX_BYTES). */
#define VALIDATE_LOOKUP_MAX_QUERIES 64u

struct validate_limits {
	uint32_t max_tokens_per_request; /* tokens in one Append/MatchPrefix */
	uint64_t max_prompt_tokens;	 /* a MatchPrefix's prompt_tokens (max-session-tokens) */
};

/* Returns 0 when req may be dispatched, else a negative errno (-EPROTO no
 * operation set, -EINVAL a field out of range (an unknown tier, a zero
 * count or id), -EMSGSIZE too many tokens)
 * and a static reason in *ret_reason. */
int validate_request(const Kvpalace__V1__Request *req, const struct validate_limits *lim,
		     const char **ret_reason);

/* The tokens a MatchPrefix carries, in whichever form (tokens or
 * tokens_le, whole 4-byte tokens only: validate_request refuses the rest). */
static inline size_t validate_match_tokens(const Kvpalace__V1__MatchPrefixRequest *m)
{
	return m->has_tokens_le ? m->tokens_le.len / 4 : m->n_tokens;
}

/* Positions a key span may reach (first_token + n_tokens ≤ this). */
#define VALIDATE_MAX_POSITION (1ull << 48)

/* Checks the key spans of one request: at most PREFIX_INDEX_MAX_SPANS,
 * keys of 1..64 bytes, n_tokens ≥ 1, ending at or before
 * VALIDATE_MAX_POSITION, sorted by first_token and disjoint (one may
 * start where the one before ends). Returns 0, or -EINVAL / -EMSGSIZE
 * with a static reason in *ret_reason. Where a span may start relative to
 * a session or lease is the daemon's to check (session_add_spans). */
int validate_key_spans(Kvpalace__V1__KeySpan *const *spans, size_t n, const char **ret_reason);
/* An extra key, when has: 1..64 bytes. Returns 0 or -EINVAL as above. */
int validate_extra_key(int has, size_t len, const char **ret_reason);

/* Converts and checks a wire layout. Returns 0 and fills *ret, or -EINVAL. */
int validate_layout(const Kvpalace__V1__Layout *in, struct shm_layout *ret);
/* Why validate_layout refuses in (a static sentence), NULL when it does not. */
const char *validate_layout_why(const Kvpalace__V1__Layout *in);

/* Returns 0 for 1..VALIDATE_MODEL_ID_MAX bytes of printable ASCII (0x20..0x7e), else
 * -EINVAL. */
int validate_model_id(const char *s);

#endif
