/*
 * The CONTEXT view, Reduce, automatic compaction and the TTL
 * (server/context.c) through the service, on the memory driver, with
 * summarizers that are slow or fail on demand.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include <cmocka.h>

#include "compaction.h"
#include "context.h"
#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "memory/memory.h"
#include "plugin.h"
#include "service.h"
#include "svc_calls.h"
#include "tokens.h"
#include "transcript_check.h"

static histd_driver *drv;
static histd_service *svc;
static histd_context *ctx;
static const histd_caller alice = { "alice", 0 };

/* ---------------------------------------------------------------------- */
/* Summarizers on demand: "slow" sleeps slow_ms, "failing" fails          */
/* fail_left more times (then works); both then summarize extractively.   */
/* "fixed" answers fixed_text whatever it is asked (an empty answer, one  */
/* far above max_output_tokens), as a provider may.                       */

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static int slow_ms;
static int fail_left;
static int calls, running, max_running;
static const char *fixed_text;
/* Run once inside the next summarizer call, as a client racing it. */
static void (*in_call)(void);

static int
fake_summarize(histd_summarizer *s, const histd_summary_request *req,
	       histd_summary_result *out)
{
	histd_summarizer *ex;
	void (*hook)(void);
	int fail, rc;

	pthread_mutex_lock(&fake_lock);
	calls++;
	if (++running > max_running)
		max_running = running;
	fail = !strcmp(s->name, "failing") && fail_left > 0;
	if (fail && fail_left > 0)
		fail_left--;
	hook = in_call;
	in_call = NULL;
	pthread_mutex_unlock(&fake_lock);
	if (hook)
		hook();
	if (!strcmp(s->name, "slow")) {
		struct timespec ts = { slow_ms / 1000,
				       (long)(slow_ms % 1000) * 1000000 };

		nanosleep(&ts, NULL);
	}
	if (fail) {
		rc = histd_error_set(HISTD_EUNAVAILABLE,
				     "provider answered HTTP 503");
	} else if (!strcmp(s->name, "fixed")) {
		memset(out, 0, sizeof(*out));
		out->text = strdup(fixed_text);
		out->model = strdup("fixed-model");
		rc = 0;
	} else {
		histd_extractive_new(&ex);
		rc = ex->summarize(ex, req, out);
		ex->free(ex);
	}
	pthread_mutex_lock(&fake_lock);
	running--;
	pthread_mutex_unlock(&fake_lock);
	return rc;
}

static void
fake_free(histd_summarizer *s)
{
	free(s);
}

static int
fake_exists(void *arg, const char *name)
{
	(void)arg;
	return !strcmp(name, "slow") || !strcmp(name, "failing") ||
	       !strcmp(name, "fixed");
}

static int
fake_open(void *arg, const char *name, histd_summarizer **out)
{
	histd_summarizer *s = calloc(1, sizeof(*s));

	(void)arg;
	s->version = HISTD_SUMMARIZER_VERSION;
	s->name = !strcmp(name, "slow") ? "slow" :
		  !strcmp(name, "fixed") ? "fixed" : "failing";
	s->summarize = fake_summarize;
	s->free = fake_free;
	*out = s;
	return 0;
}

/* The error sink: what subscribers would receive. */
static int sink_calls, sink_retry_calls;
static char sink_msg[512];

static void
sink(void *arg, const char *tenant, const char *sid, uint64_t revision,
     uint64_t incarnation, const char *plugin, const char *message,
     int will_retry)
{
	(void)arg;
	(void)tenant;
	(void)sid;
	(void)revision;
	(void)incarnation;
	pthread_mutex_lock(&fake_lock);
	sink_calls++;
	if (will_retry)
		sink_retry_calls++;
	snprintf(sink_msg, sizeof(sink_msg), "%s: %s", plugin, message);
	pthread_mutex_unlock(&fake_lock);
}

/* The context's entry_idle_us for the next start (0: its default). */
static int64_t next_entry_idle_us;

static int
start(const char *default_pipeline, int64_t ttl_us)
{
	static const histd_summarizer_source src = { fake_exists, fake_open,
						     NULL };
	histd_driver_config dc = { 0 };
	histd_context_config cc = { 0 };
	histd_service_config sc;

	histd_compaction_set_source(&src);
	if (histd_driver_open("memory", &dc, &drv))
		return -1;
	cc.default_pipeline = default_pipeline;
	cc.workers = 1;
	cc.max_retries = 3;
	cc.retry_base_us = 50000;
	cc.session_ttl_us = ttl_us;
	cc.sweep_interval_us = INT64_C(3600) * 1000000;
	cc.entry_idle_us = next_entry_idle_us;
	if (histd_context_new(&ctx, drv, &cc))
		return -1;
	histd_context_set_error_sink(ctx, sink, NULL);
	histd_service_config_default(&sc);
	sc.context = ctx;
	if (histd_service_new(&svc, drv, &sc))
		return -1;
	ut_use(svc, &alice);
	pthread_mutex_lock(&fake_lock);
	slow_ms = 0;
	fail_left = 0;
	calls = running = max_running = 0;
	sink_calls = sink_retry_calls = 0;
	sink_msg[0] = '\0';
	in_call = NULL;
	pthread_mutex_unlock(&fake_lock);
	return 0;
}

static int
setup(void **state)
{
	(void)state;
	return start("", 0);
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

/* ---------------------------------------------------------------------- */
/* Calls                                                                   */

/* Appends one message (role, text, or a tool call/result). */
static void
append_msg(const char *id, Histd__V1__Role role, const char *text,
	   const char *call_id, const char *result)
{
	Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__ContentBlock ib = HISTD__V1__CONTENT_BLOCK__INIT, *ibp = &ib;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ToolCallBlock tc = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	Histd__V1__ToolResultBlock tr = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	int rc;

	t.text = (char *)(text ? text : "x");
	if (call_id) {
		tc.id = (char *)call_id;
		tc.name = "read_file";
		tc.arguments = "{}";
		b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
		b.tool_call = &tc;
	} else if (result) {
		ib.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		ib.text = &t;
		tr.tool_call_id = (char *)result;
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
	rc = ut_call(HISTD_M_APPEND, &r.base, NULL, NULL);
	if (rc)
		fail_msg("append: %s", histd_error_message());
}

/* An agent turn: user asks q, assistant calls c, tool answers result,
 * assistant says a. 4 messages. */
static void
turn_of(const char *id, const char *q, const char *c, const char *result,
	const char *a)
{
	append_msg(id, HISTD__V1__ROLE__ROLE_USER, q, NULL, NULL);
	append_msg(id, HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, c, NULL);
	append_msg(id, HISTD__V1__ROLE__ROLE_TOOL, result, NULL, c);
	append_msg(id, HISTD__V1__ROLE__ROLE_ASSISTANT, a, NULL, NULL);
}

/* Turn i of the usual agent loop. */
static void
turn(const char *id, int i)
{
	char q[64], c[32], a[64];

	snprintf(q, sizeof(q), "Question number %d.", i);
	snprintf(c, sizeof(c), "call-%d", i);
	snprintf(a, sizeof(a), "Answer number %d.", i);
	turn_of(id, q, c,
		"file contents that are long enough to be worth masking", a);
}

static Histd__V1__GetMessagesResponse *
get(const char *id, Histd__V1__View view, uint32_t limit)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	void *resp;
	int rc;

	r.session_id = (char *)id;
	r.view = view;
	r.limit = limit;
	rc = ut_call(HISTD_M_GET_MESSAGES, &r.base,
		  &histd__v1__get_messages_response__descriptor, &resp);
	if (rc)
		fail_msg("get: %s", histd_error_message());
	return resp;
}

/* A CONTEXT read of the newest last_n messages. */
static Histd__V1__GetMessagesResponse *
get_last(const char *id, uint32_t last_n)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	void *resp;

	r.session_id = (char *)id;
	r.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	r.last_n = last_n;
	if (ut_call(HISTD_M_GET_MESSAGES, &r.base,
		    &histd__v1__get_messages_response__descriptor, &resp))
		fail_msg("get: %s", histd_error_message());
	return resp;
}

static int
reduce(const char *id, Histd__V1__ReduceResponse **out)
{
	Histd__V1__ReduceRequest r = HISTD__V1__REDUCE_REQUEST__INIT;

	r.session_id = (char *)id;
	return ut_call(HISTD_M_REDUCE, &r.base,
		    &histd__v1__reduce_response__descriptor, (void **)out);
}

