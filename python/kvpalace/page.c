/* python/kvpalace/page.c — kvpalace.Page: one page of a session (writable)
 * or of a lease (read-only) as struct kvp_page_view gives it, and the
 * buffer protocol over its page_bytes in the shared arena, which array()
 * (numpy) and tensor() (torch, imported when first asked) view without a
 * copy. Each exported buffer pins the owner (see kvpy.h): the owner's C
 * handle, and with it the mapping, lives until the last view is released.
 * A Page of a session goes stale at the session's next commit or truncate
 * (see session.c): it then refuses to export. */
#include <errno.h>
#include <string.h>

#include "kvpy.h"

const struct kvp_layout *kvpy_owner_layout(struct kvpy_node *owner)
{
	return kvp_pool_layout(((struct kvpy_pool *)owner->parent)->p);
}

PyObject *kvpy_page_new(struct kvpy_node *owner, uint64_t index, uint64_t generation, int writable,
			const struct kvp_page_view *v)
{
	struct kvpy_page *pg = PyObject_New(struct kvpy_page, &kvpy_page_type);

	if (!pg)
		return NULL;
	Py_INCREF(owner);
	pg->owner = owner;
	pg->index = index;
	pg->generation = generation;
	pg->writable = writable;
	pg->layout = *kvpy_owner_layout(owner);
	pg->v = *v;
	return (PyObject *)pg;
}

static void page_dealloc(PyObject *o)
{
	struct kvpy_page *pg = (struct kvpy_page *)o;

	Py_XDECREF(pg->owner);
	PyObject_Free(o);
}

/* 0 when the page may be viewed, else ValueError. */
static int page_check(struct kvpy_page *pg)
{
	if (kvpy_node_check(pg->owner) < 0)
		return -1;
	if (pg->owner->kind == KVPY_SESSION &&
	    ((struct kvpy_session *)pg->owner)->generation != pg->generation) {
		PyErr_SetString(PyExc_ValueError,
				"stale page: the session committed or truncated since; ask "
				"page(i) again");
		return -1;
	}
	return 0;
}

static int page_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
	struct kvpy_page *pg = (struct kvpy_page *)self;

	if (page_check(pg) < 0)
		return -1;
	if ((flags & PyBUF_WRITABLE) && !pg->writable) {
		PyErr_SetString(PyExc_BufferError, "a lease's pages are read-only");
		return -1;
	}
	if (PyBuffer_FillInfo(view, self, pg->v.base, (Py_ssize_t)pg->v.page_bytes, !pg->writable,
			      flags) < 0)
		return -1;
	pg->owner->exports++;
	pg->owner->pins++;
	return 0;
}

static void page_releasebuffer(PyObject *self, Py_buffer *view)
{
	struct kvpy_page *pg = (struct kvpy_page *)self;

	pg->owner->exports--;
	kvpy_node_unpin(pg->owner);
}

static PyBufferProcs page_buffer = {
	.bf_getbuffer = page_getbuffer,
	.bf_releasebuffer = page_releasebuffer,
};

/* The element type name for numpy (np) or torch, the item size, and the
 * shape [n_layers, 2, n_kv_heads, block_tokens, last] ([n_layers,
 * block_tokens, last] for a latent layout). The raw fp8 types are bytes
 * (uint8: no fp8 in numpy), one element each. */
static const char *page_elem(const struct kvpy_page *pg, int torch, size_t *itemsize,
			     Py_ssize_t *last)
{
	const struct kvp_layout *l = &pg->layout;

	*last = l->head_dim;
	switch (l->dtype) {
	case KVP_DTYPE_F16:
		*itemsize = 2;
		return "float16";
	case KVP_DTYPE_BF16:
		*itemsize = 2;
		return torch ? "bfloat16" : "uint16";
	case KVP_DTYPE_F32:
		*itemsize = 4;
		return "float32";
	default:
		/* Quantized: the data region's bytes, one token's row each. */
		*itemsize = 1;
		*last = (Py_ssize_t)pg->v.row_bytes;
		return "uint8";
	}
}

