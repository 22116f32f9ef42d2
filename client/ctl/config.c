/* client/ctl/config.c — kvpalacectl's configuration commands (see
 * config.h): `config show` (kvp_admin_config_show) and `config reload`
 * (kvp_admin_config_reload), as text or JSON.
 *
 * Layer: ctl, the control CLI (client/README.md): above the library,
 * which it uses only through the public header kvpalace.h.
 * Single-threaded.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "config.h"
#include "jdoc.h"

int cmd_config_show(kvp_client *c, const struct args *a)
{
	struct kvp_config *cfg;
	char buf[4200], src[64];
	int ret;

	ret = kvp_admin_config_show(c, &cfg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object(), *keys = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_str_or_null(doc, "file", cfg->file);
		jdoc_str_or_null(doc, "preset", cfg->preset);
		jdoc_bool(doc, "truncated", cfg->truncated);
		for (size_t i = 0; i < cfg->n_entries; i++) {
			json_t *e = jdoc_object();
			json_t *key = jdoc_text(cfg->entries[i].key);

			jdoc_str(e, "value", cfg->entries[i].value);
			jdoc_str(e, "source", cfg->entries[i].source);
			/* The key comes from the daemon: made valid UTF-8 first. */
			jdoc_set(keys, json_string_value(key), e);
			json_decref(key);
		}
		jdoc_set(doc, "config", keys);
		free(cfg);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	/* As kvpalaced --print-config prints it. */
	printf("# kvpalaced effective configuration");
	if (cfg->file)
		printf("; file %s", printable(cfg->file, buf, sizeof(buf)));
	if (cfg->preset)
		printf("; preset %s", printable(cfg->preset, buf, sizeof(buf)));
	printf("\n");
	for (size_t i = 0; i < cfg->n_entries; i++) {
		char key[64];

		printf("%-22s = ", printable(cfg->entries[i].key, key, sizeof(key)));
		printf("%-40s", printable(cfg->entries[i].value, buf, sizeof(buf)));
		printf(" # %s\n", printable(cfg->entries[i].source, src, sizeof(src)));
	}
	if (cfg->truncated)
		printf("# (more keys than fit in one reply)\n");
	free(cfg);
	return 0;
}

int cmd_config_reload(kvp_client *c, const struct args *a)
{
	struct kvp_config_reload *r;
	char buf[64];
	int ret;

	ret = kvp_admin_config_reload(c, &r);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		json_t *doc = jdoc_object();

		jdoc_str(doc, "socket", a->path);
		jdoc_bool(doc, "reloaded", 1);
		jdoc_set(doc, "changed", jdoc_str_array(r->changed, r->n_changed));
		jdoc_set(doc, "restart_needed",
			 jdoc_str_array(r->restart_needed, r->n_restart_needed));
		free(r);
		return jdoc_print(stdout, doc) < 0 ? EXIT_DAEMON : 0;
	}
	printf("configuration reloaded: ");
	if (!r->n_changed)
		printf("nothing changed");
	for (size_t i = 0; i < r->n_changed; i++)
		printf("%s%s", i ? ", " : "changed ", printable(r->changed[i], buf, sizeof(buf)));
	printf("\n");
	if (r->n_restart_needed) {
		printf("a restart is needed for:");
		for (size_t i = 0; i < r->n_restart_needed; i++)
			printf(" %s", printable(r->restart_needed[i], buf, sizeof(buf)));
		printf("\n");
	}
	free(r);
	return 0;
}
