/* python/kvpalace/pool.c — kvpalace.Pool: a pool handle (kvp_pool_open,
 * through Client.open_pool): its salt, lookups that change nothing
 * (kvp_lookup_batch), sessions (kvp_session_create) and matches
 * (kvp_match_prefix). A match with its own salt sets the handle's salt
 * around the call and puts the handle's back, both under the client's
 * lock, so no other thread's call sees the borrowed salt. */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

static int pool_check(struct kvpy_pool *p)
{
	return kvpy_node_check(&p->node);
}

static PyObject *pool_id(PyObject *self, void *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;

	if (pool_check(p) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(kvp_pool_id(p->p));
}

static PyObject *pool_layout(PyObject *self, void *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;

	if (pool_check(p) < 0)
		return NULL;
	return kvpy_layout_new(kvp_pool_layout(p->p));
}

static PyObject *pool_page_bytes(PyObject *self, void *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;

	if (pool_check(p) < 0)
		return NULL;
	return PyLong_FromSize_t(kvp_pool_page_bytes(p->p));
}

static PyObject *pool_row_bytes(PyObject *self, void *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;

	if (pool_check(p) < 0)
		return NULL;
	return PyLong_FromSize_t(kvp_pool_row_bytes(p->p));
}

static PyObject *pool_n_pages(PyObject *self, void *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;

	if (pool_check(p) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(kvp_pool_n_pages(p->p));
}

struct salt_arg {
	struct kvpy_pool *o;
	kvp_pool *p;
	const void *salt;
	size_t n;
};

static int do_set_salt(void *a)
{
	struct salt_arg *sa = a;
	int ret = kvp_pool_set_salt(sa->p, sa->salt, sa->n);

	/* Under the client's lock, as match(salt=) reads it. */
	if (ret == 0) {
		memcpy(sa->o->salt, sa->salt ? sa->salt : "", sa->n);
		sa->o->salt_len = sa->n;
	}
	return ret;
}

static PyObject *pool_set_salt(PyObject *self, PyObject *arg)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	struct salt_arg sa = {0};
	Py_buffer v;
	int has, ret;

	if (pool_check(p) < 0 || kvpy_salt_get(arg, &v, &has) < 0)
		return NULL;
	sa.p = p->p;
	if (has) {
		sa.salt = v.buf;
		sa.n = (size_t)v.len;
	}
	sa.o = p;
	ret = kvpy_call_raise(&p->node, do_set_salt, &sa);
	if (has)
		PyBuffer_Release(&v);
	if (ret < 0)
		return NULL;
	Py_RETURN_NONE;
}

struct lookup_arg {
	kvp_pool *p;
	struct kvp_lookup_query *q;
	struct kvp_lookup_result *r;
	size_t n;
};

static int do_lookup(void *a)
{
	struct lookup_arg *la = a;

	return kvp_lookup_batch(la->p, la->q, la->n, la->r);
}

static PyObject *pool_lookup(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tokens", "salt", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *tokens, *salt = Py_None;
	struct kvp_lookup_query q = {0};
	struct kvp_lookup_result r = {0};
	struct lookup_arg la = {.q = &q, .r = &r, .n = 1};
	struct kvpy_tokens tk;
	Py_buffer v;
	int has, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:lookup", kwlist, &tokens, &salt))
		return NULL;
	if (pool_check(p) < 0 || kvpy_tokens_get(tokens, &tk) < 0)
		return NULL;
	if (kvpy_salt_get(salt, &v, &has) < 0) {
		kvpy_tokens_put(&tk);
		return NULL;
	}
	la.p = p->p;
	q.tokens = tk.t;
	q.n_tokens = tk.n;
	if (has) {
		q.salt = v.len ? v.buf : "";
		q.salt_len = (size_t)v.len;
	}
	ret = kvpy_call_raise(&p->node, do_lookup, &la);
	kvpy_tokens_put(&tk);
	if (has)
		PyBuffer_Release(&v);
	if (ret < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(r.matched_tokens);
}

static PyObject *pool_lookup_batch(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"prompts", "salts", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *prompts, *salts = Py_None, *pseq = NULL, *sseq = NULL, *out = NULL;
	struct kvpy_tokens *tk = NULL;
	Py_buffer *sv = NULL;
	char *shas = NULL;
	struct lookup_arg la = {0};
	Py_ssize_t n, got_tk = 0, got_s = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:lookup_batch", kwlist, &prompts, &salts))
		return NULL;
	if (pool_check(p) < 0)
		return NULL;
	pseq = PySequence_Fast(prompts, "prompts must be a sequence of token sequences");
	if (!pseq)
		return NULL;
	n = PySequence_Fast_GET_SIZE(pseq);
	if (salts != Py_None) {
		sseq = PySequence_Fast(salts, "salts must be a sequence (None: the pool's salt)");
		if (!sseq)
			goto out;
		if (PySequence_Fast_GET_SIZE(sseq) != n) {
			PyErr_SetString(PyExc_ValueError, "salts must be as many as prompts");
			goto out;
		}
	}
	tk = PyMem_Calloc((size_t)n + 1, sizeof(*tk));
	sv = PyMem_Calloc((size_t)n + 1, sizeof(*sv));
	shas = PyMem_Calloc((size_t)n + 1, 1);
	la.q = PyMem_Calloc((size_t)n + 1, sizeof(*la.q));
	la.r = PyMem_Calloc((size_t)n + 1, sizeof(*la.r));
	if (!tk || !sv || !shas || !la.q || !la.r) {
		PyErr_NoMemory();
		goto out;
	}
	for (; got_tk < n; got_tk++) {
		if (kvpy_tokens_get(PySequence_Fast_GET_ITEM(pseq, got_tk), &tk[got_tk]) < 0)
			goto out;
		la.q[got_tk].tokens = tk[got_tk].t;
		la.q[got_tk].n_tokens = tk[got_tk].n;
	}
	for (; sseq && got_s < n; got_s++) {
		int has;

		if (kvpy_salt_get(PySequence_Fast_GET_ITEM(sseq, got_s), &sv[got_s], &has) < 0)
			goto out;
		shas[got_s] = (char)has;
		if (has) {
			la.q[got_s].salt = sv[got_s].len ? sv[got_s].buf : "";
			la.q[got_s].salt_len = (size_t)sv[got_s].len;
		}
	}
	la.p = p->p;
	la.n = (size_t)n;
	if (kvpy_call_raise(&p->node, do_lookup, &la) < 0)
		goto out;
	out = PyList_New(n);
	for (Py_ssize_t i = 0; out && i < n; i++) {
		PyObject *t = Py_BuildValue("(KK)", (unsigned long long)la.r[i].matched_tokens,
					    (unsigned long long)la.r[i].host_tokens);

		if (!t)
			Py_CLEAR(out);
		else
			PyList_SET_ITEM(out, i, t);
	}
out:
	for (Py_ssize_t i = 0; i < got_tk; i++)
		kvpy_tokens_put(&tk[i]);
	for (Py_ssize_t i = 0; i < got_s; i++)
		if (shas[i])
			PyBuffer_Release(&sv[i]);
	PyMem_Free(tk);
	PyMem_Free(sv);
	PyMem_Free(shas);
	PyMem_Free(la.q);
	PyMem_Free(la.r);
	Py_XDECREF(pseq);
	Py_XDECREF(sseq);
	return out;
}

struct session_arg {
	kvp_pool *p;
	kvp_session *s;
};

static int do_session_create(void *a)
{
	struct session_arg *sa = a;

	return kvp_session_create(sa->p, &sa->s);
}

PyObject *kvpy_session_wrap(struct kvpy_node *pool, kvp_session *s)
{
	struct kvpy_session *o = PyObject_New(struct kvpy_session, &kvpy_session_type);

	if (!o) {
		/* Closed with the connection. */
		return NULL;
	}
	o->node.weakrefs = NULL;
	kvpy_node_link(&o->node, pool, KVPY_SESSION);
	o->s = s;
	o->generation = 0;
	return (PyObject *)o;
}

static PyObject *pool_session(PyObject *self, PyObject *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	struct session_arg sa = {0};

	if (pool_check(p) < 0)
		return NULL;
	sa.p = p->p;
	if (kvpy_call_raise(&p->node, do_session_create, &sa) < 0)
		return NULL;
	return kvpy_session_wrap(&p->node, sa.s);
}

struct match_arg {
	kvp_pool *p;
	const uint32_t *t;
	size_t n;
	const void *salt;
	size_t salt_len;
	int has_salt;
	const void *old_salt;
	struct kvpy_pool *o;
	kvp_lease *l;
};

static int do_match(void *a)
{
	struct match_arg *ma = a;
	int ret, ret2;

	if (!ma->has_salt)
		return kvp_match_prefix(ma->p, ma->t, ma->n, &ma->l);
	ret = kvp_pool_set_salt(ma->p, ma->salt, ma->salt_len);
	if (ret < 0)
		return ret;
	ret = kvp_match_prefix(ma->p, ma->t, ma->n, &ma->l);
	ret2 = kvp_pool_set_salt(ma->p, ma->old_salt, ma->o->salt_len);
	if (ret == 0 && ret2 < 0) {
		kvp_lease_release(ma->l);
		ret = ret2;
	}
	return ret;
}

static PyObject *pool_match(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tokens", "salt", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *tokens, *salt = Py_None;
	struct match_arg ma = {0};
	struct kvpy_tokens tk;
	struct kvpy_lease *o;
	Py_buffer v;
	int has, ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:match", kwlist, &tokens, &salt))
		return NULL;
	if (pool_check(p) < 0 || kvpy_tokens_get(tokens, &tk) < 0)
		return NULL;
	if (kvpy_salt_get(salt, &v, &has) < 0) {
		kvpy_tokens_put(&tk);
		return NULL;
	}
	ma.p = p->p;
	ma.t = tk.t;
	ma.n = tk.n;
	ma.has_salt = has;
	if (has) {
		ma.salt = v.buf;
		ma.salt_len = (size_t)v.len;
	}
	ma.old_salt = p->salt;
	ma.o = p;
	ret = kvpy_call_raise(&p->node, do_match, &ma);
	kvpy_tokens_put(&tk);
	if (has)
		PyBuffer_Release(&v);
	if (ret < 0)
		return NULL;
	o = PyObject_New(struct kvpy_lease, &kvpy_lease_type);
	if (!o) {
		kvp_lease_release(ma.l);
		return NULL;
	}
	o->node.weakrefs = NULL;
	kvpy_node_link(&o->node, &p->node, KVPY_LEASE);
	o->l = ma.l;
	return (PyObject *)o;
}

struct adopt_arg {
	kvp_pool *p;
	uint64_t id;
	kvp_lease *l;
};

static int do_adopt(void *a)
{
	struct adopt_arg *aa = a;

	return kvp_lease_adopt(aa->p, aa->id, &aa->l);
}

/* adopt(lease_id) -> Lease: this client's own lease on the pages another
 * process's lease (Lease.id) holds (kvp_lease_adopt). */
static PyObject *pool_adopt(PyObject *self, PyObject *arg)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	struct adopt_arg aa = {0};
	struct kvpy_lease *o;

	if (pool_check(p) < 0)
		return NULL;
	aa.id = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	aa.p = p->p;
	if (kvpy_call_raise(&p->node, do_adopt, &aa) < 0)
		return NULL;
	o = PyObject_New(struct kvpy_lease, &kvpy_lease_type);
	if (!o) {
		kvp_lease_release(aa.l);
		return NULL;
	}
	o->node.weakrefs = NULL;
	kvpy_node_link(&o->node, &p->node, KVPY_LEASE);
	o->l = aa.l;
	return (PyObject *)o;
}

struct arena_arg {
	kvp_pool *p;
	struct kvp_arena a;
};

static int do_arena(void *a)
{
	struct arena_arg *aa = a;

	return kvp_pool_arena(aa->p, &aa->a);
}

/* arena() -> dict: the host arena as this process maps it (kvp_pool_arena). */
static PyObject *pool_arena(PyObject *self, PyObject *unused)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	struct arena_arg aa = {0};

	if (pool_check(p) < 0)
		return NULL;
	aa.p = p->p;
	if (kvpy_call_raise(&p->node, do_arena, &aa) < 0)
		return NULL;
	return Py_BuildValue(
		"{s:K,s:n,s:n,s:I,s:i,s:K,s:O}", "base", (unsigned long long)(uintptr_t)aa.a.base,
		"bytes", (Py_ssize_t)aa.a.bytes, "page_bytes", (Py_ssize_t)aa.a.page_bytes,
		"n_pages", aa.a.n_pages, "fd", aa.a.fd, "fd_offset",
		(unsigned long long)aa.a.fd_offset, "hugetlb", aa.a.hugetlb ? Py_True : Py_False);
}

