#include "metrics.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histd_error.h"
#include "histd_wire.h"
#include "log.h"

/* Bucket bounds in microseconds: 100 us .. 10 s. */
static const int64_t bounds_us[] = {
	100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000,
	250000, 500000, 1000000, 2500000, 5000000, 10000000,
};
#define N_BOUNDS (sizeof(bounds_us) / sizeof(bounds_us[0]))
#define N_CODES 17   /* gRPC status codes 0..16 */

struct histogram {
	atomic_uint_fast64_t buckets[N_BOUNDS + 1];  /* last: +Inf */
	atomic_uint_fast64_t count;
	atomic_uint_fast64_t sum_us;
};

static void
observe(struct histogram *h, int64_t us)
{
	size_t i = 0;

	if (us < 0)
		us = 0;
	while (i < N_BOUNDS && us > bounds_us[i])
		i++;
	atomic_fetch_add(&h->buckets[i], 1);
	atomic_fetch_add(&h->count, 1);
	atomic_fetch_add(&h->sum_us, (uint64_t)us);
}

#define MAX_METHODS 32
static struct {
	const char *name;
	atomic_uint_fast64_t codes[N_CODES];
	struct histogram latency;
} methods[MAX_METHODS];
static atomic_int n_methods;

static const char *const driver_ops[] = {
	"session_create", "session_get", "session_resolve", "session_list",
	"session_update", "session_delete", "session_fork", "append", "read",
	"tool_result", "clear", "replace", "summary_put", "summary_get",
	"ping", "search", "embedding_put", "truncate",
};
#define N_OPS (sizeof(driver_ops) / sizeof(driver_ops[0]))
#define N_ERRS 14    /* -HISTD_E* codes 0..13 */
static struct {
	struct histogram latency;
	atomic_uint_fast64_t errors[N_ERRS];
} ops[N_OPS];

/* Named counters: a short list, appended under a lock, read lock-free. */
#define MAX_COUNTERS 128
static struct {
	char family[64];
	char help[128];
	char labels[192];
	atomic_uint_fast64_t value;
} counters[MAX_COUNTERS];
static atomic_int n_counters;
static pthread_mutex_t counters_mu = PTHREAD_MUTEX_INITIALIZER;

/* Collectors: added and removed on the main thread while /metrics may
 * be served, and called by the HTTP thread, all under collectors_mu, so
 * that one removed is never called after its removal returns. */
#define MAX_COLLECTORS 8
static struct {
	histd_metrics_collector fn;
	void *ctx;
} collectors[MAX_COLLECTORS];
static int n_collectors;
static pthread_mutex_t collectors_mu = PTHREAD_MUTEX_INITIALIZER;

static struct MHD_Daemon *daemon_;

int
histd_metrics_method(const char *name)
{
	int i = atomic_load(&n_methods);

	if (i >= MAX_METHODS)
		return -1;
	methods[i].name = name;
	atomic_store(&n_methods, i + 1);
	return i;
}

void
histd_metrics_rpc(int method, int code, int64_t duration_us)
{
	if (method < 0 || method >= atomic_load(&n_methods))
		return;
	if (code < 0 || code >= N_CODES)
		code = 2; /* UNKNOWN */
	atomic_fetch_add(&methods[method].codes[code], 1);
	observe(&methods[method].latency, duration_us);
}

void
histd_metrics_driver(const char *op, int64_t duration_us, int rc)
{
	for (size_t i = 0; i < N_OPS; i++) {
		if (strcmp(op, driver_ops[i]) != 0)
			continue;
		observe(&ops[i].latency, duration_us);
		if (rc < 0 && -rc < N_ERRS)
			atomic_fetch_add(&ops[i].errors[-rc], 1);
		return;
	}
}

void
histd_metrics_counter_add(const char *family, const char *help,
			  const char *labels, uint64_t n)
{
	int count = atomic_load(&n_counters);

	for (int i = 0; i < count; i++)
		if (strcmp(counters[i].family, family) == 0 &&
		    strcmp(counters[i].labels, labels) == 0) {
			atomic_fetch_add(&counters[i].value, n);
			return;
		}
	pthread_mutex_lock(&counters_mu);
	count = atomic_load(&n_counters);
	for (int i = 0; i < count; i++)
		if (strcmp(counters[i].family, family) == 0 &&
		    strcmp(counters[i].labels, labels) == 0) {
			atomic_fetch_add(&counters[i].value, n);
			pthread_mutex_unlock(&counters_mu);
			return;
		}
	if (count < MAX_COUNTERS) {
		snprintf(counters[count].family, sizeof(counters[count].family),
			 "%s", family);
		snprintf(counters[count].help, sizeof(counters[count].help),
			 "%s", help);
		snprintf(counters[count].labels, sizeof(counters[count].labels),
			 "%s", labels);
		atomic_store(&counters[count].value, n);
		atomic_store(&n_counters, count + 1);
	}
	pthread_mutex_unlock(&counters_mu);
}

