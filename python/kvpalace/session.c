/* python/kvpalace/session.c — kvpalace.Session: writing K/V (kvp_append,
 * kvp_session_page, kvp_session_write), publishing it (kvp_commit),
 * rolling back (kvp_truncate) and forking (kvp_session_fork).
 *
 * The rule for views: commit() and truncate() raise BufferError while any
 * buffer of this session's pages is exported (a numpy array, a torch
 * tensor, a memoryview of a Page): a commit may swap a page it fills for an
 * identical indexed copy (dedup) and a truncate drops pages, so a view from
 * before would point at memory the session no longer owns. Drop the views
 * (del), commit, then ask page(i) again; Pages taken before a commit or a
 * truncate are stale and refuse to give views. */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

static int sess_check(struct kvpy_session *s)
{
	return kvpy_node_check(&s->node);
}

struct sess_u64_arg {
	kvp_session *s;
	int which;
	uint64_t v;
};

static int do_u64(void *a)
{
	struct sess_u64_arg *ua = a;

	ua->v = ua->which == 0	 ? kvp_session_id(ua->s)
		: ua->which == 1 ? kvp_session_tokens(ua->s)
				 : kvp_session_committed(ua->s);
	return 0;
}

static PyObject *sess_u64(PyObject *self, void *which)
{
	struct kvpy_session *s = (struct kvpy_session *)self;
	struct sess_u64_arg ua = {.which = (int)(intptr_t)which};

	if (sess_check(s) < 0)
		return NULL;
	ua.s = s->s;
	kvpy_call(&s->node, do_u64, &ua, NULL, 0);
	return PyLong_FromUnsignedLongLong(ua.v);
}

struct append_arg {
	kvp_session *s;
	const uint32_t *t;
	size_t n;
	struct kvp_append_opts o;
};

static int do_append(void *a)
{
	struct append_arg *aa = a;

	return kvp_append_opts(aa->s, aa->t, aa->n, &aa->o);
}

/* append(tokens, key_spans=None): key spans in the session's absolute
 * positions (kvp_append_opts). */
static PyObject *sess_append(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tokens", "key_spans", NULL};
	struct kvpy_session *s = (struct kvpy_session *)self;
	PyObject *tokens, *spans = Py_None;
	struct append_arg aa = {0};
	struct kvpy_tokens tk;
	struct kvpy_keys k;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:append", kwlist, &tokens, &spans))
		return NULL;
	if (sess_check(s) < 0 || kvpy_tokens_get(tokens, &tk) < 0)
		return NULL;
	if (kvpy_keys_get(NULL, NULL, spans, &k) < 0) {
		kvpy_tokens_put(&tk);
		return NULL;
	}
	aa.s = s->s;
	aa.t = tk.t;
	aa.n = tk.n;
	aa.o.size = sizeof(aa.o);
	aa.o.spans = k.spans;
	aa.o.n_spans = k.n_spans;
	ret = kvpy_call_raise(&s->node, do_append, &aa);
	kvpy_tokens_put(&tk);
	kvpy_keys_put(&k);
	if (ret < 0)
		return NULL;
	Py_RETURN_NONE;
}

struct page_arg {
	kvp_session *s;
	uint64_t i;
	struct kvp_page_view v;
};

static int do_page(void *a)
{
	struct page_arg *pa = a;

	return kvp_session_page(pa->s, pa->i, &pa->v);
}

static PyObject *sess_page(PyObject *self, PyObject *arg)
{
	struct kvpy_session *s = (struct kvpy_session *)self;
	struct page_arg pa = {0};

	if (sess_check(s) < 0)
		return NULL;
	pa.i = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	pa.s = s->s;
	if (kvpy_call_local_raise(&s->node, do_page, &pa) < 0)
		return NULL;
	return kvpy_page_new(&s->node, pa.i, s->generation, 1, &pa.v);
}

struct write_arg {
	kvp_session *s;
	uint64_t i, off;
	const void *src;
	size_t n;
};

static int do_write(void *a)
{
	struct write_arg *wa = a;

	return kvp_session_write(wa->s, wa->i, wa->off, wa->src, wa->n);
}

static PyObject *sess_write(PyObject *self, PyObject *args)
{
	struct kvpy_session *s = (struct kvpy_session *)self;
	struct write_arg wa = {0};
	unsigned long long i, off;
	Py_buffer v;
	int ret;

	if (!PyArg_ParseTuple(args, "KKy*:write", &i, &off, &v))
		return NULL;
	if (sess_check(s) < 0) {
		PyBuffer_Release(&v);
		return NULL;
	}
	wa.s = s->s;
	wa.i = i;
	wa.off = off;
	wa.src = v.buf;
	wa.n = (size_t)v.len;
	ret = kvpy_call_local_raise(&s->node, do_write, &wa);
	PyBuffer_Release(&v);
	if (ret < 0)
		return NULL;
	Py_RETURN_NONE;
}

struct commit_arg {
	kvp_session *s;
	int all;
	uint64_t n;
	int truncate;
};

static int do_commit(void *a)
{
	struct commit_arg *ca = a;

	if (ca->truncate)
		return kvp_truncate(ca->s, ca->n);
	if (ca->all)
		ca->n = kvp_session_tokens(ca->s) - kvp_session_committed(ca->s);
	return kvp_commit(ca->s, ca->n);
}

