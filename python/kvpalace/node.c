/* python/kvpalace/node.c — the lifetime tree of Clients, Pools, Sessions
 * and Leases (see kvpy.h): closing a subtree, freeing C handles once
 * nothing pins them, and kvpy_call(), the one way into libkvpalace for a
 * handle (GIL released, the client's lock held).
 *
 * Runs holding the GIL; kvpy_node_try_free and kvpy_call release it around
 * the library call, so other threads may run (and close or drop nodes)
 * meanwhile: pins and the freed flag keep each handle from being freed
 * twice or under a running call.
 */
#include "kvpy.h"

volatile unsigned int kvpy_fork_gen;

int kvpy_lock(struct kvpy_client *cl)
{
	if (cl->fork_gen != kvpy_fork_gen)
		return 0;
	PyThread_acquire_lock(cl->lock, WAIT_LOCK);
	return 1;
}

void kvpy_unlock(struct kvpy_client *cl, int locked)
{
	if (locked)
		PyThread_release_lock(cl->lock);
}

void kvpy_node_link(struct kvpy_node *n, struct kvpy_node *parent, enum kvpy_kind kind)
{
	n->kind = kind;
	n->parent = parent;
	n->child = n->next = n->prev = NULL;
	n->closed = n->freed = 0;
	n->pins = n->exports = 0;
	if (parent) {
		Py_INCREF(parent);
		n->client = parent->client;
		n->next = parent->child;
		if (parent->child)
			parent->child->prev = n;
		parent->child = n;
		parent->pins++;
	} else {
		n->client = (struct kvpy_client *)n;
	}
}

struct free_arg {
	enum kvpy_kind kind;
	void *h;
};

static int free_handle(void *a)
{
	struct free_arg *f = a;

	switch (f->kind) {
	case KVPY_CLIENT:
		kvp_disconnect(f->h);
		return 0;
	case KVPY_POOL:
		kvp_pool_close(f->h);
		return 0;
	case KVPY_SESSION:
		return kvp_session_close(f->h);
	case KVPY_LEASE:
		return kvp_lease_release(f->h);
	}
	return 0;
}

static void **handle_of(struct kvpy_node *n)
{
	switch (n->kind) {
	case KVPY_CLIENT:
		return (void **)&((struct kvpy_client *)n)->c;
	case KVPY_POOL:
		return (void **)&((struct kvpy_pool *)n)->p;
	case KVPY_SESSION:
		return (void **)&((struct kvpy_session *)n)->s;
	case KVPY_LEASE:
		return (void **)&((struct kvpy_lease *)n)->l;
	}
	return NULL;
}

void kvpy_node_try_free(struct kvpy_node *n)
{
	struct kvpy_node *parent;
	struct kvpy_client *cl = n->client;
	struct free_arg f;
	PyThreadState *ts;
	int locked;
	void **h;

	if (!n->closed || n->freed || n->pins > 0)
		return;
	n->freed = 1;
	h = handle_of(n);
	f.kind = n->kind;
	f.h = *h;
	*h = NULL;
	if (f.h) {
		/* The error of a close (the connection is gone, a forked child)
		 * is of no use to anyone: the handle is freed either way. */
		ts = PyEval_SaveThread();
		locked = kvpy_lock(cl);
		free_handle(&f);
		kvpy_unlock(cl, locked);
		PyEval_RestoreThread(ts);
	}
	if (n->kind == KVPY_CLIENT)
		kvpy_async_forget(cl);
	if (n->kind == KVPY_POOL && ((struct kvpy_pool *)n)->life) {
		((struct kvpy_pool *)n)->life->freed = 1;
		kvpy_pool_life_put(((struct kvpy_pool *)n)->life);
		((struct kvpy_pool *)n)->life = NULL;
	}
	parent = n->parent;
	if (parent) {
		parent->pins--;
		kvpy_node_try_free(parent);
	}
}

void kvpy_node_unpin(struct kvpy_node *n)
{
	n->pins--;
	kvpy_node_try_free(n);
}

static void mark_closed(struct kvpy_node *n)
{
	n->closed = 1;
	for (struct kvpy_node *c = n->child; c; c = c->next)
		mark_closed(c);
}

