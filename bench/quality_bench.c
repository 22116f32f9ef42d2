/* bench/quality_bench.c — what the token policies and the quantized page
 * formats cost in quality on a trained model: stories260K (examples/stories)
 * through a real kvpalaced and the real library.
 *
 * The model writes --seqs sequences itself (BOS, then tokens sampled at
 * temperature 1 from --seed: there is no tokenizer here, token ids are the
 * text), each --prefix + --cont + 1 tokens long, with f16 pages. The dense
 * run gives, for each continuation position P .. P + C - 1, the logits over
 * the full cache: the reference. Then for every configuration the prefix's
 * K/V pages go into a session of the daemon (kvp_append, written in place
 * through kvp_session_kv, kvp_commit), the session gets its tags, its H2O
 * scores (the attention mass each prefix token received over the prefix
 * steps, summed over layers and query heads, decayed by the policy's decay
 * per step, reported once with kvp_session_report_importance: the same
 * scores as one report per step) and its policy; kvp_session_compact makes
 * the daemon keep its budget of the prefix; the kept tokens are read back
 * from the session's pages (kvp_session_kv after the compaction) and the
 * model computes the continuation over them, each token at its true
 * position (K is stored rotated, so kept tokens keep theirs).
 *
 * Figures, over every continuation token of every sequence: perplexity of
 * the continuation (exp of the mean negative log-likelihood of the sampled
 * next token) and top-1 agreement (the argmax equals the dense run's).
 *
 * Configurations, at budgets of 10, 25, 50 and 75 % of the prefix:
 *   window      the last B tokens (BOS and the first tokens leave);
 *   sinks       4 sinks + the last B - 4 (StreamingLLM);
 *   importance  4 sinks, the last B / 2 (--recent N: the last N, as the
 *               daemon's default recent 64 does), the rest by H2O score;
 *   hierarchy   the daemon's defaults (10 % permanent, 30 % hot over the
 *               last 4 turns, the rest by score), the prefix tagged in
 *               turns of 64 tokens (stories have no turns), nothing
 *               permanent;
 *   hier+sinks  the same with the first 4 tokens tagged permanent (sinks in
 *               the hierarchy's permanent layer);
 *   random      B positions drawn uniformly, picked here (no daemon): chance.
 * And at the full budget, the cache stored as int8, fp8-e4m3 and int4 pages
 * (group = head_dim 8; the dense f16 prefix converted with
 * kref_convert_pages, each continuation token's K/V stored in the same
 * format) through a pool of that dtype, against f16.
 *
 * Mixed precision (important tokens kept exact) has no pool format, so it
 * is emulated without the daemon: the prefix quantized to int4 or fp8 and
 * back, then the sinks and 10 % of the prefix put back exact, chosen by
 * H2O score or as the most recent, or 25 % by score, against nothing put
 * back (the control: the continuation's K/V stay f16 in all of these).
 *
 * Long documents (summary spans, issue 22), at budgets B of 25 and 50 %:
 * sinks + window drop the middle of the prefix; one summary token per 16
 * dropped tokens (their K/V mean, score-weighted mean, or the top-scored
 * token's K/V: the model has no summarizer, so the summary is made of its
 * own K/V) is appended to the session tagged KVP_TAG_SUMMARY and the daemon
 * compacts under sinks + window at B + S, keeping it (checked from the
 * session's metadata); against the same tokens dropped (sinks at B) and
 * the same B + S tokens spent on sinks + window or importance.
 *
 * Self-check: f16 at the full budget through the daemon must equal the
 * dense run bit for bit (every logit), else exit 1.
 *
 * Output: tables on stdout and "sample quality.<name> VALUE" lines for
 * bench/run; progress on stderr. Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_num.h"
#include "kvpalace.h"
#include "stories.h"

#define BT	   16u
#define N_PCT	   4u
#define N_POL	   6u
#define P_RANDOM   5u
#define N_STORE	   4u
#define TURN_LEN   64u
#define N_SINKS	   4u
#define DECAY	   0.01f
#define RECENT_PCT 50u
#define N_MIXED	   8u /* {int4, fp8} x mixed_modes */
#define EXACT_PCT  10u
#define N_LD_PCT   2u  /* long-document budgets */
#define N_LD	   6u  /* long-document configurations */
#define LD_CHUNK   16u /* tokens of the prefix each summary token stands for */

/* --recent: importance's protected recent tokens; 0: half the budget */
static uint32_t opt_recent;

