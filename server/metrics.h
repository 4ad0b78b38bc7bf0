/*
 * Prometheus metrics, served over HTTP by libmicrohttpd at /metrics.
 *
 * Families: histd_rpc_requests_total{method,code},
 * histd_rpc_duration_seconds{method} (histogram),
 * histd_driver_duration_seconds{op} (histogram),
 * histd_driver_errors_total{op,error}, gauges from collectors (subscribers,
 * active calls, ...), and named counters any room may add
 * (histd_metrics_counter_add: compaction runs, provider calls, ...).
 *
 * Recording is lock-free (atomic counters) and safe from any thread; the
 * process has one set of metrics.
 */
#ifndef HISTD_METRICS_H
#define HISTD_METRICS_H

#include <stdint.h>
#include <stdio.h>

/* Starts the HTTP endpoint on host:port or [v6]:port, a host name bound
 * at its first address ("" or NULL: no endpoint, the metrics are still
 * recorded); *bound_port says the port (port 0 picks one). 0, or
 * EINVALID naming the address. */
int histd_metrics_start(const char *listen, int *bound_port);
void histd_metrics_stop(void);

/* Registers an RPC method name (a static string) at start; returns the
 * index to record with, or -1 when the table is full. */
int histd_metrics_method(const char *name);

/* One finished RPC: method index, gRPC status code, duration. */
void histd_metrics_rpc(int method, int code, int64_t duration_us);

/* The driver observer (histd_driver_set_observer). */
void histd_metrics_driver(const char *op, int64_t duration_us, int rc);

/* Adds n to the counter `family{labels}` (labels: "" or `k="v",k2="v2"`,
 * already escaped); help is a one-line description. Counters are created
 * on first use. */
void histd_metrics_counter_add(const char *family, const char *help,
			       const char *labels, uint64_t n);

/* A gauge collector writes Prometheus text lines when /metrics is read,
 * on the HTTP thread; it must not add or remove collectors. Once
 * histd_metrics_remove_collector returns, fn is not running with ctx and
 * will not be called with it again: ctx may be freed. */
typedef void (*histd_metrics_collector)(void *ctx, FILE *out);
void histd_metrics_add_collector(histd_metrics_collector fn, void *ctx);
void histd_metrics_remove_collector(histd_metrics_collector fn, void *ctx);

/* The whole exposition, as /metrics serves it (malloc'ed; for tests). */
char *histd_metrics_render(void);

#endif
