/* python/kvpalace/client.c — kvpalace.Client: one connection to the daemon
 * (kvp_connect), with the lock that lets Python threads share it (the
 * library wants one thread at a time per client), ping, the tenant's
 * counters (kvp_stats) and open_pool. Closing it closes every pool,
 * session and lease opened through it; the connection itself ends once
 * no page view of theirs is left (see kvpy.h). */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

struct connect_arg {
	const char *path;
	kvp_client *c;
};

static int do_connect(void *a)
{
	struct connect_arg *ca = a;

	return kvp_connect(ca->path, &ca->c);
}

static PyObject *client_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"path", NULL};
	PyObject *path = Py_None, *bytes = NULL;
	struct connect_arg ca = {0};
	struct kvpy_client *o;
	PyThreadState *ts;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Client", kwlist, &path))
		return NULL;
	if (path != Py_None) {
		if (!PyUnicode_FSConverter(path, &bytes))
			return NULL;
		ca.path = PyBytes_AS_STRING(bytes);
	}
	o = (struct kvpy_client *)type->tp_alloc(type, 0);
	if (!o) {
		Py_XDECREF(bytes);
		return NULL;
	}
	kvpy_node_link(&o->node, NULL, KVPY_CLIENT);
	o->fork_gen = kvpy_fork_gen;
	o->lock = PyThread_allocate_lock();
	if (!o->lock) {
		Py_XDECREF(bytes);
		Py_DECREF(o);
		return PyErr_NoMemory();
	}
	ts = PyEval_SaveThread();
	ret = do_connect(&ca);
	PyEval_RestoreThread(ts);
	if (ret < 0) {
		char msg[512];

		snprintf(msg, sizeof(msg), "cannot connect to kvpalaced%s%s: %s",
			 ca.path ? " at " : "", ca.path ? ca.path : "", strerror(-ret));
		Py_XDECREF(bytes);
		Py_DECREF(o);
		return kvpy_raise(ret, msg);
	}
	Py_XDECREF(bytes);
	o->c = ca.c;
	return (PyObject *)o;
}

static int do_ping(void *a)
{
	return kvp_ping(a);
}

static PyObject *client_ping(PyObject *self, PyObject *unused)
{
	struct kvpy_client *o = (struct kvpy_client *)self;

	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	if (kvpy_call_raise(&o->node, do_ping, o->c) < 0)
		return NULL;
	Py_RETURN_NONE;
}

struct stats_arg {
	kvp_client *c;
	struct kvp_stats *st;
};

static int do_stats(void *a)
{
	struct stats_arg *sa = a;

	return kvp_stats(sa->c, &sa->st);
}

static PyObject *client_stats(PyObject *self, PyObject *unused)
{
	struct kvpy_client *o = (struct kvpy_client *)self;
	struct stats_arg sa = {0};
	PyObject *d;

	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	sa.c = o->c;
	if (kvpy_call_raise(&o->node, do_stats, &sa) < 0)
		return NULL;
	d = Py_BuildValue("{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsnss}", "uptime_ms",
			  (unsigned long long)sa.st->uptime_ms, "connections",
			  (unsigned long long)sa.st->connections, "requests",
			  (unsigned long long)sa.st->requests, "errors",
			  (unsigned long long)sa.st->errors, "match_hits",
			  (unsigned long long)sa.st->match_hits, "match_misses",
			  (unsigned long long)sa.st->match_misses, "matched_tokens",
			  (unsigned long long)sa.st->matched_tokens, "appended_tokens",
			  (unsigned long long)sa.st->appended_tokens, "committed_tokens",
			  (unsigned long long)sa.st->committed_tokens, "evictions",
			  (unsigned long long)sa.st->evictions, "dedup_pages",
			  (unsigned long long)sa.st->dedup_pages, "queried_tokens",
			  (unsigned long long)sa.st->queried_tokens, "queried_pages",
			  (unsigned long long)sa.st->queried_pages, "matched_pages",
			  (unsigned long long)sa.st->matched_pages, "n_pools",
			  (Py_ssize_t)sa.st->n_pools, "version", sa.st->version);
	if (d && sa.st->remote_on) {
		/* The remote tier's page counts, the caller's pools'. */
		const struct kvp_remote_stats *r = &sa.st->remote;
		PyObject *rd = Py_BuildValue("{sIsIsKsKsKsKsK}", "nodes_up", r->nodes_up,
					     "nodes_down", r->nodes_down, "pages_written",
					     (unsigned long long)r->pages_written, "write_failures",
					     (unsigned long long)r->write_failures, "fetches",
					     (unsigned long long)r->fetches, "pages_fetched",
					     (unsigned long long)r->pages_fetched, "fetch_misses",
					     (unsigned long long)r->fetch_misses);

		if (!rd || PyDict_SetItemString(d, "remote", rd) < 0)
			Py_CLEAR(d);
		Py_XDECREF(rd);
	}
	kvp_stats_free(sa.st);
	return d;
}

struct pool_open_arg {
	kvp_client *c;
	const char *model;
	struct kvp_layout layout;
	struct kvp_pool_opts opts;
	kvp_pool *p;
};

