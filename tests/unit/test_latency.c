/* tests/unit/test_latency.c — the daemon and libkvpalace agree on latency
 * histograms: the bucket bounds the library publishes
 * (kvp_latency_bound_ns) are those the daemon files requests by
 * (cache_latency_add, through common/latency.h), the ones kvpalace.h
 * documents; and every request type of kvpalace.proto has a histogram and
 * the name a user reads in Stats ("MatchPrefix").
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "cache.h"
#include "kvpalace.h"
#include "latency.h"
#include "stats.h"

static void test_bounds_agree(void **state)
{
	/* What kvpalace.h promises: 1, 2.5, 5 per decade from 10 µs. */
	static const uint64_t want_us[KVP_LATENCY_BUCKETS - 1] = {
		10,    25,    50,     100,    250,    500,     1000,	2500,	 5000,	   10000,
		25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
	};

	(void)state;
	assert_int_equal(KVP_LATENCY_BUCKETS, LATENCY_BUCKETS);
	for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS + 8; i++) {
		assert_int_equal(kvp_latency_bound_ns(i), latency_bound_ns(i));
		if (i < KVP_LATENCY_BUCKETS - 1)
			assert_int_equal(kvp_latency_bound_ns(i), want_us[i] * 1000);
		else
			assert_true(kvp_latency_bound_ns(i) == UINT64_MAX);
	}
	assert_true(kvp_latency_bound_ns(UINT32_MAX) == UINT64_MAX);
}

/* A request of bound(i) ns goes in bucket i, one of a nanosecond more in
 * bucket i + 1, as kvp_latency_bound_ns says; for the daemon's counters
 * and the tenant's alike. */
static void test_daemon_buckets(void **state)
{
	static struct cache c; /* some 12 KiB of counters per tenant */
	const struct cache_counters *t;
	const unsigned int op = 3;

	(void)state;
	cache_init(&c, NULL);
	cache_latency_add(&c, 7, op, 0);
	assert_int_equal(c.ctr.latency[op].buckets[0], 1);
	for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS - 1; i++) {
		uint64_t before = c.ctr.latency[op].buckets[i + 1];

		cache_latency_add(&c, 7, op, kvp_latency_bound_ns(i));
		assert_int_equal(c.ctr.latency[op].buckets[i], 2);
		cache_latency_add(&c, 7, op, kvp_latency_bound_ns(i) + 1);
		assert_int_equal(c.ctr.latency[op].buckets[i + 1], before + 1);
	}
	cache_latency_add(&c, 7, op, UINT64_MAX);
	assert_int_equal(c.ctr.latency[op].buckets[KVP_LATENCY_BUCKETS - 1], 2);
	assert_int_equal(c.ctr.latency[op].count, 1 + 2 * (KVP_LATENCY_BUCKETS - 1) + 1);
	t = cache_tenant_find(&c, 7);
	assert_non_null(t);
	assert_memory_equal(&t->latency[op], &c.ctr.latency[op], sizeof(t->latency[op]));
	assert_null(cache_tenant_find(&c, 8));
	/* A type past the table counts nowhere. */
	cache_latency_add(&c, 7, CACHE_LATENCY_OPS, 5);
	cache_registry_fini(&c);
}

/* Every request of the Request oneof has its own histogram and a name
 * that fits struct kvp_latency.request; nothing else has one. */
static void test_request_types(void **state)
{
	const ProtobufCMessageDescriptor *d = &kvpalace__v1__request__descriptor;
	char names[CACHE_LATENCY_OPS][STATS_OP_NAME_BYTES];
	int seen[CACHE_LATENCY_OPS] = {0};
	unsigned int n = 0;

	(void)state;
	memset(names, 0, sizeof(names));
	for (unsigned int i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		int op = stats_op_index((int)f->id);

		if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) {
			assert_int_equal(op, -1); /* the id */
			continue;
		}
		if (op < 0 || op >= (int)CACHE_LATENCY_OPS)
			fail_msg("request %s (field %u) has no latency histogram: raise "
				 "CACHE_LATENCY_OPS",
				 f->name, f->id);
		assert_false(seen[op]);
		seen[op] = 1;
		assert_int_equal(stats_op_name((unsigned int)op, names[op], sizeof(names[op])), 0);
		assert_true(strlen(names[op]) > 0);
		assert_true(sizeof(names[op]) <= sizeof(((struct kvp_latency *)0)->request));
		n++;
	}
	assert_true(n > 30);
	assert_int_equal(stats_op_index(0), -1);
	assert_int_equal(stats_op_index(2), -1);
	assert_int_equal(stats_op_index(9999), -1);
	assert_int_equal(stats_op_name(0, names[0], sizeof(names[0])), -ENOENT);
	assert_int_equal(stats_op_name(CACHE_LATENCY_OPS + 1, names[0], sizeof(names[0])), -ENOENT);

#define NAMED(opcase, want)                                                                        \
	do {                                                                                       \
		char buf[STATS_OP_NAME_BYTES];                                                     \
		int op = stats_op_index(KVPALACE__V1__REQUEST__OP_##opcase);                       \
		assert_true(op > 0);                                                               \
		assert_int_equal(stats_op_name((unsigned int)op, buf, sizeof(buf)), 0);            \
		assert_string_equal(buf, want);                                                    \
	} while (0)
	NAMED(HELLO, "Hello");
	NAMED(MATCH_PREFIX, "MatchPrefix");
	NAMED(FORK_LEASE, "ForkLease");
	NAMED(STATS, "Stats");
	NAMED(LEASE_DEVICE, "LeaseDevice");
	NAMED(DELETE_CHECKPOINT, "DeleteCheckpoint");
	{
		char tiny[5];
		int op = stats_op_index(KVPALACE__V1__REQUEST__OP_MATCH_PREFIX);

		assert_int_equal(stats_op_name((unsigned int)op, tiny, sizeof(tiny)),
				 -ENAMETOOLONG);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bounds_agree),
		cmocka_unit_test(test_daemon_buckets),
		cmocka_unit_test(test_request_types),
	};

	return cmocka_run_group_tests_name("latency", tests, NULL, NULL);
}
