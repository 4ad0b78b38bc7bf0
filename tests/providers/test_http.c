/*
 * The HTTP layer against the stub provider on loopback: retries on 429
 * (honouring Retry-After) and 5xx, no retries on other 4xx, timeouts on
 * slow answers, deadlines, the cap on concurrent calls, size limits, and
 * keys that never reach an error message.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "http.h"
#include "stub_provider.h"

static const char *const hdrs[] = { "Authorization: Bearer SECRETKEY" };

static long
ms_since(struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 +
	       (t.tv_nsec - t0->tv_nsec) / 1000000;
}

typedef struct fixture {
	stub *s;
	histd_http *h;
	char url[128];
} fixture;

static fixture *
setup_with(histd_http_config *cfg)
{
	fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f->s = stub_start());
	assert_int_equal(histd_http_new(&f->h, cfg), 0);
	snprintf(f->url, sizeof(f->url), "%s/v1/messages", stub_url(f->s));
	return f;
}

static fixture *
setup(void)
{
	histd_http_config cfg;

	histd_http_config_default(&cfg);
	cfg.backoff_base_ms = 10;
	cfg.backoff_max_ms = 50;
	cfg.timeout_ms = 5000;
	return setup_with(&cfg);
}

static void
teardown(fixture *f)
{
	histd_http_free(f->h);
	stub_stop(f->s);
	free(f);
}

static int
post(fixture *f, uint32_t deadline_ms, histd_http_response *r)
{
	return histd_http_post(f->h, f->url, hdrs, 1, "{}", 2, deadline_ms, r);
}

static void
success_returns_the_body(void **state)
{
	fixture *f = setup();
	histd_http_response r;
	char *auth;

	(void)state;
	assert_int_equal(post(f, 0, &r), 0);
	assert_int_equal(r.status, 200);
	assert_int_equal(r.attempts, 1);
	assert_non_null(strstr(r.body, "stub summary"));
	auth = stub_last_header(f->s, "Authorization");
	assert_string_equal(auth, "Bearer SECRETKEY");
	free(auth);
	histd_http_response_clear(&r);
	/* The second call reuses the pooled handle and its connection. */
	assert_int_equal(post(f, 0, &r), 0);
	histd_http_response_clear(&r);
	teardown(f);
}

static void
rate_limit_waits_for_retry_after(void **state)
{
	fixture *f = setup();
	histd_http_response r;
	struct timespec t0;

	(void)state;
	stub_push(f->s, (stub_reply){ 429, 1, 0, "{\"error\":\"slow down\"}" });
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(post(f, 0, &r), 0);
	assert_true(ms_since(&t0) >= 950);
	assert_int_equal(r.attempts, 2);
	assert_int_equal(stub_requests(f->s), 2);
	histd_http_response_clear(&r);
	teardown(f);
}

static void
rate_limit_past_the_last_retry_is_elimit(void **state)
{
	histd_http_config cfg;
	histd_http_response r;
	fixture *f;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.max_retries = 2;
	cfg.backoff_base_ms = 5;
	f = setup_with(&cfg);
	for (int i = 0; i < 3; i++)
		stub_push(f->s, (stub_reply){ 429, 0, 0, "{}" });
	assert_int_equal(post(f, 0, &r), HISTD_ELIMIT);
	assert_int_equal(r.status, 429);
	assert_int_equal(r.attempts, 3);
	assert_int_equal(stub_requests(f->s), 3);
	assert_null(strstr(histd_error_message(), "SECRETKEY"));
	histd_http_response_clear(&r);
	teardown(f);
}

static void
retry_after_past_the_deadline_answers_at_once(void **state)
{
	fixture *f = setup();
	histd_http_response r;
	struct timespec t0;

	(void)state;
	stub_push(f->s, (stub_reply){ 429, 30, 0, "{}" });
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(post(f, 2000, &r), HISTD_ELIMIT);
	assert_true(ms_since(&t0) < 1500);
	assert_int_equal(stub_requests(f->s), 1);
	histd_http_response_clear(&r);
	teardown(f);
}

