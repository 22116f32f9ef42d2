/* tests/unit/test_prefix_index.c — the prefix index of daemon/store/prefix_index.h.
 *
 * The hash chain is what spilled pages and checkpoints will be found by
 * after a restart, so its format is pinned: h_i is XXH3-128 of the
 * canonical (big-endian) bytes of h_{i-1} followed by the page's token ids
 * as little-endian uint32, checked against a one-shot XXH3 of that byte
 * string and against known answers; the root separates model ids, every
 * layout field and salts (even "a" from "a\0"), and is the same for the
 * same inputs. The index itself: insert, find, duplicate keys, and
 * eviction — only pages nothing but the index holds, leaves first, least
 * recently used first, a parent right after the child it lost — with
 * prefix_index_check agreeing at every step. Single-threaded.
 */
#define XXH_STATIC_LINKING_ONLY
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "pagealloc.h"
#include "prefix_index.h"

static const struct shm_layout lay = {
	.n_layers = 2,
	.n_kv_heads = 2,
	.head_dim = 32,
	.block_tokens = 16,
	.dtype = 1, /* f16 */
	.quant_group = 0,
};

static int same(XXH128_hash_t a, XXH128_hash_t b)
{
	return XXH128_isEqual(a, b);
}

/* h_i from its definition, with one-shot XXH3 over the bytes. */
static XXH128_hash_t by_definition(XXH128_hash_t parent, const uint32_t *tokens, uint32_t n)
{
	unsigned char buf[16 + 4 * 64];
	XXH128_canonical_t cp;

	assert_true(n <= 64);
	XXH128_canonicalFromHash(&cp, parent);
	memcpy(buf, cp.digest, 16);
	for (uint32_t i = 0; i < n; i++) {
		buf[16 + 4 * i] = (unsigned char)tokens[i];
		buf[16 + 4 * i + 1] = (unsigned char)(tokens[i] >> 8);
		buf[16 + 4 * i + 2] = (unsigned char)(tokens[i] >> 16);
		buf[16 + 4 * i + 3] = (unsigned char)(tokens[i] >> 24);
	}
	return XXH3_128bits(buf, 16 + 4 * (size_t)n);
}

static void test_hash_is_the_documented_chain(void **state)
{
	uint32_t tokens[64];
	XXH128_hash_t h = prefix_index_root("m", &lay, NULL, 0);

	(void)state;
	for (uint32_t i = 0; i < 64; i++)
		tokens[i] = i * 2654435761u;
	for (uint32_t n = 1; n <= 64; n += 7) {
		XXH128_hash_t got = prefix_index_hash_page(h, tokens, n);

		assert_true(same(got, by_definition(h, tokens, n)));
		h = got;
	}
}

/* Fixed inputs, fixed outputs: a change here orphans every spilled page
 * and checkpoint, so it must come with a new PREFIX_INDEX_FORMAT. */
static void test_known_answers(void **state)
{
	uint32_t page[16];
	XXH128_hash_t root = prefix_index_root("kvpalace-test-model", &lay, NULL, 0);
	XXH128_hash_t salted = prefix_index_root("kvpalace-test-model", &lay, "salt", 4);
	XXH128_hash_t h1, h2;

	(void)state;
	for (uint32_t i = 0; i < 16; i++)
		page[i] = 1000 + i;
	h1 = prefix_index_hash_page(root, page, 16);
	h2 = prefix_index_hash_page(h1, page, 16);
	assert_int_equal(PREFIX_INDEX_FORMAT, 1);
	assert_int_equal(root.high64, 0x5e1eea2e2f844645ull);
	assert_int_equal(root.low64, 0xf5749ee797c0ba52ull);
	assert_int_equal(salted.high64, 0x79b8d26d675780a0ull);
	assert_int_equal(salted.low64, 0xe0774e11ca208d61ull);
	assert_int_equal(h1.high64, 0xa223d1159a823d5full);
	assert_int_equal(h1.low64, 0x3055a2850e0b2578ull);
	assert_int_equal(h2.high64, 0xee87aa87ea63882dull);
	assert_int_equal(h2.low64, 0x26afb6c8f9bfa4c5ull);
}

