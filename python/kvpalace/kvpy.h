/* python/kvpalace/kvpy.h — what the files of the _kvpalace extension share:
 * the object structs, the lifetime tree and the calls into libkvpalace.
 *
 * Every Client, Pool, Session and Lease is a `struct kvpy_node`: a node in
 * a tree (a pool's parent is its client, a session's or a lease's is its
 * pool) whose children are linked into their parent while they live.
 * Closing a node (close(), leaving its with-block, its parent closing,
 * or its last reference going) marks it and its children closed at once:
 * every later use raises ValueError. The C handle is freed only when
 * nothing depends on it any more: `pins` counts its children whose C
 * handles live, the buffers exported from its pages (numpy arrays, torch
 * tensors, memoryviews) and the calls running on it in other threads.
 * So a view that outlives its lease or session keeps the pages it shows
 * mapped and pinned in the daemon until the view is gone, and no handle
 * is freed under a call that released the GIL.
 *
 * Threads: everything here runs holding the GIL, except the libkvpalace
 * calls, which run with the GIL released and the client's lock held (the
 * library wants one thread at a time per client); kvpy_call() does both.
 */
#ifndef KVPY_H
#define KVPY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include "kvpalace.h"

enum kvpy_kind {
	KVPY_CLIENT,
	KVPY_POOL,
	KVPY_SESSION,
	KVPY_LEASE,
};

struct kvpy_client;

struct kvpy_node {
	PyObject_HEAD enum kvpy_kind kind;
	struct kvpy_node *parent;	       /* strong reference; NULL for a client */
	struct kvpy_client *client;	       /* borrowed (the parent chain holds it) */
	struct kvpy_node *child, *next, *prev; /* borrowed: children unlink at dealloc */
	int closed;			       /* user-visible: any use raises ValueError */
	int freed;			       /* the C handle is gone */
	Py_ssize_t pins;		       /* live children, exported buffers, running calls */
	Py_ssize_t exports;		       /* exported buffers of this node's pages */
	PyObject *weakrefs;
};

struct kvpy_op;

struct kvpy_client {
	struct kvpy_node node;
	kvp_client *c;
	PyThread_type_lock lock;
	unsigned int fork_gen;		    /* kvpy_fork_gen when connected */
	struct kvpy_op *ops[KVP_ASYNC_MAX]; /* submitted operations (async.c) */
	uint64_t next_handle;
};

/* Bumped in a forked child (pthread_atfork): a client connected before
 * the fork is not locked there (a thread of the parent may have held the
 * lock at the fork, and no longer exists to release it); libkvpalace
 * answers -ECHILD for it. */
extern volatile unsigned int kvpy_fork_gen;
/* The client's lock, unless it was connected before a fork: then 0. */
int kvpy_lock(struct kvpy_client *cl);
void kvpy_unlock(struct kvpy_client *cl, int locked);

/* Whether a pool's C handle is still open, outliving the Pool object for
 * as long as a submitted operation's record refers to it (async.c). */
struct kvpy_pool_life {
	Py_ssize_t refs;
	int freed; /* set once kvp_pool_close has dropped the pool's operations */
};

struct kvpy_pool {
	struct kvpy_node node;
	kvp_pool *p;
	struct kvpy_pool_life *life;
};
void kvpy_pool_life_put(struct kvpy_pool_life *life);

struct kvpy_session {
	struct kvpy_node node;
	kvp_session *s;
	uint64_t generation; /* bumped by commit and truncate: older Pages are stale */
};

struct kvpy_lease {
	struct kvpy_node node;
	kvp_lease *l;
};

struct kvpy_page {
	PyObject_HEAD struct kvpy_node *owner; /* strong: a session or a lease */
	uint64_t index;
	uint64_t generation;
	int writable;
	struct kvp_layout layout; /* the pool's */
	struct kvp_page_view v;
};

struct kvpy_layout {
	PyObject_HEAD struct kvp_layout l;
};

extern PyTypeObject kvpy_client_type, kvpy_pool_type, kvpy_session_type, kvpy_lease_type,
	kvpy_page_type, kvpy_layout_type;

/* ---- module.c: errors, tokens ---- */

/* Raises kvpalace.Error (or the subclass for -err) with errno -err and msg
 * (NULL: strerror). Returns NULL. */
PyObject *kvpy_raise(int err, const char *msg);
const char *kvpy_dtype_name(uint32_t dtype);
int kvpy_dtype_parse(PyObject *o, uint32_t *ret);

/* Tokens from a uint32 buffer (no copy) or a sequence of ints. */
struct kvpy_tokens {
	const uint32_t *t;
	size_t n;
	uint32_t *owned;
	Py_buffer view;
	int has_view;
};
int kvpy_tokens_get(PyObject *o, struct kvpy_tokens *tk);
void kvpy_tokens_put(struct kvpy_tokens *tk);
/* Salt argument: None -> *ret NULL, else a bytes-like of <= 64 bytes. */
int kvpy_salt_get(PyObject *o, Py_buffer *view, int *has);

