/* client/ctl/checkpoint.h — kvpalacectl's checkpoint commands:
 * checkpoint, restore, warmup, checkpoints and checkpoint rm.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 */
#ifndef KVPCTL_CHECKPOINT_H
#define KVPCTL_CHECKPOINT_H

#include "common.h"

/* `checkpoint SESSION_ID NAME`: write a session to disk as NAME. */
int cmd_checkpoint(kvp_client *c, const struct args *a);

/* `restore NAME [--uid UID] [--pool ID]`: rebuild a session from NAME. */
int cmd_restore(kvp_client *c, const struct args *a);

/* `warmup NAME [--uid UID]`: load a checkpoint into the prefix index. */
int cmd_warmup(kvp_client *c, const struct args *a);

/* `checkpoints [--uid UID] [--verify]`: one row per checkpoint. */
int cmd_checkpoints(kvp_client *c, const struct args *a);

/* `checkpoint rm NAME [--uid UID]`: remove checkpoint NAME. */
int cmd_checkpoint_rm(kvp_client *c, const struct args *a);

#endif
