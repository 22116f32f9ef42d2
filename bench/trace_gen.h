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
};

/* The defaults trace_gen.c documents. */
void trace_params_default(struct trace_params *p);

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

/* Frees what trace_generate or trace_read allocated; t may be zeroed. */
void trace_free(struct trace *t);

#endif
