/* daemon/service/reply.h — a reply being built, and what it holds.
 *
 * Handlers fill a struct reply whose storage outlives them until
 * reply_fini, so repeated fields can point straight into daemon tables
 * (page slots are not copied); anything a handler allocated for it hangs
 * off heap. The server layer packs resp and sends it with pass_fd. The
 * protobuf types of replies appear only in this layer and in proto/.
 * Event-loop thread only.
 */
#ifndef KVPD_REPLY_H
#define KVPD_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "kvpalace.pb-c.h"

struct pool;

struct reply {
	Kvpalace__V1__Response resp;
	union {
		Kvpalace__V1__HelloResponse hello;
		Kvpalace__V1__OpenPoolResponse open_pool;
		Kvpalace__V1__CreateSessionResponse create_session;
		Kvpalace__V1__CloseSessionResponse close_session;
		Kvpalace__V1__AppendResponse append;
		Kvpalace__V1__CommitResponse commit;
		Kvpalace__V1__MatchPrefixResponse match_prefix;
		Kvpalace__V1__ReleaseResponse release;
		Kvpalace__V1__StatsResponse stats;
		Kvpalace__V1__ForkResponse fork;
		Kvpalace__V1__TruncateResponse truncate;
		Kvpalace__V1__SessionPagesResponse session_pages;
		Kvpalace__V1__ListSessionsResponse list_sessions;
		Kvpalace__V1__ShowSessionResponse show_session;
		Kvpalace__V1__DropSessionResponse drop_session;
		Kvpalace__V1__DropPoolResponse drop_pool;
		Kvpalace__V1__EvictResponse evict;
		Kvpalace__V1__ConfigShowResponse config_show;
		Kvpalace__V1__ConfigReloadResponse config_reload;
		Kvpalace__V1__PurgeResponse purge;
		Kvpalace__V1__CheckpointResponse checkpoint;
		Kvpalace__V1__RestoreResponse restore;
		Kvpalace__V1__ListCheckpointsResponse list_checkpoints;
		Kvpalace__V1__WarmupResponse warmup;
		Kvpalace__V1__DeleteCheckpointResponse delete_checkpoint;
		Kvpalace__V1__PrefetchResponse prefetch;
		Kvpalace__V1__LookupResponse lookup;
		Kvpalace__V1__AdoptLeaseResponse adopt_lease;
		Kvpalace__V1__LeasePagesResponse lease_pages;
		Kvpalace__V1__SubscribeEventsResponse subscribe_events;
		Kvpalace__V1__KvEvents events;
		Kvpalace__V1__SetPolicyResponse set_policy;
		Kvpalace__V1__TagSpanResponse tag_span;
		Kvpalace__V1__ReportImportanceResponse report_importance;
		Kvpalace__V1__CompactResponse compact;
		Kvpalace__V1__SessionMetaResponse session_meta;
		Kvpalace__V1__OpenDeviceArenaResponse open_device_arena;
		Kvpalace__V1__LeaseDeviceResponse lease_device;
	} u;
	struct pool *park; /* parked: the pool whose disk I/O it waits for */
	void *heap;	   /* freed by reply_fini */
	int pass_fd;	   /* fd to send with the reply (owned), or -1 */
};

/* Bytes of a reply of at most max_message_bytes left for its repeated
 * fields, once the frame header and fixed_bytes for the envelope and the
 * fixed fields are taken: what every handler that fills a list or a
 * page table measures against, so a reply never outgrows the cap. */
static inline size_t reply_room(uint32_t max_message_bytes, size_t fixed_bytes)
{
	return max_message_bytes - FRAME_HEADER_BYTES - fixed_bytes;
}

/* Entries of at most item_bytes each packed that fit in such a reply
 * (a packed uint32 slot takes at most 5 bytes). */
static inline uint64_t reply_fit(uint32_t max_message_bytes, size_t fixed_bytes, size_t item_bytes)
{
	return reply_room(max_message_bytes, fixed_bytes) / item_bytes;
}

/* Frees what the handler hung off r (r->heap); r->pass_fd stays. */
void reply_fini(struct reply *r);

#endif