static int no_views(struct kvpy_session *s, const char *what)
{
	if (s->node.exports == 0)
		return 0;
	PyErr_Format(PyExc_BufferError,
		     "%s with %zd view(s) of this session's pages alive: a %s may move or drop "
		     "pages; delete the arrays/tensors/memoryviews first and ask page() again",
		     what, s->node.exports, what);
	return -1;
}

static PyObject *sess_commit_or_truncate(struct kvpy_session *s, PyObject *arg, int truncate)
{
	struct commit_arg ca = {.truncate = truncate};
	int ret;

	if (sess_check(s) < 0 || no_views(s, truncate ? "truncate" : "commit") < 0)
		return NULL;
	if (!arg || arg == Py_None) {
		ca.all = 1;
	} else {
		ca.n = PyLong_AsUnsignedLongLong(arg);
		if (PyErr_Occurred())
			return NULL;
	}
	ca.s = s->s;
	/* Even a failed commit may have committed some (and so moved pages). */
	s->generation++;
	ret = kvpy_call_raise(&s->node, do_commit, &ca);
	if (ret < 0)
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *sess_commit(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"n", NULL};
	PyObject *n = Py_None;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:commit", kwlist, &n))
		return NULL;
	return sess_commit_or_truncate((struct kvpy_session *)self, n, 0);
}

static PyObject *sess_truncate(PyObject *self, PyObject *n)
{
	if (n == Py_None) {
		PyErr_SetString(PyExc_TypeError, "truncate(n) needs a token count");
		return NULL;
	}
	return sess_commit_or_truncate((struct kvpy_session *)self, n, 1);
}

struct fork_arg {
	kvp_session *s;
	uint64_t n;
	kvp_session *out;
};

static int do_fork(void *a)
{
	struct fork_arg *fa = a;

	return kvp_session_fork(fa->s, fa->n, &fa->out);
}

static PyObject *sess_fork(PyObject *self, PyObject *arg)
{
	struct kvpy_session *s = (struct kvpy_session *)self;
	struct fork_arg fa = {0};

	if (sess_check(s) < 0)
		return NULL;
	fa.n = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	fa.s = s->s;
	if (kvpy_call_raise(&s->node, do_fork, &fa) < 0)
		return NULL;
	return kvpy_session_wrap(s->node.parent, fa.out);
}

static PyMethodDef sess_methods[] = {
	{"close", kvpy_node_close_meth, METH_NOARGS,
	 "close(): closes the session (idempotent; in the daemon once no view of it is left)"},
	{"append", (PyCFunction)(void (*)(void))sess_append, METH_VARARGS | METH_KEYWORDS,
	 "append(tokens, key_spans=None): reserves positions for tokens; key_spans "
	 "[(first_token, n_tokens, key), ...] in absolute positions (kvp_append_opts)"},
	{"to_engine", (PyCFunction)(void (*)(void))kvpy_session_to_engine,
	 METH_VARARGS | METH_KEYWORDS,
	 "to_engine(cache, block_ids, first_page=0, *, layers=None, heads=None, "
	 "engine_layer_first=0, engine_head_first=0): copies pages first_page.. into the "
	 "engine's blocks (kvp_pages_to_engine)"},
	{"from_engine", (PyCFunction)(void (*)(void))kvpy_session_from_engine,
	 METH_VARARGS | METH_KEYWORDS,
	 "from_engine(cache, block_ids, first_page=0, *, layers=None, heads=None, "
	 "engine_layer_first=0, engine_head_first=0): copies the engine's blocks into "
	 "uncommitted pages first_page.. (kvp_engine_to_pages)"},
	{"page", sess_page, METH_O, "page(i) -> Page: page i of the session (kvp_session_page)"},
	{"write", sess_write, METH_VARARGS,
	 "write(i, offset, data): copies bytes into page i at offset (kvp_session_write)"},
	{"commit", (PyCFunction)(void (*)(void))sess_commit, METH_VARARGS | METH_KEYWORDS,
	 "commit(n=None): publishes the next n reserved tokens, all when None (kvp_commit); "
	 "BufferError while views of the session's pages exist"},
	{"truncate", sess_truncate, METH_O,
	 "truncate(n): keeps the first n tokens (kvp_truncate); BufferError while views exist"},
	{"fork", sess_fork, METH_O,
	 "fork(n) -> Session sharing the first n committed tokens (kvp_session_fork)"},
	{"__enter__", kvpy_node_enter, METH_NOARGS, NULL},
	{"__exit__", kvpy_node_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef sess_getset[] = {
	{"id", sess_u64, NULL, "the session's id", (void *)0},
	{"tokens", sess_u64, NULL, "tokens reserved, committed or not", (void *)1},
	{"committed", sess_u64, NULL, "tokens committed", (void *)2},
	{"closed", kvpy_node_closed_get, NULL, NULL, NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_session_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Session",
	.tp_basicsize = sizeof(struct kvpy_session),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A session: Pool.session(), Session.fork(n), Lease.fork(n)",
	.tp_dealloc = kvpy_node_dealloc,
	.tp_weaklistoffset = offsetof(struct kvpy_node, weakrefs),
	.tp_methods = sess_methods,
	.tp_getset = sess_getset,
};
