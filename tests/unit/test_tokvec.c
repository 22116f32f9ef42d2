/* tests/unit/test_tokvec.c — a session's tokens shared copy-on-write
 * (daemon/store/tokvec.h).
 *
 * What a fork relies on: sharing copies nothing and charges nothing;
 * writing where another vector shares gives the writer its own copy with
 * the valid tokens and leaves the other's alone; the charge follows the
 * chunks (freed once, by whoever lets go last); a refused growth changes
 * nothing.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tokvec.h"

#define LIMIT UINT64_MAX

/* Appends ids base+len.. at positions [len, len + n) of v. */
static void append(struct tokvec *v, uint64_t len, uint64_t n, uint32_t base)
{
	uint32_t *ids = malloc(n * sizeof(*ids));

	assert_non_null(ids);
	for (uint64_t i = 0; i < n; i++)
		ids[i] = base + (uint32_t)(len + i);
	assert_int_equal(tokvec_prepare(v, len, len, len + n, LIMIT, 1), 0);
	tokvec_put(v, len, n, ids, NULL);
	for (uint64_t i = 0; i < n; i++)
		*tokvec_meta_w(v, len + i) = (struct token_meta){.pos = (uint32_t)(len + i)};
	free(ids);
}

static void check(const struct tokvec *v, uint64_t from, uint64_t to, uint32_t base)
{
	for (uint64_t i = from; i < to; i++) {
		assert_int_equal(tokvec_id(v, i), base + (uint32_t)i);
		assert_int_equal(tokvec_meta(v, i).pos, i);
	}
}

static void test_fork_shares_then_copies_what_it_writes(void **state)
{
	uint64_t account = 0, shared;
	struct tokvec a, b;

	(void)state;
	tokvec_init(&a, 16, &account);
	tokvec_init(&b, 16, &account);
	assert_int_equal(a.per_chunk % 16, 0);
	append(&a, 0, 10000, 1000000);
	shared = account;
	assert_true(shared >= 10000);
	/* The fork costs nothing. */
	assert_int_equal(tokvec_share(&b, &a, 10000), 0);
	assert_int_equal(account, shared);
	check(&b, 0, 10000, 1000000);
	/* Both go on differently from 10000: each gets its own last chunk,
	 * and neither sees the other's tokens. */
	append(&b, 10000, 500, 2000000);
	append(&a, 10000, 500, 3000000);
	check(&a, 0, 10000, 1000000);
	check(&b, 0, 10000, 1000000);
	check(&b, 10000, 10500, 2000000);
	check(&a, 10000, 10500, 3000000);
	/* Rewriting metadata in the middle copies the chunk holding it. */
	assert_int_equal(tokvec_prepare(&b, 10500, 5, 6, LIMIT, 1), 0);
	tokvec_meta_w(&b, 5)->score = 1.0f;
	assert_true(tokvec_meta(&a, 5).score == 0.0f);
	assert_true(tokvec_meta(&b, 5).score == 1.0f);
	check(&b, 0, 10000, 1000000);
	/* The charge goes with the last holder. */
	tokvec_fini(&a);
	assert_true(account > 0);
	tokvec_fini(&b);
	assert_int_equal(account, 0);
}

static void test_refused_growth_changes_nothing(void **state)
{
	uint64_t account = 0, before;
	uint32_t id = 7;
	struct tokvec a, b;

	(void)state;
	tokvec_init(&a, 16, &account);
	tokvec_init(&b, 16, &account);
	append(&a, 0, 100, 0);
	assert_int_equal(tokvec_share(&b, &a, 100), 0);
	before = account;
	/* b's own copy of the chunk would pass the limit. */
	assert_int_equal(tokvec_prepare(&b, 100, 100, 101, before, 1), -EDQUOT);
	assert_int_equal(account, before);
	assert_ptr_equal(b.chunks[0], a.chunks[0]);
	check(&b, 0, 100, 0);
	/* Writing in place needs no room: a lowered limit does not refuse it. */
	assert_int_equal(tokvec_prepare(&a, 100, 100, 101, 0, 1), -EDQUOT);
	tokvec_fini(&b);
	assert_int_equal(tokvec_prepare(&a, 100, 10, 20, 0, 1), 0);
	assert_int_equal(tokvec_prepare(&a, 100, 100, 101, LIMIT, 1), 0);
	tokvec_put(&a, 100, 1, &id, NULL);
	assert_int_equal(tokvec_id(&a, 100), 7);
	tokvec_fini(&a);
	assert_int_equal(account, 0);
}

/* tokvec_charge says what a prepare will charge before it happens, so a
 * session can check max-tenant-tokens before it evicts anything for an
 * append (daemon/core/session.c): a first chunk, a grown one, one past a
 * chunk boundary and a shared one copied, each equal to what prepare then
 * adds, and asking changes nothing. */
