/*
 * Context pipeline benchmark, in process (service calls on the memory
 * driver, no network): the costs the pipeline adds, without gRPC's
 * per-call cost diluting them.
 *
 *   context_vs_raw   GetMessages CONTEXT (compaction summary + masking +
 *                    window of 20) on a 10,000-message session, against
 *                    RAW last_n=20 on the same session, interleaved
 *                    rounds. Target: CONTEXT >= 0.7x RAW calls/s.
 *   append_p99       Append p99 on one session while another session's
 *                    compaction runs against a summarizer stub that takes
 *                    2 s per call, against the p99 without. Target:
 *                    <= 1.1x.
 *
 * ctest runs a small version (figures printed, nothing asserted); set
 * HISTD_BENCH=1 for the full one (README figures).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "compaction.h"
#include "context.h"
#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "service.h"

static histd_driver *drv;
static histd_service *svc;
static histd_context *ctx;
static const histd_caller who = { "bench", 0 };
static int full;
static int stub_ms = 2000;

static int
stub_summarize(histd_summarizer *s, const histd_summary_request *req,
	       histd_summary_result *out)
{
	struct timespec ts = { stub_ms / 1000, (long)(stub_ms % 1000) * 1000000 };
	histd_summarizer *ex;
	int rc;

	(void)s;
	nanosleep(&ts, NULL);
	histd_extractive_new(&ex);
	rc = ex->summarize(ex, req, out);
	ex->free(ex);
	return rc;
}

static void
stub_free(histd_summarizer *s)
{
	free(s);
}

static int
stub_exists(void *arg, const char *name)
{
	(void)arg;
	return !strcmp(name, "stub");
}

static int
stub_open(void *arg, const char *name, histd_summarizer **out)
{
	histd_summarizer *s = calloc(1, sizeof(*s));

	(void)arg;
	(void)name;
	s->version = HISTD_SUMMARIZER_VERSION;
	s->name = "stub";
	s->summarize = stub_summarize;
	s->free = stub_free;
	*out = s;
	return 0;
}

static int
call(enum histd_method m, const ProtobufCMessage *req)
{
	uint8_t buf[4096], *p = buf;
	size_t n = protobuf_c_message_get_packed_size(req);
	histd_reply reply = { 0 };
	int rc;

	if (n > sizeof(buf))
		p = malloc(n);
	protobuf_c_message_pack(req, p);
	rc = histd_service_unary(svc, m, &who, p, n, &reply);
	if (p != buf)
		free(p);
	free(reply.data);
	return rc;
}

/* A session on the server's default pipeline (set up below). */
static void
create(const char *id)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;

	r.session_id = (char *)id;
	assert_int_equal(call(HISTD_M_CREATE_SESSION, &r.base), 0);
}

static void
append_one(const char *id, Histd__V1__Role role, const char *text,
	   const char *call_id, const char *result_for)
{
	Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__ContentBlock ib = HISTD__V1__CONTENT_BLOCK__INIT, *ibp = &ib;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ToolCallBlock tc = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	Histd__V1__ToolResultBlock tr = HISTD__V1__TOOL_RESULT_BLOCK__INIT;

	t.text = (char *)text;
	if (call_id) {
		tc.id = (char *)call_id;
		tc.name = "read_file";
		tc.arguments = "{\"path\":\"src/main.c\"}";
		b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
		b.tool_call = &tc;
	} else if (result_for) {
		ib.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		ib.text = &t;
		tr.tool_call_id = (char *)result_for;
		tr.tool_name = "read_file";
		tr.content = &ibp;
		tr.n_content = 1;
		b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		b.tool_result = &tr;
	} else {
		b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		b.text = &t;
	}
	m.role = role;
	m.content = &bp;
	m.n_content = 1;
	r.session_id = (char *)id;
	r.messages = &mp;
	r.n_messages = 1;
	assert_int_equal(call(HISTD_M_APPEND, &r.base), 0);
}

/* n messages of agent turns (~1 KiB tool results), a system prompt first. */
static void
fill(const char *id, int n)
{
	static char big[1024];
	char cid[32];

	memset(big, 'x', sizeof(big) - 1);
	append_one(id, HISTD__V1__ROLE__ROLE_SYSTEM, "You are an agent.", NULL,
		   NULL);
	for (int i = 1; i < n; i += 4) {
		snprintf(cid, sizeof(cid), "c%d", i);
		append_one(id, HISTD__V1__ROLE__ROLE_USER, "Next step, please.",
			   NULL, NULL);
		append_one(id, HISTD__V1__ROLE__ROLE_ASSISTANT, "", cid, NULL);
		append_one(id, HISTD__V1__ROLE__ROLE_TOOL, big, NULL, cid);
		append_one(id, HISTD__V1__ROLE__ROLE_ASSISTANT, "Done.", NULL,
			   NULL);
	}
}

static double
now_s(void)
{
	return (double)histd_mono_us() / 1e6;
}

