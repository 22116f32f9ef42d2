/* python/kvpalace/layout.c — kvpalace.Layout, an immutable struct
 * kvp_layout: its constructor, Layout.named() (kvp_layout_named) and its
 * read-only attributes. Validation is libkvpalace's (kvp_pool_open);
 * here only the types and the 32-bit range are checked. The engine-owned
 * fp8 dtypes ("e4m3-raw", "e5m2-raw") and the page format ("kv",
 * "latent") are named here. */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "kvpy.h"
#include <structmember.h>

PyObject *kvpy_layout_new(const struct kvp_layout *l)
{
	struct kvpy_layout *o = PyObject_New(struct kvpy_layout, &kvpy_layout_type);

	if (o)
		o->l = *l;
	return (PyObject *)o;
}

static int u32_arg(PyObject *o, const char *what, uint32_t *ret)
{
	unsigned long long v;

	if (!PyLong_Check(o)) {
		PyErr_Format(PyExc_TypeError, "%s must be an int", what);
		return -1;
	}
	if (_PyLong_Sign(o) < 0) {
		PyErr_Format(PyExc_ValueError, "%s is negative", what);
		return -1;
	}
	v = PyLong_AsUnsignedLongLong(o);
	if (v == (unsigned long long)-1 && PyErr_Occurred())
		return -1;
	if (v > UINT32_MAX) {
		PyErr_Format(PyExc_OverflowError, "%s does not fit 32 bits", what);
		return -1;
	}
	*ret = (uint32_t)v;
	return 0;
}

static int format_arg(PyObject *o, uint32_t *ret)
{
	const char *s;

	if (!PyUnicode_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "format must be a str (\"kv\" or \"latent\")");
		return -1;
	}
	s = PyUnicode_AsUTF8(o);
	if (!s)
		return -1;
	if (!strcmp(s, "kv") || !strcmp(s, "latent")) {
		*ret = s[0] == 'l' ? KVP_FORMAT_LATENT : KVP_FORMAT_KV;
		return 0;
	}
	PyErr_Format(PyExc_ValueError, "unknown format %R (kv, latent)", o);
	return -1;
}

static const char *format_name(uint32_t format)
{
	return format == KVP_FORMAT_KV ? "kv" : format == KVP_FORMAT_LATENT ? "latent" : "unknown";
}

static PyObject *layout_tp_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"n_layers", "n_kv_heads",  "head_dim", "block_tokens",
				 "dtype",    "quant_group", "format",	NULL};
	PyObject *a[4], *dtype = NULL, *qg = NULL, *fmt = NULL;
	struct kvp_layout l = {.dtype = KVP_DTYPE_F16};
	static const char *const what[] = {"n_layers", "n_kv_heads", "head_dim", "block_tokens"};
	uint32_t *dst[] = {&l.n_layers, &l.n_kv_heads, &l.head_dim, &l.block_tokens};
	struct kvpy_layout *o;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOO:Layout", kwlist, &a[0], &a[1], &a[2],
					 &a[3], &dtype, &qg, &fmt))
		return NULL;
	for (int i = 0; i < 4; i++)
		if (u32_arg(a[i], what[i], dst[i]) < 0)
			return NULL;
	if (dtype && kvpy_dtype_parse(dtype, &l.dtype) < 0)
		return NULL;
	if (qg && u32_arg(qg, "quant_group", &l.quant_group) < 0)
		return NULL;
	if (fmt && format_arg(fmt, &l.format) < 0)
		return NULL;
	o = (struct kvpy_layout *)type->tp_alloc(type, 0);
	if (o)
		o->l = l;
	return (PyObject *)o;
}

static PyObject *layout_named(PyObject *cls, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"name", "dtype", "block_tokens", NULL};
	const char *name;
	PyObject *dtype = NULL, *bt = NULL;
	uint32_t d = KVP_DTYPE_BF16, block = 16;
	struct kvp_layout l;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|OO:named", kwlist, &name, &dtype, &bt))
		return NULL;
	if (dtype && kvpy_dtype_parse(dtype, &d) < 0)
		return NULL;
	if (bt && u32_arg(bt, "block_tokens", &block) < 0)
		return NULL;
	ret = kvp_layout_named(name, d, block, &l);
	if (ret < 0) {
		char msg[160];

		snprintf(msg, sizeof(msg), "no layout named \"%s\" (see kvpalace.layout_names())",
			 name);
		return kvpy_raise(ret, ret == -ENOENT ? msg : NULL);
	}
	return kvpy_layout_new(&l);
}

