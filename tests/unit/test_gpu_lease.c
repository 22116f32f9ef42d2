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

static void test_lease_device_waits_however_long_its_copies_take(void **state)
{
	struct core_fixture *f = calloc(1, sizeof(*f));
	struct pool *host_only, *p;
	struct loop loop;
	struct lease *l = NULL;
	struct match_result mr;
	struct gpu_lease_slots got;
	struct tier_park pk = {0}, late = {.no_park = 1};
	const char *why = NULL;
	uint32_t ids[8];
	int ret;

	(void)state;
	assert_non_null(f);
	core_fixture_init(f, 32, 0.95, 0.90);
	setenv("KVPALACED_EMULATE_GPU", "1", 1);
	assert_int_equal(loop_init(&loop, 64), 0);
	f->cfg.gpu_pool_bytes = 8 * f->p->page_bytes;
	f->cfg.gpu_tier_bytes = 64 * f->p->page_bytes;
	assert_int_equal(gpu_init(&f->c.gpu, &f->cfg, &loop), 0);
	assert_true(gpu_available(f->c.gpu));
	/* A pool opened now has a device arena. */
	host_only = f->p;
	assert_int_equal(pool_open(&f->c, CORE_UID, "unit-gpu", &host_only->layout, &p), 0);
	assert_true(p->dev.on);
	f->p = p;
	core_cached_chain(f, 0, 8); /* two pages */
	core_tokens(ids, 8, 0);
	assert_int_equal(match_start(&f->c, p, p->root, &f->a, &f->a.leases, ids, 8, &l, &mr), 1);
	assert_int_equal(l->n_pages, 2);

	/* First run: the copies start, the request waits. */
	ret = gpu_lease_device(&f->c, l, 0, &pk, &got, &why);
	assert_int_equal(ret, -EAGAIN);
	assert_ptr_equal(pk.park_on, p);
	assert_true(gpu_busy(f->c.gpu));

	/* Run again after PEER_MAX_PARK_NS, its copies still on the stream
	 * (the loop has not turned): before the refactor nothing refused a
	 * LeaseDevice for slow copies, it was answered when they were done. */
	ret = gpu_lease_device(&f->c, l, 0, &late, &got, &why);
	assert_int_not_equal(ret, -EBUSY);

	/* The copies finish; the request, run again, gets both pages, copied
	 * by it. */
	assert_int_equal(loop_run_while(&loop, gpu_jobs, f->c.gpu), 0);
	memset(&pk, 0, sizeof(pk));
	ret = gpu_lease_device(&f->c, l, 0, &pk, &got, &why);
	assert_int_equal(ret, 0);
	assert_int_equal(got.n_slots, 2);
	assert_int_equal(got.copied, 2);

	lease_release(&f->c, l);
	core_fixture_fini(f);
	gpu_fini(f->c.gpu);
	loop_fini(&loop);
	free(f);
}

/* A re-run that may still wait parks again while the copies are in
 * flight, and copied_pages counts them once. */
static void test_lease_device_rerun_while_copying_parks(void **state)
{
	struct core_fixture *f = calloc(1, sizeof(*f));
	struct pool *p;
	struct loop loop;
	struct lease *l = NULL;
	struct match_result mr;
	struct gpu_lease_slots got;
	struct tier_park pk = {0};
	const char *why = NULL;
	uint32_t ids[8];

	(void)state;
	assert_non_null(f);
	core_fixture_init(f, 32, 0.95, 0.90);
	setenv("KVPALACED_EMULATE_GPU", "1", 1);
	assert_int_equal(loop_init(&loop, 64), 0);
	f->cfg.gpu_pool_bytes = 8 * f->p->page_bytes;
	f->cfg.gpu_tier_bytes = 64 * f->p->page_bytes;
	assert_int_equal(gpu_init(&f->c.gpu, &f->cfg, &loop), 0);
	assert_int_equal(pool_open(&f->c, CORE_UID, "unit-gpu", &f->p->layout, &p), 0);
	f->p = p;
	core_cached_chain(f, 0, 8);
	core_tokens(ids, 8, 0);
	assert_int_equal(match_start(&f->c, p, p->root, &f->a, &f->a.leases, ids, 8, &l, &mr), 1);
	assert_int_equal(gpu_lease_device(&f->c, l, 0, &pk, &got, &why), -EAGAIN);
	pk.park_on = NULL;
	assert_int_equal(gpu_lease_device(&f->c, l, 0, &pk, &got, &why), -EAGAIN);
	assert_ptr_equal(pk.park_on, p);
	assert_int_equal(loop_run_while(&loop, gpu_jobs, f->c.gpu), 0);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(&f->c, l, 0, &pk, &got, &why), 0);
	assert_int_equal(got.copied, 2);
	/* Asked again: nothing more copied. */
	assert_int_equal(gpu_lease_device(&f->c, l, 0, &pk, &got, &why), 0);
	assert_int_equal(got.copied, 0);
	lease_release(&f->c, l);
	core_fixture_fini(f);
	gpu_fini(f->c.gpu);
	loop_fini(&loop);
	free(f);
}

/* A LeaseDevice from first_page 1 whose copies (pages 0 and 1) are in
 * flight waits for all of them: woken early (by another pool event), it
 * parks again instead of answering with copies still on their way. */
static void test_lease_device_past_first_page_waits_for_its_copies(void **state)
{
	struct core_fixture *f = calloc(1, sizeof(*f));
	struct pool *p;
	struct loop loop;
	struct lease *l = NULL;
	struct match_result mr;
	struct gpu_lease_slots got;
	struct tier_park pk = {0};
	const char *why = NULL;
	uint32_t ids[8];

	(void)state;
	assert_non_null(f);
	core_fixture_init(f, 32, 0.95, 0.90);
	setenv("KVPALACED_EMULATE_GPU", "1", 1);
	assert_int_equal(loop_init(&loop, 64), 0);
	f->cfg.gpu_pool_bytes = 8 * f->p->page_bytes;
	f->cfg.gpu_tier_bytes = 64 * f->p->page_bytes;
	assert_int_equal(gpu_init(&f->c.gpu, &f->cfg, &loop), 0);
	assert_int_equal(pool_open(&f->c, CORE_UID, "unit-gpu", &f->p->layout, &p), 0);
	f->p = p;
	core_cached_chain(f, 0, 8);
	core_tokens(ids, 8, 0);
	assert_int_equal(match_start(&f->c, p, p->root, &f->a, &f->a.leases, ids, 8, &l, &mr), 1);
	assert_int_equal(gpu_lease_device(&f->c, l, 1, &pk, &got, &why), -EAGAIN);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(&f->c, l, 1, &pk, &got, &why), -EAGAIN);
	assert_ptr_equal(pk.park_on, p);
	assert_int_equal(loop_run_while(&loop, gpu_jobs, f->c.gpu), 0);
	memset(&pk, 0, sizeof(pk));
	assert_int_equal(gpu_lease_device(&f->c, l, 1, &pk, &got, &why), 0);
	assert_int_equal(got.n_slots, 1);
	assert_int_equal(got.copied, 2);
	lease_release(&f->c, l);
	core_fixture_fini(f);
	gpu_fini(f->c.gpu);
	loop_fini(&loop);
	free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_lease_device_rerun_while_copying_parks),
		cmocka_unit_test(test_lease_device_past_first_page_waits_for_its_copies),
		cmocka_unit_test(test_lease_device_waits_however_long_its_copies_take),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
