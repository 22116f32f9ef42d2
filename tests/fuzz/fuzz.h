/* tests/fuzz/fuzz.h — what the fuzz targets and the corpus generator
 * agree on: the meaning of each target's leading control bytes and the
 * fixed identities the targets test against.
 *
 * Every target is one LLVMFuzzerTestOneInput (libFuzzer's entry point).
 * It is linked with libFuzzer in a -Dfuzz=true clang build, and with
 * replay.c (a plain main() over file arguments) in every build, so each
 * corpus file is replayed as an ordinary meson test with any compiler.
 */
#ifndef KVP_TESTS_FUZZ_H
#define KVP_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* ---- fuzz_request: byte 0, then one datagram ------------------------------ */

#define FUZZ_REQ_ADMIN	  0x01u /* the admin connection (uid 0) */
#define FUZZ_REQ_FRESH	  0x02u /* start from a fresh daemon state */
#define FUZZ_REQ_TENANT_B 0x04u /* the client connection of uid 1001, not 1000 */
#define FUZZ_REQ_CLOSE	  0x08u /* the connection closes after the datagram */

#define FUZZ_REQ_UID_A 1000u
#define FUZZ_REQ_UID_B 1001u

/* ---- fuzz_conn: byte 0, then actions ------------------------------------ */

#define FUZZ_CONN_FRESH	  0x01u /* start from a fresh daemon (state directory emptied) */
#define FUZZ_CONN_THREADS 0x02u /* a daemon with io-backend threads, not io_uring */

/* Each action is one byte, (op << 4) | mod, then its operands. k = mod & 3
 * is one of FUZZ_CONN_SLOTS connections; an op past the last is taken
 * modulo FUZZ_CONN_N_OPS. */
#define FUZZ_CONN_SLOTS 4u
enum fuzz_conn_op {
	FUZZ_CONN_OPEN,	    /* k: connect (closing k's client end first); mod & 4: admin */
	FUZZ_CONN_SEND,	    /* k, u16 LE length, bytes: one datagram; mod & 4: an fd with it */
	FUZZ_CONN_READ,	    /* k: read and check every reply waiting on k */
	FUZZ_CONN_STEP,	    /* u8 n: up to n + 1 turns of the loop, none waiting */
	FUZZ_CONN_WAIT,	    /* the loop runs until no worker job or disk I/O is in flight */
	FUZZ_CONN_CLOSE,    /* k: close k's client end */
	FUZZ_CONN_SHUT_WR,  /* k: shutdown(SHUT_WR) of k's client end */
	FUZZ_CONN_SEND_EOF, /* k: an empty datagram (the daemon reads it as the end) */
	/* k: the last datagram sent on any connection, again on k (one byte
	 * pipelines a request: no need for the mutator to copy its bytes) */
	FUZZ_CONN_SEND_AGAIN,
	FUZZ_CONN_N_OPS,
};
#define FUZZ_CONN_ADMIN	  0x04u /* OPEN's mod */
#define FUZZ_CONN_WITH_FD 0x04u /* SEND's mod */

/* ---- fuzz_ckpt: byte 0, then the checkpoint file -------------------------- */

/* Recompute the header, token, page and whole-file checksums before the
 * file is written, so mutations reach the checks behind them. */
#define FUZZ_CKPT_REPAIR 0x01u

/* ---- fuzz_spill: 5 control bytes, then page headers ----------------------- */

/* bytes 0-1: capacity in extents, 1 + (u16 LE % FUZZ_SPILL_MAX_CAP);
 * bytes 2-3: the extent the headers start at, u16 LE % capacity;
 * byte 4: flags below; then 128-byte page headers, written over the spill
 * file's page-header region from that extent on. */
#define FUZZ_SPILL_MAX_CAP  8192u
#define FUZZ_SPILL_CTL	    5u
#define FUZZ_SPILL_REPAIR   0x01u /* recompute each header's checksum */
#define FUZZ_SPILL_TRUNCATE 0x02u /* the file ends right after the headers (no data) */
#define FUZZ_SPILL_PICKY    0x04u /* the scan's callback refuses odd extents */

#define FUZZ_SPILL_UID	   1000u
#define FUZZ_SPILL_MODEL   "fuzz-model"
#define FUZZ_SPILL_ROOT_LO 0x0123456789abcdefull
#define FUZZ_SPILL_ROOT_HI 0xfedcba9876543210ull
/* 1 layer, 1 KV head, head_dim 8, 4 tokens per page, f16: 4 KiB pages. */
#define FUZZ_SPILL_LAYOUT                                                                          \
	((struct shm_layout){.n_layers = 1,                                                        \
			     .n_kv_heads = 1,                                                      \
			     .head_dim = 8,                                                        \
			     .block_tokens = 4,                                                    \
			     .dtype = SHM_DTYPE_F16,                                               \
			     .quant_group = 0})

/* The page header fields of daemon/store/spill.c (little-endian): magic, chain
 * hash, parent hash, data sum, sequence, flags, dtype, stored bytes, then
 * the XXH3-64 of the bytes before it seeded with the pool root's low half;
 * then (format 3) the last-use stamp and its seal, the XXH3-64 of the
 * stamp seeded with that checksum. */
#define FUZZ_SPILL_PH_CHECK 68u
#define FUZZ_SPILL_PH_USED  76u

#endif
