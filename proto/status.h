/* proto/status.h — the protocol's Status codes and negative errno.
 *
 * The daemon works in negative errno internally and puts a Status on the
 * wire; the client library turns the Status back into negative errno for its
 * caller. One table in status.c keeps both directions in step.
 */
#ifndef KVP_PROTO_STATUS_H
#define KVP_PROTO_STATUS_H

/* Maps a wire Status to a negative errno (0 for STATUS_OK, -EPROTO for an
 * unknown value). */
int status_to_errno(int status);
/* Maps a negative errno to a wire Status (STATUS_INTERNAL for anything not
 * in the table). */
int status_from_errno(int err);

#endif
