/* python/kvpalace/pool.c — kvpalace.Pool: a pool handle (kvp_pool_open,
 * through Client.open_pool): its salt, lookups that change nothing
 * (kvp_lookup_batch), sessions (kvp_session_create) and matches
 * (kvp_match_prefix_opts) and prefetches, each with the salt, extra key
 * and key spans of its own call (query.c), and the asynchronous
 * lookups and prefetches of async.c. */
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
	kvp_pool *p;
	const void *salt;
	size_t n;
};

static int do_set_salt(void *a)
{
	struct salt_arg *sa = a;

	return kvp_pool_set_salt(sa->p, sa->salt, sa->n);
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

/* A prompt and its keys, as match, lookup and prefetch take them. */
struct prompt {
	struct kvpy_tokens tk;
	struct kvpy_keys keys;
};

static int prompt_get(struct kvpy_pool *p, PyObject *tokens, PyObject *salt, PyObject *extra,
		      PyObject *spans, struct prompt *pr)
{
	if (pool_check(p) < 0 || kvpy_tokens_get(tokens, &pr->tk) < 0)
		return -1;
	if (kvpy_keys_get(salt, extra, spans, &pr->keys) < 0) {
		kvpy_tokens_put(&pr->tk);
		return -1;
	}
	return 0;
}

static void prompt_put(struct prompt *pr)
{
	kvpy_tokens_put(&pr->tk);
	kvpy_keys_put(&pr->keys);
}

static char *prompt_kwlist[] = {"tokens", "salt", "extra_key", "key_spans", NULL};

static PyObject *pool_lookup(PyObject *self, PyObject *args, PyObject *kw)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *tokens, *salt = Py_None, *extra = Py_None, *spans = Py_None;
	struct kvp_lookup_query q = {0};
	struct kvp_lookup_result r = {0};
	struct lookup_arg la = {.q = &q, .r = &r, .n = 1};
	struct prompt pr;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:lookup", prompt_kwlist, &tokens, &salt,
					 &extra, &spans) ||
	    prompt_get(p, tokens, salt, extra, spans, &pr) < 0)
		return NULL;
	la.p = p->p;
	q.tokens = pr.tk.t;
	q.n_tokens = pr.tk.n;
	kvpy_keys_query(&pr.keys, &q);
	ret = kvpy_call_raise(&p->node, do_lookup, &la);
	prompt_put(&pr);
	if (ret < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(r.matched_tokens);
}

static PyObject *pool_lookup_batch(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"prompts", "salts", "extra_keys", "key_spans", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *prompts, *salts = Py_None, *extras = Py_None, *spans = Py_None, *out = NULL;
	struct lookup_arg la = {0};
	struct kvpy_batch b;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:lookup_batch", kwlist, &prompts, &salts,
					 &extras, &spans))
		return NULL;
	if (pool_check(p) < 0 || kvpy_batch_get(prompts, salts, extras, spans, &b) < 0)
		return NULL;
	la.p = p->p;
	la.q = b.q;
	la.r = b.r;
	la.n = (size_t)b.n;
	if (kvpy_call_raise(&p->node, do_lookup, &la) == 0)
		out = kvpy_batch_results(&b);
	kvpy_batch_put(&b);
	return out;
}

struct session_arg {
	kvp_pool *p;
	struct kvp_session_opts o;
	kvp_session *s;
};