static const unsigned pcts[N_PCT] = {10, 25, 50, 75};
static const char *const pol_names[N_POL] = {"window",	  "sinks",	"importance",
					     "hierarchy", "hier+sinks", "random"};
static const unsigned ld_pcts[N_LD_PCT] = {25, 50};
/* Mixed precision: which prefix tokens stay exact (x % 4 of N_MIXED). */
enum { MIX_NONE, MIX_SCORE, MIX_RECENT, MIX_SCORE25 };
static const char *const mix_names[4] = {"nothing", "by score", "recent", "score 25%"};
static const char *const mix_keys[4] = {"none", "score", "recent", "score25"};
enum { SUM_NONE, SUM_MEAN, SUM_WMEAN, SUM_TOP }; /* how a summary token is made */
static const char *const ld_names[N_LD] = {"drop",     "+sum mean", "+sum wmean",
					   "+sum top", "sinks B+S", "import B+S"};
static const char *const ld_keys[N_LD] = {"drop", "mean", "wmean", "top", "sinks", "importance"};
static const uint32_t store_dtypes[N_STORE] = {SHM_DTYPE_F16, SHM_DTYPE_INT8, SHM_DTYPE_FP8_E4M3,
					       SHM_DTYPE_INT4};

static void die(const char *what, int err)
{
	fprintf(stderr, "kvp-bench-quality: %s: %s\n", what, strerror(err < 0 ? -err : err));
	exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size);

	if (!p)
		die("allocation", ENOMEM);
	return p;
}

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A page table of private, zeroed pages. */
static void table_new(struct stories_kv *t, const struct shm_layout *l, uint64_t n_tokens)
{
	t->layout = *l;
	t->n_pages = (n_tokens + l->block_tokens - 1) / l->block_tokens;
	t->pages = xcalloc(t->n_pages, sizeof(void *));
	for (uint64_t i = 0; i < t->n_pages; i++) {
		if (posix_memalign(&t->pages[i], SHM_PAGE_ALIGN, shm_page_bytes(l)))
			die("allocation", ENOMEM);
		memset(t->pages[i], 0, shm_page_bytes(l));
	}
}

static void table_clear(struct stories_kv *t)
{
	for (uint64_t i = 0; i < t->n_pages; i++)
		memset(t->pages[i], 0, shm_page_bytes(&t->layout));
}

static void table_free(struct stories_kv *t)
{
	for (uint64_t i = 0; i < t->n_pages; i++)
		free(t->pages[i]);
	free(t->pages);
}

struct acc {
	double nll;
	uint64_t agree, n;
};

struct bench {
	struct stories *m;
	uint32_t V, P, C;
	kvp_client *c;
	kvp_pool *pools[N_STORE];
	struct shm_layout ls[N_STORE];
	struct stories_kv dense;	 /* f16, the whole sequence */
	struct stories_kv conv[N_STORE]; /* the prefix in each format */
	struct stories_kv work[N_STORE]; /* kept tokens + continuation */
	uint32_t *tok;			 /* [P + C + 1] */
	float *score;			 /* [P]: H2O */
	float *mass;			 /* [P + C] */
	float *dense_logits;		 /* [C][V] */
	uint32_t *dense_top;		 /* [C] */
	float *logits;			 /* [V] */
	uint32_t *pos;			 /* [P] */
	uint8_t *mark;			 /* [P] */
	uint64_t rng;
	struct acc dense_acc, pol[N_POL][N_PCT], store[N_STORE], mixed[N_MIXED];
	struct acc ld[N_LD][N_LD_PCT];
	uint32_t ld_s[N_LD_PCT]; /* summary tokens at each long-document budget */
	uint32_t *order;	 /* [P]: prefix positions by score */
	int verify_exact;	 /* this configuration must equal the dense run */
};

/* Writes the sequence and its dense reference. */
static void dense_run(struct bench *b, uint64_t *rng)
{
	uint32_t n = b->P + b->C + 1;
	int ret;

	table_clear(&b->dense);
	memset(b->score, 0, b->P * sizeof(float));
	b->tok[0] = STORIES_BOS;
	for (uint32_t i = 0; i + 1 < n; i++) {
		int in_prefix = i < b->P;

		if (in_prefix)
			memset(b->mass, 0, (i + 1) * sizeof(float));
		ret = stories_step(b->m, &b->dense, i, i, b->tok[i], b->logits,
				   in_prefix ? b->mass : NULL);
		if (ret < 0)
			die("stories_step", ret);
		if (in_prefix) {
			float f = expf(-DECAY);

			for (uint32_t t = 0; t <= i; t++)
				b->score[t] = b->score[t] * f + b->mass[t];
		}
		b->tok[i + 1] = stories_sample(b->m, b->logits, rng);
		if (i >= b->P) {
			uint32_t j = i - b->P;

			memcpy(b->dense_logits + (size_t)j * b->V, b->logits, b->V * sizeof(float));
			b->dense_top[j] = stories_argmax(b->m, b->logits);
			b->dense_acc.nll += stories_nll(b->m, b->logits, b->tok[i + 1]);
			b->dense_acc.agree++;
			b->dense_acc.n++;
		}
	}
}

