/* client/ctl/session.h — kvpalacectl's commands on one session or pool
 * by id: session show, drop session, drop pool.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_SESSION_H
#define KVPCTL_SESSION_H

#include "common.h"

/* `session show ID [--pages N]`: one session in detail. */
int cmd_session_show(kvp_client *c, const struct args *a);

/* `drop session ID [--force]`: close a session of any user and forget its
 * cached pages. */
int cmd_drop_session(kvp_client *c, const struct args *a);

/* `drop pool ID [--force]`: free a pool of any user and its arena. */
int cmd_drop_pool(kvp_client *c, const struct args *a);

#endif
