/* tests/redis/test_slots.c — Redis Cluster key slots (CRC16-XMODEM, hash
 * tags) and the CLUSTER SLOTS parser against well-formed and hostile
 * replies built by hand. No server. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "slots.h"

static void test_crc16(void **state)
{
	(void)state;
	/* The Redis Cluster specification's check value. */
	assert_int_equal(slots_crc16("123456789", 9), 0x31C3);
	assert_int_equal(slots_crc16("", 0), 0);
	/* CLUSTER KEYSLOT's answers in the Redis documentation. */
	assert_int_equal(slots_key_slot("somekey", 7), 11058);
	assert_int_equal(slots_key_slot("foo{hash_tag}", 13), 2515);
	assert_int_equal(slots_key_slot("foo", 3), 12182);
}

static void test_hash_tags(void **state)
{
	unsigned int u = slots_key_slot("user1000", 8);

	(void)state;
	assert_int_equal(slots_key_slot("{user1000}.following", 20), u);
	assert_int_equal(slots_key_slot("{user1000}.followers", 20), u);
	/* Only the first {...}, and only when not empty. */
	assert_int_equal(slots_key_slot("foo{bar}{zap}", 13), slots_key_slot("bar", 3));
	assert_int_equal(slots_key_slot("foo{}{bar}", 10), slots_crc16("foo{}{bar}", 10) & 16383);
	assert_int_equal(slots_key_slot("foo{{bar}}zap", 13), slots_key_slot("{bar", 4));
	assert_int_equal(slots_key_slot("foo{bar", 7), slots_crc16("foo{bar", 7) & 16383);
	assert_int_equal(slots_key_slot("}{", 2), slots_crc16("}{", 2) & 16383);
}

/* Reply trees built by hand, as hiredis would. */
static redisReply *mk(int type)
{
	redisReply *r = calloc(1, sizeof(*r));

	assert_non_null(r);
	r->type = type;
	return r;
}

static redisReply *mk_int(long long v)
{
	redisReply *r = mk(REDIS_REPLY_INTEGER);

	r->integer = v;
	return r;
}

static redisReply *mk_str(const char *s)
{
	redisReply *r = mk(REDIS_REPLY_STRING);

	r->str = strdup(s);
	r->len = strlen(s);
	return r;
}

static redisReply *mk_arr(size_t n, ...)
{
	redisReply *r = mk(REDIS_REPLY_ARRAY);
	va_list ap;

	r->elements = n;
	r->element = calloc(n ? n : 1, sizeof(*r->element));
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		r->element[i] = va_arg(ap, redisReply *);
	va_end(ap);
	return r;
}

static void rfree(redisReply *r)
{
	if (!r)
		return;
	if (r->type == REDIS_REPLY_ARRAY) {
		for (size_t i = 0; i < r->elements; i++)
			rfree(r->element[i]);
		free(r->element);
	}
	free(r->str);
	free(r);
}

static redisReply *range(long long a, long long b, const char *host, long long port)
{
	return mk_arr(4, mk_int(a), mk_int(b),
		      mk_arr(3, mk_str(host), mk_int(port), mk_str("0123abcd")),
		      mk_arr(3, mk_str(host), mk_int(port + 3), mk_str("feed")));
}

static struct slots_table t;

static void test_parse_good(void **state)
{
	redisReply *r =
		mk_arr(3, range(0, 5460, "127.0.0.1", 7000), range(5461, 10922, "127.0.0.1", 7001),
		       range(10923, 16383, "", 7002));

	(void)state;
	assert_int_equal(slots_parse(r, "10.0.0.9", &t), 0);
	assert_int_equal(t.n_covered, 16384);
	assert_int_equal(t.n_addr, 3);
	assert_int_equal(t.addr[t.owner[0]].port, 7000);
	assert_int_equal(t.addr[t.owner[5461]].port, 7001);
	assert_int_equal(t.addr[t.owner[16383]].port, 7002);
	/* An empty host is the node the reply came from. */
	assert_string_equal(t.addr[t.owner[16383]].host, "10.0.0.9");
	assert_int_equal(slots_parse(r, NULL, &t), -EBADMSG);
	rfree(r);

	/* No slot assigned yet: a valid, empty map. */
	r = mk_arr(0);
	assert_int_equal(slots_parse(r, NULL, &t), 0);
	assert_int_equal(t.n_covered, 0);
	assert_int_equal(t.owner[42], SLOTS_NONE);
	rfree(r);
}

