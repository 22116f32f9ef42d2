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
#include "json.h"

int cmd_config_show(kvp_client *c, const struct args *a)
{
	struct kvp_config *cfg;
	char buf[4200], src[64];
	int ret;

	ret = kvp_admin_config_show(c, &cfg);
	if (ret < 0)
		return fail(c, a->name, ret);
	if (a->json) {
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_key(stdout, "file");
		if (cfg->file)
			json_str(stdout, cfg->file);
		else
			fputs("null", stdout);
		fputc(',', stdout);
		json_key(stdout, "preset");
		if (cfg->preset)
			json_str(stdout, cfg->preset);
		else
			fputs("null", stdout);
		fputc(',', stdout);
		json_bool(stdout, "truncated", cfg->truncated, 1);
		json_key(stdout, "config");
		fputc('{', stdout);
		for (size_t i = 0; i < cfg->n_entries; i++) {
			if (i)
				fputc(',', stdout);
			json_key(stdout, cfg->entries[i].key);
			fputc('{', stdout);
			json_string(stdout, "value", cfg->entries[i].value, 1);
			json_string(stdout, "source", cfg->entries[i].source, 0);
			fputc('}', stdout);
		}
		fputs("}}\n", stdout);
		free(cfg);
		return 0;
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
		fputc('{', stdout);
		json_string(stdout, "socket", a->path, 1);
		json_bool(stdout, "reloaded", 1, 1);
		json_str_array(stdout, "changed", r->changed, r->n_changed, 1);
		json_str_array(stdout, "restart_needed", r->restart_needed, r->n_restart_needed, 0);
		fputs("}\n", stdout);
		free(r);
		return 0;
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