/* ---- query.c: keys and lookup batches ---- */

/* A call's keys: salt (None: the pool handle's; b"": none), extra key
 * (None or 1..64 bytes) and key spans (None or (first_token, n_tokens,
 * key) tuples), held until kvpy_keys_put. */
struct kvpy_keys {
	Py_buffer salt, extra;
	int has_salt, has_extra;
	struct kvp_key_span *spans;
	Py_buffer *span_keys;
	size_t n_spans;
};
int kvpy_keys_get(PyObject *salt, PyObject *extra, PyObject *spans, struct kvpy_keys *k);
void kvpy_keys_put(struct kvpy_keys *k);
void kvpy_keys_match_opts(const struct kvpy_keys *k, struct kvp_match_opts *o);
void kvpy_keys_query(const struct kvpy_keys *k, struct kvp_lookup_query *q);

/* Lookup queries of prompts with their salts, extra keys and key span
 * lists (sequences as long as prompts, or None), and room for the
 * results. */
struct kvpy_batch {
	Py_ssize_t n, got;
	struct kvpy_tokens *tk;
	struct kvpy_keys *keys;
	struct kvp_lookup_query *q;
	struct kvp_lookup_result *r;
};
int kvpy_batch_get(PyObject *prompts, PyObject *salts, PyObject *extras, PyObject *spans,
		   struct kvpy_batch *b);
void kvpy_batch_put(struct kvpy_batch *b);
/* [(matched_tokens, host_tokens), ...] */
PyObject *kvpy_batch_results(const struct kvpy_batch *b);

/* ---- node.c: the lifetime tree ---- */

void kvpy_node_link(struct kvpy_node *n, struct kvpy_node *parent, enum kvpy_kind kind);
/* Marks n and its subtree closed and frees what nothing pins. */
void kvpy_node_close(struct kvpy_node *n);
/* Frees n's C handle when it is closed and unpinned, then its parent's. */
void kvpy_node_try_free(struct kvpy_node *n);
void kvpy_node_unpin(struct kvpy_node *n);
void kvpy_node_dealloc(PyObject *o);
/* 0 when open, else ValueError and -1. */
int kvpy_node_check(struct kvpy_node *n);
PyObject *kvpy_node_enter(PyObject *self, PyObject *unused);
PyObject *kvpy_node_exit(PyObject *self, PyObject *args);
PyObject *kvpy_node_close_meth(PyObject *self, PyObject *unused);
PyObject *kvpy_node_closed_get(PyObject *self, void *unused);

/* A libkvpalace call: pins n, releases the GIL, takes the client's lock,
 * runs fn(arg), copies kvp_strerror on failure into msg (of msg_n bytes),
 * and undoes all of it. Returns fn's result. */
int kvpy_call(struct kvpy_node *n, int (*fn)(void *arg), void *arg, char *msg, size_t msg_n);
/* kvpy_call, raising kvpalace.Error on a negative result. */
int kvpy_call_raise(struct kvpy_node *n, int (*fn)(void *arg), void *arg);
/* The same for a call that never talks to the daemon (a page view, a copy
 * in or out of the arena): its error is explained by errno's text alone,
 * since kvp_strerror would give the daemon's message of an earlier call
 * that failed with the same code. */
int kvpy_call_local_raise(struct kvpy_node *n, int (*fn)(void *arg), void *arg);

/* ---- async.c: submitted operations ---- */
PyObject *kvpy_pool_lookup_submit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_pool_prefetch_submit(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_client_complete(PyObject *self, PyObject *args, PyObject *kw);
/* A timeout argument in seconds (None: -1, for ever; absent: 0) as poll's
 * milliseconds. Returns 0, or -1 with ValueError/TypeError set. */
int kvpy_timeout_ms(PyObject *timeout, int *ret_ms);
/* Client.subscribe_events and Client.read_events (events.c). */
PyObject *kvpy_client_subscribe_events(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_client_read_events(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_client_fileno(PyObject *self, PyObject *unused);
PyObject *kvpy_client_in_flight(PyObject *self, void *unused);
/* Frees the records of a client whose connection is gone. */
void kvpy_async_forget(struct kvpy_client *cl);

/* ---- engine.c: copies between pages and an engine's paged cache ---- */
PyObject *kvpy_session_to_engine(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_session_from_engine(PyObject *self, PyObject *args, PyObject *kw);
PyObject *kvpy_lease_to_engine(PyObject *self, PyObject *args, PyObject *kw);

/* ---- object constructors ---- */
PyObject *kvpy_layout_new(const struct kvp_layout *l);
PyObject *kvpy_session_wrap(struct kvpy_node *pool, kvp_session *s);
PyObject *kvpy_page_new(struct kvpy_node *owner, uint64_t index, uint64_t generation, int writable,
			const struct kvp_page_view *v);
/* The layout of the pool above a session or lease node. */
const struct kvp_layout *kvpy_owner_layout(struct kvpy_node *owner);

#endif
