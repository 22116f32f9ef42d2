/* client/ctl/evict.c — kvpalacectl's commands that take cached pages out
 * (see evict.h): `evict`, which runs as many short Evict requests
 * (kvp_admin_evict_flags) with a progress bar on a terminal, and `purge`
 * (kvp_admin_purge), as text or JSON.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded, but for the progress bar (progress.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "evict.h"
#include "jdoc.h"
#include "progress.h"

/* Pages one Evict request asks for: a long eviction is many requests, so
 * the daemon's loop never stalls and the progress bar moves. */
#define EVICT_CHUNK_PAGES 1024u

/* Adds one request's per-pool figures to the running totals in *sum (n
 * used, cap allocated). Returns 0 or -ENOMEM. */
static int evict_add(struct kvp_evicted_pool **sum, size_t *n, size_t *cap,
		     const struct kvp_evict_result *r)
{
	for (size_t i = 0; i < r->n_pools; i++) {
		size_t j = 0;

		while (j < *n && (*sum)[j].pool_id != r->pools[i].pool_id)
			j++;
		if (j == *n) {
			if (*n == *cap) {
				size_t want = *cap ? *cap * 2 : 16;
				struct kvp_evicted_pool *p = realloc(*sum, want * sizeof(*p));

				if (!p)
					return -ENOMEM;
				*sum = p;
				*cap = want;
			}
			(*sum)[j] = (struct kvp_evicted_pool){.pool_id = r->pools[i].pool_id};
			(*n)++;
		}
		(*sum)[j].pages += r->pools[i].pages;
		(*sum)[j].bytes += r->pools[i].bytes;
	}
	return 0;
}

/* Bytes the prefix index holds in the pools evict may touch: the most an
 * eviction can free, for the progress bar. 0 when unknown. */
static uint64_t indexed_bytes(kvp_client *c, uint64_t pool_id)
{
	struct kvp_stats *st;
	uint64_t sum = 0;

	if (kvp_stats(c, &st) < 0)
		return 0;
	for (size_t i = 0; i < st->n_pools; i++)
		if (!pool_id || st->pools[i].pool_id == pool_id)
			sum += (uint64_t)st->pools[i].indexed_pages * st->pools[i].page_bytes;
	kvp_stats_free(st);
	return sum;
}

int cmd_evict(kvp_client *c, const struct args *a)
{
	struct kvp_evicted_pool *sum = NULL;
	size_t n = 0, cap = 0;
	uint64_t left = a->bytes, pages = 0, bytes = 0, demoted = 0, dropped = 0, total;
	struct progress pg;
	char size[32], asked[32];
	int ret = 0;

	if ((a->given & OPT_DISCARD) && a->tier != KVP_TIER_HOST)
		return usage_error(a->name, "--discard goes with --tier host only");
	/* The bar's 100 %: what was asked, or what the index holds if less. */
	total = a->tier == KVP_TIER_HOST ? indexed_bytes(c, a->pool_id) : 0;
	if (a->bytes != KVP_EVICT_ALL && (!total || a->bytes < total))
		total = a->bytes;
	progress_start(&pg, stdout, !a->json && progress_wanted(stdout), "evicting", total, 1);
	for (;;) {
		struct kvp_evict_result *r;

		ret = kvp_admin_evict_flags(c, a->tier, a->pool_id, left, EVICT_CHUNK_PAGES,
					    a->given & OPT_DISCARD ? KVP_EVICT_DISCARD : 0, &r);
		if (ret < 0)
			break;
		ret = evict_add(&sum, &n, &cap, r);
		pages += r->pages;
		bytes += r->bytes;
		demoted += r->demoted;
		dropped += r->dropped;
		if (left != KVP_EVICT_ALL)
			left -= r->bytes < left ? r->bytes : left;
		progress_update(&pg, bytes);
		if (ret < 0 || !r->more || !r->pages || !left) {
			free(r);
			break;
		}
		free(r);
	}
	progress_end(&pg);
	if (ret < 0) {
		free(sum);
		ret = fail(c, a->name, ret);
		if (pages)
			fprintf(stderr,
				"kvpalacectl: %s: %" PRIu64 " pages were evicted before that\n",
				a->name, pages);
		return ret;
	}
	if (a->json) {
		json_t *doc = jdoc_object(), *arr = jdoc_array();

		jdoc_str(doc, "socket", a->path);
		jdoc_str(doc, "tier", tier_name(a->tier));
		if (a->pool_id)
			jdoc_u64(doc, "pool_id", a->pool_id);
		else
			jdoc_null(doc, "pool_id");
		if (a->bytes != KVP_EVICT_ALL)
			jdoc_u64(doc, "max_bytes", a->bytes);
		else
			jdoc_null(doc, "max_bytes");
		jdoc_u64(doc, "pages", pages);
		jdoc_u64(doc, "bytes", bytes);
		if (a->tier != KVP_TIER_GPU) {
			jdoc_u64(doc, "demoted", demoted);
			jdoc_u64(doc, "dropped", dropped);
		}
		for (size_t i = 0; i < n; i++) {
			json_t *o = jdoc_object();

			jdoc_u64(o, "pool_id", sum[i].pool_id);
			jdoc_u64(o, "pages", sum[i].pages);
			jdoc_u64(o, "bytes", sum[i].bytes);
			jdoc_push(arr, o);
		}
		jdoc_set(doc, "pools", arr);
		if (jdoc_print(stdout, doc) < 0)
			ret = EXIT_DAEMON;
	} else {
		size_text(bytes, size, sizeof(size));
		if (a->bytes != KVP_EVICT_ALL)
			size_text(a->bytes, asked, sizeof(asked));
		printf("evicted %" PRIu64 " page%s (%s) from the %s tier%s%s%s", pages,
		       plural(pages), size, tier_name(a->tier),
		       a->bytes != KVP_EVICT_ALL ? " (at most " : "",
		       a->bytes != KVP_EVICT_ALL ? asked : "",
		       a->bytes != KVP_EVICT_ALL ? " asked)" : "");
		if (a->tier == KVP_TIER_HOST)
			printf(": %" PRIu64 " demoted to the disk tier, %" PRIu64 " dropped",
			       demoted, dropped);
		else if (a->tier == KVP_TIER_DISK)
			printf(": %" PRIu64 " kept in the host tier, %" PRIu64 " dropped",
			       pages - dropped, dropped);
		printf("\n");
		for (size_t i = 0; i < n; i++) {
			size_text(sum[i].bytes, size, sizeof(size));
			printf("  pool %-6" PRIu64 " %8" PRIu64 " page%s %12s\n", sum[i].pool_id,
			       sum[i].pages, plural(sum[i].pages), size);
		}
	}
	free(sum);
	return ret;
}

