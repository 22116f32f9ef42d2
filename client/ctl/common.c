/* client/ctl/common.c — exit codes, error reports and the text
 * formatting every kvpalacectl command shares (see common.h).
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"

int fail(kvp_client *c, const char *what, int err)
{
	fprintf(stderr, "kvpalacectl: %s: %s\n", what, kvp_strerror(c, err));
	if (err == -ENOTCONN || err == -EPIPE || err == -ECONNRESET)
		return EXIT_CONNECT;
	if (err == -EPROTO || err == -EPROTONOSUPPORT)
		return EXIT_PROTO;
	return EXIT_DAEMON;
}

int usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvpalacectl%s%s: ", cmd ? " " : "", cmd ? cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (cmd)
		fprintf(stderr, "; see 'kvpalacectl %s --help'\n", cmd);
	else
		fputs("\nTry 'kvpalacectl --help'.\n", stderr);
	return EXIT_USAGE;
}

const char *plural(uint64_t n)
{
	return n == 1 ? "" : "s";
}

const char *dtype_name(uint32_t dtype)
{
	switch (dtype) {
	case KVP_DTYPE_F16:
		return "f16";
	case KVP_DTYPE_BF16:
		return "bf16";
	case KVP_DTYPE_F32:
		return "f32";
	case KVP_DTYPE_INT8:
		return "int8";
	case KVP_DTYPE_FP8_E4M3:
		return "fp8-e4m3";
	case KVP_DTYPE_INT4:
		return "int4";
	case KVP_DTYPE_E4M3_RAW:
		return "e4m3-raw";
	case KVP_DTYPE_E5M2_RAW:
		return "e5m2-raw";
	default:
		return "?";
	}
}

const char *tier_name(uint32_t tier)
{
	switch (tier) {
	case KVP_TIER_GPU:
		return "gpu";
	case KVP_TIER_HOST:
		return "host";
	case KVP_TIER_DISK:
		return "disk";
	default:
		return "?";
	}
}

const char *printable(const char *s, char *buf, size_t cap)
{
	size_t i = 0;

	for (; s[i] && i + 1 < cap; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	buf[i] = '\0';
	return buf;
}

void layout_text(const struct kvp_layout *l, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "%uL %uH %uD %uT %s", l->n_layers, l->n_kv_heads, l->head_dim,
			 l->block_tokens, dtype_name(l->dtype));

	if (l->quant_group && n > 0 && (size_t)n < cap)
		n += snprintf(buf + n, cap - (size_t)n, "/g%u", l->quant_group);
	if (l->format && n > 0 && (size_t)n < cap)
		snprintf(buf + n, cap - (size_t)n, " %s",
			 l->format == KVP_FORMAT_LATENT ? "latent" : "format?");
}

void size_text(uint64_t bytes, char *buf, size_t cap)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned int u = 0;
	double v = (double)bytes;

	while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		u++;
	}
	if (u == 0 || v == (double)(uint64_t)v)
		snprintf(buf, cap, "%.0f %s", v, units[u]);
	else
		snprintf(buf, cap, "%.1f %s", v, units[u]);
}

void size_short(uint64_t bytes, char *buf, size_t cap)
{
	static const char units[] = "BKMGTPE";
	unsigned int u = 0;
	double v = (double)bytes;

	while (v >= 1000 && u + 1 < sizeof(units) - 1) { /* 1000 K would not fit */
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, cap, "%.0f", v);
	else if (v < 9.95)
		snprintf(buf, cap, "%.1f%c", v, units[u]);
	else
		snprintf(buf, cap, "%.0f%c", v, units[u]);
}

/* "1d 02:03:04"-style text is for uptime; idle times read better as the
 * two largest units: 850ms, 12.5s, 4m07s, 3h25m, 2d07h. */
void idle_text(uint64_t ms, char *buf, size_t cap)
{
	uint64_t s = ms / 1000;

	if (ms < 1000)
		snprintf(buf, cap, "%" PRIu64 "ms", ms);
	else if (s < 60)
		snprintf(buf, cap, "%" PRIu64 ".%" PRIu64 "s", s, ms % 1000 / 100);
	else if (s < 3600)
		snprintf(buf, cap, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, cap, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else
		snprintf(buf, cap, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
}
