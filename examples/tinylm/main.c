/* examples/tinylm/main.c — kvp-tinylm: the tiny transformer of tinylm.h as
 * a kvpalace client, and the proof that cached KV is exact.
 *
 *   kvp-tinylm write   prefill a prompt with K/V written straight into the
 *                      pages Append lends (kvp_session_kv), generate, and
 *                      commit everything: the session stays in kvpalaced.
 *   kvp-tinylm read    in another process: MatchPrefix on the prompt, map the
 *                      leased pages as the model's page table (a partial last
 *                      page is copied to a private page with
 *                      kref_gather_tokens), compute only what was not cached,
 *                      generate. --verify recomputes everything locally and
 *                      checks that every logit is bit-identical, and reports
 *                      the prefill time the cache hit saved.
 *   kvp-tinylm local   the full recompute alone, no daemon.
 *
 * Every mode prints one line per generated token with a fingerprint of its
 * logits, so the outputs of the three modes can be compared with diff.
 * Single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpalace.h"
#include "kvtable.h"
#include "tinylm.h"

static const char text[] =
	"A cache is a promise about the past: what was computed once need not be computed "
	"again, as long as nothing it depended on has changed. For a language model the "
	"expensive past is the prefill, the pass over every token of the prompt that builds "
	"the keys and values each later token attends to. System prompts, shared documents "
	"and the earlier turns of a conversation repeat from request to request, so the same "
	"keys and values are built over and over by processes that never talk to each other. "
	"Keeping them in one place, addressed by the tokens that produced them, turns that "
	"repeated work into a lookup and a few page mappings. The hard part is not storing "
	"the numbers but never handing out the wrong ones: a page must belong to exactly the "
	"prefix it claims, bit for bit, or the model quietly answers a different question. ";

static const char help[] =
	"Usage: kvp-tinylm [OPTIONS] write|read|local\n"
	"\n"
	"A tiny transformer whose KV cache lives in kvpalace pages.\n"
	"  write   prefill the prompt into a kvpalace session, generate, commit\n"
	"  read    restore the longest cached prefix of the prompt, compute the rest,\n"
	"          generate (in another process than write)\n"
	"  local   recompute everything without kvpalaced\n"
	"\n"
	"  -s, --socket PATH      kvpalaced's socket (default $KVPALACE_SOCKET or the default)\n"
	"      --seed N           weights seed (default 1)\n"
	"      --dtype T          page dtype: f16 (default), bf16, f32, int8, fp8-e4m3, int4\n"
	"      --group N          quantization group (default 32, 16 for int4)\n"
	"      --block-tokens N   tokens per page (default 16)\n"
	"  -p, --prompt TEXT      the prompt (bytes are tokens)\n"
	"  -n, --prompt-len N     a prompt of N bytes of the built-in text (default 512)\n"
	"  -g, --generate N       tokens to generate (default 16)\n"
	"      --verify           read: also recompute locally and compare every logit\n"
	"      --logits-out FILE  write the logits of each generated token (f32, raw)\n"
	"      --bench            print 'sample NAME VALUE' lines for bench/run\n"
	"  -q, --quiet            only the summary lines\n"
	"  -h, --help             show this help\n";

struct opts {
	const char *socket, *prompt, *logits_out, *mode;
	uint64_t seed, prompt_len, generate;
	uint32_t dtype, group, block_tokens;
	int verify, bench, quiet;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the decode loop, shared by every mode ------------------------------- */

struct run {
	struct tinylm *m;
	struct kvtable *t;
	/* makes position pos (token tok) writable in the table */
	int (*reserve)(struct run *r, uint64_t pos, uint32_t tok);
	void *ctx;
	uint64_t mark_pos; /* time when this position starts → mark_s */
	double mark_s, first_s;
};

/* Runs prompt positions [from, n), then generates n_gen tokens: logits of
 * generated token j in logits[j], the tokens in gen. first_s is the time the
 * first logits were ready. */
