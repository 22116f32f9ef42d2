/* client/ctl/events.h — kvpalacectl events: follow the daemon's KV events.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_EVENTS_H
#define KVPCTL_EVENTS_H

#include "common.h"

/* `events [--pool ID] [--count N]`. */
int cmd_events(kvp_client *c, const struct args *a);

#endif
