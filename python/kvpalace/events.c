/* python/kvpalace/events.c — KV events in Python: Client.subscribe_events
 * and Client.read_events over kvp_events_subscribe and kvp_events_read,
 * with the GIL released while they wait. An event is a dict, as a router
 * would keep it; the subscribed connection is for events only (the
 * library refuses its other calls with Busy).
 */
#include <errno.h>

#include "kvpy.h"

struct sub_arg {
	kvp_client *c;
	uint64_t pool_id;
	uint64_t next;
};

static int do_subscribe(void *a)
{
	struct sub_arg *sa = a;

	return kvp_events_subscribe(sa->c, sa->pool_id, &sa->next);
}

PyObject *kvpy_client_subscribe_events(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"pool_id", NULL};
	struct kvpy_client *o = (struct kvpy_client *)self;
	struct sub_arg sa = {0};
	unsigned long long pool_id = 0;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|K:subscribe_events", kwlist, &pool_id))
		return NULL;
	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	sa.c = o->c;
	sa.pool_id = pool_id;
	if (kvpy_call_raise(&o->node, do_subscribe, &sa) < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(sa.next);
}

struct read_arg {
	kvp_client *c;
	int timeout_ms;
	struct kvp_event *ev;
	size_t n;
	uint64_t lost;
};

static int do_read(void *a)
{
	struct read_arg *ra = a;

	return kvp_events_read(ra->c, ra->timeout_ms, &ra->ev, &ra->n, &ra->lost);
}

static const char *kind_name(uint32_t kind)
{
	return kind == KVP_EVENT_STORED	   ? "stored"
	       : kind == KVP_EVENT_REMOVED ? "removed"
					   : "cleared";
}

static PyObject *event_dict(const struct kvp_event *e)
{
	PyObject *tokens, *parent, *tier;

	if (e->n_tokens) {
		tokens = PyList_New((Py_ssize_t)e->n_tokens);
		for (size_t i = 0; tokens && i < e->n_tokens; i++) {
			PyObject *t = PyLong_FromUnsignedLong(e->tokens[i]);

			if (!t) {
				Py_CLEAR(tokens);
				break;
			}
			PyList_SET_ITEM(tokens, (Py_ssize_t)i, t);
		}
		if (!tokens)
			return NULL;
	} else {
		tokens = Py_NewRef(Py_None);
	}
	parent = e->has_parent ? PyBytes_FromStringAndSize((const char *)e->parent, 16)
			       : Py_NewRef(Py_None);
	tier = e->kind == KVP_EVENT_CLEARED
		       ? Py_NewRef(Py_None)
		       : PyUnicode_FromString(e->tier == KVP_TIER_DISK ? "disk" : "host");
	if (!parent || !tier) {
		Py_XDECREF(parent);
		Py_XDECREF(tier);
		Py_DECREF(tokens);
		return NULL;
	}
	return Py_BuildValue(
		"{sssKsKsNsNsNsIsN}", "kind", kind_name(e->kind), "seq", (unsigned long long)e->seq,
		"pool_id", (unsigned long long)e->pool_id, "tier", tier, "hash",
		e->kind == KVP_EVENT_CLEARED ? Py_NewRef(Py_None)
					     : PyBytes_FromStringAndSize((const char *)e->hash, 16),
		"parent", parent, "block_tokens", (unsigned int)e->block_tokens, "tokens", tokens);
}

PyObject *kvpy_client_read_events(PyObject *self, PyObject *args, PyObject *kw)
{
	static char *kwlist[] = {"timeout", NULL};
	struct kvpy_client *o = (struct kvpy_client *)self;
	struct read_arg ra = {0};
	PyObject *timeout = Py_None, *list;
	int ret;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:read_events", kwlist, &timeout))
		return NULL;
	if (kvpy_node_check(&o->node) < 0)
		return NULL;
	if (kvpy_timeout_ms(timeout, &ra.timeout_ms) < 0)
		return NULL;
	ra.c = o->c;
	ret = kvpy_call_raise(&o->node, do_read, &ra);
	if (ret < 0)
		return NULL;
	list = PyList_New(0);
	for (size_t i = 0; list && i < ra.n; i++) {
		PyObject *d = event_dict(&ra.ev[i]);

		if (!d || PyList_Append(list, d) < 0)
			Py_CLEAR(list);
		Py_XDECREF(d);
	}
	kvp_events_free(ra.ev);
	if (!list)
		return NULL;
	return Py_BuildValue("(NK)", list, (unsigned long long)ra.lost);
}