static int run_steps(struct run *r, const uint32_t *prompt, uint64_t n, uint64_t from,
		     uint64_t n_gen, float *logits, uint32_t *gen)
{
	int ret;

	for (uint64_t pos = from; pos < n; pos++) {
		if (pos == r->mark_pos)
			r->mark_s = now_s();
		ret = r->reserve(r, pos, prompt[pos]);
		if (ret == 0)
			ret = tinylm_step(r->m, &r->t->kv, pos, prompt[pos],
					  pos == n - 1 ? logits : NULL);
		if (ret < 0)
			return ret;
	}
	r->first_s = now_s();
	if (r->mark_pos >= n)
		r->mark_s = r->first_s;
	gen[0] = tinylm_argmax(logits);
	for (uint64_t j = 1; j < n_gen; j++) {
		uint64_t pos = n + j - 1;

		ret = r->reserve(r, pos, gen[j - 1]);
		if (ret == 0)
			ret = tinylm_step(r->m, &r->t->kv, pos, gen[j - 1],
					  logits + j * TINYLM_VOCAB);
		if (ret < 0)
			return ret;
		gen[j] = tinylm_argmax(logits + j * TINYLM_VOCAB);
	}
	return 0;
}

/* Private pages, allocated as positions reach them. */
static int reserve_private(struct run *r, uint64_t pos, uint32_t tok)
{
	(void)tok;
	return kvtable_ensure(r->t, pos);
}

/* The writer: positions come from Append; the page table maps the session's
 * pages; everything written before pos is committed first (the prompt in
 * one commit, then each generated token), and the table is mapped again
 * after each commit, whose dedup may move full pages. */
struct writer {
	kvp_session *s;
	uint64_t committed;
};

static int reserve_session(struct run *r, uint64_t pos, uint32_t tok)
{
	struct writer *w = r->ctx;
	const struct shm_layout *l = &r->t->kv.layout;
	uint64_t i = pos / l->block_tokens;
	uint8_t *base;
	int ret;

	if (w->committed < pos) {
		ret = kvp_commit(w->s, pos - w->committed);
		if (ret < 0)
			return ret;
		w->committed = pos;
		/* a commit may swap the pages it filled for identical indexed
		 * copies (dedup): map every page again */
		for (uint64_t j = 0; j < r->t->kv.n_pages; j++) {
			void *page = kvp_session_kv(w->s, j * l->block_tokens, 0, 0, 0);

			if (!page)
				return -EFAULT;
			if (page != r->t->kv.pages[j]) {
				ret = kvtable_set(r->t, j, page, 0);
				if (ret < 0)
					return ret;
			}
		}
	}
	if (pos >= kvp_session_tokens(w->s)) {
		ret = kvp_append(w->s, &tok, 1);
		if (ret < 0)
			return ret;
	}
	/* element 0 of (layer 0, K, head 0, slot 0) is the page's first byte */
	base = kvp_session_kv(w->s, i * l->block_tokens, 0, 0, 0);
	if (!base)
		return -EFAULT;
	/* the library and shm/layout.h must agree on every row of pos */
	for (uint32_t layer = 0; layer < l->n_layers; layer++)
		for (uint32_t kv = 0; kv < 2; kv++)
			for (uint32_t h = 0; h < l->n_kv_heads; h++)
				if ((uint8_t *)kvp_session_kv(w->s, pos, layer, kv, h) !=
				    base + shm_kv_offset(l, layer, kv, h,
							 (uint32_t)(pos % l->block_tokens)))
					return -EFAULT;
	if (i < r->t->kv.n_pages && r->t->kv.pages[i] == base)
		return 0;
	return kvtable_set(r->t, i, base, 0);
}

/* ---- output ----------------------------------------------------------------- */

