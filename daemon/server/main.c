/* daemon/server/main.c — kvpalaced's entry point: parse the configuration, start
 * the server, serve until SIGTERM/SIGINT. Everything else lives in its own
 * subsystem file.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "config.h"
#include "listen.h"
#include "log.h"
#include "server.h"

int main(int argc, char **argv)
{
	static struct config cfg;
	static struct server srv;
	enum config_action action;
	char err[256];
	int ret;

	config_defaults(&cfg);
	if (config_parse_args(&cfg, argc, argv, &action, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvpalaced: %s\nTry 'kvpalaced --help'.\n", err);
		return 2;
	}
	if (action == CONFIG_HELP) {
		config_usage(argv[0]);
		return 0;
	}
	if (action == CONFIG_PRINT) {
		config_print(&cfg, stdout);
		return 0;
	}
	if (action == CONFIG_VERSION) {
		printf("kvpalaced %s (protocol 1)\n", KVP_VERSION);
		return 0;
	}
	log_set_level(cfg.log_level);
	const char *dirs[] = {cfg.state_dir, cfg.cache_dir};
	for (size_t i = 0; i < 2; i++) {
		/* The state directory holds checkpoints: what it creates is
		 * fsynced into its parent (ckpt.h), the cache needs no such. */
		ret = i == 0 ? ckpt_mkdir_p(dirs[i], 0750) : listen_mkdir_p(dirs[i], 0750);
		if (ret >= 0 && i == 0)
			close(ret);
		if (ret < 0) {
			log_err("cannot create %s: %s", dirs[i], strerror(-ret));
			return 1;
		}
	}
	ret = server_init(&srv, &cfg, argc, argv);
	if (ret == 0)
		ret = server_run(&srv);
	server_fini(&srv);
	if (ret < 0)
		return 1;
	log_notice("stopped");
	return 0;
}