static void test_charge_is_what_prepare_charges(void **state)
{
	static const uint64_t steps[][2] = {{0, 10}, {10, 200}, {200, 5000}, {5000, 9000}};
	uint64_t account = 0, before, charge;
	struct tokvec a, b;

	(void)state;
	tokvec_init(&a, 16, &account);
	tokvec_init(&b, 16, &account);
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		before = account;
		charge = tokvec_charge(&a, steps[i][0], steps[i][1]);
		assert_int_equal(account, before);
		append(&a, steps[i][0], steps[i][1] - steps[i][0], 1);
		assert_int_equal(account - before, charge);
	}
	/* Room left in the last chunk: nothing to charge. */
	assert_int_equal(tokvec_charge(&a, 9000, 9001), 0);
	/* A fork writing into the chunk it shares pays for its copy. */
	assert_int_equal(tokvec_share(&b, &a, 9000), 0);
	before = account;
	charge = tokvec_charge(&b, 9000, 9001);
	assert_true(charge > 0);
	append(&b, 9000, 1, 1);
	assert_int_equal(account - before, charge);
	tokvec_fini(&a);
	tokvec_fini(&b);
	assert_int_equal(account, 0);
}

static void test_cut_and_get(void **state)
{
	uint64_t account = 0, full;
	uint32_t ids[9000];
	struct token_meta meta[9000];
	struct tokvec a;

	(void)state;
	tokvec_init(&a, 48, &account); /* a block size that is no power of two */
	append(&a, 0, 9000, 5);
	full = account;
	tokvec_get(&a, 100, 9000 - 100, ids, meta);
	for (uint32_t i = 0; i < 9000 - 100; i++) {
		assert_int_equal(ids[i], 5 + 100 + i);
		assert_int_equal(meta[i].pos, 100 + i);
	}
	/* A page of 48 tokens never straddles two chunks. */
	for (uint64_t pg = 0; pg < 9000 / 48; pg++) {
		const uint32_t *t = tokvec_ids_at(&a, pg * 48);

		assert_int_equal(t[47], 5 + pg * 48 + 47);
	}
	tokvec_cut(&a, 10);
	assert_true(account < full);
	assert_int_equal(a.n_chunks, 1);
	check(&a, 0, 10, 5);
	tokvec_fini(&a);
	assert_int_equal(account, 0);
}

/* Metadata only where it differs from the default: a vector prepared
 * without it reads the default (position = index) everywhere, costs the
 * same charge, and gets defaults it can overwrite when a write needs them
 * — in its own chunk, and in a copy of a shared one, the sharer's left
 * as it was. */
static void test_metadata_made_when_needed(void **state)
{
	uint64_t account = 0, charged;
	uint32_t ids[100];
	struct token_meta meta[100];
	struct tokvec a, b;

	(void)state;
	for (uint32_t i = 0; i < 100; i++)
		ids[i] = 7 + i;
	tokvec_init(&a, 16, &account);
	assert_int_equal(tokvec_charge(&a, 0, 100), 128);
	assert_int_equal(tokvec_prepare(&a, 0, 0, 100, LIMIT, 0), 0);
	charged = account;
	assert_int_equal(charged, 128);
	tokvec_put(&a, 0, 100, ids, NULL);
	assert_false(tokvec_has_meta(&a, 0));
	tokvec_get(&a, 0, 100, NULL, meta);
	for (uint32_t i = 0; i < 100; i++) {
		assert_int_equal(tokvec_meta(&a, i).pos, i);
		assert_int_equal(tokvec_meta(&a, i).turn, 0);
		assert_int_equal(meta[i].pos, i);
		assert_true(meta[i].score == 0);
	}
	/* A fork shares the chunk; its write of metadata copies it. */
	tokvec_init(&b, 16, &account);
	assert_int_equal(tokvec_share(&b, &a, 100), 0);
	assert_int_equal(tokvec_prepare(&b, 100, 40, 41, LIMIT, 1), 0);
	assert_true(tokvec_has_meta(&b, 40));
	assert_false(tokvec_has_meta(&a, 40));
	tokvec_meta_w(&b, 40)->score = 2.0f;
	tokvec_meta_w(&b, 40)->turn = 3;
	for (uint32_t i = 0; i < 100; i++) {
		assert_int_equal(tokvec_meta(&b, i).pos, i);
		assert_int_equal(tokvec_id(&b, i), 7 + i);
		assert_int_equal(tokvec_meta(&a, i).turn, 0);
	}
	assert_int_equal(tokvec_meta(&b, 40).turn, 3);
	/* Its own chunk made whole with defaults: the same charge. */
	assert_int_equal(tokvec_prepare(&a, 100, 0, 100, LIMIT, 1), 0);
	assert_true(tokvec_has_meta(&a, 0));
	assert_int_equal(tokvec_meta(&a, 99).pos, 99);
	assert_int_equal(tokvec_id(&a, 99), 7 + 99);
	tokvec_fini(&b);
	assert_int_equal(account, charged);
	tokvec_fini(&a);
	assert_int_equal(account, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fork_shares_then_copies_what_it_writes),
		cmocka_unit_test(test_refused_growth_changes_nothing),
		cmocka_unit_test(test_charge_is_what_prepare_charges),
		cmocka_unit_test(test_cut_and_get),
		cmocka_unit_test(test_metadata_made_when_needed),
	};

	return cmocka_run_group_tests_name("tokvec", tests, NULL, NULL);
}
