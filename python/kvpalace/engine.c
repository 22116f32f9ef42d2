/* python/kvpalace/engine.c — Session.to_engine, Session.from_engine and
 * Lease.to_engine: whole pages copied between kvpalace pages and an
 * inference engine's paged KV cache (kvp_pages_to_engine,
 * kvp_engine_to_pages), for a list of blocks in one call.
 *
 * The engine's cache is a kvpalace.EngineCache (__init__.py), which
 * checks the tensors' shapes, dtypes and contiguity and, at each copy,
 * gives their current addresses through its _spec() method: a tensor
 * resized in place since the cache was made is refused there, not
 * written through a stale address. The block table and the copy run in
 * one call with the GIL released and the client's lock held, so no
 * commit of another thread moves a page in between. */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

struct copy_arg {
	kvp_session *s; /* or */
	const kvp_lease *l;
	int to_pages; /* engine -> pages */
	const struct kvp_layout *layout;
	uint64_t first_page;
	size_t n;
	void **bases;
	int32_t *block_ids;
	struct kvp_engine_cache ec;
	const struct kvp_adapt_range *range;
	const char *why; /* a refusal of ours, for the message */
};

static int do_copy(void *a)
{
	struct copy_arg *ca = a;
	struct kvp_page_view v;
	uint32_t last = ca->layout->block_tokens;
	int ret;

	if (ca->n == 0)
		return 0;
	if (ca->s) {
		ret = kvp_session_block_table(ca->s, ca->first_page, ca->n, ca->bases, NULL);
		if (ret < 0)
			return ret;
		ret = kvp_session_page(ca->s, ca->first_page + ca->n - 1, &v);
		if (ret < 0)
			return ret;
		last = v.n_tokens;
		if (ca->to_pages &&
		    ca->first_page * ca->layout->block_tokens < kvp_session_committed(ca->s)) {
			ca->why = "the pages hold committed tokens: from_engine writes only "
				  "pages past Session.committed";
			return -EBUSY;
		}
	} else {
		ret = kvp_lease_block_table(ca->l, ca->first_page, ca->n, ca->bases, NULL);
		if (ret < 0)
			return ret;
	}
	if (ca->to_pages)
		return kvp_engine_to_pages(ca->layout, ca->bases, ca->n, last, &ca->ec,
					   ca->block_ids, ca->range);
	return kvp_pages_to_engine(ca->layout, ca->bases, ca->n, last, &ca->ec, ca->block_ids,
				   ca->range);
}

/* A (first, n) pair of non-negative ints, or None. */
static int pair_get(PyObject *o, const char *what, uint32_t *first, uint32_t *n, int *has)
{
	unsigned int f, c;

	*has = 0;
	if (!o || o == Py_None)
		return 0;
	if (!PyTuple_Check(o) || !PyArg_ParseTuple(o, "II", &f, &c)) {
		PyErr_Clear();
		PyErr_Format(PyExc_TypeError, "%s must be a (first, count) pair of ints", what);
		return -1;
	}
	*first = f;
	*n = c;
	*has = 1;
	return 0;
}

static int addrs_get(PyObject *o, uint32_t n, void **out)
{
	if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != (Py_ssize_t)n) {
		PyErr_SetString(PyExc_TypeError,
				"EngineCache._spec(): a tuple of n_layers addresses");
		return -1;
	}
	for (uint32_t i = 0; i < n; i++) {
		out[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(o, i));
		if (PyErr_Occurred())
			return -1;
	}
	return 0;
}

static int ids_get(PyObject *o, size_t *ret_n, int32_t **ret)
{
	PyObject *seq = PySequence_Fast(o, "block_ids must be a sequence of ints");
	Py_ssize_t n;

	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	*ret = PyMem_Calloc((size_t)n + 1, sizeof(**ret));
	if (!*ret) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));

		if (v == -1 && PyErr_Occurred()) {
			Py_DECREF(seq);
			return -1;
		}
		if (v < 0 || v > INT32_MAX) {
			Py_DECREF(seq);
			PyErr_Format(PyExc_ValueError, "block id %lld out of range", v);
			return -1;
		}
		(*ret)[i] = (int32_t)v;
	}
	Py_DECREF(seq);
	*ret_n = (size_t)n;
	return 0;
}

/* A cache of kind 0 ("strided"): K and V views of [num_blocks, block_size,
 * H, D] whose (block, token, head) strides, in elements, the cache gives;
 * kvp_pages_to_engine checks that no two rows overlap. -EFAULT with a
 * Python error set. */
static int strided_init(struct kvp_engine_cache *ec, PyObject *strides, uint32_t n_layers,
			void **k_layers, void **v_layers, uint32_t nb, uint32_t bs, uint32_t nh,
			uint32_t hd, uint32_t eb)
{
	unsigned long long bst, tst, hst;

	if (!v_layers || !PyTuple_Check(strides) ||
	    !PyArg_ParseTuple(strides, "KKK", &bst, &tst, &hst)) {
		PyErr_Clear();
		PyErr_SetString(PyExc_TypeError, "a strided EngineCache gives v_layers and "
						 "(block, token, head) strides");
		return -EFAULT;
	}
	memset(ec, 0, sizeof(*ec));
	ec->n_layers = n_layers;
	ec->num_blocks = nb;
	ec->block_size = bs;
	ec->n_heads = nh;
	ec->head_dim = hd;
	ec->elem_bytes = eb;
	ec->block_stride = bst;
	ec->token_stride = tst;
	ec->head_stride = hst;
	ec->k_layers = k_layers;
	ec->v_layers = v_layers;
	return 0;
}

