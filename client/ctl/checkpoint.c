/* client/ctl/checkpoint.c — kvpalacectl's checkpoint commands (see
 * checkpoint.h), as text or JSON. The daemon answers checkpoint, restore,
 * warmup, the listing and a removal once the disk work is done, so these
 * show a spinner and the time waited on a terminal; `checkpoints
 * --verify` verifies one file per request under a progress bar.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded, but for the spinner's drawing thread (progress.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "common.h"
#include "jdoc.h"
#include "progress.h"

/* "YYYY-MM-DD HH:MM:SS" in local time, or "-" for 0. */
static void time_text(uint64_t unix_ms, char *buf, size_t cap)
{
	time_t t = (time_t)(unix_ms / 1000);
	struct tm tm;

	if (!unix_ms || !localtime_r(&t, &tm) || !strftime(buf, cap, "%Y-%m-%d %H:%M:%S", &tm))
		snprintf(buf, cap, "-");
}

/* "uid":U, or "uid":null without --uid. */
static void json_uid_opt(json_t *doc, const struct args *a)
{
	if (a->given & OPT_UID)
		jdoc_u64(doc, "uid", a->uid);
	else
		jdoc_null(doc, "uid");
}

/* Starts the spinner of a command the daemon answers once, on a terminal
 * without --json. */
static void wait_start(struct progress *pg, const struct args *a, const char *label)
{
	progress_wait_start(pg, stdout, !a->json && progress_wanted(stdout), label);
}

int cmd_checkpoint(kvp_client *c, const struct args *a)
{
	struct progress pg;
	uint64_t bytes;
	char size[32];
	int ret;

	wait_start(&pg, a, "checkpointing");
	ret = kvp_admin_checkpoint(c, a->id, a->ckpt, &bytes);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_u64(doc, "session_id", a->id);
		jdoc_str(doc, "name", a->ckpt);
		jdoc_u64(doc, "bytes", bytes);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	size_text(bytes, size, sizeof(size));
	printf("checkpointed session %" PRIu64 " as %s (%s written)\n", a->id, a->ckpt, size);
	return 0;
}

int cmd_restore(kvp_client *c, const struct args *a)
{
	struct kvp_restore_info r;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "restoring");
	ret = kvp_admin_restore(c, a->ckpt, !!(a->given & OPT_UID), a->uid, a->pool_id, &r);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "name", a->ckpt);
		json_uid_opt(doc, a);
		jdoc_u64(doc, "session_id", r.session_id);
		jdoc_u64(doc, "pool_id", r.pool_id);
		jdoc_u64(doc, "n_tokens", r.n_tokens);
		jdoc_u64(doc, "n_pages", r.n_pages);
		jdoc_u64(doc, "shared_pages", r.shared_pages);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("restored %s as session %" PRIu64 " of pool %" PRIu64 ": %" PRIu64
	       " token%s in %u page%s, %u of them already in the prefix index\n",
	       a->ckpt, r.session_id, r.pool_id, r.n_tokens, plural(r.n_tokens), r.n_pages,
	       plural(r.n_pages), r.shared_pages);
	return 0;
}

int cmd_warmup(kvp_client *c, const struct args *a)
{
	struct kvp_warmup_info r;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "warming up");
	ret = kvp_admin_warmup(c, a->ckpt, !!(a->given & OPT_UID), a->uid, &r);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "name", a->ckpt);
		json_uid_opt(doc, a);
		jdoc_u64(doc, "pool_id", r.pool_id);
		jdoc_u64(doc, "n_tokens", r.n_tokens);
		jdoc_u64(doc, "indexed_pages", r.indexed_pages);
		jdoc_u64(doc, "shared_pages", r.shared_pages);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("warmed up %s: %" PRIu64 " token%s, %u full page%s in the prefix index of pool "
	       "%" PRIu64 " (%u there already)\n",
	       a->ckpt, r.n_tokens, plural(r.n_tokens), r.indexed_pages, plural(r.indexed_pages),
	       r.pool_id, r.shared_pages);
	return 0;
}

static int print_checkpoints_json(const char *path, const struct args *a,
				  const struct kvp_checkpoint_list *l)
{
	json_t *doc = jdoc_object(), *arr = jdoc_array();

	jdoc_str(doc, "socket", path);
	json_uid_opt(doc, a);
	jdoc_bool(doc, "truncated", l->truncated);
	for (size_t i = 0; i < l->n_entries; i++) {
		const struct kvp_checkpoint_info *e = &l->entries[i];
		json_t *o = jdoc_object();

		jdoc_str(o, "name", e->name);
		jdoc_u64(o, "uid", e->uid);
		if (e->error) {
			/* What the file would hold is unknown. */
			jdoc_null(o, "model_id");
			jdoc_null(o, "layout");
			jdoc_null(o, "n_tokens");
		} else {
			jdoc_str(o, "model_id", e->model_id);
			jdoc_set(o, "layout", jdoc_layout(&e->layout));
			jdoc_u64(o, "n_tokens", e->n_tokens);
		}
		if (e->bytes || !e->error)
			jdoc_u64(o, "bytes", e->bytes);
		else
			jdoc_null(o, "bytes");
		if (e->created_unix_ms || !e->error)
			jdoc_u64(o, "created_unix_ms", e->created_unix_ms);
		else
			jdoc_null(o, "created_unix_ms");
		jdoc_u64(o, "format_version", e->format_version);
		jdoc_bool(o, "verified", e->verified);
		jdoc_str_or_null(o, "error", e->error);
		jdoc_push(arr, o);
	}
	jdoc_set(doc, "checkpoints", arr);
	return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
}

