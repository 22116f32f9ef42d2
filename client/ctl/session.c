/* client/ctl/session.c — kvpalacectl's commands on one session or pool
 * by id (see session.h): `session show` (kvp_admin_show_session), `drop
 * session` and `drop pool` (kvp_admin_drop_session, kvp_admin_drop_pool),
 * as text or JSON.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "jdoc.h"
#include "session.h"

/* Page slots `session show` lists unless --pages says otherwise. */
#define SHOW_SLOTS_DEFAULT 16u

static const char *policy_name(uint32_t kind)
{
	static const char *const names[] = {"none", "window", "sinks", "importance", "hierarchy"};

	return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

static int print_session_json(const char *path, const struct kvp_session_detail *d)
{
	const struct kvp_session_info *s = &d->info;
	json_t *doc = jdoc_object();

	jdoc_str(doc, "socket", path);
	jdoc_u64(doc, "session_id", s->session_id);
	jdoc_u64(doc, "pool_id", s->pool_id);
	jdoc_u64(doc, "uid", s->uid);
	jdoc_str(doc, "model_id", d->model_id);
	jdoc_set(doc, "layout", jdoc_layout(&d->layout));
	jdoc_u64(doc, "n_tokens", s->n_tokens);
	jdoc_u64(doc, "committed_tokens", s->committed_tokens);
	jdoc_u64(doc, "n_pages", s->n_pages);
	jdoc_u64(doc, "shared_pages", s->shared_pages);
	jdoc_u64(doc, "reserved_pages", d->reserved_pages);
	jdoc_u64(doc, "idle_ms", s->idle_ms);
	jdoc_bool(doc, "writing", s->writing);
	if (d->writer_pid)
		jdoc_u64(doc, "writer_pid", d->writer_pid);
	else
		jdoc_null(doc, "writer_pid");
	jdoc_bool(doc, "salted", d->salted);
	jdoc_str(doc, "policy", policy_name(d->policy));
	jdoc_u64(doc, "budget", d->budget);
	jdoc_bool(doc, "compacted", d->compacted);
	jdoc_u64(doc, "dropped_tokens", d->dropped_tokens);
	jdoc_set(doc, "page_slots", jdoc_u32_array(d->page_slots, d->n_page_slots));
	jdoc_set(doc, "page_holders", jdoc_u32_array(d->page_holders, d->n_page_slots));
	return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
}

static void print_session_text(const struct kvp_session_detail *d)
{
	const struct kvp_session_info *s = &d->info;
	char model[sizeof(d->model_id)], layout[128], idle[32];

	layout_text(&d->layout, layout, sizeof(layout));
	idle_text(s->idle_ms, idle, sizeof(idle));
	printf("session %" PRIu64 "\n", s->session_id);
	printf("  %-12s %" PRIu64 " (uid %u, model %s, %s)\n", "pool", s->pool_id, s->uid,
	       printable(d->model_id, model, sizeof(model)), layout);
	printf("  %-12s %" PRIu64 " (%" PRIu64 " committed, %" PRIu64 " reserved)\n", "tokens",
	       s->n_tokens, s->committed_tokens, s->n_tokens - s->committed_tokens);
	printf("  %-12s %u (%u shared with another holder, %u holding only reserved tokens)\n",
	       "pages", s->n_pages, s->shared_pages, d->reserved_pages);
	if (d->writer_pid)
		printf("  %-12s pid %" PRIu32 " holds uncommitted tokens\n", "writer",
		       d->writer_pid);
	else
		printf("  %-12s none\n", "writer");
	printf("  %-12s %s\n", "idle", idle);
	printf("  %-12s %s\n", "cache salt", d->salted ? "yes" : "no");
	if (d->policy)
		printf("  %-12s %s, budget %u tokens%s (%" PRIu64 " dropped)\n", "policy",
		       policy_name(d->policy), d->budget, d->compacted ? ", compacted" : "",
		       d->dropped_tokens);
	else
		printf("  %-12s none (exact)\n", "policy");
	printf("  %-12s", "page slots");
	if (!d->n_page_slots)
		printf(" none");
	for (size_t i = 0; i < d->n_page_slots; i++)
		printf(" %" PRIu32 "(%" PRIu32 ")", d->page_slots[i], d->page_holders[i]);
	if (d->n_page_slots < s->n_pages)
		printf(" ... (%zu of %u)", d->n_page_slots, s->n_pages);
	printf("\n  %-12s slot(holders) of pages 0..; holders: sessions, leases, the prefix "
	       "index\n",
	       "");
}

int cmd_session_show(kvp_client *c, const struct args *a)
{
	struct kvp_session_detail *d;
	int ret;

	ret = kvp_admin_show_session(c, a->id, a->given & OPT_PAGES ? a->pages : SHOW_SLOTS_DEFAULT,
				     &d);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json)
		ret = print_session_json(a->path, d);
	else
		print_session_text(d), ret = 0;
	free(d);
	return ret;
}

int cmd_drop_session(kvp_client *c, const struct args *a)
{
	struct kvp_drop_session_result r;
	int ret;

	ret = kvp_admin_drop_session(c, a->id, a->given & OPT_FORCE ? KVP_DROP_FORCE : 0, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "dropped", "session");
		jdoc_u64(doc, "session_id", r.session_id);
		jdoc_u64(doc, "pool_id", r.pool_id);
		jdoc_u64(doc, "n_tokens", r.n_tokens);
		jdoc_u64(doc, "committed_tokens", r.committed_tokens);
		jdoc_u64(doc, "freed_pages", r.freed_pages);
		jdoc_bool(doc, "was_writing", r.was_writing);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("dropped session %" PRIu64 " of pool %" PRIu64 ": %" PRIu64 " tokens (%" PRIu64
	       " committed), %u page%s freed%s; its cached pages no other session or lease "
	       "holds are forgotten in every tier\n",
	       r.session_id, r.pool_id, r.n_tokens, r.committed_tokens, r.freed_pages,
	       plural(r.freed_pages),
	       r.was_writing ? "; a writer's uncommitted tokens were rolled back" : "");
	return 0;
}

int cmd_drop_pool(kvp_client *c, const struct args *a)
{
	struct kvp_drop_pool_result r;
	char model[sizeof(r.model_id)], size[32];
	int ret;

	ret = kvp_admin_drop_pool(c, a->id, a->given & OPT_FORCE ? KVP_DROP_FORCE : 0, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "dropped", "pool");
		jdoc_u64(doc, "pool_id", r.pool_id);
		jdoc_u64(doc, "uid", r.uid);
		jdoc_str(doc, "model_id", r.model_id);
		jdoc_u64(doc, "sessions_closed", r.sessions_closed);
		jdoc_u64(doc, "leases_released", r.leases_released);
		jdoc_u64(doc, "arena_bytes", r.arena_bytes);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	size_text(r.arena_bytes, size, sizeof(size));
	printf("dropped pool %" PRIu64 " (uid %u, model %s): %u session%s closed, %u lease%s "
	       "released, %s of host tier freed, its spill file (if any) removed\n",
	       r.pool_id, r.uid, printable(r.model_id, model, sizeof(model)), r.sessions_closed,
	       plural(r.sessions_closed), r.leases_released, plural(r.leases_released), size);
	return 0;
}
