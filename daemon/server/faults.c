/* daemon/server/faults.c — I/O fault injection for tests (see faults.h).
 *
 * The rules live in a small static table filled once at start, before the
 * worker threads take any job, and only read afterwards; each rule's call
 * and fire counts are atomics, because ckpt_inject runs on worker threads
 * while the aio hook runs on the loop thread. Nothing here runs unless
 * $KVPALACED_FAULTS is set.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "faults.h"
#include "log.h"

#define FAULTS_MAX_RULES 16
#define FAULTS_SPEC_MAX	 1024
#define SHORT_FAULT	 1 /* rule.err for "short" */

enum layer { LAYER_AIO, LAYER_CKPT };
enum op { OP_READ, OP_WRITE, OP_FSYNC, OP_DIRSYNC, OP_ANY };
enum when { WHEN_EVERY, WHEN_NTH, WHEN_AFTER };

struct rule {
	enum layer layer;
	enum op op;
	int err; /* -errno, or SHORT_FAULT */
	enum when when;
	uint64_t n;
	uint64_t calls; /* atomic: calls the rule matched */
	uint64_t fired; /* atomic: faults it injected */
	char text[96];
};

static struct rule rules[FAULTS_MAX_RULES];
static unsigned int n_rules;

static const struct {
	const char *name;
	int err;
} errnames[] = {
	{"EIO", -EIO},	   {"ENOSPC", -ENOSPC}, {"ECANCELED", -ECANCELED}, {"EDQUOT", -EDQUOT},
	{"EFBIG", -EFBIG}, {"EINTR", -EINTR},	{"EAGAIN", -EAGAIN},	   {"short", SHORT_FAULT},
};

static const char *const opnames[] = {"read", "write", "fsync", "dirsync", "any"};

/* Parses a count of "every=", "nth=" or "after=" (1.., or 0.. for after). */
static int parse_count(const char *s, uint64_t min, uint64_t *ret)
{
	char *end;
	unsigned long long v;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v < min)
		return -EINVAL;
	*ret = v;
	return 0;
}

/* Parses one rule (a writable copy) into r. Returns 0 or -EINVAL with
 * the reason in why. */
