/* client/ctl/latency.c — `kvpalacectl latency` and the latency quantiles
 * of `status` (see latency.h). The daemon keeps one histogram per request
 * type with fixed buckets (10 us, 25 us, 50 us, 100 us, ... 10 s, and
 * above); a quantile here is the upper bound of the bucket it falls in,
 * so "p99 1ms" reads "99 % of these requests took at most 1 ms".
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "latency.h"
#include "table.h"

uint64_t latency_quantile_ns(const struct kvp_latency *l, double q)
{
	uint64_t total = 0, want, sum = 0;

	for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		total += l->buckets[i];
	if (!total)
		return 0;
	want = (uint64_t)((double)total * q + 0.999999);
	if (want < 1)
		want = 1;
	for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS; i++) {
		sum += l->buckets[i];
		if (sum >= want)
			return kvp_latency_bound_ns(i);
	}
	return UINT64_MAX;
}

void duration_text(uint64_t ns, char *buf, size_t cap)
{
	static const struct {
		const char *unit;
		uint64_t ns;
	} units[] = {{"s", 1000000000}, {"ms", 1000000}, {"us", 1000}};

	if (ns == UINT64_MAX) {
		snprintf(buf, cap, ">%s", "10s");
		return;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (ns < units[i].ns)
			continue;
		if (ns % units[i].ns == 0)
			snprintf(buf, cap, "%" PRIu64 "%s", ns / units[i].ns, units[i].unit);
		else
			snprintf(buf, cap, "%.1f%s", (double)ns / (double)units[i].ns,
				 units[i].unit);
		return;
	}
	snprintf(buf, cap, "%" PRIu64 "ns", ns);
}

static const struct kvp_stats *order_st;

static int by_count(const void *x, const void *y)
{
	const struct kvp_latency *a = &order_st->latencies[*(const size_t *)x];
	const struct kvp_latency *b = &order_st->latencies[*(const size_t *)y];

	if (a->count != b->count)
		return a->count < b->count ? 1 : -1;
	return strcmp(a->request, b->request);
}

void latency_order(const struct kvp_stats *st, size_t *order)
{
	for (size_t i = 0; i < st->n_latencies; i++)
		order[i] = i;
	order_st = st;
	if (st->n_latencies)
		qsort(order, st->n_latencies, sizeof(*order), by_count);
}

static void set_quantile(json_t *o, const char *key, const struct kvp_latency *l, double q)
{
	uint64_t v = latency_quantile_ns(l, q);

	if (v == UINT64_MAX)
		jdoc_null(o, key);
	else
		jdoc_u64(o, key, v);
}

json_t *latency_json(const struct kvp_latency *l)
{
	json_t *o = jdoc_object();
	json_t *b = jdoc_array();

	jdoc_str(o, "request", l->request);
	jdoc_u64(o, "count", l->count);
	jdoc_u64(o, "sum_ns", l->sum_ns);
	jdoc_u64(o, "mean_ns", l->count ? l->sum_ns / l->count : 0);
	set_quantile(o, "p50_ns", l, 0.5);
	set_quantile(o, "p90_ns", l, 0.9);
	set_quantile(o, "p99_ns", l, 0.99);
	for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS; i++)
		jdoc_push(b, jdoc_uint(l->buckets[i]));
	jdoc_set(o, "buckets", b);
	return o;
}

static int print_latency(const struct args *a, const struct kvp_stats *st, const size_t *order)
{
	struct table t = {0};
	char buf[4][32];

	if (a->json) {
		json_t *doc = jdoc_object(), *bounds = jdoc_array(), *arr = jdoc_array();

		jdoc_str(doc, "socket", a->path);
		for (unsigned int i = 0; i < KVP_LATENCY_BUCKETS; i++)
			jdoc_push(bounds, i + 1 < KVP_LATENCY_BUCKETS
						  ? jdoc_uint(kvp_latency_bound_ns(i))
						  : json_null());
		jdoc_set(doc, "bucket_bounds_ns", bounds);
		for (size_t k = 0; k < st->n_latencies; k++)
			jdoc_push(arr, latency_json(&st->latencies[order[k]]));
		jdoc_set(doc, "latencies", arr);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	if (!st->n_latencies) {
		if (!(a->given & OPT_NO_HEADERS))
			printf("no requests timed%s\n",
			       st->version[0] ? "" : " (this daemon may not time them)");
		return 0;
	}
	table_col(&t, "REQUEST", '<');
	table_col(&t, "COUNT", '>');
	table_col(&t, "MEAN", '>');
	table_col(&t, "P50", '>');
	table_col(&t, "P90", '>');
	table_col(&t, "P99", '>');
	for (size_t k = 0; k < st->n_latencies; k++) {
		const struct kvp_latency *l = &st->latencies[order[k]];
		char name[sizeof(l->request)];

		duration_text(l->count ? l->sum_ns / l->count : 0, buf[0], sizeof(buf[0]));
		duration_text(latency_quantile_ns(l, 0.5), buf[1], sizeof(buf[1]));
		duration_text(latency_quantile_ns(l, 0.9), buf[2], sizeof(buf[2]));
		duration_text(latency_quantile_ns(l, 0.99), buf[3], sizeof(buf[3]));
		table_row(&t);
		table_cell(&t, "%s", printable(l->request, name, sizeof(name)));
		table_cell(&t, "%" PRIu64, l->count);
		table_cell(&t, "%s", buf[0]);
		table_cell(&t, "%s", buf[1]);
		table_cell(&t, "%s", buf[2]);
		table_cell(&t, "%s", buf[3]);
	}
	return table_print(&t, stdout, 0, a->given & OPT_NO_HEADERS) < 0 ? EXIT_DAEMON : 0;
}

int cmd_latency(kvp_client *c, const struct args *a)
{
	struct kvp_stats *st;
	size_t *order;
	int ret;

	ret = kvp_stats(c, &st);
	if (ret < 0)
		return fail(c, a->name, ret);
	order = calloc(st->n_latencies + 1, sizeof(*order));
	if (!order) {
		kvp_stats_free(st);
		return fail(c, a->name, -ENOMEM);
	}
	latency_order(st, order);
	ret = print_latency(a, st, order);
	free(order);
	kvp_stats_free(st);
	return ret;
}