static void print_checkpoints_text(const struct kvp_checkpoint_list *l, int no_headers)
{
	int wname = (int)strlen("NAME"), wmodel = (int)strlen("MODEL");
	char model[128], size[32], when[32], why[256];

	if (!l->n_entries) {
		if (!no_headers)
			printf("no checkpoints\n");
		return;
	}
	for (size_t i = 0; i < l->n_entries; i++) {
		int n = (int)strlen(l->entries[i].name);

		if (n > wname)
			wname = n;
		n = (int)strlen(l->entries[i].model_id);
		if (n > wmodel)
			wmodel = n;
	}
	if (!no_headers)
		printf("%-*s %-6s %-*s %10s %10s  %-19s  %s\n", wname, "NAME", "UID", wmodel,
		       "MODEL", "TOKENS", "SIZE", "CREATED", "CHECKED");
	for (size_t i = 0; i < l->n_entries; i++) {
		const struct kvp_checkpoint_info *e = &l->entries[i];

		/* Names are checked by the library: nothing to escape. */
		if (e->error) {
			printf("%-*s %-6u cannot be restored: %s\n", wname, e->name, e->uid,
			       printable(e->error, why, sizeof(why)));
			continue;
		}
		size_text(e->bytes, size, sizeof(size));
		time_text(e->created_unix_ms, when, sizeof(when));
		/* A listing reads headers only unless --verify: say so, a
		 * damaged page shows only when the pages are read. */
		printf("%-*s %-6u %-*s %10" PRIu64 " %10s  %-19s  %s%s\n", wname, e->name, e->uid,
		       wmodel, printable(e->model_id, model, sizeof(model)), e->n_tokens, size,
		       when,
		       e->verified ? "every page verified" : "header valid, pages not checked",
		       e->format_version && e->format_version < 3
			       ? " (old format: its name is not recorded)"
			       : "");
	}
	if (l->truncated && !no_headers)
		printf("(more checkpoints exist than fit in one reply)\n");
}

/* Verifies each listed checkpoint that the header check passed, one
 * request per file so a bar can show the bytes read (on a terminal),
 * and copies each verdict into l. The verdicts' lists go to *ret_keep
 * (their strings are what l's entries point at now). */
static int verify_each(kvp_client *c, const struct args *a, struct kvp_checkpoint_list *l,
		       struct kvp_checkpoint_list ***ret_keep)
{
	struct kvp_checkpoint_list **keep = calloc(l->n_entries ? l->n_entries : 1, sizeof(*keep));
	uint64_t total = 0, done = 0;
	struct progress pg;
	int ret = 0;

	if (!keep)
		return -ENOMEM;
	for (size_t i = 0; i < l->n_entries; i++)
		total += l->entries[i].error ? 0 : l->entries[i].bytes;
	progress_start(&pg, stdout, !a->json && progress_wanted(stdout), "verifying", total, 1);
	for (size_t i = 0; i < l->n_entries && ret == 0; i++) {
		struct kvp_checkpoint_info *e = &l->entries[i];

		if (e->error)
			continue;
		ret = kvp_list_checkpoints_ex(c, 1, e->uid, e->name, KVP_LIST_VERIFY, &keep[i]);
		if (ret == 0 && keep[i]->n_entries == 1) {
			e->error = keep[i]->entries[0].error;
			e->verified = keep[i]->entries[0].verified;
		} else if (ret == 0) {
			e->error = "removed while it was being verified";
		}
		done += e->bytes;
		progress_update(&pg, done);
	}
	progress_end(&pg);
	*ret_keep = keep;
	return ret;
}

int cmd_checkpoints(kvp_client *c, const struct args *a)
{
	struct kvp_checkpoint_list *l, **keep = NULL;
	struct progress pg;
	int ret;

	wait_start(&pg, a, "listing");
	ret = kvp_list_checkpoints(c, !!(a->given & OPT_UID), a->uid, &l);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->given & OPT_VERIFY)
		ret = verify_each(c, a, l, &keep);
	if (ret < 0) {
		ret = fail(c, a->name, ret);
	} else {
		ret = 0;
		if (a->json)
			ret = print_checkpoints_json(a->path, a, l);
		else
			print_checkpoints_text(l, a->given & OPT_NO_HEADERS);
	}
	for (size_t i = 0; keep && i < l->n_entries; i++)
		kvp_checkpoint_list_free(keep[i]);
	free(keep);
	kvp_checkpoint_list_free(l);
	return ret;
}

int cmd_checkpoint_rm(kvp_client *c, const struct args *a)
{
	uint32_t uid = a->given & OPT_UID ? a->uid : (uint32_t)getuid();
	struct progress pg;
	uint64_t bytes = 0;
	char size[32];
	int ret;

	wait_start(&pg, a, "removing");
	ret = kvp_checkpoint_remove(c, a->ckpt, !!(a->given & OPT_UID), a->uid, &bytes);
	progress_wait_end(&pg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "name", a->ckpt);
		jdoc_u64(doc, "uid", uid);
		jdoc_u64(doc, "bytes", bytes);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	size_text(bytes, size, sizeof(size));
	printf("removed checkpoint %s of uid %u (%s)\n", a->ckpt, uid, size);
	return 0;
}