static void print_steps(const struct opts *o, const float *logits, const uint32_t *gen)
{
	if (!o->quiet)
		for (uint64_t j = 0; j < o->generate; j++)
			printf("step %3" PRIu64 ": token %3u logits %016" PRIx64 "\n", j, gen[j],
			       tinylm_logits_hash(logits + j * TINYLM_VOCAB));
	printf("generated: \"");
	for (uint64_t j = 0; j < o->generate; j++)
		if (gen[j] >= 0x20 && gen[j] < 0x7f && gen[j] != '"' && gen[j] != '\\')
			putchar((int)gen[j]);
		else
			printf("\\x%02x", gen[j]);
	printf("\"\n");
}

static int write_logits(const struct opts *o, const float *logits)
{
	FILE *f;
	size_t n = o->generate * TINYLM_VOCAB;

	if (!o->logits_out)
		return 0;
	f = fopen(o->logits_out, "wb");
	if (!f || fwrite(logits, sizeof(float), n, f) != n || fclose(f) != 0) {
		fprintf(stderr, "kvp-tinylm: cannot write %s\n", o->logits_out);
		return -EIO;
	}
	return 0;
}

/* ---- modes -------------------------------------------------------------------- */

struct app {
	struct opts o;
	struct tinylm *m;
	struct shm_layout layout;
	uint32_t *prompt;
	uint64_t n;
	float *logits, *logits2;
	uint32_t *gen, *gen2;
	kvp_client *c;
	kvp_pool *p;
};

/* The full recompute with private pages: logits/gen, prefill time of the
 * first `mark` tokens in *ret_mark_s, total to first logits in
 * *ret_first_s. */
static int recompute(struct app *a, float *logits, uint32_t *gen, uint64_t mark, double *ret_mark_s,
		     double *ret_first_s)
{
	struct kvtable t;
	struct run r = {.m = a->m, .t = &t, .reserve = reserve_private, .mark_pos = mark};
	double t0 = now_s();
	int ret;

	kvtable_init(&t, &a->layout);
	ret = run_steps(&r, a->prompt, a->n, 0, a->o.generate, logits, gen);
	kvtable_free(&t);
	if (ret < 0)
		return ret;
	*ret_mark_s = r.mark_s - t0;
	*ret_first_s = r.first_s - t0;
	return 0;
}

static int mode_local(struct app *a)
{
	double mark, first;
	int ret = recompute(a, a->logits, a->gen, 0, &mark, &first);

	if (ret < 0) {
		fprintf(stderr, "kvp-tinylm: %s\n", strerror(-ret));
		return 1;
	}
	print_steps(&a->o, a->logits, a->gen);
	printf("local: prefill of %" PRIu64 " tokens and first logits in %.2f ms\n", a->n,
	       first * 1e3);
	if (a->o.bench)
		printf("sample kernel.tinylm_ttft_local_ms %.4f\n", first * 1e3);
	return write_logits(&a->o, a->logits) < 0;
}

static int connect_pool(struct app *a)
{
	char model_id[64];
	struct kvp_layout kl = {a->layout.n_layers, a->layout.n_kv_heads,
				a->layout.head_dim, a->layout.block_tokens,
				a->layout.dtype,    a->layout.quant_group};
	int ret = kvp_connect(a->o.socket, &a->c);

	if (ret < 0) {
		fprintf(stderr, "kvp-tinylm: cannot connect to kvpalaced: %s\n",
			kvp_strerror(NULL, ret));
		return ret;
	}
	snprintf(model_id, sizeof(model_id), "tinylm-v1-s%" PRIu64, a->o.seed);
	ret = kvp_pool_open(a->c, model_id, &kl, &a->p);
	if (ret < 0)
		fprintf(stderr, "kvp-tinylm: opening pool %s: %s\n", model_id,
			kvp_strerror(a->c, ret));
	return ret;
}

