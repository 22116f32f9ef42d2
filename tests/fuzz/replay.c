/* tests/fuzz/replay.c — runs a fuzz target over files, without libFuzzer.
 *
 * Linked with one target's LLVMFuzzerTestOneInput in every build (gcc or
 * clang, sanitizers or not): each argument is a file, whose bytes are one
 * input, or a directory, whose regular files are inputs in name order.
 * Inputs run in one process one after the other, as under libFuzzer. A
 * finding aborts (the target's checks, or a sanitizer); otherwise the exit
 * status is 0, or 1 when an argument cannot be read. meson registers one
 * test per corpus file (tests/fuzz/meson.build); replaying a crash found
 * by the fuzzer is `<build>/tests/fuzz/<target>_replay crash-...`.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Reads path whole into a buffer of exactly its size (so the sanitizers
 * see any read past the input). Returns 0 or -errno. */
static int read_file(const char *path, uint8_t **ret_buf, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0;
	struct stat sb;
	int ret = 0;

	if (!f)
		return -errno;
	if (fstat(fileno(f), &sb) < 0) {
		ret = -errno;
		goto out;
	}
	len = (size_t)sb.st_size;
	buf = malloc(len ? len : 1);
	if (!buf) {
		ret = -ENOMEM;
		goto out;
	}
	if (len && fread(buf, 1, len, f) != len) {
		ret = -EIO;
		free(buf);
		goto out;
	}
	*ret_buf = buf;
	*ret_len = len;
out:
	fclose(f);
	return ret;
}

static int run_file(const char *path)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int ret = read_file(path, &buf, &len);

	if (ret < 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(-ret));
		return ret;
	}
	printf("%s: %zu bytes\n", path, len);
	fflush(stdout);
	LLVMFuzzerTestOneInput(buf, len);
	free(buf);
	return 0;
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int ret = 0;

	if (!d) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		return -errno;
	}
	while ((de = readdir(d))) {
		char *path;

		if (de->d_name[0] == '.')
			continue;
		if (n == cap) {
			char **v = realloc(names, (cap ? 2 * cap : 64) * sizeof(*v));

			if (!v) {
				ret = -ENOMEM;
				break;
			}
			names = v;
			cap = cap ? 2 * cap : 64;
		}
		if (asprintf(&path, "%s/%s", dir, de->d_name) < 0) {
			ret = -ENOMEM;
			break;
		}
		names[n++] = path;
	}
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), by_name);
	for (size_t i = 0; i < n; i++) {
		struct stat sb;

		if (ret == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode))
			ret = run_file(names[i]);
		free(names[i]);
	}
	free(names);
	return ret;
}

int main(int argc, char **argv)
{
	int failed = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (int i = 1; i < argc; i++) {
		struct stat sb;

		if (stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode))
			failed |= run_dir(argv[i]) < 0;
		else
			failed |= run_file(argv[i]) < 0;
	}
	return failed;
}