/* The continuation over the k tokens already in slots 0..k-1 of t. */
static void continuation(struct bench *b, struct stories_kv *t, uint64_t k, struct acc *a)
{
	for (uint32_t j = 0; j < b->C; j++) {
		int ret = stories_step(b->m, t, k + j, b->P + j, b->tok[b->P + j], b->logits, NULL);

		if (ret < 0)
			die("stories_step", ret);
		if (b->verify_exact &&
		    memcmp(b->logits, b->dense_logits + (size_t)j * b->V, b->V * sizeof(float))) {
			fprintf(stderr, "kvp-bench-quality: f16 at the full budget through the "
					"daemon differs from the dense run\n");
			exit(1);
		}
		a->nll += stories_nll(b->m, b->logits, b->tok[b->P + j + 1]);
		a->agree += stories_argmax(b->m, b->logits) == b->dense_top[j];
		a->n++;
	}
}

/* Summary token c of the chunk [c0, c1) of the prefix into the session's
 * slot at: for every layer, K and V and head, the mean of the chunk's
 * rows (SUM_MEAN), their mean weighted by H2O score (SUM_WMEAN), or the
 * row of its token with the highest score (SUM_TOP). From the dense f16
 * pages: K rotated to each token's own position. */
static void summary_token(struct bench *b, kvp_session *s, uint64_t at, uint32_t c0, uint32_t c1,
			  int mode)
{
	const struct shm_layout *l = &b->ls[0];
	uint32_t hd = l->head_dim, top = c0;
	double wsum = 0;
	float acc[64];

	for (uint32_t t = c0; t < c1; t++) {
		if (b->score[t] > b->score[top])
			top = t;
		wsum += mode == SUM_WMEAN ? b->score[t] : 1.0;
	}
	if (hd > 64 || !(wsum > 0))
		die("summary token", EINVAL);
	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++) {
				uint16_t *dst = kvp_session_kv(s, at, layer, kv, h);

				if (!dst)
					die("kvp_session_kv (summary)", EFAULT);
				memset(acc, 0, sizeof(acc));
				for (uint32_t t = c0; t < c1; t++) {
					const uint16_t *row =
						(const uint16_t *)((const char *)
									   b->dense.pages[t / BT] +
								   shm_kv_offset(l, layer, kv, h,
										 t % BT));
					double w = mode == SUM_TOP     ? t == top
						   : mode == SUM_WMEAN ? b->score[t]
								       : 1.0;

					if (mode == SUM_TOP)
						wsum = 1.0;
					for (uint32_t d = 0; d < hd; d++)
						acc[d] += (float)(w / wsum) * kn_f16_to_f32(row[d]);
				}
				for (uint32_t d = 0; d < hd; d++)
					dst[d] = kn_f32_to_f16(acc[d]);
			}
}

/* The prefix in format si through a session of the daemon, under pol
 * (NULL: exact), with a summary span (sum_mode not SUM_NONE: one token per
 * LD_CHUNK tokens of the prefix's [sum_first, sum_end), appended after it
 * tagged KVP_TAG_SUMMARY); the kept tokens into b->work[si]; returns how
 * many. */
