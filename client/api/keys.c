/* client/api/keys.c — extra keys and key spans on the wire (see keys.h). */
#include <errno.h>
#include <string.h>

#include "handle.h"
#include "keys.h"

#define KEYS_MAX_POSITION (1ull << 48)

int keys_check(const struct kvp_key_span *spans, size_t n, const char **why)
{
	if (n && !spans) {
		*why = "key spans: NULL array";
		return -EINVAL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct kvp_key_span *k = &spans[i];

		if (!k->key || k->key_len == 0 || k->key_len > KEYS_MAX_KEY_BYTES) {
			*why = "a key span's key is 1..64 bytes";
			return -EINVAL;
		}
		if (k->n_tokens == 0) {
			*why = "a key span covers 1 token or more";
			return -EINVAL;
		}
		if (k->first_token > KEYS_MAX_POSITION ||
		    k->n_tokens > KEYS_MAX_POSITION - k->first_token) {
			*why = "a key span ends past position 2^48";
			return -EINVAL;
		}
		if (i && k->first_token < spans[i - 1].first_token + spans[i - 1].n_tokens) {
			*why = "key spans must be sorted by first_token and must not overlap";
			return -EINVAL;
		}
	}
	return 0;
}

int keys_check_extra(const void *key, size_t len)
{
	return (len && !key) || len > KEYS_MAX_KEY_BYTES ? -EINVAL : 0;
}

void keys_wire_set(struct keys_wire *w, const struct kvp_key_span *spans, size_t lo, size_t hi)
{
	w->n = 0;
	keys_wire_add(w, spans, lo, hi);
}

void keys_wire_add(struct keys_wire *w, const struct kvp_key_span *spans, size_t lo, size_t hi)
{
	for (size_t i = lo; i < hi && w->n < KEYS_MAX_PER_REQUEST; i++) {
		Kvpalace__V1__KeySpan *m = &w->m[w->n];

		kvpalace__v1__key_span__init(m);
		m->first_token = spans[i].first_token;
		m->n_tokens = spans[i].n_tokens;
		m->key.data = (uint8_t *)(uintptr_t)spans[i].key;
		m->key.len = spans[i].key_len;
		w->p[w->n++] = m;
	}
}

size_t keys_first_at(const struct kvp_key_span *spans, size_t n, uint64_t pos)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (spans[mid].first_token < pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

size_t keys_first_ending_after(const struct kvp_key_span *spans, size_t n, uint64_t pos)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (spans[mid].first_token + spans[mid].n_tokens <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

size_t keys_take(const struct kvp_key_span *spans, size_t n, size_t lo, uint64_t limit,
		 uint32_t max_message_bytes, size_t *ret_bytes)
{
	size_t most = keys_max_count(max_message_bytes), bytes = 0, hi = lo;

	while (hi < n && spans[hi].first_token < limit && hi - lo < most &&
	       bytes + KEYS_WIRE_BYTES(&spans[hi]) <= max_message_bytes / 2)
		bytes += KEYS_WIRE_BYTES(&spans[hi++]);
	*ret_bytes = bytes;
	return hi;
}

void keys_opts_copy(void *out, size_t out_size, const void *in, size_t first_size)
{
	size_t size;

	memset(out, 0, out_size);
	if (!in)
		return;
	memcpy(&size, in, sizeof(size));
	if (!size)
		size = first_size;
	memcpy(out, in, size < out_size ? size : out_size);
}

int keys_match_opts(kvp_pool *p, const struct kvp_match_opts *opts, struct kvp_match_opts *o)
{
	const char *why;

	keys_opts_copy(o, sizeof(*o), opts, sizeof(*o));
	if (!p)
		return -EINVAL;
	conn_clear_error(p->client);
	if (o->salt && o->salt_len > POOL_SALT_MAX_BYTES)
		return conn_error(p->client, -EINVAL, "a cache salt has at most 64 bytes");
	if (keys_check_extra(o->extra_key, o->extra_key_len) < 0)
		return conn_error(p->client, -EINVAL, "an extra key has 1..64 bytes");
	if (keys_check(o->spans, o->n_spans, &why) < 0)
		return conn_error(p->client, -EINVAL, "%s", why);
	return 0;
}
