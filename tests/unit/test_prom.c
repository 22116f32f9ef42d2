/* tests/unit/test_prom.c — the metrics layer (client/metrics/prom.c) on
 * a struct kvp_stats built here, no daemon: exact lines for the names a
 * dashboard reads, label escaping (quotes, backslashes, newlines, bytes
 * that are not UTF-8), cumulative histogram buckets with _count equal to
 * the +Inf bucket, tiers a pool lacks left out, the page of an unreachable
 * daemon, and the JSON form holding the same samples as the text. Both
 * forms then go through check_metrics.py (prometheus_client's parser, and
 * promtool where installed) when $KVP_CHECK_METRICS and /usr/bin/python3
 * are there.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "prom.h"

static struct kvp_pool_stats pools[2];
static struct kvp_latency lat[2];
static struct kvp_stats st;

static void fill(void)
{
	memset(pools, 0, sizeof(pools));
	memset(lat, 0, sizeof(lat));
	memset(&st, 0, sizeof(st));

	/* Pool 7: every tier. */
	pools[0].pool_id = 7;
	pools[0].uid = 1000;
	snprintf(pools[0].model_id, sizeof(pools[0].model_id), "llama");
	pools[0].page_bytes = 8192;
	pools[0].n_pages = 100;
	pools[0].free_pages = 60;
	pools[0].indexed_pages = 30;
	pools[0].n_sessions = 2;
	pools[0].evictions = 11;
	pools[0].has_disk = 1;
	pools[0].disk_capacity = 1000;
	pools[0].disk_pages = 250;
	pools[0].spilled_pages = 300;
	pools[0].io_errors = 3;
	pools[0].disk_scanning = 1;
	pools[0].has_gpu = 1;
	pools[0].device_pages = 64;
	pools[0].device_used_pages = 16;
	pools[0].device_copy_errors = 2;
	/* Pool 8: host only, and a model id no label should carry raw. */
	pools[1].pool_id = 8;
	pools[1].uid = 1001;
	memcpy(pools[1].model_id, "a\"b\\c\nd\xff", 9);
	pools[1].page_bytes = 4096;
	pools[1].n_pages = 10;
	pools[1].free_pages = 10;
	pools[1].evictions = 5;

	snprintf(lat[0].request, sizeof(lat[0].request), "MatchPrefix");
	lat[0].buckets[0] = 1;			     /* <= 10 us */
	lat[0].buckets[3] = 2;			     /* <= 100 us */
	lat[0].buckets[KVP_LATENCY_BUCKETS - 1] = 1; /* beyond 10 s */
	lat[0].count = 4;
	lat[0].sum_ns = 12000000250ull;
	snprintf(lat[1].request, sizeof(lat[1].request), "Commit");
	lat[1].buckets[5] = 3;
	lat[1].count = 3;
	lat[1].sum_ns = 600000;

	st.uptime_ms = 12345;
	st.requests = 42;
	st.evictions = 16;
	st.disconnects_bad = 1;
	st.queried_tokens = 1000;
	st.matched_tokens = 640;
	st.queried_pages = 62;
	st.matched_pages = 40;
	snprintf(st.version, sizeof(st.version), "9.8.7");
	st.n_pools = 2;
	st.pools = pools;
	st.n_latencies = 2;
	st.latencies = lat;
}

