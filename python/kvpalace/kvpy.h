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

struct kvpy_client {
	struct kvpy_node node;
	kvp_client *c;
	PyThread_type_lock lock;
};

struct kvpy_pool {
	struct kvpy_node node;
	kvp_pool *p;
	unsigned char salt[64]; /* the handle's salt, to restore after match(salt=) */
	size_t salt_len;
};

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

/* ---- object constructors ---- */
PyObject *kvpy_layout_new(const struct kvp_layout *l);
PyObject *kvpy_session_wrap(struct kvpy_node *pool, kvp_session *s);
PyObject *kvpy_page_new(struct kvpy_node *owner, uint64_t index, uint64_t generation, int writable,
			const struct kvp_page_view *v);
/* The layout of the pool above a session or lease node. */
const struct kvp_layout *kvpy_owner_layout(struct kvpy_node *owner);

#endif
