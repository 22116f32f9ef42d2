/* daemon/remote/slots.c — CRC16 key slots and the CLUSTER SLOTS parser
 * (slots.h). Pure functions, any thread. */
#include "slots.h"

#include <errno.h>
#include <string.h>

/* Bitwise CRC16-XMODEM: keys are short (a page key is under 120 bytes),
 * so a 512-byte table would buy nothing measurable. */
uint16_t slots_crc16(const void *buf, size_t len)
{
	const unsigned char *p = buf;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned int slots_key_slot(const void *key, size_t len)
{
	const char *k = key;
	const char *open = memchr(k, '{', len);

	if (open) {
		size_t rest = len - (size_t)(open - k) - 1;
		const char *close = memchr(open + 1, '}', rest);

		if (close && close > open + 1)
			return slots_crc16(open + 1, (size_t)(close - open - 1)) & (SLOTS_N - 1);
	}
	return slots_crc16(k, len) & (SLOTS_N - 1);
}

int slots_addr_index(struct slots_table *t, const char *host, int port)
{
	size_t n = strlen(host);

	if (n == 0 || n >= SLOTS_HOST_MAX || port < 1 || port > 65535)
		return -EINVAL;
	for (unsigned int i = 0; i < t->n_addr; i++)
		if (t->addr[i].port == port && !strcmp(t->addr[i].host, host))
			return (int)i;
	if (t->n_addr >= SLOTS_MAX_NODES)
		return -E2BIG;
	memcpy(t->addr[t->n_addr].host, host, n + 1);
	t->addr[t->n_addr].port = port;
	return (int)t->n_addr++;
}

static int is_int(const redisReply *r, long long lo, long long hi)
{
	return r && r->type == REDIS_REPLY_INTEGER && r->integer >= lo && r->integer <= hi;
}

static void clear(struct slots_table *t)
{
	memset(t->owner, 0xff, sizeof(t->owner));
	t->n_addr = 0;
	t->n_covered = 0;
}

int slots_parse(const redisReply *r, const char *default_host, struct slots_table *t)
{
	int ret = -EBADMSG;

	clear(t);
	if (!r || r->type != REDIS_REPLY_ARRAY || (r->elements && !r->element))
		goto fail;
	for (size_t i = 0; i < r->elements; i++) {
		const redisReply *e = r->element[i], *node, *host;
		const char *h;
		int idx;

		if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 3 || !e->element)
			goto fail;
		if (!is_int(e->element[0], 0, SLOTS_N - 1) ||
		    !is_int(e->element[1], 0, SLOTS_N - 1) ||
		    e->element[0]->integer > e->element[1]->integer)
			goto fail;
		node = e->element[2];
		if (!node || node->type != REDIS_REPLY_ARRAY || node->elements < 2 ||
		    !node->element)
			goto fail;
		host = node->element[0];
		if (!host || host->type != REDIS_REPLY_STRING || !host->str ||
		    memchr(host->str, 0, host->len) || !is_int(node->element[1], 1, 65535))
			goto fail;
		h = host->len ? host->str : default_host;
		if (!h || strlen(h) >= SLOTS_HOST_MAX)
			goto fail;
		idx = slots_addr_index(t, h, (int)node->element[1]->integer);
		if (idx < 0) {
			ret = idx == -E2BIG ? -E2BIG : -EBADMSG;
			goto fail;
		}
		for (long long s = e->element[0]->integer; s <= e->element[1]->integer; s++) {
			if (t->owner[s] == SLOTS_NONE)
				t->n_covered++;
			t->owner[s] = (uint16_t)idx;
		}
	}
	return 0;
fail:
	clear(t);
	return ret;
}
