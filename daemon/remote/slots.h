/* daemon/remote/slots.h — Redis Cluster's key → slot function and its
 * slot → node table, parsed from a CLUSTER SLOTS reply.
 *
 * A Redis Cluster splits the key space into 16384 hash slots: a key's slot
 * is CRC16 (the XMODEM variant: polynomial 0x1021, initial value 0, no
 * reflection) of the key modulo 16384, or of the text between the first
 * '{' and the next '}' when that text is not empty (a "hash tag", which
 * puts related keys on one node). Each slot is served by one master.
 *
 * slots_parse reads the reply of CLUSTER SLOTS, an array of
 * [start, end, [host, port, id...], replicas...], into a table: each
 * slot's owner (the first node of its range, the master) as an index into
 * a list of distinct host:port addresses. The reply comes from the
 * network and is untrusted: every element's type, every slot number and
 * every port is checked, and anything malformed rejects the whole reply
 * rather than leaving half a map.
 *
 * Pure functions on memory the caller owns; no I/O, no logging, no state:
 * safe on any thread.
 */
#ifndef KVPD_SLOTS_H
#define KVPD_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#define SLOTS_N		16384u
#define SLOTS_NONE	0xffffu /* a slot no node serves */
#define SLOTS_MAX_NODES 256u	/* distinct masters in one table */
#define SLOTS_HOST_MAX	256u	/* a host name or address, with its NUL */

/* CRC16-XMODEM of len bytes: "123456789" gives 0x31C3. */
uint16_t slots_crc16(const void *buf, size_t len);

/* The slot (0..16383) of a key of len bytes, hash tags included. */
unsigned int slots_key_slot(const void *key, size_t len);

struct slots_addr {
	char host[SLOTS_HOST_MAX];
	int port; /* 1..65535 */
};

struct slots_table {
	uint16_t owner[SLOTS_N]; /* index into addr, or SLOTS_NONE */
	unsigned int n_addr;
	struct slots_addr addr[SLOTS_MAX_NODES];
	unsigned int n_covered; /* slots with an owner */
};

/* Fills t from r, a CLUSTER SLOTS reply. An empty host (a node that does
 * not know its own address) stands for default_host, the address the
 * reply came from (may be NULL: then such a reply is rejected). Returns 0,
 * or -EBADMSG when r is not a well-formed reply (wrong types, a start
 * above its end, a slot above 16383, a port outside 1..65535, a host too
 * long, a range without a node) or -E2BIG when it names more than
 * SLOTS_MAX_NODES masters; t is then left zeroed, no slot owned. */
int slots_parse(const redisReply *r, const char *default_host, struct slots_table *t);

/* The index of host:port in t, added when absent. Returns the index, or
 * -E2BIG when t is full, or -EINVAL for a host too long or a bad port. */
int slots_addr_index(struct slots_table *t, const char *host, int port);

#endif