static int do_pool_open(void *a)
{
	struct pool_open_arg *pa = a;

	return kvp_pool_open_opts(pa->c, pa->model, &pa->layout, &pa->opts, &pa->p);
}

static PyObject *client_open_pool(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"model_id", "layout", "tp_rank", "tp_size", NULL};
	struct kvpy_client *o = (struct kvpy_client *)self;
	struct pool_open_arg pa = {0};
	struct kvpy_layout *layout;
	struct kvpy_pool *p;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "sO!|II:open_pool", kwlist, &pa.model,
					 &kvpy_layout_type, &layout, &pa.opts.tp_rank,
					 &pa.opts.tp_size))
		return NULL;
	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	pa.c = o->c;
	pa.layout = layout->l;
	if (kvpy_call_raise(&o->node, do_pool_open, &pa) < 0)
		return NULL;
	p = PyObject_New(struct kvpy_pool, &kvpy_pool_type);
	if (p)
		p->life = PyMem_Calloc(1, sizeof(*p->life));
	if (!p || !p->life) {
		if (p)
			PyObject_Free(p);
		kvp_pool_close(pa.p);
		return PyErr_NoMemory();
	}
	p->life->refs = 1;
	p->node.weakrefs = NULL;
	kvpy_node_link(&p->node, &o->node, KVPY_POOL);
	p->p = pa.p;
	return (PyObject *)p;
}

static PyObject *client_server_version(PyObject *self, void *unused)
{
	struct kvpy_client *o = (struct kvpy_client *)self;

	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	return PyUnicode_FromString(kvp_server_version(o->c) ? kvp_server_version(o->c) : "");
}

static PyObject *client_is_admin(PyObject *self, void *unused)
{
	struct kvpy_client *o = (struct kvpy_client *)self;

	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	return PyBool_FromLong(kvp_is_admin(o->c));
}

static PyMethodDef client_methods[] = {
	{"close", kvpy_node_close_meth, METH_NOARGS,
	 "close(): closes the connection and everything opened through it (idempotent)"},
	{"ping", client_ping, METH_NOARGS, "ping(): a round trip to the daemon"},
	{"stats", client_stats, METH_NOARGS, "stats() -> dict: the tenant's counters (kvp_stats)"},
	{"open_pool", (PyCFunction)(void (*)(void))client_open_pool, METH_VARARGS | METH_KEYWORDS,
	 "open_pool(model_id, layout, tp_rank=0, tp_size=0) -> Pool (kvp_pool_open_opts)"},
	{"fileno", kvpy_client_fileno, METH_NOARGS,
	 "fileno() -> int: the connection's socket, to poll for POLLIN while operations are "
	 "in flight (do not read, write or close it)"},
	{"complete", (PyCFunction)(void (*)(void))kvpy_client_complete,
	 METH_VARARGS | METH_KEYWORDS,
	 "complete(timeout=0.0) -> list[(handle, result)]: the submitted operations that "
	 "completed, waiting up to timeout seconds (None: until one does) while none has; "
	 "result is a lookup's list[(matched_tokens, host_tokens)], a prefetch's pages coming, "
	 "or a kvpalace.Error instance"},
	{"subscribe_events", (PyCFunction)(void (*)(void))kvpy_client_subscribe_events,
	 METH_VARARGS | METH_KEYWORDS,
	 "subscribe_events(pool_id=0) -> int: this connection now gets KV events (of pool_id, "
	 "or every pool it may see) and is for them only; the least number of the first "
	 "(kvp_events_subscribe)"},
	{"read_events", (PyCFunction)(void (*)(void))kvpy_client_read_events,
	 METH_VARARGS | METH_KEYWORDS,
	 "read_events(timeout=None) -> (list[dict], lost): the next events, waiting up to "
	 "timeout seconds (None: until some come; ([], 0) when none did); each dict has kind "
	 "('stored', 'removed', 'cleared'), seq, pool_id, tier ('host', 'disk' or None), hash "
	 "and parent (16 bytes, or None), block_tokens and tokens (a list, or None); lost: "
	 "events missed just before these (kvp_events_read)"},
	{"__enter__", kvpy_node_enter, METH_NOARGS, NULL},
	{"__exit__", kvpy_node_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef client_getset[] = {
	{"server_version", client_server_version, NULL, "the daemon's version (its Hello)", NULL},
	{"is_admin", client_is_admin, NULL, "connected on the admin socket", NULL},
	{"in_flight", kvpy_client_in_flight, NULL, "submitted operations not yet completed", NULL},
	{"closed", kvpy_node_closed_get, NULL, NULL, NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_client_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Client",
	.tp_basicsize = sizeof(struct kvpy_client),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Client(path=None): a connection to kvpalaced (kvp_connect; None: "
		  "$KVPALACE_SOCKET or the default socket)",
	.tp_new = client_tp_new,
	.tp_dealloc = kvpy_node_dealloc,
	.tp_weaklistoffset = offsetof(struct kvpy_node, weakrefs),
	.tp_methods = client_methods,
	.tp_getset = client_getset,
};