static int parse_rule(char *text, struct rule *r, const char **why)
{
	char *save = NULL;
	char *layer = strtok_r(text, ":", &save);
	char *op = strtok_r(NULL, ":", &save);
	char *fault = strtok_r(NULL, ":", &save);
	char *when = strtok_r(NULL, ":", &save);
	size_t i;

	memset(r, 0, sizeof(*r));
	if (!layer || !op || !fault || strtok_r(NULL, ":", &save)) {
		*why = "a rule is layer:op:fault[:when]";
		return -EINVAL;
	}
	if (!strcmp(layer, "aio")) {
		r->layer = LAYER_AIO;
	} else if (!strcmp(layer, "ckpt")) {
		r->layer = LAYER_CKPT;
	} else {
		*why = "the layer is aio or ckpt";
		return -EINVAL;
	}
	for (i = 0; i < sizeof(opnames) / sizeof(opnames[0]); i++)
		if (!strcmp(op, opnames[i]))
			break;
	if (i == sizeof(opnames) / sizeof(opnames[0]) ||
	    (r->layer == LAYER_AIO && i == OP_DIRSYNC)) {
		*why = "the op is read, write, fsync, any (or dirsync for ckpt)";
		return -EINVAL;
	}
	r->op = (enum op)i;
	for (i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
		if (!strcmp(fault, errnames[i].name))
			break;
	if (i == sizeof(errnames) / sizeof(errnames[0])) {
		*why = "the fault is EIO, ENOSPC, ECANCELED, EDQUOT, EFBIG, EINTR, EAGAIN or short";
		return -EINVAL;
	}
	r->err = errnames[i].err;
	r->when = WHEN_EVERY;
	r->n = 1;
	if (!when) {
		/* every=1 */
	} else if (!strcmp(when, "once")) {
		r->when = WHEN_NTH;
	} else if (!strncmp(when, "every=", 6) && parse_count(when + 6, 1, &r->n) == 0) {
		r->when = WHEN_EVERY;
	} else if (!strncmp(when, "nth=", 4) && parse_count(when + 4, 1, &r->n) == 0) {
		r->when = WHEN_NTH;
	} else if (!strncmp(when, "after=", 6) && parse_count(when + 6, 0, &r->n) == 0) {
		r->when = WHEN_AFTER;
	} else {
		*why = "when is once, every=N, nth=N or after=N";
		return -EINVAL;
	}
	/* The caller retries these: firing on every call never ends. */
	if ((r->err == -EINTR || r->err == -EAGAIN) &&
	    (r->when == WHEN_AFTER || (r->when == WHEN_EVERY && r->n == 1))) {
		*why = "EINTR and EAGAIN are retried: give them once, nth=N or every=N (N >= 2)";
		return -EINVAL;
	}
	return 0;
}

/* Whether r fires on the call it is now counting. */
static int fires(struct rule *r)
{
	uint64_t k = __atomic_add_fetch(&r->calls, 1, __ATOMIC_RELAXED);

	switch (r->when) {
	case WHEN_EVERY:
		return k % r->n == 0;
	case WHEN_NTH:
		return k == r->n;
	case WHEN_AFTER:
		return k > r->n;
	}
	return 0;
}

/* Applies the first rule of layer that matches op and fires: returns its
 * -errno, or 0 after lowering *max_bytes for "short" (to whole blocks of
 * align bytes, leaving a transfer of one block whole). */
static int decide(enum layer layer, enum op op, size_t *max_bytes, size_t align)
{
	int ret = 0, decided = 0;

	for (unsigned int i = 0; i < n_rules; i++) {
		struct rule *r = &rules[i];

		if (r->layer != layer || (r->op != OP_ANY && r->op != op))
			continue;
		if (!fires(r) || decided)
			continue;
		if (r->err == SHORT_FAULT) {
			size_t half = *max_bytes / 2 / align * align;

			if (!half)
				continue; /* cannot be shortened */
			*max_bytes = half;
		} else {
			ret = r->err;
		}
		decided = 1;
		__atomic_add_fetch(&r->fired, 1, __ATOMIC_RELAXED);
	}
	return ret;
}

static int aio_hook(void *ctx, const struct aio_req *r, size_t done_so_far, size_t *max_bytes)
{
	const struct aio *a = ctx;
	size_t align = 1;
	enum op op;
	int fl;

	(void)done_so_far;
	switch (r->op) {
	case AIO_READ:
		op = OP_READ;
		break;
	case AIO_WRITE:
		op = OP_WRITE;
		break;
	default:
		op = OP_FSYNC;
		break;
	}
	/* O_DIRECT transfers move whole blocks. */
	fl = fcntl(a->files[r->file].fd, F_GETFL);
	if (fl >= 0 && (fl & O_DIRECT))
		align = 4096;
	return decide(LAYER_AIO, op, max_bytes, align);
}

static int ckpt_hook(enum ckpt_io io, size_t *max_bytes)
{
	static const enum op ops[] = {
		[CKPT_IO_READ] = OP_READ,
		[CKPT_IO_WRITE] = OP_WRITE,
		[CKPT_IO_FSYNC] = OP_FSYNC,
		[CKPT_IO_DIRSYNC] = OP_DIRSYNC,
	};

	return decide(LAYER_CKPT, ops[io], max_bytes, 1);
}

int faults_init(struct aio *a)
{
	const char *spec = getenv(FAULTS_ENV);
	char buf[FAULTS_SPEC_MAX], *save = NULL, *text;
	const char *why = NULL;
	int want_aio = 0, want_ckpt = 0;

	n_rules = 0;
	if (!spec || !*spec)
		return 0;
	if (strlen(spec) >= sizeof(buf)) {
		log_err("$%s: longer than %d bytes", FAULTS_ENV, FAULTS_SPEC_MAX - 1);
		return -EINVAL;
	}
	snprintf(buf, sizeof(buf), "%s", spec);
	for (text = strtok_r(buf, ";", &save); text; text = strtok_r(NULL, ";", &save)) {
		struct rule *r = &rules[n_rules];
		char copy[sizeof(r->text)];

		if (n_rules == FAULTS_MAX_RULES) {
			log_err("$%s: more than %d rules", FAULTS_ENV, FAULTS_MAX_RULES);
			return -EINVAL;
		}
		snprintf(copy, sizeof(copy), "%s", text);
		if (parse_rule(text, r, &why) < 0) {
			log_err("$%s: bad rule '%s': %s", FAULTS_ENV, copy, why);
			n_rules = 0;
			return -EINVAL;
		}
		snprintf(r->text, sizeof(r->text), "%s", copy);
		want_aio |= r->layer == LAYER_AIO;
		want_ckpt |= r->layer == LAYER_CKPT;
		n_rules++;
	}
	if (want_aio && a) {
		a->inject = aio_hook;
		a->inject_ctx = a;
	}
	if (want_ckpt)
		ckpt_inject = ckpt_hook;
	log_warn("fault injection armed by $%s (a test hook): %s%s", FAULTS_ENV, spec,
		 want_aio && !a ? " (no disk I/O: aio rules idle)" : "");
	return 0;
}

void faults_fini(struct aio *a)
{
	for (unsigned int i = 0; i < n_rules; i++)
		log_notice("fault injection: rule '%s' matched %llu calls, injected %llu faults",
			   rules[i].text, (unsigned long long)rules[i].calls,
			   (unsigned long long)rules[i].fired);
	if (a && a->inject == aio_hook) {
		a->inject = NULL;
		a->inject_ctx = NULL;
	}
	ckpt_inject = NULL;
	n_rules = 0;
}
