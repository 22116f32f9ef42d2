/* daemon/compact.c — tags, importance and compaction of sessions (see
 * compact.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compact.h"
#include "evict.h"
#include "gpu.h"
#include "guard.h"
#include "kernels.h"
#include "log.h"
#include "prefix_index.h"

int compact_set_policy(struct session *s, const struct policy *pol, uint32_t *ret_budget,
		       const char **why)
{
	int ret = policy_validate(pol, why);

	if (ret < 0)
		return ret;
	s->pol = *pol;
	*ret_budget = policy_budget(pol, s->n_tokens);
	return 0;
}

int compact_tag(struct session *s, uint64_t first, uint64_t n, const struct session_tag *tag)
{
	if (first > s->n_tokens || n > s->n_tokens - first)
		return -ERANGE;
	for (uint64_t i = first; i < first + n; i++) {
		s->meta[i].role = tag->role;
		s->meta[i].flags = tag->flags;
		if (tag->has_turn)
			s->meta[i].turn = tag->turn;
	}
	/* Tokens appended later without a tag belong to the last tagged turn. */
	if (tag->has_turn && first + n == s->n_tokens)
		s->cur_turn = tag->turn;
	/* Indexed pages of a span tagged permanent leave the host tier last. */
	if ((tag->flags & TOKEN_PERMANENT) && n) {
		uint32_t bt = s->pool->layout.block_tokens;

		for (uint64_t i = first / bt; i < s->n_hashes && i <= (first + n - 1) / bt; i++) {
			struct pindex_entry *e = prefix_index_find(&s->pool->ix, s->hashes[i]);

			if (e)
				prefix_index_mark_permanent(&s->pool->ix, &s->pool->pa, e);
		}
	}
	return 0;
}

int compact_add_mass(struct session *s, uint64_t first, const float *mass, size_t n)
{
	if (first > s->n_tokens || n > s->n_tokens - first)
		return -ERANGE;
	policy_add_mass(s->meta, s->n_tokens, s->pol.decay, first, mass, n);
	return 0;
}

/* The reference kernels over the clients' arena, under the guard: a page
 * whose memory a client took away is -EFAULT for this request, never a
 * dead daemon (guard.h). */
struct kcall {
	const struct shm_layout *l;
	const void *const *src;
	void **dst;
	uint32_t layer, head, n_q_heads;
	uint64_t n;
	const uint32_t *keep;
	size_t k;
	const float *q;
	float scale, *out, *weights;
};

static int do_attn(void *arg)
{
	struct kcall *a = arg;

	return kref_attn_decode(a->l, a->layer, a->src, a->n, a->q, a->n_q_heads, a->scale, a->out,
				a->weights);
}

static int do_gather_rows(void *arg)
{
	struct kcall *a = arg;

	return kref_gather_rows_f32(a->l, a->src, a->layer, 0, a->head, 0, a->n, a->out);
}

static int do_gather_tokens(void *arg)
{
	struct kcall *a = arg;

	return kref_gather_tokens(a->l, a->dst, 0, a->src, a->n, a->keep, a->k);
}

/* The page table of s as pointers into its pool's arena. */
static const void **page_ptrs(const struct session *s)
{
	const struct pool *p = s->pool;
	const void **v = malloc((s->n_pages ? s->n_pages : 1) * sizeof(*v));

	for (uint32_t i = 0; v && i < s->n_pages; i++)
		v[i] = (const char *)p->arena + (uint64_t)s->pages[i] * p->page_bytes;
	return v;
}

/* The checks a query or a topic (n_q floats, n_q_heads heads of layer)
 * passes before it costs the loop work per committed token of s:
 * work_per_token multiply-adds each. Returns 0 or the error (*why). */
