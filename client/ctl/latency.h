/* client/ctl/latency.h — kvpalacectl's view of the daemon's per-request
 * latency histograms (struct kvp_latency): `latency`, and the quantiles
 * `status` and the JSON documents show.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_LATENCY_H
#define KVPCTL_LATENCY_H

#include "common.h"
#include "jdoc.h"

/* The upper bound of the bucket holding quantile q (0 < q <= 1) of l, in
 * ns; UINT64_MAX when it is the last, unbounded one; 0 for no requests. */
uint64_t latency_quantile_ns(const struct kvp_latency *l, double q);

/* "850ns", "25us", "2.5ms", "10s", ">10s" (UINT64_MAX). */
void duration_text(uint64_t ns, char *buf, size_t cap);

/* Indexes of st->latencies, busiest first, into order (n_latencies
 * entries, the caller's). */
void latency_order(const struct kvp_stats *st, size_t *order);

/* One histogram as a JSON object: request, count, sum_ns, mean_ns,
 * p50_ns, p90_ns, p99_ns (null when in the unbounded bucket), buckets. */
json_t *latency_json(const struct kvp_latency *l);

/* `latency`: one row per request type the daemon timed, busiest first. */
int cmd_latency(kvp_client *c, const struct args *a);

#endif
