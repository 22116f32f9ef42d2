/* tests/unit/test_pagealloc.c — the page-slot allocator of daemon/store/pagealloc.h.
 *
 * Slots come out distinct until -ENOSPC, references and pins keep a slot
 * held until the last one goes, freed slots are reused last-in first-out,
 * and pagealloc_check notices each kind of corruption we introduce into the
 * tables. A long random sequence is replayed against a simple model.
 * Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "pagealloc.h"

#define SENTINEL 0xdeadbeefu

static void test_get_until_full(void **state)
{
	enum { N = 64 };
	struct pagealloc pa;
	uint8_t seen[N] = {0};
	uint32_t slot = SENTINEL;

	assert_int_equal(pagealloc_init(&pa, N), 0);
	assert_int_equal(pa.n_pages, N);
	assert_int_equal(pa.n_free, N);
	assert_int_equal(pagealloc_check(&pa), 0);
	for (uint32_t i = 0; i < N; i++) {
		assert_int_equal(pagealloc_get(&pa, &slot), 0);
		assert_true(slot < N);
		assert_false(seen[slot]);
		seen[slot] = 1;
		assert_int_equal(pa.refs[slot], 1);
		assert_int_equal(pa.n_free, N - 1 - i);
		assert_int_equal(pagealloc_check(&pa), 0);
	}
	/* Full: -ENOSPC, and the out-parameter is left alone. */
	slot = SENTINEL;
	assert_int_equal(pagealloc_get(&pa, &slot), -ENOSPC);
	assert_int_equal(slot, SENTINEL);
	assert_int_equal(pa.n_free, 0);
	assert_int_equal(pagealloc_check(&pa), 0);

	/* Freeing one makes exactly one available again. */
	assert_int_equal(pagealloc_unref(&pa, 17), 0);
	assert_int_equal(pagealloc_get(&pa, &slot), 0);
	assert_int_equal(slot, 17);
	assert_int_equal(pagealloc_get(&pa, &slot), -ENOSPC);
	pagealloc_fini(&pa);
}

static void test_zero_pages(void **state)
{
	struct pagealloc pa;
	uint32_t slot = SENTINEL;

	assert_int_equal(pagealloc_init(&pa, 0), 0);
	assert_int_equal(pagealloc_get(&pa, &slot), -ENOSPC);
	assert_int_equal(slot, SENTINEL);
	assert_int_equal(pagealloc_check(&pa), 0);
	assert_int_equal(pagealloc_n_pinned(&pa), 0);
	pagealloc_fini(&pa);
}

static void test_fini_accepts_zeroed_and_twice(void **state)
{
	struct pagealloc pa;

	memset(&pa, 0, sizeof(pa));
	pagealloc_fini(&pa);
	assert_int_equal(pagealloc_init(&pa, 4), 0);
	pagealloc_fini(&pa);
	pagealloc_fini(&pa);
	assert_null(pa.free_stack);
	assert_null(pa.refs);
	assert_null(pa.pins);
}

static void test_ref_unref(void **state)
{
	struct pagealloc pa;
	uint32_t s;

	assert_int_equal(pagealloc_init(&pa, 8), 0);
	assert_int_equal(pagealloc_get(&pa, &s), 0);
	pagealloc_ref(&pa, s); /* a second session shares the page */
	pagealloc_ref(&pa, s);
	assert_int_equal(pa.refs[s], 3);
	assert_int_equal(pagealloc_unref(&pa, s), 2);
	assert_int_equal(pagealloc_unref(&pa, s), 1);
	assert_int_equal(pa.n_free, 7); /* still held */
	assert_int_equal(pagealloc_check(&pa), 0);
	assert_int_equal(pagealloc_unref(&pa, s), 0);
	assert_int_equal(pa.n_free, 8);
	assert_int_equal(pagealloc_check(&pa), 0);
	pagealloc_fini(&pa);
}

