/*
 * histd's configuration: one table of options, each settable by a flag
 * (--max-message-bytes 1048576), an environment variable
 * (HISTD_MAX_MESSAGE_BYTES) and a key of the YAML file given by --config or
 * HISTD_CONFIG (max_message_bytes: 1048576). Precedence: flag, then
 * environment, then file, then the default.
 */
#ifndef HISTD_CONFIG_H
#define HISTD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "context.h"
#include "embedder.h"
#include "http.h"
#include "hub.h"
#include "service.h"

/* One provider's summarizer (clients/provider_summarizer.h): opened at
 * start when model is set. OpenAI's options serve both of its formats
 * (summarizer=openai_chat and summarizer=openai_responses). */
typedef struct histd_provider_config {
	char *base_url;          /* "": the provider's public API */
	char *api_key_env;       /* the variable holding the API key */
	char *model;             /* "": this provider is not configured */
	char *prompt;            /* "": the built-in instruction */
	uint32_t max_output_tokens;
	uint32_t timeout_ms;     /* the whole call, retries included */
} histd_provider_config;

typedef struct histd_config {
	char *config_file;
	/* HISTD_* environment variables that name no option, comma-separated
	 * ("" none): a typo would otherwise go unseen; main logs them. */
	char *unknown_env;
	char *listen;            /* host:port */
	char *port_file;         /* written with the bound port once serving */
	char *driver;            /* memory | file | postgres */
	char *data_dir;
	char *fsync;
	char *dsn;
	int pool_size;
	int pg_timeout_ms;
	/* Storage limits the driver enforces (histd_driver_config); 0: none. */
	size_t max_sessions_per_tenant;
	size_t max_session_messages;
	size_t max_session_bytes;
	int threads;             /* completion-queue threads */
	int posted_calls;        /* requests kept posted per method */
	uint32_t max_receive_bytes;
	uint32_t max_concurrent_streams;
	histd_service_config service;
	histd_hub_config hub;
	histd_context_config context;  /* the context pipeline (context.h) */
	uint32_t replay_max;     /* messages one Subscribe may replay */
	int64_t shutdown_grace_us;     /* in-flight calls may finish this long */
	char *log_level;
	char *metrics_listen;    /* host:port of /metrics; "" off */
	char *metrics_port_file;
	char *tls_cert;          /* PEM files; "" = plaintext */
	char *tls_key;
	char *tls_client_ca;     /* set: mutual TLS */
	char *api_keys_file;     /* KEY TENANT [read-only] per line */
	int auth_disabled;       /* explicit: every call is tenant "default" */
	uint32_t max_calls_per_tenant;  /* calls in progress; 0: no limit */
	uint32_t max_subscribers_per_tenant; /* Subscribe streams; 0: none */
	/* Compaction's provider summarizers, and the HTTP layer they share. */
	histd_provider_config anthropic;
	histd_provider_config openai;
	histd_provider_config gemini;
	histd_provider_config mistral;
	histd_http_config summarizer_http;
	/* Embeddings for semantic search (embedder.h); the providers'
	 * base URLs and key variables are the summarizers' above. */
	histd_embedder_config embedding;
} histd_config;

/*
 * Fills cfg from defaults, the YAML file, the environment and argv, in
 * that order of increasing precedence. Returns 0; 1 if --help or --version
 * was printed (exit 0); -1 after printing a one-line error to stderr (exit
 * 2). cfg is freed with histd_config_free in every case.
 */
int histd_config_load(histd_config *cfg, int argc, char **argv);
void histd_config_free(histd_config *cfg);

/* The option reference (flags, variables, keys, defaults), as --help
 * prints it. */
void histd_config_usage(FILE *out);

#endif