static PyMethodDef pool_methods[] = {
	{"close", kvpy_node_close_meth, METH_NOARGS,
	 "close(): closes the handle and its sessions and leases (idempotent)"},
	{"set_salt", pool_set_salt, METH_O,
	 "set_salt(bytes | None): the handle's cache salt (kvp_pool_set_salt)"},
	{"lookup", (PyCFunction)(void (*)(void))pool_lookup, METH_VARARGS | METH_KEYWORDS,
	 "lookup(tokens, salt=None) -> int: tokens a match would find now; changes nothing"},
	{"lookup_batch", (PyCFunction)(void (*)(void))pool_lookup_batch,
	 METH_VARARGS | METH_KEYWORDS,
	 "lookup_batch(prompts, salts=None) -> list[(matched_tokens, host_tokens)]"},
	{"session", pool_session, METH_NOARGS, "session() -> Session (kvp_session_create)"},
	{"match", (PyCFunction)(void (*)(void))pool_match, METH_VARARGS | METH_KEYWORDS,
	 "match(tokens, salt=None) -> Lease: the longest cached prefix, pinned (kvp_match_prefix)"},
	{"adopt", pool_adopt, METH_O,
	 "adopt(lease_id) -> Lease: a lease of this client's on the pages another lease of the "
	 "user holds (kvp_lease_adopt)"},
	{"arena", pool_arena, METH_NOARGS,
	 "arena() -> dict(base, bytes, page_bytes, n_pages, fd, fd_offset, hugetlb): the host "
	 "arena as mapped here (kvp_pool_arena; fd is the library's: do not close it)"},
	{"__enter__", kvpy_node_enter, METH_NOARGS, NULL},
	{"__exit__", kvpy_node_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
	{"id", pool_id, NULL, "the pool's id in the daemon", NULL},
	{"layout", pool_layout, NULL, "the pool's Layout", NULL},
	{"page_bytes", pool_page_bytes, NULL, "bytes of one page (padded)", NULL},
	{"row_bytes", pool_row_bytes, NULL, "bytes of one token's head_dim elements", NULL},
	{"n_pages", pool_n_pages, NULL, "pages in the host arena", NULL},
	{"closed", kvpy_node_closed_get, NULL, NULL, NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_pool_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Pool",
	.tp_basicsize = sizeof(struct kvpy_pool),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A pool handle: Client.open_pool(model_id, layout)",
	.tp_dealloc = kvpy_node_dealloc,
	.tp_weaklistoffset = offsetof(struct kvpy_node, weakrefs),
	.tp_methods = pool_methods,
	.tp_getset = pool_getset,
};
