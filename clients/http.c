/*
 * libcurl under the provider clients: a pool of easy handles (connection
 * reuse), a cap on concurrent calls, timeouts, and retries with backoff and
 * jitter that honour Retry-After. See http.h for the contract.
 */
#include "http.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

struct histd_http {
	histd_http_config cfg;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint32_t in_flight;
	/* Idle easy handles; each keeps its own connection cache. */
	CURL **idle;
	size_t n_idle;
	histd_http_stats stats;
	/* histd_http_stop: calls end, waits end, nothing new starts. */
	atomic_int stopped;
	pthread_cond_t stop_cv;        /* backoff waits (wait_ms) */
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void
global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void
histd_http_config_default(histd_http_config *c)
{
	c->connect_timeout_ms = 5000;
	c->timeout_ms = 60000;
	c->max_retries = 3;
	c->backoff_base_ms = 500;
	c->backoff_max_ms = 30000;
	c->max_concurrent = 8;
	c->max_response_bytes = 16u << 20;
}

int
histd_http_new(histd_http **out, const histd_http_config *cfg)
{
	histd_http *h;

	if (!cfg->max_concurrent)
		return histd_error_set(HISTD_EINVALID,
				       "max_concurrent must be at least 1");
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return histd_error_set(HISTD_EINTERNAL, "libcurl did not "
				       "initialize: %s",
				       curl_easy_strerror(global_rc));
	if (!(h = calloc(1, sizeof(*h))) ||
	    !(h->idle = calloc(cfg->max_concurrent, sizeof(*h->idle)))) {
		free(h);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	h->cfg = *cfg;
	pthread_mutex_init(&h->mu, NULL);
	{
		/* Both on the monotonic clock: slot and backoff waits end
		 * at the call's deadline. Two variables: a slot's one
		 * wake-up must reach a caller in acquire, never a backoff
		 * wait. */
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&h->cv, &ca);
		pthread_cond_init(&h->stop_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	*out = h;
	return 0;
}

void
histd_http_stop(histd_http *h)
{
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	atomic_store(&h->stopped, 1);
	pthread_cond_broadcast(&h->cv);
	pthread_cond_broadcast(&h->stop_cv);
	pthread_mutex_unlock(&h->mu);
}

void
histd_http_free(histd_http *h)
{
	if (!h)
		return;
	for (size_t i = 0; i < h->n_idle; i++)
		curl_easy_cleanup(h->idle[i]);
	free(h->idle);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	pthread_cond_destroy(&h->stop_cv);
	free(h);
}

void
histd_http_response_clear(histd_http_response *r)
{
	free(r->body);
	memset(r, 0, sizeof(*r));
}

void
histd_http_get_stats(histd_http *h, histd_http_stats *out)
{
	pthread_mutex_lock(&h->mu);
	*out = h->stats;
	pthread_mutex_unlock(&h->mu);
}

/* ---------------------------------------------------------------------- */
/* The pool                                                               */

static int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A CLOCK_MONOTONIC time ms milliseconds after its epoch, for the timed
 * waits. */
static struct timespec
at_ms(int64_t ms)
{
	struct timespec ts;

	ts.tv_sec = (time_t)(ms / 1000);
	ts.tv_nsec = (long)(ms % 1000) * 1000000;
	return ts;
}

/*
 * Waits for a free slot until deadline (now_ms time; INT64_MAX: none).
 * Returns a handle (pooled or new), or NULL: stopped, deadline passed
 * (*late set) or no handle could be made.
 */
static CURL *
acquire(histd_http *h, int64_t deadline, int *late)
{
	struct timespec until = at_ms(deadline);
	CURL *c;

	*late = 0;
	pthread_mutex_lock(&h->mu);
	while (h->in_flight >= h->cfg.max_concurrent &&
	       !atomic_load(&h->stopped)) {
		if (deadline == INT64_MAX) {
			pthread_cond_wait(&h->cv, &h->mu);
		} else if (pthread_cond_timedwait(&h->cv, &h->mu, &until) ==
			   ETIMEDOUT &&
			   h->in_flight >= h->cfg.max_concurrent) {
			*late = 1;
			break;
		}
	}
	if (*late || atomic_load(&h->stopped)) {
		pthread_mutex_unlock(&h->mu);
		return NULL;
	}
	h->in_flight++;
	if (h->in_flight > h->stats.max_in_flight)
		h->stats.max_in_flight = h->in_flight;
	h->stats.in_flight = h->in_flight;
	c = h->n_idle ? h->idle[--h->n_idle] : NULL;
	pthread_mutex_unlock(&h->mu);
	if (!c && !(c = curl_easy_init())) {
		pthread_mutex_lock(&h->mu);
		h->in_flight--;
		h->stats.in_flight = h->in_flight;
		pthread_cond_signal(&h->cv);
		pthread_mutex_unlock(&h->mu);
	}
	return c;
}

static void
release(histd_http *h, CURL *c)
{
	pthread_mutex_lock(&h->mu);
	/* At most max_concurrent handles exist, so the array has room. */
	if (c)
		h->idle[h->n_idle++] = c;
	h->in_flight--;
	h->stats.in_flight = h->in_flight;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* ---------------------------------------------------------------------- */
/* One attempt                                                            */

typedef struct sink {
	char *p;
	size_t n, cap, max;
	int too_big;
} sink;

static size_t
on_data(char *ptr, size_t size, size_t nmemb, void *ud)
{
	sink *s = ud;
	size_t len = size * nmemb;

	if (s->n + len > s->max) {
		s->too_big = 1;
		return 0;   /* curl aborts with CURLE_WRITE_ERROR */
	}
	if (s->n + len + 1 > s->cap) {
		size_t cap = s->cap ? s->cap : 4096;
		char *p;

		while (cap < s->n + len + 1)
			cap *= 2;
		if (!(p = realloc(s->p, cap)))
			return 0;
		s->p = p;
		s->cap = cap;
	}
	memcpy(s->p + s->n, ptr, len);
	s->n += len;
	s->p[s->n] = '\0';
	return len;
}

/* Waits ms, or less if histd_http_stop comes first. */
static void
wait_ms(histd_http *h, int64_t ms)
{
	struct timespec until = at_ms(now_ms() + ms);

	pthread_mutex_lock(&h->mu);
	while (!atomic_load(&h->stopped) &&
	       pthread_cond_timedwait(&h->stop_cv, &h->mu, &until) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&h->mu);
}

/* libcurl's progress callback, about once a second even when nothing
 * moves: nonzero ends the transfer (CURLE_ABORTED_BY_CALLBACK). */
static int
on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
	    curl_off_t ulnow)
{
	histd_http *h = ud;

	(void)dltotal;
	(void)dlnow;
	(void)ultotal;
	(void)ulnow;
	return atomic_load_explicit(&h->stopped, memory_order_relaxed);
}

static int
stopping(void)
{
	return histd_error_set(HISTD_EUNAVAILABLE, "histd is shutting down; "
			       "the provider call was abandoned");
}

/* What may pass: timeouts, conflicts, rate limits, and every server
 * error but those that say the request itself cannot be served (501 Not
 * Implemented, 505 HTTP Version Not Supported). Proxies and providers
 * use many more than 500-504: Cloudflare's 520-524, Anthropic's 529. */
static int
retryable_status(long st)
{
	return st == 408 || st == 409 || st == 429 ||
	       (st >= 500 && st <= 599 && st != 501 && st != 505);
}

static int
retryable_curl(CURLcode rc)
{
	switch (rc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return 1;
	default:
		return 0;
	}
}

/* Retry-After in milliseconds (seconds or an HTTP date); -1 if none. */
static int64_t
retry_after_ms(CURL *c)
{
	curl_off_t secs = -1;

	/* libcurl parses both forms (7.66+): seconds from now. */
	if (curl_easy_getinfo(c, CURLINFO_RETRY_AFTER, &secs) != CURLE_OK ||
	    secs < 0)
		return -1;
	if (secs > 24 * 3600)
		secs = 24 * 3600;
	return (int64_t)secs * 1000;
}

static uint64_t
rand64(void)
{
	uint64_t r = 0;

	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
		r = (uint64_t)now_ms() * 6364136223846793005ull;
	return r;
}

/* Jitter: uniform in [d / 2, d], d = base*2^n capped, so that retries
 * spread out but never come sooner than half the backoff. */
static int64_t
backoff_ms(const histd_http_config *cfg, uint32_t n)
{
	uint64_t d = cfg->backoff_base_ms;

	for (uint32_t i = 0; i < n && d < cfg->backoff_max_ms; i++)
		d *= 2;
	if (d > cfg->backoff_max_ms)
		d = cfg->backoff_max_ms;
	if (d < 2)
		return (int64_t)d;
	return (int64_t)(d / 2 + rand64() % (d / 2 + 1));
}

static int
error_for(long status, CURLcode crc, int too_big, size_t max)
{
	if (too_big)
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answer "
				       "exceeds %zu bytes", max);
	if (crc != CURLE_OK)
		return histd_error_set(HISTD_EUNAVAILABLE, "provider "
				       "unreachable: %s",
				       curl_easy_strerror(crc));
	if (status == 429)
		return histd_error_set(HISTD_ELIMIT, "provider answered 429 "
				       "(rate limited)");
	/* histd's own key or request refused: the server's failure, not
	 * the caller's credentials or input (no UNAUTHENTICATED, no
	 * INVALID_ARGUMENT), and not retried. */
	if (status == 401 || status == 403)
		return histd_error_set(HISTD_EPRECONDITION, "provider refused "
				       "histd's API key (HTTP %ld)", status);
	if (status >= 500 || retryable_status(status))
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answered "
				       "%ld", status);
	return histd_error_set(HISTD_EPRECONDITION, "provider refused "
			       "histd's request (HTTP %ld)", status);
}

/* The provider's own error text in a JSON error body, as one line of at
 * most cap - 1 bytes ("" if none): error.message (Anthropic, OpenAI,
 * Gemini), error or message as a string, detail as a string or its first
 * msg (Mistral). Other members may echo the request: never read. */
static void
provider_why(const char *body, size_t len, char *out, size_t cap)
{
	json_t *root = body ? json_loadb(body, len, 0, NULL) : NULL;
	json_t *e = json_object_get(root, "error");
	json_t *d = json_object_get(root, "detail");
	const char *t = NULL;
	size_t n = 0;

	if (json_is_string(json_object_get(e, "message")))
		t = json_string_value(json_object_get(e, "message"));
	else if (json_is_string(e))
		t = json_string_value(e);
	else if (json_is_string(json_object_get(root, "message")))
		t = json_string_value(json_object_get(root, "message"));
	else if (json_is_string(d))
		t = json_string_value(d);
	else if (json_is_string(json_object_get(json_array_get(d, 0), "msg")))
		t = json_string_value(json_object_get(json_array_get(d, 0),
						      "msg"));
	if (t && strlen(t) >= cap) {
		/* Cut on a character boundary, room left for "...". */
		n = cap > 4 ? cap - 4 : 0;
		while (n && ((unsigned char)t[n] & 0xc0) == 0x80)
			n--;
	} else if (t) {
		n = strlen(t);
	}
	for (size_t i = 0; i < n; i++)
		out[i] = (unsigned char)t[i] < 0x20 || t[i] == 0x7f ? ' ' : t[i];
	if (t && t[n] && cap > 4) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
	json_decref(root);
}

int
histd_http_error_name(int rc, const char *provider, const char *key_env,
		      const histd_http_response *r)
{
	char was[256], why[HISTD_HTTP_WHY_MAX + 1];
	long st = r ? r->status : 0;

	if (!rc || rc == HISTD_ENOMEM)
		return rc;
	if (rc == HISTD_EPRECONDITION && (st == 401 || st == 403))
		return histd_error_set(rc, "%s refused histd's API key (HTTP "
				       "%ld): check the key%s%s", provider, st,
				       key_env ? " in " : "",
				       key_env ? key_env : "");
	if (rc == HISTD_EPRECONDITION && st >= 400 && st < 500) {
		provider_why(r->body, r->len, why, sizeof(why));
		return histd_error_set(rc, "%s refused histd's request (HTTP "
				       "%ld)%s%s", provider, st,
				       why[0] ? ": " : "", why);
	}
	snprintf(was, sizeof(was), "%s", histd_error_message());
	return histd_error_set(rc, "%s: %s", provider, was);
}

int
histd_http_post(histd_http *h, const char *url, const char *const *headers,
		size_t n_headers, const char *body, size_t len,
		uint32_t deadline_ms, histd_http_response *out)
{
	int64_t start = now_ms(), deadline = deadline_ms ? start + deadline_ms
							  : INT64_MAX;
	struct curl_slist *hl = NULL, *t;
	uint32_t attempt = 0;
	int rc = 0;

	memset(out, 0, sizeof(out[0]));
	for (size_t i = 0; i < n_headers; i++) {
		if (!(t = curl_slist_append(hl, headers[i]))) {
			curl_slist_free_all(hl);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
		hl = t;
	}
	if (!(t = curl_slist_append(hl, "Content-Type: application/json")) ||
	    !(hl = t, t = curl_slist_append(hl, "Expect:"))) {
		curl_slist_free_all(hl);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	hl = t;
	pthread_mutex_lock(&h->mu);
	h->stats.calls++;
	pthread_mutex_unlock(&h->mu);
	for (;;) {
		sink s = { .max = h->cfg.max_response_bytes };
		int64_t left = deadline - now_ms(), wait;
		long status = 0, per = h->cfg.timeout_ms;
		CURLcode crc;
		CURL *c;
		int late;

		if (left <= 0) {
			rc = rc ? rc : histd_error_set(HISTD_EUNAVAILABLE,
				"provider call exceeded its deadline");
			break;
		}
		if (!(c = acquire(h, deadline, &late))) {
			if (atomic_load(&h->stopped))
				rc = stopping();
			else if (late && !rc)
				rc = histd_error_set(HISTD_EUNAVAILABLE,
					"provider call exceeded its deadline "
					"waiting for one of %u connection "
					"slots", h->cfg.max_concurrent);
			else if (!late)
				rc = histd_error_set(HISTD_EINTERNAL,
					"libcurl handle not created");
			/* late after a failed try: the caller hears that
			 * try's error, as at the deadline check above. */
			break;
		}
		/* The slot wait came out of the deadline; a slot that came
		 * at the deadline is given back unused. */
		left = deadline - now_ms();
		if (left <= 0) {
			release(h, c);
			if (!rc)
				rc = histd_error_set(HISTD_EUNAVAILABLE,
					"provider call exceeded its deadline "
					"waiting for one of %u connection "
					"slots", h->cfg.max_concurrent);
			break;
		}
		/* 0 is no limit per attempt: the deadline still is one. */
		if (per <= 0 || left < per)
			per = (long)left;
		attempt++;
		curl_easy_reset(c);
		curl_easy_setopt(c, CURLOPT_URL, url);
		curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
		curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(c, CURLOPT_VERBOSE, 0L);
		curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)len);
		curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
				 (long)h->cfg.connect_timeout_ms);
		curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, per);
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
		curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");
		curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
		curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
		curl_easy_setopt(c, CURLOPT_XFERINFODATA, h);
		crc = curl_easy_perform(c);
		if (crc == CURLE_OK)
			curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		wait = status == 429 || status == 503 ? retry_after_ms(c) : -1;
		release(h, c);
		pthread_mutex_lock(&h->mu);
		h->stats.attempts++;
		pthread_mutex_unlock(&h->mu);