static void
context_vs_raw(void **state)
{
	Histd__V1__GetMessagesRequest raw = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetMessagesRequest cv = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__ReduceRequest rr = HISTD__V1__REDUCE_REQUEST__INIT;
	int n = full ? 10000 : 1000, rounds = 5, per = full ? 20000 : 1000;
	double t_raw = 0, t_ctx = 0;

	(void)state;
	create("big");
	fill("big", n);
	/* A summary to apply: compact all but the recent tail. */
	rr.session_id = "big";
	stub_ms = 0;
	assert_int_equal(call(HISTD_M_REDUCE, &rr.base), 0);
	raw.session_id = cv.session_id = "big";
	raw.view = HISTD__V1__VIEW__VIEW_RAW;
	raw.last_n = 20;
	cv.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	for (int i = 0; i < 200; i++) {     /* warm-up (and the index) */
		assert_int_equal(call(HISTD_M_GET_MESSAGES, &raw.base), 0);
		assert_int_equal(call(HISTD_M_GET_MESSAGES, &cv.base), 0);
	}
	for (int r = 0; r < rounds; r++) {
		double t0 = now_s();

		for (int i = 0; i < per; i++)
			call(HISTD_M_GET_MESSAGES, &raw.base);
		t_raw += now_s() - t0;
		t0 = now_s();
		for (int i = 0; i < per; i++)
			call(HISTD_M_GET_MESSAGES, &cv.base);
		t_ctx += now_s() - t0;
	}
	printf("context_vs_raw: %d messages; RAW last_n=20 %.0f calls/s "
	       "(%.1f us); CONTEXT %.0f calls/s (%.1f us); ratio %.2f\n", n,
	       rounds * per / t_raw, t_raw * 1e6 / (rounds * per),
	       rounds * per / t_ctx, t_ctx * 1e6 / (rounds * per),
	       t_raw / t_ctx);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t
append_p99(const char *id, int n)
{
	uint64_t *lat = malloc((size_t)n * sizeof(*lat)), p;

	for (int i = 0; i < n; i++) {
		int64_t t0 = histd_mono_us();

		append_one(id, HISTD__V1__ROLE__ROLE_USER,
			   "A user message of a typical length, about a line "
			   "or two of text that an agent loop appends.", NULL,
			   NULL);
		lat[i] = (uint64_t)(histd_mono_us() - t0);
	}
	qsort(lat, (size_t)n, sizeof(*lat), cmp_u64);
	p = lat[(size_t)n * 99 / 100];
	free(lat);
	return p;
}

static atomic_int compacting;     /* the compactor thread reads it */

static void *
compactor(void *arg)
{
	Histd__V1__ReduceRequest rr = HISTD__V1__REDUCE_REQUEST__INIT;

	(void)arg;
	rr.session_id = "victim";
	while (compacting) {
		append_one("victim", HISTD__V1__ROLE__ROLE_USER, "more", NULL,
			   NULL);
		call(HISTD_M_REDUCE, &rr.base);
	}
	return NULL;
}

static void
append_p99_during_compaction(void **state)
{
	int n = full ? 50000 : 2000;
	uint64_t base[3], during[3];
	pthread_t t;

	(void)state;
	create("w");
	create("victim");
	fill("victim", full ? 2000 : 200);
	append_p99("w", n / 5);            /* warm-up */
	stub_ms = full ? 2000 : 200;
	/* Interleave: without, with, three times; the best of each. */
	for (int r = 0; r < 3; r++) {
		base[r] = append_p99("w", n);
		compacting = 1;
		pthread_create(&t, NULL, compactor, NULL);
		/* Let the compaction start (it sleeps in the stub). */
		{
			struct timespec ts = { 0, 50 * 1000000 };

			nanosleep(&ts, NULL);
		}
		during[r] = append_p99("w", n);
		compacting = 0;
		pthread_join(t, NULL);
	}
	qsort(base, 3, sizeof(base[0]), cmp_u64);
	qsort(during, 3, sizeof(during[0]), cmp_u64);
	printf("append_p99: %d appends per run; p99 without compaction %llu "
	       "us, during a 2 s compaction %llu us (median of 3 runs); "
	       "ratio %.2f\n", n, (unsigned long long)base[1],
	       (unsigned long long)during[1],
	       base[1] ? (double)during[1] / (double)base[1] : 0.0);
}

static int
setup(void **state)
{
	static const histd_summarizer_source src = { stub_exists, stub_open,
						     NULL };
	histd_driver_config dc = { 0 };
	histd_context_config cc = { 0 };
	histd_service_config sc;

	(void)state;
	full = getenv("HISTD_BENCH") != NULL;
	histd_compaction_set_source(&src);
	if (histd_driver_open("memory", &dc, &drv))
		return -1;
	cc.default_pipeline = "compaction:summarizer=stub,keep_recent=20;"
			      "masking:keep_recent_results=3;"
			      "window:max_messages=20";
	cc.workers = 1;
	if (histd_context_new(&ctx, drv, &cc))
		return -1;
	histd_service_config_default(&sc);
	sc.context = ctx;
	sc.max_page_size = 1000;
	return histd_service_new(&svc, drv, &sc);
}

static int
teardown(void **state)
{
	(void)state;
	histd_service_free(svc);
	histd_context_free(ctx);
	histd_driver_close(drv);
	histd_compaction_set_source(NULL);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(context_vs_raw),
		cmocka_unit_test(append_p99_during_compaction),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
