/* daemon/core/compact.c — tags, importance and compaction of sessions (see
 * compact.h).
 *
 * Above the sessions it changes (session.h) and the tiers it takes room
 * from (tier.h, gpu.h); nothing of the core calls it but the whole-cache
 * check (whole.c). A closing session's tier placement by the hierarchy is
 * place.c's, below session.c, which calls it. Event-loop thread only,
 * but for compact_job_run. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "compact.h"
#include "gpu.h"
#include "guard.h"
#include "kernels.h"
#include "log.h"
#include "prefix_index.h"
#include "tier.h"

/* Summary tokens of s outside [first, first + n). */
static uint64_t summary_tokens(const struct session *s, uint64_t first, uint64_t n)
{
	uint64_t got = 0;

	for (uint64_t i = 0; i < s->n_tokens; i++)
		if ((i < first || i - first >= n) &&
		    (tokvec_meta(&s->tok, i).flags & TOKEN_SUMMARY))
			got++;
	return got;
}

static int summary_fits(const struct policy *pol, uint64_t n_sum, const char **why)
{
	if (pol->kind == POLICY_NONE || n_sum <= pol->budget)
		return 0;
	*why = "summary spans of more tokens than the policy's budget (every policy keeps "
	       "them all)";
	return -EINVAL;
}

int compact_check_summary(const struct session *s, uint64_t first, uint64_t n, unsigned flags,
			  const char **why)
{
	if (!(flags & TOKEN_SUMMARY))
		return 0;
	return summary_fits(s->pol, summary_tokens(s, first, n) + n, why);
}

int compact_set_policy(struct session *s, const struct policy *pol, uint32_t *ret_budget,
		       const char **why)
{
	int ret = policy_validate(pol, why);

	if (ret < 0)
		return ret;
	ret = summary_fits(pol, summary_tokens(s, 0, 0), why);
	if (ret < 0)
		return ret;
	/* Token policies score and gather K/V rows with the numeric kernels,
	 * which address only K/V pages of the converted dtypes. */
	if (pol->kind != POLICY_NONE && !shm_layout_numeric(&s->pool->layout)) {
		*why = "token policies need K/V pages (not latent, not raw fp8)";
		return -EOPNOTSUPP;
	}
	ret = session_set_policy(s, pol);
	if (ret < 0) {
		*why = "no memory for the policy";
		return ret;
	}
	*ret_budget = policy_budget(pol, s->n_tokens);
	return 0;
}