static PyObject *copy(struct kvpy_node *owner, int to_pages, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"cache", "block_ids",		"first_page",	     "layers",
				 "heads", "engine_layer_first", "engine_head_first", NULL};
	PyObject *cache, *ids, *layers = Py_None, *heads = Py_None, *spec = NULL, *k, *v;
	PyObject *res = NULL, *dtype, *strides = Py_None;
	unsigned int planes = 2;
	unsigned long long first_page = 0;
	unsigned int elf = 0, ehf = 0, kind, n_layers, nb, bs, nh, hd, eb;
	struct copy_arg ca = {0};
	struct kvp_adapt_range range = {0};
	void **k_layers = NULL, **v_layers = NULL;
	int has_l, has_h, ret;
	char msg[256];

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|K$OOII:copy", kwlist, &cache, &ids,
					 &first_page, &layers, &heads, &elf, &ehf))
		return NULL;
	if (kvpy_node_check(owner) < 0)
		return NULL;
	ca.layout = kvpy_owner_layout(owner);
	if (pair_get(layers, "layers", &range.layer_first, &range.n_layers, &has_l) < 0 ||
	    pair_get(heads, "heads", &range.head_first, &range.n_heads, &has_h) < 0)
		return NULL;
	if (has_l || has_h || elf || ehf) {
		if (!has_l) {
			range.layer_first = 0;
			range.n_layers = ca.layout->n_layers;
		}
		if (!has_h) {
			range.head_first = 0;
			range.n_heads = ca.layout->n_kv_heads;
		}
		range.engine_layer_first = elf;
		range.engine_head_first = ehf;
		ca.range = &range;
	}
	spec = PyObject_CallMethod(cache, "_spec", NULL);
	if (!spec)
		return NULL;
	if (!PyArg_ParseTuple(spec, "IIIIIIIOOO|OI;EngineCache._spec() returned a wrong tuple",
			      &kind, &n_layers, &nb, &bs, &nh, &hd, &eb, &k, &v, &dtype, &strides,
			      &planes))
		goto out;
	/* A one-plane (latent) engine tensor holds no V: a K/V pool's copy
	 * would run past it. */
	if (planes == 1 && ca.layout->format != KVP_FORMAT_LATENT) {
		PyErr_SetString(PyExc_TypeError, "a latent EngineCache copies to and from pools of "
						 "format \"latent\" only");
		goto out;
	}
	/* Bytes are copied unchanged: f16 read as bf16 would be garbage. */
	if (dtype != Py_None && PyUnicode_Check(dtype) &&
	    strcmp(PyUnicode_AsUTF8(dtype), kvpy_dtype_name(ca.layout->dtype))) {
		PyErr_Format(PyExc_TypeError, "the engine's tensors are %U, the pool's pages %s",
			     dtype, kvpy_dtype_name(ca.layout->dtype));
		goto out;
	}
	k_layers = PyMem_Calloc((size_t)n_layers + 1, sizeof(void *));
	v_layers = v != Py_None ? PyMem_Calloc((size_t)n_layers + 1, sizeof(void *)) : NULL;
	if (!k_layers || (v != Py_None && !v_layers)) {
		PyErr_NoMemory();
		goto out;
	}
	if (addrs_get(k, n_layers, k_layers) < 0 ||
	    (v_layers && addrs_get(v, n_layers, v_layers) < 0))
		goto out;
	if (kind == 0)
		ret = strided_init(&ca.ec, strides, n_layers, k_layers, v_layers, nb, bs, nh, hd,
				   eb);
	else
		ret = kvp_engine_cache_init(&ca.ec, kind, n_layers, k_layers, v_layers, nb, bs, nh,
					    hd, eb);
	if (ret == -EFAULT)
		goto out;
	if (ret < 0) {
		kvpy_raise(ret, "the engine cache's geometry is invalid (kvp_engine_cache_init)");
		goto out;
	}
	if (ids_get(ids, &ca.n, &ca.block_ids) < 0)
		goto out;
	ca.bases = PyMem_Calloc(ca.n + 1, sizeof(void *));
	if (!ca.bases) {
		PyErr_NoMemory();
		goto out;
	}
	if (owner->kind == KVPY_SESSION)
		ca.s = ((struct kvpy_session *)owner)->s;
	else
		ca.l = ((struct kvpy_lease *)owner)->l;
	ca.to_pages = to_pages;
	ca.first_page = first_page;
	ret = kvpy_call(owner, do_copy, &ca, msg, sizeof(msg));
	if (ret < 0) {
		if (ca.why)
			kvpy_raise(ret, ca.why);
		else
			kvpy_raise(ret, ret == -ERANGE	 ? "a page or a block id out of range, or "
							   "layers/heads past the cache's"
					: ret == -EINVAL ? "the engine cache does not fit "
							   "the pool's layout (block_size, "
							   "heads, head_dim, element size)"
							 : msg);
		goto out;
	}
	res = Py_None;
	Py_INCREF(res);
out:
	Py_XDECREF(spec);
	PyMem_Free(k_layers);
	PyMem_Free(v_layers);
	PyMem_Free(ca.block_ids);
	PyMem_Free(ca.bases);
	return res;
}

PyObject *kvpy_session_to_engine(PyObject *self, PyObject *args, PyObject *kw)
{
	return copy((struct kvpy_node *)self, 0, args, kw);
}

/* Pages are written in place and none moves: views of them stay valid. */
PyObject *kvpy_session_from_engine(PyObject *self, PyObject *args, PyObject *kw)
{
	return copy((struct kvpy_node *)self, 1, args, kw);
}

PyObject *kvpy_lease_to_engine(PyObject *self, PyObject *args, PyObject *kw)
{
	return copy((struct kvpy_node *)self, 0, args, kw);
}