static void test_root_separates_identities(void **state)
{
	struct shm_layout l2;
	XXH128_hash_t base = prefix_index_root("model", &lay, NULL, 0);
	static const char salt64[64] =
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

	(void)state;
	/* Deterministic, and an empty salt is no salt. */
	assert_true(same(base, prefix_index_root("model", &lay, NULL, 0)));
	assert_true(same(base, prefix_index_root("model", &lay, "", 0)));
	assert_false(same(base, prefix_index_root("model2", &lay, NULL, 0)));
	assert_false(same(base, prefix_index_root("mode", &lay, NULL, 0)));
	/* every field, the page format (7th) included */
	for (int f = 0; f < 7; f++) {
		uint32_t *field = (uint32_t *)&l2 + f;

		l2 = lay;
		*field += 1;
		assert_false(same(base, prefix_index_root("model", &l2, NULL, 0)));
	}
	assert_false(same(base, prefix_index_root("model", &lay, "a", 1)));
	assert_false(same(prefix_index_root("model", &lay, "a", 1),
			  prefix_index_root("model", &lay, "a\0", 2)));
	assert_false(same(prefix_index_root("model", &lay, "a", 1),
			  prefix_index_root("model", &lay, "b", 1)));
	assert_false(same(base, prefix_index_root("model", &lay, salt64, 64)));
	/* A salt cannot pose as part of the model id. */
	assert_false(
		same(prefix_index_root("ab", &lay, NULL, 0), prefix_index_root("a", &lay, "b", 1)));
}

/* ---- extra keys and key spans (issue 18) ------------------------------------ */

static struct pindex_span kspan(uint64_t first, uint64_t n, const char *key)
{
	return (struct pindex_span){first, n, prefix_index_key_digest(key, strlen(key))};
}

static void test_extra_key_root(void **state)
{
	XXH128_hash_t base = prefix_index_root("model", &lay, "salt", 4);

	(void)state;
	/* No extra key: the salt's root as it always was. */
	assert_true(same(base, prefix_index_root_keyed("model", &lay, "salt", 4, NULL, 0)));
	assert_false(same(base, prefix_index_root_keyed("model", &lay, "salt", 4, "lora", 4)));
	assert_false(same(prefix_index_root_keyed("model", &lay, "salt", 4, "lora", 4),
			  prefix_index_root_keyed("model", &lay, "salt", 4, "lorb", 4)));
	/* An extra key is not a salt, nor part of one. */
	assert_false(same(prefix_index_root_keyed("model", &lay, NULL, 0, "salt", 4),
			  prefix_index_root("model", &lay, "salt", 4)));
	assert_false(same(prefix_index_root_keyed("model", &lay, "sa", 2, "lt", 2),
			  prefix_index_root_keyed("model", &lay, "s", 1, "alt", 3)));
	assert_true(same(prefix_index_root_keyed("model", &lay, "s", 1, "alt", 3),
			 prefix_index_root_keyed("model", &lay, "s", 1, "alt", 3)));
}

