/* client/api/page.c — whole pages: views of where a session's or a
 * lease's page lies in this process's mapping of the arena, with the
 * strides of its layout (kvp_session_page, kvp_lease_page), so an engine
 * copies whole runs (a page, a layer's K) instead of calling
 * kvp_session_kv once per row; and copies in and out through the arena's
 * file (kvp_session_write, kvp_lease_read), which map nothing here.
 *
 * Views are pure reads of the handle's page table, as kvp_session_kv and
 * kvp_lease_kv are (the view's addresses are theirs: handle_page_view
 * computes them with shm/layout.h's offsets); nothing goes to the daemon.
 * The copies use the same slots at the same offsets in the memfd: why
 * they are faster for a fresh process is in kvpalace.h.
 * Not thread-safe: one thread at a time per client.
 *
 * Layer: api (client/README.md): uses handle/ only.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "handle.h"

KVP_PUBLIC int kvp_session_page(kvp_session *s, uint64_t page, struct kvp_page_view *ret)
{
	const struct kvp_pool *p;
	uint64_t bt, left;

	if (!s || !ret)
		return -EINVAL;
	p = s->pool;
	/* After a lost connection the daemon has freed our uncommitted slots
	 * and may lend them to someone else: hand out no more addresses. */
	if (p->client->dead)
		return -ENOTCONN;
	bt = p->layout.block_tokens;
	if (page >= pool_pages_for(p, s->n_tokens))
		return -ERANGE;
	left = s->n_tokens - page * bt;
	handle_page_view(p, s->slots[page], page, (uint32_t)(left < bt ? left : bt), ret);
	return 0;
}

KVP_PUBLIC int kvp_lease_page(const kvp_lease *l, uint64_t page, struct kvp_page_view *ret)
{
	const struct kvp_pool *p;

	if (!l || !ret)
		return -EINVAL;
	p = l->pool;
	/* A lost connection ended the lease: the pages may be reused. */
	if (p->client->dead)
		return -ENOTCONN;
	if (page >= l->n_tokens / p->layout.block_tokens)
		return -ERANGE;
	handle_page_view(p, l->slots[page], page, p->layout.block_tokens, ret);
	return 0;
}

/* Pages [first, first + n) of a page table of `have` pages, as
 * addresses and/or slots. */
static int block_table(const struct kvp_pool *p, const uint32_t *slots, uint64_t have,
		       uint64_t first, size_t n, void **ret_bases, uint32_t *ret_slots)
{
	if (p->client->dead)
		return -ENOTCONN;
	if (first > have || n > have - first)
		return -ERANGE;
	for (size_t i = 0; i < n; i++) {
		uint32_t slot = slots[first + i];

		if (ret_bases)
			ret_bases[i] = p->pages + (uint64_t)slot * p->page_bytes;
		if (ret_slots)
			ret_slots[i] = slot;
	}
	return 0;
}

KVP_PUBLIC int kvp_session_block_table(const kvp_session *s, uint64_t first_page, size_t n,
				       void **ret_bases, uint32_t *ret_slots)
{
	if (!s || (n && !ret_bases && !ret_slots))
		return -EINVAL;
	return block_table(s->pool, s->slots, pool_pages_for(s->pool, s->n_tokens), first_page, n,
			   ret_bases, ret_slots);
}

KVP_PUBLIC int kvp_lease_block_table(const kvp_lease *l, uint64_t first_page, size_t n,
				     void **ret_bases, uint32_t *ret_slots)
{
	if (!l || (n && !ret_bases && !ret_slots))
		return -EINVAL;
	return block_table(l->pool, l->slots, l->n_tokens / l->pool->layout.block_tokens,
			   first_page, n, ret_bases, ret_slots);
}

KVP_PUBLIC int kvp_pool_arena(const kvp_pool *p, struct kvp_arena *ret)
{
	if (!p || !ret)
		return -EINVAL;
	if (p->client->dead)
		return -ENOTCONN;
	*ret = (struct kvp_arena){
		.base = p->pages,
		.bytes = (size_t)p->n_pages * p->page_bytes,
		.page_bytes = p->page_bytes,
		.n_pages = p->n_pages,
		.fd = p->arena_fd,
		.fd_offset = (uint64_t)(p->pages - p->arena),
		.hugetlb = p->arena_hugetlb,
	};
	return 0;
}

/* pwrite/pread of [off, off + n) of slot `slot`'s page, to the end: the
 * kernel may copy less than asked (a signal). */
static int page_io(const struct kvp_pool *p, uint32_t slot, uint64_t off, void *buf, size_t n,
		   int write)
{
	uint64_t at = (uint64_t)(p->pages - p->arena) + (uint64_t)slot * p->page_bytes + off;

	if (p->arena_fd < 0)
		return -EBADF;
	if (write && p->arena_hugetlb) {
		/* pwrite to hugetlbfs is -EINVAL; its mapping faults per 2
		 * MiB and zeroes nothing a pwrite would have spared. */
		if (n) /* src may be NULL then */
			memcpy(p->arena + at, buf, n);
		return 0;
	}
	while (n) {
		ssize_t k = write ? pwrite(p->arena_fd, buf, n, (off_t)at)
				  : pread(p->arena_fd, buf, n, (off_t)at);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -EIO; /* past the end: cannot be, the arena is sealed */
		buf = (unsigned char *)buf + k;
		n -= (size_t)k;
		at += (uint64_t)k;
	}
	return 0;
}

KVP_PUBLIC int kvp_session_write(kvp_session *s, uint64_t page, uint64_t off, const void *src,
				 size_t n)
{
	const struct kvp_pool *p;

	if (!s || (!src && n))
		return -EINVAL;
	p = s->pool;
	if (p->client->dead)
		return -ENOTCONN;
	if (page >= pool_pages_for(p, s->n_tokens) || off > p->page_bytes ||
	    n > p->page_bytes - off)
		return -ERANGE;
	/* Committed rows may be read by anyone now (and a full page may be
	 * an indexed copy other sessions share). */
	if (s->committed > page * p->layout.block_tokens)
		return -EROFS;
	return page_io(p, s->slots[page], off, (void *)src, n, 1);
}

KVP_PUBLIC int kvp_lease_read(const kvp_lease *l, uint64_t page, uint64_t off, void *dst, size_t n)
{
	const struct kvp_pool *p;

	if (!l || (!dst && n))
		return -EINVAL;
	p = l->pool;
	if (p->client->dead)
		return -ENOTCONN;
	if (page >= l->n_tokens / p->layout.block_tokens || off > p->page_bytes ||
	    n > p->page_bytes - off)
		return -ERANGE;
	return page_io(p, l->slots[page], off, dst, n, 0);
}
