/* client/ctl/metrics.c — `kvpalacectl metrics` (see metrics.h): each
 * daemon counter and each pool's page counts as a Prometheus family, in
 * the text exposition format or as JSON.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "metrics.h"

/* Prometheus label value: backslash, quote and newline escaped. */
static void prom_label(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*v, f);
	}
}

/* The metrics in either form: the Prometheus text exposition format, or
 * with --json {"metrics":[{"name","type","help","samples":[{"labels",
 * "value"}]}]}. */
struct metrics_out {
	FILE *f;
	int json;
	unsigned int families; /* begun so far */
	unsigned int samples;  /* in the current family */
};

static void metrics_family(struct metrics_out *m, const char *name, const char *type,
			   const char *help)
{
	FILE *f = m->f;

	if (!m->json) {
		fprintf(f, "# HELP kvpalace_%s %s\n# TYPE kvpalace_%s %s\n", name, help, name,
			type);
		m->families++;
		return;
	}
	fputs(m->families ? "]},{" : "{", f);
	fprintf(f, "\"name\":\"kvpalace_%s\",", name);
	json_string(f, "type", type, 1);
	json_string(f, "help", help, 1);
	json_key(f, "samples");
	fputc('[', f);
	m->families++;
	m->samples = 0;
}

/* One sample of the current family; value is a number's text, pool the
 * pool whose labels it carries, or NULL. */
static void metrics_sample(struct metrics_out *m, const char *name,
			   const struct kvp_pool_stats *pool, const char *value)
{
	FILE *f = m->f;

	if (!m->json) {
		fprintf(f, "kvpalace_%s", name);
		if (pool) {
			fprintf(f, "{pool=\"%" PRIu64 "\",uid=\"%u\",model=\"", pool->pool_id,
				pool->uid);
			prom_label(f, pool->model_id);
			fputs("\"}", f);
		}
		fprintf(f, " %s\n", value);
		return;
	}
	fputs(m->samples++ ? ",{" : "{", f);
	json_key(f, "labels");
	fputc('{', f);
	if (pool) {
		char id[24], uid[16];

		snprintf(id, sizeof(id), "%" PRIu64, pool->pool_id);
		snprintf(uid, sizeof(uid), "%u", pool->uid);
		json_string(f, "pool", id, 1);
		json_string(f, "uid", uid, 1);
		json_string(f, "model", pool->model_id, 0);
	}
	fputs("},", f);
	json_key(f, "value");
	fprintf(f, "%s}", value);
}