static void test_keyed_pages(void **state)
{
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t page[16];
	struct pindex_span a = kspan(40, 48, "image-A"), b = kspan(40, 48, "image-B");
	struct pindex_span a_moved = kspan(41, 47, "image-A"), a_short = kspan(40, 2, "image-A");
	struct pindex_span two[] = {kspan(2, 3, "x"), kspan(5, 1, "y")};
	struct pindex_span two_swapped[] = {kspan(2, 3, "y"), kspan(5, 1, "x")};
	XXH128_hash_t plain;

	(void)state;
	for (uint32_t i = 0; i < 16; i++)
		page[i] = 7;
	plain = prefix_index_hash_page(root, page, 16);
	/* A page overlapping no span is the plain page. */
	assert_true(same(plain, prefix_index_hash_keyed(root, page, 16, 0, NULL, 0)));
	assert_true(same(plain, prefix_index_hash_keyed(root, page, 16, 16, &a, 1)));
	assert_true(same(plain, prefix_index_hash_keyed(root, page, 16, 24, &a, 1)));
	assert_true(same(plain, prefix_index_hash_keyed(root, page, 16, 88, &a, 1)));
	/* Overlapping: keyed, by the key and by where the span starts. */
	assert_false(same(plain, prefix_index_hash_keyed(root, page, 16, 32, &a, 1)));
	assert_false(same(prefix_index_hash_keyed(root, page, 16, 32, &a, 1),
			  prefix_index_hash_keyed(root, page, 16, 32, &b, 1)));
	assert_false(same(prefix_index_hash_keyed(root, page, 16, 48, &a, 1),
			  prefix_index_hash_keyed(root, page, 16, 48, &a_moved, 1)));
	/* Pages wholly inside the image differ by their offset in it. */
	assert_false(same(prefix_index_hash_keyed(root, page, 16, 48, &a, 1),
			  prefix_index_hash_keyed(root, page, 16, 64, &a, 1)));
	/* The length only decides which pages overlap: a span cut short
	 * keeps the hash of a page it still overlaps. */
	assert_true(same(prefix_index_hash_keyed(root, page, 16, 32, &a, 1),
			 prefix_index_hash_keyed(root, page, 16, 32, &a_short, 1)));
	/* Two spans on a page: both count, in order. */
	assert_false(same(prefix_index_hash_keyed(root, page, 16, 0, two, 2),
			  prefix_index_hash_keyed(root, page, 16, 0, two_swapped, 2)));
	assert_false(same(prefix_index_hash_keyed(root, page, 16, 0, two, 2),
			  prefix_index_hash_keyed(root, page, 16, 0, two, 1)));
	/* Known answer: the fold is part of the format (what checkpoints and
	 * spill files store), so a change to it must be deliberate. */
	{
		XXH128_hash_t h = prefix_index_hash_keyed(root, page, 16, 32, &a, 1);
		XXH3_state_t st;
		XXH128_canonical_t c;
		unsigned char rec[24];
		uint64_t off = (uint64_t)(40 - 32);

		XXH3_128bits_reset(&st);
		XXH128_canonicalFromHash(&c, root);
		XXH3_128bits_update(&st, &c, sizeof(c));
		XXH3_128bits_update(&st, page, sizeof(page));
		for (int i = 0; i < 8; i++)
			rec[i] = (unsigned char)(off >> (8 * i));
		XXH128_canonicalFromHash((XXH128_canonical_t *)(rec + 8), a.key);
		XXH3_128bits_update(&st, rec, sizeof(rec));
		assert_true(same(h, XXH3_128bits_digest(&st)));
	}
}

static void test_span_lists(void **state)
{
	struct pindex_span v[] = {kspan(0, 10, "a"), kspan(10, 5, "b"), kspan(20, 30, "c")};
	struct pindex_spans s = {0}, f = {0};

	(void)state;
	assert_int_equal(prefix_index_span_seek(v, 3, 0), 0);
	assert_int_equal(prefix_index_span_seek(v, 3, 10), 1);
	assert_int_equal(prefix_index_span_seek(v, 3, 15), 2);
	assert_int_equal(prefix_index_span_seek(v, 3, 49), 2);
	assert_int_equal(prefix_index_span_seek(v, 3, 50), 3);
	assert_int_equal(prefix_index_spans_add(&s, v, 3, 2), -EDQUOT);
	assert_int_equal(s.n, 0);
	assert_int_equal(prefix_index_spans_add(&s, v, 3, 3), 0);
	assert_int_equal(prefix_index_spans_copy(&f, s.v, s.n, 25), 0);
	assert_int_equal(f.n, 3);
	assert_int_equal(f.v[2].n_tokens, 5);
	prefix_index_spans_cut(&s, 12);
	assert_int_equal(s.n, 2);
	assert_int_equal(s.v[1].n_tokens, 2);
	prefix_index_spans_cut(&s, 10);
	assert_int_equal(s.n, 1);
	assert_int_equal(s.v[0].n_tokens, 10);
	prefix_index_spans_free(&s);
	prefix_index_spans_free(&f);
	assert_null(s.v);
}

/* ---- the index -------------------------------------------------------------- */

struct fix {
	struct pagealloc pa;
	struct prefix_index ix;
	uint32_t refs[64];
};

static void check(struct fix *f)
{
	memset(f->refs, 0, sizeof(f->refs));
	assert_int_equal(prefix_index_check(&f->ix, &f->pa, f->refs), 0);
	assert_int_equal(pagealloc_check(&f->pa), 0);
}

/* A session commits a chain of n pages under root: each page a fresh
 * slot (the session's reference), indexed. Slots go to slots[]. */
