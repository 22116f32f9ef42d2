/* tests/unit/test_event_rings.c — the rings of KV events
 * (daemon/core/events.h), called directly: nothing is kept for a tenant
 * nobody reads; a tenant's ring holds its own events only, numbered
 * without a hole, however many another tenant makes; a ring grows from
 * its first size to KV_EVENTS_KEEP without losing an event and then
 * drops the oldest; the ring of every event (an admin's) gets each event
 * too, with the tokens; at most KV_EVENTS_MAX_TENANTS tenants have a
 * ring, and a tenant's ring goes with its last reader. */
#include <errno.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "events.h"

#define BT 16

static XXH128_hash_t hash_of(uint64_t n)
{
	return (XXH128_hash_t){.low64 = n, .high64 = ~n};
}

/* n stored events of uid's pool pool_id, the i-th hashed by first + i. */
static void store(struct kv_events *ev, uid_t uid, uint64_t pool_id, uint64_t first, uint64_t n)
{
	uint32_t tokens[BT];

	for (uint64_t i = 0; i < n; i++) {
		for (uint32_t t = 0; t < BT; t++)
			tokens[t] = (uint32_t)(first + i) * 100 + t;
		kv_events_stored(ev, pool_id, uid, BT, hash_of(first + i), NULL, KV_EVENT_HOST,
				 tokens);
	}
}

static void test_nobody_reads(void **state)
{
	struct kv_events ev;

	(void)state;
	kv_events_init(&ev);
	store(&ev, 1000, 1, 0, 100);
	assert_null(ev.all);
	assert_int_equal(ev.n_rings, 0);
	assert_int_equal(ev.next_seq, 1); /* nothing recorded */
	kv_events_fini(&ev);
}

static void test_tenant_ring(void **state)
{
	enum { MINE = 3 * KV_RING_FIRST + 7, OTHERS = 3 * KV_EVENTS_KEEP };
	struct kv_events ev;
	struct kv_ring *r, *r2, *adm;
	uint64_t base;

	(void)state;
	kv_events_init(&ev);
	assert_int_equal(kv_events_subscribe(&ev, 0, 1000, &r), 0);
	assert_int_equal(r->cap, KV_RING_FIRST); /* an idle subscriber costs little */
	assert_int_equal(kv_events_subscribe(&ev, 0, 1000, &r2), 0);
	assert_ptr_equal(r, r2); /* one ring a tenant */
	assert_int_equal(ev.n_rings, 1);
	base = r->next;
	assert_int_equal(base, kv_events_uid_next(&ev, 1000));

	/* Another tenant with no reader: nothing of it kept or numbered. */
	store(&ev, 2000, 2, 0, OTHERS);
	assert_int_equal(r->next, base);
	assert_int_equal(kv_events_uid_next(&ev, 2000), 1);

	/* Its own, interleaved with an admin's view of another's flood. */
	assert_int_equal(kv_events_subscribe(&ev, 1, 0, &adm), 0);
	assert_int_equal(ev.n_rings, 1); /* the admin's is no tenant's */
	for (int k = 0; k < MINE; k++) {
		store(&ev, 1000, 1, (uint64_t)k, 1);
		store(&ev, 2000, 2, 0, 25); /* 26 * MINE > KV_EVENTS_KEEP */
	}
	assert_int_equal(r->next, base + MINE);
	assert_int_equal(kv_ring_oldest(r), base); /* grew: nothing lost */
	assert_true(r->cap >= MINE);
	for (uint64_t n = base; n < base + MINE; n++) {
		const struct kv_event *e = kv_ring_at(r, n);

		assert_non_null(e);
		assert_int_equal(e->useq, n);
		assert_int_equal(e->uid, 1000);
		assert_int_equal(e->pool_id, 1);
		assert_int_equal(e->hash.low64, n - base);
		assert_int_equal(e->n_tokens, BT);
		assert_int_equal(e->tokens[BT - 1], (uint32_t)(n - base) * 100 + BT - 1);
	}
	assert_null(kv_ring_at(r, base + MINE));
	/* The admin's ring had both tenants' and lost the oldest. */
	assert_int_equal(adm->next, ev.next_seq);
	assert_int_equal(adm->cap, KV_EVENTS_KEEP);
	assert_int_equal(kv_ring_oldest(adm), adm->next - KV_EVENTS_KEEP);
	{
		const struct kv_event *last = kv_ring_at(adm, adm->next - 1);
		const struct kv_event *mine = kv_ring_at(adm, adm->next - 26);

		assert_int_equal(last->uid, 2000);
		assert_int_equal(mine->uid, 1000);
		assert_int_equal(mine->useq, base + MINE - 1);
		assert_memory_equal(mine, kv_ring_at(r, base + MINE - 1),
				    offsetof(struct kv_event, tokens) + BT * sizeof(uint32_t));
	}
	assert_null(kv_ring_at(adm, kv_ring_oldest(adm) - 1));

	/* Past KV_EVENTS_KEEP its own drop the oldest, the numbers go on. */
	store(&ev, 1000, 1, 0, KV_EVENTS_KEEP);
	assert_int_equal(r->cap, KV_EVENTS_KEEP);
	assert_int_equal(kv_ring_oldest(r), r->next - KV_EVENTS_KEEP);
	assert_null(kv_ring_at(r, kv_ring_oldest(r) - 1));
	assert_int_equal(kv_ring_at(r, kv_ring_oldest(r))->useq, kv_ring_oldest(r));

	/* The ring goes with its last reader; the numbering goes on. */
	base = r->next;
	kv_events_unsubscribe(&ev, r2);
	assert_int_equal(ev.n_rings, 1);
	kv_events_unsubscribe(&ev, r);
	assert_int_equal(ev.n_rings, 0);
	assert_int_equal(kv_events_uid_next(&ev, 1000), base);
	kv_events_unsubscribe(&ev, adm);
	assert_null(ev.all);
	assert_int_equal(kv_events_subscribe(&ev, 0, 1000, &r), 0);
	assert_int_equal(r->next, base);
	kv_events_unsubscribe(&ev, r);
	kv_events_fini(&ev);
}