static int mode_write(struct app *a)
{
	struct writer w = {0};
	struct kvtable t;
	struct run r = {.m = a->m, .t = &t, .reserve = reserve_session, .ctx = &w};
	double t0;
	int ret;

	if (connect_pool(a) < 0)
		return 1;
	kvtable_init(&t, &a->layout);
	ret = kvp_session_create(a->p, &w.s);
	t0 = now_s();
	/* reserve the whole prompt in one call (the library splits it) */
	if (ret == 0)
		ret = kvp_append(w.s, a->prompt, a->n);
	if (ret == 0)
		ret = run_steps(&r, a->prompt, a->n, 0, a->o.generate, a->logits, a->gen);
	/* commit the last written position too; the session stays in the
	 * daemon after we disconnect */
	if (ret == 0 && w.committed < a->n + a->o.generate - 1)
		ret = kvp_commit(w.s, a->n + a->o.generate - 1 - w.committed);
	kvtable_free(&t);
	if (ret < 0) {
		fprintf(stderr, "kvp-tinylm: write: %s\n", kvp_strerror(a->c, ret));
		return 1;
	}
	print_steps(&a->o, a->logits, a->gen);
	printf("write: prefill of %" PRIu64 " tokens into kvpalace pages and first logits in "
	       "%.2f ms; %" PRIu64 " tokens committed (session %" PRIu64 ")\n",
	       a->n, (r.first_s - t0) * 1e3, a->n + a->o.generate - 1, kvp_session_id(w.s));
	if (a->o.bench)
		printf("sample kernel.tinylm_ttft_prefill_ms %.4f\n", (r.first_s - t0) * 1e3);
	return write_logits(&a->o, a->logits) < 0;
}

static int mode_read(struct app *a)
{
	const struct shm_layout *l = &a->layout;
	struct kvtable t;
	struct run r = {.m = a->m, .t = &t, .reserve = reserve_private};
	kvp_lease *lease = NULL;
	const void **src = NULL;
	uint64_t m = 0, partial = 0, n_pages = 0;
	double t0, t_restore, mark = 0, first = 0;
	int ret, status = 0;

	if (connect_pool(a) < 0)
		return 1;
	kvtable_init(&t, l);
	t0 = now_s();
	/* leave the last prompt token to compute: its logits are needed */
	ret = kvp_match_prefix(a->p, a->prompt, a->n - 1, &lease);
	if (ret == 0) {
		m = kvp_lease_tokens(lease);
		n_pages = (m + l->block_tokens - 1) / l->block_tokens;
		src = calloc(n_pages ? n_pages : 1, sizeof(*src));
		ret = src ? 0 : -ENOMEM;
	}
	/* page i starts with element 0 of (layer 0, K, head 0, slot 0) */
	for (uint64_t i = 0; ret == 0 && i < n_pages; i++) {
		src[i] = kvp_lease_kv(lease, i * l->block_tokens, 0, 0, 0);
		if (!src[i])
			ret = -EFAULT;
	}
	if (ret == 0) {
		ret = kvtable_restore(&t, src, m);
		if (ret >= 0) {
			partial = (uint64_t)ret;
			ret = 0;
		}
	}
	free(src);
	t_restore = now_s() - t0;
	if (ret == 0)
		ret = run_steps(&r, a->prompt, a->n, m, a->o.generate, a->logits, a->gen);
	kvtable_free(&t);
	kvp_lease_release(lease);
	if (ret < 0) {
		fprintf(stderr, "kvp-tinylm: read: %s\n", kvp_strerror(a->c, ret));
		return 1;
	}
	print_steps(&a->o, a->logits, a->gen);
	printf("read: cache hit of %" PRIu64 " of %" PRIu64 " prompt tokens (%" PRIu64
	       " pages leased, %" PRIu64 " tokens copied from a partial page) restored in "
	       "%.3f ms; first logits after %.2f ms (%" PRIu64 " tokens computed)\n",
	       m, a->n, (m + l->block_tokens - 1) / l->block_tokens, partial, t_restore * 1e3,
	       (r.first_s - t0) * 1e3, a->n - m);
	if (a->o.bench) {
		printf("sample kernel.tinylm_restore_ms %.4f\n", t_restore * 1e3);
		printf("sample kernel.tinylm_ttft_restore_ms %.4f\n", (r.first_s - t0) * 1e3);
	}
	if (a->o.verify) {
		ret = recompute(a, a->logits2, a->gen2, m, &mark, &first);
		if (ret < 0) {
			fprintf(stderr, "kvp-tinylm: recompute: %s\n", strerror(-ret));
			return 1;
		}
		if (memcmp(a->logits, a->logits2, a->o.generate * TINYLM_VOCAB * sizeof(float)) ==
			    0 &&
		    memcmp(a->gen, a->gen2, a->o.generate * sizeof(uint32_t)) == 0) {
			printf("verify: logits of all %" PRIu64 " generated tokens bit-identical "
			       "to a full recompute: yes\n",
			       a->o.generate);
		} else {
			printf("verify: logits bit-identical to a full recompute: NO\n");
			status = 1;
		}
		printf("saved: computing the %" PRIu64 " cached tokens takes %.2f ms, restoring "
		       "them took %.3f ms: %.2f ms of prefill saved (first logits %.2f ms vs "
		       "%.2f ms)\n",
		       m, mark * 1e3, t_restore * 1e3, (mark - t_restore) * 1e3,
		       (r.first_s - t0) * 1e3, first * 1e3);
	}
	if (write_logits(&a->o, a->logits) < 0)
		status = 1;
	return status;
}

