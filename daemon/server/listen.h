/* daemon/server/listen.h — creating the daemon's listening Unix sockets. */
#ifndef KVPD_LISTEN_H
#define KVPD_LISTEN_H

#include <sys/types.h>

/* Creates the parent directory if missing (0755), binds a SOCK_SEQPACKET
 * socket at path with permissions mode and listens. A socket file left by
 * a dead daemon is replaced; one a live daemon answers on is not
 * (-EADDRINUSE). Returns the fd (O_CLOEXEC) or a negative errno. */
int listen_unix(const char *path, mode_t mode);

/* mkdir -p with mode for missing components. Returns 0 or a negative
 * errno. */
int listen_mkdir_p(const char *path, mode_t mode);

/* Sockets passed by systemd (socket activation), by name. */
struct listen_activated {
	int client; /* named "client" (or the only, unnamed one); -1 if none */
	int admin;  /* named "admin"; -1 if none */
};

/* Takes the descriptors systemd passed ($LISTEN_FDS, $LISTEN_FDNAMES)
 * through sd_listen_fds_with_names() and unsets those variables, so
 * children do not inherit them. Each one must be a listening AF_UNIX
 * SOCK_SEQPACKET socket; it is made O_CLOEXEC and returned in *ret by its
 * name ("client", "admin"; a single unnamed one counts as "client").
 * Descriptors with other names are closed. Without socket activation both
 * fields are -1 and the result is 0. Returns the number of sockets taken
 * (0–2), or a negative errno: -EINVAL when a passed descriptor is not a
 * listening seqpacket Unix socket or a name repeats (all passed
 * descriptors are closed then). The caller owns the returned fds. */
int listen_activated(struct listen_activated *ret);

#endif
