#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "driver.h"

/* The largest OPT_SECONDS value: 100 years. */
#define SECONDS_MAX 3155760000ULL
#define SECONDS_MAX_TEXT "3155760000"

enum opt_type {
	OPT_STR,
	OPT_INT,        /* int, >= 0 */
	OPT_U32,        /* uint32_t, >= 0; accepts K/M/G suffixes (1024) */
	OPT_SIZE,       /* size_t, >= 0 */
	OPT_SECONDS,    /* int64_t microseconds, given in seconds */
	OPT_BOOL,       /* int 0/1: "--flag" alone, or true/false/1/0 */
};

struct opt {
	const char *name;        /* flag without "--"; key and variable derive */
	enum opt_type type;
	size_t offset;
	const char *def;
	const char *help;
};

#define OFF(f) offsetof(histd_config, f)

/* The reference: README's configuration table is this table. */
static const struct opt opts[] = {
	{ "listen", OPT_STR, OFF(listen), "0.0.0.0:50051",
	  "address to serve gRPC on (host:port; port 0 picks a free one)" },
	{ "port-file", OPT_STR, OFF(port_file), "",
	  "write the bound port to this file once serving (0 for a unix:\n"
	  "      listener)" },
	{ "driver", OPT_STR, OFF(driver), "file",
	  "storage driver: file (durable, in data-dir), memory (lost at\n"
	  "      exit) or postgres (shared by replicas)" },
	{ "data-dir", OPT_STR, OFF(data_dir), "./data",
	  "directory of the file driver" },
	{ "fsync", OPT_STR, OFF(fsync), "batch",
	  "file driver durability: always | batch | never" },
	{ "dsn", OPT_STR, OFF(dsn), "",
	  "PostgreSQL connection string (postgres driver)" },
	{ "pool-size", OPT_INT, OFF(pool_size), "8",
	  "PostgreSQL connections (postgres driver)" },
	{ "pg-timeout-ms", OPT_INT, OFF(pg_timeout_ms), "30000",
	  "milliseconds a PostgreSQL statement may run (its\n"
	  "      statement_timeout); histd waits 2 s more for the answer, then\n"
	  "      drops the connection; the call answers UNAVAILABLE (0: no\n"
	  "      limit; postgres driver)" },
	{ "max-sessions-per-tenant", OPT_SIZE, OFF(max_sessions_per_tenant),
	  "0", "sessions one tenant may hold (RESOURCE_EXHAUSTED above; 0: no\n"
	  "      limit)" },
	{ "max-session-messages", OPT_SIZE, OFF(max_session_messages), "0",
	  "messages one session may hold (RESOURCE_EXHAUSTED above; 0: no\n"
	  "      limit)" },
	{ "max-session-bytes", OPT_SIZE, OFF(max_session_bytes), "0",
	  "stored bytes one session may hold (RESOURCE_EXHAUSTED above; 0:\n"
	  "      no limit)" },
	{ "threads", OPT_INT, OFF(threads), "0",
	  "threads serving the completion queue (0: 2 per core; at least\n"
	  "      32 for the file and postgres drivers, which block; at most\n"
	  "      1024)" },
	{ "provider-call-threads", OPT_U32,
	  OFF(service.provider_call_threads), "16",
	  "threads running the calls that may wait on a provider (Reduce,\n"
	  "      SEMANTIC and HYBRID Search), started as needed, so a slow\n"
	  "      provider holds none of the threads above (0: run them there;\n"
	  "      at most 1024)" },
	{ "posted-calls", OPT_INT, OFF(posted_calls), "16",
	  "requests kept posted per method (at most 1024)" },
	{ "max-message-bytes", OPT_U32, OFF(max_receive_bytes), "4M",
	  "largest gRPC request accepted (RESOURCE_EXHAUSTED above)" },
	{ "max-concurrent-streams", OPT_U32, OFF(max_concurrent_streams), "1000",
	  "concurrent calls per HTTP/2 connection" },
	{ "max-messages-per-append", OPT_U32,
	  OFF(service.max_messages_per_append), "1000",
	  "messages in one Append, Replace or Import" },
	{ "max-stored-message-bytes", OPT_U32, OFF(service.max_message_bytes),
	  "1M", "largest single message (packed protobuf)" },
	{ "max-page-size", OPT_U32, OFF(service.max_page_size), "1000",
	  "most messages or sessions one page returns" },
	{ "max-response-bytes", OPT_U32, OFF(service.max_response_bytes),
	  "4000000", "largest GetMessages page (a page ends early above it) "
	  "and Subscribe event" },
	{ "idempotency-ttl", OPT_SECONDS, OFF(service.idempotency_ttl_us),
	  "86400", "seconds an idempotency key is remembered" },
	{ "subscriber-queue", OPT_SIZE, OFF(hub.queue_max), "1024",
	  "changes queued per subscriber before it is ended as too slow "
	  "(a change sent as several events counts once)" },
	{ "subscriber-end-grace", OPT_SECONDS, OFF(hub.end_grace_us), "30",
	  "seconds a subscriber ended as too slow may read nothing before its "
	  "stream is cancelled (0: never)" },
	{ "max-subscribers", OPT_SIZE, OFF(hub.max_subscribers), "10000",
	  "Subscribe streams in total (0: no limit)" },
	{ "max-subscribers-per-session", OPT_SIZE, OFF(hub.max_per_session),
	  "1000", "Subscribe streams per session (0: no limit; a stream "
	  "ended as too slow no longer counts)" },
	{ "replay-max", OPT_U32, OFF(replay_max), "100000",
	  "messages one Subscribe may replay" },
	{ "default-pipeline", OPT_STR, OFF(context.default_pipeline), "",
	  "context pipeline of sessions whose config has none, e.g.\n"
	  "      'masking:keep_recent_results=3;window:max_tokens=100000'\n"
	  "      (plugins ';'-separated, options ','-separated key=value)" },
	{ "plugins", OPT_STR, OFF(context.plugin_paths), "",
	  "plugin shared objects to load at start (comma-separated paths)" },
	{ "compaction-workers", OPT_INT, OFF(context.workers), "1",
	  "threads running automatic compactions" },
	{ "compaction-retries", OPT_INT, OFF(context.max_retries), "5",
	  "retries of a failed automatic compaction (backoff doubling\n"
	  "      from compaction-retry-base, at most 60 s)" },
	{ "compaction-retry-base", OPT_SECONDS, OFF(context.retry_base_us), "1",
	  "seconds before the first retry of a failed compaction" },
	{ "session-ttl", OPT_SECONDS, OFF(context.session_ttl_us), "0",
	  "delete sessions idle for longer than this many seconds (0: never)" },
	{ "ttl-sweep-interval", OPT_SECONDS, OFF(context.sweep_interval_us),
	  "60", "seconds between sweeps for expired sessions (at least 1)" },
	{ "shutdown-grace", OPT_SECONDS, OFF(shutdown_grace_us), "10",
	  "seconds in-flight calls get to finish on SIGTERM" },
	{ "log-level", OPT_STR, OFF(log_level), "info",
	  "debug | info | warn | error" },
	{ "metrics-listen", OPT_STR, OFF(metrics_listen), "",
	  "host:port serving Prometheus metrics at /metrics (empty: off)" },
	{ "metrics-port-file", OPT_STR, OFF(metrics_port_file), "",
	  "write the bound metrics port to this file" },
	{ "tls-cert", OPT_STR, OFF(tls_cert), "",
	  "PEM certificate chain: serve gRPC over TLS (reloaded when it changes)" },
	{ "tls-key", OPT_STR, OFF(tls_key), "",
	  "PEM private key of tls-cert" },
	{ "tls-client-ca", OPT_STR, OFF(tls_client_ca), "",
	  "PEM CA: require client certificates it signed (mutual TLS)" },
	{ "api-keys-file", OPT_STR, OFF(api_keys_file), "",
	  "API keys, one 'KEY TENANT [read-only|read-write]' per line\n"
	  "      (reloaded when it changes); callers send 'authorization:\n"
	  "      Bearer KEY'" },
	{ "auth-disabled", OPT_BOOL, OFF(auth_disabled), "false",
	  "serve without authentication (every call is tenant 'default');\n"
	  "      needed when no api-keys-file is given" },
	{ "max-calls-per-tenant", OPT_U32, OFF(max_calls_per_tenant), "256",
	  "calls one tenant may have in progress (RESOURCE_EXHAUSTED above;\n"
	  "      0: no limit)" },
	{ "max-subscribers-per-tenant", OPT_U32, OFF(max_subscribers_per_tenant),
	  "2500", "Subscribe streams one tenant may hold open (RESOURCE_EXHAUSTED\n"
	  "      above; 0: no limit)" },
	{ "anthropic-base-url", OPT_STR, OFF(anthropic.base_url),
	  "https://api.anthropic.com", "Anthropic API base URL (summarizer=anthropic)" },
	{ "anthropic-api-key-env", OPT_STR, OFF(anthropic.api_key_env), "ANTHROPIC_API_KEY",
	  "environment variable holding the Anthropic API key (never logged)" },
	{ "anthropic-model", OPT_STR, OFF(anthropic.model), "",
	  "Anthropic model that writes summaries (empty: Anthropic summarizer\n"
	  "      not configured)" },
	{ "anthropic-prompt", OPT_STR, OFF(anthropic.prompt), "",
	  "Anthropic summarization instruction (empty: the built-in one)" },
	{ "anthropic-max-output-tokens", OPT_U32, OFF(anthropic.max_output_tokens),
	  "1024", "longest Anthropic summary in tokens (a session's\n"
	  "      max_summary_tokens wins)" },
	{ "anthropic-timeout-ms", OPT_U32, OFF(anthropic.timeout_ms), "120000",
	  "one Anthropic summary call, retries included (a session's\n"
	  "      timeout_ms wins)" },
	{ "openai-base-url", OPT_STR, OFF(openai.base_url),
	  "https://api.openai.com", "OpenAI API base URL (summarizer=openai_chat, openai_responses)" },
	{ "openai-api-key-env", OPT_STR, OFF(openai.api_key_env), "OPENAI_API_KEY",
	  "environment variable holding the OpenAI API key (never logged)" },
	{ "openai-model", OPT_STR, OFF(openai.model), "",
	  "OpenAI model that writes summaries (empty: OpenAI summarizer\n"
	  "      not configured)" },
	{ "openai-prompt", OPT_STR, OFF(openai.prompt), "",
	  "OpenAI summarization instruction (empty: the built-in one)" },
	{ "openai-max-output-tokens", OPT_U32, OFF(openai.max_output_tokens),
	  "1024", "longest OpenAI summary in tokens (a session's\n"
	  "      max_summary_tokens wins)" },
	{ "openai-timeout-ms", OPT_U32, OFF(openai.timeout_ms), "120000",
	  "one OpenAI summary call, retries included (a session's\n"
	  "      timeout_ms wins)" },
	{ "gemini-base-url", OPT_STR, OFF(gemini.base_url),
	  "https://generativelanguage.googleapis.com", "Gemini API base URL (summarizer=gemini)" },
	{ "gemini-api-key-env", OPT_STR, OFF(gemini.api_key_env), "GEMINI_API_KEY",
	  "environment variable holding the Gemini API key (never logged)" },
	{ "gemini-model", OPT_STR, OFF(gemini.model), "",
	  "Gemini model that writes summaries (empty: Gemini summarizer\n"
	  "      not configured)" },
	{ "gemini-prompt", OPT_STR, OFF(gemini.prompt), "",
	  "Gemini summarization instruction (empty: the built-in one)" },
	{ "gemini-max-output-tokens", OPT_U32, OFF(gemini.max_output_tokens),
	  "1024", "longest Gemini summary in tokens (a session's\n"
	  "      max_summary_tokens wins)" },
	{ "gemini-timeout-ms", OPT_U32, OFF(gemini.timeout_ms), "120000",
	  "one Gemini summary call, retries included (a session's\n"
	  "      timeout_ms wins)" },
	{ "mistral-base-url", OPT_STR, OFF(mistral.base_url),
	  "https://api.mistral.ai", "Mistral API base URL (summarizer=mistral)" },
	{ "mistral-api-key-env", OPT_STR, OFF(mistral.api_key_env), "MISTRAL_API_KEY",
	  "environment variable holding the Mistral API key (never logged)" },
	{ "mistral-model", OPT_STR, OFF(mistral.model), "",
	  "Mistral model that writes summaries (empty: Mistral summarizer\n"
	  "      not configured)" },
	{ "mistral-prompt", OPT_STR, OFF(mistral.prompt), "",
	  "Mistral summarization instruction (empty: the built-in one)" },
	{ "mistral-max-output-tokens", OPT_U32, OFF(mistral.max_output_tokens),
	  "1024", "longest Mistral summary in tokens (a session's\n"
	  "      max_summary_tokens wins)" },
	{ "mistral-timeout-ms", OPT_U32, OFF(mistral.timeout_ms), "120000",
	  "one Mistral summary call, retries included (a session's\n"
	  "      timeout_ms wins)" },
	{ "summarizer-connect-timeout-ms", OPT_U32,
	  OFF(summarizer_http.connect_timeout_ms), "5000",
	  "provider calls: one connection attempt" },
	{ "summarizer-request-timeout-ms", OPT_U32,
	  OFF(summarizer_http.timeout_ms), "60000",
	  "provider calls: one attempt, whole (at least 1)" },
	{ "summarizer-max-retries", OPT_U32, OFF(summarizer_http.max_retries),
	  "3", "provider calls: retries of a failed attempt (connection\n"
	  "      errors, timeouts, 408, 409, 429, 5xx)" },
	{ "summarizer-backoff-base-ms", OPT_U32,
	  OFF(summarizer_http.backoff_base_ms), "500",
	  "provider calls: first backoff (doubling, full jitter)" },
	{ "summarizer-backoff-max-ms", OPT_U32,
	  OFF(summarizer_http.backoff_max_ms), "30000",
	  "provider calls: longest single backoff" },
	{ "summarizer-max-concurrent", OPT_U32,
	  OFF(summarizer_http.max_concurrent), "8",
	  "provider calls in progress at once, all providers together" },
	{ "summarizer-max-response-bytes", OPT_SIZE,
	  OFF(summarizer_http.max_response_bytes), "16M",
	  "largest provider answer accepted" },
	{ "embedding-provider", OPT_STR, OFF(embedding.provider), "",
	  "embeddings of sessions whose config names none: openai, gemini\n"
	  "      or mistral (empty: none; base URL and key variable are the\n"
	  "      <provider>-base-url and <provider>-api-key-env options)" },
	{ "embedding-model", OPT_STR, OFF(embedding.model), "",
	  "embedding model of embedding-provider (empty: the provider's\n"
	  "      default: text-embedding-3-small, gemini-embedding-001,\n"
	  "      mistral-embed)" },
	{ "embedding-workers", OPT_INT, OFF(embedding.workers), "1",
	  "threads computing message embeddings off the request path" },
	{ "embedding-queue", OPT_SIZE, OFF(embedding.queue_max), "10000",
	  "embedding jobs waiting (more are dropped, counted, and\n"
	  "      backfilled by the next semantic search)" },
	{ "embedding-batch", OPT_U32, OFF(embedding.batch), "32",
	  "messages per embedding call (1..96)" },
	{ "embedding-retries", OPT_U32, OFF(embedding.retries), "5",
	  "retries of a failed embedding job (backoff doubling from\n"
	  "      embedding-retry-base, at most 60 s)" },
	{ "embedding-retry-base", OPT_SECONDS, OFF(embedding.retry_base_us), "1",
	  "seconds before the first retry of a failed embedding job" },
	{ "embedding-max-text-bytes", OPT_U32, OFF(embedding.max_text_bytes),
	  "8192", "text of one message embedded (longer text is cut)" },
	{ "embedding-timeout-ms", OPT_U32, OFF(embedding.timeout_ms), "30000",
	  "one embedding call, retries included" },
};