static void
server_errors_are_retried(void **state)
{
	fixture *f = setup();
	histd_http_response r;

	(void)state;
	stub_push(f->s, (stub_reply){ 500, -1, 0, "oops" });
	stub_push(f->s, (stub_reply){ 503, 0, 0, "busy" });
	assert_int_equal(post(f, 0, &r), 0);
	assert_int_equal(r.attempts, 3);
	histd_http_response_clear(&r);
	/* A proxy's 5xx too (Cloudflare 520) */
	stub_push(f->s, (stub_reply){ 520, -1, 0, "origin error" });
	assert_int_equal(post(f, 0, &r), 0);
	assert_int_equal(r.attempts, 2);
	histd_http_response_clear(&r);
	/* but not one that says the request cannot be served. */
	stub_push(f->s, (stub_reply){ 501, -1, 0, "not implemented" });
	assert_int_equal(post(f, 0, &r), HISTD_EUNAVAILABLE);
	assert_int_equal(r.attempts, 1);
	histd_http_response_clear(&r);
	teardown(f);
}

/* A provider's 4xx refuses histd's own key or request: EPRECONDITION
 * (a server-side failure for histd's caller), never EUNAUTH or EINVALID,
 * and not retried. */
static void
client_errors_are_not_retried(void **state)
{
	fixture *f = setup();
	histd_http_response r;

	(void)state;
	stub_push(f->s, (stub_reply){ 400, -1, 0, "{\"error\":\"bad\"}" });
	assert_int_equal(post(f, 0, &r), HISTD_EPRECONDITION);
	assert_int_equal(r.status, 400);
	assert_non_null(strstr(r.body, "bad"));
	assert_non_null(strstr(histd_error_message(), "HTTP 400"));
	histd_http_response_clear(&r);
	stub_push(f->s, (stub_reply){ 401, -1, 0, "{}" });
	assert_int_equal(post(f, 0, &r), HISTD_EPRECONDITION);
	assert_non_null(strstr(histd_error_message(), "API key (HTTP 401)"));
	assert_null(strstr(histd_error_message(), "SECRETKEY"));
	histd_http_response_clear(&r);
	stub_push(f->s, (stub_reply){ 403, -1, 0, "{}" });
	assert_int_equal(post(f, 0, &r), HISTD_EPRECONDITION);
	assert_non_null(strstr(histd_error_message(), "API key (HTTP 403)"));
	histd_http_response_clear(&r);
	stub_push(f->s, (stub_reply){ 404, -1, 0, "{}" });
	assert_int_equal(post(f, 0, &r), HISTD_EPRECONDITION);
	histd_http_response_clear(&r);
	assert_int_equal(stub_requests(f->s), 4);
	teardown(f);
}

/* histd_http_error_name: the message names the provider and the status;
 * a refused request quotes the provider's own error text (one line, cut),
 * a refused key names the variable, never what the provider said. */