static uint64_t through_daemon_sum(struct bench *b, unsigned si, const struct kvp_policy *pol,
				   int perm_sinks, int sum_mode, uint32_t sum_first,
				   uint32_t sum_end)
{
	const struct shm_layout *l = &b->ls[si];
	size_t page_bytes = shm_page_bytes(l);
	uint32_t n_pages = b->P / BT;
	const void **src = xcalloc(n_pages, sizeof(void *));
	kvp_session *s;
	uint64_t k, dropped = 0, n_sum = 0;
	int ret;

	ret = kvp_session_create(b->pools[si], &s);
	if (ret < 0)
		die("kvp_session_create", ret);
	ret = kvp_append(s, b->tok, b->P);
	if (ret < 0)
		die("kvp_append", ret);
	for (uint32_t i = 0; i < n_pages; i++) {
		void *dst = kvp_session_kv(s, (uint64_t)i * BT, 0, 0, 0);

		if (!dst)
			die("kvp_session_kv", EFAULT);
		memcpy(dst, b->conv[si].pages[i], page_bytes);
	}
	ret = kvp_commit(s, b->P);
	if (ret < 0)
		die("kvp_commit", ret);
	if (sum_mode != SUM_NONE) {
		uint32_t c = 0;

		n_sum = (sum_end - sum_first + LD_CHUNK - 1) / LD_CHUNK;
		ret = kvp_append_tagged(s, b->tok + sum_first, n_sum, KVP_ROLE_NONE, 0,
					KVP_TAG_SUMMARY);
		if (ret < 0)
			die("kvp_append_tagged (summary)", ret);
		for (uint32_t c0 = sum_first; c0 < sum_end; c0 += LD_CHUNK, c++)
			summary_token(b, s, b->P + c, c0,
				      c0 + LD_CHUNK < sum_end ? c0 + LD_CHUNK : sum_end, sum_mode);
		ret = kvp_commit(s, n_sum);
		if (ret < 0)
			die("kvp_commit (summary)", ret);
	}
	if (pol) {
		if (pol->kind == KVP_POLICY_HIERARCHY) {
			for (uint32_t t0 = 0; t0 < b->P; t0 += TURN_LEN) {
				uint32_t n = b->P - t0 < TURN_LEN ? b->P - t0 : TURN_LEN;

				ret = kvp_session_tag(s, t0, n, KVP_ROLE_ASSISTANT,
						      1 + t0 / TURN_LEN, 0);
				if (ret < 0)
					die("kvp_session_tag", ret);
			}
			if (perm_sinks) {
				ret = kvp_session_tag(s, 0, N_SINKS, KVP_ROLE_ASSISTANT, 1,
						      KVP_TAG_PERMANENT);
				if (ret < 0)
					die("kvp_session_tag", ret);
			}
		}
		if (pol->kind == KVP_POLICY_IMPORTANCE || pol->kind == KVP_POLICY_HIERARCHY) {
			ret = kvp_session_report_importance(s, 0, b->score, b->P);
			if (ret < 0)
				die("kvp_session_report_importance", ret);
		}
		ret = kvp_session_set_policy(s, pol, NULL);
		if (ret < 0)
			die("kvp_session_set_policy", ret);
		ret = kvp_session_compact(s, &dropped);
		if (ret < 0)
			die("kvp_session_compact", ret);
	}
	k = kvp_session_tokens(s);
	if (k + dropped != b->P + n_sum || (pol && k != pol->budget))
		die("the compacted session's length", EPROTO);
	/* the kept tokens, read from the session's pages */
	for (uint32_t i = 0; i < (k + BT - 1) / BT; i++) {
		src[i] = kvp_session_kv(s, (uint64_t)i * BT, 0, 0, 0);
		if (!src[i])
			die("kvp_session_kv after compaction", EFAULT);
	}
	for (uint64_t i = 0; i < k; i++)
		b->pos[i] = (uint32_t)i;
	table_clear(&b->work[si]);
	ret = kref_gather_tokens(l, b->work[si].pages, 0, src, k, b->pos, k);
	if (ret < 0)
		die("kref_gather_tokens", ret);
	/* the kept tokens' original positions: ascending, inside the prefix,
	 * and then every summary token, tagged so */
	if (pol) {
		struct kvp_token_info *info = xcalloc(k, sizeof(*info));

		ret = kvp_session_meta(s, 0, k, info);
		if (ret < 0)
			die("kvp_session_meta", ret);
		for (uint64_t i = 0; i < k; i++) {
			int is_sum = i >= k - n_sum;

			if ((!is_sum && info[i].pos >= b->P) ||
			    (is_sum && (info[i].pos != b->P + (i - (k - n_sum)) ||
					!(info[i].flags & KVP_TAG_SUMMARY))) ||
			    (i && info[i].pos <= info[i - 1].pos))
				die("the kept tokens' positions or the summary", EPROTO);
		}
		free(info);
	}
	kvp_session_close(s);
	free(src);
	return k;
}

static uint64_t through_daemon(struct bench *b, unsigned si, const struct kvp_policy *pol,
			       int perm_sinks)
{
	return through_daemon_sum(b, si, pol, perm_sinks, SUM_NONE, 0, 0);
}

