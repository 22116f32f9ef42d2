/* bench/trace_gen.h — multi-user, multi-turn conversation traces for
 * kvp-bench-trace: generated from a seed (trace_gen.c documents the
 * distributions), written to and read from a small text format.
 *
 * A trace is a list of conversations and a list of requests in arrival
 * order. A conversation's tokens are its system prompt followed by its
 * turns (user message, assistant reply, ...); request r of conversation c
 * is the prompt conv[c].tokens[0 .. prompt_tokens) (system prompt, every
 * earlier turn, the new user message) followed by the reply
 * conv[c].tokens[prompt_tokens .. prompt_tokens + reply_tokens). Token ids
 * are a pure function of the seed, the system prompt's or conversation's
 * number and the position (trace_token), so the same prefix has the same
 * ids wherever it appears. Single-threaded; no I/O but the FILE given.
 */
#ifndef KVP_BENCH_TRACE_GEN_H
#define KVP_BENCH_TRACE_GEN_H

#include <stdint.h>
#include <stdio.h>

#define TRACE_MAX_SYSTEM 64u

/* The trace shapes trace_gen.c documents. */
enum trace_shape {
	TRACE_SHAPE_CHAT, /* users with soon/later returns, a few system prompts */
	TRACE_SHAPE_PROD, /* production-like: one shared block, most blocks one-use */
	TRACE_SHAPE_DOCS, /* long shared documents under most conversations */
	TRACE_N_SHAPES,
};

struct trace_params {
	uint64_t seed;
	uint32_t n_users;
	uint32_t n_requests;
	uint32_t n_system;	    /* shared system prompts, 1..TRACE_MAX_SYSTEM */
	uint32_t system_min_tokens; /* their lengths, uniform in [min, max] */
	uint32_t system_max_tokens;
	double zipf_s;		     /* popularity of system prompt k ∝ 1 / k^s */
	double user_mean_tokens;     /* lognormal mean of a user message */
	double user_sigma;	     /* its sigma (of the underlying normal) */
	double reply_mean_tokens;    /* lognormal mean of an assistant reply */
	double reply_sigma;	     /* its sigma */
	double p_soon;		     /* a user comes back soon with this probability... */
	double soon_mean_s;	     /* ...after an exponential gap of this mean */
	double later_mean_s;	     /* else after an exponential gap of this mean */
	double p_new_after_soon;     /* a new conversation after a short gap */
	double p_new_after_later;    /* a new conversation after a long gap */
	uint32_t max_turns;	     /* a conversation ends after this many turns */
	uint32_t max_context_tokens; /* or when the next request would not fit */
	/* TRACE_SHAPE_PROD and TRACE_SHAPE_DOCS only (the others above that
	 * they use: seed, n_requests, n_users, n_system = 1 + documents,
	 * zipf_s (documents), user_* (later turns), reply_*, max_turns,
	 * max_context_tokens): */
	uint32_t shape;		      /* enum trace_shape */
	uint32_t system_block_tokens; /* the block every request starts with */
	double p_doc;		      /* a conversation opens on a shared document */
	double doc_mean_tokens;	      /* lognormal length of a document */
	double doc_sigma;
	double first_mean_tokens; /* lognormal length of a first user message */
	double first_sigma;
	double p_continue;	/* after a turn, the conversation goes on */
	double gap_median_reqs; /* other requests before the next turn: lognormal */
	double gap_sigma;	/* of that median and this sigma */
};

/* The defaults trace_gen.c documents (TRACE_SHAPE_CHAT). */
void trace_params_default(struct trace_params *p);

/* The defaults of shape (enum trace_shape); -EINVAL for an unknown one. */
int trace_params_shape(struct trace_params *p, uint32_t shape);

/* "chat", "prod", "docs" -> enum trace_shape, or -EINVAL. */
int trace_shape_parse(const char *name);
const char *trace_shape_name(uint32_t shape);

enum trace_gap {
	TRACE_GAP_FIRST, /* the user's first request */
	TRACE_GAP_SOON,
	TRACE_GAP_LATER,
};

struct trace_conv {
	uint32_t user;
	uint32_t system;   /* index of its system prompt */
	uint32_t n_tokens; /* all its tokens, every turn */
	uint32_t *tokens;  /* [n_tokens] */
};

struct trace_req {
	double t_s; /* virtual arrival time, seconds */
	uint32_t user;
	uint32_t conv;
	uint32_t turn; /* 0 for a conversation's first request */
	uint32_t gap;  /* enum trace_gap */
	uint32_t prompt_tokens;
	uint32_t reply_tokens;
};

struct trace {
	struct trace_params prm;
	uint32_t n_system;
	uint32_t system_tokens[TRACE_MAX_SYSTEM]; /* length of each system prompt */
	uint32_t *system[TRACE_MAX_SYSTEM];	  /* [system_tokens[k]] their ids */
	uint32_t n_convs;
	struct trace_conv *convs; /* [n_convs] */
	uint32_t n_reqs;
	struct trace_req *reqs; /* [n_reqs] in arrival order */
};

/* Token i of stream `stream` under seed (a system prompt is stream k, a
 * conversation's own tokens, after its system prompt, stream
 * 0x100000000 + conv): 1000 + a 64-bit mix of the three, mod 150,000. */
uint32_t trace_token(uint64_t seed, uint64_t stream, uint64_t i);

/* Generates a trace. Returns 0, -EINVAL for parameters out of range,
 * -ENOMEM. *ret is written only on success; free it with trace_free. */
int trace_generate(const struct trace_params *prm, struct trace *ret);

/* Writes t as text (the format is documented in trace_gen.c and at the
 * top of every file written). Returns 0 or -EIO. */
int trace_write(const struct trace *t, FILE *f);

/* Reads a trace written by trace_write, regenerating its token ids from
 * the seed it records. Returns 0, -EBADMSG for a malformed file, -ENOMEM. */
int trace_read(FILE *f, struct trace *ret);

/* Reads a trace in the Mooncake format (JSON lines with input_length,
 * output_length and hash_ids, a hash id per 512-token block, as
 * FAST'25's Mooncake traces): each line is a request of a conversation
 * of its own whose tokens are block_tokens tokens per hash id (ids
 * derived from the hash id, so equal ids are equal pages, and blocks
 * shorten 512 -> block_tokens: hit ratios in blocks are unchanged),
 * then its reply (output_length scaled the same way, at least one
 * token). The result has shape TRACE_SHAPE_PROD and no system prompt
 * table (n_system 0) and cannot be written with trace_write. Returns
 * 0, -EBADMSG for a malformed line (*ret_line: its number), -EINVAL,
 * -ENOMEM. */
int trace_read_mooncake(FILE *f, uint32_t block_tokens, struct trace *ret, uint32_t *ret_line);

/* Frees what trace_generate or trace_read allocated; t may be zeroed. */
void trace_free(struct trace *t);

#endif
