/* client/base/list.h — the intrusive doubly linked list of libkvpalace.
 *
 * A client keeps its pools on one, a pool its sessions and leases, so that
 * closing a parent frees every handle opened through it. Header only; no
 * allocation; the caller serialises access (one thread per client).
 */
#ifndef KVPC_LIST_H
#define KVPC_LIST_H

#include <stddef.h>

struct list {
	struct list *prev;
	struct list *next;
};

#define list_entry(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

static inline void list_init(struct list *head)
{
	head->prev = head;
	head->next = head;
}

static inline int list_empty(const struct list *head)
{
	return head->next == head;
}

static inline void list_add_tail(struct list *head, struct list *node)
{
	node->prev = head->prev;
	node->next = head;
	head->prev->next = node;
	head->prev = node;
}

/* Unlinks node and leaves it pointing at itself, so a second list_del is
 * harmless. */
static inline void list_del(struct list *node)
{
	node->prev->next = node->next;
	node->next->prev = node->prev;
	node->prev = node;
	node->next = node;
}

#endif