void
histd_metrics_add_collector(histd_metrics_collector fn, void *ctx)
{
	pthread_mutex_lock(&collectors_mu);
	if (n_collectors < MAX_COLLECTORS) {
		collectors[n_collectors].fn = fn;
		collectors[n_collectors].ctx = ctx;
		n_collectors++;
	}
	pthread_mutex_unlock(&collectors_mu);
}

void
histd_metrics_remove_collector(histd_metrics_collector fn, void *ctx)
{
	pthread_mutex_lock(&collectors_mu);
	for (int i = 0; i < n_collectors; i++)
		if (collectors[i].fn == fn && collectors[i].ctx == ctx) {
			memmove(&collectors[i], &collectors[i + 1],
				(size_t)(n_collectors - i - 1) *
				sizeof(collectors[0]));
			n_collectors--;
			break;
		}
	pthread_mutex_unlock(&collectors_mu);
}

static void
write_histogram(FILE *out, const char *family, const char *label,
		const char *value, struct histogram *h)
{
	uint64_t cum = 0;

	for (size_t i = 0; i <= N_BOUNDS; i++) {
		cum += atomic_load(&h->buckets[i]);
		if (i < N_BOUNDS)
			fprintf(out, "%s_bucket{%s=\"%s\",le=\"%g\"} %llu\n",
				family, label, value, bounds_us[i] / 1e6,
				(unsigned long long)cum);
		else
			fprintf(out, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %llu\n",
				family, label, value, (unsigned long long)cum);
	}
	fprintf(out, "%s_sum{%s=\"%s\"} %.6f\n", family, label, value,
		atomic_load(&h->sum_us) / 1e6);
	fprintf(out, "%s_count{%s=\"%s\"} %llu\n", family, label, value,
		(unsigned long long)atomic_load(&h->count));
}

static const char *const code_names[N_CODES] = {
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
	"RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED",
};

char *
histd_metrics_render(void)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&buf, &len);
	int nm = atomic_load(&n_methods), nc = atomic_load(&n_counters);

	if (!out)
		return NULL;
	fprintf(out, "# HELP histd_rpc_requests_total RPCs handled, by method "
		"and status code.\n# TYPE histd_rpc_requests_total counter\n");
	for (int i = 0; i < nm; i++)
		for (int k = 0; k < N_CODES; k++) {
			uint64_t v = atomic_load(&methods[i].codes[k]);

			if (v)
				fprintf(out, "histd_rpc_requests_total{method=\"%s\","
					"code=\"%s\"} %llu\n", methods[i].name,
					code_names[k], (unsigned long long)v);
		}
	fprintf(out, "# HELP histd_rpc_duration_seconds Time from a call's "
		"arrival to its answer.\n"
		"# TYPE histd_rpc_duration_seconds histogram\n");
	for (int i = 0; i < nm; i++)
		write_histogram(out, "histd_rpc_duration_seconds", "method",
				methods[i].name, &methods[i].latency);
	fprintf(out, "# HELP histd_driver_duration_seconds Storage driver "
		"calls.\n# TYPE histd_driver_duration_seconds histogram\n");
	for (size_t i = 0; i < N_OPS; i++)
		if (atomic_load(&ops[i].latency.count))
			write_histogram(out, "histd_driver_duration_seconds", "op",
					driver_ops[i], &ops[i].latency);
	fprintf(out, "# HELP histd_driver_errors_total Storage driver calls "
		"that failed, by error.\n"
		"# TYPE histd_driver_errors_total counter\n");
	for (size_t i = 0; i < N_OPS; i++)
		for (int k = 1; k < N_ERRS; k++) {
			uint64_t v = atomic_load(&ops[i].errors[k]);

			if (v)
				fprintf(out, "histd_driver_errors_total{op=\"%s\","
					"error=\"%s\"} %llu\n", driver_ops[i],
					histd_error_name(-k),
					(unsigned long long)v);
		}
	/* Counters are listed in the order of first use, so the label sets
	 * of one family may be apart: each family is written once, all its
	 * samples under one HELP and TYPE, as Prometheus requires. */
	for (int i = 0; i < nc; i++) {
		int done = 0;

		for (int j = 0; j < i && !done; j++)
			done = strcmp(counters[j].family, counters[i].family) == 0;
		if (done)
			continue;
		fprintf(out, "# HELP %s %s\n# TYPE %s counter\n",
			counters[i].family, counters[i].help,
			counters[i].family);
		for (int j = i; j < nc; j++)
			if (strcmp(counters[j].family, counters[i].family) == 0)
				fprintf(out, "%s%s%s%s %llu\n", counters[j].family,
					counters[j].labels[0] ? "{" : "",
					counters[j].labels,
					counters[j].labels[0] ? "}" : "",
					(unsigned long long)atomic_load(
						&counters[j].value));
	}
	pthread_mutex_lock(&collectors_mu);
	for (int i = 0; i < n_collectors; i++)
		collectors[i].fn(collectors[i].ctx, out);
	pthread_mutex_unlock(&collectors_mu);
	fclose(out);
	return buf;
}