static void commit_chain(struct fix *f, XXH128_hash_t root, uint32_t seed, int n, uint32_t *slots,
			 XXH128_hash_t *hashes)
{
	struct pindex_entry *parent = NULL;
	XXH128_hash_t h = root;

	for (int i = 0; i < n; i++) {
		uint32_t page[16];

		for (uint32_t k = 0; k < 16; k++)
			page[k] = seed * 100 + (uint32_t)i * 16 + k;
		h = prefix_index_hash_page(h, page, 16);
		assert_int_equal(pagealloc_get(&f->pa, &slots[i]), 0);
		assert_int_equal(prefix_index_insert(&f->ix, &f->pa, h, parent, slots[i]), 0);
		parent = prefix_index_find(&f->ix, h);
		assert_non_null(parent);
		assert_int_equal(parent->slot, slots[i]);
		hashes[i] = h;
		check(f);
	}
}

/* The session lets go of its pages (closes). */
static void close_chain(struct fix *f, const uint32_t *slots, int n)
{
	for (int i = n; i-- > 0;) {
		assert_int_equal(pagealloc_unref(&f->pa, slots[i]), 1);
		prefix_index_update(&f->ix, &f->pa, slots[i]);
	}
	check(f);
}

static void test_evict_lru_leaves_first(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t a[3], b[3], c[2];
	XXH128_hash_t ha[3], hb[3], hc[2];

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	commit_chain(f, root, 1, 3, a, ha);
	commit_chain(f, root, 2, 3, b, hb);
	commit_chain(f, root, 3, 2, c, hc);
	assert_int_equal(f->ix.n_entries, 8);
	/* Held by their sessions: nothing to evict. */
	assert_int_equal(f->ix.n_evictable, 0);
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, 64, 1), 0);
	/* A duplicate hash is refused; the page stays unindexed. */
	{
		uint32_t s;

		assert_int_equal(pagealloc_get(&f->pa, &s), 0);
		assert_int_equal(prefix_index_insert(&f->ix, &f->pa, ha[0], NULL, s), -EEXIST);
		assert_null(prefix_index_of_slot(&f->ix, s));
		assert_int_equal(pagealloc_unref(&f->pa, s), 0);
		check(f);
	}

	/* B closes first, then A, then C: only leaves are evictable. */
	close_chain(f, b, 3);
	close_chain(f, a, 3);
	close_chain(f, c, 2);
	assert_int_equal(f->ix.n_evictable, 3);
	/* C is pinned by a lease: never a victim while it is. */
	pagealloc_pin(&f->pa, c[0]);
	pagealloc_pin(&f->pa, c[1]);
	prefix_index_update(&f->ix, &f->pa, c[0]);
	prefix_index_update(&f->ix, &f->pa, c[1]);
	assert_int_equal(f->ix.n_evictable, 2);
	check(f);

	/* The coldest chain (B) goes whole, from its end, before A loses a
	 * page. */
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, f->pa.n_free + 2, 1), 2);
	assert_null(prefix_index_of_slot(&f->ix, b[2]));
	assert_null(prefix_index_of_slot(&f->ix, b[1]));
	assert_non_null(prefix_index_find(&f->ix, hb[0]));
	assert_non_null(prefix_index_find(&f->ix, ha[2]));
	check(f);
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, f->pa.n_free + 2, 1), 2);
	assert_null(prefix_index_find(&f->ix, hb[0]));
	assert_null(prefix_index_find(&f->ix, ha[2]));
	assert_non_null(prefix_index_find(&f->ix, ha[1]));
	check(f);
	/* Everything that can go: A; C stays pinned. */
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, 64, 1), 2);
	assert_int_equal(f->ix.n_entries, 2);
	assert_int_equal(f->ix.evictions, 6);
	assert_non_null(prefix_index_find(&f->ix, hc[1]));
	check(f);
	/* The lease ends: C can go too. */
	pagealloc_unpin(&f->pa, c[1]);
	pagealloc_unpin(&f->pa, c[0]);
	prefix_index_update(&f->ix, &f->pa, c[1]);
	prefix_index_update(&f->ix, &f->pa, c[0]);
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, 64, 1), 2);
	assert_int_equal(f->ix.n_entries, 0);
	assert_int_equal(f->pa.n_free, 64);
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	pagealloc_fini(&f->pa);
	free(f);
}

