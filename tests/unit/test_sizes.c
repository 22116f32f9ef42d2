/* tests/unit/test_sizes.c — prints the sizes of the structures that matter
 * (memcached's habit: a size that grows shows up in the test log) and
 * checks the ones that are ABI: the frame header, the shared-memory layout,
 * and the public struct kvp_layout, which must stay field for field the
 * same as struct shm_layout because the library hands one to the other.
 */
#include <stdio.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "events.h"
#include "frame.h"
#include "kvpalace.h"
#include "layout.h"
#include "pagealloc.h"
#include "session.h"
#include "stats.h"
#include "validate.h"

#define SHOW(T) printf("%-40s %6zu\n", #T, sizeof(T))

static void test_print_sizes(void **state)
{
	SHOW(struct frame_header);
	SHOW(struct frame_arena);
	SHOW(struct shm_layout);
	SHOW(struct pagealloc);
	SHOW(struct session);
	SHOW(struct tokvec_chunk);
	SHOW(struct policy);
	SHOW(struct validate_limits);
	SHOW(struct kv_event);
	printf("%-40s %6zu\n", "event rings at most, MiB",
	       sizeof(struct kv_event) * KV_EVENTS_KEEP * (KV_EVENTS_MAX_TENANTS + 1) >> 20);
	SHOW(struct kvp_layout);
	SHOW(struct kvp_pool_stats);
	SHOW(struct kvp_stats);
	SHOW(Kvpalace__V1__Request);
	SHOW(Kvpalace__V1__Response);
	SHOW(Kvpalace__V1__AppendRequest);
	SHOW(Kvpalace__V1__AppendResponse);
	SHOW(Kvpalace__V1__MatchPrefixResponse);
	SHOW(Kvpalace__V1__PoolStats);
	printf("%-40s %6zu\n", "frame_arena_bytes(default cap)",
	       frame_arena_bytes(FRAME_DEFAULT_MAX_BYTES));
	printf("%-40s %6zu\n", "frame_arena_bytes(max cap)",
	       frame_arena_bytes(FRAME_MAX_MAX_BYTES));
	printf("%-40s %6zu\n", "frame_response_bound per wire byte",
	       frame_response_bound(1) - frame_response_bound(0));
	printf("%-40s %6zu\n", "frame_response_bound(max cap)",
	       frame_response_bound(FRAME_MAX_MAX_BYTES));
}

#define SAME_FIELD(f)                                                                              \
	do {                                                                                       \
		assert_int_equal(offsetof(struct kvp_layout, f), offsetof(struct shm_layout, f));  \
		assert_int_equal(sizeof(((struct kvp_layout *)0)->f),                              \
				 sizeof(((struct shm_layout *)0)->f));                             \
	} while (0)

static void test_abi_sizes(void **state)
{
	assert_int_equal(sizeof(struct frame_header), FRAME_HEADER_BYTES);
	assert_int_equal(sizeof(struct shm_layout), 28);
	assert_int_equal(sizeof(struct kvp_layout), sizeof(struct shm_layout));
	SAME_FIELD(n_layers);
	SAME_FIELD(n_kv_heads);
	SAME_FIELD(head_dim);
	SAME_FIELD(block_tokens);
	SAME_FIELD(dtype);
	SAME_FIELD(format);
	SAME_FIELD(quant_group);
	/* The dtype numbers are one list in three places. */
	assert_int_equal(KVP_DTYPE_F16, SHM_DTYPE_F16);
	assert_int_equal(KVP_DTYPE_BF16, SHM_DTYPE_BF16);
	assert_int_equal(KVP_DTYPE_F32, SHM_DTYPE_F32);
	assert_int_equal(KVP_DTYPE_INT8, SHM_DTYPE_INT8);
	assert_int_equal(KVP_DTYPE_FP8_E4M3, SHM_DTYPE_FP8_E4M3);
	assert_int_equal(KVP_DTYPE_INT4, SHM_DTYPE_INT4);
	assert_int_equal(KVP_DTYPE_F16, KVPALACE__V1__DTYPE__DTYPE_F16);
	assert_int_equal(KVP_DTYPE_BF16, KVPALACE__V1__DTYPE__DTYPE_BF16);
	assert_int_equal(KVP_DTYPE_F32, KVPALACE__V1__DTYPE__DTYPE_F32);
	assert_int_equal(KVP_DTYPE_INT8, KVPALACE__V1__DTYPE__DTYPE_INT8);
	assert_int_equal(KVP_DTYPE_FP8_E4M3, KVPALACE__V1__DTYPE__DTYPE_FP8_E4M3);
	assert_int_equal(KVP_DTYPE_INT4, KVPALACE__V1__DTYPE__DTYPE_INT4);
	assert_int_equal(KVP_DTYPE_E4M3_RAW, SHM_DTYPE_E4M3_RAW);
	assert_int_equal(KVP_DTYPE_E5M2_RAW, SHM_DTYPE_E5M2_RAW);
	assert_int_equal(KVP_DTYPE_E4M3_RAW, KVPALACE__V1__DTYPE__DTYPE_E4M3_RAW);
	assert_int_equal(KVP_DTYPE_E5M2_RAW, KVPALACE__V1__DTYPE__DTYPE_E5M2_RAW);
	assert_int_equal(KVP_FORMAT_KV, SHM_FORMAT_KV);
	assert_int_equal(KVP_FORMAT_LATENT, SHM_FORMAT_LATENT);
	/* The daemon's page cap is the one the manual promises. */
	assert_int_equal(STATS_LIST_MAX, KVP_LIST_SESSIONS_MAX);
	/* A model id of the longest allowed length fits kvp_pool_stats. */
	assert_true(sizeof(((struct kvp_pool_stats *)0)->model_id) > VALIDATE_MODEL_ID_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_print_sizes),
		cmocka_unit_test(test_abi_sizes),
	};

	return cmocka_run_group_tests_name("sizes", tests, NULL, NULL);
}