/* ---- arguments -------------------------------------------------------------- */

static int parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max || s[0] == '-')
		return -1;
	*ret = v;
	return 0;
}

static int parse_dtype(const char *s, uint32_t *ret)
{
	for (uint32_t d = SHM_DTYPE_F16; d <= SHM_DTYPE_INT4; d++)
		if (strcmp(s, shm_dtype_name(d)) == 0 ||
		    (d == SHM_DTYPE_FP8_E4M3 && strcmp(s, "fp8") == 0)) {
			*ret = d;
			return 0;
		}
	return -1;
}

static int parse_args(struct opts *o, int argc, char **argv)
{
	enum { O_SEED = 256, O_DTYPE, O_GROUP, O_BT, O_VERIFY, O_LOGITS, O_BENCH };
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},
		{"seed", required_argument, NULL, O_SEED},
		{"dtype", required_argument, NULL, O_DTYPE},
		{"group", required_argument, NULL, O_GROUP},
		{"block-tokens", required_argument, NULL, O_BT},
		{"prompt", required_argument, NULL, 'p'},
		{"prompt-len", required_argument, NULL, 'n'},
		{"generate", required_argument, NULL, 'g'},
		{"verify", no_argument, NULL, O_VERIFY},
		{"logits-out", required_argument, NULL, O_LOGITS},
		{"bench", no_argument, NULL, O_BENCH},
		{"quiet", no_argument, NULL, 'q'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	uint64_t v;
	int opt;

	*o = (struct opts){.seed = 1,
			   .prompt_len = 512,
			   .generate = 16,
			   .dtype = SHM_DTYPE_F16,
			   .block_tokens = 16};
	while ((opt = getopt_long(argc, argv, "s:p:n:g:qh", opts, NULL)) != -1) {
		switch (opt) {
		case 's':
			o->socket = optarg;
			break;
		case O_SEED:
			if (parse_u64(optarg, 0, UINT64_MAX, &o->seed) < 0)
				return 2;
			break;
		case O_DTYPE:
			if (parse_dtype(optarg, &o->dtype) < 0) {
				fprintf(stderr, "kvp-tinylm: unknown dtype %s\n", optarg);
				return 2;
			}
			break;
		case O_GROUP:
			if (parse_u64(optarg, 1, SHM_MAX_HEAD_DIM, &v) < 0)
				return 2;
			o->group = (uint32_t)v;
			break;
		case O_BT:
			if (parse_u64(optarg, 1, SHM_MAX_BLOCK_TOKENS, &v) < 0)
				return 2;
			o->block_tokens = (uint32_t)v;
			break;
		case 'p':
			o->prompt = optarg;
			break;
		case 'n':
			if (parse_u64(optarg, 2, 1u << 22, &o->prompt_len) < 0)
				return 2;
			break;
		case 'g':
			if (parse_u64(optarg, 1, 1u << 20, &o->generate) < 0)
				return 2;
			break;
		case O_VERIFY:
			o->verify = 1;
			break;
		case O_LOGITS:
			o->logits_out = optarg;
			break;
		case O_BENCH:
			o->bench = 1;
			break;
		case 'q':
			o->quiet = 1;
			break;
		case 'h':
			fputs(help, stdout);
			return 0;
		default:
			return 2;
		}
	}
	if (optind + 1 != argc)
		return 2;
	o->mode = argv[optind];
	if (strcmp(o->mode, "write") && strcmp(o->mode, "read") && strcmp(o->mode, "local"))
		return 2;
	if (o->prompt && strlen(o->prompt) < 2) {
		fprintf(stderr, "kvp-tinylm: the prompt needs at least 2 bytes\n");
		return 2;
	}
	if (shm_dtype_quantized(o->dtype) && !o->group)
		o->group = o->dtype == SHM_DTYPE_INT4 ? 16 : 32;
	if (!shm_dtype_quantized(o->dtype))
		o->group = 0;
	return -1;
}