static int do_session_create(void *a)
{
	struct session_arg *sa = a;

	return kvp_session_create_opts(sa->p, &sa->o, &sa->s);
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

/* session(extra_key=None, salt=None) -> Session: the session keeps both
 * for good (kvp_session_create_opts). */
static PyObject *pool_session(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"extra_key", "salt", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *extra = Py_None, *salt = Py_None;
	struct session_arg sa = {0};
	struct kvp_match_opts mo;
	struct kvpy_keys k;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:session", kwlist, &extra, &salt))
		return NULL;
	if (pool_check(p) < 0 || kvpy_keys_get(salt, extra, NULL, &k) < 0)
		return NULL;
	kvpy_keys_match_opts(&k, &mo);
	sa.p = p->p;
	sa.o.size = sizeof(sa.o);
	sa.o.salt = mo.salt;
	sa.o.salt_len = mo.salt_len;
	sa.o.extra_key = mo.extra_key;
	sa.o.extra_key_len = mo.extra_key_len;
	ret = kvpy_call_raise(&p->node, do_session_create, &sa);
	kvpy_keys_put(&k);
	if (ret < 0)
		return NULL;
	return kvpy_session_wrap(&p->node, sa.s);
}

struct match_arg {
	kvp_pool *p;
	const uint32_t *t;
	size_t n;
	struct kvp_match_opts o;
	kvp_lease *l;
	uint32_t coming;
};

static int do_match(void *a)
{
	struct match_arg *ma = a;

	return kvp_match_prefix_opts(ma->p, ma->t, ma->n, &ma->o, &ma->l);
}

static int do_prefetch(void *a)
{
	struct match_arg *ma = a;

	return kvp_prefetch_opts(ma->p, ma->t, ma->n, &ma->o, &ma->coming);
}

/* Parses (tokens, salt, extra_key, key_spans) by fmt and runs fn on them. */
static int prompt_run(struct kvpy_pool *p, PyObject *args, PyObject *kw, const char *fmt,
		      int (*fn)(void *), struct match_arg *ma)
{
	PyObject *tokens, *salt = Py_None, *extra = Py_None, *spans = Py_None;
	struct prompt pr;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, prompt_kwlist, &tokens, &salt, &extra,
					 &spans) ||
	    prompt_get(p, tokens, salt, extra, spans, &pr) < 0)
		return -1;
	ma->p = p->p;
	ma->t = pr.tk.t;
	ma->n = pr.tk.n;
	kvpy_keys_match_opts(&pr.keys, &ma->o);
	ret = kvpy_call_raise(&p->node, fn, ma);
	prompt_put(&pr);
	return ret;
}

static PyObject *pool_match(PyObject *self, PyObject *args, PyObject *kw)
{
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	struct match_arg ma = {0};
	struct kvpy_lease *o;

	if (prompt_run(p, args, kw, "O|OOO:match", do_match, &ma) < 0)
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

/* prefetch(tokens, salt=None, extra_key=None, key_spans=None) -> int:
 * pages on their way in from disk (kvp_prefetch_opts). */
static PyObject *pool_prefetch(PyObject *self, PyObject *args, PyObject *kw)
{
	struct match_arg ma = {0};

	if (prompt_run((struct kvpy_pool *)self, args, kw, "O|OOO:prefetch", do_prefetch, &ma) < 0)
		return NULL;
	return PyLong_FromUnsignedLong(ma.coming);
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
	if (kvpy_call_local_raise(&p->node, do_arena, &aa) < 0)
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
	 "lookup(tokens, salt=None, extra_key=None, key_spans=None) -> int: tokens a match "
	 "would find now; changes nothing"},
	{"lookup_batch", (PyCFunction)(void (*)(void))pool_lookup_batch,
	 METH_VARARGS | METH_KEYWORDS,
	 "lookup_batch(prompts, salts=None, extra_keys=None, key_spans=None) -> "
	 "list[(matched_tokens, host_tokens)]"},
	{"lookup_submit", (PyCFunction)(void (*)(void))kvpy_pool_lookup_submit,
	 METH_VARARGS | METH_KEYWORDS,
	 "lookup_submit(prompts, salts=None, extra_keys=None, key_spans=None) -> int: "
	 "lookup_batch, "
	 "submitted; Client.complete() gives its result under the returned handle"},
	{"prefetch", (PyCFunction)(void (*)(void))pool_prefetch, METH_VARARGS | METH_KEYWORDS,
	 "prefetch(tokens, salt=None, extra_key=None, key_spans=None) -> int: pages coming "
	 "from disk ahead of a match (kvp_prefetch_opts)"},
	{"prefetch_submit", (PyCFunction)(void (*)(void))kvpy_pool_prefetch_submit,
	 METH_VARARGS | METH_KEYWORDS,
	 "prefetch_submit(tokens) -> int: prefetch, submitted (the pool handle's salt); "
	 "Client.complete() gives the pages coming under the returned handle"},
	{"session", (PyCFunction)(void (*)(void))pool_session, METH_VARARGS | METH_KEYWORDS,
	 "session(extra_key=None, salt=None) -> Session (kvp_session_create_opts)"},
	{"match", (PyCFunction)(void (*)(void))pool_match, METH_VARARGS | METH_KEYWORDS,
	 "match(tokens, salt=None, extra_key=None, key_spans=None) -> Lease: the longest "
	 "cached prefix, pinned (kvp_match_prefix_opts)"},
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
