/* tools/kvp-ckpt-inspect.c — prints what a checkpoint file holds.
 *
 *   kvp-ckpt-inspect [--verify] FILE...
 *
 * Reads each FILE with the daemon's own reader (daemon/store/ckpt.h) under its
 * own name, as a restore of that name would: the header (format version,
 * the name and owner it records, model, layouts, counts, sizes, when it
 * was written) and, with --verify, every page against its checksum and
 * the whole-file checksum. A file the daemon would refuse is reported
 * with the daemon's reason (a copy under another name says which
 * checkpoint it holds). Exit status: 0 every file is a valid checkpoint,
 * 1 one was refused, 2 usage. Reads only; single-threaded.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"

static void print_layout(const char *what, const struct shm_layout *l)
{
	printf("%-12s %u layers, %u kv heads, head_dim %u, %u tokens per page, %s", what,
	       l->n_layers, l->n_kv_heads, l->head_dim, l->block_tokens, shm_dtype_name(l->dtype));
	if (l->quant_group)
		printf(" (groups of %u)", l->quant_group);
	if (l->format)
		printf(", %s format", shm_format_name(l->format));
	printf("\n");
}

/* Inspects one file. Returns 0 when it is a valid checkpoint, else 1. */
static int inspect(const char *path, int verify)
{
	char dir[4096], why[256] = "";
	const char *base = strrchr(path, '/');
	struct ckpt_reader r;
	const struct ckpt_meta *m = &r.meta;
	int dfd, ret;

	if (base) {
		snprintf(dir, sizeof(dir), "%.*s", (int)(base - path) ? (int)(base - path) : 1,
			 path);
		base++;
	} else {
		snprintf(dir, sizeof(dir), ".");
		base = path;
	}
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		printf("%s: cannot open its directory: %s\n", path, strerror(errno));
		return 1;
	}
	ret = ckpt_open(dfd, base, &r, why, sizeof(why));
	close(dfd);
	if (ret < 0) {
		printf("%s: refused: %s\n", path, why[0] ? why : strerror(-ret));
		return 1;
	}
	printf("%s:\n", path);
	printf("%-12s %u\n", "format", m->version);
	printf("%-12s %s\n", "name", m->name[0] ? m->name : "(not recorded: format 1 or 2)");
	printf("%-12s %u\n", "uid", m->uid);
	printf("%-12s %s\n", "model", m->model_id);
	print_layout("layout", &m->layout);
	if (memcmp(&m->layout, &m->pool_layout, sizeof(m->layout)))
		print_layout("pool layout", &m->pool_layout);
	printf("%-12s %" PRIu64 " in %u pages of %" PRIu64 " bytes\n", "tokens", m->n_tokens,
	       m->n_pages, m->page_bytes);
	printf("%-12s %u", "key spans", m->n_spans);
	for (uint32_t i = 0; i < m->n_spans && i < 8; i++)
		printf("%s[%" PRIu64 ", %" PRIu64 ") %016" PRIx64 "%016" PRIx64, i ? ", " : ": ",
		       m->spans[i].first_token, m->spans[i].first_token + m->spans[i].n_tokens,
		       m->spans[i].key.high64, m->spans[i].key.low64);
	printf("%s\n", m->n_spans > 8 ? ", ..." : "");
	printf("%-12s %" PRIu64 " bytes\n", "file", m->file_bytes);
	printf("%-12s %" PRIu64 " ns after the epoch\n", "created", m->created_ns);
	ret = 0;
	if (verify) {
		ret = ckpt_read_pages(&r, NULL, why, sizeof(why));
		printf("%-12s %s\n", "pages", ret == 0 ? "every page verified" : why);
	} else {
		printf("%-12s %s\n", "pages", "not checked (--verify reads them)");
	}
	ckpt_close(&r);
	return ret < 0;
}

int main(int argc, char **argv)
{
	int verify = 0, first = 1, bad = 0;

	if (argc > 1 && !strcmp(argv[1], "--verify")) {
		verify = 1;
		first = 2;
	}
	if (first >= argc || !strcmp(argv[first], "--help") || !strcmp(argv[first], "-h")) {
		fprintf(first >= argc ? stderr : stdout,
			"Usage: kvp-ckpt-inspect [--verify] FILE...\n"
			"Print what a kvpalaced checkpoint file holds (header, recorded name and\n"
			"owner); with --verify, check every page too. Exit status: 0 valid, 1 a\n"
			"file was refused, 2 usage.\n");
		return first >= argc ? 2 : 0;
	}
	for (int i = first; i < argc; i++)
		bad |= inspect(argv[i], verify);
	return bad;
}
