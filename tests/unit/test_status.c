/* tests/unit/test_status.c — the Status ↔ errno table of proto/status.h.
 *
 * The client library turns every wire Status into the negative errno that
 * kvpalace.h documents, and the daemon turns its errors back; both rely on
 * one table. These tests pin each pair to what the protocol comments say,
 * check that every value of the Status enum (read from the generated
 * descriptor, so a new value cannot be forgotten) survives a round trip,
 * and check the fallbacks for values outside the table. Single-threaded.
 */
#include <errno.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "kvpalace.pb-c.h"
#include "status.h"

/* The documented pairs (proto/kvpalace.proto, client/kvpalace.h). */
static const struct {
	int status;
	int err;
} documented[] = {
	{KVPALACE__V1__STATUS__STATUS_OK, 0},
	{KVPALACE__V1__STATUS__STATUS_INVALID, -EINVAL},
	{KVPALACE__V1__STATUS__STATUS_NOT_FOUND, -ENOENT},
	{KVPALACE__V1__STATUS__STATUS_NO_SPACE, -ENOSPC},
	{KVPALACE__V1__STATUS__STATUS_BUSY, -EBUSY},
	{KVPALACE__V1__STATUS__STATUS_PROTOCOL, -EPROTO},
	{KVPALACE__V1__STATUS__STATUS_TOO_BIG, -EMSGSIZE},
	{KVPALACE__V1__STATUS__STATUS_UNSUPPORTED, -EOPNOTSUPP},
	{KVPALACE__V1__STATUS__STATUS_PERMISSION, -EPERM},
	{KVPALACE__V1__STATUS__STATUS_LIMIT, -EDQUOT},
	{KVPALACE__V1__STATUS__STATUS_INTERNAL, -EIO},
	{KVPALACE__V1__STATUS__STATUS_NO_MEMORY, -ENOMEM},
	{KVPALACE__V1__STATUS__STATUS_EXISTS, -EEXIST},
	{KVPALACE__V1__STATUS__STATUS_RANGE, -ERANGE},
	{KVPALACE__V1__STATUS__STATUS_VERSION, -EPROTONOSUPPORT},
	{KVPALACE__V1__STATUS__STATUS_CORRUPT, -EBADMSG},
};
#define N_DOCUMENTED (sizeof(documented) / sizeof(documented[0]))

static void test_documented_pairs(void **state)
{
	for (size_t i = 0; i < N_DOCUMENTED; i++) {
		assert_int_equal(status_to_errno(documented[i].status), documented[i].err);
		assert_int_equal(status_from_errno(documented[i].err), documented[i].status);
	}
}

static void test_every_enum_value_round_trips(void **state)
{
	const ProtobufCEnumDescriptor *d = &kvpalace__v1__status__descriptor;

	/* The table above must cover the whole enum. */
	assert_int_equal(d->n_values, N_DOCUMENTED);
	for (unsigned i = 0; i < d->n_values; i++) {
		int s = d->values[i].value;
		int err = status_to_errno(s);

		assert_true(err <= 0);
		/* Only STATUS_PROTOCOL itself may map to -EPROTO, the fallback. */
		if (s != KVPALACE__V1__STATUS__STATUS_PROTOCOL)
			assert_int_not_equal(err, -EPROTO);
		assert_int_equal(status_from_errno(err), s);
	}
}

static void test_errnos_are_distinct(void **state)
{
	for (size_t i = 0; i < N_DOCUMENTED; i++)
		for (size_t j = i + 1; j < N_DOCUMENTED; j++)
			assert_int_not_equal(status_to_errno(documented[i].status),
					     status_to_errno(documented[j].status));
}

static void test_unknown_values(void **state)
{
	/* A status from a newer daemon is a protocol error for this library. */
	assert_int_equal(status_to_errno(-1), -EPROTO);
	assert_int_equal(status_to_errno(999), -EPROTO);
	assert_int_equal(status_to_errno(0x7fffffff), -EPROTO);
	/* An errno the protocol has no word for is an internal failure. */
	assert_int_equal(status_from_errno(-EXDEV), KVPALACE__V1__STATUS__STATUS_INTERNAL);
	assert_int_equal(status_from_errno(-ENOTDIR), KVPALACE__V1__STATUS__STATUS_INTERNAL);
	/* Positive errno is accepted as its negative. */
	assert_int_equal(status_from_errno(ENOSPC), KVPALACE__V1__STATUS__STATUS_NO_SPACE);
	assert_int_equal(status_from_errno(0), KVPALACE__V1__STATUS__STATUS_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_documented_pairs),
		cmocka_unit_test(test_every_enum_value_round_trips),
		cmocka_unit_test(test_errnos_are_distinct),
		cmocka_unit_test(test_unknown_values),
	};

	return cmocka_run_group_tests_name("status", tests, NULL, NULL);
}