struct forget_arg {
	XXH128_hash_t pick; /* the entry chosen */
	int gone;	    /* entries gone() saw */
	int order_ok;	    /* each gone before its parent */
	XXH128_hash_t seen[16];
};

static int pick_one(void *arg, const struct pindex_entry *e)
{
	return XXH128_isEqual(e->hash, ((struct forget_arg *)arg)->pick);
}

static void saw_gone(void *arg, const struct pindex_entry *e)
{
	struct forget_arg *x = arg;

	/* Children first: none of those seen so far is e's parent. */
	for (int i = 0; i < x->gone; i++)
		if (e->parent && XXH128_isEqual(x->seen[i], e->parent->hash))
			x->order_ok = 0;
	if (x->gone < 16)
		x->seen[x->gone] = e->hash;
	x->gone++;
}

/* An admin's purge (daemon/service/purge.c): forgetting a page takes every page
 * continuing it, children first, leaves its parent and the other chains;
 * a page a session still holds stays allocated for it; a dry run changes
 * nothing; I/O in flight refuses the whole call. */
static void test_forget_takes_descendants(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t a[4], b[2];
	XXH128_hash_t ha[4], hb[2];
	struct forget_arg x = {.order_ok = 1};
	struct pindex_entry *e;

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	commit_chain(f, root, 1, 4, a, ha);
	commit_chain(f, root, 2, 2, b, hb);
	close_chain(f, a + 2, 2); /* the session keeps a[0], a[1] */
	close_chain(f, b, 2);
	x.pick = ha[1];
	assert_int_equal(prefix_index_forget(&f->ix, &f->pa, pick_one, saw_gone, &x, 1), 3);
	assert_int_equal(x.gone, 0);
	assert_int_equal(f->ix.n_entries, 6);
	check(f);
	/* I/O in flight on one of them: nothing happens. */
	e = prefix_index_find(&f->ix, ha[3]);
	e->io = PINDEX_IO_WRITE;
	prefix_index_reconsider(&f->ix, &f->pa, e);
	assert_int_equal(prefix_index_forget(&f->ix, &f->pa, pick_one, saw_gone, &x, 0), -EBUSY);
	assert_int_equal(f->ix.n_entries, 6);
	e->io = PINDEX_IO_NONE;
	prefix_index_reconsider(&f->ix, &f->pa, e);
	check(f);

	assert_int_equal(prefix_index_forget(&f->ix, &f->pa, pick_one, saw_gone, &x, 0), 3);
	assert_int_equal(x.gone, 3);
	assert_true(x.order_ok);
	assert_null(prefix_index_find(&f->ix, ha[1]));
	assert_null(prefix_index_find(&f->ix, ha[2]));
	assert_null(prefix_index_find(&f->ix, ha[3]));
	assert_non_null(prefix_index_find(&f->ix, ha[0]));
	assert_non_null(prefix_index_find(&f->ix, hb[1]));
	assert_int_equal(f->ix.forgotten, 3);
	assert_int_equal(f->ix.evictions, 0);
	/* a[1] is the session's still; a[2], a[3] went back to the pool. */
	assert_int_equal(f->pa.refs[a[1]], 1);
	assert_null(prefix_index_of_slot(&f->ix, a[1]));
	assert_int_equal(f->pa.refs[a[2]], 0);
	check(f);
	assert_int_equal(pagealloc_unref(&f->pa, a[1]), 0);
	assert_int_equal(pagealloc_unref(&f->pa, a[0]), 1);
	prefix_index_update(&f->ix, &f->pa, a[0]);
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	pagealloc_fini(&f->pa);
	free(f);
}

/* The host list's order: ordinary entries LRU first, then permanent ones
 * (which leave last), and a demoted entry goes to the cold end of its
 * list. With a disk tier as without, only pages none of whose children
 * keeps a host copy are listed: a chain leaves the host tier from its end
 * (issue 13: spilling took parents whose children stayed). */