/* Random: B positions of the prefix, uniformly, gathered here. */
static uint64_t random_keep(struct bench *b, uint32_t budget)
{
	const struct shm_layout *l = &b->ls[0];
	uint32_t got = 0;
	int ret;

	memset(b->mark, 0, b->P);
	while (got < budget) {
		uint32_t i = (uint32_t)(rng_next(&b->rng) % b->P);

		if (!b->mark[i]) {
			b->mark[i] = 1;
			got++;
		}
	}
	got = 0;
	for (uint32_t i = 0; i < b->P; i++)
		if (b->mark[i])
			b->pos[got++] = i;
	table_clear(&b->work[0]);
	ret = kref_gather_tokens(l, b->work[0].pages, 0, (const void *const *)b->dense.pages, b->P,
				 b->pos, got);
	if (ret < 0)
		die("kref_gather_tokens", ret);
	return got;
}

static const float *sort_scores;

static int by_score(const void *a, const void *b)
{
	float x = sort_scores[*(const uint32_t *)a], y = sort_scores[*(const uint32_t *)b];

	if (x != y)
		return x < y ? 1 : -1;
	return *(const uint32_t *)a < *(const uint32_t *)b ? 1 : -1; /* newer first */
}

/* Mixed precision, emulated here (a pool has one format): the prefix
 * quantized as format si and back to f16, then the sinks and EXACT_PCT %
 * of the prefix restored exact from the f16 pages: the tokens with the
 * highest H2O scores (MIX_SCORE; 25 % with MIX_SCORE25) or the most recent
 * (MIX_RECENT); MIX_NONE restores nothing, the control (the store rows
 * quantize the continuation too, these do not). The continuation's own
 * K/V stay f16 (recent tokens exact, as KIVI keeps them). */
static void mixed(struct bench *b, unsigned si, int mode, struct acc *a)
{
	const struct shm_layout *l = &b->ls[0];
	uint32_t n_exact = b->P * (mode == MIX_SCORE25 ? 25 : EXACT_PCT) / 100, got = 0;
	int by_recency = mode == MIX_RECENT;
	int ret;

	table_clear(&b->work[0]);
	ret = kref_convert_pages(l, b->work[0].pages, &b->ls[si],
				 (const void *const *)b->conv[si].pages, b->P / BT, 0, BT);
	if (ret < 0)
		die("kref_convert_pages", ret);
	for (uint32_t i = 0; i < b->P; i++)
		b->order[i] = i;
	if (!by_recency) {
		sort_scores = b->score;
		qsort(b->order, b->P, sizeof(uint32_t), by_score);
	} else {
		for (uint32_t i = 0; i < b->P; i++)
			b->order[i] = b->P - 1 - i;
	}
	for (uint32_t t = 0; t < N_SINKS && mode != MIX_NONE; t++)
		b->pos[got++] = t;
	for (uint32_t i = 0; i < b->P && mode != MIX_NONE && got < N_SINKS + n_exact; i++)
		if (b->order[i] >= N_SINKS)
			b->pos[got++] = b->order[i];
	for (uint32_t i = 0; i < got; i++) {
		ret = kref_gather_tokens(l, b->work[0].pages, b->pos[i],
					 (const void *const *)b->dense.pages, b->P, &b->pos[i], 1);
		if (ret < 0)
			die("kref_gather_tokens", ret);
	}
	continuation(b, &b->work[0], b->P, a);
}

static void policy_for(struct kvp_policy *pol, unsigned p, uint32_t budget)
{
	static const uint32_t kinds[] = {KVP_POLICY_WINDOW, KVP_POLICY_SINKS, KVP_POLICY_IMPORTANCE,
					 KVP_POLICY_HIERARCHY, KVP_POLICY_HIERARCHY};

	kvp_policy_init(pol, kinds[p], budget);
	pol->sinks = N_SINKS;
	pol->decay = DECAY;
	pol->recent = opt_recent ? opt_recent : budget * RECENT_PCT / 100;
	if (pol->recent + pol->sinks > budget)
		pol->recent = budget > pol->sinks ? budget - pol->sinks : 0;
}

/* Long documents at budget ld_pcts[li] of the prefix (B tokens): sinks +
 * window drops the middle of the prefix, [N_SINKS, P - B + N_SINKS); a
 * summary span of S tokens, one per LD_CHUNK dropped tokens, is attached
 * to the session and kept by the daemon beside the same sinks and window
 * (budget B + S), against the same B + S tokens spent on a longer window
 * or on importance. */
