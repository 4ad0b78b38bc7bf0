/*
 * The embedding worker: computes the embeddings of stored messages off the
 * request path and stores them with the driver, into the life of the
 * session it read them from (histd_driver_embedding_put_life), and embeds
 * Search queries (it is the process's histd_search_embedder).
 *
 * Flow: the driver's change hook (histd_embedder_notify, beside the hub's)
 * queues (tenant, session, seq range) for every append and replace; it
 * never blocks and never calls the driver. Worker threads take jobs, read
 * the session's config (SessionConfig.embeddings, else the server's
 * default; none: the job is dropped), read the messages, embed their text
 * (the text lexical search reads, without tool results: the text blocks,
 * reasoning, tool call names and arguments) in batches through the
 * provider's embedding client (clients/embeddings.h), and store the
 * vectors. Consecutive appends to one session merge into one job.
 *
 * Bounds: the queue holds at most queue_max jobs; a job that does not fit
 * is dropped and counted (histd_embedding_jobs_dropped_total) and logged
 * at most once a minute. Dropped work is not lost for good: each session
 * remembers (in memory) up to which seq its messages are embedded, and a
 * semantic Search over a session behind that mark queues the rest
 * (backfill). Provider failures that may pass (unavailable, rate limited)
 * are retried with exponential backoff and jitter, up to `retries` times;
 * others drop the job with a log line naming the provider and the error.
 *
 * Threads: every function may be called from any thread; notify and the
 * search callbacks run concurrently with the workers.
 */
#ifndef HISTD_EMBEDDER_H
#define HISTD_EMBEDDER_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "embeddings.h"
#include "http.h"
#include "search.h"

typedef struct histd_embedder_config {
	char *provider;          /* default for sessions naming none; "" none */
	char *model;             /* "" : the provider's default model */
	int workers;             /* threads; >= 1 */
	size_t queue_max;        /* jobs waiting; >= 1 */
	uint32_t batch;          /* texts per provider call, 1..96 */
	uint32_t retries;        /* of a failed call, after the HTTP layer's */
	int64_t retry_base_us;   /* first backoff, doubling, at most 60 s */
	uint32_t max_text_bytes; /* longer texts are cut (on a UTF-8 edge) */
	uint32_t timeout_ms;     /* one provider call, HTTP retries included */
} histd_embedder_config;

/* Where one provider's embedding endpoint is (the summarizer's options:
 * --openai-base-url, --openai-api-key-env, ...). */
typedef struct histd_embedder_provider {
	const char *name;        /* "openai", "gemini", "mistral" */
	const char *base_url;    /* "" : public endpoint */
	const char *api_key_env;
} histd_embedder_provider;

typedef struct histd_embedder histd_embedder;

/*
 * Opens a client for every provider whose API key is set (the others stay
 * unconfigured: their sessions are not embedded and searched lexically)
 * and starts the workers. The driver and http are borrowed and must
 * outlive the embedder. EINVALID if the default provider is unknown or
 * has no API key (the message names the variable), or a bound is 0;
 * ENOMEM; EUNAVAILABLE if a thread cannot start.
 */
int histd_embedder_new(histd_embedder **out, histd_driver *d,
		       const histd_embedder_config *cfg, histd_http *http,
		       const histd_embedder_provider *providers, size_t n);

/* The change hook's second half (histd_change_fn): queues work. e may be
 * NULL (nothing). Cheap, never blocks on the driver or the network. */
void histd_embedder_notify(void *e, const histd_change *c);

/* The process's embedder for Search (histd_search_set_embedder); valid
 * until histd_embedder_free. */
const histd_search_embedder *histd_embedder_search(histd_embedder *e);

/* Stops the workers (jobs in progress finish their provider call; queued
 * jobs are dropped). notify does nothing afterwards. Before the driver
 * closes. */
void histd_embedder_stop(histd_embedder *e);
/* Stops (if not yet) and frees; after the driver's last notify. */
void histd_embedder_free(histd_embedder *e);

typedef struct histd_embedder_stats {
	uint64_t queued;          /* jobs accepted (merges not counted) */
	uint64_t dropped;         /* jobs refused: the queue was full */
	uint64_t embedded;        /* vectors stored */
	uint64_t failed;          /* jobs given up after errors */
	uint64_t retried;         /* provider calls retried by the worker */
	size_t waiting;           /* jobs in the queue now */
} histd_embedder_stats;

void histd_embedder_get_stats(histd_embedder *e, histd_embedder_stats *out);

#endif
