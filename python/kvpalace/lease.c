/* python/kvpalace/lease.c — kvpalace.Lease: the pages of a matched prefix,
 * pinned until release() (kvp_match_prefix through Pool.match): read-only
 * page views (kvp_lease_page), copies (kvp_lease_read) and a session that
 * continues from the prefix (kvp_lease_fork). release() is close(): a view
 * still alive keeps the lease in the daemon until the view is gone. */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

static int lease_check(struct kvpy_lease *l)
{
	return kvpy_node_check(&l->node);
}

struct tokens_arg {
	kvp_lease *l;
	uint64_t v;
};

static int do_tokens(void *a)
{
	struct tokens_arg *ta = a;

	ta->v = kvp_lease_tokens(ta->l);
	return 0;
}

static PyObject *lease_tokens(PyObject *self, void *unused)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;
	struct tokens_arg ta = {0};

	if (lease_check(l) < 0)
		return NULL;
	ta.l = l->l;
	kvpy_call(&l->node, do_tokens, &ta, NULL, 0);
	return PyLong_FromUnsignedLongLong(ta.v);
}

static PyObject *lease_id(PyObject *self, void *unused)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;

	if (lease_check(l) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(kvp_lease_id(l->l));
}

struct table_arg {
	kvp_lease *l;
	uint64_t first;
	size_t n;
	uint32_t *slots;
};

static int do_table(void *a)
{
	struct table_arg *ta = a;

	return kvp_lease_block_table(ta->l, ta->first, ta->n, NULL, ta->slots);
}

/* block_table(first=0, n=None): the arena slots of pages first..first+n
 * (None: to the last whole page), one call for the lot. */
static PyObject *lease_block_table(PyObject *self, PyObject *args)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;
	struct table_arg ta = {0};
	unsigned long long first = 0;
	PyObject *n = Py_None, *list = NULL;
	uint64_t pages;

	if (!PyArg_ParseTuple(args, "|KO:block_table", &first, &n) || lease_check(l) < 0)
		return NULL;
	pages = kvp_lease_tokens(l->l) / kvpy_owner_layout(&l->node)->block_tokens;
	ta.l = l->l;
	ta.first = first;
	if (n == Py_None) {
		ta.n = first < pages ? (size_t)(pages - first) : 0;
	} else {
		ta.n = PyLong_AsSize_t(n);
		if (PyErr_Occurred())
			return NULL;
	}
	if (ta.n > pages) /* the call says -ERANGE; no allocation past the lease */
		ta.n = (size_t)pages + 1;
	ta.slots = PyMem_Malloc((ta.n ? ta.n : 1) * sizeof(uint32_t));
	if (!ta.slots)
		return PyErr_NoMemory();
	if (kvpy_call_local_raise(&l->node, do_table, &ta) == 0) {
		list = PyList_New((Py_ssize_t)ta.n);
		for (size_t i = 0; list && i < ta.n; i++) {
			PyObject *v = PyLong_FromUnsignedLong(ta.slots[i]);

			if (!v) {
				Py_CLEAR(list);
				break;
			}
			PyList_SET_ITEM(list, (Py_ssize_t)i, v);
		}
	}
	PyMem_Free(ta.slots);
	return list;
}

struct lpage_arg {
	kvp_lease *l;
	uint64_t i;
	struct kvp_page_view v;
};

static int do_page(void *a)
{
	struct lpage_arg *pa = a;

	return kvp_lease_page(pa->l, pa->i, &pa->v);
}

static PyObject *lease_page(PyObject *self, PyObject *arg)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;
	struct lpage_arg pa = {0};

	if (lease_check(l) < 0)
		return NULL;
	pa.i = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	pa.l = l->l;
	if (kvpy_call_local_raise(&l->node, do_page, &pa) < 0)
		return NULL;
	return kvpy_page_new(&l->node, pa.i, 0, 0, &pa.v);
}

struct read_arg {
	kvp_lease *l;
	uint64_t i, off;
	void *dst;
	size_t n;
};