static void
error_messages_name_the_provider(void **state)
{
	static const struct {
		long status;
		const char *body, *want;
	} cases[] = {
		{ 400, "{\"type\":\"error\",\"error\":{\"type\":"
		  "\"invalid_request_error\",\"message\":\"max_tokens: "
		  "too large\"}}",
		  "anthropic refused histd's request (HTTP 400): max_tokens: "
		  "too large" },
		{ 404, "{\"error\":{\"code\":404,\"message\":\"model "
		  "not\\nfound\",\"status\":\"NOT_FOUND\"}}",
		  "anthropic refused histd's request (HTTP 404): model not "
		  "found" },
		{ 422, "{\"object\":\"error\",\"message\":\"bad model\"}",
		  "anthropic refused histd's request (HTTP 422): bad model" },
		{ 422, "{\"detail\":[{\"msg\":\"Field required\","
		  "\"input\":\"conversation\"}]}",
		  "anthropic refused histd's request (HTTP 422): Field "
		  "required" },
		{ 400, "<html>Bad Request</html>",
		  "anthropic refused histd's request (HTTP 400)" },
		{ 401, "{\"error\":{\"message\":\"Incorrect API key "
		  "provided: SECRETKEY\"}}",
		  "anthropic refused histd's API key (HTTP 401): check the key "
		  "in ANTHROPIC_API_KEY" },
		{ 403, "{}", "anthropic refused histd's API key (HTTP 403): check "
		  "the key in ANTHROPIC_API_KEY" },
	};
	fixture *f = setup();
	histd_http_response r;
	char longer[600];
	int rc;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		stub_push(f->s, (stub_reply){ (int)cases[i].status, -1, 0,
					      cases[i].body });
		rc = histd_http_error_name(post(f, 0, &r), "anthropic",
					   "ANTHROPIC_API_KEY", &r);
		assert_int_equal(rc, HISTD_EPRECONDITION);
		assert_string_equal(histd_error_message(), cases[i].want);
		histd_http_response_clear(&r);
	}
	/* A long provider message is cut, on a character boundary. */
	snprintf(longer, sizeof(longer), "{\"error\":{\"message\":\"%0*d"
		 "\\u00e9\\u00e9\\u00e9%0300d\"}}", 196, 0, 0);
	stub_push(f->s, (stub_reply){ 400, -1, 0, longer });
	rc = histd_http_error_name(post(f, 0, &r), "gemini", NULL, &r);
	assert_int_equal(rc, HISTD_EPRECONDITION);
	assert_true(strlen(histd_error_message()) <
		    strlen("gemini refused histd's request (HTTP 400): ") +
		    HISTD_HTTP_WHY_MAX + 1);
	/* The cut falls inside the first e-acute: it goes whole. */
	assert_non_null(strstr(histd_error_message(), "00..."));
	assert_null(strchr(histd_error_message(), '\xc3'));
	histd_http_response_clear(&r);
	/* Other failures keep their message, with the provider in front. */
	stub_push(f->s, (stub_reply){ 500, -1, 0, "{}" });
	stub_push(f->s, (stub_reply){ 500, -1, 0, "{}" });
	stub_push(f->s, (stub_reply){ 500, -1, 0, "{}" });
	stub_push(f->s, (stub_reply){ 500, -1, 0, "{}" });
	rc = histd_http_error_name(post(f, 0, &r), "mistral", NULL, &r);
	assert_int_equal(rc, HISTD_EUNAVAILABLE);
	assert_string_equal(histd_error_message(),
			    "mistral: provider answered 500");
	histd_http_response_clear(&r);
	teardown(f);
}

static void
slow_answers_time_out_and_are_retried(void **state)
{
	histd_http_config cfg;
	histd_http_response r;
	fixture *f;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.timeout_ms = 300;
	cfg.max_retries = 1;
	cfg.backoff_base_ms = 5;
	f = setup_with(&cfg);
	stub_push(f->s, (stub_reply){ 0, -1, 1200, NULL });
	stub_push(f->s, (stub_reply){ 0, -1, 1200, NULL });
	assert_int_equal(post(f, 0, &r), HISTD_EUNAVAILABLE);
	assert_non_null(strstr(histd_error_message(), "unreachable"));
	assert_int_equal(r.attempts, 2);
	histd_http_response_clear(&r);
	/* A slow first answer, a quick second: success. */
	stub_push(f->s, (stub_reply){ 0, -1, 1200, NULL });
	assert_int_equal(post(f, 0, &r), 0);
	assert_int_equal(r.attempts, 2);
	histd_http_response_clear(&r);
	teardown(f);
}

static void
unreachable_provider_is_eunavailable(void **state)
{
	histd_http_config cfg;
	histd_http *h;
	histd_http_response r;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.max_retries = 1;
	cfg.backoff_base_ms = 5;
	assert_int_equal(histd_http_new(&h, &cfg), 0);
	/* Port 1 on loopback: nothing listens. */
	assert_int_equal(histd_http_post(h, "http://127.0.0.1:1/v1/messages",
					 hdrs, 1, "{}", 2, 0, &r),
			 HISTD_EUNAVAILABLE);
	assert_int_equal(r.attempts, 2);
	histd_http_response_clear(&r);
	histd_http_free(h);
}

static void
oversized_answers_fail(void **state)
{
	histd_http_config cfg;
	histd_http_response r;
	fixture *f;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.max_response_bytes = 64;
	f = setup_with(&cfg);
	assert_int_equal(post(f, 0, &r), HISTD_EUNAVAILABLE);
	assert_non_null(strstr(histd_error_message(), "exceeds 64 bytes"));
	assert_int_equal(stub_requests(f->s), 1);
	histd_http_response_clear(&r);
	teardown(f);
}