void print_metrics(FILE *f, const char *path, int json, const struct kvp_stats *st)
{
	static const struct {
		const char *name, *type, *help;
		size_t off;
	} daemon_metrics[] = {
		{"uptime_seconds", "gauge", "Seconds since kvpalaced started.", 0},
		{"connections", "gauge", "Client connections open now.",
		 offsetof(struct kvp_stats, connections)},
		{"requests_total", "counter", "Requests served.",
		 offsetof(struct kvp_stats, requests)},
		{"errors_total", "counter", "Requests answered with an error.",
		 offsetof(struct kvp_stats, errors)},
		{"match_hits_total", "counter", "Prefix matches that found at least one page.",
		 offsetof(struct kvp_stats, match_hits)},
		{"match_misses_total", "counter", "Prefix matches that found nothing.",
		 offsetof(struct kvp_stats, match_misses)},
		{"matched_tokens_total", "counter", "Tokens served from the cache.",
		 offsetof(struct kvp_stats, matched_tokens)},
		{"appended_tokens_total", "counter", "Tokens reserved by Append.",
		 offsetof(struct kvp_stats, appended_tokens)},
		{"committed_tokens_total", "counter", "Tokens published by Commit.",
		 offsetof(struct kvp_stats, committed_tokens)},
		{"evicted_pages_total", "counter", "Cached pages evicted.",
		 offsetof(struct kvp_stats, evictions)},
		{"dedup_pages_total", "counter", "Committed pages replaced by an indexed copy.",
		 offsetof(struct kvp_stats, dedup_pages)},
		{"purges_total", "counter", "Admin purges served.",
		 offsetof(struct kvp_stats, purges)},
		{"purged_pages_total", "counter",
		 "Index pages admin purges and drops forgot, in every tier.",
		 offsetof(struct kvp_stats, purged_pages)},
		{"bad_disconnects_total", "counter", "Connections closed for misbehaviour.",
		 offsetof(struct kvp_stats, disconnects_bad)},
		{"checkpoints_written_total", "counter", "Checkpoints written.",
		 offsetof(struct kvp_stats, checkpoints_written)},
		{"checkpoints_restored_total", "counter",
		 "Checkpoints restored into a session or warmed up.",
		 offsetof(struct kvp_stats, checkpoints_restored)},
		{"checkpoints_refused_total", "counter",
		 "Checkpoint files refused: corrupt, truncated, foreign or newer.",
		 offsetof(struct kvp_stats, checkpoints_refused)},
		{"checkpoint_failures_total", "counter",
		 "Checkpoint writes that failed (disk full, I/O error).",
		 offsetof(struct kvp_stats, checkpoint_failures)},
		{"warmed_up_pages_total", "counter", "Pages loaded into prefix indexes by warm-up.",
		 offsetof(struct kvp_stats, warmed_up_pages)},
		{"checkpoints_removed_total", "counter", "Checkpoints removed.",
		 offsetof(struct kvp_stats, checkpoints_removed)},
		{"restore_waits_total", "counter",
		 "Restores that waited for the host tier to write cached pages out.",
		 offsetof(struct kvp_stats, restore_waits)},
	};
	static const struct {
		const char *name, *help;
	} pool_metrics[] = {
		{"pool_pages", "Pages in the pool's host arena."},
		{"pool_free_pages", "Free pages."},
		{"pool_indexed_pages", "Pages held by the prefix index."},
		{"pool_evictable_pages", "Indexed pages eviction may take."},
		{"pool_leased_pages", "Pages pinned by read leases."},
		{"pool_sessions", "Sessions in the pool."},
	};
	struct metrics_out m = {.f = f, .json = json};
	char value[32];

	if (json) {
		fputc('{', f);
		json_string(f, "socket", path, 1);
		json_key(f, "metrics");
		fputc('[', f);
	}
	for (size_t i = 0; i < sizeof(daemon_metrics) / sizeof(daemon_metrics[0]); i++) {
		uint64_t v;

		metrics_family(&m, daemon_metrics[i].name, daemon_metrics[i].type,
			       daemon_metrics[i].help);
		if (i == 0) {
			snprintf(value, sizeof(value), "%.3f", (double)st->uptime_ms / 1000.0);
		} else {
			memcpy(&v, (const char *)st + daemon_metrics[i].off, sizeof(v));
			snprintf(value, sizeof(value), "%" PRIu64, v);
		}
		metrics_sample(&m, daemon_metrics[i].name, NULL, value);
	}
	metrics_family(&m, "gpu", "gauge", "1 when a GPU tier is available.");
	metrics_sample(&m, "gpu", NULL, st->gpu ? "1" : "0");
	for (size_t k = 0; k < sizeof(pool_metrics) / sizeof(pool_metrics[0]); k++) {
		metrics_family(&m, pool_metrics[k].name, "gauge", pool_metrics[k].help);
		for (size_t i = 0; i < st->n_pools; i++) {
			const struct kvp_pool_stats *p = &st->pools[i];
			uint64_t v[] = {p->n_pages,	    p->free_pages,   p->indexed_pages,
					p->evictable_pages, p->leased_pages, p->n_sessions};

			snprintf(value, sizeof(value), "%" PRIu64, v[k]);
			metrics_sample(&m, pool_metrics[k].name, p, value);
		}
	}
	if (json)
		fputs("]}]}\n", f);
}
