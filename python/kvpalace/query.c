/* python/kvpalace/query.c — what a match or a lookup asks, from Python
 * arguments into libkvpalace's structs: the keys a call may carry besides
 * its tokens (client/kvpalace.h: a salt, an extra key such as a LoRA
 * adapter's id, and key spans, the content hashes of multimodal inputs
 * over the placeholder tokens they stand behind), and batches of lookup
 * queries with their results. The buffers stay held until the matching
 * put, so the structs may point into them with the GIL released, or, for
 * a submitted lookup, until it completes. */
#include <string.h>

#include "kvpy.h"

/* A key argument: None, or 1..64 bytes (what for, in the message). */
static int key_get(PyObject *o, Py_buffer *v, int *has, const char *what)
{
	*has = 0;
	if (!o || o == Py_None)
		return 0;
	if (PyObject_GetBuffer(o, v, PyBUF_SIMPLE) < 0)
		return -1;
	if (v->len < 1 || v->len > 64) {
		PyErr_Format(PyExc_ValueError, "%s is 1..64 bytes, not %zd", what, v->len);
		PyBuffer_Release(v);
		return -1;
	}
	*has = 1;
	return 0;
}

static int spans_get(PyObject *o, struct kvpy_keys *k)
{
	PyObject *seq = PySequence_Fast(o, "key_spans must be a sequence of "
					   "(first_token, n_tokens, key) tuples");
	Py_ssize_t n;

	if (!seq)
		return -1;
	n = PySequence_Fast_GET_SIZE(seq);
	k->spans = PyMem_Calloc((size_t)n + 1, sizeof(*k->spans));
	k->span_keys = PyMem_Calloc((size_t)n + 1, sizeof(*k->span_keys));
	if (!k->spans || !k->span_keys) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		unsigned long long first, len;
		PyObject *key;
		int has;

		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i),
				      "KKO;a key span is "
				      "(first_token, n_tokens, key)",
				      &first, &len, &key) ||
		    key_get(key, &k->span_keys[i], &has, "a span's key") < 0) {
			Py_DECREF(seq);
			return -1;
		}
		if (!has) {
			Py_DECREF(seq);
			PyErr_SetString(PyExc_ValueError, "a span's key is 1..64 bytes, not None");
			return -1;
		}
		k->n_spans++;
		k->spans[i].first_token = first;
		k->spans[i].n_tokens = len;
		k->spans[i].key = k->span_keys[i].buf;
		k->spans[i].key_len = (size_t)k->span_keys[i].len;
	}
	Py_DECREF(seq);
	return 0;
}

int kvpy_keys_get(PyObject *salt, PyObject *extra, PyObject *spans, struct kvpy_keys *k)
{
	memset(k, 0, sizeof(*k));
	if (kvpy_salt_get(salt, &k->salt, &k->has_salt) < 0)
		return -1;
	if (key_get(extra, &k->extra, &k->has_extra, "an extra key") < 0 ||
	    (spans && spans != Py_None && spans_get(spans, k) < 0)) {
		kvpy_keys_put(k);
		return -1;
	}
	return 0;
}

void kvpy_keys_put(struct kvpy_keys *k)
{
	if (k->has_salt)
		PyBuffer_Release(&k->salt);
	if (k->has_extra)
		PyBuffer_Release(&k->extra);
	for (size_t i = 0; i < k->n_spans; i++)
		PyBuffer_Release(&k->span_keys[i]);
	PyMem_Free(k->spans);
	PyMem_Free(k->span_keys);
	memset(k, 0, sizeof(*k));
}

void kvpy_keys_match_opts(const struct kvpy_keys *k, struct kvp_match_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	if (k->has_salt) {
		o->salt = k->salt.len ? k->salt.buf : "";
		o->salt_len = (size_t)k->salt.len;
	}
	if (k->has_extra) {
		o->extra_key = k->extra.buf;
		o->extra_key_len = (size_t)k->extra.len;
	}
	o->spans = k->spans;
	o->n_spans = k->n_spans;
}

void kvpy_keys_query(const struct kvpy_keys *k, struct kvp_lookup_query *q)
{
	struct kvp_match_opts o;

	kvpy_keys_match_opts(k, &o);
	q->salt = o.salt;
	q->salt_len = o.salt_len;
	q->extra_key = o.extra_key;
	q->extra_key_len = o.extra_key_len;
	q->spans = o.spans;
	q->n_spans = o.n_spans;
}

