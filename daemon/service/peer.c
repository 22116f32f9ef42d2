/* daemon/service/peer.c — a request's peer and its tickets (peer.h). */
#include <unistd.h>

#include "cache.h"
#include "clock.h"
#include "peer.h"
#include "reply.h"

void peer_init(struct peer *p, const struct peer_ops *ops, uid_t uid, gid_t gid, pid_t pid,
	       int admin)
{
	*p = (struct peer){.ops = ops, .uid = uid, .gid = gid, .pid = pid, .admin = admin};
	p->timing.op = -1;
	list_init(&p->leases);
	session_writer_init(&p->writing);
	session_owner_init(&p->sessions);
}

void ticket_deliver(struct ticket *t, struct reply *r)
{
	if (!t->peer) {
		if (r->pass_fd >= 0)
			close(r->pass_fd);
		r->pass_fd = -1;
		return;
	}
	if (t->timing.op >= 0 && t->peer->cache)
		cache_latency_add(t->peer->cache, t->peer->uid, (unsigned int)t->timing.op,
				  clock_now_ns() - t->timing.start_ns);
	t->peer->ops->deliver(t, r);
}