/* Each hostile reply is rejected whole, nothing owned after it. */
static void expect_bad(redisReply *r, int err)
{
	assert_int_equal(slots_parse(r, "127.0.0.1", &t), err);
	assert_int_equal(t.n_covered, 0);
	assert_int_equal(t.n_addr, 0);
	assert_int_equal(t.owner[0], SLOTS_NONE);
	rfree(r);
}

static void test_parse_hostile(void **state)
{
	redisReply *big;

	(void)state;
	assert_int_equal(slots_parse(NULL, NULL, &t), -EBADMSG);
	expect_bad(mk_str("not an array"), -EBADMSG);
	expect_bad(mk(REDIS_REPLY_NIL), -EBADMSG);
	expect_bad(mk_arr(1, mk_int(3)), -EBADMSG);
	expect_bad(mk_arr(1, NULL), -EBADMSG);
	/* A good range, then a bad one: nothing of the good one is kept. */
	expect_bad(mk_arr(2, range(0, 100, "h", 1), range(200, 16384, "h", 2)), -EBADMSG);
	expect_bad(mk_arr(1, range(-1, 100, "h", 1)), -EBADMSG);
	expect_bad(mk_arr(1, range(500, 100, "h", 1)), -EBADMSG);
	expect_bad(mk_arr(1, range(0, 100, "h", 0)), -EBADMSG);
	expect_bad(mk_arr(1, range(0, 100, "h", 65536)), -EBADMSG);
	/* Missing fields, wrong types. */
	expect_bad(mk_arr(1, mk_arr(2, mk_int(0), mk_int(10))), -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_arr(1, mk_str("h")))), -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_str("h:1"))), -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_str("0"), mk_int(10), mk_arr(2, mk_str("h"), mk_int(1)))),
		   -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_arr(2, mk_int(5), mk_int(1)))),
		   -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_arr(2, NULL, mk_int(1)))),
		   -EBADMSG);
	expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_arr(2, mk_str("h"), mk_str("1")))),
		   -EBADMSG);
	/* A host with a NUL inside, a host too long. */
	{
		redisReply *h = mk_str("ab");
		char *longhost = malloc(400);

		h->str[1] = 0;
		expect_bad(mk_arr(1, mk_arr(3, mk_int(0), mk_int(10), mk_arr(2, h, mk_int(1)))),
			   -EBADMSG);
		memset(longhost, 'x', 399);
		longhost[399] = 0;
		expect_bad(mk_arr(1, range(0, 10, longhost, 1)), -EBADMSG);
		free(longhost);
	}
	/* More distinct masters than a table holds. */
	big = mk_arr(SLOTS_MAX_NODES + 1);
	for (unsigned int i = 0; i <= SLOTS_MAX_NODES; i++)
		big->element[i] = range(i, i, "h", 1000 + i);
	expect_bad(big, -E2BIG);
}

static void test_addr_index(void **state)
{
	(void)state;
	memset(&t, 0, sizeof(t));
	assert_int_equal(slots_addr_index(&t, "a", 1), 0);
	assert_int_equal(slots_addr_index(&t, "b", 1), 1);
	assert_int_equal(slots_addr_index(&t, "a", 1), 0);
	assert_int_equal(slots_addr_index(&t, "", 1), -EINVAL);
	assert_int_equal(slots_addr_index(&t, "a", 0), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc16),	   cmocka_unit_test(test_hash_tags),
		cmocka_unit_test(test_parse_good), cmocka_unit_test(test_parse_hostile),
		cmocka_unit_test(test_addr_index),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
