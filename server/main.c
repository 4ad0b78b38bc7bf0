/*
 * histd: start-up and shutdown.
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread before gRPC
 * starts its own, and main waits for them with sigwait; then the server
 * drains (health NOT_SERVING, streams end with UNAVAILABLE, calls in
 * flight finish within the grace) and histd exits 0.
 */
#include <errno.h>
#include <grpc/grpc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "context.h"
#include "driver.h"
#include "hub.h"
#include "log.h"
#include "metrics.h"
#include "service.h"
#include "transport.h"

static int
write_port_file(const char *path, int port)
{
	char tmp[4096];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	fprintf(f, "%d\n", port);
	if (fclose(f) != 0)
		return -1;
	/* Readers see the whole number or no file. */
	return rename(tmp, path);
}

int
main(int argc, char **argv)
{
	histd_config cfg;
	histd_driver_config dcfg = { 0 };
	histd_driver *drv = NULL;
	histd_hub *hub = NULL;
	histd_context *ctx = NULL;
	histd_service *svc = NULL;
	histd_server *srv = NULL;
	sigset_t sigs;
	int rc, port = 0, mport = 0, sig = 0;
	char portbuf[16];

	rc = histd_config_load(&cfg, argc, argv);
	if (rc != 0) {
		histd_config_free(&cfg);
		return rc > 0 ? 0 : 2;
	}
	if (histd_log_set_level(cfg.log_level) != 0) {
		fprintf(stderr, "histd: log-level must be debug, info, warn "
			"or error\n");
		histd_config_free(&cfg);
		return 2;
	}

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	grpc_init();

	dcfg.data_dir = cfg.data_dir;
	dcfg.fsync_mode = cfg.fsync;
	dcfg.dsn = cfg.dsn;
	dcfg.pool_size = cfg.pool_size;
	histd_driver_set_observer(histd_metrics_driver);
	rc = histd_metrics_start(cfg.metrics_listen, &mport);
	if (rc != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot serve metrics",
			  "error", histd_error_message(), NULL);
		goto out;
	}
	if (mport && cfg.metrics_port_file && *cfg.metrics_port_file)
		write_port_file(cfg.metrics_port_file, mport);
	rc = histd_driver_open(cfg.driver, &dcfg, &drv);
	if (rc != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot open storage",
			  "driver", cfg.driver, "error", histd_error_message(),
			  NULL);
		goto out;
	}
	rc = histd_hub_new(&hub, &cfg.hub);
	if (rc == 0) {
		histd_driver_set_notify(drv, histd_hub_notify, hub);
		rc = histd_context_new(&ctx, drv, &cfg.context);
	}
	if (rc == 0) {
		/* Compaction failures reach subscribers as plugin_error. */
		histd_context_set_error_sink(ctx,
					     histd_hub_publish_plugin_error, hub);
		cfg.service.context = ctx;
		rc = histd_service_new(&svc, drv, &cfg.service);
	}
	if (rc == 0)
		rc = histd_server_start(&srv, &cfg, svc, hub, &port);
	if (rc != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot start",
			  "error", histd_error_message(), NULL);
		goto out;
	}
	snprintf(portbuf, sizeof(portbuf), "%d", port);
	if (cfg.port_file && *cfg.port_file &&
	    write_port_file(cfg.port_file, port) != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot write port file",
			  "path", cfg.port_file, "error", strerror(errno), NULL);
		rc = -1;
	} else {
		histd_log(HISTD_LOG_INFO, "serving", "listen", cfg.listen,
			  "port", portbuf, "driver", cfg.driver, NULL);
		while (sigwait(&sigs, &sig) != 0)
			;
		histd_log(HISTD_LOG_INFO, "shutting down",
			  "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
	}
	histd_server_shutdown(srv);
	histd_server_free(srv);
	srv = NULL;

out:
	histd_metrics_stop();
	/* Before the hub (its error sink) and the driver (its workers). */
	histd_context_free(ctx);
	if (hub)
		histd_hub_free(hub);
	histd_service_free(svc);
	if (drv)
		histd_driver_close(drv);
	grpc_shutdown();
	if (rc == 0)
		histd_log(HISTD_LOG_INFO, "stopped", NULL);
	histd_config_free(&cfg);
	return rc == 0 ? 0 : 1;
}
