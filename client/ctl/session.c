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
#include "json.h"
#include "session.h"

/* Page slots `session show` lists unless --pages says otherwise. */
#define SHOW_SLOTS_DEFAULT 16u

static const char *policy_name(uint32_t kind)
{
	static const char *const names[] = {"none", "window", "sinks", "importance", "hierarchy"};

	return kind < sizeof(names) / sizeof(names[0]) ? names[kind] : "unknown";
}

static void print_session_json(const char *path, const struct kvp_session_detail *d)
{
	const struct kvp_session_info *s = &d->info;
	FILE *f = stdout;

	fputc('{', f);
	json_string(f, "socket", path, 1);
	json_u64(f, "session_id", s->session_id, 1);
	json_u64(f, "pool_id", s->pool_id, 1);
	json_u64(f, "uid", s->uid, 1);
	json_string(f, "model_id", d->model_id, 1);
	json_layout(f, &d->layout);
	json_u64(f, "n_tokens", s->n_tokens, 1);
	json_u64(f, "committed_tokens", s->committed_tokens, 1);
	json_u64(f, "n_pages", s->n_pages, 1);
	json_u64(f, "shared_pages", s->shared_pages, 1);
	json_u64(f, "reserved_pages", d->reserved_pages, 1);
	json_u64(f, "idle_ms", s->idle_ms, 1);
	json_bool(f, "writing", s->writing, 1);
	json_key(f, "writer_pid");
	if (d->writer_pid)
		fprintf(f, "%" PRIu32 ",", d->writer_pid);
	else
		fputs("null,", f);
	json_bool(f, "salted", d->salted, 1);
	json_string(f, "policy", policy_name(d->policy), 1);
	json_u64(f, "budget", d->budget, 1);
	json_bool(f, "compacted", d->compacted, 1);
	json_u64(f, "dropped_tokens", d->dropped_tokens, 1);
	json_u32_array(f, "page_slots", d->page_slots, d->n_page_slots, 1);
	json_u32_array(f, "page_holders", d->page_holders, d->n_page_slots, 0);
	fputs("}\n", f);
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
		print_session_json(a->path, d);
	else
		print_session_text(d);
	free(d);
	return 0;
}

int cmd_drop_session(kvp_client *c, const struct args *a)
{
	struct kvp_drop_session_result r;
	int ret;

	ret = kvp_admin_drop_session(c, a->id, a->given & OPT_FORCE ? KVP_DROP_FORCE : 0, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "dropped", "session", 1);
		json_u64(stdout, "session_id", r.session_id, 1);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "n_tokens", r.n_tokens, 1);
		json_u64(stdout, "committed_tokens", r.committed_tokens, 1);
		json_u64(stdout, "freed_pages", r.freed_pages, 1);
		json_bool(stdout, "was_writing", r.was_writing, 0);
		fputs("}\n", stdout);
		return 0;
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
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_string(stdout, "dropped", "pool", 1);
		json_u64(stdout, "pool_id", r.pool_id, 1);
		json_u64(stdout, "uid", r.uid, 1);
		json_string(stdout, "model_id", r.model_id, 1);
		json_u64(stdout, "sessions_closed", r.sessions_closed, 1);
		json_u64(stdout, "leases_released", r.leases_released, 1);
		json_u64(stdout, "arena_bytes", r.arena_bytes, 0);
		fputs("}\n", stdout);
		return 0;
	}
	size_text(r.arena_bytes, size, sizeof(size));
	printf("dropped pool %" PRIu64 " (uid %u, model %s): %u session%s closed, %u lease%s "
	       "released, %s of host tier freed, its spill file (if any) removed\n",
	       r.pool_id, r.uid, printable(r.model_id, model, sizeof(model)), r.sessions_closed,
	       plural(r.sessions_closed), r.leases_released, plural(r.leases_released), size);
	return 0;
}