static PyObject *page_view(struct kvpy_page *pg, int torch)
{
	const struct kvp_layout *l = &pg->layout;
	PyObject *mod = NULL, *dt = NULL, *mv = NULL, *flat = NULL, *out = NULL;
	PyObject *warnings = NULL, *cm = NULL, *r;
	size_t itemsize;
	Py_ssize_t last;
	const char *name = page_elem(pg, torch, &itemsize, &last);
	Py_ssize_t count = (Py_ssize_t)(pg->v.data_bytes / itemsize);

	if (page_check(pg) < 0)
		return NULL;
	mod = PyImport_ImportModule(torch ? "torch" : "numpy");
	if (!mod)
		return NULL;
	dt = PyObject_GetAttrString(mod, name);
	if (!dt)
		goto out;
	/* A memoryview holds the export for as long as numpy or torch
	 * keeps it (torch releases its own buffer at once and keeps the
	 * object). */
	mv = PyMemoryView_FromObject((PyObject *)pg);
	if (!mv)
		goto out;
	if (torch && !pg->writable) {
		/* torch warns that it has no read-only tensors; the tensor of a
		 * lease page must not be written, as the array's cannot be. */
		warnings = PyImport_ImportModule("warnings");
		if (!warnings)
			goto out;
		cm = PyObject_CallMethod(warnings, "catch_warnings", NULL);
		if (!cm)
			goto out;
		r = PyObject_CallMethod(cm, "__enter__", NULL);
		if (!r)
			goto out;
		Py_DECREF(r);
		r = PyObject_CallMethod(warnings, "simplefilter", "s", "ignore");
		Py_XDECREF(r);
	}
	{
		PyObject *fn = PyObject_GetAttrString(mod, "frombuffer");
		PyObject *args = Py_BuildValue("(O)", mv);
		PyObject *kw = Py_BuildValue("{sOsn}", "dtype", dt, "count", count);

		if (fn && args && kw)
			flat = PyObject_Call(fn, args, kw);
		Py_XDECREF(fn);
		Py_XDECREF(args);
		Py_XDECREF(kw);
	}
	if (cm) {
		PyObject *et, *ev, *tb;

		PyErr_Fetch(&et, &ev, &tb);
		r = PyObject_CallMethod(cm, "__exit__", "OOO", Py_None, Py_None, Py_None);
		Py_XDECREF(r);
		PyErr_Restore(et, ev, tb);
	}
	if (!flat)
		goto out;
	if (l->format == KVP_FORMAT_LATENT)
		out = PyObject_CallMethod(flat, "reshape", "(nnn)", (Py_ssize_t)l->n_layers,
					  (Py_ssize_t)l->block_tokens, last);
	else
		out = PyObject_CallMethod(flat, "reshape", "(nnnnn)", (Py_ssize_t)l->n_layers,
					  (Py_ssize_t)2, (Py_ssize_t)l->n_kv_heads,
					  (Py_ssize_t)l->block_tokens, last);
out:
	Py_XDECREF(flat);
	Py_XDECREF(cm);
	Py_XDECREF(warnings);
	Py_XDECREF(mv);
	Py_XDECREF(dt);
	Py_XDECREF(mod);
	return out;
}

static PyObject *page_array(PyObject *self, PyObject *unused)
{
	return page_view((struct kvpy_page *)self, 0);
}

static PyObject *page_tensor(PyObject *self, PyObject *unused)
{
	return page_view((struct kvpy_page *)self, 1);
}

static PyObject *page_strides(PyObject *self, void *unused)
{
	const struct kvp_page_view *v = &((struct kvpy_page *)self)->v;
	size_t scales = v->scales ? (size_t)((char *)v->scales - (char *)v->base) : 0;

	return Py_BuildValue(
		"{snsnsnsnsnsnsnsnsnsnsnsnsn}", "row_bytes", (Py_ssize_t)v->row_bytes,
		"token_stride", (Py_ssize_t)v->token_stride, "head_stride",
		(Py_ssize_t)v->head_stride, "kv_stride", (Py_ssize_t)v->kv_stride, "layer_stride",
		(Py_ssize_t)v->layer_stride, "data_bytes", (Py_ssize_t)v->data_bytes, "page_bytes",
		(Py_ssize_t)v->page_bytes, "scales_offset", (Py_ssize_t)scales, "scale_row_bytes",
		(Py_ssize_t)v->scale_row_bytes, "scale_token_stride",
		(Py_ssize_t)v->scale_token_stride, "scale_head_stride",
		(Py_ssize_t)v->scale_head_stride, "scale_kv_stride", (Py_ssize_t)v->scale_kv_stride,
		"scale_layer_stride", (Py_ssize_t)v->scale_layer_stride);
}

static PyObject *page_get(PyObject *self, void *which)
{
	struct kvpy_page *pg = (struct kvpy_page *)self;

	switch ((int)(intptr_t)which) {
	case 0:
		return PyLong_FromUnsignedLong(pg->v.n_tokens);
	case 1:
		return PyLong_FromUnsignedLongLong(pg->v.first_pos);
	case 2:
		return PyLong_FromUnsignedLong(pg->v.slot);
	case 3:
		return PyLong_FromUnsignedLongLong(pg->index);
	case 4:
		return PyBool_FromLong(pg->writable);
	}
	Py_RETURN_NONE;
}

static PyMethodDef page_methods[] = {
	{"array", page_array, METH_NOARGS,
	 "array() -> numpy.ndarray [n_layers, 2, n_kv_heads, block_tokens, head_dim] "
	 "([n_layers, block_tokens, head_dim] for a latent layout) over the "
	 "page's data, no copy (bf16: uint16; quantized: uint8 rows of row_bytes)"},
	{"tensor", page_tensor, METH_NOARGS,
	 "tensor() -> torch.Tensor of the same shape, no copy (bf16: torch.bfloat16)"},
	{NULL, NULL, 0, NULL},
};

static PyGetSetDef page_getset[] = {
	{"n_tokens", page_get, NULL, "tokens of the page held", (void *)0},
	{"first_pos", page_get, NULL, "position of the page's token 0", (void *)1},
	{"slot", page_get, NULL, "the page's slot in the arena", (void *)2},
	{"index", page_get, NULL, "the page's index in its session or lease", (void *)3},
	{"writable", page_get, NULL, "a session's page (a lease's is read-only)", (void *)4},
	{"strides", page_strides, NULL, "struct kvp_page_view's strides, in bytes", NULL},
	{NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject kvpy_page_type = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvpalace.Page",
	.tp_basicsize = sizeof(struct kvpy_page),
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One page of a session or a lease: Session.page(i), Lease.page(i); a buffer "
		  "of page_bytes",
	.tp_dealloc = page_dealloc,
	.tp_as_buffer = &page_buffer,
	.tp_methods = page_methods,
	.tp_getset = page_getset,
};