static void *
one_call(void *arg)
{
	fixture *f = arg;
	histd_http_response r;
	int rc = post(f, 0, &r);

	histd_http_response_clear(&r);
	return (void *)(intptr_t)rc;
}

static void
concurrent_calls_are_capped(void **state)
{
	histd_http_config cfg;
	histd_http_stats st;
	pthread_t t[6];
	void *rcs[6];
	int started = 0;
	fixture *f;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.max_concurrent = 2;
	f = setup_with(&cfg);
	for (int i = 0; i < 6; i++)
		stub_push(f->s, (stub_reply){ 0, -1, 200, NULL });
	while (started < 6 && pthread_create(&t[started], NULL, one_call,
					     f) == 0)
		started++;
	for (int i = 0; i < started; i++)
		pthread_join(t[i], &rcs[i]);
	assert_int_equal(started, 6);
	for (int i = 0; i < 6; i++)
		assert_int_equal((intptr_t)rcs[i], 0);
	histd_http_get_stats(f->h, &st);
	assert_int_equal(st.calls, 6);
	/* Six callers, each answer 200 ms: two must overlap, never three. */
	assert_int_equal(st.max_in_flight, 2);
	assert_int_equal(stub_max_concurrent(f->s), 2);
	assert_int_equal(stub_requests(f->s), 6);
	teardown(f);
}

typedef struct timed_call {
	fixture *f;
	uint32_t deadline_ms;
	int rc;
	long ms;
	char msg[256];
} timed_call;

static void *
timed_one_call(void *arg)
{
	timed_call *tc = arg;
	histd_http_response r;
	struct timespec t0;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	tc->rc = post(tc->f, tc->deadline_ms, &r);
	tc->ms = ms_since(&t0);
	snprintf(tc->msg, sizeof(tc->msg), "%s", histd_error_message());
	histd_http_response_clear(&r);
	return NULL;
}

/* The deadline covers the wait for a slot: with one slot held by a slow
 * answer, a second call gives up at its own deadline, not once the slot
 * is free, and never reaches the provider. */
static void
deadline_covers_the_wait_for_a_slot(void **state)
{
	histd_http_config cfg;
	timed_call first, second;
	pthread_t t1, t2;
	fixture *f;

	(void)state;
	histd_http_config_default(&cfg);
	cfg.max_concurrent = 1;
	cfg.max_retries = 0;
	f = setup_with(&cfg);
	stub_push(f->s, (stub_reply){ 0, -1, 2500, NULL });
	first = (timed_call){ .f = f, .deadline_ms = 0 };
	second = (timed_call){ .f = f, .deadline_ms = 500 };
	assert_int_equal(pthread_create(&t1, NULL, timed_one_call, &first), 0);
	for (int i = 0; i < 200 && stub_requests(f->s) == 0; i++)
		usleep(10 * 1000);
	assert_int_equal(stub_requests(f->s), 1);
	assert_int_equal(pthread_create(&t2, NULL, timed_one_call, &second),
			 0);
	pthread_join(t2, NULL);
	pthread_join(t1, NULL);
	assert_int_equal(first.rc, 0);
	assert_int_equal(second.rc, HISTD_EUNAVAILABLE);
	assert_non_null(strstr(second.msg, "deadline"));
	assert_non_null(strstr(second.msg, "slot"));
	assert_true(second.ms >= 450);
	assert_true(second.ms < 1500);
	assert_int_equal(stub_requests(f->s), 1);
	teardown(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(success_returns_the_body),
		cmocka_unit_test(rate_limit_waits_for_retry_after),
		cmocka_unit_test(rate_limit_past_the_last_retry_is_elimit),
		cmocka_unit_test(retry_after_past_the_deadline_answers_at_once),
		cmocka_unit_test(server_errors_are_retried),
		cmocka_unit_test(client_errors_are_not_retried),
		cmocka_unit_test(error_messages_name_the_provider),
		cmocka_unit_test(slow_answers_time_out_and_are_retried),
		cmocka_unit_test(unreachable_provider_is_eunavailable),
		cmocka_unit_test(oversized_answers_fail),
		cmocka_unit_test(concurrent_calls_are_capped),
		cmocka_unit_test(deadline_covers_the_wait_for_a_slot),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
