/* daemon/listen.h — creating the daemon's listening Unix sockets. */
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

#endif