/* A per-prompt argument: None, or a sequence as long as the prompts. */
static int per_prompt(PyObject *o, Py_ssize_t n, const char *what, PyObject **ret)
{
	*ret = NULL;
	if (!o || o == Py_None)
		return 0;
	*ret = PySequence_Fast(o, what);
	if (!*ret)
		return -1;
	if (PySequence_Fast_GET_SIZE(*ret) != n) {
		PyErr_Format(PyExc_ValueError, "%s: as many as prompts", what);
		Py_CLEAR(*ret);
		return -1;
	}
	return 0;
}

int kvpy_batch_get(PyObject *prompts, PyObject *salts, PyObject *extras, PyObject *spans,
		   struct kvpy_batch *b)
{
	PyObject *pseq, *sseq = NULL, *eseq = NULL, *kseq = NULL;
	int ret = -1;

	memset(b, 0, sizeof(*b));
	pseq = PySequence_Fast(prompts, "prompts must be a sequence of token sequences");
	if (!pseq)
		return -1;
	b->n = PySequence_Fast_GET_SIZE(pseq);
	if (per_prompt(salts, b->n, "salts must be a sequence (None: the pool's salt)", &sseq) <
		    0 ||
	    per_prompt(extras, b->n, "extra_keys must be a sequence (None: none)", &eseq) < 0 ||
	    per_prompt(spans, b->n, "key_spans must be a sequence of span lists (None: none)",
		       &kseq) < 0)
		goto out;
	b->tk = PyMem_Calloc((size_t)b->n + 1, sizeof(*b->tk));
	b->keys = PyMem_Calloc((size_t)b->n + 1, sizeof(*b->keys));
	b->q = PyMem_Calloc((size_t)b->n + 1, sizeof(*b->q));
	b->r = PyMem_Calloc((size_t)b->n + 1, sizeof(*b->r));
	if (!b->tk || !b->keys || !b->q || !b->r) {
		PyErr_NoMemory();
		goto out;
	}
	for (; b->got < b->n; b->got++) {
		Py_ssize_t i = b->got;

		if (kvpy_tokens_get(PySequence_Fast_GET_ITEM(pseq, i), &b->tk[i]) < 0)
			goto out;
		if (kvpy_keys_get(sseq ? PySequence_Fast_GET_ITEM(sseq, i) : NULL,
				  eseq ? PySequence_Fast_GET_ITEM(eseq, i) : NULL,
				  kseq ? PySequence_Fast_GET_ITEM(kseq, i) : NULL,
				  &b->keys[i]) < 0) {
			kvpy_tokens_put(&b->tk[i]);
			goto out;
		}
		b->q[i].tokens = b->tk[i].t;
		b->q[i].n_tokens = b->tk[i].n;
		kvpy_keys_query(&b->keys[i], &b->q[i]);
	}
	ret = 0;
out:
	Py_DECREF(pseq);
	Py_XDECREF(sseq);
	Py_XDECREF(eseq);
	Py_XDECREF(kseq);
	if (ret < 0)
		kvpy_batch_put(b);
	return ret;
}

void kvpy_batch_put(struct kvpy_batch *b)
{
	for (Py_ssize_t i = 0; i < b->got; i++) {
		kvpy_tokens_put(&b->tk[i]);
		kvpy_keys_put(&b->keys[i]);
	}
	PyMem_Free(b->tk);
	PyMem_Free(b->keys);
	PyMem_Free(b->q);
	PyMem_Free(b->r);
	memset(b, 0, sizeof(*b));
}

PyObject *kvpy_batch_results(const struct kvpy_batch *b)
{
	PyObject *out = PyList_New(b->n);

	for (Py_ssize_t i = 0; out && i < b->n; i++) {
		PyObject *t = Py_BuildValue("(KK)", (unsigned long long)b->r[i].matched_tokens,
					    (unsigned long long)b->r[i].host_tokens);

		if (!t)
			Py_CLEAR(out);
		else
			PyList_SET_ITEM(out, i, t);
	}
	return out;
}