/* Frees the subtree's handles bottom up. The child list can change while a
 * free has the GIL released, so the children are held in an array first. */
static void sweep(struct kvpy_node *n)
{
	Py_ssize_t k = 0, nk = 0;
	struct kvpy_node **kids;

	for (struct kvpy_node *c = n->child; c; c = c->next)
		nk++;
	kids = nk ? PyMem_Malloc(nk * sizeof(*kids)) : NULL;
	if (kids) {
		for (struct kvpy_node *c = n->child; c && k < nk; c = c->next) {
			Py_INCREF(c);
			kids[k++] = c;
		}
		for (Py_ssize_t i = 0; i < k; i++)
			sweep(kids[i]);
		for (Py_ssize_t i = 0; i < k; i++)
			Py_DECREF(kids[i]);
		PyMem_Free(kids);
	}
	kvpy_node_try_free(n);
}

void kvpy_node_close(struct kvpy_node *n)
{
	if (n->closed && n->freed)
		return;
	Py_INCREF(n);
	mark_closed(n);
	sweep(n);
	Py_DECREF(n);
}

void kvpy_node_dealloc(PyObject *o)
{
	struct kvpy_node *n = (struct kvpy_node *)o;
	struct kvpy_node *parent = n->parent;

	if (n->weakrefs)
		PyObject_ClearWeakRefs(o);
	/* Nothing can pin a node nobody references: children, pages and
	 * running calls all hold a reference. */
	n->closed = 1;
	n->pins = 0;
	kvpy_node_try_free(n);
	if (parent) {
		if (n->prev)
			n->prev->next = n->next;
		else
			parent->child = n->next;
		if (n->next)
			n->next->prev = n->prev;
	}
	if (n->kind == KVPY_CLIENT && ((struct kvpy_client *)n)->lock)
		PyThread_free_lock(((struct kvpy_client *)n)->lock);
	Py_TYPE(o)->tp_free(o);
	Py_XDECREF(parent);
}

int kvpy_node_check(struct kvpy_node *n)
{
	static const char *const what[] = {"client", "pool", "session", "lease"};

	if (!n->closed)
		return 0;
	PyErr_Format(PyExc_ValueError, "the %s is closed", what[n->kind]);
	return -1;
}

int kvpy_call(struct kvpy_node *n, int (*fn)(void *arg), void *arg, char *msg, size_t msg_n)
{
	struct kvpy_client *cl = n->client;
	PyThreadState *ts;
	int locked, ret;

	Py_INCREF(n);
	n->pins++;
	ts = PyEval_SaveThread();
	locked = kvpy_lock(cl);
	ret = fn(arg);
	if (ret < 0 && msg)
		snprintf(msg, msg_n, "%s", kvp_strerror(cl->c, ret));
	kvpy_unlock(cl, locked);
	PyEval_RestoreThread(ts);
	kvpy_node_unpin(n);
	Py_DECREF(n);
	return ret;
}

int kvpy_call_raise(struct kvpy_node *n, int (*fn)(void *arg), void *arg)
{
	char msg[256];
	int ret = kvpy_call(n, fn, arg, msg, sizeof(msg));

	if (ret < 0)
		kvpy_raise(ret, msg);
	return ret;
}

int kvpy_call_local_raise(struct kvpy_node *n, int (*fn)(void *arg), void *arg)
{
	int ret = kvpy_call(n, fn, arg, NULL, 0);

	if (ret < 0)
		kvpy_raise(ret, NULL);
	return ret;
}

PyObject *kvpy_node_enter(PyObject *self, PyObject *unused)
{
	if (kvpy_node_check((struct kvpy_node *)self) < 0)
		return NULL;
	Py_INCREF(self);
	return self;
}

PyObject *kvpy_node_exit(PyObject *self, PyObject *args)
{
	kvpy_node_close((struct kvpy_node *)self);
	Py_RETURN_FALSE;
}

PyObject *kvpy_node_close_meth(PyObject *self, PyObject *unused)
{
	kvpy_node_close((struct kvpy_node *)self);
	Py_RETURN_NONE;
}

PyObject *kvpy_node_closed_get(PyObject *self, void *unused)
{
	return PyBool_FromLong(((struct kvpy_node *)self)->closed);
}
