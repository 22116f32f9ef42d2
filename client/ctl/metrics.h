/* client/ctl/metrics.h — `kvpalacectl metrics`: the Stats reply in the
 * Prometheus text exposition format, or as JSON, written by the metrics
 * library (client/metrics/prom.h), as kvpalace-exporter serves it.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_METRICS_H
#define KVPCTL_METRICS_H

#include <stdio.h>

#include "kvpalace.h"

/* Writes st to f as metrics (client/kvpalacectl.1, METRICS); with json,
 * one object whose "metrics" array holds each family's name, type, help
 * and samples. path is the admin socket, for the JSON object. Returns 0
 * or prom_write's negative errno. */
int print_metrics(FILE *f, const char *path, int json, const struct kvp_stats *st);

#endif
