/* common/list.h — intrusive circular doubly-linked lists, and
 * container_of.
 *
 * Objects embed a struct list node and belong to a list without extra
 * allocation, so unlinking on teardown cannot fail. Header only, no
 * state: the daemon and the client library share it (common/ is below
 * both, and calls nothing).
 */
#ifndef KVP_LIST_H
#define KVP_LIST_H

#include <stddef.h>

/* The struct of type that holds member at ptr. */
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

struct list {
	struct list *prev, *next;
};

static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}

static inline int list_empty(const struct list *l)
{
	return l->next == l;
}

static inline void list_add_tail(struct list *head, struct list *node)
{
	node->prev = head->prev;
	node->next = head;
	head->prev->next = node;
	head->prev = node;
}

/* Unlinks node and leaves it as an empty list, so unlinking twice is safe. */
static inline void list_del(struct list *node)
{
	node->prev->next = node->next;
	node->next->prev = node->prev;
	list_init(node);
}

#define list_entry(ptr, type, member) container_of(ptr, type, member)

/* Iterates safely against removal of the current node. */
#define list_for_each_safe(pos, tmp, head)                                                         \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                           \
	     (pos) = (tmp), (tmp) = (pos)->next)

#endif
