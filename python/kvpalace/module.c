/* python/kvpalace/module.c — the _kvpalace extension module: its
 * functions (version, layout_names), the exception classes and the
 * conversions the object files share (errors, dtypes, tokens, salts).
 *
 * The error classes: Error(OSError) carries the errno and the daemon's
 * message (kvp_strerror); NotFound (ENOENT, also a FileNotFoundError),
 * Busy (EBUSY), QuotaExceeded (EDQUOT), NoSpace (ENOSPC), ConnectionLost
 * (ENOTCONN, EPIPE, ECONNRESET; also a ConnectionError) and ForkedChild
 * (ECHILD: a client used in a forked child; also a ChildProcessError)
 * subclass it. Runs holding the GIL.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "kvpy.h"

static PyObject *err_base, *err_notfound, *err_busy, *err_quota, *err_nospace, *err_connlost,
	*err_child;

PyObject *kvpy_raise(int err, const char *msg)
{
	PyObject *cls = err_base, *exc;
	int e = err < 0 ? -err : err;

	switch (e) {
	case ENOENT:
		cls = err_notfound;
		break;
	case EBUSY:
		cls = err_busy;
		break;
	case EDQUOT:
		cls = err_quota;
		break;
	case ENOSPC:
		cls = err_nospace;
		break;
	case ENOTCONN:
	case EPIPE:
	case ECONNRESET:
		cls = err_connlost;
		break;
	case ECHILD:
		cls = err_child;
		break;
	}
	exc = PyObject_CallFunction(cls, "is", e, msg && *msg ? msg : strerror(e));
	if (exc) {
		PyErr_SetObject(cls, exc);
		Py_DECREF(exc);
	}
	return NULL;
}

/* The names Layout(dtype=) takes; "e4m3_raw" and "e5m2_raw" work too. */
static const char *const dtype_names[] = {
	[KVP_DTYPE_F16] = "f16",	   [KVP_DTYPE_BF16] = "bf16",
	[KVP_DTYPE_F32] = "f32",	   [KVP_DTYPE_INT8] = "int8",
	[KVP_DTYPE_FP8_E4M3] = "fp8_e4m3", [KVP_DTYPE_INT4] = "int4",
	[KVP_DTYPE_E4M3_RAW] = "e4m3-raw", [KVP_DTYPE_E5M2_RAW] = "e5m2-raw",
};
#define N_DTYPES (sizeof(dtype_names) / sizeof(dtype_names[0]))

const char *kvpy_dtype_name(uint32_t dtype)
{
	return dtype < N_DTYPES && dtype_names[dtype] ? dtype_names[dtype] : "unknown";
}

int kvpy_dtype_parse(PyObject *o, uint32_t *ret)
{
	const char *s;

	if (!PyUnicode_Check(o)) {
		PyErr_SetString(PyExc_TypeError, "dtype must be a str (\"f16\", \"bf16\", ...)");
		return -1;
	}
	s = PyUnicode_AsUTF8(o);
	if (!s)
		return -1;
	for (uint32_t i = 1; i < N_DTYPES; i++) {
		const char *n = dtype_names[i];
		size_t k = strlen(n);

		/* "e4m3_raw" for "e4m3-raw": the raw names' one '-' either way. */
		if (strcmp(s, n) == 0 || (k > 4 && strlen(s) == k && !strcmp(n + k - 4, "-raw") &&
					  !strncmp(s, n, k - 4) && !strcmp(s + k - 4, "_raw"))) {
			*ret = i;
			return 0;
		}
	}
	PyErr_Format(PyExc_ValueError,
		     "unknown dtype %R (f16, bf16, f32, int8, fp8_e4m3, int4, e4m3-raw, e5m2-raw)",
		     o);
	return -1;
}

static const uint32_t no_tokens[1];

static int buffer_is_u32(const Py_buffer *v)
{
	const char *f = v->format ? v->format : "B";

	if (v->itemsize != 4 || v->ndim > 1)
		return 0;
	if (*f == '@' || *f == '=' || *f == '<')
		f++;
	return strcmp(f, "I") == 0 || (strcmp(f, "L") == 0 && sizeof(long) == 4);
}