static int
reduce_bounded(const char *id, uint32_t max_entries, uint64_t max_tokens,
	       Histd__V1__ReduceResponse **out)
{
	Histd__V1__ReduceRequest r = HISTD__V1__REDUCE_REQUEST__INIT;

	r.session_id = (char *)id;
	r.max_entries = max_entries;
	r.max_tokens = max_tokens;
	return ut_call(HISTD_M_REDUCE, &r.base,
		    &histd__v1__reduce_response__descriptor, (void **)out);
}

static Histd__V1__Session *
session(const char *id)
{
	Histd__V1__GetSessionRequest r = HISTD__V1__GET_SESSION_REQUEST__INIT;
	void *resp;

	r.session_id = (char *)id;
	if (ut_call(HISTD_M_GET_SESSION, &r.base,
		    &histd__v1__session__descriptor, &resp))
		fail_msg("get session: %s", histd_error_message());
	return resp;
}

/* The index of the message of g holding a tool_call (calls 1) or a
 * tool_result (calls 0) of that id, or -1. */
static int
tool_block_at(const Histd__V1__GetMessagesResponse *g, int calls,
	      const char *call_id)
{
	for (size_t i = 0; i < g->n_messages; i++)
		for (size_t j = 0; j < g->messages[i]->n_content; j++) {
			const Histd__V1__ContentBlock *b =
				g->messages[i]->content[j];

			if (calls && b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
			    !strcmp(b->tool_call->id, call_id))
				return (int)i;
			if (!calls && b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
			    !strcmp(b->tool_result->tool_call_id, call_id))
				return (int)i;
		}
	return -1;
}

/* 1 if s[0..n) is well-formed UTF-8. */
static int
utf8_ok(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;

	for (size_t i = 0; i < n;) {
		size_t k = p[i] < 0x80 ? 1 : (p[i] & 0xe0) == 0xc0 ? 2 :
			   (p[i] & 0xf0) == 0xe0 ? 3 :
			   (p[i] & 0xf8) == 0xf0 ? 4 : 0;

		if (!k || i + k > n)
			return 0;
		for (size_t j = 1; j < k; j++)
			if ((p[i + j] & 0xc0) != 0x80)
				return 0;
		i += k;
	}
	return 1;
}

/* The view's shape: system messages only first, the summary (if any)
 * right after them as a user message, no unpaired tool block. */