static void test_lifo_reuse(void **state)
{
	struct pagealloc pa;
	uint32_t a, b, c, d, x;

	assert_int_equal(pagealloc_init(&pa, 16), 0);
	assert_int_equal(pagealloc_get(&pa, &a), 0);
	assert_int_equal(pagealloc_get(&pa, &b), 0);
	assert_int_equal(pagealloc_get(&pa, &c), 0);
	assert_int_equal(pagealloc_get(&pa, &d), 0);
	/* Free b, then d, then a: they come back a, d, b. */
	assert_int_equal(pagealloc_unref(&pa, b), 0);
	assert_int_equal(pagealloc_unref(&pa, d), 0);
	assert_int_equal(pagealloc_unref(&pa, a), 0);
	assert_int_equal(pagealloc_get(&pa, &x), 0);
	assert_int_equal(x, a);
	assert_int_equal(pagealloc_get(&pa, &x), 0);
	assert_int_equal(x, d);
	assert_int_equal(pagealloc_get(&pa, &x), 0);
	assert_int_equal(x, b);
	/* The next one is none of those still held. */
	assert_int_equal(pagealloc_get(&pa, &x), 0);
	assert_true(x != a && x != b && x != c && x != d);
	assert_int_equal(pagealloc_check(&pa), 0);
	pagealloc_fini(&pa);
}

static void test_pins(void **state)
{
	struct pagealloc pa;
	uint32_t s, t;

	assert_int_equal(pagealloc_init(&pa, 4), 0);
	assert_int_equal(pagealloc_get(&pa, &s), 0);
	assert_int_equal(pagealloc_get(&pa, &t), 0);
	assert_int_equal(pagealloc_n_pinned(&pa), 0);

	/* Two leases pin s, one pins t. */
	pagealloc_pin(&pa, s);
	pagealloc_pin(&pa, s);
	pagealloc_pin(&pa, t);
	assert_int_equal(pa.refs[s], 3);
	assert_int_equal(pa.pins[s], 2);
	assert_int_equal(pagealloc_n_pinned(&pa), 2); /* slots, not pins */
	assert_int_equal(pagealloc_check(&pa), 0);

	/* The sessions drop their pages: pinned pages stay held. */
	assert_int_equal(pagealloc_unref(&pa, s), 2);
	assert_int_equal(pagealloc_unref(&pa, t), 1);
	assert_int_equal(pa.n_free, 2);
	assert_int_equal(pagealloc_check(&pa), 0);

	/* The leases end: the pages come free with the last pin. */
	pagealloc_unpin(&pa, t);
	assert_int_equal(pa.refs[t], 0);
	assert_int_equal(pa.n_free, 3);
	assert_int_equal(pagealloc_n_pinned(&pa), 1);
	pagealloc_unpin(&pa, s);
	assert_int_equal(pa.refs[s], 1);
	assert_int_equal(pa.n_free, 3);
	pagealloc_unpin(&pa, s);
	assert_int_equal(pa.refs[s], 0);
	assert_int_equal(pa.n_free, 4);
	assert_int_equal(pagealloc_n_pinned(&pa), 0);
	assert_int_equal(pagealloc_check(&pa), 0);
	pagealloc_fini(&pa);
}

/* A healthy allocator with some held, pinned and free slots. */
static void make_mixed(struct pagealloc *pa, uint32_t *held, uint32_t *pinned)
{
	uint32_t s;

	assert_int_equal(pagealloc_init(pa, 10), 0);
	for (int i = 0; i < 6; i++)
		assert_int_equal(pagealloc_get(pa, &s), 0);
	pagealloc_pin(pa, s);
	*pinned = s;
	assert_int_equal(pagealloc_get(pa, held), 0);
	assert_int_equal(pa->n_free, 3);
	assert_int_equal(pagealloc_check(pa), 0);
}

/* Released slots are the coldest free ones: a fresh allocator has
 * touched nothing, a slot taken is resident again, and the most recently
 * freed `keep` stay resident. */
