/* tests/integration/test_nogpu.c — the GPU tier where there is no GPU.
 *
 * Issue 7 makes the GPU a tier, never a requirement. This test runs on
 * every machine (it hides any GPU from the daemon with
 * CUDA_VISIBLE_DEVICES="", so it means the same on a GPU machine) and
 * checks what a user without a GPU sees: the daemon starts and says once,
 * in Stats, that it serves the host and disk tiers only and why; a pool
 * has no device arena; a client that asks for the GPU tier gets a clear
 * "unsupported" error naming the reason, with nothing pinned, or the host
 * tier when it allowed that fallback; the new requests (OpenDeviceArena,
 * LeaseDevice, tiers on Append) answer errors without costing the
 * connection; and everything else serves as before, from another process.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "harness.h"

#define N_TOKENS 200 /* 12 whole pages of 16 and a partial one */
#define MODEL	 "nogpu-model"
#define SEQ	 7

static uint32_t tokens[N_TOKENS];

/* Stats says: no GPU, and why. */
static void test_stats_say_host_only(void **state)
{
	struct harness *h = *state;
	struct kvp_stats *st;
	kvp_client *c;

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(st->gpu, 0);
	/* "no GPU: host and disk tiers only (reason)", the reason being
	 * CUDA's error, or that the build has no CUDA. */
	assert_non_null(strstr(st->gpu_status, "no GPU: host and disk tiers only ("));
	assert_true(strstr(st->gpu_status, "cudaGetDeviceCount") != NULL ||
		    strstr(st->gpu_status, "built without CUDA") != NULL);
	kvp_stats_free(st);
	kvp_disconnect(c);
}

/* A writer in another process commits the prefix. */
static int writer(void *arg)
{
	struct harness *h = arg;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;

	CHILD_CHECK_EQ(kvp_connect(h->sock, &c), 0);
	CHILD_CHECK_EQ(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	CHILD_CHECK_EQ(kvp_pool_has_gpu(p), 0);
	CHILD_CHECK_EQ(harness_pkv_commit_session(p, tokens, N_TOKENS, &s), 0);
	kvp_disconnect(c);
	return 0;
}

static void test_gpu_requests_refused_or_served_from_host(void **state)
{
	struct harness *h = *state;
	struct kvp_pool_stats ps;
	kvp_client *c;
	kvp_pool *p;
	kvp_lease *l = NULL;
	uint32_t coming = 99;

	harness_tokens(tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, h), 0);

	assert_int_equal(kvp_connect(h->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, MODEL, &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_has_gpu(p), 0);
	assert_int_equal(kvp_pool_gpu_pages(p), 0);
	assert_int_equal(kvp_pool_gpu_open(p), -EOPNOTSUPP);

	/* The GPU tier without the fallback: refused, with the reason, and
	 * nothing pinned. */
	assert_int_equal(kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, 0, &l),
			 -EOPNOTSUPP);
	assert_null(l);
	assert_non_null(strstr(kvp_strerror(c, -EOPNOTSUPP), "no GPU"));
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.leased_pages, 0);
	assert_int_equal(ps.has_gpu, 0);
	assert_int_equal(ps.device_pages, 0);
	assert_int_equal(kvp_prefetch_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, 0, &coming),
			 -EOPNOTSUPP);
	assert_int_equal(coming, 99);
	/* Unknown tiers and flags are the caller's mistake. */
	assert_int_equal(kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_DISK, 0, &l), -EINVAL);
	assert_int_equal(kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, 8, &l), -EINVAL);

	/* With the fallback: the host tier, every byte right. */
	assert_int_equal(
		kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, KVP_TIER_OR_HOST, &l), 0);
	assert_int_equal(kvp_lease_tier(l), KVP_TIER_HOST);
	assert_int_equal(kvp_lease_tokens(l), harness_whole(N_TOKENS, 16));
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
	assert_null(kvp_lease_device_kv(l, 0, 0, 0, 0));
	assert_int_equal(harness_pool_stats(c, kvp_pool_id(p), &ps, NULL), 0);
	assert_int_equal(ps.leased_pages, N_TOKENS / 16);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(
		kvp_prefetch_tier(p, tokens, N_TOKENS, KVP_TIER_GPU, KVP_TIER_OR_HOST, &coming), 0);

	/* The host tier as always, through the tier call and the old one. */
	assert_int_equal(kvp_match_prefix_tier(p, tokens, N_TOKENS, KVP_TIER_HOST, 0, &l), 0);
	assert_int_equal(kvp_lease_tier(l), KVP_TIER_HOST);
	assert_int_equal(harness_pkv_check_lease(l, p, tokens, kvp_lease_tokens(l)), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, N_TOKENS, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), harness_whole(N_TOKENS, 16));
	assert_int_equal(kvp_lease_release(l), 0);
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
}

