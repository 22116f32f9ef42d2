/* common/le.h — little-endian fixed-width fields in byte buffers.
 *
 * Every on-disk and on-wire format of kvpalace (frames, spill files,
 * checkpoints) stores its integers little-endian at fixed offsets, so a
 * file or message reads the same whatever the struct padding or the
 * host's byte order. Header only, no state; the daemon, the client and
 * proto/ share it.
 */
#ifndef KVP_LE_H
#define KVP_LE_H

#include <stddef.h>
#include <stdint.h>

static inline void le_put16(unsigned char *p, uint16_t v)
{
	p[0] = (unsigned char)v;
	p[1] = (unsigned char)(v >> 8);
}

static inline void le_put32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline void le_put64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t le_get16(const unsigned char *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t le_get32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t le_get64(const unsigned char *p)
{
	return (uint64_t)le_get32(p) | (uint64_t)le_get32(p + 4) << 32;
}

/* Arrays of uint32 stored as 4-byte little-endian fields (token lists and
 * page tables on the wire): on a little-endian host the stored form is the
 * native one, and a 4-aligned array may be read in place. */
#define LE_NATIVE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)

static inline void le_get32_array(uint32_t *dst, const unsigned char *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = le_get32(src + 4 * i);
}

static inline void le_put32_array(unsigned char *dst, const uint32_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		le_put32(dst + 4 * i, src[i]);
}

#endif