static void
assert_provider_valid(const Histd__V1__GetMessagesResponse *g)
{
	size_t i = 0;

	while (i < g->n_messages &&
	       g->messages[i]->role == HISTD__V1__ROLE__ROLE_SYSTEM)
		i++;
	if (g->summary) {
		assert_true(i < g->n_messages);
		assert_int_equal(g->messages[i]->role,
				 HISTD__V1__ROLE__ROLE_USER);
		assert_memory_equal(tc_text_of(g->messages[i]),
				    HISTD_SUMMARY_PREFIX,
				    strlen(HISTD_SUMMARY_PREFIX));
		i++;
	}
	for (size_t k = i; k < g->n_messages; k++) {
		const Histd__V1__Message *m = g->messages[k];

		assert_int_not_equal(m->role, HISTD__V1__ROLE__ROLE_SYSTEM);
		for (size_t j = 0; j < m->n_content; j++) {
			const Histd__V1__ContentBlock *b = m->content[j];
			int found = 0;

			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
				for (size_t q = i; q < k && !found; q++)
					for (size_t z = 0;
					     z < g->messages[q]->n_content; z++) {
						const Histd__V1__ContentBlock *c =
							g->messages[q]->content[z];

						if (c->block_case ==
						    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
						    !strcmp(c->tool_call->id,
							    b->tool_result->tool_call_id))
							found = 1;
					}
				assert_true(found);
			}
			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
				for (size_t q = k + 1; q < g->n_messages &&
				     !found; q++)
					for (size_t z = 0;
					     z < g->messages[q]->n_content; z++) {
						const Histd__V1__ContentBlock *c =
							g->messages[q]->content[z];

						if (c->block_case ==
						    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
						    !strcmp(c->tool_result->tool_call_id,
							    b->tool_call->id))
							found = 1;
					}
				assert_true(found);
			}
		}
	}
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void
context_is_system_then_summary_as_user_then_the_tail(void **state)
{
	static const char *const pl[] = {
		"compaction", "keep_recent", "6",
		"masking", "keep_recent_results", "1",
		"window", "max_messages", "100", NULL };
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g, *raw;
	uint64_t to;

	(void)state;
	assert_int_equal(ut_create("s1", pl), 0);
	append_msg("s1", HISTD__V1__ROLE__ROLE_SYSTEM, "You are terse.", NULL,
		   NULL);
	for (int i = 0; i < 5; i++)
		turn("s1", i);
	/* A second system message mid-history (some agents add them). */
	append_msg("s1", HISTD__V1__ROLE__ROLE_SYSTEM, "Be brief now.", NULL,
		   NULL);
	turn("s1", 5);
	assert_int_equal(reduce("s1", &rr), 0);
	assert_non_null(rr->summary);
	to = rr->summary->covers_to_seq;
	assert_true(to > 1);
	assert_string_equal(rr->summary->model, "extractive");
	ut_free_msg(rr);

	g = get("s1", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_provider_valid(g);
	assert_non_null(g->summary);
	assert_int_equal(g->summary->covers_to_seq, to);
	/* Both system messages, in order, then the summary. */
	assert_string_equal(tc_text_of(g->messages[0]), "You are terse.");
	assert_string_equal(tc_text_of(g->messages[1]), "Be brief now.");
	assert_non_null(strstr(tc_text_of(g->messages[2]),
			       "Question number 0."));
	/* Every message after the covered range follows, seq order. */
	for (size_t i = 3; i < g->n_messages; i++)
		assert_true(g->messages[i]->seq > to);
	assert_int_equal(g->messages[g->n_messages - 1]->seq, 26);
	/* RAW still has every message. */
	raw = get("s1", HISTD__V1__VIEW__VIEW_RAW, 1000);
	assert_int_equal(raw->n_messages, 26);
	ut_free_msg(raw);
	ut_free_msg(g);
}

/* A system message mid-history is one the window keeps apart, as one at
 * the start: it counts toward neither max_messages nor the messages cut
 * for max_tokens, whether the read loaded it with the tail or not. */
static void
the_window_keeps_a_system_message_mid_history_apart(void **state)
{
	static const char *const by_count[] = {
		"window", "max_messages", "2", NULL };
	static const char *const by_tokens[] = {
		"window", "max_tokens", "60", NULL };
	static const char *const want[] = { "s3", "a2", "u4" };
	Histd__V1__GetMessagesResponse *g, *all;

	(void)state;
	assert_int_equal(ut_create("w", by_count), 0);
	append_msg("w", HISTD__V1__ROLE__ROLE_USER, "u1", NULL, NULL);
	append_msg("w", HISTD__V1__ROLE__ROLE_ASSISTANT, "a2", NULL, NULL);
	append_msg("w", HISTD__V1__ROLE__ROLE_SYSTEM, "s3", NULL, NULL);
	append_msg("w", HISTD__V1__ROLE__ROLE_USER, "u4", NULL, NULL);
	g = get("w", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_int_equal(g->n_messages, 3);
	for (size_t i = 0; i < 3; i++)
		assert_string_equal(tc_text_of(g->messages[i]), want[i]);
	ut_free_msg(g);

	/* A system message of about 40 tokens among 40 short ones: the
	 * view is the same, and within max_tokens, whatever was loaded. */
	assert_int_equal(ut_create("t", by_tokens), 0);
	append_msg("t", HISTD__V1__ROLE__ROLE_USER, "first", NULL, NULL);
	append_msg("t", HISTD__V1__ROLE__ROLE_SYSTEM,
		   "You answer in one short sentence and never use lists, "
		   "tables or code blocks unless the user asks for them by "
		   "name, in this session.", NULL, NULL);
	for (int i = 0; i < 40; i++)
		append_msg("t", i % 2 ? HISTD__V1__ROLE__ROLE_ASSISTANT :
					HISTD__V1__ROLE__ROLE_USER, "short", NULL,
			   NULL);
	g = get_last("t", 0);
	all = get_last("t", 1000);
	assert_true(g->token_estimate <= 60);
	assert_int_equal(all->token_estimate, g->token_estimate);
	assert_int_equal(all->n_messages, g->n_messages);
	for (size_t i = 0; i < g->n_messages; i++)
		assert_int_equal(all->messages[i]->seq, g->messages[i]->seq);
	assert_int_equal(g->messages[0]->role, HISTD__V1__ROLE__ROLE_SYSTEM);
	ut_free_msg(g);
	ut_free_msg(all);
}

/* Reduce with max_tokens: the CONTEXT view after it, summary message
 * included (its text and what wraps it), is within the bound. */
static void
reduce_max_tokens_bounds_the_view_with_the_summary_message(void **state)
{
	static const char *const pl[] = {
		"compaction", "keep_recent", "2",
		"compaction", "max_summary_tokens", "100", NULL };
	char long_text[121];
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	assert_int_equal(ut_create("mt", pl), 0);
	for (int i = 0; i < 38; i++)
		append_msg("mt", i % 2 ? HISTD__V1__ROLE__ROLE_ASSISTANT :
					 HISTD__V1__ROLE__ROLE_USER,
			   i % 2 ? "Answer number." : "Question here.", NULL,
			   NULL);
	memset(long_text, 'w', sizeof(long_text) - 1);
	for (size_t i = 5; i < sizeof(long_text) - 1; i += 6)
		long_text[i] = ' ';
	long_text[sizeof(long_text) - 1] = '\0';
	append_msg("mt", HISTD__V1__ROLE__ROLE_USER, long_text, NULL, NULL);
	append_msg("mt", HISTD__V1__ROLE__ROLE_ASSISTANT, long_text, NULL,
		   NULL);
	assert_int_equal(reduce_bounded("mt", 0, 200, &rr), 0);
	assert_non_null(rr->summary);
	ut_free_msg(rr);
	g = get("mt", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_non_null(g->summary);
	if (g->token_estimate > 200)
		fail_msg("the view is %llu tokens, over max_tokens 200",
			 (unsigned long long)g->token_estimate);
	ut_free_msg(g);
}

/* What the context keeps of a session goes once the session is idle: a
 * service whose sessions come and go does not grow. Sessions of one
 * message each are made until the context holds fewer entries than the
 * first batch made (idle after 1 us here). */
static void
entries_of_idle_sessions_are_freed(void **state)
{
	const size_t batch = 4000, bound = 4000;
	size_t made = 0, held = 0;

	(void)state;
	teardown(NULL);
	next_entry_idle_us = 1;
	assert_int_equal(start("", 0), 0);
	next_entry_idle_us = 0;
	for (int round = 0; round < 40; round++) {
		for (size_t i = 0; i < batch; i++) {
			char id[32];

			snprintf(id, sizeof(id), "e%zu", made++);
			assert_int_equal(ut_create(id, NULL), 0);
			append_msg(id, HISTD__V1__ROLE__ROLE_USER, "hi", NULL,
				   NULL);
		}
		held = histd_context_entries(ctx);
		if (made > 4 * batch && held < bound)
			break;
	}
	if (held >= bound)
		fail_msg("%zu entries held after %zu sessions", held, made);
}

/* Three turns of `tag` questions, answers and results: 12 messages. */
static void
tagged_turns(const char *id, const char *tag)
{
	for (int i = 0; i < 3; i++) {
		char q[64], c[32], a[64];

		snprintf(q, sizeof(q), "%s question %d.", tag, i);
		snprintf(c, sizeof(c), "call-%s-%d", tag, i);
		snprintf(a, sizeof(a), "%s answer %d.", tag, i);
		turn_of(id, q, c, "result text", a);
	}
}

/* The summary a CONTEXT read shows is known per revision of a session: a
 * session deleted and made again under the same id, at the same revision,
 * shows its own summary, not the one before. */
static void
a_session_made_again_shows_its_own_summary(void **state)
{
	static const char *const pl[] = {
		"compaction", "keep_recent", "2", NULL };
	Histd__V1__DeleteSessionRequest del =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;
	uint64_t first_revision;

	(void)state;
	assert_int_equal(ut_create("again", pl), 0);
	tagged_turns("again", "First");
	assert_int_equal(reduce("again", &rr), 0);
	ut_free_msg(rr);
	for (int k = 0; k < 2; k++) {      /* the second read is cached */
		g = get("again", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
		assert_non_null(g->summary);
		assert_non_null(strstr(tc_text_of(g->messages[0]),
				       "First question 0."));
		first_revision = g->revision;
		ut_free_msg(g);
	}

	del.session_id = "again";
	assert_int_equal(ut_call(HISTD_M_DELETE_SESSION, &del.base, NULL, NULL),
			 0);
	assert_int_equal(ut_create("again", pl), 0);
	tagged_turns("again", "Second");
	assert_int_equal(reduce("again", &rr), 0);
	ut_free_msg(rr);
	g = get("again", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_int_equal(g->revision, first_revision);
	assert_non_null(g->summary);
	assert_non_null(strstr(tc_text_of(g->messages[0]),
			       "Second question 0."));
	assert_null(strstr(tc_text_of(g->messages[0]), "First question"));
	ut_free_msg(g);
}

static void
masked_results_are_markers_and_get_tool_result_has_the_original(void **state)
{
	static const char *const pl[] = {
		"masking", "keep_recent_results", "1", NULL };
	Histd__V1__GetToolResultRequest r =
		HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	Histd__V1__GetToolResultResponse *tr;
	Histd__V1__GetMessagesResponse *g;
	int masked = 0;

	(void)state;
	assert_int_equal(ut_create("s2", pl), 0);
	for (int i = 0; i < 3; i++)
		turn("s2", i);
	g = get("s2", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_int_equal(g->n_messages, 12);
	for (size_t i = 0; i < g->n_messages; i++) {
		const Histd__V1__ContentBlock *b = g->messages[i]->content[0];

		if (b->block_case != HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
			continue;
		if (strstr(b->tool_result->content[0]->text->text,
			   "[tool result masked: "))
			masked++;
	}
	assert_int_equal(masked, 2);
	ut_free_msg(g);
	r.session_id = "s2";
	r.tool_call_id = "call-0";
	assert_int_equal(ut_call(HISTD_M_GET_TOOL_RESULT, &r.base,
		&histd__v1__get_tool_result_response__descriptor,
		(void **)&tr), 0);
	assert_string_equal(tr->result->content[0]->text->text,
		"file contents that are long enough to be worth masking");
	ut_free_msg(tr);
}

static void
the_default_pipeline_applies_when_the_config_has_none(void **state)
{
	static const char *const empty[] = { NULL };
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	teardown(NULL);
	assert_int_equal(start("window:max_messages=4", 0), 0);
	assert_int_equal(ut_create("d", NULL), 0);
	assert_int_equal(ut_create("e", empty), 0);
	for (int i = 0; i < 3; i++) {
		turn("d", i);
		turn("e", i);
	}
	g = get("d", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_int_equal(g->n_messages, 4);
	ut_free_msg(g);
	/* Set and empty: no pipeline. */
	g = get("e", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_int_equal(g->n_messages, 12);
	ut_free_msg(g);
}

static void
a_bad_pipeline_is_invalid_argument_at_create_and_update(void **state)
{
	static const char *const bad[] = {
		"masking", "include_tools", "a", "masking", "exclude_tools", "b",
		NULL };
	static const char *const unknown[] = { "tokenizer", NULL, NULL, NULL };
	Histd__V1__UpdateSessionRequest u = HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT, *pcs = &pc;
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	char *path = "config";

	(void)state;
	assert_int_equal(ut_create("b1", bad), HISTD_EINVALID);
	assert_int_equal(ut_create("b2", unknown), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].name: unknown plugin");
	assert_int_equal(ut_create("b3", NULL), 0);
	pc.name = "window";
	pl.plugins = &pcs;
	pl.n_plugins = 1;
	c.pipeline = &pl;
	u.session_id = "b3";
	u.config = &c;
	mask.paths = &path;
	mask.n_paths = 1;
	u.update_mask = &mask;
	assert_int_equal(ut_call(HISTD_M_UPDATE_SESSION, &u.base, NULL, NULL),
			 HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options: max_messages or "
		"max_tokens is required (above 0; 0 means no limit)");
}

/* Deletes "remade" and creates it again with other turns, from inside a
 * summarizer call on it: a client starting over while the provider
 * works. */
static const char *const remade_pl[] = {
	"compaction", "summarizer", "failing",
	"compaction", "keep_recent", "2", NULL };

static void
remake(void)
{
	Histd__V1__DeleteSessionRequest del =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;

	del.session_id = "remade";
	assert_int_equal(ut_call(HISTD_M_DELETE_SESSION, &del.base, NULL, NULL),
			 0);
	assert_int_equal(ut_create("remade", remade_pl), 0);
	tagged_turns("remade", "Second");
}

/* The read hook's work: once, at the system index's scan of "mix" (a
 * read from seq 0, not of the newest) on the test's own thread (not the
 * context's worker), the session is made again with a system message of
 * its own. */
static int mix_fired;
static pthread_t mix_thread;
static const char *const mix_pl[] = { "window", "max_messages", "5", NULL };

static void
remake_mix_at_the_scan(const histd_read *q)
{
	Histd__V1__DeleteSessionRequest del =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;

	if (!pthread_equal(pthread_self(), mix_thread) || mix_fired ||
	    strcmp(q->session_id, "mix") || q->last_n || q->after_seq)
		return;
	mix_fired = 1;
	del.session_id = "mix";
	assert_int_equal(ut_call(HISTD_M_DELETE_SESSION, &del.base, NULL, NULL),
			 0);
	assert_int_equal(ut_create("mix", mix_pl), 0);
	append_msg("mix", HISTD__V1__ROLE__ROLE_SYSTEM, "second life system",
		   NULL, NULL);
	append_msg("mix", HISTD__V1__ROLE__ROLE_USER, "second life user",
		   NULL, NULL);
}

/* A session deleted and made again between the CONTEXT view's read of
 * the newest messages and its scan for the system messages before them:
 * the view is one life's, never the new system message over the old
 * tail. */
static void
a_view_never_mixes_two_lives_of_a_session(void **state)
{
	Histd__V1__GetMessagesResponse *g;
	int first = 0, second = 0;

	(void)state;
	/* Entries idle for a microsecond are freed as others are made: the
	 * view's read finds no system index for "mix" and scans for it. */
	teardown(NULL);
	next_entry_idle_us = 1;
	assert_int_equal(start("", 0), 0);
	next_entry_idle_us = 0;
	assert_int_equal(ut_create("mix", mix_pl), 0);
	append_msg("mix", HISTD__V1__ROLE__ROLE_SYSTEM, "first life system",
		   NULL, NULL);
	for (int i = 0; i < 60; i++)
		append_msg("mix", HISTD__V1__ROLE__ROLE_USER, "first life user",
			   NULL, NULL);
	usleep(1000);
	assert_int_equal(ut_create("other", NULL), 0);
	append_msg("other", HISTD__V1__ROLE__ROLE_USER, "x", NULL, NULL);
	mix_fired = 0;
	mix_thread = pthread_self();
	histd_memory_read_test_hook = remake_mix_at_the_scan;
	g = get_last("mix", 5);
	histd_memory_read_test_hook = NULL;
	assert_int_equal(mix_fired, 1);
	for (size_t i = 0; i < g->n_messages; i++) {
		const Histd__V1__Message *m = g->messages[i];
		const char *t = m->n_content && m->content[0]->text
				? m->content[0]->text->text : "";

		first += strncmp(t, "first life", 10) == 0;
		second += strncmp(t, "second life", 11) == 0;
	}
	if (first && second)
		fail_msg("the view holds %d messages of the first life and %d "
			 "of the second", first, second);
	assert_int_equal(second, 2);
	histd__v1__get_messages_response__free_unpacked(g, NULL);
}

/* The summary of the first conversation is not stored on the second,
 * though it has as many messages: its CONTEXT view is its own. */
static void
a_reduce_of_a_session_made_again_meanwhile_stores_nothing(void **state)
{
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	assert_int_equal(ut_create("remade", remade_pl), 0);
	tagged_turns("remade", "First");
	in_call = remake;
	assert_int_equal(reduce("remade", &rr), 0);
	assert_null(rr->summary);
	ut_free_msg(rr);
	assert_null(in_call);
	g = get("remade", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_null(g->summary);
	assert_int_equal(g->n_messages, 12);
	assert_non_null(strstr(tc_text_of(g->messages[0]),
			       "Second question 0."));
	ut_free_msg(g);
}

/* The first conversation's failed compaction is the caller's error, and
 * not reported to the second one's subscribers. */
static void
a_failed_reduce_of_a_session_made_again_meanwhile_is_not_reported(void **state)
{
	Histd__V1__ReduceResponse *rr;

	(void)state;
	assert_int_equal(ut_create("remade", remade_pl), 0);
	tagged_turns("remade", "First");
	fail_left = 1;
	in_call = remake;
	assert_int_equal(reduce("remade", &rr), HISTD_EUNAVAILABLE);
	assert_null(in_call);
	assert_int_equal(sink_calls, 0);
	/* A failure of the session that is there now is reported. */
	fail_left = 1;
	assert_int_equal(reduce("remade", &rr), HISTD_EUNAVAILABLE);
	assert_int_equal(sink_calls, 1);
}

static void
a_failed_reduce_leaves_history_unchanged_and_is_reported(void **state)
{
	static const char *const pl[] = {
		"compaction", "summarizer", "failing",
		"compaction", "keep_recent", "2", NULL };
	Histd__V1__GetSessionRequest gs = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__Session *before, *after;
	Histd__V1__ReduceResponse *rr;

	(void)state;
	assert_int_equal(ut_create("f1", pl), 0);
	for (int i = 0; i < 3; i++)
		turn("f1", i);
	gs.session_id = "f1";
	assert_int_equal(ut_call(HISTD_M_GET_SESSION, &gs.base,
		&histd__v1__session__descriptor, (void **)&before), 0);
	fail_left = 100;
	assert_int_equal(reduce("f1", &rr), HISTD_EUNAVAILABLE);
	assert_int_equal(ut_call(HISTD_M_GET_SESSION, &gs.base,
		&histd__v1__session__descriptor, (void **)&after), 0);
	assert_int_equal(after->revision, before->revision);
	assert_int_equal(after->stats->summary_count, 0);
	assert_int_equal(sink_calls, 1);
	assert_int_equal(sink_retry_calls, 0);
	assert_non_null(strstr(sink_msg, "compaction: compaction failed "
			       "(UNAVAILABLE)"));
	/* No conversation text in the report. */
	assert_null(strstr(sink_msg, "Question"));
	ut_free_msg(before);
	ut_free_msg(after);
	/* It works once the provider is back. */
	fail_left = 0;
	assert_int_equal(reduce("f1", &rr), 0);
	assert_non_null(rr->summary);
	ut_free_msg(rr);
}

static void
auto_reduce_compacts_off_the_request_path_and_retries_with_backoff(void **state)
{
	static const char *const pl[] = {
		"compaction", "summarizer", "failing",
		"compaction", "keep_recent", "2",
		"compaction", "auto_reduce_when", "messages>=12", NULL };
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	assert_int_equal(ut_create("a1", pl), 0);
	fail_left = 2;
	for (int i = 0; i < 2; i++)
		turn("a1", i);
	/* 8 messages: below the threshold, nothing runs. */
	assert_int_equal(histd_context_wait_idle(ctx, 5000), 0);
	assert_int_equal(calls, 0);
	turn("a1", 2);
	/* 12: the worker compacts; two failures, retried after 50 and
	 * 100 ms, then it works. */
	assert_int_equal(histd_context_wait_idle(ctx, 10000), 0);
	assert_int_equal(calls, 3);
	assert_int_equal(sink_calls, 2);
	assert_int_equal(sink_retry_calls, 2);
	g = get("a1", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_non_null(g->summary);
	assert_provider_valid(g);
	/* keep_recent 2 and a safe start: the last turn's answer pair. */
	assert_true(g->summary->covers_to_seq >= 8);
	ut_free_msg(g);
}

struct racer {
	const char *id;
	int rc;
	uint64_t covers_to;
};

static void *
reduce_thread(void *arg)
{
	struct racer *r = arg;
	Histd__V1__ReduceResponse *rr = NULL;

	r->rc = reduce(r->id, &rr);
	if (!r->rc && rr && rr->summary)
		r->covers_to = rr->summary->covers_to_seq;
	ut_free_msg(rr);
	return NULL;
}

static void
appends_racing_a_compaction_lose_nothing(void **state)
{
	static const char *const pl[] = {
		"compaction", "summarizer", "slow",
		"compaction", "keep_recent", "4", NULL };
	/* Static: a failing turn() below leaves the frame while the two
	 * Reduce threads still write their results. */
	static struct racer r, r2;
	Histd__V1__GetMessagesResponse *g, *raw;
	pthread_t t, t2;
	uint64_t expect;

	(void)state;
	r = (struct racer){ "r1", -1, 0 };
	r2 = r;
	assert_int_equal(ut_create("r1", pl), 0);
	append_msg("r1", HISTD__V1__ROLE__ROLE_SYSTEM, "sys", NULL, NULL);
	for (int i = 0; i < 10; i++)
		turn("r1", i);
	slow_ms = 300;
	assert_int_equal(pthread_create(&t, NULL, reduce_thread, &r), 0);
	if (pthread_create(&t2, NULL, reduce_thread, &r2) != 0) {
		pthread_join(t, NULL);
		fail_msg("cannot start the second Reduce thread");
	}
	/* 10 more turns while the summarizer sleeps. */
	for (int i = 10; i < 20; i++)
		turn("r1", i);
	pthread_join(t, NULL);
	pthread_join(t2, NULL);
	assert_int_equal(r.rc, 0);
	assert_int_equal(r2.rc, 0);
	/* One compaction at a time per session. */
	assert_int_equal(max_running, 1);

	raw = get("r1", HISTD__V1__VIEW__VIEW_RAW, 1000);
	assert_int_equal(raw->n_messages, 81);
	g = get("r1", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_provider_valid(g);
	assert_non_null(g->summary);
	/* system + summary + every message after the covered range. */
	expect = 81 - g->summary->covers_to_seq;
	assert_int_equal(g->n_messages, 2 + expect);
	assert_int_equal(g->messages[g->n_messages - 1]->seq, 81);
	ut_free_msg(raw);
	ut_free_msg(g);
}

static void
ttl_deletes_idle_sessions_only(void **state)
{
	struct timespec ts = { 0, 300 * 1000000 };
	Histd__V1__GetSessionRequest gs = HISTD__V1__GET_SESSION_REQUEST__INIT;

	(void)state;
	teardown(NULL);
	assert_int_equal(start("", 200000), 0);
	assert_int_equal(ut_create("old", NULL), 0);
	assert_int_equal(ut_create("new", NULL), 0);
	turn("old", 0);
	nanosleep(&ts, NULL);
	turn("new", 0);
	assert_int_equal(histd_context_sweep(ctx), 1);
	gs.session_id = "old";
	assert_int_equal(ut_call(HISTD_M_GET_SESSION, &gs.base, NULL, NULL),
			 HISTD_ENOTFOUND);
	gs.session_id = "new";
	assert_int_equal(ut_call(HISTD_M_GET_SESSION, &gs.base, NULL, NULL), 0);
}

/* Sessions stored by another process (written to the driver, never
 * served here), in more tenants than the sweeper once remembered (256):
 * the sweep finds them all through the driver. */
static void
ttl_sweeps_every_tenant_in_storage(void **state)
{
	enum { N = 300 };
	char tenant[32];

	(void)state;
	teardown(NULL);
	assert_int_equal(start("", 200000), 0);
	for (int i = 0; i < N; i++) {
		histd_session in = { 0 }, *out = NULL;

		snprintf(tenant, sizeof(tenant), "stored-%03d", i);
		in.tenant = tenant;
		in.id = "idle";
		in.created_at_us = in.updated_at_us = histd_now_us() - 1000000;
		assert_int_equal(histd_driver_session_create(drv, &in, &out), 0);
		histd_session_free(out);
	}
	/* One of the caller's, fresh: it stays. */
	assert_int_equal(ut_create("fresh", NULL), 0);
	assert_int_equal(histd_context_sweep(ctx), N);
	for (int i = 0; i < N; i += 37) {
		histd_session *s = NULL;

		snprintf(tenant, sizeof(tenant), "stored-%03d", i);
		assert_int_equal(histd_driver_session_get(drv, tenant, "idle",
							  &s), HISTD_ENOTFOUND);
	}
	assert_int_equal(histd_context_sweep(ctx), 0);
}

/* Stopping the context ends a running TTL sweep between sessions:
 * shutdown does not wait for a whole backlog of expired sessions to be
 * deleted one by one (under --shutdown-grace and Kubernetes' grace). */
static void
stopping_ends_a_ttl_sweep_between_sessions(void **state)
{
	enum { N = 100000 };
	histd_driver_config dc = { 0 };
	histd_context_config cc = { 0 };
	histd_driver *d = NULL;
	histd_context *x = NULL;
	histd_session *s = NULL;
	char id[32];

	(void)state;
	teardown(NULL);
	assert_int_equal(histd_driver_open("memory", &dc, &d), 0);
	for (int i = 0; i < N; i++) {
		histd_session in = { 0 }, *out = NULL;

		snprintf(id, sizeof(id), "idle-%06d", i);
		in.tenant = "stored";
		in.id = id;
		in.created_at_us = in.updated_at_us = histd_now_us() - 10000000;
		assert_int_equal(histd_driver_session_create(d, &in, &out), 0);
		histd_session_free(out);
	}
	cc.session_ttl_us = 1000000;
	cc.sweep_interval_us = 1000;
	assert_int_equal(histd_context_new(&x, d, &cc), 0);
	/* The sweep has begun: the first session (in id order) is gone. */
	while (histd_driver_session_get(d, "stored", "idle-000000", &s) == 0) {
		histd_session_free(s);
		s = NULL;
		usleep(1000);
	}
	histd_context_free(x);
	/* It stopped there: the last one is left for the next start. */
	assert_int_equal(histd_driver_session_get(d, "stored", "idle-099999", &s), 0);
	histd_session_free(s);
	histd_driver_close(d);
	assert_int_equal(start("", 0), 0);
}

static void
context_of_a_long_session_reads_only_its_tail(void **state)
{
	static const char *const pl[] = {
		"masking", "keep_recent_results", "2",
		"window", "max_messages", "20", NULL };
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	assert_int_equal(ut_create("long", pl), 0);
	append_msg("long", HISTD__V1__ROLE__ROLE_SYSTEM, "sys", NULL, NULL);
	for (int i = 0; i < 500; i++)
		turn("long", i);
	for (int k = 0; k < 3; k++) {
		static const uint64_t last[] = { 2001, 2006, 2010 };

		g = get("long", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
		assert_string_equal(tc_text_of(g->messages[0]), "sys");
		if (k > 0)
			assert_string_equal(tc_text_of(g->messages[1]), "sys2");
		assert_true(g->n_messages <= 22);
		assert_int_equal(g->messages[g->n_messages - 1]->seq, last[k]);
		assert_provider_valid(g);
		ut_free_msg(g);
		/* A new system message late in the session joins the view. */
		if (k == 0)
			append_msg("long", HISTD__V1__ROLE__ROLE_SYSTEM, "sys2",
				   NULL, NULL);
		turn("long", 1000 + k);
	}
}

/* Records the CONTEXT reads of "tail" asked the driver for: the newest
 * (last_n) and pages from a seq (limit, the system index's scan). */
static uint64_t tail_asked, scan_asked, tail_passes;
static pthread_t tail_thread;

/* Counts the test thread's reads (not the context worker's). */
static void
count_tail_reads(const histd_read *q)
{
	if (!pthread_equal(pthread_self(), tail_thread) ||
	    strcmp(q->session_id, "tail"))
		return;
	if (q->last_n) {
		tail_asked += q->last_n;
		tail_passes++;
	} else
		scan_asked += q->limit;
}

/* Appends n user messages "m<i>" to id, 1000 to an Append. */
static void
append_many(const char *id, int n)
{
	static Histd__V1__Message m[1000], *mp[1000];
	static Histd__V1__ContentBlock b[1000], *bp[1000];
	static Histd__V1__TextBlock t[1000];
	static char text[1000][16];

	for (int done = 0; done < n;) {
		Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
		int k = n - done < 1000 ? n - done : 1000;

		for (int i = 0; i < k; i++) {
			histd__v1__message__init(&m[i]);
			histd__v1__content_block__init(&b[i]);
			histd__v1__text_block__init(&t[i]);
			snprintf(text[i], sizeof(text[i]), "m%d", done + i);
			t[i].text = text[i];
			b[i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
			b[i].text = &t[i];
			bp[i] = &b[i];
			m[i].role = HISTD__V1__ROLE__ROLE_USER;
			m[i].content = &bp[i];
			m[i].n_content = 1;
			mp[i] = &m[i];
		}
		r.session_id = (char *)id;
		r.messages = mp;
		r.n_messages = (size_t)k;
		if (ut_call(HISTD_M_APPEND, &r.base, NULL, NULL))
			fail_msg("append: %s", histd_error_message());
		done += k;
	}
}

/* "tail": no transform, a system message, then 20,000 user messages; the
 * test thread's reads of it counted from now on. */
static void
long_session_counted(void)
{
	static const char *const empty[] = { NULL };

	assert_int_equal(ut_create("tail", empty), 0);
	append_msg("tail", HISTD__V1__ROLE__ROLE_SYSTEM, "sys", NULL, NULL);
	append_many("tail", 20000);
	tail_thread = pthread_self();
	histd_memory_read_test_hook = count_tail_reads;
}

/* With no transform in the pipeline (the default empty one), a CONTEXT
 * read with last_n loads the newest messages it needs, as RAW does, not
 * the whole session: the records it asks the driver for do not grow with
 * the session. (The system index scans the older messages once, at the
 * first read, and keeps them.) */
static void
context_last_n_without_transforms_loads_only_the_tail(void **state)
{
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	long_session_counted();
	for (int k = 0; k < 2; k++) {
		tail_asked = scan_asked = 0;
		g = get_last("tail", 10);
		assert_int_equal(g->n_messages, 11);
		assert_string_equal(tc_text_of(g->messages[0]), "sys");
		assert_int_equal(g->messages[1]->seq, 20001 - 9);
		assert_int_equal(g->messages[10]->seq, 20001);
		ut_free_msg(g);
		if (tail_asked > 64)
			fail_msg("read %d asked for the newest %llu records", k,
				 (unsigned long long)tail_asked);
		/* Once scanned, the index is not scanned again. */
		if (k > 0)
			assert_int_equal(scan_asked, 0);
	}
	histd_memory_read_test_hook = NULL;
}

/* Packed messages of two views are the same, in order (but for
 * created_at: the two sessions were written at different times). */
static void
assert_same_messages(const Histd__V1__GetMessagesResponse *x,
		     const Histd__V1__GetMessagesResponse *y)
{
	assert_int_equal(x->n_messages, y->n_messages);
	assert_int_equal(x->token_estimate, y->token_estimate);
	for (size_t i = 0; i < x->n_messages; i++) {
		Google__Protobuf__Timestamp *ta = x->messages[i]->created_at;
		Google__Protobuf__Timestamp *tb = y->messages[i]->created_at;
		size_t n;
		uint8_t *a, *b;

		x->messages[i]->created_at = NULL;
		y->messages[i]->created_at = NULL;
		n = histd__v1__message__get_packed_size(x->messages[i]);
		a = malloc(n);
		b = malloc(n);

		assert_int_equal(n, histd__v1__message__get_packed_size(
					    y->messages[i]));
		histd__v1__message__pack(x->messages[i], a);
		histd__v1__message__pack(y->messages[i], b);
		x->messages[i]->created_at = ta;
		y->messages[i]->created_at = tb;
		assert_memory_equal(a, b, n);
		free(a);
		free(b);
	}
}

/*
 * A window of max_messages N makes a CONTEXT read load the newest N + 1
 * messages (the newest_needed hint) rather than 32: the view must be the
 * one a read of everything gives. Session "hint-<N>" has masking then the
 * window; "all-<N>" the same behind a window of 1,000,000 messages, whose
 * hint loads the whole session and which changes nothing. After every
 * append, with tool turns of one and of two parallel calls, both views
 * are equal.
 */
static void
the_window_hint_loads_less_and_changes_nothing(void **state)
{
	(void)state;
	for (int w = 3; w <= 7; w += 2) {
		char ws[16], hint[32], all[32];
		const char *const pl[] = {
			"masking", "keep_recent_results", "1",
			"window", "max_messages", ws, NULL };
		const char *const pl_all[] = {
			"window", "max_messages", "1000000",
			"masking", "keep_recent_results", "1",
			"window", "max_messages", ws, NULL };
		int msgs = 0;

		snprintf(ws, sizeof(ws), "%d", w);
		snprintf(hint, sizeof(hint), "hint-%d", w);
		snprintf(all, sizeof(all), "all-%d", w);
		assert_int_equal(ut_create(hint, pl), 0);
		assert_int_equal(ut_create(all, pl_all), 0);
		for (int i = 0; i < 12; i++) {
			const char *ids[2] = { NULL, NULL };
			char c0[32], c1[32];
			Histd__V1__Role roles[6];
			const char *texts[6], *calls[6], *results[6];
			int n = 0;

			snprintf(c0, sizeof(c0), "c%d-0", i);
			snprintf(c1, sizeof(c1), "c%d-1", i);
			ids[0] = c0;
			ids[1] = i % 3 == 1 ? c1 : NULL;
			roles[n] = HISTD__V1__ROLE__ROLE_USER;
			texts[n] = "Question.";
			calls[n] = results[n] = NULL;
			n++;
			for (int k = 0; k < 2 && ids[k]; k++) {
				roles[n] = HISTD__V1__ROLE__ROLE_ASSISTANT;
				texts[n] = NULL;
				calls[n] = ids[k];
				results[n] = NULL;
				n++;
			}
			for (int k = 0; k < 2 && ids[k]; k++) {
				roles[n] = HISTD__V1__ROLE__ROLE_TOOL;
				texts[n] = "a result long enough to mask";
				calls[n] = NULL;
				results[n] = ids[k];
				n++;
			}
			roles[n] = HISTD__V1__ROLE__ROLE_ASSISTANT;
			texts[n] = "Answer.";
			calls[n] = results[n] = NULL;
			n++;
			for (int k = 0; k < n; k++) {
				Histd__V1__GetMessagesResponse *x, *y;

				append_msg(hint, roles[k], texts[k], calls[k],
					   results[k]);
				append_msg(all, roles[k], texts[k], calls[k],
					   results[k]);
				msgs++;
				x = get(hint, HISTD__V1__VIEW__VIEW_CONTEXT, 0);
				y = get(all, HISTD__V1__VIEW__VIEW_CONTEXT, 0);
				assert_same_messages(x, y);
				if (msgs > w + 4)
					assert_true(x->n_messages <=
						    (size_t)w);
				ut_free_msg(x);
				ut_free_msg(y);
			}
		}
	}
}

/*
 * Message i of the script that "tail" (no transform) and "full" (a window
 * too wide to cut, so every read loads everything) both get: a system
 * message at 0 and mid-history at 60, a tool call at 5 answered 95
 * messages later, whose result the newest messages hold for a while, and
 * turns of question, call, result and answer. text: every text, or NULL
 * for short ones.
 */
static void
append_to_both(int i, const char *text)
{
	const char *const ids[] = { "tail", "full" };
	char c[32];

	snprintf(c, sizeof(c), "c%d", i / 5);
	for (int s = 0; s < 2; s++) {
		const char *id = ids[s];

		if (i == 0 || i == 60)
			append_msg(id, HISTD__V1__ROLE__ROLE_SYSTEM,
				   text ? text : "sys", NULL, NULL);
		else if (i == 5)
			append_msg(id, HISTD__V1__ROLE__ROLE_ASSISTANT, NULL,
				   "late", NULL);
		else if (i == 100)
			append_msg(id, HISTD__V1__ROLE__ROLE_TOOL,
				   text ? text : "late result", NULL, "late");
		else if (i % 5 == 1)
			append_msg(id, HISTD__V1__ROLE__ROLE_ASSISTANT, NULL,
				   c, NULL);
		else if (i % 5 == 2)
			append_msg(id, HISTD__V1__ROLE__ROLE_TOOL,
				   text ? text : "result", NULL, c);
		else if (i % 5 == 3)
			append_msg(id, HISTD__V1__ROLE__ROLE_ASSISTANT,
				   text ? text : "Answer.", NULL, NULL);
		else
			append_msg(id, HISTD__V1__ROLE__ROLE_USER,
				   text ? text : "Question.", NULL, NULL);
	}
}

static int
create_tail_and_full(void)
{
	static const char *const empty[] = { NULL };
	static const char *const full[] = {
		"window", "max_messages", "10000000", NULL };

	return ut_create("tail", empty) || ut_create("full", full);
}

/*
 * A CONTEXT last_n read that loads only the newest messages (no
 * transform) shows what one of the whole session shows, after every
 * append of append_to_both's script.
 */
static void
context_last_n_of_the_tail_is_that_of_the_whole_session(void **state)
{
	static const uint32_t last_n[] = { 1, 5, 10, 40 };

	(void)state;
	assert_int_equal(create_tail_and_full(), 0);
	for (int i = 0; i < 150; i++) {
		append_to_both(i, NULL);
		for (size_t k = 0; k < sizeof(last_n) / sizeof(last_n[0]);
		     k++) {
			Histd__V1__GetMessagesResponse *x, *y;

			x = get_last("tail", last_n[k]);
			y = get_last("full", last_n[k]);
			assert_same_messages(x, y);
			ut_free_msg(x);
			ut_free_msg(y);
		}
	}
}

/* A CONTEXT read (last_n: 0 for none) of a response of at most max
 * bytes, straight from the context. */
static Histd__V1__GetMessagesResponse *
get_within(const char *id, uint32_t last_n, size_t max)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetMessagesResponse *g;
	uint8_t *out = NULL;
	size_t len = 0;

	r.session_id = (char *)id;
	r.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	r.last_n = last_n;
	if (histd_context_get_messages(ctx, drv, "alice", &r, max, &out, &len))
		fail_msg("get: %s", histd_error_message());
	g = histd__v1__get_messages_response__unpack(NULL, len, out);
	free(out);
	assert_non_null(g);
	return g;
}

/*
 * A CONTEXT read within a response size that loads only the newest
 * messages (no transform) shows what one of the whole session shows,
 * after every append of append_to_both's script with texts of several
 * sizes: with and without last_n.
 */
static void
context_within_a_size_is_that_of_the_whole_session(void **state)
{
	static const uint32_t last_n[] = { 0, 3, 40 };
	static const size_t max[] = { 300, 700, 2000, 6000 };

	(void)state;
	assert_int_equal(create_tail_and_full(), 0);
	for (int i = 0; i < 150; i++) {
		char text[200];

		snprintf(text, sizeof(text), "%.*s", 10 + (i * 37) % 150,
			 "Lorem ipsum dolor sit amet, consectetur adipiscing "
			 "elit, sed do eiusmod tempor incididunt ut labore et "
			 "dolore magna aliqua. Ut enim ad minim veniam, quis "
			 "nostrud exercitation.");
		append_to_both(i, text);
		for (size_t k = 0; k < sizeof(last_n) / sizeof(last_n[0]);
		     k++) {
			for (size_t m = 0; m < sizeof(max) / sizeof(max[0]);
			     m++) {
				Histd__V1__GetMessagesResponse *x, *y;

				x = get_within("tail", last_n[k], max[m]);
				y = get_within("full", last_n[k], max[m]);
				assert_same_messages(x, y);
				ut_free_msg(x);
				ut_free_msg(y);
			}
		}
	}
}

/*
 * With no transform in the pipeline, a CONTEXT read loads the newest
 * messages that decide what fits the response, not the whole session,
 * with or without last_n (here far above the session's length); the
 * next read starts where the last one ended. What comes back is the
 * newest messages that fit, after the system message.
 */
static void
context_without_transforms_loads_what_fits_the_response(void **state)
{
	static const uint32_t last_n[] = { 0, 1000000 };
	const size_t max = 2000;

	(void)state;
	long_session_counted();
	for (size_t k = 0; k < 2 * sizeof(last_n) / sizeof(last_n[0]); k++) {
		Histd__V1__GetMessagesResponse *g;
		size_t bytes;

		tail_asked = scan_asked = tail_passes = 0;
		g = get_within("tail", last_n[k / 2], max);
		bytes = histd__v1__get_messages_response__get_packed_size(g);
		assert_true(g->n_messages > 10);
		assert_true(bytes <= max);
		assert_string_equal(tc_text_of(g->messages[0]), "sys");
		assert_int_equal(g->messages[1]->seq,
				 20002 - (g->n_messages - 1));
		assert_int_equal(g->messages[g->n_messages - 1]->seq, 20001);
		ut_free_msg(g);
		if (tail_asked > 4096)
			fail_msg("read %zu (last_n %u) asked for the newest "
				 "%llu records", k, last_n[k / 2],
				 (unsigned long long)tail_asked);
		/* A read without last_n starts where the last one ended:
		 * one pass. */
		if (k == 1 && tail_passes != 1)
			fail_msg("the second read took %llu passes",
				 (unsigned long long)tail_passes);
	}
	histd_memory_read_test_hook = NULL;
}

/*
 * A Reduce whose bounds would cover an assistant tool call whose result
 * has not come yet stops before that message: the result, appended
 * later, shows in the CONTEXT view with its call.
 */
static void
reduce_never_covers_a_call_waiting_for_its_result(void **state)
{
	static const char *const pl[] = {
		"compaction", "keep_recent", "0", NULL };
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;
	int call, result;

	(void)state;
	assert_int_equal(ut_create("p1", pl), 0);
	append_msg("p1", HISTD__V1__ROLE__ROLE_USER, "Look up the weather.",
		   NULL, NULL);
	append_msg("p1", HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, "w1", NULL);
	/* One message at most: the bound asks to cover both. */
	assert_int_equal(reduce_bounded("p1", 1, 0, &rr), 0);
	assert_non_null(rr->summary);
	assert_int_equal(rr->summary->covers_to_seq, 1);
	ut_free_msg(rr);
	/* No bound: everything but the tail, still not the waiting call. */
	assert_int_equal(reduce("p1", &rr), 0);
	assert_null(rr->summary);
	ut_free_msg(rr);

	append_msg("p1", HISTD__V1__ROLE__ROLE_TOOL, "18 C and sunny.", NULL,
		   "w1");
	append_msg("p1", HISTD__V1__ROLE__ROLE_ASSISTANT, "It is 18 C.", NULL,
		   NULL);
	g = get("p1", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_provider_valid(g);
	assert_non_null(g->summary);
	call = tool_block_at(g, 1, "w1");
	result = tool_block_at(g, 0, "w1");
	assert_int_equal(call, 1);
	assert_int_equal(result, 2);
	assert_int_equal(g->n_messages, 4);
	ut_free_msg(g);

	/* Answered, the pair may be covered, together. */
	assert_int_equal(reduce("p1", &rr), 0);
	assert_non_null(rr->summary);
	assert_int_equal(rr->summary->covers_to_seq, 4);
	ut_free_msg(rr);
}

/* The same for automatic compaction: a call still running while others
 * talk on is not covered, and its result shows with it. */
static void
auto_compaction_never_covers_a_call_waiting_for_its_result(void **state)
{
	static const char *const pl[] = {
		"compaction", "keep_recent", "1",
		"compaction", "auto_reduce_when", "messages>=6", NULL };
	Histd__V1__GetMessagesResponse *g;
	Histd__V1__Session *se;

	(void)state;
	assert_int_equal(ut_create("p2", pl), 0);
	append_msg("p2", HISTD__V1__ROLE__ROLE_USER, "Start the long build.",
		   NULL, NULL);
	append_msg("p2", HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, "build1", NULL);
	for (int i = 0; i < 5; i++)
		append_msg("p2", HISTD__V1__ROLE__ROLE_USER,
			   "A message from another participant.", NULL, NULL);
	assert_int_equal(histd_context_wait_idle(ctx, 10000), 0);
	se = session("p2");
	assert_int_equal(se->stats->summary_count, 1);
	ut_free_msg(se);

	append_msg("p2", HISTD__V1__ROLE__ROLE_TOOL, "BUILD OK.", NULL,
		   "build1");
	assert_int_equal(histd_context_wait_idle(ctx, 10000), 0);
	g = get("p2", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_provider_valid(g);
	assert_non_null(g->summary);
	assert_int_equal(g->summary->covers_to_seq, 1);
	assert_true(tool_block_at(g, 1, "build1") > 0);
	assert_int_equal(tool_block_at(g, 0, "build1"),
			 (int)g->n_messages - 1);
	ut_free_msg(g);
}

/* Retention deletes what its window dropped, but never a call whose
 * result has not come: the driver would forget the call and refuse the
 * result. */
static void
retention_never_deletes_a_call_waiting_for_its_result(void **state)
{
	static const char *const pl[] = {
		"window", "max_messages", "2",
		"window", "retention", "delete", NULL };
	Histd__V1__GetMessagesResponse *raw;

	(void)state;
	assert_int_equal(ut_create("d1", pl), 0);
	append_msg("d1", HISTD__V1__ROLE__ROLE_USER, "Start the long build.",
		   NULL, NULL);
	append_msg("d1", HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, "build1", NULL);
	for (int i = 0; i < 3; i++)
		append_msg("d1", HISTD__V1__ROLE__ROLE_USER,
			   "A message from another participant.", NULL, NULL);
	assert_int_equal(histd_context_wait_idle(ctx, 10000), 0);
	raw = get("d1", HISTD__V1__VIEW__VIEW_RAW, 100);
	/* The first message went; the call and what follows stay. */
	assert_int_equal(raw->n_messages, 4);
	assert_int_equal(raw->messages[0]->seq, 2);
	assert_int_equal(tool_block_at(raw, 1, "build1"), 0);
	ut_free_msg(raw);

	append_msg("d1", HISTD__V1__ROLE__ROLE_TOOL, "BUILD OK.", NULL,
		   "build1");
	assert_int_equal(histd_context_wait_idle(ctx, 10000), 0);
	raw = get("d1", HISTD__V1__VIEW__VIEW_RAW, 100);
	assert_int_equal(tool_block_at(raw, 0, "build1"),
			 (int)raw->n_messages - 1);
	ut_free_msg(raw);
}

/* A reducer of a loaded plugin that covers everything, whatever is
 * open: the host refuses its cut. */
static int
cover_all_configure(const histd_plugin_opt *o, size_t n, void **state,
		    char *err, size_t cap)
{
	(void)o;
	(void)n;
	(void)state;
	(void)err;
	(void)cap;
	return 0;
}

static void
cover_all_release(void *state)
{
	(void)state;
}

static int
cover_all_reduce(void *state, histd_reduce *r)
{
	(void)state;
	r->n_covered = r->n_messages;
	r->text = strdup("Everything so far.");
	r->model = strdup("cover-all");
	return 0;
}

static const histd_plugin cover_all = {
	.version = HISTD_PLUGIN_VERSION,
	.name = "cover_all",
	.configure = cover_all_configure,
	.release = cover_all_release,
	.reduce = cover_all_reduce,
};

static void
a_reducer_that_covers_a_call_waiting_for_its_result_is_refused(void **state)
{
	static const char *const pl[] = { "cover_all", NULL, NULL, NULL };
	Histd__V1__ReduceResponse *rr;
	Histd__V1__Session *se;
	int rc = histd_plugin_register(&cover_all);

	(void)state;
	assert_true(rc == 0 || rc == HISTD_EEXISTS);
	assert_int_equal(ut_create("p3", pl), 0);
	append_msg("p3", HISTD__V1__ROLE__ROLE_USER, "Look up the weather.",
		   NULL, NULL);
	append_msg("p3", HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, "w1", NULL);
	assert_int_equal(reduce("p3", &rr), HISTD_EINTERNAL);
	assert_string_equal(histd_error_message(),
		"the cover_all plugin's summary would split a tool call from "
		"its result or an assistant turn");
	se = session("p3");
	assert_int_equal(se->stats->summary_count, 0);
	ut_free_msg(se);
	assert_int_equal(sink_calls, 1);

	/* Answered, the same cut is safe. */
	append_msg("p3", HISTD__V1__ROLE__ROLE_TOOL, "18 C.", NULL, "w1");
	assert_int_equal(reduce("p3", &rr), 0);
	assert_non_null(rr->summary);
	assert_int_equal(rr->summary->covers_to_seq, 3);
	ut_free_msg(rr);
}

/* A summarizer that answers nothing (an Anthropic answer of thinking
 * blocks alone, white space): compaction fails, nothing is stored. */
static void
an_empty_summary_is_refused_and_nothing_is_stored(void **state)
{
	static const char *const pl[] = {
		"compaction", "summarizer", "fixed",
		"compaction", "keep_recent", "1", NULL };
	static const char *const empties[] = { "", " \n\t " };
	Histd__V1__ReduceResponse *rr;
	Histd__V1__Session *before, *after;

	(void)state;
	assert_int_equal(ut_create("e1", pl), 0);
	for (int i = 0; i < 2; i++)
		turn("e1", i);
	before = session("e1");
	for (int k = 0; k < 2; k++) {
		fixed_text = empties[k];
		assert_int_equal(reduce("e1", &rr), HISTD_EUNAVAILABLE);
		assert_string_equal(histd_error_message(),
			"the summarizer returned an empty summary");
		after = session("e1");
		assert_int_equal(after->revision, before->revision);
		assert_int_equal(after->stats->summary_count, 0);
		ut_free_msg(after);
		assert_int_equal(sink_calls, k + 1);
		assert_non_null(strstr(sink_msg, "compaction: compaction "
				       "failed (UNAVAILABLE): the summarizer "
				       "returned an empty summary"));
	}
	ut_free_msg(before);
	fixed_text = "The user asked two questions.";
	assert_int_equal(reduce("e1", &rr), 0);
	assert_non_null(rr->summary);
	assert_string_equal(rr->summary->text, fixed_text);
	ut_free_msg(rr);
}

/* A summary far above max_summary_tokens is cut to fit, on a UTF-8
 * boundary, before it is stored. */
static void
a_summary_above_max_summary_tokens_is_cut_to_fit(void **state)
{
	static const char *const pl[] = {
		"compaction", "summarizer", "fixed",
		"compaction", "keep_recent", "1",
		"compaction", "max_summary_tokens", "50", NULL };
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;
	/* "x" then 3-byte characters of 1/2 token each: 50 tokens end in
	 * the middle of none of them. */
	size_t n = 1 + 3 * 20000, len;
	char *huge = malloc(n + 1);

	(void)state;
	huge[0] = 'x';
	for (size_t i = 1; i < n; i += 3)
		memcpy(huge + i, "\xe2\x82\xac", 3);    /* U+20AC */
	huge[n] = '\0';
	fixed_text = huge;
	assert_int_equal(ut_create("h1", pl), 0);
	for (int i = 0; i < 2; i++)
		turn("h1", i);
	assert_int_equal(reduce("h1", &rr), 0);
	fixed_text = NULL;
	assert_non_null(rr->summary);
	len = strlen(rr->summary->text);
	/* x (1/4) + 99 characters (49 1/2): 50 tokens, 298 bytes. */
	assert_int_equal(len, 1 + 3 * 99);
	assert_true(utf8_ok(rr->summary->text, len));
	assert_memory_equal(rr->summary->text, huge, len);
	assert_true(histd_tokens_text(rr->summary->text, len) <= 50);
	ut_free_msg(rr);
	free(huge);

	g = get("h1", HISTD__V1__VIEW__VIEW_CONTEXT, 0);
	assert_non_null(g->summary);
	assert_true(strlen(tc_text_of(g->messages[0])) <
		    strlen(HISTD_SUMMARY_PREFIX) + 300 + 8);
	ut_free_msg(g);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			a_session_made_again_shows_its_own_summary, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			context_is_system_then_summary_as_user_then_the_tail,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_window_keeps_a_system_message_mid_history_apart,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			entries_of_idle_sessions_are_freed, setup, teardown),
		cmocka_unit_test_setup_teardown(
			reduce_max_tokens_bounds_the_view_with_the_summary_message,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			masked_results_are_markers_and_get_tool_result_has_the_original,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_default_pipeline_applies_when_the_config_has_none,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_bad_pipeline_is_invalid_argument_at_create_and_update,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_reduce_of_a_session_made_again_meanwhile_stores_nothing,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_failed_reduce_of_a_session_made_again_meanwhile_is_not_reported,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_failed_reduce_leaves_history_unchanged_and_is_reported,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			auto_reduce_compacts_off_the_request_path_and_retries_with_backoff,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			appends_racing_a_compaction_lose_nothing, setup,
			teardown),
		cmocka_unit_test_setup_teardown(ttl_deletes_idle_sessions_only,
						setup, teardown),
		cmocka_unit_test_setup_teardown(a_view_never_mixes_two_lives_of_a_session,
						setup, teardown),
		cmocka_unit_test_setup_teardown(stopping_ends_a_ttl_sweep_between_sessions,
						setup, teardown),
		cmocka_unit_test_setup_teardown(ttl_sweeps_every_tenant_in_storage,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_window_hint_loads_less_and_changes_nothing,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			context_of_a_long_session_reads_only_its_tail, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			context_last_n_without_transforms_loads_only_the_tail,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			context_last_n_of_the_tail_is_that_of_the_whole_session,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			context_within_a_size_is_that_of_the_whole_session,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			context_without_transforms_loads_what_fits_the_response,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			reduce_never_covers_a_call_waiting_for_its_result,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			auto_compaction_never_covers_a_call_waiting_for_its_result,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			retention_never_deletes_a_call_waiting_for_its_result,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_reducer_that_covers_a_call_waiting_for_its_result_is_refused,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			an_empty_summary_is_refused_and_nothing_is_stored,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_summary_above_max_summary_tokens_is_cut_to_fit,
			setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