int compact_tag(struct cache *c, struct session *s, uint64_t first, uint64_t n,
		const struct session_tag *tag)
{
	int ret;

	if (first > s->n_tokens || n > s->n_tokens - first)
		return -ERANGE;
	ret = session_own_meta(c, s, first, first + n);
	if (ret < 0)
		return ret;
	for (uint64_t i = first; i < first + n; i++) {
		struct token_meta *m = tokvec_meta_w(&s->tok, i);

		m->role = tag->role;
		m->flags = tag->flags;
		if (tag->has_turn)
			m->turn = tag->turn;
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

/* policy_add_mass over the session's metadata, chunk by chunk (it decays
 * every score): its own, made so by the caller. */
static void add_mass(struct session *s, uint64_t first, const float *mass, size_t n)
{
	uint64_t per = s->tok.per_chunk;

	for (uint64_t at = 0; at < s->n_tokens; at += per) {
		uint64_t len = s->n_tokens - at < per ? s->n_tokens - at : per;
		uint64_t lo = first > at ? first : at;
		uint64_t hi = first + n < at + len ? first + n : at + len;
		struct token_meta *m = tokvec_meta_w(&s->tok, at);

		if (lo < hi)
			policy_add_mass(m, len, s->pol->decay, lo - at, mass + (lo - first),
					hi - lo);
		else
			policy_add_mass(m, len, s->pol->decay, len, NULL, 0);
	}
}

int compact_add_mass(struct cache *c, struct session *s, uint64_t first, const float *mass,
		     size_t n)
{
	int ret;

	if (first > s->n_tokens || n > s->n_tokens - first)
		return -ERANGE;
	ret = session_own_meta(c, s, 0, s->n_tokens);
	if (ret < 0)
		return ret;
	add_mass(s, first, mass, n);
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

/* The checks a query or a topic (n_q floats, n_q_heads heads of layer)
 * passes before it costs work per committed token of s: work_per_token
 * multiply-adds each. Returns 0 or the error (*why). */
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

void compact_job_release(struct compact_job *j)
{
	struct pool *p = j->pool;

	if (p) {
		for (uint32_t i = 0; i < j->n_slots; i++) {
			pagealloc_unref(&p->pa, j->slots[i]);
			prefix_index_update(&p->ix, &p->pa, j->slots[i]);
		}
		/* Fresh pages a compaction did not hand to its session. */
		for (uint32_t i = 0; i < j->n_new; i++)
			pagealloc_unref(&p->pa, j->new_slots[i]);
		p->n_compact_jobs--;
		list_del(&j->link);
		j->pool = NULL;
	}
	j->n_slots = j->n_new = 0;
	free(j->slots);
	free(j->src);
	free(j->q);
	free(j->turns);
	free(j->out);
	free(j->keep);
	free(j->meta);
	free(j->new_slots);
	free(j->dst);
	j->slots = j->keep = j->new_slots = j->turns = NULL;
	j->meta = NULL;
	j->src = NULL;
	j->dst = NULL;
	j->q = j->out = NULL;
}

/* Takes the snapshot of s's first n_slots pages into j (whose slots and
 * src have room) and attaches j to the pool. References keep the slots
 * from being freed or reused while the worker reads them; committed
 * positions are never rewritten (a truncated session copies a page
 * someone else holds before it writes it again). */
static void hold_pages(struct session *s, uint32_t n_slots, struct compact_job *j)
{
	struct pool *p = s->pool;

	for (uint32_t i = 0; i < n_slots; i++) {
		j->slots[i] = s->pages[i];
		pagealloc_ref(&p->pa, s->pages[i]);
		prefix_index_update(&p->ix, &p->pa, s->pages[i]);
		j->src[i] = (const char *)p->arena + (uint64_t)s->pages[i] * p->page_bytes;
	}
	j->n_slots = n_slots;
	j->session_id = s->id;
	j->layout = p->layout;
	j->pool = p;
	p->n_compact_jobs++;
	list_add_tail(&p->compact_jobs, &j->link);
}

int compact_score_start(struct session *s, int topic, uint32_t layer, uint32_t n_q_heads,
			const float *q, size_t n_q, struct compact_job *j, const char **why)
{
	const struct shm_layout *l = &s->pool->layout;
	uint64_t n = s->n_committed;
	uint32_t n_slots;
	int ret = check_query(s, layer, n_q_heads, n_q,
			      topic ? (uint64_t)l->head_dim * l->n_kv_heads : (uint64_t)n_q, why);

	memset(j, 0, sizeof(*j));
	list_init(&j->link);
	if (ret < 0)
		return ret;
	if (!shm_layout_numeric(l)) {
		*why = "scoring needs K/V pages (not latent, not raw fp8)";
		return -EINVAL;
	}
	n_slots = (uint32_t)((n + l->block_tokens - 1) / l->block_tokens);
	j->slots = malloc(n_slots * sizeof(*j->slots));
	j->src = malloc(n_slots * sizeof(*j->src));
	j->q = malloc(n_q * sizeof(*j->q));
	j->out = malloc(n * sizeof(*j->out));
	j->turns = topic ? malloc(n * sizeof(*j->turns)) : NULL;
	if (!j->slots || !j->src || !j->q || !j->out || (topic && !j->turns)) {
		compact_job_release(j);
		*why = "out of memory";
		return -ENOMEM;
	}
	j->kind = topic ? COMPACT_JOB_TOPIC : COMPACT_JOB_QUERY;
	j->n = n;
	j->layer = layer;
	j->n_q_heads = n_q_heads;
	memcpy(j->q, q, n_q * sizeof(*q));
	for (uint64_t t = 0; topic && t < n; t++)
		j->turns[t] = tokvec_meta(&s->tok, t).turn;
	hold_pages(s, n_slots, j);
	return 0;
}

/* The attention weights of the query, summed over heads, into out. */
static void run_query(struct compact_job *j)
{
	const struct shm_layout *l = &j->layout;
	uint64_t n = j->n;
	size_t n_q = (size_t)j->n_q_heads * l->head_dim;
	float *weights = malloc(n * j->n_q_heads * sizeof(float));
	float *out = malloc(n_q * sizeof(float));
	struct kcall a = {.l = l,
			  .src = j->src,
			  .layer = j->layer,
			  .n = n,
			  .q = j->q,
			  .n_q_heads = j->n_q_heads,
			  .scale = 1.0f / sqrtf((float)l->head_dim),
			  .out = out,
			  .weights = weights};

	if (!weights || !out) {
		j->ret = -ENOMEM;
		j->why = "out of memory";
		goto done;
	}
	/* The bytes are the clients': garbage gives garbage weights, which
	 * policy_add_mass reads as 0 where they are not finite. */
	j->ret = guard_run(do_attn, &a);
	if (j->ret < 0) {
		j->why = j->ret == -EFAULT ? "the session's pages are gone from the arena"
					   : "attention failed";
		goto done;
	}
	memset(j->out, 0, n * sizeof(float));
	for (uint32_t h = 0; h < j->n_q_heads; h++)
		for (uint64_t t = 0; t < n; t++)
			j->out[t] += weights[h * n + t];
done:
	free(weights);
	free(out);
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

/* Each span's similarity to the topic, as every token's score, into out. */
static void run_topic(struct compact_job *j)
{
	const struct shm_layout *l = &j->layout;
	uint64_t n = j->n;
	uint32_t hd = l->head_dim, nkv = l->n_kv_heads, dim = hd * nkv, group, n_turns = 0;
	uint32_t *turns = NULL, *count = NULL;
	float *rows = NULL, *emb = NULL, *topic = NULL, *sim = NULL;
	int ret;

	j->ret = -ENOMEM;
	j->why = "out of memory";
	/* The spans: distinct turns, sorted. */
	turns = malloc(n * sizeof(*turns));
	rows = malloc(n * hd * sizeof(*rows));
	topic = calloc(dim, sizeof(*topic));
	if (!turns || !rows || !topic)
		goto done;
	memcpy(turns, j->turns, n * sizeof(*turns));
	qsort(turns, n, sizeof(*turns), cmp_u32);
	for (uint64_t t = 0; t < n; t++)
		if (!n_turns || turns[n_turns - 1] != turns[t])
			turns[n_turns++] = turns[t];
	emb = calloc((size_t)n_turns * dim, sizeof(*emb));
	count = calloc(n_turns, sizeof(*count));
	sim = malloc(n_turns * sizeof(*sim));
	if (!emb || !count || !sim)
		goto done;
	/* Each span's mean key, head by head (the bytes are the clients':
	 * garbage gives a garbage score, never anything worse). */
	for (uint32_t h = 0; h < nkv; h++) {
		struct kcall a = {
			.l = l, .src = j->src, .layer = j->layer, .head = h, .n = n, .out = rows};

		ret = guard_run(do_gather_rows, &a);
		if (ret == -EFAULT) {
			j->ret = ret;
			j->why = "the session's pages are gone from the arena";
			goto done;
		}
		kvp_assert(ret == 0); /* committed positions of a valid layer */
		for (uint64_t t = 0; t < n; t++) {
			float *e = emb + (size_t)turn_index(turns, n_turns, j->turns[t]) * dim +
				   (size_t)h * hd;

			for (uint32_t d = 0; d < hd; d++)
				e[d] += rows[t * hd + d];
		}
	}
	for (uint64_t t = 0; t < n; t++)
		count[turn_index(turns, n_turns, j->turns[t])]++;
	for (uint32_t i = 0; i < n_turns; i++)
		for (uint32_t d = 0; d < dim; d++)
			emb[(size_t)i * dim + d] /= (float)count[i];
	/* The topic: each KV head's query heads averaged. */
	group = j->n_q_heads / nkv;
	for (uint32_t qh = 0; qh < j->n_q_heads; qh++)
		for (uint32_t d = 0; d < hd; d++)
			topic[(qh / group) * hd + d] += j->q[(size_t)qh * hd + d] / (float)group;
	ret = kref_score_cosine(emb, n_turns, topic, 1, dim, sim);
	kvp_assert(ret == 0);
	for (uint64_t t = 0; t < n; t++) {
		float v = sim[turn_index(turns, n_turns, j->turns[t])];

		j->out[t] = v == v ? v : 0.0f; /* NaN from garbage: no score */
	}
	j->ret = 0;
	j->why = NULL;
done:
	free(turns);
	free(count);
	free(rows);
	free(emb);
	free(topic);
	free(sim);
}

/* The choice of the kept tokens (when not made yet), then their K/V into
 * the fresh pages. */
static void run_gather(struct compact_job *j)
{
	uint32_t bt = j->layout.block_tokens;
	struct kcall a = {
		.l = &j->layout, .dst = j->dst, .src = j->src, .n = j->n, .keep = j->keep};

	if (j->meta) {
		uint32_t *scratch = malloc((j->n ? j->n : 1) * sizeof(*scratch));

		if (!scratch) {
			j->ret = -ENOMEM;
			j->why = "out of memory";
			return;
		}
		j->k = policy_select(&j->pol, j->meta, j->n, j->budget, j->keep, scratch);
		free(scratch);
		if (j->late) {
			j->ret = 0;
			return; /* the loop takes pages and copies, if need be */
		}
		if (j->k > (size_t)j->n_new * bt) {
			/* policy_select keeps at most the budget: never here. */
			j->ret = -EIO;
			j->why = "the policy kept more tokens than its budget";
			return;
		}
	}
	a.k = j->k;
	j->ret = j->k && j->k < j->n ? guard_run(do_gather_tokens, &a) : 0;
	if (j->ret == -EFAULT)
		j->why = "the session's pages are gone from the arena";
	else
		kvp_assert(j->ret == 0); /* keep[] lies inside the session */
}

void compact_job_run(struct compact_job *j)
{
	switch (j->kind) {
	case COMPACT_JOB_QUERY:
		run_query(j);
		break;
	case COMPACT_JOB_TOPIC:
		run_topic(j);
		break;
	case COMPACT_JOB_GATHER:
		run_gather(j);
		break;
	}
}

/* The session takes the kept tokens in the job's fresh pages. Its
 * tokens must be its own (session_own_meta). */
static void apply_gather(struct session *s, struct compact_job *j)
{
	struct pool *p = s->pool;
	size_t k = j->k;
	uint32_t used = (uint32_t)((k + j->layout.block_tokens - 1) / j->layout.block_tokens);

	/* keep[] ascends and keep[i] >= i: in place, front to back. */
	for (size_t i = 0; i < k; i++) {
		uint32_t id = tokvec_id(&s->tok, j->keep[i]);

		*tokvec_meta_w(&s->tok, i) = tokvec_meta(&s->tok, j->keep[i]);
		tokvec_put(&s->tok, i, 1, &id, NULL);
	}
	for (uint32_t i = 0; i < s->n_pages; i++) {
		pagealloc_unref(&p->pa, s->pages[i]);
		prefix_index_update(&p->ix, &p->pa, s->pages[i]);
	}
	/* Device slots belong to the old page numbers (everything was copied
	 * back at the commits): they go. used <= n_pages: the table has room;
	 * the job's references on the fresh pages it used become the
	 * session's, the rest go back with the job. */
	gpu_session_free(s);
	memcpy(s->pages, j->new_slots, used * sizeof(*j->new_slots));
	s->n_pages = used;
	memmove(j->new_slots, j->new_slots + used, (j->n_new - used) * sizeof(*j->new_slots));
	j->n_new -= used;
	s->n_hashes = 0;
	s->dropped_tokens += s->n_tokens - k;
	s->n_tokens = s->n_committed = k;
	tokvec_cut(&s->tok, k);
	s->compacted = s->unindexed = 1;
}

/* A choice that dropped tokens although the budget holds all of them
 * (role limits): the fresh pages and the copy, here and now — rare, and
 * no more than the kept tokens. The request cannot wait for disk writes
 * any more, so room comes without them or not at all. Returns 0, -ENOSPC,
 * -ENOMEM or -EFAULT (*why). */
static int late_gather(struct cache *c, struct compact_job *j, const char **why)
{
	struct pool *p = j->pool;
	uint32_t n_new = (uint32_t)((j->k + p->layout.block_tokens - 1) / p->layout.block_tokens);
	struct tier_park pk = {.no_park = 1}; /* the choice is made: no waiting now */
	int ret;

	ret = tier_make_room(c, p, n_new, &pk);
	if (ret < 0) {
		*why = "host tier full: no pages for the compacted copy";
		return -ENOSPC;
	}
	/* The start left room for none. */
	free(j->new_slots);
	free(j->dst);
	j->new_slots = malloc((n_new ? n_new : 1) * sizeof(*j->new_slots));
	j->dst = malloc((n_new ? n_new : 1) * sizeof(*j->dst));
	if (!j->new_slots || !j->dst) {
		*why = "out of memory";
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n_new; i++) {
		ret = pagealloc_get(&p->pa, &j->new_slots[i]);
		kvp_assert(ret == 0); /* tier_make_room made room */
		j->dst[i] = (char *)p->arena + (uint64_t)j->new_slots[i] * p->page_bytes;
		j->n_new++;
	}
	/* The choice is made: only the copy is left. */
	j->late = 0;
	free(j->meta);
	j->meta = NULL;
	run_gather(j);
	*why = j->why;
	return j->ret;
}

int compact_job_finish(struct cache *c, struct compact_job *j, uint64_t *ret_n, const char **why)
{
	struct pool *p = j->pool;
	struct session *s = p ? session_get(c, j->session_id, p->uid, 0) : NULL;
	int gather = j->kind == COMPACT_JOB_GATHER;
	int ret = j->ret;

	if (ret < 0) {
		*why = j->why;
	} else if (!s || s->pool != p) {
		ret = -ENOENT;
		*why = gather ? "the session was closed while it was compacted"
			      : "the session was closed while it was scored";
	} else if (s->n_committed != j->n || s->n_pages < j->n_slots ||
		   (j->n_slots &&
		    memcmp(s->pages, j->slots, j->n_slots * sizeof(*j->slots)) != 0) ||
		   (gather && (s->n_tokens != j->n || s->n_pages != j->n_slots ||
			       (s->dev && s->dev->copying)))) {
		/* Our references kept the slots from being reused, so the same
		 * slots and length mean the same committed K/V. */
		ret = -EBUSY;
		*why = gather ? "the session changed while it was compacted: try again"
			      : "the session changed while it was scored: try again";
	} else {
		/* Scores and kept tokens are written where a fork may share
		 * them: the session's own copy first. */
		ret = session_own_meta(c, s, 0, s->n_tokens);
		if (ret < 0)
			*why = "no room for the session's own copy of its tokens "
			       "(max-tenant-tokens)";
	}
	if (ret == 0) {
		switch (j->kind) {
		case COMPACT_JOB_QUERY:
			add_mass(s, 0, j->out, j->n);
			*ret_n = j->n;
			break;
		case COMPACT_JOB_TOPIC:
			for (uint64_t t = 0; t < j->n; t++)
				tokvec_meta_w(&s->tok, t)->score = j->out[t];
			*ret_n = j->n;
			break;
		case COMPACT_JOB_GATHER:
			if (j->late && j->k < j->n)
				ret = late_gather(c, j, why);
			if (ret == 0 && j->k < j->n)
				apply_gather(s, j);
			if (ret == 0)
				*ret_n = j->n - j->k;
			break;
		}
	}
	if (s)
		s->last_use_ns = clock_now_ns();
	compact_job_release(j);
	return ret;
}

uint32_t compact_jobs(const struct cache *c, uid_t uid)
{
	uint32_t n = 0;

	for (const struct list *it = c->pool_list.next; it != &c->pool_list; it = it->next) {
		const struct pool *p = list_entry(it, struct pool, link);

		if (p->uid == uid)
			n += p->n_compact_jobs;
	}
	return n;
}

int compact_check(const struct pool *p, uint32_t *refs)
{
	uint32_t n = 0;

	for (const struct list *it = p->compact_jobs.next; it != &p->compact_jobs; it = it->next) {
		const struct compact_job *j = list_entry(it, struct compact_job, link);

		if (j->pool != p)
			return -EUCLEAN;
		for (uint32_t i = 0; i < j->n_slots; i++) {
			if (j->slots[i] >= p->pa.n_pages)
				return -EUCLEAN;
			refs[j->slots[i]]++;
		}
		for (uint32_t i = 0; i < j->n_new; i++) {
			if (j->new_slots[i] >= p->pa.n_pages)
				return -EUCLEAN;
			refs[j->new_slots[i]]++;
		}
		n++;
	}
	return n == p->n_compact_jobs ? 0 : -EUCLEAN;
}

int compact_gather_start(struct cache *c, struct session *s, struct tier_park *pk,
			 struct compact_job *j)
{
	struct pool *p = s->pool;
	uint32_t bt = p->layout.block_tokens, n_new, budget;
	uint64_t n = s->n_tokens;
	int ret;

	memset(j, 0, sizeof(*j));
	list_init(&j->link);
	if (s->pol->kind == POLICY_NONE || !shm_layout_numeric(&p->layout))
		return -EINVAL; /* compact_set_policy refuses policies there */
	if (s->n_committed != s->n_tokens || (s->dev && s->dev->copying))
		return -EBUSY;
	ret = -ENOMEM;
	budget = policy_budget(s->pol, n);
	j->keep = malloc((n ? n : 1) * sizeof(*j->keep));
	if (!j->keep)
		goto fail;
	/* The choice on the worker, from a copy. At most budget tokens are
	 * kept: room for them now, unless the budget holds every token —
	 * then pages are taken only when the choice dropped some (late). */
	j->meta = malloc((n ? n : 1) * sizeof(*j->meta));
	if (!j->meta)
		goto fail;
	tokvec_get(&s->tok, 0, n, NULL, j->meta);
	j->pol = *s->pol;
	j->budget = budget;
	j->late = budget >= n;
	n_new = j->late ? 0 : (uint32_t)((budget + bt - 1) / bt);
	if (n_new) {
		ret = tier_make_room(c, p, n_new, pk);
		if (ret < 0)
			goto fail;
	}
	ret = -ENOMEM;
	j->slots = malloc((s->n_pages ? s->n_pages : 1) * sizeof(*j->slots));
	j->src = malloc((s->n_pages ? s->n_pages : 1) * sizeof(*j->src));
	j->new_slots = malloc((n_new ? n_new : 1) * sizeof(*j->new_slots));
	j->dst = malloc((n_new ? n_new : 1) * sizeof(*j->dst));
	if (!j->slots || !j->src || !j->new_slots || !j->dst)
		goto fail;
	j->kind = COMPACT_JOB_GATHER;
	j->n = n;
	hold_pages(s, s->n_pages, j);
	for (uint32_t i = 0; i < n_new; i++) {
		ret = pagealloc_get(&p->pa, &j->new_slots[i]);
		kvp_assert(ret == 0); /* tier_make_room made room */
		j->dst[i] = (char *)p->arena + (uint64_t)j->new_slots[i] * p->page_bytes;
		j->n_new++;
	}
	return 0;
fail:
	compact_job_release(j);
	return ret;
}

static int compact(struct cache *c, struct session *s, struct tier_park *pk, uint64_t *ret_dropped)
{
	struct compact_job j;
	const char *why;
	int ret = compact_gather_start(c, s, pk, &j);

	*ret_dropped = 0;
	if (ret < 0)
		return ret;
	compact_job_run(&j);
	return compact_job_finish(c, &j, ret_dropped, &why);
}

int compact_session(struct cache *c, struct session *s, struct tier_park *pk, uint64_t *ret_dropped)
{
	int ret = compact(c, s, pk, ret_dropped);

	s->last_use_ns = clock_now_ns();
	return ret;
}

int compact_due(const struct session *s, uint64_t more)
{
	return s->pol->auto_compact && s->pol->kind != POLICY_NONE &&
	       s->n_committed + more == s->n_tokens &&
	       s->n_tokens > policy_budget(s->pol, s->n_tokens);
}

int compact_gather_start_now(struct cache *c, struct session *s, struct compact_job *j)
{
	/* The commit is done either way: no parking here. */
	struct tier_park pk = {.no_park = 1};

	return compact_gather_start(c, s, &pk, j);
}

int compact_after_commit(struct cache *c, struct session *s)
{
	struct compact_job j;
	uint64_t dropped = 0;
	const char *why;

	if (!compact_due(s, 0) || compact_gather_start_now(c, s, &j) < 0)
		return 0;
	compact_job_run(&j);
	return compact_job_finish(c, &j, &dropped, &why) == 0 && dropped > 0;
}
