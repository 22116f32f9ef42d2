/* proto/status.c — the Status ↔ errno table (see status.h). */
#include <errno.h>
#include <stddef.h>

#include "kvpalace.pb-c.h"
#include "status.h"

static const struct {
	int status;
	int err;
} table[] = {
	{KVPALACE__V1__STATUS__STATUS_OK, 0},
	{KVPALACE__V1__STATUS__STATUS_INVALID, EINVAL},
	{KVPALACE__V1__STATUS__STATUS_NOT_FOUND, ENOENT},
	{KVPALACE__V1__STATUS__STATUS_NO_SPACE, ENOSPC},
	{KVPALACE__V1__STATUS__STATUS_BUSY, EBUSY},
	{KVPALACE__V1__STATUS__STATUS_PROTOCOL, EPROTO},
	{KVPALACE__V1__STATUS__STATUS_TOO_BIG, EMSGSIZE},
	{KVPALACE__V1__STATUS__STATUS_UNSUPPORTED, EOPNOTSUPP},
	{KVPALACE__V1__STATUS__STATUS_PERMISSION, EPERM},
	{KVPALACE__V1__STATUS__STATUS_LIMIT, EDQUOT},
	{KVPALACE__V1__STATUS__STATUS_INTERNAL, EIO},
	{KVPALACE__V1__STATUS__STATUS_NO_MEMORY, ENOMEM},
	{KVPALACE__V1__STATUS__STATUS_EXISTS, EEXIST},
	{KVPALACE__V1__STATUS__STATUS_RANGE, ERANGE},
	{KVPALACE__V1__STATUS__STATUS_VERSION, EPROTONOSUPPORT},
	{KVPALACE__V1__STATUS__STATUS_CORRUPT, EBADMSG},
};

int status_to_errno(int status)
{
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (table[i].status == status)
			return -table[i].err;
	return -EPROTO;
}

int status_from_errno(int err)
{
	if (err < 0)
		err = -err;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
		if (table[i].err == err)
			return table[i].status;
	return KVPALACE__V1__STATUS__STATUS_INTERNAL;
}
