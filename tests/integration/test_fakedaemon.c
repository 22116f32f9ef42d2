/* tests/integration/test_fakedaemon.c — the client library against a daemon
 * that misbehaves.
 *
 * A forked fake daemon on a socket in a temporary directory answers the
 * library's requests wrongly in one way per test: another protocol
 * version, a garbled or mis-addressed reply, a closed connection, an arena
 * fd that is no sealed arena or is smaller than announced, Append slots
 * outside the arena, a match that is not whole pages, Commit, Truncate and
 * SessionPages (after Fork) replies whose page slots lie outside the arena
 * or at the wrong place, admin replies that contradict their request (a
 * session view with more slots than asked, a drop of another session, an
 * eviction whose pools do not add up), and checkpoint replies that cannot
 * be right (a restored session with a slot outside the arena, in its
 * first window or in the SessionPages after it, more pages than the arena
 * holds or in another pool; a checkpoint whose pages do not fit its
 * tokens; a list with an invalid name or of another uid than asked; an
 * admin restore into another pool; a warm-up sharing more pages than it
 * indexed), and GPU-tier replies (a device arena that is no sealed memfd,
 * device slots past the device arena, a LeaseDevice without slots), and
 * KV event pushes (a hash of 15 bytes, numbers going back, more tokens
 * than a page holds).
 * kvpalace.h promises -EPROTONOSUPPORT for another version,
 * -EPROTO (and a closed connection, -ENOTCONN afterwards) for a malformed
 * reply, -EPIPE/-ECONNRESET when the daemon goes away — and, in no case,
 * a pointer outside the arena. A checkpoint refusal (corrupt, newer,
 * foreign, missing) is an errno and leaves the connection usable; a
 * restore whose page table cannot be read is given back (CloseSession);
 * an invalid checkpoint name never leaves the library.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "arena.h"
#include "harness.h"
#include "layout.h"
#include "le.h"

#define ST(x)	   KVPALACE__V1__STATUS__STATUS_##x
#define FAKE_PAGES 16

enum fake_mode {
	FAKE_GOOD,	      /* behaves */
	FAKE_VERSION_STATUS,  /* Hello: STATUS_VERSION */
	FAKE_VERSION_2,	      /* Hello: OK, protocol_version 2 */
	FAKE_GARBAGE,	      /* Hello: bytes that are no reply */
	FAKE_WRONG_ID,	      /* Hello: the reply carries another id */
	FAKE_CLOSE,	      /* Hello: the connection closes */
	FAKE_NO_FD,	      /* OpenPool: no arena fd */
	FAKE_UNSEALED,	      /* OpenPool: an unsealed memfd */
	FAKE_SMALL_ARENA,     /* OpenPool: more pages than the arena holds */
	FAKE_BAD_SLOTS,	      /* Append: a slot past the arena */
	FAKE_BAD_FIRST_TOKEN, /* Append: reserved at the wrong position */
	FAKE_MATCH_TOO_LONG,  /* MatchPrefix: more tokens than asked */
	FAKE_COMMIT_TOO_MANY, /* Commit: more committed than reserved */
	FAKE_MATCH_PARTIAL,   /* MatchPrefix: a match that ends inside a page */
	FAKE_COMMIT_BAD_SLOT, /* Commit: a filled page moved past the arena */
	FAKE_COMMIT_NO_SLOTS, /* Commit: filled pages, but no slots for them */
	FAKE_TRUNC_BAD_SLOT,  /* Truncate: the copied last page past the arena */
	FAKE_FORK_BAD_SLOT,   /* SessionPages of a fork: a slot past the arena */
	/* The GPU tier: OpenPool offers a device arena of FAKE_DEV_PAGES. */
	FAKE_GPU_GOOD,		  /* device replies that fit their requests */
	FAKE_GPU_UNSEALED,	  /* OpenDeviceArena: an unsealed memfd */
	FAKE_GPU_LEASE_BAD_SLOT,  /* LeaseDevice: a slot past the device arena */
	FAKE_GPU_APPEND_BAD_SLOT, /* Append on the GPU: a device slot past the arena */
	FAKE_GPU_LEASE_SHORT,	  /* LeaseDevice: no slots at all */
	FAKE_ADMIN_GOOD,	  /* admin replies that fit their requests */
	FAKE_SHOW_TOO_MANY,	  /* ShowSession: more slots than asked for */
	FAKE_DROP_OTHER,	  /* DropSession: another session dropped */
	FAKE_EVICT_SUM,		  /* Evict: pools that do not add up to the total */
	FAKE_STATS_GARBAGE,	  /* Stats: bytes that are no reply */
	/* Checkpoints; from here on Hello says admin, uid FAKE_UID. */
	FAKE_CKPT_GOOD,		       /* checkpoint replies that fit their requests */
	FAKE_RESTORE_BAD_SLOT,	       /* Restore: a slot past the arena */
	FAKE_RESTORE_TOO_LONG,	       /* Restore: more pages than the arena holds */
	FAKE_RESTORE_OTHER_POOL,       /* Restore: into another pool than asked */
	FAKE_RESTORE_PAGES_BAD_SLOT,   /* SessionPages of a restore: a slot past the arena */
	FAKE_RESTORE_PAGES_GONE,       /* SessionPages of a restore: not found */
	FAKE_CKPT_BAD_PAGES,	       /* Checkpoint: pages that do not fit the tokens */
	FAKE_LIST_BAD_NAME,	       /* ListCheckpoints: a name no checkpoint may have */
	FAKE_LIST_OTHER_UID,	       /* ListCheckpoints: another uid than asked */
	FAKE_LIST_FOREIGN,	       /* ListCheckpoints, client socket: another tenant's */
	FAKE_ADMIN_RESTORE_OTHER_POOL, /* admin Restore: another pool than asked */
	FAKE_WARMUP_SHARED,	       /* Warmup: more shared pages than indexed */
	FAKE_LIST_OTHER_NAME,	       /* ListCheckpoints of one name: others listed */
	FAKE_LIST_UNASKED_VERIFY,      /* ListCheckpoints: "verified" when not asked to */
	FAKE_EVENTS_GOOD,	       /* SubscribeEvents, then one well-formed push */
	FAKE_EVENTS_SHORT_HASH,	       /* ... a push whose hash is 15 bytes */
	FAKE_EVENTS_BACKWARDS,	       /* ... a push whose numbers go back */
	FAKE_EVENTS_TOO_MANY_TOKENS,   /* ... a stored page with more tokens than a page holds */
};

#define FAKE_UID	     1000u
#define FAKE_DEV_PAGES	     4u
#define IS_GPU_MODE(m)	     ((m) >= FAKE_GPU_GOOD && (m) <= FAKE_GPU_LEASE_SHORT)
#define FAKE_RESTORED_ID     11u /* the session a Restore makes */
#define FAKE_RESTORED_TOKENS 40u

struct fake {
	char dir[80];
	char sock[108];
	int listen_fd;
	enum fake_mode mode;
};

static int send_resp(int c, Kvpalace__V1__Response *resp, int fd)
{
	unsigned char buf[4096];
	int n = frame_pack_response(resp, buf, sizeof(buf), sizeof(buf));

	if (n < 0)
		return n;
	return frame_send(c, buf, (size_t)n, fd);
}

