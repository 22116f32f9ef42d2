/* tests/unit/core_fixture.c — the cache and pool the core unit tests
 * share (see core_fixture.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "core_fixture.h"
#include "log.h"
#include "match.h"
#include "prefix_index.h"

/* One page of 4 KiB (the smallest a page is padded to) holding CORE_BT
 * tokens. */
static const struct shm_layout core_layout = {
	.n_layers = 1,
	.n_kv_heads = 1,
	.head_dim = 8,
	.block_tokens = CORE_BT,
	.dtype = 1, /* f16 */
	.quant_group = 0,
};

static void client_init(struct core_client *cl)
{
	session_writer_init(&cl->writing);
	session_owner_init(&cl->sessions);
	list_init(&cl->leases);
}

void core_fixture_init(struct core_fixture *f, uint32_t n_pages, double high, double low)
{
	uint64_t page_bytes = shm_page_bytes(&core_layout);

	memset(f, 0, sizeof(*f));
	log_set_level(LOG_WARNING); /* pool_open's line on every test */
	config_defaults(&f->cfg);
	/* The tests of the victim order spell out LRU's (test_tier). */
	f->cfg.eviction = CONFIG_EVICTION_LRU;
	f->cfg.host_pool_bytes = (uint64_t)n_pages * page_bytes;
	/* Room for every pool: no tier share evicts anything, only the
	 * pool's own watermarks. */
	f->cfg.host_tier_bytes = 64 * f->cfg.host_pool_bytes;
	f->cfg.host_tenant_bytes = 0;
	f->cfg.host_high_watermark = high;
	f->cfg.host_low_watermark = low;
	f->cfg.disk_pool_bytes = 0;
	f->cfg.gpu_pool_bytes = 0;
	cache_init(&f->c, &f->cfg);
	assert_null(f->c.aio);
	assert_null(f->c.gpu);
	client_init(&f->a);
	client_init(&f->b);
	assert_int_equal(pool_open(&f->c, CORE_UID, "unit-model", &core_layout, &f->p), 0);
	assert_int_equal(f->p->pa.n_pages, n_pages);
	assert_int_equal(f->p->page_bytes, page_bytes);
	assert_null(f->p->spill);
	core_check(f);
}

void core_fixture_fini(struct core_fixture *f)
{
	/* Freed even when the check fails, so ASan reports only real
	 * leaks. */
	int ret = cache_check(&f->c);

	cache_fini(&f->c);
	assert_int_equal(ret, 0);
}

int core_fixture_setup(void **state, uint32_t n_pages, double high, double low)
{
	struct core_fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	core_fixture_init(f, n_pages, high, low);
	*state = f;
	return 0;
}

int core_fixture_teardown(void **state)
{
	struct core_fixture *f = *state;

	core_fixture_fini(f);
	free(f);
	return 0;
}

void core_tokens(uint32_t *ids, uint32_t n, uint32_t base)
{
	for (uint32_t i = 0; i < n; i++)
		ids[i] = base + i;
}

struct session *core_session(struct core_fixture *f, struct core_client *cl)
{
	struct session *s = NULL;

	assert_int_equal(session_create(&f->c, f->p, f->p->root, &s), 0);
	session_own(&f->c, s, &cl->sessions, 0);
	core_check(f);
	return s;
}

uint64_t core_append(struct core_fixture *f, struct core_client *cl, struct session *s,
		     const uint32_t *ids, uint32_t n)
{
	uint64_t first = UINT64_MAX, before = s->n_tokens;

	assert_int_equal(session_append(&f->c, s, cl, &cl->writing, ids, n, NULL, &f->pk, &first),
			 0);
	assert_int_equal(first, before);
	assert_int_equal(s->n_tokens, before + n);
	assert_ptr_equal(s->writer, cl);
	core_check(f);
	return first;
}

void core_commit(struct core_fixture *f, struct core_client *cl, struct session *s, uint32_t n)
{
	uint64_t before = s->n_committed;
	uint32_t first_filled = UINT32_MAX;

	assert_int_equal(session_commit(&f->c, s, cl, n, &first_filled), 0);
	assert_int_equal(first_filled, before / CORE_BT);
	assert_int_equal(s->n_committed, before + n);
	core_check(f);
}

uint64_t core_append_commit(struct core_fixture *f, struct core_client *cl, struct session *s,
			    uint32_t base, uint32_t n)
{
	uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	uint64_t first;

	assert_non_null(ids);
	core_tokens(ids, n, base);
	first = core_append(f, cl, s, ids, n);
	core_commit(f, cl, s, n);
	free(ids);
	return first;
}

void core_cached_chain(struct core_fixture *f, uint32_t base, uint32_t n)
{
	struct session *s = core_session(f, &f->a);

	core_append_commit(f, &f->a, s, base, n);
	session_close(&f->c, s);
	core_check(f);
}

static uint8_t *slot_at(const struct core_fixture *f, uint32_t slot)
{
	assert_true(slot < f->p->pa.n_pages);
	return (uint8_t *)f->p->arena + (uint64_t)slot * f->p->page_bytes;
}

uint8_t core_slot_byte(const struct core_fixture *f, uint32_t slot)
{
	return *slot_at(f, slot);
}

void core_fill_slot(struct core_fixture *f, uint32_t slot, uint8_t v)
{
	memset(slot_at(f, slot), v, f->p->page_bytes);
}

int core_slot_all(const struct core_fixture *f, uint32_t slot, uint8_t v)
{
	const uint8_t *b = slot_at(f, slot);

	for (uint64_t i = 0; i < f->p->page_bytes; i++)
		if (b[i] != v)
			return 0;
	return 1;
}

XXH128_hash_t core_page_hash(const struct core_fixture *f, uint32_t base, uint32_t i)
{
	XXH128_hash_t h = f->p->root;
	uint32_t ids[CORE_BT];

	for (uint32_t k = 0; k <= i; k++) {
		core_tokens(ids, CORE_BT, base + k * CORE_BT);
		h = prefix_index_hash_page(h, ids, CORE_BT);
	}
	return h;
}

int core_indexed(const struct core_fixture *f, uint32_t base, uint32_t i)
{
	return prefix_index_find_host(&f->p->ix, core_page_hash(f, base, i)) != NULL;
}

uint64_t core_match_tokens(struct core_fixture *f, uint32_t base, uint32_t n)
{
	uint32_t *ids = malloc((n ? n : 1) * sizeof(*ids));
	struct match_result mr;
	struct lease *l = NULL;
	struct list owner;
	uint64_t got = 0;
	int ret;

	assert_non_null(ids);
	list_init(&owner);
	core_tokens(ids, n, base);
	ret = match_start(&f->c, f->p, f->p->root, &owner, &owner, ids, n, NULL, 0, 0, &l, &mr);
	assert_true(ret == 0 || ret == 1);
	if (ret == 1) {
		got = l->n_tokens;
		core_check(f);
		lease_release(&f->c, l);
	}
	assert_true(list_empty(&owner));
	core_check(f);
	free(ids);
	return got;
}
