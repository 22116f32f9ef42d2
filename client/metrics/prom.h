/* client/metrics/prom.h — struct kvp_stats as metrics: the Prometheus
 * text exposition format (version 0.0.4) or the same families as JSON.
 * Shared by `kvpalacectl metrics` and kvpalace-exporter, so the names a
 * dashboard reads are the same whichever of them produced the page.
 *
 * Layer: metrics (client/README.md), above the library, which it uses
 * only through the public header kvpalace.h; JSON through libjansson.
 * No global state: callable from any thread.
 */
#ifndef KVP_METRICS_PROM_H
#define KVP_METRICS_PROM_H

#include <stdio.h>

#include "kvpalace.h"

/* The Content-Type of the text form. */
#define PROM_TEXT_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

enum prom_format {
	PROM_TEXT, /* Prometheus text exposition format 0.0.4 */
	PROM_JSON, /* {"socket","up","metrics":[{"name","type","help","samples":[...]}]} */
};

/* Who wrote the page. */
struct prom_source {
	const char *component; /* "kvpalacectl", "kvpalace-exporter": build_info's label */
	const char *version;   /* its version */
	const char *socket;    /* the admin socket asked, for JSON; NULL leaves it out */
	/* 1: a sample per pool, labelled with its pool id, uid and model id,
	 * for a reader allowed to see every tenant (kvpalacectl on the admin
	 * socket). 0: the pool families summed over every pool, with no pool,
	 * uid or model label (and no page_bytes, which does not add up), for
	 * a page that readers of any tenant may fetch (the exporter's port). */
	int per_pool;
};

/* Writes the metrics of st to f in format fmt. st NULL means the daemon
 * could not be asked: the page then holds kvpalace_up 0 and the writer's
 * own kvpalace_build_info, and is still a valid page. Every name starts
 * with kvpalace_; each family has HELP and TYPE; pools' families carry
 * pool, uid and model labels, or are sums over the pools (src->per_pool;
 * client/kvpalacectl.1, METRICS, lists them).
 * Label values are escaped, and bytes that are not UTF-8 become U+FFFD.
 * Returns 0, -ENOMEM, or -EIO when writing to f failed. */
int prom_write(FILE *f, enum prom_format fmt, const struct kvp_stats *st,
	       const struct prom_source *src);

#endif