/* The new requests on the wire: errors, never a lost connection. */
static void test_raw_gpu_requests(void **state)
{
	struct harness *h = *state;
	Kvpalace__V1__Request req = KVPALACE__V1__REQUEST__INIT;
	Kvpalace__V1__OpenDeviceArenaRequest oda = KVPALACE__V1__OPEN_DEVICE_ARENA_REQUEST__INIT;
	Kvpalace__V1__LeaseDeviceRequest ld = KVPALACE__V1__LEASE_DEVICE_REQUEST__INIT;
	Kvpalace__V1__MatchPrefixRequest mp;
	Kvpalace__V1__AppendRequest ap;
	Kvpalace__V1__Response *resp;
	struct raw *r = calloc(1, sizeof(*r));
	uint64_t pool_id, session_id, lease_id;
	int fd = -1;

	assert_non_null(r);
	harness_tokens(tokens, N_TOKENS, SEQ, 0);
	assert_int_equal(harness_run_child(writer, h), 0);
	assert_int_equal(raw_open(r, h->sock), 0);
	assert_int_equal(raw_open_pool(r, MODEL, &harness_layout, &pool_id), 0);

	/* OpenDeviceArena: unsupported, and no fd. */
	req.id = 900;
	req.op_case = KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA;
	req.open_device_arena = &oda;
	oda.pool_id = pool_id;
	assert_int_equal(raw_call(r, &req, &resp, &fd), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_UNSUPPORTED);
	assert_non_null(strstr(resp->error, "no GPU"));
	assert_int_equal(fd, -1);
	oda.pool_id = pool_id + 1000;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);

	/* MatchPrefix: the GPU refused; the disk tier is no tier to read
	 * from; the GPU with or_host answers from the host. */
	raw_req_match(&req, &mp, pool_id, tokens, N_TOKENS);
	mp.has_tier = 1;
	mp.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_UNSUPPORTED);
	mp.tier = KVPALACE__V1__TIER__TIER_DISK;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_INVALID);
	mp.tier = KVPALACE__V1__TIER__TIER_GPU;
	mp.has_or_host = 1;
	mp.or_host = 1;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_true(resp->match_prefix->has_tier);
	assert_int_equal(resp->match_prefix->tier, KVPALACE__V1__TIER__TIER_HOST);
	assert_int_equal(resp->match_prefix->matched_tokens, harness_whole(N_TOKENS, 16));
	lease_id = resp->match_prefix->lease_id;
	assert_true(lease_id != 0);

	/* LeaseDevice on that lease: unsupported; on no lease: not found. */
	req.id = 901;
	req.op_case = KVPALACE__V1__REQUEST__OP_LEASE_DEVICE;
	req.lease_device = &ld;
	ld.lease_id = lease_id;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_UNSUPPORTED);
	ld.lease_id = lease_id + 1000;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_NOT_FOUND);

	/* Append on the GPU tier: refused, or host slots with or_host. */
	assert_int_equal(raw_create_session(r, pool_id, &session_id), 0);
	raw_req_append(&req, &ap, session_id, tokens, 20);
	ap.has_tier = 1;
	ap.tier = KVPALACE__V1__TIER__TIER_GPU;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_UNSUPPORTED);
	ap.has_or_host = 1;
	ap.or_host = 1;
	assert_int_equal(raw_call(r, &req, &resp, NULL), 1);
	assert_int_equal(resp->status, KVPALACE__V1__STATUS__STATUS_OK);
	assert_int_equal(resp->append->tier, KVPALACE__V1__TIER__TIER_HOST);
	assert_int_equal(resp->append->n_page_slots, 2);

	/* The connection still serves. */
	assert_int_equal(raw_hello(r), 0);
	raw_close(r);
	free(r);
}

static int setup_plain(void **state)
{
	return harness_setup(state);
}

/* A GPU tier configured (as a GPU machine's configuration would say) on a
 * machine without one changes nothing. */
static int setup_configured(void **state)
{
	static const char *const extra[] = {"--gpu-pool-size",
					    "64M",
					    "--gpu-high-watermark",
					    "0.5",
					    "--gpu-low-watermark",
					    "0.25",
					    NULL};

	return harness_setup_args(state, extra);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_stats_say_host_only, setup_plain,
						harness_teardown),
		cmocka_unit_test_setup_teardown(test_gpu_requests_refused_or_served_from_host,
						setup_plain, harness_teardown),
		cmocka_unit_test_setup_teardown(test_raw_gpu_requests, setup_configured,
						harness_teardown),
	};

	/* Whatever the machine has, this daemon sees no GPU. */
	setenv("CUDA_VISIBLE_DEVICES", "", 1);
	return cmocka_run_group_tests_name("nogpu", tests, NULL, NULL);
}
