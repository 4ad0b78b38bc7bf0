/*
 * histd: start-up and shutdown.
 *
 * Signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread before
 * gRPC starts its own, and main waits for them with sigwait. On SIGTERM or
 * SIGINT the server drains (health NOT_SERVING, streams end with
 * UNAVAILABLE, calls in flight finish within the grace) and histd exits 0.
 * SIGHUP, which would otherwise kill histd on the spot, is logged and
 * ignored: the files it might be sent to reload are watched already.
 *
 * Summarizers: the provider summarizers whose model is configured are
 * opened at start (a configured one without its API key stops start-up)
 * and handed to compaction as its summarizer source, so that a session's
 * compaction option summarizer=<name> finds them. The other provider names
 * stay known, so that a session may name them, and fail when used with a
 * message saying which options and variable to set.
 */
#include <errno.h>
#include <stdatomic.h>
#include <grpc/grpc.h>
#include <grpc/support/log.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compaction.h"
#include "config.h"
#include "context.h"
#include "driver.h"
#include "embedder.h"
#include "hub.h"
#include "log.h"
#include "metrics.h"
#include "provider_summarizer.h"
#include "service.h"
#include "transport.h"

/* gRPC core's own messages, as JSON lines like ours. */
static void
log_grpc(gpr_log_func_args *a)
{
	char where[256];

	snprintf(where, sizeof(where), "%s:%d", a->file ? a->file : "", a->line);
	histd_log(a->severity == GPR_LOG_SEVERITY_ERROR ? HISTD_LOG_ERROR :
		  a->severity == GPR_LOG_SEVERITY_INFO ? HISTD_LOG_INFO :
		  HISTD_LOG_DEBUG,
		  "grpc", "message", a->message ? a->message : "",
		  "source", where, NULL);
}

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

/* ---------------------------------------------------------------------- */
/* Compaction's provider summarizers                                       */

/* At shutdown, once calls had their grace: provider calls (summaries,
 * embeddings) are abandoned rather than waited for. */
static void
stop_http(void *http)
{
	histd_http_stop(http);
}


/* One name compaction may give as its summarizer option. */
typedef struct summarizer_slot {
	const char *name;          /* in compaction's options */
	const char *provider;      /* histd_provider_options.provider */
	const char *prefix;        /* its options: "<prefix>-model", ... */
	const histd_provider_config *conf;
	histd_summarizer *s;       /* opened at start; NULL: not configured */
} summarizer_slot;

typedef struct summarizers {
	histd_http *http;          /* shared by every provider call */
	summarizer_slot slot[6];
	size_t n;
} summarizers;

/*
 * What compaction opens per reduce: a view of the long-lived summarizer
 * made at start (which holds the key and the shared HTTP layer), freed
 * without touching it. summarize of a provider summarizer is safe from
 * several threads at once.
 */
typedef struct borrowed_summarizer {
	histd_summarizer base;
	histd_summarizer *inner;
} borrowed_summarizer;

static int
borrowed_summarize(histd_summarizer *s, const histd_summary_request *req,
		   histd_summary_result *out)
{
	histd_summarizer *in = ((borrowed_summarizer *)s)->inner;
	int rc = in->summarize(in, req, out);
	char labels[128];

	snprintf(labels, sizeof(labels), "provider=\"%s\",kind=\"summarize\","
		 "result=\"%s\"", in->name ? in->name : "",
		 rc ? histd_error_name(rc) : "OK");
	histd_metrics_counter_add("histd_provider_calls_total",
				  "Calls to LLM providers by provider, kind and "
				  "result.", labels, 1);
	return rc;
}

static void
borrowed_free(histd_summarizer *s)
{
	free(s);
}

static summarizer_slot *
find_slot(summarizers *z, const char *name)
{
	for (size_t i = 0; i < z->n; i++)
		if (!strcmp(z->slot[i].name, name))
			return &z->slot[i];
	return NULL;
}

static int
source_exists(void *arg, const char *name)
{
	return find_slot(arg, name) != NULL;
}