/* Serves one connection the way f->mode says. */
static int fake_daemon(void *arg)
{
	struct fake *f = arg;
	unsigned char buf[FRAME_MAX_MAX_BYTES + 1];
	static unsigned char mem[1 << 20];
	struct frame_arena a;
	struct shm_layout layout = {0};
	uint64_t reserved = 0, committed = 0;
	int closed_restored = 0; /* CloseSession of the restored session came */
	int c = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);

	if (c < 0)
		return 1;
	for (;;) {
		Kvpalace__V1__Response resp = KVPALACE__V1__RESPONSE__INIT;
		Kvpalace__V1__HelloResponse hello = KVPALACE__V1__HELLO_RESPONSE__INIT;
		Kvpalace__V1__OpenPoolResponse op = KVPALACE__V1__OPEN_POOL_RESPONSE__INIT;
		Kvpalace__V1__CreateSessionResponse cs =
			KVPALACE__V1__CREATE_SESSION_RESPONSE__INIT;
		Kvpalace__V1__AppendResponse app = KVPALACE__V1__APPEND_RESPONSE__INIT;
		Kvpalace__V1__CommitResponse cm = KVPALACE__V1__COMMIT_RESPONSE__INIT;
		Kvpalace__V1__MatchPrefixResponse mp = KVPALACE__V1__MATCH_PREFIX_RESPONSE__INIT;
		Kvpalace__V1__ReleaseResponse rel = KVPALACE__V1__RELEASE_RESPONSE__INIT;
		Kvpalace__V1__ForkResponse fk = KVPALACE__V1__FORK_RESPONSE__INIT;
		Kvpalace__V1__TruncateResponse tr = KVPALACE__V1__TRUNCATE_RESPONSE__INIT;
		Kvpalace__V1__SessionPagesResponse sp = KVPALACE__V1__SESSION_PAGES_RESPONSE__INIT;
		Kvpalace__V1__ShowSessionResponse sh = KVPALACE__V1__SHOW_SESSION_RESPONSE__INIT;
		Kvpalace__V1__SessionInfo si = KVPALACE__V1__SESSION_INFO__INIT;
		Kvpalace__V1__Layout sl = KVPALACE__V1__LAYOUT__INIT;
		Kvpalace__V1__DropSessionResponse ds = KVPALACE__V1__DROP_SESSION_RESPONSE__INIT;
		Kvpalace__V1__EvictResponse ev = KVPALACE__V1__EVICT_RESPONSE__INIT;
		Kvpalace__V1__EvictedPool evp[2] = {KVPALACE__V1__EVICTED_POOL__INIT,
						    KVPALACE__V1__EVICTED_POOL__INIT};
		Kvpalace__V1__EvictedPool *evps[2] = {&evp[0], &evp[1]};
		Kvpalace__V1__CloseSessionResponse cls = KVPALACE__V1__CLOSE_SESSION_RESPONSE__INIT;
		Kvpalace__V1__CheckpointResponse ck = KVPALACE__V1__CHECKPOINT_RESPONSE__INIT;
		Kvpalace__V1__RestoreResponse rs = KVPALACE__V1__RESTORE_RESPONSE__INIT;
		Kvpalace__V1__WarmupResponse wu = KVPALACE__V1__WARMUP_RESPONSE__INIT;
		Kvpalace__V1__ListCheckpointsResponse lc =
			KVPALACE__V1__LIST_CHECKPOINTS_RESPONSE__INIT;
		Kvpalace__V1__CheckpointInfo ci[2] = {KVPALACE__V1__CHECKPOINT_INFO__INIT,
						      KVPALACE__V1__CHECKPOINT_INFO__INIT};
		Kvpalace__V1__CheckpointInfo *cis[2] = {&ci[0], &ci[1]};
		Kvpalace__V1__Layout cl = KVPALACE__V1__LAYOUT__INIT;
		Kvpalace__V1__StatsResponse st = KVPALACE__V1__STATS_RESPONSE__INIT;
		Kvpalace__V1__OpenDeviceArenaResponse oda =
			KVPALACE__V1__OPEN_DEVICE_ARENA_RESPONSE__INIT;
		Kvpalace__V1__LeaseDeviceResponse ldr = KVPALACE__V1__LEASE_DEVICE_RESPONSE__INIT;
		static uint8_t uuid[16];
		uint32_t dslots[64];
		const char *ckpt_name = NULL;
		Kvpalace__V1__Request *req;
		uint32_t slots[64];
		unsigned char slots_le[64 * 4];
		int fd = -1, n, len, ret;

		n = frame_recv(c, buf, sizeof(buf), &fd);
		if (n <= 0)
			/* The library gives back a restore it could not read. */
			return f->mode == FAKE_RESTORE_PAGES_GONE && !closed_restored ? 4 : 0;
		len = frame_header_check(buf, (size_t)n, sizeof(buf));
		if (len < 0)
			return 1;
		frame_arena_init(&a, mem, sizeof(mem));
		req = frame_unpack_request(&a, buf + FRAME_HEADER_BYTES, (size_t)len);
		if (!req)
			return 1;
		resp.id = req->id;
		/* The library never sends an invalid checkpoint name. */
		if (req->op_case == KVPALACE__V1__REQUEST__OP_CHECKPOINT)
			ckpt_name = req->checkpoint->name;
		if (req->op_case == KVPALACE__V1__REQUEST__OP_RESTORE)
			ckpt_name = req->restore->name;
		if (req->op_case == KVPALACE__V1__REQUEST__OP_WARMUP)
			ckpt_name = req->warmup->name;
		if (ckpt_name && kvp_checkpoint_name_check(ckpt_name) < 0)
			return 3;
		switch (req->op_case) {
		case KVPALACE__V1__REQUEST__OP_HELLO:
			if (f->mode == FAKE_CLOSE) {
				close(c);
				return 0;
			}
			if (f->mode == FAKE_GARBAGE) {
				frame_header_encode(buf, 8);
				memset(buf + FRAME_HEADER_BYTES, 0xff, 8);
				frame_send(c, buf, FRAME_HEADER_BYTES + 8, -1);
				continue;
			}
			if (f->mode == FAKE_VERSION_STATUS) {
				resp.status = ST(VERSION);
				resp.error = "fake speaks version 2";
				break;
			}
			if (f->mode == FAKE_WRONG_ID)
				resp.id++;
			hello.protocol_version = f->mode == FAKE_VERSION_2 ? 2 : 1;
			hello.server_version = "fake";
			hello.max_message_bytes = FRAME_DEFAULT_MAX_BYTES;
			hello.max_tokens_per_request = 1000;
			if (f->mode >= FAKE_CKPT_GOOD) {
				hello.admin = f->mode != FAKE_LIST_FOREIGN;
				hello.uid = FAKE_UID;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_HELLO;
			resp.hello = &hello;
			break;
		case KVPALACE__V1__REQUEST__OP_OPEN_POOL: {
			const Kvpalace__V1__Layout *l = req->open_pool->layout;
			uint64_t bytes;

			layout.n_layers = l->n_layers;
			layout.n_kv_heads = l->n_kv_heads;
			layout.head_dim = l->head_dim;
			layout.block_tokens = l->block_tokens;
			layout.dtype = l->dtype;
			layout.quant_group = l->has_quant_group ? l->quant_group : 0;
			op.pool_id = 5;
			op.page_bytes = shm_page_bytes(&layout);
			op.n_pages = FAKE_PAGES;
			bytes = op.page_bytes * FAKE_PAGES;
			op.arena_bytes = bytes;
			if (f->mode == FAKE_SMALL_ARENA)
				op.arena_bytes = bytes = op.page_bytes * (FAKE_PAGES / 2);
			if (f->mode == FAKE_UNSEALED) {
				fd = memfd_create("fake", MFD_CLOEXEC);
				if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0)
					return 1;
			} else if (f->mode != FAKE_NO_FD) {
				ret = shm_arena_create("fake", bytes, &fd, NULL);
				if (ret < 0)
					return 1;
			}
			if (IS_GPU_MODE(f->mode)) {
				op.has_device_arena = op.has_device_arena_bytes = 1;
				op.has_device_n_pages = 1;
				op.device_arena = 1;
				op.device_arena_bytes = op.page_bytes * FAKE_DEV_PAGES;
				op.device_n_pages = FAKE_DEV_PAGES;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_OPEN_POOL;
			resp.open_pool = &op;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_OPEN_DEVICE_ARENA: {
			/* An "emulated" device: a memfd, as a daemon started
			 * with KVPALACED_EMULATE_GPU passes. */
			uint64_t bytes = shm_page_bytes(&layout) * FAKE_DEV_PAGES;

			oda.pool_id = 5;
			oda.arena_bytes = bytes;
			oda.page_bytes = shm_page_bytes(&layout);
			oda.n_pages = FAKE_DEV_PAGES;
			oda.handle_type = KVPALACE__V1__DEVICE_HANDLE__DEVICE_HANDLE_HOST_EMULATED;
			oda.has_device_uuid = 1;
			oda.device_uuid.data = uuid;
			oda.device_uuid.len = sizeof(uuid);
			if (f->mode == FAKE_GPU_UNSEALED) {
				fd = memfd_create("fake-dev", MFD_CLOEXEC);
				if (fd < 0 || ftruncate(fd, (off_t)bytes) < 0)
					return 1;
			} else if (shm_arena_create("fake-dev", bytes, &fd, NULL) < 0) {
				return 1;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_OPEN_DEVICE_ARENA;
			resp.open_device_arena = &oda;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_LEASE_DEVICE: {
			/* The match's pages in device slots 3, 2, 1, ... */
			uint64_t from = req->lease_device->first_page;

			ldr.lease_id = req->lease_device->lease_id;
			ldr.first_page = from;
			ldr.n_device_slots = 2 > from ? 2 - from : 0; /* matches are 2 pages */
			for (size_t i = 0; i < ldr.n_device_slots; i++)
				dslots[i] = (uint32_t)(FAKE_DEV_PAGES - 1 - from - i);
			if (f->mode == FAKE_GPU_LEASE_BAD_SLOT)
				dslots[0] = FAKE_DEV_PAGES;
			if (f->mode == FAKE_GPU_LEASE_SHORT)
				ldr.n_device_slots = 0;
			ldr.device_slots = dslots;
			ldr.copied_pages = (uint32_t)ldr.n_device_slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_LEASE_DEVICE;
			resp.lease_device = &ldr;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_CREATE_SESSION:
			cs.session_id = 6;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_CREATE_SESSION;
			resp.create_session = &cs;
			break;
		case KVPALACE__V1__REQUEST__OP_APPEND: {
			uint64_t bt = layout.block_tokens;
			uint64_t end = reserved + req->append->n_tokens;

			app.first_token = reserved;
			app.first_page = reserved / bt;
			app.n_page_slots = (end + bt - 1) / bt - app.first_page;
			if (app.n_page_slots > 64)
				return 1;
			for (size_t i = 0; i < app.n_page_slots; i++)
				slots[i] = (uint32_t)(app.first_page + i);
			if (f->mode == FAKE_BAD_SLOTS)
				slots[app.n_page_slots - 1] = FAKE_PAGES;
			if (f->mode == FAKE_BAD_FIRST_TOKEN)
				app.first_token += 1;
			if (IS_GPU_MODE(f->mode) && req->append->has_tier &&
			    req->append->tier == KVPALACE__V1__TIER__TIER_GPU) {
				app.has_tier = 1;
				app.tier = KVPALACE__V1__TIER__TIER_GPU;
				app.n_device_slots = app.n_page_slots;
				for (size_t i = 0; i < app.n_page_slots; i++)
					dslots[i] =
						(uint32_t)((app.first_page + i) % FAKE_DEV_PAGES);
				if (f->mode == FAKE_GPU_APPEND_BAD_SLOT)
					dslots[app.n_page_slots - 1] = FAKE_DEV_PAGES + 7;
				app.device_slots = dslots;
			}
			app.page_slots = slots;
			reserved = end;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_APPEND;
			resp.append = &app;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_COMMIT: {
			/* Page i lives in slot i; the reply lists the pages the
			 * commit filled, as the real daemon does after dedup. */
			uint64_t bt = layout.block_tokens;
			uint64_t first = committed / bt;

			committed += req->commit->n_tokens;
			cm.committed_tokens = committed;
			if (f->mode == FAKE_COMMIT_TOO_MANY)
				cm.committed_tokens = reserved + 5;
			cm.has_first_page = 1;
			cm.first_page = first;
			cm.n_page_slots = committed / bt - first;
			if (cm.n_page_slots > 64)
				return 1;
			for (size_t i = 0; i < cm.n_page_slots; i++)
				slots[i] = (uint32_t)(first + i);
			if (f->mode == FAKE_COMMIT_BAD_SLOT && cm.n_page_slots)
				slots[cm.n_page_slots - 1] = FAKE_PAGES;
			if (f->mode == FAKE_COMMIT_NO_SLOTS)
				cm.n_page_slots = 0;
			cm.page_slots = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_COMMIT;
			resp.commit = &cm;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_FORK:
			fk.session_id = 7;
			fk.n_tokens = req->fork->n_tokens;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_FORK;
			resp.fork = &fk;
			break;
		case KVPALACE__V1__REQUEST__OP_SESSION_PAGES: {
			/* The fork (7): its pages are copies in the upper half
			 * of the arena. */
			uint64_t bt = layout.block_tokens;

			if (req->session_pages->session_id == FAKE_RESTORED_ID) {
				/* The restored session: pages 0.. in slots 10.. */
				if (f->mode == FAKE_RESTORE_PAGES_GONE) {
					resp.status = ST(NOT_FOUND);
					resp.error = "no such session";
					break;
				}
				sp.first_page = req->session_pages->first_page;
				sp.n_tokens = sp.committed_tokens = FAKE_RESTORED_TOKENS;
				sp.n_page_slots =
					(FAKE_RESTORED_TOKENS + bt - 1) / bt - sp.first_page;
				for (size_t i = 0; i < sp.n_page_slots && i < 64; i++)
					slots[i] = (uint32_t)(10 + sp.first_page + i);
				if (f->mode == FAKE_RESTORE_PAGES_BAD_SLOT)
					slots[0] = FAKE_PAGES + 1;
				sp.page_slots = slots;
				resp.op_case = KVPALACE__V1__RESPONSE__OP_SESSION_PAGES;
				resp.session_pages = &sp;
				break;
			}

			sp.first_page = req->session_pages->first_page;
			sp.n_tokens = sp.committed_tokens = 20;
			sp.n_page_slots = (20 + bt - 1) / bt - sp.first_page;
			for (size_t i = 0; i < sp.n_page_slots; i++)
				slots[i] = (uint32_t)(FAKE_PAGES / 2 + sp.first_page + i);
			if (f->mode == FAKE_FORK_BAD_SLOT)
				slots[0] = FAKE_PAGES + 3;
			sp.page_slots = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_SESSION_PAGES;
			resp.session_pages = &sp;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_TRUNCATE: {
			/* The new last page is copied to the last slot. */
			uint64_t bt = layout.block_tokens, keep = req->truncate->n_tokens;

			tr.n_tokens = keep;
			reserved = keep;
			if (committed > keep)
				committed = keep;
			tr.committed_tokens = committed;
			if (keep % bt) {
				tr.has_first_page = 1;
				tr.first_page = keep / bt;
				slots[0] = f->mode == FAKE_TRUNC_BAD_SLOT ? FAKE_PAGES
									  : FAKE_PAGES - 1;
				tr.n_page_slots = 1;
				tr.page_slots = slots;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_TRUNCATE;
			resp.truncate = &tr;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_MATCH_PREFIX: {
			/* Whole pages of what was asked, in slots 0.., in the
			 * form the daemon answers a tokens_le request with. */
			size_t asked = req->match_prefix->has_tokens_le
					       ? req->match_prefix->tokens_le.len / 4
					       : req->match_prefix->n_tokens;
			size_t n_slots;

			mp.lease_id = 9;
			mp.matched_tokens = asked / layout.block_tokens * layout.block_tokens;
			if (f->mode == FAKE_MATCH_TOO_LONG)
				mp.matched_tokens += 16;
			if (f->mode == FAKE_MATCH_PARTIAL)
				mp.matched_tokens = asked;
			mp.first_page = 0;
			n_slots =
				(mp.matched_tokens + layout.block_tokens - 1) / layout.block_tokens;
			if (n_slots > 64)
				return 1;
			for (size_t i = 0; i < n_slots; i++)
				le_put32(slots_le + 4 * i, (uint32_t)i);
			mp.has_page_slots_le = 1;
			mp.page_slots_le.data = slots_le;
			mp.page_slots_le.len = n_slots * 4;
			mp.complete = 1;
			if (IS_GPU_MODE(f->mode) && req->match_prefix->has_tier) {
				mp.has_tier = 1;
				mp.tier = req->match_prefix->tier;
			}
			resp.op_case = KVPALACE__V1__RESPONSE__OP_MATCH_PREFIX;
			resp.match_prefix = &mp;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_RELEASE:
			resp.op_case = KVPALACE__V1__RESPONSE__OP_RELEASE;
			resp.release = &rel;
			break;
		case KVPALACE__V1__REQUEST__OP_SHOW_SESSION: {
			/* A 3-page session; as many slots as asked for. */
			uint32_t want = req->show_session->max_page_slots;

			si.session_id = req->show_session->session_id;
			si.n_tokens = si.committed_tokens = 40;
			si.n_pages = 3;
			sh.info = &si;
			sh.model_id = "fake-model";
			sh.layout = &sl;
			sh.n_page_slots = sh.n_page_holders = want < 3 ? want : 3;
			if (f->mode == FAKE_SHOW_TOO_MANY)
				sh.n_page_slots = sh.n_page_holders = want + 1;
			for (size_t i = 0; i < sh.n_page_slots && i < 64; i++)
				slots[i] = (uint32_t)i;
			sh.page_slots = sh.page_holders = slots;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_SHOW_SESSION;
			resp.show_session = &sh;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_DROP_SESSION:
			ds.session_id = req->drop_session->session_id;
			if (f->mode == FAKE_DROP_OTHER)
				ds.session_id++;
			ds.n_tokens = ds.committed_tokens = 40;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_DROP_SESSION;
			resp.drop_session = &ds;
			break;
		case KVPALACE__V1__REQUEST__OP_EVICT:
			/* Two pools, 3 + 2 pages of 8 KiB. */
			evp[0].pool_id = 5;
			evp[0].pages = 3;
			evp[0].bytes = 3 * 8192;
			evp[1].pool_id = 8;
			evp[1].pages = 2;
			evp[1].bytes = 2 * 8192;
			ev.pages = f->mode == FAKE_EVICT_SUM ? 6 : 5;
			ev.bytes = 5 * 8192;
			ev.n_pools = 2;
			ev.pools = evps;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_EVICT;
			resp.evict = &ev;
			break;
		case KVPALACE__V1__REQUEST__OP_CLOSE_SESSION:
			closed_restored |= req->close_session->session_id == FAKE_RESTORED_ID;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_CLOSE_SESSION;
			resp.close_session = &cls;
			break;
		case KVPALACE__V1__REQUEST__OP_CHECKPOINT:
			/* 40 tokens in 3 pages of 8 KiB, after a 4 KiB header. */
			ck.bytes = 4096 + 3 * 8192 + 8192;
			ck.n_tokens = 40;
			ck.n_pages = f->mode == FAKE_CKPT_BAD_PAGES ? 2 : 3;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_CHECKPOINT;
			resp.checkpoint = &ck;
			break;
		case KVPALACE__V1__REQUEST__OP_RESTORE: {
			/* Refusals by name; else 40 tokens in pool 5, the
			 * first two pages in the reply (slots 10, 11), the
			 * third by SessionPages. */
			static const struct {
				const char *name;
				int status;
			} refusals[] = {{"corrupt", ST(CORRUPT)},
					{"newer", ST(VERSION)},
					{"foreign", ST(INVALID)},
					{"missing", ST(NOT_FOUND)},
					{"full", ST(NO_SPACE)}};
			uint64_t pool = req->restore->has_pool_id ? req->restore->pool_id : 5;

			for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++)
				if (!strcmp(ckpt_name, refusals[i].name))
					resp.status = refusals[i].status;
			if (resp.status) {
				resp.error = "checkpoint refused by the fake: checksum mismatch";
				break;
			}
			rs.session_id = FAKE_RESTORED_ID;
			rs.n_tokens = FAKE_RESTORED_TOKENS;
			rs.pool_id = pool;
			rs.n_pages = 3;
			rs.shared_pages = 1;
			slots[0] = 10;
			slots[1] = 11;
			rs.n_page_slots = 2;
			rs.page_slots = slots;
			if (f->mode == FAKE_RESTORE_BAD_SLOT)
				slots[1] = FAKE_PAGES;
			if (f->mode == FAKE_RESTORE_TOO_LONG) {
				/* Consistent, but more pages than the arena has:
				 * the table must not be sized by it. */
				rs.n_tokens = (uint64_t)16 << 28;
				rs.n_pages = 1u << 28;
			}
			if (f->mode == FAKE_RESTORE_OTHER_POOL ||
			    f->mode == FAKE_ADMIN_RESTORE_OTHER_POOL)
				rs.pool_id = pool + 1;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_RESTORE;
			resp.restore = &rs;
			break;
		}
		case KVPALACE__V1__REQUEST__OP_WARMUP:
			wu.pool_id = 5;
			wu.n_tokens = 40;
			wu.indexed_pages = 2;
			wu.shared_pages = f->mode == FAKE_WARMUP_SHARED ? 3 : 1;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_WARMUP;
			resp.warmup = &wu;
			break;
		case KVPALACE__V1__REQUEST__OP_LIST_CHECKPOINTS:
			/* One good checkpoint and one the daemon cannot read. */
			cl.n_layers = 2;
			cl.n_kv_heads = 2;
			cl.head_dim = 32;
			cl.block_tokens = 16;
			cl.dtype = KVPALACE__V1__DTYPE__DTYPE_F16;
			ci[0].name = f->mode == FAKE_LIST_BAD_NAME ? "../etc" : "chat-1";
			ci[0].uid = FAKE_UID;
			ci[0].model_id = "fake-model";
			ci[0].layout = &cl;
			ci[0].has_n_tokens = ci[0].has_bytes = ci[0].has_created_unix_ms = 1;
			ci[0].n_tokens = 40;
			ci[0].bytes = 40960;
			ci[0].created_unix_ms = 1700000000123ull;
			ci[0].has_verified = f->mode == FAKE_LIST_UNASKED_VERIFY;
			ci[0].verified = ci[0].has_verified;
			ci[1].name = "broken";
			ci[1].uid = f->mode == FAKE_LIST_OTHER_UID || f->mode == FAKE_LIST_FOREIGN
					    ? FAKE_UID + 1
					    : FAKE_UID;
			ci[1].has_bytes = 1;
			ci[1].bytes = 4096;
			ci[1].error = "truncated: 4096 of 40960 bytes";
			lc.n_checkpoints = 2;
			lc.checkpoints = cis;
			lc.has_truncated = 1;
			lc.truncated = 1;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_LIST_CHECKPOINTS;
			resp.list_checkpoints = &lc;
			break;
		case KVPALACE__V1__REQUEST__OP_STATS:
			if (f->mode == FAKE_STATS_GARBAGE) {
				frame_header_encode(buf, 8);
				memset(buf + FRAME_HEADER_BYTES, 0xff, 8);
				frame_send(c, buf, FRAME_HEADER_BYTES + 8, -1);
				continue;
			}
			st.has_checkpoints_written = st.has_checkpoints_restored = 1;
			st.has_checkpoints_refused = st.has_checkpoint_failures = 1;
			st.has_warmed_up_pages = 1;
			st.checkpoints_written = 3;
			st.checkpoints_restored = 2;
			st.checkpoints_refused = 1;
			st.checkpoint_failures = 4;
			st.warmed_up_pages = 5;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_STATS;
			resp.stats = &st;
			break;
		case KVPALACE__V1__REQUEST__OP_SUBSCRIBE_EVENTS: {
			Kvpalace__V1__SubscribeEventsResponse se =
				KVPALACE__V1__SUBSCRIBE_EVENTS_RESPONSE__INIT;
			Kvpalace__V1__KvEvent e[2] = {KVPALACE__V1__KV_EVENT__INIT,
						      KVPALACE__V1__KV_EVENT__INIT};
			Kvpalace__V1__KvEvent *ep[2] = {&e[0], &e[1]};
			Kvpalace__V1__KvEvents evs = KVPALACE__V1__KV_EVENTS__INIT;
			Kvpalace__V1__Response push = KVPALACE__V1__RESPONSE__INIT;
			static uint8_t hash[16], toks[4 * 17];

			se.next_seq = 5;
			se.keep = 16;
			resp.op_case = KVPALACE__V1__RESPONSE__OP_SUBSCRIBE_EVENTS;
			resp.subscribe_events = &se;
			if (send_resp(c, &resp, -1) < 0)
				return 1;
			for (int i = 0; i < 2; i++) {
				e[i].kind = KVPALACE__V1__KV_EVENT__KIND__BLOCK_STORED;
				e[i].seq = 5 + (uint64_t)i;
				e[i].pool_id = 1;
				e[i].has_block_hash = 1;
				e[i].block_hash.data = hash;
				e[i].block_hash.len = 16;
				e[i].has_tier = 1;
				e[i].tier = KVPALACE__V1__TIER__TIER_HOST;
				e[i].has_block_tokens = 1;
				e[i].block_tokens = 16;
				e[i].has_tokens_le = 1;
				e[i].tokens_le.data = toks;
				e[i].tokens_le.len = 4 * 16;
			}
			if (f->mode == FAKE_EVENTS_SHORT_HASH)
				e[1].block_hash.len = 15;
			if (f->mode == FAKE_EVENTS_BACKWARDS)
				e[1].seq = 5;
			if (f->mode == FAKE_EVENTS_TOO_MANY_TOKENS)
				e[1].tokens_le.len = 4 * 17;
			evs.n_events = 2;
			evs.events = ep;
			push.op_case = KVPALACE__V1__RESPONSE__OP_EVENTS;
			push.events = &evs;
			if (send_resp(c, &push, -1) < 0)
				return 1;
			continue;
		}
		default:
			resp.status = ST(UNSUPPORTED);
			resp.error = "not in the fake";
			break;
		}
		ret = send_resp(c, &resp, fd);
		if (fd >= 0)
			close(fd);
		if (ret < 0)
			return 0;
	}
}

static int setup(void **state)
{
	struct fake *f = calloc(1, sizeof(*f));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/tmp/kvpf-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->sock, sizeof(f->sock), "%s/fake.sock", f->dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f->sock);
	f->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(f->listen_fd, 4) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fake *f = *state;

	close(f->listen_fd);
	unlink(f->sock);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* Starts the fake in `mode` and returns its pid. */
static pid_t start_fake(struct fake *f, enum fake_mode mode)
{
	pid_t pid;

	f->mode = mode;
	pid = harness_fork(fake_daemon, f);
	assert_true(pid > 0);
	return pid;
}

static void expect_connect_fails(void **state, enum fake_mode mode, int want1, int want2)
{
	struct fake *f = *state;
	kvp_client *c = NULL;
	pid_t pid = start_fake(f, mode);
	int ret = kvp_connect(f->sock, &c);

	if (ret != want1 && ret != want2)
		fail_msg("kvp_connect against fake mode %d: %d", mode, ret);
	assert_null(c);
	harness_wait(pid, 30);
}

static void test_version_status(void **state)
{
	expect_connect_fails(state, FAKE_VERSION_STATUS, -EPROTONOSUPPORT, -EPROTONOSUPPORT);
}

static void test_version_2(void **state)
{
	expect_connect_fails(state, FAKE_VERSION_2, -EPROTONOSUPPORT, -EPROTONOSUPPORT);
}

static void test_garbage_reply(void **state)
{
	expect_connect_fails(state, FAKE_GARBAGE, -EPROTO, -EPROTO);
}

static void test_wrong_reply_id(void **state)
{
	expect_connect_fails(state, FAKE_WRONG_ID, -EPROTO, -EPROTO);
}

static void test_daemon_closes(void **state)
{
	expect_connect_fails(state, FAKE_CLOSE, -ECONNRESET, -EPIPE);
}

static void test_good_fake(void **state)
{
	struct fake *f = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l;
	pid_t pid = start_fake(f, FAKE_GOOD);

	/* The fake itself must be right, or the other cases prove nothing. */
	harness_tokens(tokens, 40, 90, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);
	assert_int_equal(kvp_match_prefix(p, tokens, 40, &l), 0);
	assert_int_equal(kvp_lease_tokens(l), 32);
	assert_int_equal(harness_check_lease(l, p, tokens, 32), 0);
	assert_int_equal(kvp_lease_release(l), 0);
	{
		kvp_session *fk;

		assert_int_equal(kvp_session_fork(s, 20, &fk), 0);
		assert_int_equal(kvp_session_committed(fk), 20);
		assert_non_null(kvp_session_kv(fk, 19, 0, 0, 0));
		assert_int_equal(kvp_truncate(s, 20), 0);
		assert_int_equal(kvp_session_tokens(s), 20);
		assert_non_null(kvp_session_kv(s, 19, 0, 0, 0));
		assert_null(kvp_session_kv(s, 20, 0, 0, 0));
	}
	kvp_disconnect(c);
	assert_int_equal(harness_wait(pid, 30), 0);
}

/* OpenPool replies that must not be mapped. */
static void expect_pool_open_fails(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	kvp_client *c;
	kvp_pool *p = NULL;
	pid_t pid = start_fake(f, mode);
	int ret;

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	ret = kvp_pool_open(c, "fake-model", &harness_layout, &p);
	if (ret != -EPROTO)
		fail_msg("kvp_pool_open against fake mode %d: %d", mode, ret);
	assert_null(p);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_no_arena_fd(void **state)
{
	expect_pool_open_fails(state, FAKE_NO_FD);
}

static void test_unsealed_arena(void **state)
{
	expect_pool_open_fails(state, FAKE_UNSEALED);
}

static void test_arena_smaller_than_announced(void **state)
{
	expect_pool_open_fails(state, FAKE_SMALL_ARENA);
}

/* Replies after a good OpenPool that must break the connection. */
static void expect_broken_after(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l = NULL;
	pid_t pid = start_fake(f, mode);
	int ret = 0;

	harness_tokens(tokens, 40, 91, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(kvp_session_create(p, &s), 0);
	if (mode == FAKE_MATCH_TOO_LONG || mode == FAKE_MATCH_PARTIAL) {
		ret = kvp_match_prefix(p, tokens, 20, &l);
		assert_null(l);
	} else if (mode == FAKE_COMMIT_BAD_SLOT || mode == FAKE_COMMIT_NO_SLOTS) {
		assert_int_equal(kvp_append(s, tokens, 40), 0);
		ret = kvp_commit(s, 40);
		assert_null(kvp_session_kv(s, 0, 0, 0, 0));
	} else if (mode == FAKE_TRUNC_BAD_SLOT || mode == FAKE_FORK_BAD_SLOT) {
		kvp_session *fk = NULL;

		assert_int_equal(kvp_append(s, tokens, 40), 0);
		assert_int_equal(kvp_commit(s, 40), 0);
		if (mode == FAKE_TRUNC_BAD_SLOT) {
			ret = kvp_truncate(s, 20);
		} else {
			ret = kvp_session_fork(s, 20, &fk);
			assert_null(fk);
		}
		assert_null(kvp_session_kv(s, 0, 0, 0, 0));
	} else {
		ret = kvp_append(s, tokens, 40);
		if (mode == FAKE_COMMIT_TOO_MANY) {
			assert_int_equal(ret, 0);
			ret = kvp_commit(s, 40);
		} else {
			/* Nothing past what was properly reserved is writable. */
			assert_null(kvp_session_kv(s, 39, 0, 0, 0));
		}
	}
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

/* The GPU tier against a fake daemon: well-formed device replies give
 * device pointers inside the mapped device arena; malformed ones break
 * the connection and give none. */
static void expect_gpu(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s;
	kvp_lease *l = NULL;
	pid_t pid = start_fake(f, mode);
	int ret;

	harness_tokens(tokens, 40, 92, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(kvp_pool_has_gpu(p), 1);
	assert_int_equal(kvp_pool_gpu_pages(p), FAKE_DEV_PAGES);
	assert_int_equal(kvp_session_create(p, &s), 0);
	switch (mode) {
	case FAKE_GPU_GOOD: {
		const unsigned char *d0, *d1;

		assert_int_equal(kvp_pool_gpu_open(p), 0);
		assert_int_equal(kvp_match_prefix_tier(p, tokens, 32, KVP_TIER_GPU, 0, &l), 0);
		assert_int_equal(kvp_lease_tier(l), KVP_TIER_GPU);
		/* Page 0 in device slot 3, page 1 in slot 2: a page apart. */
		d0 = kvp_lease_device_kv(l, 0, 0, 0, 0);
		d1 = kvp_lease_device_kv(l, 16, 0, 0, 0);
		assert_non_null(d0);
		assert_non_null(d1);
		assert_true(d0 - d1 == (ptrdiff_t)kvp_pool_page_bytes(p));
		assert_null(kvp_lease_device_kv(l, 32, 0, 0, 0));
		assert_int_equal(kvp_append_tier(s, tokens, 40, KVP_TIER_GPU, 0), 0);
		assert_non_null(kvp_session_device_kv(s, 39, 0, 0, 0));
		assert_int_equal(kvp_ping(c), 0);
		kvp_disconnect(c);
		harness_wait(pid, 30);
		return;
	}
	case FAKE_GPU_UNSEALED:
		ret = kvp_pool_gpu_open(p);
		break;
	case FAKE_GPU_LEASE_BAD_SLOT:
	case FAKE_GPU_LEASE_SHORT:
		ret = kvp_match_prefix_tier(p, tokens, 32, KVP_TIER_GPU, KVP_TIER_OR_HOST, &l);
		assert_null(l);
		break;
	default:
		ret = kvp_append_tier(s, tokens, 40, KVP_TIER_GPU, 0);
		assert_null(kvp_session_device_kv(s, 0, 0, 0, 0));
		break;
	}
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_gpu_good_fake(void **state)
{
	expect_gpu(state, FAKE_GPU_GOOD);
}

static void test_gpu_unsealed_arena(void **state)
{
	expect_gpu(state, FAKE_GPU_UNSEALED);
}

static void test_gpu_lease_slot_outside_arena(void **state)
{
	expect_gpu(state, FAKE_GPU_LEASE_BAD_SLOT);
}

static void test_gpu_lease_without_slots(void **state)
{
	expect_gpu(state, FAKE_GPU_LEASE_SHORT);
}

static void test_gpu_append_slot_outside_arena(void **state)
{
	expect_gpu(state, FAKE_GPU_APPEND_BAD_SLOT);
}

static void test_append_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_BAD_SLOTS);
}

static void test_append_at_wrong_position(void **state)
{
	expect_broken_after(state, FAKE_BAD_FIRST_TOKEN);
}

static void test_match_longer_than_asked(void **state)
{
	expect_broken_after(state, FAKE_MATCH_TOO_LONG);
}

static void test_commit_more_than_reserved(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_TOO_MANY);
}

static void test_match_inside_a_page(void **state)
{
	expect_broken_after(state, FAKE_MATCH_PARTIAL);
}

static void test_commit_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_BAD_SLOT);
}

static void test_commit_without_slots(void **state)
{
	expect_broken_after(state, FAKE_COMMIT_NO_SLOTS);
}

static void test_truncate_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_TRUNC_BAD_SLOT);
}

static void test_fork_slot_outside_arena(void **state)
{
	expect_broken_after(state, FAKE_FORK_BAD_SLOT);
}

/* Admin replies that fit their requests are taken as they are; one that
 * contradicts its request breaks the connection. */
static void expect_admin(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	struct kvp_session_detail *d = NULL;
	struct kvp_drop_session_result dr;
	struct kvp_evict_result *er = NULL;
	kvp_client *c;
	pid_t pid = start_fake(f, mode);
	int ret = 0;

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	if (mode == FAKE_ADMIN_GOOD) {
		assert_int_equal(kvp_admin_show_session(c, 6, 2, &d), 0);
		assert_int_equal(d->info.session_id, 6);
		assert_int_equal(d->n_page_slots, 2);
		assert_string_equal(d->model_id, "fake-model");
		free(d);
		assert_int_equal(kvp_admin_drop_session(c, 6, 0, &dr), 0);
		assert_int_equal(dr.session_id, 6);
		assert_int_equal(kvp_admin_evict(c, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &er), 0);
		assert_int_equal(er->pages, 5);
		assert_int_equal(er->n_pools, 2);
		assert_int_equal(er->pools[1].pool_id, 8);
		free(er);
		er = NULL;
		/* Asked for one pool, told about two: a lie. */
		ret = kvp_admin_evict(c, KVP_TIER_HOST, 5, KVP_EVICT_ALL, 0, &er);
	} else if (mode == FAKE_SHOW_TOO_MANY) {
		ret = kvp_admin_show_session(c, 6, 2, &d);
		assert_null(d);
	} else if (mode == FAKE_DROP_OTHER) {
		ret = kvp_admin_drop_session(c, 6, KVP_DROP_FORCE, &dr);
	} else {
		ret = kvp_admin_evict(c, KVP_TIER_HOST, 0, KVP_EVICT_ALL, 0, &er);
	}
	assert_null(er);
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_admin_replies(void **state)
{
	expect_admin(state, FAKE_ADMIN_GOOD);
}

static void test_show_more_slots_than_asked(void **state)
{
	expect_admin(state, FAKE_SHOW_TOO_MANY);
}

static void test_drop_of_another_session(void **state)
{
	expect_admin(state, FAKE_DROP_OTHER);
}

/* A Stats reply that does not decode is a protocol error, not a refusal:
 * kvpalacectl says so and exits 4 (an operator's script must not read it
 * as "the daemon refused", exit 1). */
static void test_ctl_undecodable_reply(void **state)
{
	struct fake *f = *state;
	const char *bin = getenv("KVPALACECTL");
	char *argv[] = {(char *)bin, "--socket", f->sock, "stats", NULL};
	static char out[4096];
	pid_t pid;
	int st;

	assert_non_null(bin);
	pid = start_fake(f, FAKE_STATS_GARBAGE);
	st = harness_run_capture(argv, NULL, out, sizeof(out));
	if (st != 4)
		fail_msg("kvpalacectl stats against an undecodable reply exited %d:\n%s", st, out);
	assert_non_null(strstr(out, "does not decode"));
	harness_wait(pid, 30);
}

static void test_evict_that_does_not_add_up(void **state)
{
	expect_admin(state, FAKE_EVICT_SUM);
}

/* ---- checkpoints -------------------------------------------------------- */

static void test_checkpoint_replies(void **state)
{
	static const char *const bad_names[] = {"",    ".hidden", "-x",	 "a/b",
						"a b", "..",	  "x\n", "\xc3\xa9t\xc3\xa9"};
	static const struct {
		const char *name;
		int err;
	} refusals[] = {{"corrupt", -EBADMSG},
			{"newer", -EPROTONOSUPPORT},
			{"foreign", -EINVAL},
			{"missing", -ENOENT},
			{"full", -ENOSPC}};
	struct fake *f = *state;
	char longest[KVP_CHECKPOINT_NAME_MAX + 2];
	struct kvp_checkpoint_list *list;
	struct kvp_restore_info ri;
	struct kvp_warmup_info wi;
	struct kvp_stats *st;
	uint32_t tokens[40];
	uint64_t bytes = 0;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *rs;
	pid_t pid = start_fake(f, FAKE_CKPT_GOOD);

	harness_tokens(tokens, 40, 92, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);

	assert_int_equal(kvp_session_checkpoint(s, "chat-1", &bytes), 0);
	assert_int_equal(bytes, 4096 + 4 * 8192);
	assert_int_equal(kvp_session_checkpoint(s, "chat-1", NULL), 0);
	assert_int_equal(kvp_admin_checkpoint(c, 6, "_by.id-2", NULL), 0);
	/* Names are checked before anything is sent (the fake exits 3 when
	 * it sees a bad one). */
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		bytes = 7;
		assert_int_equal(kvp_checkpoint_name_check(bad_names[i]), -EINVAL);
		assert_int_equal(kvp_session_checkpoint(s, bad_names[i], &bytes), -EINVAL);
		assert_non_null(strstr(kvp_strerror(c, -EINVAL), "checkpoint name"));
		assert_int_equal(bytes, 7);
		assert_int_equal(kvp_admin_checkpoint(c, 6, bad_names[i], NULL), -EINVAL);
		assert_int_equal(kvp_admin_warmup(c, bad_names[i], 0, 0, NULL), -EINVAL);
		assert_int_equal(kvp_admin_restore(c, bad_names[i], 0, 0, 0, NULL), -EINVAL);
		rs = (kvp_session *)&bytes;
		assert_int_equal(kvp_session_restore(p, bad_names[i], &rs), -EINVAL);
		assert_ptr_equal(rs, &bytes);
	}
	assert_int_equal(kvp_checkpoint_name_check(NULL), -EINVAL);
	memset(longest, 'a', sizeof(longest));
	longest[KVP_CHECKPOINT_NAME_MAX + 1] = '\0';
	assert_int_equal(kvp_checkpoint_name_check(longest), -EINVAL);
	longest[KVP_CHECKPOINT_NAME_MAX] = '\0';
	assert_int_equal(kvp_checkpoint_name_check(longest), 0);
	assert_int_equal(kvp_session_checkpoint(s, longest, NULL), 0);

	/* A restore reads as a fork does: the reply's window, then the rest
	 * of the page table. */
	assert_int_equal(kvp_session_restore(p, "chat-1", &rs), 0);
	assert_int_equal(kvp_session_id(rs), FAKE_RESTORED_ID);
	assert_int_equal(kvp_session_tokens(rs), 40);
	assert_int_equal(kvp_session_committed(rs), 40);
	assert_non_null(kvp_session_kv(rs, 39, 1, 1, 1));
	assert_null(kvp_session_kv(rs, 40, 0, 0, 0));
	/* Pages 0 and 2 are slots 10 and 12. */
	assert_int_equal((char *)kvp_session_kv(rs, 32, 0, 0, 0) -
				 (char *)kvp_session_kv(rs, 0, 0, 0, 0),
			 2 * kvp_pool_page_bytes(p));
	assert_int_equal(kvp_session_close(rs), 0);

	/* Refusals are errors of the call, not of the connection. */
	for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
		rs = (kvp_session *)&bytes;
		assert_int_equal(kvp_session_restore(p, refusals[i].name, &rs), refusals[i].err);
		assert_ptr_equal(rs, &bytes);
		assert_non_null(strstr(kvp_strerror(c, refusals[i].err), "checksum mismatch"));
		assert_int_equal(kvp_admin_restore(c, refusals[i].name, 1, FAKE_UID, 0, &ri),
				 refusals[i].err);
	}
	assert_int_equal(kvp_ping(c), 0);

	/* Sorted by uid, then name, whatever the daemon's order. */
	assert_int_equal(kvp_list_checkpoints(c, 0, 0, &list), 0);
	assert_int_equal(list->n_entries, 2);
	assert_true(list->truncated);
	assert_string_equal(list->entries[1].name, "chat-1");
	assert_int_equal(list->entries[1].uid, FAKE_UID);
	assert_string_equal(list->entries[1].model_id, "fake-model");
	assert_int_equal(list->entries[1].layout.block_tokens, 16);
	assert_int_equal(list->entries[1].layout.dtype, KVP_DTYPE_F16);
	assert_int_equal(list->entries[1].n_tokens, 40);
	assert_int_equal(list->entries[1].bytes, 40960);
	assert_int_equal(list->entries[1].created_unix_ms, 1700000000123ull);
	assert_null(list->entries[1].error);
	assert_string_equal(list->entries[0].name, "broken");
	assert_string_equal(list->entries[0].model_id, "");
	assert_int_equal(list->entries[0].layout.n_layers, 0);
	assert_int_equal(list->entries[0].n_tokens, 0);
	assert_int_equal(list->entries[0].bytes, 4096);
	assert_string_equal(list->entries[0].error, "truncated: 4096 of 40960 bytes");
	kvp_checkpoint_list_free(list);
	kvp_checkpoint_list_free(NULL);
	assert_int_equal(kvp_list_checkpoints(c, 1, FAKE_UID, &list), 0);
	kvp_checkpoint_list_free(list);

	assert_int_equal(kvp_admin_restore(c, "chat-1", 1, FAKE_UID, 0, &ri), 0);
	assert_int_equal(ri.session_id, FAKE_RESTORED_ID);
	assert_int_equal(ri.pool_id, 5);
	assert_int_equal(ri.n_tokens, 40);
	assert_int_equal(ri.n_pages, 3);
	assert_int_equal(ri.shared_pages, 1);
	assert_int_equal(kvp_admin_restore(c, "chat-1", 0, 0, 5, NULL), 0);
	assert_int_equal(kvp_admin_warmup(c, "chat-1", 1, FAKE_UID, &wi), 0);
	assert_int_equal(wi.pool_id, 5);
	assert_int_equal(wi.n_tokens, 40);
	assert_int_equal(wi.indexed_pages, 2);
	assert_int_equal(wi.shared_pages, 1);

	assert_int_equal(kvp_stats(c, &st), 0);
	assert_int_equal(st->checkpoints_written, 3);
	assert_int_equal(st->checkpoints_restored, 2);
	assert_int_equal(st->checkpoints_refused, 1);
	assert_int_equal(st->checkpoint_failures, 4);
	assert_int_equal(st->warmed_up_pages, 5);
	kvp_stats_free(st);
	kvp_disconnect(c);
	assert_int_equal(harness_wait(pid, 30), 0);
}

/* Checkpoint replies that must break the connection. */
static void expect_ckpt_broken(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	struct kvp_checkpoint_list *list = NULL;
	struct kvp_restore_info ri;
	struct kvp_warmup_info wi;
	uint32_t tokens[40];
	kvp_client *c;
	kvp_pool *p;
	kvp_session *s, *rs = NULL;
	pid_t pid = start_fake(f, mode);
	int ret;

	harness_tokens(tokens, 40, 93, 0);
	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(harness_commit_session(p, tokens, 40, &s), 0);
	switch (mode) {
	case FAKE_CKPT_BAD_PAGES:
		ret = kvp_session_checkpoint(s, "chat-1", NULL);
		break;
	case FAKE_LIST_BAD_NAME:
	case FAKE_LIST_FOREIGN:
		ret = kvp_list_checkpoints(c, 0, 0, &list);
		break;
	case FAKE_LIST_OTHER_UID:
		ret = kvp_list_checkpoints(c, 1, FAKE_UID, &list);
		break;
	case FAKE_ADMIN_RESTORE_OTHER_POOL:
		ret = kvp_admin_restore(c, "chat-1", 0, 0, 5, &ri);
		break;
	case FAKE_WARMUP_SHARED:
		ret = kvp_admin_warmup(c, "chat-1", 0, 0, &wi);
		break;
	case FAKE_LIST_OTHER_NAME:
		ret = kvp_list_checkpoints_ex(c, 0, 0, "only-this", KVP_LIST_VERIFY, &list);
		break;
	case FAKE_LIST_UNASKED_VERIFY:
		ret = kvp_list_checkpoints(c, 0, 0, &list);
		break;
	default:
		ret = kvp_session_restore(p, "chat-1", &rs);
		break;
	}
	assert_null(rs);
	assert_null(list);
	if (ret != -EPROTO)
		fail_msg("fake mode %d: %d instead of -EPROTO", mode, ret);
	if (mode == FAKE_RESTORE_TOO_LONG)
		assert_non_null(strstr(kvp_strerror(c, ret), "the arena has 16"));
	assert_int_equal(kvp_ping(c), -ENOTCONN);
	kvp_disconnect(c);
	harness_wait(pid, 30);
}

static void test_restore_slot_outside_arena(void **state)
{
	expect_ckpt_broken(state, FAKE_RESTORE_BAD_SLOT);
}

static void test_restore_longer_than_the_arena(void **state)
{
	expect_ckpt_broken(state, FAKE_RESTORE_TOO_LONG);
}

static void test_restore_into_another_pool(void **state)
{
	expect_ckpt_broken(state, FAKE_RESTORE_OTHER_POOL);
}

static void test_restore_pages_slot_outside_arena(void **state)
{
	expect_ckpt_broken(state, FAKE_RESTORE_PAGES_BAD_SLOT);
}

static void test_checkpoint_pages_do_not_fit(void **state)
{
	expect_ckpt_broken(state, FAKE_CKPT_BAD_PAGES);
}

static void test_list_invalid_name(void **state)
{
	expect_ckpt_broken(state, FAKE_LIST_BAD_NAME);
}

static void test_list_other_uid(void **state)
{
	expect_ckpt_broken(state, FAKE_LIST_OTHER_UID);
}

static void test_list_foreign_on_client_socket(void **state)
{
	expect_ckpt_broken(state, FAKE_LIST_FOREIGN);
}

static void test_admin_restore_into_another_pool(void **state)
{
	expect_ckpt_broken(state, FAKE_ADMIN_RESTORE_OTHER_POOL);
}

static void test_warmup_shares_more_than_it_indexed(void **state)
{
	expect_ckpt_broken(state, FAKE_WARMUP_SHARED);
}

/* Issue 13, item 10: a listing of one name, or one not asked to verify,
 * that says otherwise is a broken daemon, not a verdict to show. */
static void test_list_other_name(void **state)
{
	expect_ckpt_broken(state, FAKE_LIST_OTHER_NAME);
}

static void test_list_verified_unasked(void **state)
{
	expect_ckpt_broken(state, FAKE_LIST_UNASKED_VERIFY);
}

/* KV event pushes are checked before they are handed out: a well-formed
 * one reads, one with a short hash, numbers going back or more tokens
 * than a page holds is a broken daemon. */
static void expect_events(void **state, enum fake_mode mode)
{
	struct fake *f = *state;
	struct kvp_event *ev = NULL;
	uint64_t next, lost;
	size_t n;
	kvp_client *c;
	pid_t pid = start_fake(f, mode);

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_events_subscribe(c, 0, &next), 0);
	assert_int_equal(next, 5);
	if (mode == FAKE_EVENTS_GOOD) {
		assert_int_equal(kvp_events_read(c, 5000, &ev, &n, &lost), 1);
		assert_int_equal(n, 2);
		assert_int_equal(ev[1].seq, 6);
		assert_int_equal(ev[1].n_tokens, 16);
		kvp_events_free(ev);
	} else {
		assert_int_equal(kvp_events_read(c, 5000, &ev, &n, &lost), -EPROTO);
		assert_null(ev);
		assert_int_equal(kvp_events_read(c, 0, &ev, &n, &lost), -ENOTCONN);
	}
	kvp_disconnect(c);
	assert_int_equal(harness_wait(pid, 10), 0);
}

static void test_events_good(void **state)
{
	expect_events(state, FAKE_EVENTS_GOOD);
}

static void test_events_short_hash(void **state)
{
	expect_events(state, FAKE_EVENTS_SHORT_HASH);
}

static void test_events_backwards(void **state)
{
	expect_events(state, FAKE_EVENTS_BACKWARDS);
}

static void test_events_too_many_tokens(void **state)
{
	expect_events(state, FAKE_EVENTS_TOO_MANY_TOKENS);
}

/* A restore whose page table the daemon then refuses to show: the error
 * comes back, the connection stays, and the session is given back (the
 * fake exits non-zero when no CloseSession for it came). */
static void test_restore_pages_refused(void **state)
{
	struct fake *f = *state;
	kvp_client *c;
	kvp_pool *p;
	kvp_session *rs = NULL;
	pid_t pid = start_fake(f, FAKE_RESTORE_PAGES_GONE);

	assert_int_equal(kvp_connect(f->sock, &c), 0);
	assert_int_equal(kvp_pool_open(c, "fake-model", &harness_layout, &p), 0);
	assert_int_equal(kvp_session_restore(p, "chat-1", &rs), -ENOENT);
	assert_null(rs);
	assert_non_null(strstr(kvp_strerror(c, -ENOENT), "no such session"));
	assert_int_equal(kvp_ping(c), 0);
	kvp_disconnect(c);
	assert_int_equal(harness_wait(pid, 30), 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_good_fake),
		T(test_version_status),
		T(test_version_2),
		T(test_garbage_reply),
		T(test_wrong_reply_id),
		T(test_daemon_closes),
		T(test_no_arena_fd),
		T(test_unsealed_arena),
		T(test_arena_smaller_than_announced),
		T(test_append_slot_outside_arena),
		T(test_append_at_wrong_position),
		T(test_match_longer_than_asked),
		T(test_commit_more_than_reserved),
		T(test_match_inside_a_page),
		T(test_commit_slot_outside_arena),
		T(test_commit_without_slots),
		T(test_truncate_slot_outside_arena),
		T(test_fork_slot_outside_arena),
		T(test_gpu_good_fake),
		T(test_gpu_unsealed_arena),
		T(test_gpu_lease_slot_outside_arena),
		T(test_gpu_lease_without_slots),
		T(test_gpu_append_slot_outside_arena),
		T(test_admin_replies),
		T(test_show_more_slots_than_asked),
		T(test_drop_of_another_session),
		T(test_evict_that_does_not_add_up),
		T(test_ctl_undecodable_reply),
		T(test_checkpoint_replies),
		T(test_restore_slot_outside_arena),
		T(test_restore_longer_than_the_arena),
		T(test_restore_into_another_pool),
		T(test_restore_pages_slot_outside_arena),
		T(test_restore_pages_refused),
		T(test_checkpoint_pages_do_not_fit),
		T(test_list_invalid_name),
		T(test_list_other_uid),
		T(test_list_foreign_on_client_socket),
		T(test_admin_restore_into_another_pool),
		T(test_warmup_shares_more_than_it_indexed),
		T(test_list_other_name),
		T(test_list_verified_unasked),
		T(test_events_good),
		T(test_events_short_hash),
		T(test_events_backwards),
		T(test_events_too_many_tokens),
	};

	return cmocka_run_group_tests_name("fakedaemon", tests, NULL, NULL);
}