static int check_query(const struct session *s, uint32_t layer, uint32_t n_q_heads, size_t n_q,
		       uint64_t work_per_token, const char **why)
{
	const struct shm_layout *l = &s->pool->layout;
	uint64_t n = s->n_committed;

	if (layer >= l->n_layers) {
		*why = "layer out of range";
		return -EINVAL;
	}
	if (n_q_heads == 0 || n_q_heads % l->n_kv_heads || n_q_heads > 64 * l->n_kv_heads) {
		*why = "n_q_heads must be a multiple of the pool's KV heads (at most 64 per KV "
		       "head)";
		return -EINVAL;
	}
	if (n_q != (size_t)n_q_heads * l->head_dim) {
		*why = "query must hold n_q_heads * head_dim values";
		return -EINVAL;
	}
	if (n == 0) {
		*why = "the session has no committed tokens";
		return -ENODATA;
	}
	if (n * work_per_token > COMPACT_MAX_QUERY_WORK) {
		*why = "session too long for a query here: report the attention masses instead";
		return -E2BIG;
	}
	return 0;
}

int compact_score_query(struct session *s, uint32_t layer, uint32_t n_q_heads, const float *q,
			size_t n_q, uint64_t *ret_scored, const char **why)
{
	const struct shm_layout *l = &s->pool->layout;
	uint64_t n = s->n_committed;
	float *weights = NULL, *out = NULL, *mass = NULL;
	const void **pages = NULL;
	int ret = check_query(s, layer, n_q_heads, n_q, (uint64_t)n_q_heads * l->head_dim, why);

	if (ret < 0)
		return ret;
	ret = -ENOMEM;
	weights = malloc(n * n_q_heads * sizeof(float));
	out = malloc(n_q * sizeof(float));
	mass = calloc(n, sizeof(float));
	pages = page_ptrs(s);
	if (!weights || !out || !mass || !pages) {
		*why = "out of memory";
		goto done;
	}
	/* The bytes are the clients': garbage gives garbage weights, which
	 * policy_add_mass reads as 0 where they are not finite. */
	{
		struct kcall a = {.l = l,
				  .src = (const void *const *)pages,
				  .layer = layer,
				  .n = n,
				  .q = q,
				  .n_q_heads = n_q_heads,
				  .scale = 1.0f / sqrtf((float)l->head_dim),
				  .out = out,
				  .weights = weights};

		ret = guard_run(do_attn, &a);
	}
	if (ret < 0) {
		*why = ret == -EFAULT ? "the session's pages are gone from the arena"
				      : "attention failed";
		goto done;
	}
	for (uint32_t h = 0; h < n_q_heads; h++)
		for (uint64_t t = 0; t < n; t++)
			mass[t] += weights[h * n + t];
	policy_add_mass(s->meta, s->n_tokens, s->pol.decay, 0, mass, n);
	*ret_scored = n;
	ret = 0;
done:
	free(weights);
	free(out);
	free(mass);
	free(pages);
	return ret;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

/* Index of turn in the sorted distinct turns[0..n). */
static uint32_t turn_index(const uint32_t *turns, uint32_t n, uint32_t turn)
{
	uint32_t lo = 0, hi = n;

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (turns[mid] <= turn)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

int compact_score_topic(struct session *s, uint32_t layer, uint32_t n_q_heads, const float *q,
			size_t n_q, uint64_t *ret_scored, const char **why)
{
	const struct shm_layout *l = &s->pool->layout;
	uint64_t n = s->n_committed;
	uint32_t hd = l->head_dim, nkv = l->n_kv_heads, dim = hd * nkv, group, n_turns = 0;
	uint32_t *turns = NULL, *count = NULL;
	float *rows = NULL, *emb = NULL, *topic = NULL, *sim = NULL;
	const void **pages = NULL;
	int ret = check_query(s, layer, n_q_heads, n_q, dim, why);

	if (ret < 0)
		return ret;
	ret = -ENOMEM;
	/* The spans: distinct turns, sorted. */
	turns = malloc(n * sizeof(*turns));
	rows = malloc(n * hd * sizeof(*rows));
	topic = calloc(dim, sizeof(*topic));
	pages = page_ptrs(s);
	if (!turns || !rows || !topic || !pages) {
		*why = "out of memory";
		goto done;
	}
	for (uint64_t t = 0; t < n; t++)
		turns[t] = s->meta[t].turn;
	qsort(turns, n, sizeof(*turns), cmp_u32);
	for (uint64_t t = 0; t < n; t++)
		if (!n_turns || turns[n_turns - 1] != turns[t])
			turns[n_turns++] = turns[t];
	emb = calloc((size_t)n_turns * dim, sizeof(*emb));
	count = calloc(n_turns, sizeof(*count));
	sim = malloc(n_turns * sizeof(*sim));
	if (!emb || !count || !sim) {
		*why = "out of memory";
		goto done;
	}
	/* Each span's mean key, head by head (the bytes are the clients':
	 * garbage gives a garbage score, never anything worse). */
	for (uint32_t h = 0; h < nkv; h++) {
		struct kcall a = {.l = l,
				  .src = (const void *const *)pages,
				  .layer = layer,
				  .head = h,
				  .n = n,
				  .out = rows};

		ret = guard_run(do_gather_rows, &a);
		if (ret == -EFAULT) {
			*why = "the session's pages are gone from the arena";
			goto done;
		}
		kvp_assert(ret == 0); /* committed positions of a valid layer */
		for (uint64_t t = 0; t < n; t++) {
			float *e = emb + (size_t)turn_index(turns, n_turns, s->meta[t].turn) * dim +
				   (size_t)h * hd;

			for (uint32_t d = 0; d < hd; d++)
				e[d] += rows[t * hd + d];
		}
	}
	for (uint64_t t = 0; t < n; t++)
		count[turn_index(turns, n_turns, s->meta[t].turn)]++;
	for (uint32_t i = 0; i < n_turns; i++)
		for (uint32_t d = 0; d < dim; d++)
			emb[(size_t)i * dim + d] /= (float)count[i];
	/* The topic: each KV head's query heads averaged. */
	group = n_q_heads / nkv;
	for (uint32_t qh = 0; qh < n_q_heads; qh++)
		for (uint32_t d = 0; d < hd; d++)
			topic[(qh / group) * hd + d] += q[(size_t)qh * hd + d] / (float)group;
	ret = kref_score_cosine(emb, n_turns, topic, 1, dim, sim);
	kvp_assert(ret == 0);
	for (uint64_t t = 0; t < n; t++) {
		float v = sim[turn_index(turns, n_turns, s->meta[t].turn)];

		s->meta[t].score = v == v ? v : 0.0f; /* NaN from garbage: no score */
	}
	*ret_scored = n;
	ret = 0;
done:
	free(turns);
	free(count);
	free(rows);
	free(emb);
	free(topic);
	free(sim);
	free(pages);
	return ret;
}

void compact_place(struct session *s, uint32_t n_hashes)
{
	struct pool *p = s->pool;
	uint32_t bt = p->layout.block_tokens;
	uint64_t n = (uint64_t)n_hashes * bt;
	uint32_t *keep, *scratch;
	uint8_t *layer;

	if (s->pol.kind != POLICY_HIERARCHY || s->unindexed || n == 0 || n > s->n_tokens)
		return;
	keep = malloc(n * sizeof(*keep));
	scratch = malloc(n * sizeof(*scratch));
	layer = malloc(n);
	if (keep && scratch && layer) {
		policy_layers(&s->pol, s->meta, n, policy_budget(&s->pol, s->n_tokens), layer, keep,
			      scratch);
		/* Newest first: the oldest page ends up coldest. */
		for (uint32_t i = n_hashes; i-- > 0;) {
			struct pindex_entry *e;
			int rest = 1;

			for (uint32_t t = 0; t < bt && rest; t++)
				rest = layer[(uint64_t)i * bt + t] == LAYER_REST;
			e = rest ? prefix_index_find(&p->ix, s->hashes[i]) : NULL;
			if (e)
				prefix_index_demote(&p->ix, &p->pa, e);
		}
	}
	free(keep);
	free(scratch);
	free(layer);
}

/* Moves the kept tokens keep[0..k) of s into n_new fresh pages. */
static int rebuild(struct session *s, const uint32_t *keep, size_t k, uint32_t n_new)
{
	struct pool *p = s->pool;
	uint32_t *slots = malloc((n_new ? n_new : 1) * sizeof(*slots));
	void **dst = malloc((n_new ? n_new : 1) * sizeof(*dst));
	const void **src = page_ptrs(s);
	int ret = -ENOMEM;

	if (!slots || !dst || !src)
		goto done;
	for (uint32_t i = 0; i < n_new; i++) {
		ret = pagealloc_get(&p->pa, &slots[i]);
		kvp_assert(ret == 0); /* evict_make_room made room */
		dst[i] = (char *)p->arena + (uint64_t)slots[i] * p->page_bytes;
	}
	if (k) {
		struct kcall a = {.l = &p->layout,
				  .dst = dst,
				  .src = (const void *const *)src,
				  .n = s->n_tokens,
				  .keep = keep,
				  .k = k};

		ret = guard_run(do_gather_tokens, &a);
		if (ret == -EFAULT) {
			/* Nothing changed yet: the fresh pages go back. */
			for (uint32_t i = 0; i < n_new; i++)
				pagealloc_unref(&p->pa, slots[i]);
			goto done;
		}
		kvp_assert(ret == 0); /* keep[] lies inside the session */
	}
	/* keep[] ascends and keep[i] >= i: in place, front to back. */
	for (size_t i = 0; i < k; i++) {
		s->tokens[i] = s->tokens[keep[i]];
		s->meta[i] = s->meta[keep[i]];
	}
	for (uint32_t i = 0; i < s->n_pages; i++) {
		pagealloc_unref(&p->pa, s->pages[i]);
		prefix_index_update(&p->ix, &p->pa, s->pages[i]);
	}
	/* Device slots belong to the old page numbers (everything was copied
	 * back at the commits): they go. n_new <= n_pages: the table has room. */
	gpu_session_free(s);
	memcpy(s->pages, slots, n_new * sizeof(*slots));
	s->n_pages = n_new;
	s->n_hashes = 0;
	s->dropped_tokens += s->n_tokens - k;
	s->n_tokens = s->n_committed = k;
	s->compacted = s->unindexed = 1;
	ret = 0;
done:
	free(slots);
	free(dst);
	free(src);
	return ret;
}

static int compact(struct cache *c, struct session *s, uint64_t *ret_dropped)
{
	struct pool *p = s->pool;
	uint32_t bt = p->layout.block_tokens, n_new;
	uint64_t n = s->n_tokens;
	uint32_t *keep, *scratch;
	size_t k;
	int ret;

	*ret_dropped = 0;
	if (s->pol.kind == POLICY_NONE)
		return -EINVAL;
	if (s->n_committed != s->n_tokens || s->dev_copying)
		return -EBUSY;
	keep = malloc((n ? n : 1) * sizeof(*keep));
	scratch = malloc((n ? n : 1) * sizeof(*scratch));
	if (!keep || !scratch) {
		ret = -ENOMEM;
		goto done;
	}
	k = policy_select(&s->pol, s->meta, n, policy_budget(&s->pol, n), keep, scratch);
	ret = 0;
	if (k == n)
		goto done; /* everything fits */
	n_new = (uint32_t)((k + bt - 1) / bt);
	ret = evict_make_room(c, p, n_new);
	if (ret == 0)
		ret = rebuild(s, keep, k, n_new);
	if (ret == 0)
		*ret_dropped = n - k;
done:
	free(keep);
	free(scratch);
	return ret;
}

int compact_session(struct cache *c, struct session *s, uint64_t *ret_dropped)
{
	int ret = compact(c, s, ret_dropped);

	s->last_use_ns = cache_now_ns();
	return ret;
}

int compact_after_commit(struct cache *c, struct session *s)
{
	int saved = c->no_park, ret;
	uint64_t dropped;

	if (!s->pol.auto_compact || s->pol.kind == POLICY_NONE || s->n_committed != s->n_tokens ||
	    s->n_tokens <= policy_budget(&s->pol, s->n_tokens))
		return 0;
	/* The commit is done and answered either way: no parking here. */
	c->no_park = 1;
	ret = compact(c, s, &dropped);
	c->no_park = saved;
	c->park_on = NULL;
	return ret == 0 && dropped > 0;
}