int kvpy_tokens_get(PyObject *o, struct kvpy_tokens *tk)
{
	PyObject *seq;
	Py_ssize_t n;

	memset(tk, 0, sizeof(*tk));
	tk->t = no_tokens;
	if (PyBytes_Check(o) || PyByteArray_Check(o) || PyUnicode_Check(o)) {
		PyErr_SetString(PyExc_TypeError,
				"tokens must be ints or a uint32 buffer, not bytes or str");
		return -1;
	}
	if (PyObject_CheckBuffer(o)) {
		if (PyObject_GetBuffer(o, &tk->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
			if (buffer_is_u32(&tk->view)) {
				tk->has_view = 1;
				tk->n = (size_t)tk->view.len / 4;
				if (tk->n)
					tk->t = tk->view.buf;
				return 0;
			}
			PyBuffer_Release(&tk->view);
		} else {
			PyErr_Clear();
		}
	}
	seq = PySequence_Fast(o, "tokens must be a sequence of ints or a uint32 buffer");
	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	if (n > 0) {
		tk->owned = PyMem_Malloc((size_t)n * sizeof(uint32_t));
		if (!tk->owned) {
			Py_DECREF(seq);
			PyErr_NoMemory();
			return -1;
		}
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *idx = PyNumber_Index(PySequence_Fast_GET_ITEM(seq, i));
		long long v;
		int overflow;

		if (!idx)
			goto fail;
		v = PyLong_AsLongLongAndOverflow(idx, &overflow);
		Py_DECREF(idx);
		if (v == -1 && PyErr_Occurred())
			goto fail;
		if (overflow < 0 || v < 0) {
			PyErr_Format(PyExc_ValueError, "token %zd is negative", i);
			goto fail;
		}
		if (overflow > 0 || v > UINT32_MAX) {
			PyErr_Format(PyExc_OverflowError, "token %zd does not fit 32 bits", i);
			goto fail;
		}
		tk->owned[i] = (uint32_t)v;
	}
	Py_DECREF(seq);
	tk->n = (size_t)n;
	if (n)
		tk->t = tk->owned;
	return 0;
fail:
	Py_DECREF(seq);
	PyMem_Free(tk->owned);
	tk->owned = NULL;
	return -1;
}

void kvpy_tokens_put(struct kvpy_tokens *tk)
{
	if (tk->has_view)
		PyBuffer_Release(&tk->view);
	PyMem_Free(tk->owned);
	tk->owned = NULL;
	tk->has_view = 0;
}

int kvpy_salt_get(PyObject *o, Py_buffer *view, int *has)
{
	*has = 0;
	if (!o || o == Py_None)
		return 0;
	if (PyObject_GetBuffer(o, view, PyBUF_SIMPLE) < 0)
		return -1;
	if (view->len > 64) {
		PyBuffer_Release(view);
		PyErr_SetString(PyExc_ValueError, "a salt is at most 64 bytes");
		return -1;
	}
	*has = 1;
	return 0;
}

static PyObject *mod_version(PyObject *self, PyObject *unused)
{
	return PyUnicode_FromString(kvp_version(NULL, NULL, NULL));
}

static PyObject *mod_layout_names(PyObject *self, PyObject *unused)
{
	PyObject *list = PyList_New(0);
	const char *name;

	if (!list)
		return NULL;
	for (size_t i = 0; (name = kvp_layout_name(i, NULL)); i++) {
		PyObject *s = PyUnicode_FromString(name);

		if (!s || PyList_Append(list, s) < 0) {
			Py_XDECREF(s);
			Py_DECREF(list);
			return NULL;
		}
		Py_DECREF(s);
	}
	return list;
}

static PyMethodDef mod_methods[] = {
	{"version", mod_version, METH_NOARGS, "version() -> str: libkvpalace's version"},
	{"layout_names", mod_layout_names, METH_NOARGS,
	 "layout_names() -> list[str]: the models Layout.named() knows"},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef mod_def = {
	PyModuleDef_HEAD_INIT, "_kvpalace", "libkvpalace bindings (use the kvpalace package)", -1,
	mod_methods,
};

static PyObject *new_error(PyObject *m, const char *name, PyObject *extra, const char *doc)
{
	char full[64];
	PyObject *bases, *cls;

	snprintf(full, sizeof(full), "kvpalace.%s", name);
	bases = extra ? PyTuple_Pack(2, err_base, extra) : PyTuple_Pack(1, err_base);
	if (!bases)
		return NULL;
	cls = PyErr_NewExceptionWithDoc(full, doc, bases, NULL);
	Py_DECREF(bases);
	if (cls && PyModule_AddObjectRef(m, name, cls) < 0)
		Py_CLEAR(cls);
	return cls;
}

static void after_fork_child(void)
{
	kvpy_fork_gen++;
}

PyMODINIT_FUNC PyInit__kvpalace(void);
PyMODINIT_FUNC PyInit__kvpalace(void)
{
	PyTypeObject *types[] = {&kvpy_layout_type,  &kvpy_client_type, &kvpy_pool_type,
				 &kvpy_session_type, &kvpy_lease_type,	&kvpy_page_type};
	static const char *const names[] = {"Layout", "Client", "Pool", "Session", "Lease", "Page"};
	PyObject *m = PyModule_Create(&mod_def);

	if (!m)
		return NULL;
	if (pthread_atfork(NULL, NULL, after_fork_child) != 0) {
		Py_DECREF(m);
		return PyErr_NoMemory();
	}
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
		if (PyType_Ready(types[i]) < 0 ||
		    PyModule_AddObjectRef(m, names[i], (PyObject *)types[i]) < 0)
			goto fail;
	err_base = PyErr_NewExceptionWithDoc(
		"kvpalace.Error", "A libkvpalace call failed: errno and the daemon's message",
		PyExc_OSError, NULL);
	if (!err_base || PyModule_AddObjectRef(m, "Error", err_base) < 0)
		goto fail;
	if (!(err_notfound = new_error(m, "NotFound", PyExc_FileNotFoundError, "ENOENT")) ||
	    !(err_busy = new_error(m, "Busy", NULL, "EBUSY")) ||
	    !(err_quota = new_error(m, "QuotaExceeded", NULL, "EDQUOT")) ||
	    !(err_nospace = new_error(m, "NoSpace", NULL, "ENOSPC")) ||
	    !(err_connlost = new_error(m, "ConnectionLost", PyExc_ConnectionError,
				       "ENOTCONN, EPIPE, ECONNRESET")) ||
	    !(err_child = new_error(m, "ForkedChild", PyExc_ChildProcessError,
				    "ECHILD: a client used in a forked child; connect anew there")))
		goto fail;
	return m;
fail:
	Py_DECREF(m);
	return NULL;
}