/* A pool's end numbers the pool's last event and forgets its numbering. */
static void test_cleared(void **state)
{
	struct kv_events ev;
	struct kv_ring *r;

	(void)state;
	kv_events_init(&ev);
	assert_int_equal(kv_events_subscribe(&ev, 0, 7, &r), 0);
	store(&ev, 7, 5, 0, 2);
	kv_events_removed(&ev, 5, 7, BT, hash_of(1), KV_EVENT_DISK);
	kv_events_cleared(&ev, 5, 7);
	assert_int_equal(r->next - kv_ring_oldest(r), 4);
	assert_int_equal(kv_ring_at(r, r->next - 2)->kind, KV_EVENT_REMOVED);
	assert_int_equal(kv_ring_at(r, r->next - 2)->tier, KV_EVENT_DISK);
	assert_int_equal(kv_ring_at(r, r->next - 1)->kind, KV_EVENT_CLEARED);
	assert_int_equal(kv_ring_at(r, r->next - 1)->pseq, 4);
	assert_int_equal(kv_events_pool_next(&ev, 5), 1);
	kv_events_unsubscribe(&ev, r);
	kv_events_fini(&ev);
}

static void test_cap(void **state)
{
	struct kv_ring *r[KV_EVENTS_MAX_TENANTS + 1], *again;
	struct kv_events ev;

	(void)state;
	kv_events_init(&ev);
	for (uid_t i = 0; i < KV_EVENTS_MAX_TENANTS; i++)
		assert_int_equal(kv_events_subscribe(&ev, 0, 100 + i, &r[i]), 0);
	assert_int_equal(kv_events_subscribe(&ev, 0, 100 + KV_EVENTS_MAX_TENANTS, &again), -EDQUOT);
	assert_int_equal(kv_events_subscribe(&ev, 0, 100, &again), 0); /* has one */
	assert_ptr_equal(again, r[0]);
	assert_int_equal(kv_events_subscribe(&ev, 1, 0, &again), 0); /* not a tenant's */
	kv_events_unsubscribe(&ev, again);
	kv_events_unsubscribe(&ev, r[1]);
	assert_int_equal(
		kv_events_subscribe(&ev, 0, 100 + KV_EVENTS_MAX_TENANTS, &r[KV_EVENTS_MAX_TENANTS]),
		0);
	/* Rings still read are freed with the events (the daemon's end). */
	kv_events_fini(&ev);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nobody_reads),
		cmocka_unit_test(test_tenant_ring),
		cmocka_unit_test(test_cleared),
		cmocka_unit_test(test_cap),
	};

	return cmocka_run_group_tests_name("event_rings", tests, NULL, NULL);
}