static void test_release(void **state)
{
	struct pagealloc pa;
	uint32_t slots[16], got[16];

	(void)state;
	assert_int_equal(pagealloc_init(&pa, 16), 0);
	assert_int_equal(pagealloc_resident(&pa), 0);
	assert_int_equal(pagealloc_release(&pa, 0, 16, slots), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(pagealloc_get(&pa, &got[i]), 0);
	assert_int_equal(pagealloc_resident(&pa), 10);
	/* Freed in order 0..9: the stack's top is got[9]. */
	for (int i = 0; i < 10; i++)
		pagealloc_unref(&pa, got[i]);
	assert_int_equal(pagealloc_release(&pa, 4, 16, slots), 6);
	/* The six freed first, sorted. */
	for (int i = 0; i < 6; i++)
		assert_int_equal(slots[i], got[i]);
	pagealloc_released(&pa, 6);
	assert_int_equal(pagealloc_resident(&pa), 4);
	assert_int_equal(pagealloc_check(&pa), 0);
	/* Nothing more to give while keep holds. */
	assert_int_equal(pagealloc_release(&pa, 4, 16, slots), 0);
	/* Taking the 4 warm ones and one more: that one is resident again. */
	for (int i = 0; i < 5; i++)
		assert_int_equal(pagealloc_get(&pa, &got[i]), 0);
	assert_int_equal(pagealloc_resident(&pa), 5);
	assert_int_equal(pagealloc_check(&pa), 0);
	/* max bounds one call. */
	for (int i = 0; i < 5; i++)
		pagealloc_unref(&pa, got[i]);
	assert_int_equal(pagealloc_release(&pa, 0, 2, slots), 2);
	pagealloc_fini(&pa);
}

/* Warming (pagealloc_cold_top / pagealloc_warmed): the released slots
 * handed out next become resident in the count, whether the stack stayed
 * as it was or more slots were released above them; a stack that moved
 * under them (the slots handed out) leaves the count alone. */
static void test_warm(void **state)
{
	enum { N = 64 };
	struct pagealloc pa;
	uint32_t slots[N], pos, slot, n, rel[N];

	(void)state;
	assert_int_equal(pagealloc_init(&pa, N), 0);
	/* Fresh: all released; the next out is slot 0, then 1, ... */
	n = pagealloc_cold_top(&pa, 8, slots, &pos);
	assert_int_equal(n, 8);
	assert_int_equal(pos, N - 8);
	assert_int_equal(pa.n_released, N); /* nothing changed yet */
	assert_int_equal(pagealloc_warmed(&pa, pos, n, slots), 8);
	assert_int_equal(pa.n_released, N - 8);
	assert_int_equal(pagealloc_resident(&pa), 8);
	assert_int_equal(pagealloc_check(&pa), 0);
	/* Those are the ones handed out first. */
	assert_int_equal(pagealloc_get(&pa, &slot), 0);
	assert_int_equal(slot, 0);
	assert_int_equal(pa.n_released, N - 8);

	/* Slots released while the job ran lie above its slots. */
	n = pagealloc_cold_top(&pa, 4, slots, &pos);
	assert_int_equal(n, 4);
	assert_int_equal(pagealloc_release(&pa, 0, N, rel), 7);
	pagealloc_released(&pa, 7);
	assert_int_equal(pagealloc_warmed(&pa, pos, n, slots), 4);
	assert_int_equal(pa.n_released, N - 1 - 4);
	assert_int_equal(pagealloc_check(&pa), 0);
	/* The top of the released part is the warm four. */
	for (uint32_t i = 0; i < 4; i++)
		assert_int_equal(pa.free_stack[pa.n_released + i], slots[i]);

	/* Handed out while the job ran: counted as before. */
	n = pagealloc_cold_top(&pa, 4, slots, &pos);
	for (uint32_t i = 0; i < 6; i++)
		assert_int_equal(pagealloc_get(&pa, &slot), 0);
	{
		uint32_t before = pa.n_released;

		assert_int_equal(pagealloc_warmed(&pa, pos, n, slots), 0);
		assert_int_equal(pa.n_released, before);
	}
	assert_int_equal(pagealloc_check(&pa), 0);
	/* Nothing released: nothing to warm. */
	while (pa.n_free)
		assert_int_equal(pagealloc_get(&pa, &slot), 0);
	assert_int_equal(pagealloc_cold_top(&pa, 4, slots, &pos), 0);
	assert_int_equal(pagealloc_warmed(&pa, pos, 0, slots), 0);
	pagealloc_fini(&pa);
}

static void test_check_detects_corruption(void **state)
{
	struct pagealloc pa;
	uint32_t held, pinned, save, free_slot;

	/* A free slot that claims a reference. */
	make_mixed(&pa, &held, &pinned);
	free_slot = pa.free_stack[0];
	pa.refs[free_slot] = 1;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.refs[free_slot] = 0;
	assert_int_equal(pagealloc_check(&pa), 0);

	/* A slot twice on the free stack (a double free). */
	save = pa.free_stack[1];
	pa.free_stack[1] = pa.free_stack[0];
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.free_stack[1] = save;
	assert_int_equal(pagealloc_check(&pa), 0);

	/* A held slot on the free stack. */
	save = pa.free_stack[2];
	pa.free_stack[2] = held;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.free_stack[2] = save;

	/* An out-of-range slot number on the free stack. */
	pa.free_stack[0] = pa.n_pages;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.free_stack[0] = free_slot;
	assert_int_equal(pagealloc_check(&pa), 0);

	/* More pins than references. */
	pa.pins[pinned] = pa.refs[pinned] + 1;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.pins[pinned] = 1;
	assert_int_equal(pagealloc_check(&pa), 0);

	/* A leaked slot: no references yet not on the free stack. */
	pa.refs[held] = 0;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.refs[held] = 1;

	/* Free count off by one either way. */
	pa.n_free++;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.n_free -= 2;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.n_free++;
	/* More free than pages. */
	save = pa.n_free;
	pa.n_free = pa.n_pages + 1;
	assert_int_equal(pagealloc_check(&pa), -EUCLEAN);
	pa.n_free = save;

	assert_int_equal(pagealloc_check(&pa), 0);
	pagealloc_fini(&pa);
}

/* xorshift: a fixed seed keeps the run reproducible. */
static uint32_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 32);
}