static void test_host_order_permanent_and_demoted(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t a[2], b[2], c[2];
	XXH128_hash_t ha[2], hb[2], hc[2];
	struct pindex_entry *want[6], *e;
	int n = 0;

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	f->ix.disk = 1;
	commit_chain(f, root, 1, 2, a, ha);
	commit_chain(f, root, 2, 2, b, hb);
	commit_chain(f, root, 3, 2, c, hc);
	/* A is a system prompt: permanent. */
	prefix_index_mark_permanent(&f->ix, &f->pa, prefix_index_find(&f->ix, ha[0]));
	prefix_index_mark_permanent(&f->ix, &f->pa, prefix_index_find(&f->ix, ha[1]));
	close_chain(f, a, 2); /* joins: a1 (kept list) */
	close_chain(f, b, 2); /* b1 */
	close_chain(f, c, 2); /* c1 */
	assert_int_equal(f->ix.n_permanent, 2);
	/* C's last page was the least useful: demoted. */
	prefix_index_demote(&f->ix, &f->pa, prefix_index_find(&f->ix, hc[1]));
	want[n++] = prefix_index_find(&f->ix, hc[1]);
	want[n++] = prefix_index_find(&f->ix, hb[1]);
	want[n++] = prefix_index_find(&f->ix, ha[1]);
	e = prefix_index_host_next(&f->ix, NULL);
	for (int i = 0; i < n; i++, e = prefix_index_host_next(&f->ix, e))
		assert_ptr_equal(e, want[i]);
	assert_null(e);
	check(f);
	/* Touching a permanent entry keeps it on its own list. */
	prefix_index_touch(&f->ix, &f->pa, want[2]);
	assert_true(want[2]->permanent);
	check(f);
	/* C's last page leaves the host tier (it has a disk copy): its
	 * parent is a leaf now, as cold as it was, the next to go. */
	want[0]->extent = 7;
	f->ix.n_disk++;
	prefix_index_detach_host(&f->ix, &f->pa, want[0]);
	assert_ptr_equal(prefix_index_host_next(&f->ix, NULL), prefix_index_find(&f->ix, hc[0]));
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	pagealloc_fini(&f->pa);
	free(f);
}

/* A chain used again (a lease came and went) is the most recent. */
/* Pin and release each of n slots: a request used the pages once more. */
static void use_again(struct fix *f, const uint32_t *slots, int n)
{
	for (int i = 0; i < n; i++) {
		pagealloc_pin(&f->pa, slots[i]);
		prefix_index_update(&f->ix, &f->pa, slots[i]);
	}
	for (int i = n; i-- > 0;) {
		pagealloc_unpin(&f->pa, slots[i]);
		prefix_index_update(&f->ix, &f->pa, slots[i]);
	}
	check(f);
}

static void test_evict_reuse_is_recent(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t a[2], b[2];
	XXH128_hash_t ha[2], hb[2];

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	commit_chain(f, root, 1, 2, a, ha);
	commit_chain(f, root, 2, 2, b, hb);
	close_chain(f, a, 2);
	close_chain(f, b, 2);
	/* A is matched (pinned) and released: now newer than B. */
	use_again(f, a, 2);
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, f->pa.n_free + 2, 1), 2);
	assert_null(prefix_index_find(&f->ix, hb[0]));
	assert_non_null(prefix_index_find(&f->ix, ha[1]));
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	assert_int_equal(f->pa.n_free, 64);
	pagealloc_fini(&f->pa);
	free(f);
}

/* A kept walk (prefix_index_keep_walk): under window, A (used twice: main)
 * goes before B (once: probation, under its share) — unless a walk used
 * A, when B goes and then nothing: the walk's pages are no victims until
 * it ends. */
static void test_kept_walk_is_no_victim(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0);
	uint32_t a[2], b[2];
	XXH128_hash_t ha[2], hb[2];

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	assert_int_equal(prefix_index_set_window(&f->ix, PINDEX_WIN_PERMILLE), 0);
	commit_chain(f, root, 1, 2, a, ha);
	commit_chain(f, root, 2, 2, b, hb);
	close_chain(f, a, 2);
	close_chain(f, b, 2);
	use_again(f, a, 2);
	/* Without a walk main goes first: A's leaf. */
	assert_int_equal(prefix_index_host_next(&f->ix, NULL), prefix_index_find(&f->ix, ha[1]));

	prefix_index_keep_walk(&f->ix, 1);
	prefix_index_touch(&f->ix, &f->pa, prefix_index_find(&f->ix, ha[0]));
	prefix_index_touch(&f->ix, &f->pa, prefix_index_find(&f->ix, ha[1]));
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, 64, 1), 2);
	assert_null(prefix_index_find(&f->ix, hb[0]));
	assert_non_null(prefix_index_find(&f->ix, ha[1]));
	assert_null(prefix_index_host_next(&f->ix, NULL));
	check(f);
	/* The walk over, A can go. */
	prefix_index_keep_walk(&f->ix, 0);
	assert_int_equal(prefix_index_evict(&f->ix, &f->pa, 64, 1), 2);
	assert_int_equal(f->ix.n_entries, 0);
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	pagealloc_fini(&f->pa);
	free(f);
}