static int
source_open(void *arg, const char *name, histd_summarizer **out)
{
	summarizer_slot *sl = find_slot(arg, name);
	borrowed_summarizer *b;

	if (!sl)
		return histd_error_set(HISTD_EINVALID, "unknown summarizer");
	if (!sl->s)
		return histd_error_set(HISTD_EPRECONDITION, "summarizer %s is "
				       "not configured: set %s-model and the "
				       "API key in %s", sl->name, sl->prefix,
				       sl->conf->api_key_env);
	if (!(b = calloc(1, sizeof(*b))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	b->base.version = HISTD_SUMMARIZER_VERSION;
	b->base.name = sl->name;
	b->base.summarize = borrowed_summarize;
	b->base.free = borrowed_free;
	b->inner = sl->s;
	*out = &b->base;
	return 0;
}

static void
summarizers_free(summarizers *z)
{
	for (size_t i = 0; i < z->n; i++)
		if (z->slot[i].s)
			z->slot[i].s->free(z->slot[i].s);
	histd_http_free(z->http);
	memset(z, 0, sizeof(*z));
}

/* Opens every configured provider summarizer; -1 after logging why not. */
static int
summarizers_open(summarizers *z, const histd_config *cfg)
{
	const summarizer_slot slots[] = {
		{ "anthropic", "anthropic", "anthropic", &cfg->anthropic, NULL },
		{ "openai_chat", "openai_chat", "openai", &cfg->openai, NULL },
		/* "openai" is the Chat Completions summarizer too. */
		{ "openai", "openai_chat", "openai", &cfg->openai, NULL },
		{ "openai_responses", "openai_responses", "openai",
		  &cfg->openai, NULL },
		{ "gemini", "gemini", "gemini", &cfg->gemini, NULL },
		{ "mistral", "mistral", "mistral", &cfg->mistral, NULL },
	};
	int rc;

	memset(z, 0, sizeof(*z));
	if (histd_http_new(&z->http, &cfg->summarizer_http) != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot start the provider HTTP "
			  "layer", "error", histd_error_message(), NULL);
		return -1;
	}
	for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
		summarizer_slot *sl = &z->slot[z->n++];
		const histd_provider_config *c = slots[i].conf;
		histd_provider_options o = { 0 };

		*sl = slots[i];
		if (!*c->model)
			continue;
		o.provider = sl->provider;
		o.model = c->model;
		o.base_url = c->base_url;
		o.api_key_env = c->api_key_env;
		o.prompt = c->prompt;
		o.max_output_tokens = c->max_output_tokens;
		o.timeout_ms = c->timeout_ms;
		o.http = z->http;
		if ((rc = histd_provider_summarizer_open(&o, &sl->s)) != 0) {
			/* The message names the variable, never the key. */
			histd_log(HISTD_LOG_ERROR, "cannot open summarizer",
				  "summarizer", sl->name,
				  "error", histd_error_message(), NULL);
			summarizers_free(z);
			return rc;
		}
		histd_log(HISTD_LOG_INFO, "summarizer ready", "summarizer",
			  sl->name, "model", c->model, NULL);
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The driver's change hook: the hub, then the embedding worker            */

/*
 * Both halves only queue: the hub its events, the embedder (tenant,
 * session, seqs) jobs. The embedder is set once it exists (it needs the
 * provider HTTP layer opened after the hook) and is stopped, not freed,
 * while the driver may still call the hook.
 */
typedef struct change_hook {
	histd_hub *hub;
	_Atomic(histd_embedder *) emb;
} change_hook;

static void
change_both(void *arg, const histd_change *c)
{
	change_hook *h = arg;

	histd_hub_notify(h->hub, c);
	histd_embedder_notify(atomic_load(&h->emb), c);
}

/* The embedding worker on the summarizers' HTTP layer; -1 after logging. */
static int
embedder_open(histd_embedder **out, histd_driver *drv, const histd_config *cfg,
	      histd_http *http)
{
	const histd_embedder_provider prov[] = {
		{ "openai", cfg->openai.base_url, cfg->openai.api_key_env },
		{ "gemini", cfg->gemini.base_url, cfg->gemini.api_key_env },
		{ "mistral", cfg->mistral.base_url, cfg->mistral.api_key_env },
	};

	int rc = histd_embedder_new(out, drv, &cfg->embedding, http, prov,
				    sizeof(prov) / sizeof(prov[0]));

	if (rc != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot start embeddings",
			  "error", histd_error_message(), NULL);
		return rc;
	}
	if (*cfg->embedding.provider)
		histd_log(HISTD_LOG_INFO, "embeddings ready", "provider",
			  cfg->embedding.provider, NULL);
	return 0;
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
	summarizers sums = { 0 };
	histd_summarizer_source src;
	change_hook hook = { 0 };
	histd_embedder *emb = NULL;
	sigset_t sigs;
	int rc, port = 0, mport = 0, sig = 0;
	/* A bad option found only as it is used (a default pipeline naming
	 * no plugin, a summarizer or embedding provider without its key):
	 * exit 2, as config.c's checks do. */
	int bad_option = 0;
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

	if (cfg.unknown_env && *cfg.unknown_env)
		histd_log(HISTD_LOG_WARN, "environment variables that name no "
			  "option are ignored (see histd --help)", "names",
			  cfg.unknown_env, NULL);

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	gpr_set_log_function(log_grpc);
	grpc_init();

	dcfg.data_dir = cfg.data_dir;
	dcfg.fsync_mode = cfg.fsync;
	dcfg.log_level = cfg.log_level;
	dcfg.dsn = cfg.dsn;
	dcfg.pool_size = cfg.pool_size;
	dcfg.timeout_ms = cfg.pg_timeout_ms;
	dcfg.max_sessions_per_tenant = cfg.max_sessions_per_tenant;
	dcfg.max_session_messages = cfg.max_session_messages;
	dcfg.max_session_bytes = cfg.max_session_bytes;
	histd_driver_set_observer(histd_metrics_driver);
	rc = histd_metrics_start(cfg.metrics_listen, &mport);
	if (rc != 0) {
		/* A host that does not resolve is a bad value (exit 2); a
		 * port in use is not. */
		bad_option = rc == HISTD_EINVALID;
		histd_log(HISTD_LOG_ERROR, "cannot serve metrics",
			  "error", histd_error_message(), NULL);
		goto out;
	}
	if (mport && cfg.metrics_port_file && *cfg.metrics_port_file &&
	    write_port_file(cfg.metrics_port_file, mport) != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot write metrics port file",
			  "path", cfg.metrics_port_file, "error",
			  strerror(errno), NULL);
		rc = -1;
		goto out;
	}
	rc = histd_driver_open(cfg.driver, &dcfg, &drv);
	if (rc != 0) {
		histd_log(HISTD_LOG_ERROR, "cannot open storage",
			  "driver", cfg.driver, "error", histd_error_message(),
			  NULL);
		goto out;
	}
	/* No event larger than a GetMessages page, as in a replay. */
	cfg.hub.max_event_bytes = cfg.service.max_response_bytes;
	rc = histd_hub_new(&hub, &cfg.hub);
	if (rc == 0 && (rc = summarizers_open(&sums, &cfg))) {
		/* A model configured without its API key. */
		bad_option = rc == HISTD_EINVALID;
		goto out;
	}
	if (rc == 0) {
		/* Before the context: its default pipeline may name a
		 * provider summarizer, checked as it is parsed. */
		src.exists = source_exists;
		src.open = source_open;
		src.arg = &sums;
		histd_compaction_set_source(&src);
		hook.hub = hub;
		histd_driver_set_notify(drv, change_both, &hook);
		rc = histd_context_new(&ctx, drv, &cfg.context);
		bad_option = rc == HISTD_EINVALID;
	}
	if (rc == 0 && (rc = embedder_open(&emb, drv, &cfg, sums.http))) {
		bad_option = rc == HISTD_EINVALID;
		goto out;
	}
	if (rc == 0) {
		atomic_store(&hook.emb, emb);
		histd_search_set_embedder(histd_embedder_search(emb));
	}
	if (rc == 0) {
		/* Compaction failures reach subscribers as plugin_error. */
		histd_context_set_error_sink(ctx,
					     histd_hub_publish_plugin_error, hub);
		cfg.service.context = ctx;
		rc = histd_service_new(&svc, drv, &cfg.service);
	}
	if (rc == 0) {
		/* A keys or TLS file refused: a bad option, like the rest. */
		rc = histd_server_start(&srv, &cfg, svc, hub, &port);
		bad_option = rc == HISTD_EINVALID;
	}
	if (rc == 0 && sums.http)
		histd_server_on_grace_over(srv, stop_http, sums.http);
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
		for (;;) {
			if (sigwait(&sigs, &sig) != 0)
				continue;
			if (sig != SIGHUP)
				break;
			histd_log(HISTD_LOG_INFO, "SIGHUP ignored: the keys "
				  "and certificate files are re-read when they "
				  "change", NULL);
		}
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
	/* No search runs any more; the workers stop before the HTTP layer
	 * and the driver go (freed after the driver's last notify). */
	histd_search_set_embedder(NULL);
	histd_embedder_stop(emb);
	/* No compaction runs any more: the summarizers can go. */
	histd_compaction_set_source(NULL);
	if (sums.http)
		summarizers_free(&sums);
	histd_service_free(svc);
	if (drv)
		histd_driver_close(drv);
	/* After the driver: until it is closed its threads (the postgres
	 * listener catching up on another replica's changes, a committer
	 * draining its queue) may call the hook, which queues to the hub. */
	if (hub)
		histd_hub_free(hub);
	histd_embedder_free(emb);
	grpc_shutdown();
	if (rc == 0)
		histd_log(HISTD_LOG_INFO, "stopped", NULL);
	histd_config_free(&cfg);
	return rc == 0 ? 0 : bad_option ? 2 : 1;
}
