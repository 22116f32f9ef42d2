/* client/ctl/evict.h — kvpalacectl's commands that take cached pages
 * out: evict and purge.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_EVICT_H
#define KVPCTL_EVICT_H

#include "common.h"

/* `evict --tier TIER --bytes SIZE [--pool ID] [--discard]`. */
int cmd_evict(kvp_client *c, const struct args *a);

/* `purge [--pool ID] [--uid UID] [--model ID] [--salt TEXT|--salt-hex HEX]
 * [--unused-since TIME]`. */
int cmd_purge(kvp_client *c, const struct args *a);

#endif