		free(out->body);
		out->body = s.p;
		out->len = s.n;
		out->status = status;
		out->attempts = attempt;
		if (crc == CURLE_OK && status >= 200 && status < 300) {
			if (!out->body && !(out->body = calloc(1, 1)))
				rc = histd_error_set(HISTD_ENOMEM,
						     "out of memory");
			else
				rc = 0;
			break;
		}
		if (crc == CURLE_ABORTED_BY_CALLBACK) {
			rc = stopping();
			break;
		}
		rc = error_for(status, crc, s.too_big,
			       h->cfg.max_response_bytes);
		if (s.too_big || attempt > h->cfg.max_retries ||
		    !(crc == CURLE_OK ? retryable_status(status)
				      : retryable_curl(crc)))
			break;
		{
			int64_t b = backoff_ms(&h->cfg, attempt - 1);

			if (wait < b)
				wait = b;
		}
		/* A wait that ends past the deadline is not worth starting:
		 * the caller hears now (ELIMIT for a 429). */
		if (now_ms() + wait >= deadline)
			break;
		pthread_mutex_lock(&h->mu);
		h->stats.retries++;
		pthread_mutex_unlock(&h->mu);
		wait_ms(h, wait);
		if (atomic_load(&h->stopped)) {
			rc = stopping();
			break;
		}
	}
	curl_slist_free_all(hl);
	if (rc == 0 && out->status == 0)
		rc = histd_error_set(HISTD_EINTERNAL, "no HTTP status");
	return rc;
}