static char *render_pools(const struct kvp_stats *s, enum prom_format fmt, int per_pool)
{
	const struct prom_source src = {
		.component = "test", .version = "1.2.3", .socket = "/x", .per_pool = per_pool};
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	assert_int_equal(prom_write(f, fmt, s, &src), 0);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static char *render(const struct kvp_stats *s, enum prom_format fmt)
{
	return render_pools(s, fmt, 1);
}

static void has(const char *page, const char *line)
{
	char want[512];

	snprintf(want, sizeof(want), "\n%s\n", line);
	if (!strstr(page, want))
		fail_msg("no line '%s' in:\n%s", line, page);
}

static void lacks(const char *page, const char *text)
{
	if (strstr(page, text))
		fail_msg("'%s' should not be in:\n%s", text, page);
}

static void test_names(void **state)
{
	char *t;

	(void)state;
	fill();
	t = render(&st, PROM_TEXT);
	assert_memory_equal(t, "# HELP kvpalace_up ", 19);
	has(t, "kvpalace_up 1");
	has(t, "kvpalace_build_info{component=\"kvpalaced\",version=\"9.8.7\"} 1");
	has(t, "kvpalace_build_info{component=\"test\",version=\"1.2.3\"} 1");
	has(t, "kvpalace_uptime_seconds 12.345");
	has(t, "# TYPE kvpalace_requests_total counter");
	has(t, "kvpalace_requests_total 42");
	has(t, "kvpalace_evictions_total 16");
	has(t, "kvpalace_disconnects_bad_total 1");
	has(t, "kvpalace_queried_tokens_total 1000");
	has(t, "kvpalace_matched_tokens_total 640");
	has(t, "kvpalace_queried_pages_total 62");
	has(t, "kvpalace_matched_pages_total 40");
	lacks(t, "evicted_pages_total");
	lacks(t, "bad_disconnects_total");
	/* Per pool and per tier. */
	has(t, "kvpalace_page_bytes{pool=\"7\",uid=\"1000\",model=\"llama\"} 8192");
	has(t, "kvpalace_pool_evictions_total{pool=\"7\",uid=\"1000\",model=\"llama\"} 11");
	has(t,
	    "kvpalace_pool_capacity_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"host\"} "
	    "100");
	has(t, "kvpalace_pool_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"host\","
	       "state=\"used\"} 40");
	has(t, "kvpalace_pool_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"host\","
	       "state=\"free\"} 60");
	has(t, "kvpalace_pool_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"disk\","
	       "state=\"used\"} 250");
	has(t, "kvpalace_pool_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"disk\","
	       "state=\"free\"} 750");
	has(t, "kvpalace_pool_pages{pool=\"7\",uid=\"1000\",model=\"llama\",tier=\"gpu\","
	       "state=\"used\"} 16");
	has(t, "kvpalace_pool_spilled_pages_total{pool=\"7\",uid=\"1000\",model=\"llama\"} 300");
	has(t, "kvpalace_pool_io_errors_total{pool=\"7\",uid=\"1000\",model=\"llama\"} 3");
	has(t, "kvpalace_pool_disk_scanning{pool=\"7\",uid=\"1000\",model=\"llama\"} 1");
	has(t, "kvpalace_pool_device_copy_errors_total{pool=\"7\",uid=\"1000\",model=\"llama\"} 2");
	/* Pool 8 has no disk and no GPU: present 0, no samples of theirs. */
	has(t, "kvpalace_pool_tier_present{pool=\"8\",uid=\"1001\",model="
	       "\"a\\\"b\\\\c\\nd\xef\xbf\xbd\","
	       "tier=\"disk\"} 0");
	lacks(t,
	      "pool=\"8\",uid=\"1001\",model=\"a\\\"b\\\\c\\nd\xef\xbf\xbd\",tier=\"disk\",state");
	lacks(t, "kvpalace_pool_spilled_pages_total{pool=\"8\"");
	free(t);
}

/* Summed over the pools (the exporter's default): no sample names a
 * pool, a uid or a model; tiers add up over the pools that have them. */
static void test_pools_summed(void **state)
{
	char *t;

	(void)state;
	fill();
	t = render_pools(&st, PROM_TEXT, 0);
	lacks(t, "pool=\"");
	lacks(t, "uid=\"");
	lacks(t, "model=\"");
	lacks(t, "llama");
	lacks(t, "kvpalace_page_bytes");
	has(t, "kvpalace_pools 2");
	has(t, "kvpalace_pool_evictions_total 16");
	has(t, "kvpalace_pool_tier_present{tier=\"host\"} 2");
	has(t, "kvpalace_pool_tier_present{tier=\"disk\"} 1");
	has(t, "kvpalace_pool_capacity_pages{tier=\"host\"} 110");
	has(t, "kvpalace_pool_pages{tier=\"host\",state=\"used\"} 40");
	has(t, "kvpalace_pool_pages{tier=\"host\",state=\"free\"} 70");
	has(t, "kvpalace_pool_pages{tier=\"disk\",state=\"used\"} 250");
	has(t, "kvpalace_pool_spilled_pages_total 300");
	has(t, "kvpalace_pool_device_copy_errors_total 2");
	has(t, "kvpalace_request_duration_seconds_count{request=\"MatchPrefix\"} 4");
	free(t);
}

static void test_histogram(void **state)
{
	char *t;

	(void)state;
	fill();
	t = render(&st, PROM_TEXT);
	has(t, "# TYPE kvpalace_request_duration_seconds histogram");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"MatchPrefix\",le=\"1e-05\"} 1");
	has(t,
	    "kvpalace_request_duration_seconds_bucket{request=\"MatchPrefix\",le=\"2.5e-05\"} 1");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"MatchPrefix\",le=\"0.0001\"} 3");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"MatchPrefix\",le=\"10\"} 3");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"MatchPrefix\",le=\"+Inf\"} 4");
	has(t, "kvpalace_request_duration_seconds_count{request=\"MatchPrefix\"} 4");
	has(t, "kvpalace_request_duration_seconds_sum{request=\"MatchPrefix\"} 12.00000025");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"Commit\",le=\"0.00025\"} 0");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"Commit\",le=\"0.0005\"} 3");
	has(t, "kvpalace_request_duration_seconds_bucket{request=\"Commit\",le=\"+Inf\"} 3");
	has(t, "kvpalace_request_duration_seconds_sum{request=\"Commit\"} 0.0006");
	/* 19 bounded buckets and +Inf per request type. */
	for (const char *p = t, *q; (q = strstr(p, "_bucket{request=\"Commit\"")); p = q + 1) {
		static int n;

		if (++n > KVP_LATENCY_BUCKETS)
			fail_msg("more than %d buckets", KVP_LATENCY_BUCKETS);
	}
	free(t);
}

