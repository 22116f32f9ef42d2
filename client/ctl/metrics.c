/* client/ctl/metrics.c — `kvpalacectl metrics` (see metrics.h): the
 * metrics library (client/metrics/prom.c) writes the page; kvpalace-exporter
 * serves the same page over HTTP.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h, and the
 * metrics layer. Single-threaded.
 */
#include <stdio.h>

#include "metrics.h"
#include "prom.h"

int print_metrics(FILE *f, const char *path, int json, const struct kvp_stats *st)
{
	const struct prom_source src = {
		.component = "kvpalacectl",
		.version = KVP_VERSION,
		.socket = path,
		.per_pool = 1, /* the admin socket's reader sees every tenant anyway */
	};

	return prom_write(f, json ? PROM_JSON : PROM_TEXT, st, &src);
}