static PyObject *layout_dtype_get(PyObject *self, void *unused)
{
	return PyUnicode_FromString(kvpy_dtype_name(((struct kvpy_layout *)self)->l.dtype));
}

static PyObject *layout_format_get(PyObject *self, void *unused)
{
	return PyUnicode_FromString(format_name(((struct kvpy_layout *)self)->l.format));
}

static PyObject *layout_repr(PyObject *self)
{
	const struct kvp_layout *l = &((struct kvpy_layout *)self)->l;

	if (l->format != KVP_FORMAT_KV)
		return PyUnicode_FromFormat("Layout(n_layers=%u, n_kv_heads=%u, head_dim=%u, "
					    "block_tokens=%u, dtype='%s', quant_group=%u, "
					    "format='%s')",
					    l->n_layers, l->n_kv_heads, l->head_dim,
					    l->block_tokens, kvpy_dtype_name(l->dtype),
					    l->quant_group, format_name(l->format));
	return PyUnicode_FromFormat("Layout(n_layers=%u, n_kv_heads=%u, head_dim=%u, "
				    "block_tokens=%u, dtype='%s', quant_group=%u)",
				    l->n_layers, l->n_kv_heads, l->head_dim, l->block_tokens,
				    kvpy_dtype_name(l->dtype), l->quant_group);
}

static PyObject *layout_richcompare(PyObject *a, PyObject *b, int op)
{
	int eq;

	if (!PyObject_TypeCheck(b, &kvpy_layout_type) || (op != Py_EQ && op != Py_NE))
		Py_RETURN_NOTIMPLEMENTED;
	eq = memcmp(&((struct kvpy_layout *)a)->l, &((struct kvpy_layout *)b)->l,
		    sizeof(struct kvp_layout)) == 0;
	return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static Py_hash_t layout_hash(PyObject *self)
{
	const struct kvp_layout *l = &((struct kvpy_layout *)self)->l;
	/* unsigned: wraps instead of overflowing a signed Py_hash_t */
	uint64_t h = 1469598103;
	Py_hash_t r;

	h = h * 31 + l->n_layers;
	h = h * 31 + l->n_kv_heads;
	h = h * 31 + l->head_dim;
	h = h * 31 + l->block_tokens;
	h = h * 31 + l->dtype;
	h = h * 31 + l->quant_group;
	h = h * 31 + l->format;
	r = (Py_hash_t)(h ^ (h >> 29));
	return r == -1 ? -2 : r;
}

static PyMemberDef layout_members[] = {
	{"n_layers", T_UINT, offsetof(struct kvpy_layout, l.n_layers), READONLY, NULL},
	{"n_kv_heads", T_UINT, offsetof(struct kvpy_layout, l.n_kv_heads), READONLY, NULL},
	{"head_dim", T_UINT, offsetof(struct kvpy_layout, l.head_dim), READONLY, NULL},
	{"block_tokens", T_UINT, offsetof(struct kvpy_layout, l.block_tokens), READONLY, NULL},
	{"quant_group", T_UINT, offsetof(struct kvpy_layout, l.quant_group), READONLY, NULL},
	{NULL, 0, 0, 0, NULL},
};

static PyGetSetDef layout_getset[] = {
	{"dtype", layout_dtype_get, NULL,
	 "element type name: f16, bf16, f32, int8, ..., e4m3-raw, e5m2-raw", NULL},
	{"format", layout_format_get, NULL,
	 "page format: 'kv' (K and V per head) or 'latent' (one plane per layer)", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef layout_methods[] = {
	{"named", (PyCFunction)(void (*)(void))layout_named,
	 METH_VARARGS | METH_KEYWORDS | METH_CLASS,
	 "named(name, dtype='bf16', block_tokens=16) -> Layout: a common model's KV layout"},
	{NULL, NULL, 0, NULL},
};

PyTypeObject kvpy_layout_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Layout",
	.tp_basicsize = sizeof(struct kvpy_layout),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Layout(n_layers, n_kv_heads, head_dim, block_tokens, dtype='f16', "
		  "quant_group=0, format='kv'): the shape of a model's KV cache (struct "
		  "kvp_layout); format='latent' for MLA latents (n_kv_heads 1), dtype "
		  "'e4m3-raw' / 'e5m2-raw' for an engine's own fp8 bytes",
	.tp_new = layout_tp_new,
	.tp_repr = layout_repr,
	.tp_richcompare = layout_richcompare,
	.tp_hash = layout_hash,
	.tp_members = layout_members,
	.tp_getset = layout_getset,
	.tp_methods = layout_methods,
};