#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

static void
env_name(const struct opt *o, char *buf, size_t cap)
{
	size_t n = (size_t)snprintf(buf, cap, "HISTD_");

	for (const char *p = o->name; *p && n + 1 < cap; p++)
		buf[n++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
	buf[n] = '\0';
}

static void
yaml_key(const struct opt *o, char *buf, size_t cap)
{
	size_t n = 0;

	for (const char *p = o->name; *p && n + 1 < cap; p++)
		buf[n++] = *p == '-' ? '_' : *p;
	buf[n] = '\0';
}

static int
parse_uint(const char *s, int suffixes, unsigned long long max,
	   unsigned long long *out)
{
	char *end;
	unsigned long long v;

	if (!*s || *s == '-' || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	if (suffixes && *end) {
		unsigned long long mul = 1;

		switch (*end) {
		case 'k': case 'K': mul = 1024ULL; break;
		case 'm': case 'M': mul = 1024ULL * 1024; break;
		case 'g': case 'G': mul = 1024ULL * 1024 * 1024; break;
		default: return -1;
		}
		end++;
		if (*end == 'i' && end[1] == 'B')
			end += 2;
		else if (*end == 'B')
			end++;
		if (v > max / mul)
			return -1;
		v *= mul;
	}
	if (*end || v > max)
		return -1;
	*out = v;
	return 0;
}

/* Sets one option from text; -1 after printing why not. */
static int
set_opt(histd_config *cfg, const struct opt *o, const char *val,
	const char *from)
{
	char *base = (char *)cfg + o->offset;
	unsigned long long v = 0;
	int ok = 0;

	switch (o->type) {
	case OPT_STR: {
		char *copy = strdup(val);

		if (!copy)
			return -1;
		free(*(char **)base);
		*(char **)base = copy;
		return 0;
	}
	case OPT_INT:
		ok = parse_uint(val, 0, INT_MAX, &v) == 0;
		if (ok)
			*(int *)base = (int)v;
		break;
	case OPT_U32:
		ok = parse_uint(val, 1, UINT32_MAX, &v) == 0;
		if (ok)
			*(uint32_t *)base = (uint32_t)v;
		break;
	case OPT_SIZE:
		ok = parse_uint(val, 1, SIZE_MAX, &v) == 0;
		if (ok)
			*(size_t *)base = (size_t)v;
		break;
	case OPT_SECONDS:
		/* At most 100 years: a time added to now never overflows. */
		ok = parse_uint(val, 0, SECONDS_MAX, &v) == 0;
		if (ok)
			*(int64_t *)base = (int64_t)v * 1000000;
		break;
	case OPT_BOOL:
		if (strcmp(val, "true") == 0 || strcmp(val, "1") == 0 ||
		    strcmp(val, "yes") == 0) {
			*(int *)base = 1;
			return 0;
		}
		if (strcmp(val, "false") == 0 || strcmp(val, "0") == 0 ||
		    strcmp(val, "no") == 0) {
			*(int *)base = 0;
			return 0;
		}
		fprintf(stderr, "histd: %s: %s needs true or false\n", from,
			o->name);
		return -1;
	}
	if (!ok) {
		fprintf(stderr, "histd: %s: %s needs a non-negative number%s\n",
			from, o->name,
			o->type == OPT_U32 || o->type == OPT_SIZE ?
				" (K, M, G suffixes allowed)" :
			o->type == OPT_SECONDS ?
				" of seconds, at most " SECONDS_MAX_TEXT
				" (100 years)" : "");
		return -1;
	}
	return 0;
}

static const char *const fsync_modes[] = { "always", "batch", "never", NULL };

/* v is one of the NULL-ended set. */
static int
one_of(const char *v, const char *const *set)
{
	for (; *set; set++)
		if (strcmp(v, *set) == 0)
			return 1;
	return 0;
}

/* host:port ends in a port from 0 to 65535. */
static int
port_valid(const char *hostport)
{
	const char *colon = strrchr(hostport, ':');
	unsigned long port = 0;
	size_t digits = 0;

	if (!colon)
		return 0;
	for (const char *p = colon + 1; *p; p++, digits++) {
		if (*p < '0' || *p > '9' || digits >= 5)
			return 0;
		port = port * 10 + (unsigned long)(*p - '0');
	}
	return digits > 0 && port <= 65535;
}

/* gRPC takes a port above 65535 modulo 65536 and binds another one:
 * anything but a unix socket must end in :0..65535. */
static int
listen_port_valid(const char *listen)
{
	if (!strncmp(listen, "unix:", 5) || !strncmp(listen, "unix-abstract:", 14))
		return 1;
	return port_valid(listen);
}

/* Options where 0 would not mean "none" but quietly break the server:
 * -1 after naming the first one found. */
static int
refuse_zero(const histd_config *cfg)
{
	const struct {
		const char *name;
		unsigned long long v;
	} least_one[] = {
		{ "subscriber-queue", cfg->hub.queue_max },
		{ "summarizer-max-concurrent",
		  cfg->summarizer_http.max_concurrent },
		/* libcurl takes 0 for no limit: a stuck provider would hold
		 * its slot for good. */
		{ "summarizer-request-timeout-ms",
		  cfg->summarizer_http.timeout_ms },
		{ "max-messages-per-append",
		  cfg->service.max_messages_per_append },
		{ "max-page-size", cfg->service.max_page_size },
		/* 0 fails every request, or makes every call wait. */
		{ "max-message-bytes", cfg->max_receive_bytes },
		{ "max-concurrent-streams", cfg->max_concurrent_streams },
		/* The service refuses these too, but too late to say which. */
		{ "max-stored-message-bytes", cfg->service.max_message_bytes },
		{ "idempotency-ttl",
		  (unsigned long long)cfg->service.idempotency_ttl_us },
		/* The context would take 0 for its 60 s default. */
		{ "ttl-sweep-interval",
		  (unsigned long long)cfg->context.sweep_interval_us },
	};

	for (size_t i = 0; i < sizeof(least_one) / sizeof(least_one[0]); i++)
		if (least_one[i].v == 0) {
			fprintf(stderr, "histd: %s must be at least 1\n",
				least_one[i].name);
			return -1;
		}
	return 0;
}

static const struct opt *
find_flag(const char *name, size_t len)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (strlen(opts[i].name) == len &&
		    strncmp(opts[i].name, name, len) == 0)
			return &opts[i];
	return NULL;
}

static const struct opt *
find_yaml_key(const char *key)
{
	char buf[64];

	for (size_t i = 0; i < N_OPTS; i++) {
		yaml_key(&opts[i], buf, sizeof(buf));
		if (strcmp(buf, key) == 0)
			return &opts[i];
	}
	return NULL;
}

/* A flat mapping of option keys to scalars, in one document. A key given
 * twice, or a second document, is refused rather than let the last win
 * unseen. */
static int
load_yaml(histd_config *cfg, const char *path)
{
	FILE *f = fopen(path, "r");
	yaml_parser_t parser;
	yaml_event_t ev;
	char *key = NULL;
	unsigned char seen[N_OPTS] = { 0 };
	int depth = 0, rc = 0, done = 0, docs = 0;

	if (!f) {
		fprintf(stderr, "histd: config file %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	yaml_parser_initialize(&parser);
	yaml_parser_set_input_file(&parser, f);
	while (!done && rc == 0) {
		if (!yaml_parser_parse(&parser, &ev)) {
			fprintf(stderr, "histd: config file %s: line %zu: %s\n",
				path, parser.problem_mark.line + 1,
				parser.problem ? parser.problem : "parse error");
			rc = -1;
			break;
		}
		switch (ev.type) {
		case YAML_DOCUMENT_START_EVENT:
			if (++docs > 1) {
				fprintf(stderr, "histd: config file %s holds "
					"more than one YAML document\n", path);
				rc = -1;
			}
			break;
		case YAML_MAPPING_START_EVENT:
		case YAML_SEQUENCE_START_EVENT:
			depth++;
			if (depth == 1 && ev.type != YAML_MAPPING_START_EVENT) {
				fprintf(stderr, "histd: config file %s: line %zu:"
					" must be a mapping of option keys to "
					"values\n", path, ev.start_mark.line + 1);
				rc = -1;
			} else if (depth > 1) {
				fprintf(stderr, "histd: config file %s: line %zu:"
					" values must be scalars\n", path,
					ev.start_mark.line + 1);
				rc = -1;
			}
			break;
		case YAML_MAPPING_END_EVENT:
		case YAML_SEQUENCE_END_EVENT:
			depth--;
			break;
		case YAML_SCALAR_EVENT: {
			const char *s = (const char *)ev.data.scalar.value;

			/* An empty document ("---" alone, comments, "~")
			 * sets nothing. */
			if (depth == 0 &&
			    ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
			    (!*s || !strcmp(s, "~") || !strcmp(s, "null")))
				break;
			if (depth == 0) {
				fprintf(stderr, "histd: config file %s: line %zu:"
					" must be a mapping of option keys to "
					"values\n", path, ev.start_mark.line + 1);
				rc = -1;
				break;
			}
			if (depth != 1)
				break;
			if (!key) {
				key = strdup(s);
				if (!key)
					rc = -1;
			} else {
				const struct opt *o = find_yaml_key(key);
				char from[512];

				snprintf(from, sizeof(from), "config file %s",
					 path);
				if (!o) {
					fprintf(stderr, "histd: %s: unknown key"
						" '%s'\n", from, key);
					rc = -1;
				} else if (seen[o - opts]++) {
					fprintf(stderr, "histd: %s: key '%s' "
						"appears twice\n", from, key);
					rc = -1;
				} else if (set_opt(cfg, o, s, from) != 0) {
					rc = -1;
				}
				free(key);
				key = NULL;
			}
			break;
		}
		case YAML_ALIAS_EVENT:
			fprintf(stderr, "histd: config file %s: line %zu: "
				"aliases (*name) are not supported; write the "
				"value\n", path, ev.start_mark.line + 1);
			rc = -1;
			break;
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	free(key);
	yaml_parser_delete(&parser);
	fclose(f);
	return rc;
}

/* Not options, but read by other programs of histd (histctl). */
static const char *const other_env[] = {
	"HISTD_CONFIG", "HISTD_TARGET", "HISTD_TOKEN", NULL
};

/* Whether the variable (n bytes of name) is one Kubernetes makes for a
 * Service named histd: HISTD_SERVICE_HOST, HISTD_SERVICE_PORT[_<name>],
 * HISTD_PORT, HISTD_PORT_<port>_<proto>[_...]. */
static int
is_service_link(const char *name, size_t n)
{
	return (n == 18 && !strncmp(name, "HISTD_SERVICE_HOST", 18)) ||
	       (n >= 18 && !strncmp(name, "HISTD_SERVICE_PORT", 18)) ||
	       (n == 10 && !strncmp(name, "HISTD_PORT", 10)) ||
	       (n > 11 && !strncmp(name, "HISTD_PORT_", 11) &&
		name[11] >= '0' && name[11] <= '9');
}

/* The HISTD_* variables of the environment that name no option. */
static char *
find_unknown_env(void)
{
	extern char **environ;
	char *list = NULL, env[64];
	size_t len = 0;

	for (char **e = environ; e && *e; e++) {
		size_t n = strcspn(*e, "=");
		int known = 0;
		char *more;

		if (strncmp(*e, "HISTD_", 6) != 0)
			continue;
		for (size_t i = 0; i < N_OPTS && !known; i++) {
			env_name(&opts[i], env, sizeof(env));
			known = strlen(env) == n && !strncmp(*e, env, n);
		}
		for (size_t i = 0; other_env[i] && !known; i++)
			known = strlen(other_env[i]) == n &&
				!strncmp(*e, other_env[i], n);
		if (known || is_service_link(*e, n))
			continue;
		if (!(more = realloc(list, len + n + 2)))
			break;
		list = more;
		if (len)
			list[len++] = ',';
		memcpy(list + len, *e, n);
		len += n;
		list[len] = '\0';
	}
	return list ? list : strdup("");
}

void
histd_config_usage(FILE *out)
{
	char env[64];

	fprintf(out,
		"usage: histd [options]\n"
		"\n"
		"histd serves conversation history for LLM agents over gRPC.\n"
		"Each option is a flag, an environment variable, or a key of\n"
		"the YAML file named by --config (HISTD_CONFIG); flags win over\n"
		"the environment, the environment over the file.\n"
		"\n"
		"  --config FILE  (HISTD_CONFIG)\n"
		"      YAML file of options: one flat mapping, each key once\n"
		"      (keys as below, '-' written '_')\n");
	for (size_t i = 0; i < N_OPTS; i++) {
		env_name(&opts[i], env, sizeof(env));
		fprintf(out, "  --%s  (%s)  default: %s\n      %s\n",
			opts[i].name, env, *opts[i].def ? opts[i].def : "none",
			opts[i].help);
	}
	fprintf(out, "  --help, --version\n");
}

int
histd_config_load(histd_config *cfg, int argc, char **argv)
{
	const char *file = getenv("HISTD_CONFIG");
	char env[64];

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < N_OPTS; i++)
		if (set_opt(cfg, &opts[i], opts[i].def, "default") != 0)
			return -1;

	/* --help, --version and --config first: the file is read before
	 * the environment and the other flags apply over it. */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			histd_config_usage(stdout);
			return 1;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("histd 0.1.0\n");
			return 1;
		}
		if (strcmp(argv[i], "--config") == 0 && i + 1 == argc) {
			/* Not the file of the environment, nor none. */
			fprintf(stderr, "histd: --config needs a value\n");
			return -1;
		}
		if (strcmp(argv[i], "--config") == 0)
			file = argv[++i];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			file = argv[i] + 9;
	}
	if (file && *file) {
		cfg->config_file = strdup(file);
		if (load_yaml(cfg, file) != 0)
			return -1;
	}

	for (size_t i = 0; i < N_OPTS; i++) {
		const char *v;

		env_name(&opts[i], env, sizeof(env));
		v = getenv(env);
		if (v && set_opt(cfg, &opts[i], v, env) != 0)
			return -1;
	}
	cfg->unknown_env = find_unknown_env();

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *name, *eq, *val;
		const struct opt *o;
		size_t len;

		if (strncmp(a, "--", 2) != 0) {
			fprintf(stderr, "histd: unexpected argument '%s' "
				"(see --help)\n", a);
			return -1;
		}
		name = a + 2;
		eq = strchr(name, '=');
		len = eq ? (size_t)(eq - name) : strlen(name);
		if (len == 6 && strncmp(name, "config", 6) == 0) {
			if (!eq)
				i++;
			continue;
		}
		o = find_flag(name, len);
		if (!o) {
			fprintf(stderr, "histd: unknown option '--%.*s' "
				"(see --help)\n", (int)len, name);
			return -1;
		}
		if (eq) {
			val = eq + 1;
		} else if (o->type == OPT_BOOL) {
			val = "true";   /* a bare boolean flag */
		} else if (i + 1 < argc) {
			val = argv[++i];
		} else {
			fprintf(stderr, "histd: --%s needs a value\n", o->name);
			return -1;
		}
		if (set_opt(cfg, o, val, "flag") != 0)
			return -1;
	}

	if (cfg->threads == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		/* Calls are answered inline on queue threads. The memory driver
		 * never blocks, so a few threads per core suffice; the file and
		 * postgres drivers block on fsync or on the database, and group
		 * commit needs many callers waiting at once. */
		cfg->threads = n > 0 ? (int)(2 * n) : 2;
		if (strcmp(cfg->driver, "memory") != 0 && cfg->threads < 32)
			cfg->threads = 32;
	}
	if (cfg->posted_calls < 1)
		cfg->posted_calls = 1;
	if (!one_of(cfg->driver, histd_driver_names())) {
		fprintf(stderr, "histd: driver must be memory, file or postgres "
			"(got '%s')\n", cfg->driver);
		return -1;
	}
	if (!one_of(cfg->fsync, fsync_modes)) {
		fprintf(stderr, "histd: fsync must be always, batch or never "
			"(got '%s')\n", cfg->fsync);
		return -1;
	}
	if (!listen_port_valid(cfg->listen)) {
		fprintf(stderr, "histd: listen '%s' needs a port from 0 to "
			"65535 (host:port, [v6]:port or unix:path)\n",
			cfg->listen);
		return -1;
	}
	/* The metrics endpoint would take a port it was not given. */
	if (*cfg->metrics_listen && !port_valid(cfg->metrics_listen)) {
		fprintf(stderr, "histd: metrics-listen '%s' needs a port from 0 "
			"to 65535 (host:port or [v6]:port)\n",
			cfg->metrics_listen);
		return -1;
	}
	if (!*cfg->api_keys_file && !cfg->auth_disabled) {
		fprintf(stderr, "histd: no API keys: give --api-keys-file, or "
			"--auth-disabled to serve without authentication\n");
		return -1;
	}
	/* Each is a thread, or a call context per method, made at start. */
	if (cfg->threads > 1024 || cfg->posted_calls > 1024) {
		fprintf(stderr, "histd: threads is %d and posted-calls %d; each "
			"at most 1024\n", cfg->threads, cfg->posted_calls);
		return -1;
	}
	if (cfg->service.provider_call_threads > 1024) {
		fprintf(stderr, "histd: provider-call-threads is %" PRIu32
			"; at most 1024\n", cfg->service.provider_call_threads);
		return -1;
	}
	if (*cfg->api_keys_file && cfg->auth_disabled) {
		fprintf(stderr, "histd: --api-keys-file and --auth-disabled "
			"contradict each other\n");
		return -1;
	}
	if (!*cfg->tls_cert != !*cfg->tls_key) {
		fprintf(stderr, "histd: tls-cert and tls-key go together\n");
		return -1;
	}
	if (*cfg->tls_client_ca && !*cfg->tls_cert) {
		fprintf(stderr, "histd: tls-client-ca needs tls-cert and "
			"tls-key\n");
		return -1;
	}
	if (refuse_zero(cfg) != 0)
		return -1;
	if (cfg->embedding.workers < 1 || cfg->embedding.queue_max == 0 ||
	    cfg->embedding.batch == 0 || cfg->embedding.batch > 96 ||
	    cfg->embedding.max_text_bytes < 16) {
		fprintf(stderr, "histd: embedding-workers and embedding-queue "
			"must be at least 1, embedding-batch 1..96, "
			"embedding-max-text-bytes at least 16\n");
		return -1;
	}
	return 0;
}

void
histd_config_free(histd_config *cfg)
{
	for (size_t i = 0; i < N_OPTS; i++)
		if (opts[i].type == OPT_STR) {
			char **p = (char **)((char *)cfg + opts[i].offset);

			free(*p);
			*p = NULL;
		}
	free(cfg->config_file);
	cfg->config_file = NULL;
	free(cfg->unknown_env);
	cfg->unknown_env = NULL;
}
