/* tests/unit/test_idseq.c — the id-ordered sequence behind ListSessions
 * (daemon/base/idseq.h): against a plain sorted reference through random
 * adds (mostly increasing ids, some smaller) and removals, every "after
 * this id" walk lists exactly the live ids above it, in order, and the
 * holes stay no more than the live entries (after the small minimum). */
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "idseq.h"

#define N_OPS  20000
#define MAX_ID 40000

static void check_walk(const struct idseq *q, const unsigned char *live, uint64_t after)
{
	size_t i = idseq_live(q, idseq_after(q, after));

	for (uint64_t id = after + 1; id < MAX_ID; id++) {
		if (!live[id])
			continue;
		assert_true(i < q->n);
		assert_int_equal(q->v[i].id, id);
		assert_ptr_equal(q->v[i].ptr, (void *)(uintptr_t)id);
		i = idseq_live(q, i + 1);
	}
	assert_int_equal(i, q->n);
}

static void test_against_reference(void **state)
{
	unsigned char *live = calloc(MAX_ID, 1), *used = calloc(MAX_ID, 1);
	struct idseq q = {0};
	uint64_t next = 2;
	size_t n_live = 0;
	unsigned int seed = 5;

	assert_non_null(live);
	assert_non_null(used);
	for (int op = 0; op < N_OPS; op++) {
		unsigned int r = (unsigned int)rand_r(&seed);

		if (r % 3 != 0 && next + 4 < MAX_ID) {
			/* Ids leave gaps; now and then one fills a gap below the
			 * last (never expected of one pool, still kept in order).
			 * An id is never used twice, as cache_new_id promises. */
			uint64_t id = next + 2;

			if (r % 17 == 0 && !used[next - 1])
				id = next - 1;
			else
				next += 3;
			used[id] = 1;
			assert_int_equal(idseq_add(&q, id, (void *)(uintptr_t)id), 0);
			live[id] = 1;
			n_live++;
		} else if (n_live) {
			uint64_t id = (uint64_t)rand_r(&seed) % next;

			while (!live[id])
				id = (id + 1) % next;
			idseq_del(&q, id);
			live[id] = 0;
			n_live--;
		}
		assert_int_equal(idseq_count(&q), n_live);
		assert_true(q.dead <= 16 || q.dead <= n_live);
		if (op % 997 == 0)
			check_walk(&q, live, (uint64_t)rand_r(&seed) % next);
	}
	check_walk(&q, live, 0);
	idseq_fini(&q);
	free(live);
	free(used);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_against_reference),
	};

	return cmocka_run_group_tests_name("idseq", tests, NULL, NULL);
}