static void test_down(void **state)
{
	char *t, *j;

	(void)state;
	t = render(NULL, PROM_TEXT);
	assert_string_equal(
		t, "# HELP kvpalace_up 1 when kvpalaced's admin socket answered, else 0.\n"
		   "# TYPE kvpalace_up gauge\n"
		   "kvpalace_up 0\n"
		   "# HELP kvpalace_build_info 1, labelled with a component's version: the daemon "
		   "and the program that wrote this page.\n"
		   "# TYPE kvpalace_build_info gauge\n"
		   "kvpalace_build_info{component=\"test\",version=\"1.2.3\"} 1\n");
	j = render(NULL, PROM_JSON);
	assert_non_null(
		strstr(j, "{\"socket\":\"/x\",\"up\":0,\"metrics\":[{\"name\":\"kvpalace_up\""));
	free(t);
	free(j);
}

/* Both forms through check_metrics.py: parsed as Prometheus would, the
 * histogram rules, and the JSON holding the same samples. */
static void test_parsers(void **state)
{
	const char *script = getenv("KVP_CHECK_METRICS");
	char tpath[] = "/tmp/kvp-prom-XXXXXX", jpath[] = "/tmp/kvp-prom-XXXXXX";
	char *t, *j;
	int tfd, jfd, status;
	pid_t pid;

	(void)state;
	if (!script || access("/usr/bin/python3", X_OK) != 0) {
		fprintf(stderr, "no $KVP_CHECK_METRICS or /usr/bin/python3: skipping\n");
		skip();
	}
	fill();
	t = render(&st, PROM_TEXT);
	j = render(&st, PROM_JSON);
	tfd = mkstemp(tpath);
	jfd = mkstemp(jpath);
	assert_true(tfd >= 0 && jfd >= 0);
	assert_int_equal(write(tfd, t, strlen(t)), (ssize_t)strlen(t));
	assert_int_equal(write(jfd, j, strlen(j)), (ssize_t)strlen(j));
	close(tfd);
	close(jfd);
	fflush(stderr);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		execl("/usr/bin/python3", "python3", script, "--json", jpath, tpath,
		      "kvpalace_up==1",
		      "kvpalace_request_duration_seconds_count{request=MatchPrefix}==4",
		      "kvpalace_page_bytes{pool=8,model=a\"b\\c\nd\xef\xbf\xbd}==4096", NULL);
		_exit(127);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	unlink(tpath);
	unlink(jpath);
	free(t);
	free(j);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("check_metrics.py failed on the formatter's page (status %d)", status);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),	  cmocka_unit_test(test_pools_summed),
		cmocka_unit_test(test_histogram), cmocka_unit_test(test_down),
		cmocka_unit_test(test_parsers),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