int main(int argc, char **argv)
{
	struct tinylm_config cfg;
	struct app a = {0};
	int ret;

	ret = parse_args(&a.o, argc, argv);
	if (ret >= 0) {
		if (ret == 2)
			fputs(help, stderr);
		return ret;
	}
	tinylm_default_config(&cfg, a.o.seed);
	ret = tinylm_new(&cfg, &a.m);
	if (ret < 0) {
		fprintf(stderr, "kvp-tinylm: %s\n", strerror(-ret));
		return 1;
	}
	tinylm_layout(a.m, a.o.dtype, a.o.group, a.o.block_tokens, &a.layout);
	if (shm_layout_check(&a.layout) < 0) {
		fprintf(stderr, "kvp-tinylm: --group must divide the head dimension (%u)\n",
			cfg.head_dim);
		tinylm_free(a.m);
		return 2;
	}
	a.n = a.o.prompt ? strlen(a.o.prompt) : a.o.prompt_len;
	a.prompt = malloc(a.n * sizeof(uint32_t));
	a.logits = malloc(a.o.generate * TINYLM_VOCAB * sizeof(float));
	a.logits2 = malloc(a.o.generate * TINYLM_VOCAB * sizeof(float));
	a.gen = malloc(a.o.generate * sizeof(uint32_t));
	a.gen2 = malloc(a.o.generate * sizeof(uint32_t));
	if (!a.prompt || !a.logits || !a.logits2 || !a.gen || !a.gen2) {
		fprintf(stderr, "kvp-tinylm: out of memory\n");
		ret = 1;
		goto out;
	}
	for (uint64_t i = 0; i < a.n; i++)
		a.prompt[i] =
			a.o.prompt ? (uint8_t)a.o.prompt[i] : (uint8_t)text[i % (sizeof(text) - 1)];
	if (!a.o.quiet)
		printf("tinylm: seed %" PRIu64 ", %u layers, %u query heads sharing %u KV heads "
		       "of %u, d_model %u; %s pages of %u tokens; prompt of %" PRIu64 " tokens\n",
		       a.o.seed, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
		       cfg.d_model, shm_dtype_name(a.o.dtype), a.o.block_tokens, a.n);
	if (strcmp(a.o.mode, "local") == 0)
		ret = mode_local(&a);
	else if (strcmp(a.o.mode, "write") == 0)
		ret = mode_write(&a);
	else
		ret = mode_read(&a);
out:
	kvp_disconnect(a.c);
	tinylm_free(a.m);
	free(a.prompt);
	free(a.logits);
	free(a.logits2);
	free(a.gen);
	free(a.gen2);
	return ret;
}
