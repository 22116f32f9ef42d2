/* bench/trace_mooncake.c — reads the public Mooncake trace format into a
 * struct trace (trace_gen.h, trace_read_mooncake), so kvp-bench-trace can
 * replay and simulate real traces anyone has.
 *
 * The format: one JSON object a line, {"timestamp": MS, "input_length":
 * N, "output_length": M, "hash_ids": [h0, h1, ...]}, a hash id per block
 * of 512 prompt tokens (the last block may be partial); equal ids are
 * equal blocks, a prefix of ids a shared prefix. Each line becomes a
 * conversation of its own: block j of the prompt is block_tokens tokens
 * trace_token(seed 0, 2^40 + hash id, j-th token of the block), so equal
 * hash ids give equal pages and, through the page chain, equal prefixes;
 * the prompt's length is scaled by block_tokens / 512 (at most the
 * blocks it names, at least one token), the reply's too (at least one
 * token, ids of the conversation's own stream). Lines that are blank are
 * skipped; anything else malformed is -EBADMSG with its line number.
 * Single-threaded; reads only the FILE given.
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "trace_gen.h"

#define MOONCAKE_BLOCK	   512u
#define MOONCAKE_MAX_LINE  (1u << 22)
#define MOONCAKE_MAX_BLOCK (1u << 16) /* hash ids a request, 32 M tokens */

static uint32_t scale(uint64_t n, uint32_t block_tokens)
{
	return (uint32_t)((n * block_tokens + MOONCAKE_BLOCK - 1) / MOONCAKE_BLOCK);
}

/* Parses one line into conversation t->n_convs and request t->n_reqs
 * (both have room). Returns 0, 1 for a blank line, -EBADMSG, -ENOMEM. */
static int read_line(struct trace *t, const char *line, uint32_t block_tokens)
{
	json_t *j = json_loads(line, JSON_REJECT_DUPLICATES, NULL), *ids, *in, *out, *ts;
	struct trace_conv *c = &t->convs[t->n_convs];
	uint32_t n_ids, prompt, reply, n;
	int ret = -EBADMSG;

	if (!j) {
		for (const char *p = line; *p; p++)
			if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
				return -EBADMSG;
		return 1;
	}
	ids = json_object_get(j, "hash_ids");
	in = json_object_get(j, "input_length");
	out = json_object_get(j, "output_length");
	ts = json_object_get(j, "timestamp");
	if (!json_is_array(ids) || !json_is_integer(in) || !json_is_integer(out) ||
	    json_integer_value(in) < 1 || json_integer_value(out) < 0)
		goto out;
	n_ids = (uint32_t)json_array_size(ids);
	if (!n_ids || n_ids > MOONCAKE_MAX_BLOCK)
		goto out;
	prompt = scale((uint64_t)json_integer_value(in), block_tokens);
	if (prompt > n_ids * block_tokens)
		prompt = n_ids * block_tokens;
	reply = scale((uint64_t)json_integer_value(out), block_tokens);
	if (!reply)
		reply = 1;
	n = prompt + reply; /* the prompt's blocks, then the reply */
	c->tokens = malloc((size_t)n * sizeof(uint32_t));
	if (!c->tokens) {
		ret = -ENOMEM;
		goto out;
	}
	for (uint32_t b = 0; b * block_tokens < prompt; b++) {
		json_t *h = json_array_get(ids, b);

		if (!json_is_integer(h) || json_integer_value(h) < 0) {
			free(c->tokens);
			c->tokens = NULL;
			goto out;
		}
		for (uint32_t i = 0; i < block_tokens && b * block_tokens + i < prompt; i++)
			c->tokens[b * block_tokens + i] =
				trace_token(0, (1ull << 40) + (uint64_t)json_integer_value(h), i);
	}
	for (uint32_t i = prompt; i < n; i++)
		c->tokens[i] = trace_token(0, 0x100000000ull + t->n_convs, i);
	c->user = t->n_convs;
	c->system = 0;
	c->n_tokens = n;
	t->reqs[t->n_reqs] = (struct trace_req){
		.t_s = json_is_number(ts) ? json_number_value(ts) / 1000.0 : t->n_reqs,
		.user = c->user,
		.conv = t->n_convs,
		.gap = TRACE_GAP_FIRST,
		.prompt_tokens = prompt,
		.reply_tokens = reply,
	};
	t->n_convs++;
	t->n_reqs++;
	ret = 0;
out:
	json_decref(j);
	return ret;
}

int trace_read_mooncake(FILE *f, uint32_t block_tokens, struct trace *ret, uint32_t *ret_line)
{
	struct trace t = {0};
	uint32_t cap = 0, line_no = 0;
	char *line = NULL;
	size_t line_cap = 0;
	ssize_t len;
	int err = 0;

	if (!block_tokens || block_tokens > MOONCAKE_BLOCK)
		return -EINVAL;
	trace_params_shape(&t.prm, TRACE_SHAPE_PROD);
	t.prm.seed = 0;
	while ((len = getline(&line, &line_cap, f)) >= 0) {
		line_no++;
		if ((size_t)len > MOONCAKE_MAX_LINE || strlen(line) != (size_t)len) {
			err = -EBADMSG;
			break;
		}
		if (t.n_reqs == cap) {
			uint32_t nc = cap ? cap * 2 : 1024;
			void *a = realloc(t.convs, (size_t)nc * sizeof(*t.convs));
			void *b;

			if (!a) {
				err = -ENOMEM;
				break;
			}
			t.convs = a;
			b = realloc(t.reqs, (size_t)nc * sizeof(*t.reqs));
			if (!b) {
				err = -ENOMEM;
				break;
			}
			t.reqs = b;
			cap = nc;
		}
		err = read_line(&t, line, block_tokens);
		if (err < 0)
			break;
		err = 0;
	}
	free(line);
	if (!err && (ferror(f) || !t.n_reqs))
		err = -EBADMSG;
	if (err) {
		if (ret_line)
			*ret_line = line_no;
		trace_free(&t);
		return err;
	}
	t.prm.n_requests = t.n_reqs;
	t.prm.n_users = t.n_convs;
	t.prm.n_system = 0;
	*ret = t;
	return 0;
}
