/* daemon/core/place.c — tier placement of a closing hierarchy session's
 * pages (see place.h).
 *
 * Once compact_place in compact.c: session_close calls it, and compact.c
 * calls sessions (session_get, session_own_meta), so the two files called
 * each other (issue 15). Placement needs only the closing session's
 * tokens and hashes, the policy's layers (base/policy.h), the prefix
 * index and a worker, so it sits below session.c and calls nothing of the
 * core but cache.c's tenants and counters. Event-loop thread only, but for
 * place_run on a worker, which touches only its job's copies.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "list.h"
#include "place.h"
#include "policy.h"
#include "prefix_index.h"
#include "session.h"
#include "tokvec.h"
#include "worker.h"

/* Indexed tokens of a closing session whose placement runs on the loop
 * (policy_layers took 34 ms for 64K tokens and 1.6 s for 1M on a 2-core
 * machine; 2K tokens stay near a millisecond). */
#define PLACE_INLINE_TOKENS 2048u

/* The pages of a closing session, by chain hash, and the layers of their
 * tokens: those holding only LAYER_REST tokens go cold, newest first, so
 * the oldest ends up coldest. */
static void demote_rest(struct pool *p, const XXH128_hash_t *hashes, uint32_t n_hashes,
			const uint8_t *layer)
{
	uint32_t bt = p->layout.block_tokens;

	for (uint32_t i = n_hashes; i-- > 0;) {
		struct pindex_entry *e;
		int rest = 1;

		for (uint32_t t = 0; t < bt && rest; t++)
			rest = layer[(uint64_t)i * bt + t] == LAYER_REST;
		e = rest ? prefix_index_find(&p->ix, hashes[i]) : NULL;
		if (e)
			prefix_index_demote(&p->ix, &p->pa, e);
	}
}

/* A placement on a worker: the layers from a copy of the metadata, the
 * demotions back on the loop if the pool is still there. */
struct place_job {
	struct worker_job wj;
	struct cache *c;
	struct cache_tenant *tenant; /* counts it in place_jobs */
	uint64_t pool_id;
	struct policy pol;
	uint32_t budget, n_hashes;
	uint64_t n;
	struct token_meta *meta; /* [n] */
	XXH128_hash_t *hashes;	 /* [n_hashes] */
	uint8_t *layer;		 /* [n] */
	uint32_t *keep, *scratch;
};

static void place_job_free(struct place_job *j)
{
	free(j->meta);
	free(j->hashes);
	free(j->layer);
	free(j->keep);
	free(j->scratch);
	free(j);
}

static void place_run(struct worker_job *wj)
{
	struct place_job *j = container_of(wj, struct place_job, wj);

	policy_layers(&j->pol, j->meta, j->n, j->budget, j->layer, j->keep, j->scratch);
}

static void place_done(struct worker_job *wj)
{
	struct place_job *j = container_of(wj, struct place_job, wj);
	struct pool *p = idmap_get(&j->c->pools, j->pool_id);

	/* Pages indexed since, or matched again, may go cold too: a hint
	 * of eviction order, never a loss. */
	if (p)
		demote_rest(p, j->hashes, j->n_hashes, j->layer);
	cache_count(j->c, j->tenant->uid, placed_sessions, 1);
	j->tenant->place_jobs--;
	place_job_free(j);
}

/* Hands the placement of s's first n_hashes pages to a worker. Returns 0,
 * or -ENOMEM. */
static int place_later(struct cache *c, struct session *s, uint32_t n_hashes, uint64_t n)
{
	struct place_job *j = calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->meta = malloc(n * sizeof(*j->meta));
	j->hashes = malloc(n_hashes * sizeof(*j->hashes));
	j->layer = malloc(n);
	j->keep = malloc(n * sizeof(*j->keep));
	j->scratch = malloc(n * sizeof(*j->scratch));
	if (!j->meta || !j->hashes || !j->layer || !j->keep || !j->scratch) {
		place_job_free(j);
		return -ENOMEM;
	}
	tokvec_get(&s->tok, 0, n, NULL, j->meta);
	memcpy(j->hashes, s->hashes, n_hashes * sizeof(*j->hashes));
	j->c = c;
	j->tenant = cache_tenant(c, s->pool->uid);
	j->pool_id = s->pool->id;
	j->pol = *s->pol;
	j->budget = policy_budget(s->pol, s->n_tokens);
	j->n_hashes = n_hashes;
	j->n = n;
	j->wj.run = place_run;
	j->wj.done = place_done;
	j->tenant->place_jobs++;
	worker_submit(c->worker, &j->wj);
	return 0;
}

void place_session(struct cache *c, struct session *s, uint32_t n_hashes)
{
	struct pool *p = s->pool;
	uint64_t n = (uint64_t)n_hashes * p->layout.block_tokens;
	struct token_meta *meta;
	uint32_t *keep, *scratch;
	uint8_t *layer;

	if (s->pol->kind != POLICY_HIERARCHY || s->unindexed || n == 0 || n > s->n_tokens)
		return;
	if (n > PLACE_INLINE_TOKENS) {
		/* One placement per tenant on the workers; a tenant closing
		 * many long sessions at once, or a daemon stopping, leaves
		 * the rest where they are (an eviction hint, nothing more). */
		if (!c->worker || !c->worker->loop || cache_tenant(c, p->uid)->place_jobs ||
		    place_later(c, s, n_hashes, n) < 0)
			cache_count(c, p->uid, unplaced_sessions, 1);
		return;
	}
	keep = malloc(n * sizeof(*keep));
	scratch = malloc(n * sizeof(*scratch));
	layer = malloc(n);
	meta = malloc(n * sizeof(*meta));
	if (keep && scratch && layer && meta) {
		tokvec_get(&s->tok, 0, n, NULL, meta);
		policy_layers(s->pol, meta, n, policy_budget(s->pol, s->n_tokens), layer, keep,
			      scratch);
		demote_rest(p, s->hashes, n_hashes, layer);
		cache_count(c, p->uid, placed_sessions, 1);
	}
	free(meta);
	free(keep);
	free(scratch);
	free(layer);
}