static void long_document(struct bench *b, unsigned li)
{
	uint32_t B = (b->P * ld_pcts[li] + 50) / 100;
	uint32_t d0 = N_SINKS, d1 = b->P - (B - N_SINKS);
	uint32_t S = (d1 - d0 + LD_CHUNK - 1) / LD_CHUNK;
	struct kvp_policy pol;
	uint64_t k;

	b->ld_s[li] = S;
	for (unsigned x = 1; x < N_LD; x++) {
		if (x == 5) {
			policy_for(&pol, 2, B + S);
		} else {
			kvp_policy_init(&pol, KVP_POLICY_SINKS, B + S);
			pol.sinks = N_SINKS;
			pol.decay = DECAY;
		}
		k = through_daemon_sum(b, 0, &pol, 0, x <= 3 ? (int)x : SUM_NONE, d0, d1);
		continuation(b, &b->work[0], k, &b->ld[x][li]);
	}
}

static double ppl(const struct acc *a)
{
	return exp(a->nll / (double)(a->n ? a->n : 1));
}

static double agree(const struct acc *a)
{
	return 100.0 * (double)a->agree / (double)(a->n ? a->n : 1);
}

static void usage(void)
{
	fputs("usage: kvp-bench-quality --socket PATH [--seqs N (200)] [--prefix P (384)] "
	      "[--cont C (32)] [--seed S (1)] [--model FILE]\n"
	      "       [--recent N (0: half the budget; importance's recent window)]\n",
	      stderr);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 'S'},
		{"seqs", required_argument, NULL, 'n'},
		{"prefix", required_argument, NULL, 'p'},
		{"cont", required_argument, NULL, 'c'},
		{"seed", required_argument, NULL, 's'},
		{"model", required_argument, NULL, 'm'},
		{"recent", required_argument, NULL, 'r'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}, /* one per line */
	};
	const char *sock = NULL, *model = "models/stories260K/stories260K.bin";
	uint64_t n_seqs = 200, seed = 1, gen_rng;
	struct bench b = {0};
	int opt, ret;

	b.P = 384;
	b.C = 32;
	while ((opt = getopt_long(argc, argv, "S:n:p:c:s:m:r:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'S':
			sock = optarg;
			break;
		case 'n':
			n_seqs = strtoull(optarg, NULL, 10);
			break;
		case 'p':
			b.P = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 'c':
			b.C = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		case 's':
			seed = strtoull(optarg, NULL, 10);
			break;
		case 'm':
			model = optarg;
			break;
		case 'r':
			opt_recent = (uint32_t)strtoul(optarg, NULL, 10);
			break;
		default:
			usage();
			return opt == 'h' ? 0 : 2;
		}
	}
	ret = stories_load(model, &b.m);
	if (ret < 0)
		die(model, ret);
	b.V = stories_config(b.m)->vocab;
	if (!sock || n_seqs < 1 || n_seqs > 100000 || b.P < 64 || b.P % BT || b.C < 1 ||
	    b.P + b.C + 1 > stories_config(b.m)->seq_len) {
		usage();
		fprintf(stderr, "  --prefix: a multiple of %u, >= 64; prefix + cont + 1 <= %u\n",
			BT, stories_config(b.m)->seq_len);
		return 2;
	}
	ret = kvp_connect(sock, &b.c);
	if (ret < 0)
		die("kvp_connect", ret);
	for (unsigned si = 0; si < N_STORE; si++) {
		uint32_t dt = store_dtypes[si];
		uint32_t group = shm_dtype_quantized(dt) ? stories_config(b.m)->head_dim : 0;
		char name[64];

		stories_layout(b.m, dt, group, BT, &b.ls[si]);
		struct kvp_layout kl = {b.ls[si].n_layers, b.ls[si].n_kv_heads,
					b.ls[si].head_dim, b.ls[si].block_tokens,
					b.ls[si].dtype,	   b.ls[si].quant_group};

		snprintf(name, sizeof(name), "stories260K-%s", shm_dtype_name(dt));
		ret = kvp_pool_open(b.c, name, &kl, &b.pools[si]);
		if (ret < 0)
			die("kvp_pool_open", ret);
		table_new(&b.conv[si], &b.ls[si], b.P);
		table_new(&b.work[si], &b.ls[si], b.P + b.C);
	}
	table_new(&b.dense, &b.ls[0], b.P + b.C + 1);
	b.tok = xcalloc(b.P + b.C + 1, sizeof(uint32_t));
	b.score = xcalloc(b.P, sizeof(float));
	b.mass = xcalloc(b.P + b.C, sizeof(float));
	b.dense_logits = xcalloc((size_t)b.C * b.V, sizeof(float));
	b.dense_top = xcalloc(b.C, sizeof(uint32_t));
	b.logits = xcalloc(b.V, sizeof(float));
	b.pos = xcalloc(b.P, sizeof(uint32_t));
	b.mark = xcalloc(b.P, 1);
	b.order = xcalloc(b.P, sizeof(uint32_t));
	b.rng = seed * 0x9e3779b97f4a7c15ull + 7;
	gen_rng = seed;
	fprintf(stderr,
		"kvp-bench-quality: %llu sequences, prefix %u, continuation %u, seed %llu\n",
		(unsigned long long)n_seqs, b.P, b.C, (unsigned long long)seed);

	for (uint64_t q = 0; q < n_seqs; q++) {
		if (q % 20 == 0)
			fprintf(stderr, "kvp-bench-quality: sequence %llu\n",
				(unsigned long long)q);
		dense_run(&b, &gen_rng);
		/* the prefix in every format */
		for (unsigned si = 0; si < N_STORE; si++) {
			ret = kref_convert_pages(&b.ls[si], b.conv[si].pages, &b.ls[0],
						 (const void *const *)b.dense.pages, b.P / BT, 0,
						 BT);
			if (ret < 0)
				die("kref_convert_pages", ret);
		}
		/* storage, full budget */
		for (unsigned si = 0; si < N_STORE; si++) {
			uint64_t k = through_daemon(&b, si, NULL, 0);

			b.verify_exact = si == 0;
			continuation(&b, &b.work[si], k, &b.store[si]);
			b.verify_exact = 0;
		}
		for (unsigned x = 0; x < N_MIXED; x++)
			mixed(&b, x < 4 ? 3 : 2, (int)(x % 4), &b.mixed[x]);
		for (unsigned pi = 0; pi < N_PCT; pi++) {
			uint32_t budget = (b.P * pcts[pi] + 50) / 100;

			for (unsigned p = 0; p < N_POL; p++) {
				struct kvp_policy pol;
				uint64_t k;

				if (p == P_RANDOM) {
					k = random_keep(&b, budget);
				} else {
					policy_for(&pol, p, budget);
					k = through_daemon(&b, 0, &pol, p == 4);
				}
				continuation(&b, &b.work[0], k, &b.pol[p][pi]);
			}
		}
		for (unsigned li = 0; li < N_LD_PCT; li++)
			long_document(&b, li);
	}
	/* "drop" is sinks + window at the budget, measured above */
	for (unsigned li = 0; li < N_LD_PCT; li++)
		for (unsigned pi = 0; pi < N_PCT; pi++)
			if (pcts[pi] == ld_pcts[li])
				b.ld[0][li] = b.pol[1][pi];

	printf("stories260K (trained), %llu sequences it wrote (seed %llu), prefix %u tokens "
	       "compacted by the daemon, then %u continuation tokens scored;\n"
	       "dense f16: perplexity %.3f. Cells: perplexity / top-1 agreement with dense "
	       "(%%)\n",
	       (unsigned long long)n_seqs, (unsigned long long)seed, b.P, b.C, ppl(&b.dense_acc));
	printf("%-12s", "budget");
	for (unsigned pi = 0; pi < N_PCT; pi++)
		printf(" %14u%%", pcts[pi]);
	printf("\n");
	for (unsigned p = 0; p < N_POL; p++) {
		printf("%-12s", pol_names[p]);
		for (unsigned pi = 0; pi < N_PCT; pi++)
			printf("   %6.3f / %4.1f", ppl(&b.pol[p][pi]), agree(&b.pol[p][pi]));
		printf("\n");
	}
	printf("perplexity ratio to dense (1.000 = no loss)\n");
	for (unsigned p = 0; p < N_POL; p++) {
		printf("%-12s", pol_names[p]);
		for (unsigned pi = 0; pi < N_PCT; pi++)
			printf(" %15.3f", ppl(&b.pol[p][pi]) / ppl(&b.dense_acc));
		printf("\n");
	}
	printf("perplexity ratios between policies (< 1: the first is better)\n");
	{
		static const unsigned pairs[][2] = {{1, 0}, {2, 0}, {2, 1}, {3, 2}, {4, 3}, {2, 5}};

		for (unsigned r = 0; r < sizeof(pairs) / sizeof(pairs[0]); r++) {
			char name[32];

			snprintf(name, sizeof(name), "%s/%s", pol_names[pairs[r][0]],
				 pol_names[pairs[r][1]]);
			printf("%-22s", name);
			for (unsigned pi = 0; pi < N_PCT; pi++)
				printf(" %8.3f",
				       ppl(&b.pol[pairs[r][0]][pi]) / ppl(&b.pol[pairs[r][1]][pi]));
			printf("\n");
		}
	}
	printf("storage at the full budget (group %u): perplexity / agreement / ratio to f16\n",
	       b.ls[1].quant_group);
	for (unsigned si = 0; si < N_STORE; si++)
		printf("%-12s   %6.3f / %5.1f / %.4f\n", shm_dtype_name(store_dtypes[si]),
		       ppl(&b.store[si]), agree(&b.store[si]),
		       ppl(&b.store[si]) / ppl(&b.store[0]));
	printf("mixed precision (emulated: a pool has one format), the continuation's K/V f16: "
	       "nothing, or the sinks + %u %% (25 %%) of the prefix exact, the rest quantized\n",
	       EXACT_PCT);
	for (unsigned x = 0; x < N_MIXED; x++)
		printf("%-5s exact %-9s %6.3f / %5.1f / %.4f\n", x < 4 ? "int4" : "fp8",
		       mix_names[x % 4], ppl(&b.mixed[x]), agree(&b.mixed[x]),
		       ppl(&b.mixed[x]) / ppl(&b.store[0]));
	printf("long document: sinks + window at B drop the middle of the prefix; a summary "
	       "span of S tokens (one per %u dropped tokens: their K/V mean, score-weighted "
	       "mean, or the top-scored token's K/V) kept by the daemon beside them (B + S), "
	       "against B + S tokens of sinks + window or importance\n",
	       LD_CHUNK);
	printf("%-12s", "budget");
	for (unsigned li = 0; li < N_LD_PCT; li++)
		printf("  %3u%% (B %3u, S %2u)", ld_pcts[li], (b.P * ld_pcts[li] + 50) / 100,
		       b.ld_s[li]);
	printf("\n");
	for (unsigned x = 0; x < N_LD; x++) {
		printf("%-12s", ld_names[x]);
		for (unsigned li = 0; li < N_LD_PCT; li++)
			printf("     %8.3f / %4.1f", ppl(&b.ld[x][li]), agree(&b.ld[x][li]));
		printf("\n");
	}
	printf("sample quality.ppl_dense %.6g\n", ppl(&b.dense_acc));
	for (unsigned x = 0; x < N_LD; x++)
		for (unsigned li = 0; li < N_LD_PCT; li++) {
			printf("sample quality.ppl_ld_%s_%u %.6g\n", ld_keys[x], ld_pcts[li],
			       ppl(&b.ld[x][li]));
			printf("sample quality.top1_ld_%s_%u %.6g\n", ld_keys[x], ld_pcts[li],
			       agree(&b.ld[x][li]));
		}
	for (unsigned x = 0; x < N_MIXED; x++) {
		printf("sample quality.ppl_mixed_%s_%s %.6g\n", x < 4 ? "int4" : "fp8",
		       mix_keys[x % 4], ppl(&b.mixed[x]));
		printf("sample quality.top1_mixed_%s_%s %.6g\n", x < 4 ? "int4" : "fp8",
		       mix_keys[x % 4], agree(&b.mixed[x]));
	}
	for (unsigned p = 0; p < N_POL; p++)
		for (unsigned pi = 0; pi < N_PCT; pi++) {
			printf("sample quality.ppl_%s_%u %.6g\n", pol_names[p], pcts[pi],
			       ppl(&b.pol[p][pi]));
			printf("sample quality.top1_%s_%u %.6g\n", pol_names[p], pcts[pi],
			       agree(&b.pol[p][pi]));
		}
	for (unsigned si = 0; si < N_STORE; si++) {
		printf("sample quality.ppl_%s %.6g\n", shm_dtype_name(store_dtypes[si]),
		       ppl(&b.store[si]));
		printf("sample quality.top1_%s %.6g\n", shm_dtype_name(store_dtypes[si]),
		       agree(&b.store[si]));
	}
	fflush(stdout);

	for (unsigned si = 0; si < N_STORE; si++) {
		table_free(&b.conv[si]);
		table_free(&b.work[si]);
		kvp_pool_close(b.pools[si]);
	}
	table_free(&b.dense);
	kvp_disconnect(b.c);
	free(b.tok);
	free(b.score);
	free(b.mass);
	free(b.dense_logits);
	free(b.dense_top);
	free(b.logits);
	free(b.pos);
	free(b.mark);
	free(b.order);
	stories_free(b.m);
	return 0;
}