static enum MHD_Result
answer(void *cls, struct MHD_Connection *conn, const char *url,
       const char *method, const char *version, const char *upload_data,
       size_t *upload_size, void **req_cls)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;
	char *body;

	(void)cls;
	(void)version;
	(void)upload_data;
	(void)upload_size;
	(void)req_cls;
	if (strcmp(method, "GET") != 0 || strcmp(url, "/metrics") != 0) {
		static char nf[] = "not found: GET /metrics\n";

		resp = MHD_create_response_from_buffer(strlen(nf), nf,
						       MHD_RESPMEM_PERSISTENT);
		ret = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	if (!(body = histd_metrics_render()))
		return MHD_NO;
	resp = MHD_create_response_from_buffer(strlen(body), body,
					       MHD_RESPMEM_MUST_FREE);
	MHD_add_response_header(resp, "Content-Type",
				"text/plain; version=0.0.4; charset=utf-8");
	ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* libmicrohttpd's own messages, as JSON lines like every other; at most
 * one a second (a client refused over and over would flood the log), the
 * next one saying how many were left out. */
static void
log_mhd(void *cls, const char *fmt, va_list ap)
{
	static _Atomic int64_t last_s;
	static atomic_uint skipped;
	int64_t now = histd_mono_us() / 1000000, was = atomic_load(&last_s);
	char msg[512], n_skipped[16];
	size_t n;

	(void)cls;
	if (was == now || !atomic_compare_exchange_strong(&last_s, &was, now)) {
		atomic_fetch_add(&skipped, 1);
		return;
	}
	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	snprintf(n_skipped, sizeof(n_skipped), "%u",
		 atomic_exchange(&skipped, 0));
	histd_log(HISTD_LOG_WARN, "metrics endpoint", "message", msg,
		  "messages_left_out", n_skipped, NULL);
}

int
histd_metrics_start(const char *listen, int *bound_port)
{
	struct addrinfo hints, *ai = NULL;
	const char *colon;
	char host[256];
	size_t hlen;
	int gai;
	const union MHD_DaemonInfo *info;

	*bound_port = 0;
	if (!listen || !*listen)
		return 0;
	/* host:port, [v6]:port or :port; the port was checked with the
	 * configuration. */
	colon = strrchr(listen, ':');
	if (!colon || (size_t)(colon - listen) >= sizeof(host))
		return histd_error_set(HISTD_EINVALID, "metrics-listen '%s' is "
				       "not host:port", listen);
	hlen = (size_t)(colon - listen);
	if (hlen >= 2 && listen[0] == '[' && listen[hlen - 1] == ']') {
		memcpy(host, listen + 1, hlen - 2);
		host[hlen - 2] = '\0';
	} else {
		memcpy(host, listen, hlen);
		host[hlen] = '\0';
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	gai = getaddrinfo(*host ? host : "0.0.0.0", colon + 1, &hints, &ai);
	if (gai != 0)
		return histd_error_set(HISTD_EINVALID, "metrics-listen '%s': %s",
				       listen, gai_strerror(gai));
	/* AUTO: epoll here; select() would refuse every connection once
	 * histd holds 1024 descriptors (a busy gRPC side). One address
	 * holds at most 8 of the 64 connections, each dropped after 5 s
	 * without a byte. */
	daemon_ = MHD_start_daemon(MHD_USE_AUTO_INTERNAL_THREAD |
				   MHD_USE_ERROR_LOG |
				   (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0),
				   0, NULL, NULL, answer, NULL,
				   MHD_OPTION_EXTERNAL_LOGGER, log_mhd, NULL,
				   MHD_OPTION_SOCK_ADDR, ai->ai_addr,
				   MHD_OPTION_CONNECTION_LIMIT, 64,
				   MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8,
				   MHD_OPTION_CONNECTION_TIMEOUT, 5,
				   MHD_OPTION_END);
	freeaddrinfo(ai);
	if (!daemon_)
		return histd_error_set(HISTD_EUNAVAILABLE, "cannot serve metrics "
				       "on %s", listen);
	info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
	*bound_port = info ? info->port : atoi(colon + 1);
	return 0;
}

void
histd_metrics_stop(void)
{
	if (daemon_)
		MHD_stop_daemon(daemon_);
	daemon_ = NULL;
}
