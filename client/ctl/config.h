/* client/ctl/config.h — kvpalacectl's configuration commands: config
 * show and config reload.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_CONFIG_H
#define KVPCTL_CONFIG_H

#include "common.h"

/* `config show`: the effective configuration, as kvpalaced --print-config
 * prints it. */
int cmd_config_show(kvp_client *c, const struct args *a);

/* `config reload`: re-read the configuration as SIGHUP does. */
int cmd_config_reload(kvp_client *c, const struct args *a);

#endif