static int do_read(void *a)
{
	struct read_arg *ra = a;

	return kvp_lease_read(ra->l, ra->i, ra->off, ra->dst, ra->n);
}

static PyObject *lease_read(PyObject *self, PyObject *args)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;
	struct read_arg ra = {0};
	unsigned long long i, off;
	Py_ssize_t n;
	PyObject *out;

	if (!PyArg_ParseTuple(args, "KKn:read", &i, &off, &n))
		return NULL;
	if (lease_check(l) < 0)
		return NULL;
	if (n < 0) {
		PyErr_SetString(PyExc_ValueError, "n is negative");
		return NULL;
	}
	out = PyBytes_FromStringAndSize(NULL, n);
	if (!out)
		return NULL;
	ra.l = l->l;
	ra.i = i;
	ra.off = off;
	ra.dst = PyBytes_AS_STRING(out);
	ra.n = (size_t)n;
	if (kvpy_call_local_raise(&l->node, do_read, &ra) < 0) {
		Py_DECREF(out);
		return NULL;
	}
	return out;
}

struct lfork_arg {
	kvp_lease *l;
	uint64_t n;
	kvp_session *out;
};

static int do_fork(void *a)
{
	struct lfork_arg *fa = a;

	return kvp_lease_fork(fa->l, fa->n, &fa->out);
}

static PyObject *lease_fork(PyObject *self, PyObject *arg)
{
	struct kvpy_lease *l = (struct kvpy_lease *)self;
	struct lfork_arg fa = {0};

	if (lease_check(l) < 0)
		return NULL;
	fa.n = PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	fa.l = l->l;
	if (kvpy_call_raise(&l->node, do_fork, &fa) < 0)
		return NULL;
	return kvpy_session_wrap(l->node.parent, fa.out);
}

static PyMethodDef lease_methods[] = {
	{"release", kvpy_node_close_meth, METH_NOARGS,
	 "release(): ends the lease (idempotent; in the daemon once no view of it is left)"},
	{"close", kvpy_node_close_meth, METH_NOARGS, "close(): release()"},
	{"to_engine", (PyCFunction)(void (*)(void))kvpy_lease_to_engine,
	 METH_VARARGS | METH_KEYWORDS,
	 "to_engine(cache, block_ids, first_page=0, *, layers=None, heads=None, "
	 "engine_layer_first=0, engine_head_first=0): copies pages first_page.. into the "
	 "engine's blocks (kvp_pages_to_engine)"},
	{"page", lease_page, METH_O, "page(i) -> Page: read-only view of page i (kvp_lease_page)"},
	{"read", lease_read, METH_VARARGS,
	 "read(i, offset, n) -> bytes: n bytes of page i from offset (kvp_lease_read)"},
	{"fork", lease_fork, METH_O,
	 "fork(n) -> Session holding the first n tokens of the match (kvp_lease_fork)"},
	{"block_table", lease_block_table, METH_VARARGS,
	 "block_table(first=0, n=None) -> list[int]: arena slots of pages first.. "
	 "(kvp_lease_block_table)"},
	{"__enter__", kvpy_node_enter, METH_NOARGS, NULL},
	{"__exit__", kvpy_node_exit, METH_VARARGS, NULL},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef lease_getset[] = {
	{"tokens", lease_tokens, NULL, "tokens matched (0: a miss)", NULL},
	{"id", lease_id, NULL,
	 "the lease's id, for Pool.adopt in another process of the user (0: a miss)", NULL},
	{"closed", kvpy_node_closed_get, NULL, NULL, NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_lease_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Lease",
	.tp_basicsize = sizeof(struct kvpy_lease),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "A read lease on a matched prefix: Pool.match(tokens)",
	.tp_dealloc = kvpy_node_dealloc,
	.tp_weaklistoffset = offsetof(struct kvpy_node, weakrefs),
	.tp_methods = lease_methods,
	.tp_getset = lease_getset,
};
