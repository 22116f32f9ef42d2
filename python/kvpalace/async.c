/* python/kvpalace/async.c — submitted lookups and prefetches
 * (kvp_lookup_submit, kvp_prefetch_submit) and their completions
 * (kvp_complete), for a scheduler that polls Client.fileno() among its
 * own descriptors instead of blocking on one round trip per request.
 *
 * A submitted operation's memory (queries, tokens, keys, results) must
 * stay valid until it completes, so each lives in a record of its
 * client's (struct kvpy_op, at most KVP_ASYNC_MAX) under a handle that
 * Client.complete() reports. A record holds no Python object (a
 * forgotten operation keeps nothing alive), only its pool's life
 * (struct kvpy_pool_life): once the pool's C handle is freed (closed, or
 * its object gone) libkvpalace has dropped its operations, which never
 * complete, and the record is dropped at the next submit or complete;
 * when the connection is freed, every record goes (kvpy_async_forget).
 * Not before: the library may still read the queries of a long batch.
 * Runs holding the GIL.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "kvpy.h"

struct kvpy_op {
	uint64_t handle;
	uint32_t op; /* enum kvp_async_op */
	struct kvpy_pool_life *life;
	struct kvpy_batch b;
	struct kvpy_tokens tk;
};

static void op_free(struct kvpy_op *o)
{
	if (o->op == KVP_ASYNC_LOOKUP)
		kvpy_batch_put(&o->b);
	else
		kvpy_tokens_put(&o->tk);
	if (o->life)
		kvpy_pool_life_put(o->life);
	PyMem_Free(o);
}

void kvpy_pool_life_put(struct kvpy_pool_life *life)
{
	if (--life->refs == 0)
		PyMem_Free(life);
}

/* Whether libkvpalace still holds o: its pool's handle lives. */
static int op_live(const struct kvpy_op *o)
{
	return !o->life->freed;
}

/* Drops the records whose operations can no longer complete; returns the
 * first free slot, or -1. */
static int sweep_slots(struct kvpy_client *cl)
{
	int free_slot = -1;

	for (int i = 0; i < (int)KVP_ASYNC_MAX; i++) {
		if (cl->ops[i] && !op_live(cl->ops[i])) {
			op_free(cl->ops[i]);
			cl->ops[i] = NULL;
		}
		if (!cl->ops[i] && free_slot < 0)
			free_slot = i;
	}
	return free_slot;
}

void kvpy_async_forget(struct kvpy_client *cl)
{
	for (unsigned int i = 0; i < KVP_ASYNC_MAX; i++) {
		if (cl->ops[i])
			op_free(cl->ops[i]);
		cl->ops[i] = NULL;
	}
}

struct submit_arg {
	kvp_pool *p;
	struct kvpy_op *o;
};

static int do_submit(void *a)
{
	struct submit_arg *sa = a;
	struct kvpy_op *o = sa->o;

	if (o->op == KVP_ASYNC_LOOKUP)
		return kvp_lookup_submit(sa->p, o->b.q, (size_t)o->b.n, o->b.r, o->handle);
	return kvp_prefetch_submit(sa->p, o->tk.t, o->tk.n, o->handle);
}

/* Takes a slot for o (filled by the caller), submits it and returns its
 * handle; on an error frees o and raises. */
static PyObject *submit(struct kvpy_pool *p, struct kvpy_op *o)
{
	struct kvpy_client *cl = p->node.client;
	struct submit_arg sa = {.p = p->p, .o = o};
	int slot = sweep_slots(cl);

	if (slot < 0) {
		op_free(o);
		return kvpy_raise(-EAGAIN, "16 operations are in flight on this client: "
					   "complete() some first");
	}
	o->life = p->life;
	o->life->refs++;
	o->handle = ++cl->next_handle;
	/* In its slot before the call: the GIL is released during it. */
	cl->ops[slot] = o;
	if (kvpy_call_raise(&p->node, do_submit, &sa) < 0) {
		if (cl->ops[slot] == o)
			cl->ops[slot] = NULL;
		op_free(o);
		return NULL;
	}
	return PyLong_FromUnsignedLongLong(o->handle);
}

PyObject *kvpy_pool_lookup_submit(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"prompts", "salts", "extra_keys", "key_spans", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *prompts, *salts = Py_None, *extras = Py_None, *spans = Py_None;
	struct kvpy_op *o;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOO:lookup_submit", kwlist, &prompts, &salts,
					 &extras, &spans))
		return NULL;
	if (kvpy_node_check(&p->node) < 0)
		return NULL;
	o = PyMem_Calloc(1, sizeof(*o));
	if (!o)
		return PyErr_NoMemory();
	o->op = KVP_ASYNC_LOOKUP;
	if (kvpy_batch_get(prompts, salts, extras, spans, &o->b) < 0) {
		PyMem_Free(o);
		return NULL;
	}
	return submit(p, o);
}