/* prefix_index_keep_walk: a match's prefetch walk touched P, a page that
 * sat on no host list (its other child X was in the host tier), then
 * made room: X went, P joined the host list at its cold end, and P, a
 * page the walk found, was the next victim unless the touch marked it. */
static void test_keep_walk_keeps_a_parent_it_found(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	XXH128_hash_t root = prefix_index_root("m", &lay, NULL, 0), hq;
	uint32_t a[2], q, page[16];
	XXH128_hash_t ha[2];
	struct pindex_entry *P, *X, *Q;

	(void)state;
	assert_non_null(f);
	assert_int_equal(pagealloc_init(&f->pa, 64), 0);
	assert_int_equal(prefix_index_init(&f->ix, 64), 0);
	f->ix.disk = 1;
	/* P → X committed, and P → Q, another conversation on P. */
	commit_chain(f, root, 1, 2, a, ha);
	for (uint32_t k = 0; k < 16; k++)
		page[k] = 9000 + k;
	hq = prefix_index_hash_page(ha[0], page, 16);
	P = prefix_index_find(&f->ix, ha[0]);
	assert_int_equal(pagealloc_get(&f->pa, &q), 0);
	assert_int_equal(prefix_index_insert(&f->ix, &f->pa, hq, P, q), 0);
	assert_int_equal(pagealloc_unref(&f->pa, q), 1);
	prefix_index_update(&f->ix, &f->pa, q);
	close_chain(f, a, 2);
	X = prefix_index_find(&f->ix, ha[1]);
	Q = prefix_index_find(&f->ix, hq);
	/* Both have disk copies; Q's host copy left: Q is on disk only. */
	X->extent = 7;
	Q->extent = 8;
	f->ix.n_disk += 2;
	prefix_index_detach_host(&f->ix, &f->pa, Q);
	check(f);
	assert_ptr_equal(prefix_index_host_next(&f->ix, NULL), X);
	assert_int_equal(P->list, PINDEX_LIST_NONE);

	/* The walk: P found in the host tier, Q to be read; room is made. */
	prefix_index_keep_walk(&f->ix, 1);
	prefix_index_touch(&f->ix, &f->pa, P);
	prefix_index_touch(&f->ix, &f->pa, Q);
	assert_ptr_equal(prefix_index_host_next(&f->ix, NULL), X);
	prefix_index_detach_host(&f->ix, &f->pa, X);
	assert_int_equal(P->list, PINDEX_LIST_HOST);
	assert_null(prefix_index_host_next(&f->ix, NULL)); /* P is kept */
	prefix_index_keep_walk(&f->ix, 0);
	assert_ptr_equal(prefix_index_host_next(&f->ix, NULL), P);
	check(f);
	prefix_index_fini(&f->ix, &f->pa);
	pagealloc_fini(&f->pa);
	free(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hash_is_the_documented_chain),
		cmocka_unit_test(test_known_answers),
		cmocka_unit_test(test_root_separates_identities),
		cmocka_unit_test(test_extra_key_root),
		cmocka_unit_test(test_keyed_pages),
		cmocka_unit_test(test_span_lists),
		cmocka_unit_test(test_evict_lru_leaves_first),
		cmocka_unit_test(test_forget_takes_descendants),
		cmocka_unit_test(test_host_order_permanent_and_demoted),
		cmocka_unit_test(test_evict_reuse_is_recent),
		cmocka_unit_test(test_kept_walk_is_no_victim),
		cmocka_unit_test(test_keep_walk_keeps_a_parent_it_found),
	};

	return cmocka_run_group_tests_name("prefix_index", tests, NULL, NULL);
}