int cmd_purge(kvp_client *c, const struct args *a)
{
	struct kvp_purge_spec spec = {0};
	struct kvp_purge_result r;
	int ret;

	if (a->given & OPT_POOL) {
		spec.flags |= KVP_PURGE_POOL;
		spec.pool_id = a->pool_id;
	}
	if (a->given & OPT_UID) {
		spec.flags |= KVP_PURGE_UID;
		spec.uid = a->uid;
	}
	if (a->given & OPT_MODEL) {
		spec.flags |= KVP_PURGE_MODEL;
		spec.model_id = a->model;
	}
	if (a->given & OPT_SALT) {
		spec.flags |= KVP_PURGE_SALT;
		spec.salt = a->salt;
		spec.salt_len = a->salt_len;
	}
	if (a->given & OPT_EXTRA_KEY) {
		if (!(a->given & OPT_SALT))
			return usage_error(a->name, "--extra-key goes with --salt or --salt-hex "
						    "(\"\" for no salt)");
		spec.extra_key = a->extra_key;
		spec.extra_key_len = strlen(a->extra_key);
	}
	if (a->given & OPT_UNUSED) {
		spec.flags |= KVP_PURGE_UNUSED_SINCE;
		spec.unused_since = a->unused_since;
	}
	if (!spec.flags)
		return usage_error(a->name, "missing what to purge: one of --pool, --uid, --model, "
					    "--salt, --salt-hex, --unused-since");
	ret = kvp_admin_purge(c, &spec, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_u64(doc, "pages", r.pages);
		jdoc_u64(doc, "pools", r.pools);
		jdoc_u64(doc, "host_pages", r.host_pages);
		jdoc_u64(doc, "disk_pages", r.disk_pages);
		jdoc_u64(doc, "device_pages", r.device_pages);
		jdoc_u64(doc, "held_pages", r.held_pages);
		jdoc_u64(doc, "sessions_marked", r.sessions_marked);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("purged %" PRIu64 " page%s from %u pool%s: %" PRIu64 " in the host tier, %" PRIu64
	       " on disk (invalidated and synced), %" PRIu64 " GPU cop%s\n",
	       r.pages, plural(r.pages), r.pools, plural(r.pools), r.host_pages, r.disk_pages,
	       r.device_pages, r.device_pages == 1 ? "y" : "ies");
	if (r.held_pages)
		printf("  %" PRIu64
		       " page%s still held by sessions or leases, freed when they end; "
		       "%u session%s will index nothing more\n",
		       r.held_pages, plural(r.held_pages), r.sessions_marked,
		       plural(r.sessions_marked));
	return 0;
}
