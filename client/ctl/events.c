/* client/ctl/events.c — kvpalacectl events (see events.h): one line per
 * KV event as it comes, or one JSON object per line with --json, flushed
 * as they come so that a pipe sees them at once. Lost events (this reader
 * fell behind the daemon's ring) are said as a line of their own.
 */
#include <stdio.h>
#include <stdlib.h>

#include "events.h"
#include "jdoc.h"

static const char *kind_name(uint32_t kind)
{
	switch (kind) {
	case KVP_EVENT_STORED:
		return "stored";
	case KVP_EVENT_REMOVED:
		return "removed";
	default:
		return "cleared";
	}
}

static void hex(const uint8_t *b, char *out)
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int print_event(const struct kvp_event *e, int json)
{
	char h[33], ph[33];

	hex(e->hash, h);
	hex(e->parent, ph);
	if (json) {
		json_t *doc = jdoc_object();

		jdoc_u64(doc, "seq", e->seq);
		jdoc_str(doc, "kind", kind_name(e->kind));
		jdoc_u64(doc, "pool", e->pool_id);
		if (e->kind != KVP_EVENT_CLEARED) {
			jdoc_str(doc, "tier", e->tier == KVP_TIER_DISK ? "disk" : "host");
			jdoc_str(doc, "hash", h);
			if (e->has_parent)
				jdoc_str(doc, "parent", ph);
			jdoc_u64(doc, "block_tokens", e->block_tokens);
			if (e->n_tokens)
				jdoc_set(doc, "tokens", jdoc_u32_array(e->tokens, e->n_tokens));
		}
		return jdoc_print(stdout, doc);
	}
	if (e->kind == KVP_EVENT_CLEARED)
		return printf("%llu cleared pool %llu\n", (unsigned long long)e->seq,
			      (unsigned long long)e->pool_id) < 0
			       ? -1
			       : 0;
	return printf("%llu %s pool %llu %s %s%s%s%s\n", (unsigned long long)e->seq,
		      kind_name(e->kind), (unsigned long long)e->pool_id,
		      e->tier == KVP_TIER_DISK ? "disk" : "host", h,
		      e->has_parent ? " parent " : "", e->has_parent ? ph : "",
		      e->n_tokens ? " (tokens)" : "") < 0
		       ? -1
		       : 0;
}

int cmd_events(kvp_client *c, const struct args *a)
{
	uint32_t seen = 0;
	int ret;

	ret = kvp_events_subscribe(c, (a->given & OPT_POOL) ? a->pool_id : 0, NULL);
	if (ret < 0)
		return fail(c, a->name, ret);
	for (;;) {
		struct kvp_event *ev;
		uint64_t lost;
		size_t n;

		ret = kvp_events_read(c, -1, &ev, &n, &lost);
		if (ret < 0)
			return fail(c, a->name, ret);
		if (ret == 0)
			continue;
		if (lost && !a->json)
			printf("lost %llu events (this reader fell behind)\n",
			       (unsigned long long)lost);
		if (lost && a->json) {
			json_t *doc = jdoc_object();

			jdoc_u64(doc, "lost", lost);
			jdoc_print(stdout, doc);
		}
		for (size_t i = 0; i < n; i++) {
			if (print_event(&ev[i], a->json) < 0) {
				kvp_events_free(ev);
				return EXIT_DAEMON;
			}
			if (a->count && ++seen == a->count) {
				kvp_events_free(ev);
				fflush(stdout);
				return 0;
			}
		}
		kvp_events_free(ev);
		if (fflush(stdout) == EOF)
			return EXIT_DAEMON;
	}
}
