/*
 * The HTTP layer of the provider clients, on libcurl.
 *
 * One histd_http is shared by every provider call of a process. It keeps a
 * pool of curl easy handles (each keeps its connections alive, so calls to
 * the same host reuse them), caps how many calls run at once, and retries:
 * on connection failures, timeouts and HTTP 408, 409, 429, 500, 502, 503,
 * 504 and 529, at most max_retries times, waiting an exponential backoff
 * with full jitter, or what Retry-After says (429 and 503) if longer, never
 * past the call's deadline. libcurl's errors and HTTP statuses are
 * translated here, once, into HISTD_E* codes:
 *
 *   EUNAVAILABLE  no connection, timeout, 5xx, an answer too large
 *   ELIMIT        429 after the last retry
 *   EPRECONDITION 401 / 403 (the provider refused histd's key) and any
 *                 other 4xx (the provider refused histd's request):
 *                 the server's configuration or request failed, not
 *                 the credentials or input of histd's caller, so never
 *                 EUNAUTH or EINVALID
 *
 * Messages name the status and what failed, never the URL (it may hold
 * credentials), a header or a body.
 *
 * Secrets: request headers are never logged or copied into messages; curl's
 * verbose output stays off.
 *
 * Threads: histd_http_post may be called from any number of threads; it
 * blocks the caller for the whole call, retries included.
 */
#ifndef HISTD_HTTP_H
#define HISTD_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "histd_error.h"

typedef struct histd_http_config {
	uint32_t connect_timeout_ms;   /* one connection attempt; 5000 */
	uint32_t timeout_ms;           /* one attempt, whole; 60000 */
	uint32_t max_retries;          /* retries after the first try; 3 */
	uint32_t backoff_base_ms;      /* first backoff; 500 */
	uint32_t backoff_max_ms;       /* cap of one wait; 30000 */
	uint32_t max_concurrent;       /* calls at once, process-wide; 8 */
	size_t max_response_bytes;     /* larger answers fail; 16 MiB */
} histd_http_config;

/* Fills the defaults above. */
void histd_http_config_default(histd_http_config *cfg);

typedef struct histd_http histd_http;

/* 0 with *out (freed with histd_http_free), EINVALID for a bad config
 * (max_concurrent 0), or ENOMEM / EINTERNAL. */
int histd_http_new(histd_http **out, const histd_http_config *cfg);
/* Frees the pool; no call may be running. */
void histd_http_free(histd_http *h);

typedef struct histd_http_response {
	long status;        /* the final HTTP status */
	char *body;         /* malloc'ed, NUL-terminated; the caller frees */
	size_t len;
	uint32_t attempts;  /* tries made (1 + retries) */
} histd_http_response;

void histd_http_response_clear(histd_http_response *r);

/*
 * POSTs body (len bytes, JSON) to url with the given headers ("Name: value"
 * strings, borrowed; may hold secrets). deadline_ms: the whole call, the
 * wait for one of the max_concurrent slots, retries and backoff waits
 * included (0: no deadline beyond the per-attempt timeouts and
 * max_retries). A call still waiting for a slot at its deadline fails
 * EUNAVAILABLE without reaching the provider.
 *
 * Returns 0 with *out filled when the provider answered 2xx; otherwise a
 * negative code as above, with out->status set to the last status (0 if
 * none) and out->body to the last body (NULL if none), for the caller to
 * read the provider's error (never to log it whole).
 */
int histd_http_post(histd_http *h, const char *url,
		    const char *const *headers, size_t n_headers,
		    const char *body, size_t len, uint32_t deadline_ms,
		    histd_http_response *out);

/* The longest provider error text histd_http_error_name quotes. */
#define HISTD_HTTP_WHY_MAX 200

/*
 * After histd_http_post failed with rc (r: its response): sets this
 * thread's message again so that it names the provider ("anthropic"):
 *
 *   401 / 403   "anthropic refused histd's API key (HTTP 401): check the
 *               key in ANTHROPIC_API_KEY" (key_env may be NULL; the
 *               provider's answer is not quoted, as it may echo the key)
 *   other 4xx   "anthropic refused histd's request (HTTP 400): <the
 *               provider's error message>" (from a JSON error body, one
 *               line, at most HISTD_HTTP_WHY_MAX bytes)
 *   otherwise   "anthropic: <the message as it was>"
 *
 * Returns rc (0 and ENOMEM untouched).
 */
int histd_http_error_name(int rc, const char *provider, const char *key_env,
			  const histd_http_response *r);

/*
 * Shutdown: every call in flight ends within about a second (libcurl
 * checks between reads) with EUNAVAILABLE "histd is shutting down",
 * retry waits end, and later calls fail at once the same way. Any thread;
 * the pool stays valid until histd_http_free.
 */
void histd_http_stop(histd_http *h);

/* Counters, for tests and metrics. */
typedef struct histd_http_stats {
	uint64_t calls;
	uint64_t attempts;
	uint64_t retries;
	uint32_t in_flight;
	uint32_t max_in_flight;   /* the highest in_flight seen */
} histd_http_stats;

void histd_http_get_stats(histd_http *h, histd_http_stats *out);

#endif
