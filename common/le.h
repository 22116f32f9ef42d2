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

#endif