static void test_random_against_model(void **state)
{
	enum { N = 97, STEPS = 20000 };
	struct pagealloc pa;
	uint32_t refs[N] = {0}, pins[N] = {0};
	uint32_t n_held = 0;
	uint64_t seed = 0x9e3779b97f4a7c15ull;

	assert_int_equal(pagealloc_init(&pa, N), 0);
	for (int step = 0; step < STEPS; step++) {
		uint32_t op = rnd(&seed) % 5;
		uint32_t s = rnd(&seed) % N;

		if (op == 0) {
			uint32_t got = SENTINEL;
			int ret = pagealloc_get(&pa, &got);

			if (n_held == N) {
				assert_int_equal(ret, -ENOSPC);
				continue;
			}
			assert_int_equal(ret, 0);
			assert_true(got < N);
			assert_int_equal(refs[got], 0);
			refs[got] = 1;
			n_held++;
		} else if (!refs[s]) {
			continue;
		} else if (op == 1) {
			pagealloc_ref(&pa, s);
			refs[s]++;
		} else if (op == 2 && refs[s] > pins[s]) {
			assert_int_equal(pagealloc_unref(&pa, s), refs[s] - 1);
			if (--refs[s] == 0)
				n_held--;
		} else if (op == 3) {
			pagealloc_pin(&pa, s);
			refs[s]++;
			pins[s]++;
		} else if (op == 4 && pins[s]) {
			pagealloc_unpin(&pa, s);
			pins[s]--;
			if (--refs[s] == 0)
				n_held--;
		}
		assert_int_equal(pa.n_free, N - n_held);
		if (step % 97 == 0) {
			uint32_t n_pinned = 0;

			assert_int_equal(pagealloc_check(&pa), 0);
			for (uint32_t i = 0; i < N; i++) {
				assert_int_equal(pa.refs[i], refs[i]);
				n_pinned += pins[i] > 0;
			}
			assert_int_equal(pagealloc_n_pinned(&pa), n_pinned);
		}
	}
	assert_int_equal(pagealloc_check(&pa), 0);
	pagealloc_fini(&pa);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_get_until_full),
		cmocka_unit_test(test_zero_pages),
		cmocka_unit_test(test_fini_accepts_zeroed_and_twice),
		cmocka_unit_test(test_ref_unref),
		cmocka_unit_test(test_lifo_reuse),
		cmocka_unit_test(test_pins),
		cmocka_unit_test(test_release),
		cmocka_unit_test(test_warm),
		cmocka_unit_test(test_check_detects_corruption),
		cmocka_unit_test(test_random_against_model),
	};

	return cmocka_run_group_tests_name("pagealloc", tests, NULL, NULL);
}