PyObject *kvpy_pool_prefetch_submit(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"tokens", NULL};
	struct kvpy_pool *p = (struct kvpy_pool *)self;
	PyObject *tokens;
	struct kvpy_op *o;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "O:prefetch_submit", kwlist, &tokens))
		return NULL;
	if (kvpy_node_check(&p->node) < 0)
		return NULL;
	o = PyMem_Calloc(1, sizeof(*o));
	if (!o)
		return PyErr_NoMemory();
	o->op = KVP_ASYNC_PREFETCH;
	if (kvpy_tokens_get(tokens, &o->tk) < 0) {
		PyMem_Free(o);
		return NULL;
	}
	return submit(p, o);
}

struct complete_arg {
	kvp_client *c;
	struct kvp_completion done[KVP_ASYNC_MAX];
	int timeout_ms;
};

static int do_complete(void *a)
{
	struct complete_arg *ca = a;

	return kvp_complete(ca->c, ca->done, KVP_ASYNC_MAX, ca->timeout_ms);
}

/* The result of one completion, for the list complete() returns. */
static PyObject *op_result(struct kvpy_op *o, const struct kvp_completion *d, char *msg)
{
	PyObject *r, *exc_type, *exc, *tb;

	if (d->result >= 0)
		return o->op == KVP_ASYNC_LOOKUP ? kvpy_batch_results(&o->b)
						 : PyLong_FromLong(d->result);
	/* The error as an exception object, not raised. */
	kvpy_raise(d->result, msg);
	PyErr_Fetch(&exc_type, &exc, &tb);
	PyErr_NormalizeException(&exc_type, &exc, &tb);
	r = exc;
	Py_XDECREF(exc_type);
	Py_XDECREF(tb);
	return r;
}

int kvpy_timeout_ms(PyObject *timeout, int *ret_ms)
{
	double t;

	*ret_ms = 0;
	if (timeout == Py_None) {
		*ret_ms = -1;
		return 0;
	}
	if (!timeout)
		return 0;
	t = PyFloat_AsDouble(timeout);
	if (t == -1.0 && PyErr_Occurred())
		return -1;
	if (t < 0 || t > 86400.0) {
		PyErr_SetString(PyExc_ValueError, "timeout is 0..86400 s, or None");
		return -1;
	}
	*ret_ms = (int)(t * 1000.0 + 0.999);
	return 0;
}

PyObject *kvpy_client_complete(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"timeout", NULL};
	struct kvpy_client *cl = (struct kvpy_client *)self;
	struct complete_arg ca = {0};
	PyObject *timeout = NULL, *out;
	int n;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:complete", kwlist, &timeout))
		return NULL;
	if (kvpy_node_check(&cl->node) < 0)
		return NULL;
	if (kvpy_timeout_ms(timeout, &ca.timeout_ms) < 0)
		return NULL;
	sweep_slots(cl);
	ca.c = cl->c;
	n = kvpy_call_raise(&cl->node, do_complete, &ca);
	if (n < 0)
		return NULL;
	out = PyList_New(0);
	for (int i = 0; out && i < n; i++) {
		struct kvpy_op *o = NULL;
		PyObject *r, *item;
		int slot;

		for (slot = 0; slot < (int)KVP_ASYNC_MAX; slot++)
			if (cl->ops[slot] && cl->ops[slot]->handle == ca.done[i].user_data) {
				o = cl->ops[slot];
				break;
			}
		if (!o)
			continue; /* submitted by no record: cannot happen */
		r = op_result(o, &ca.done[i], NULL);
		item = r ? Py_BuildValue("(KN)", (unsigned long long)o->handle, r) : NULL;
		cl->ops[slot] = NULL;
		op_free(o);
		if (!item || PyList_Append(out, item) < 0)
			Py_CLEAR(out);
		Py_XDECREF(item);
	}
	return out;
}

PyObject *kvpy_client_fileno(PyObject *self, PyObject *unused)
{
	struct kvpy_client *cl = (struct kvpy_client *)self;
	int fd;

	if (kvpy_node_check(&cl->node) < 0)
		return NULL;
	fd = kvp_client_fd(cl->c);
	if (fd < 0)
		return kvpy_raise(fd, NULL);
	return PyLong_FromLong(fd);
}

struct in_flight_arg {
	kvp_client *c;
	size_t n;
};

static int do_in_flight(void *a)
{
	struct in_flight_arg *ia = a;

	ia->n = kvp_in_flight(ia->c);
	return 0;
}

PyObject *kvpy_client_in_flight(PyObject *self, void *unused)
{
	struct kvpy_client *cl = (struct kvpy_client *)self;
	struct in_flight_arg ia = {0};

	if (kvpy_node_check(&cl->node) < 0)
		return NULL;
	ia.c = cl->c;
	kvpy_call(&cl->node, do_in_flight, &ia, NULL, 0);
	return PyLong_FromSize_t(ia.n);
}
