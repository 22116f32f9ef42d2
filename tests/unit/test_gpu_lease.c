/* tests/unit/test_gpu_lease.c — LeaseDevice (core/gpu.c gpu_lease_device)
 * on an emulated device, with the loop turned by hand.
 *
 * Before issue 15 a LeaseDevice whose host→device copies were in flight
 * was answered through a ticket when they finished, however long they
 * took. Now it parks on the pool like a disk read and runs again when
 * they are done. A review of that change found two ways it could answer
 * differently, each a case here: a re-run past PEER_MAX_PARK_NS (no_park,
 * the server's conn_park_tick) was refused with -EBUSY while its copies
 * were still on the stream (a busy GPU: one stream serves every lease),
 * and a re-run woken by another pool event answered before its own
 * copies below first_page were done.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core_fixture.h"
#include "gpu.h"
#include "loop.h"
#include "match.h"

static int gpu_jobs(void *arg)
{
	return gpu_busy(arg);
}

/* A core fixture whose cache has an emulated device, a pool opened after
 * it (so with a device arena), two cached pages and a lease on them. */
struct gpu_fixture {
	struct core_fixture f;
	struct loop loop;
	struct pool *p;
	struct lease *l;
};

static int gpu_setup(void **state)
{
	struct gpu_fixture *g = calloc(1, sizeof(*g));
	struct core_fixture *f;
	struct match_result mr;
	uint32_t ids[8];

	assert_non_null(g);
	f = &g->f;
	core_fixture_init(f, 32, 0.95, 0.90);
	setenv("KVPALACED_EMULATE_GPU", "1", 1);
	assert_int_equal(loop_init(&g->loop, 64, LOOP_WANT_AUTO), 0);
	f->cfg.gpu_pool_bytes = 8 * f->p->page_bytes;
	f->cfg.gpu_tier_bytes = 64 * f->p->page_bytes;
	assert_int_equal(gpu_init(&f->c.gpu, &f->cfg, &g->loop), 0);
	assert_true(gpu_available(f->c.gpu));
	assert_int_equal(pool_open(&f->c, CORE_UID, "unit-gpu", &f->p->layout, &g->p), 0);
	assert_true(g->p->dev.on);
	f->p = g->p;
	core_cached_chain(f, 0, 8); /* two pages */
	core_tokens(ids, 8, 0);
	assert_int_equal(match_start(&f->c, g->p, g->p->root, &f->a, &f->a.leases, ids, 8, NULL, 0,
				     0, &g->l, &mr),
			 1);
	assert_int_equal(g->l->n_pages, 2);
	*state = g;
	return 0;
}

static int gpu_teardown(void **state)
{
	struct gpu_fixture *g = *state;

	/* Copies a failed case left in flight end first: the pool may not
	 * go while they run. */
	assert_int_equal(loop_run_while(&g->loop, gpu_jobs, g->f.c.gpu), 0);
	lease_release(&g->f.c, g->l);
	core_fixture_fini(&g->f);
	gpu_fini(g->f.c.gpu);
	loop_fini(&g->loop);
	free(g);
	return 0;
}

/* Run again after PEER_MAX_PARK_NS (no_park, set by the server's
 * conn_park_tick), its copies still on the stream: it waits on, as the
 * ticket of old did, rather than being refused with -EBUSY. */
static void test_lease_device_waits_however_long_its_copies_take(void **state)
{
	struct gpu_fixture *g = *state;
	struct cache *c = &g->f.c;
	struct tier_park pk = {0}, late = {.no_park = 1};
	struct gpu_lease_slots got;
	const char *why = NULL;

	/* First run: the copies start, the request waits. */
	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), -EAGAIN);
	assert_ptr_equal(pk.park_on, g->p);
	assert_true(gpu_busy(c->gpu));
	/* The loop has not turned: the copies are still in flight. */
	assert_int_not_equal(gpu_lease_device(c, g->l, 0, &late, &got, &why), -EBUSY);
	/* The copies finish; the request, run again, gets both pages, copied
	 * by it. */
	assert_int_equal(loop_run_while(&g->loop, gpu_jobs, c->gpu), 0);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), 0);
	assert_int_equal(got.n_slots, 2);
	assert_int_equal(got.copied, 2);
}

/* A re-run that may still wait parks again while the copies are in
 * flight, and copied_pages counts them once. */
static void test_lease_device_rerun_while_copying_parks(void **state)
{
	struct gpu_fixture *g = *state;
	struct cache *c = &g->f.c;
	struct tier_park pk = {0};
	struct gpu_lease_slots got;
	const char *why = NULL;

	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), -EAGAIN);
	pk.park_on = NULL;
	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), -EAGAIN);
	assert_ptr_equal(pk.park_on, g->p);
	assert_int_equal(loop_run_while(&g->loop, gpu_jobs, c->gpu), 0);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), 0);
	assert_int_equal(got.copied, 2);
	/* Asked again: nothing more copied. */
	assert_int_equal(gpu_lease_device(c, g->l, 0, &pk, &got, &why), 0);
	assert_int_equal(got.copied, 0);
}

/* A LeaseDevice from first_page 1 whose copies (pages 0 and 1) are in
 * flight waits for all of them: run again before they are done, it parks
 * again instead of answering with copies still on their way. */
static void test_lease_device_past_first_page_waits_for_its_copies(void **state)
{
	struct gpu_fixture *g = *state;
	struct cache *c = &g->f.c;
	struct tier_park pk = {0};
	struct gpu_lease_slots got;
	const char *why = NULL;

	assert_int_equal(gpu_lease_device(c, g->l, 1, &pk, &got, &why), -EAGAIN);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(c, g->l, 1, &pk, &got, &why), -EAGAIN);
	assert_ptr_equal(pk.park_on, g->p);
	assert_int_equal(loop_run_while(&g->loop, gpu_jobs, c->gpu), 0);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(c, g->l, 1, &pk, &got, &why), 0);
	assert_int_equal(got.n_slots, 1);
	assert_int_equal(got.copied, 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lease_device_rerun_while_copying_parks,
						gpu_setup, gpu_teardown),
		cmocka_unit_test_setup_teardown(
			test_lease_device_past_first_page_waits_for_its_copies, gpu_setup,
			gpu_teardown),
		cmocka_unit_test_setup_teardown(
			test_lease_device_waits_however_long_its_copies_take, gpu_setup,
			gpu_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
