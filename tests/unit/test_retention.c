/*
 * The window's retention = delete end to end below the transport
 * (server/context.c through the service, on the memory driver behind a
 * shim that counts and fails truncate on demand), the SessionCleared event
 * it produces (server/hub.c), and the file driver's snapshot of a session
 * whose system messages a truncate kept.
 *
 * Every retention session has a twin with the same pipeline but retention
 * = view, fed the same messages: the CONTEXT views of the two must be
 * equal, byte for byte, and the twin must keep every message.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "context.h"
#include "driver.h"
#include "file/file.h"
#include "histd/v1/histd.pb-c.h"
#include "hub.h"
#include "plugin.h"
#include "service.h"
#include "svc_calls.h"
#include "transcript_check.h"

/* ---------------------------------------------------------------------- */
/* A shim around the memory driver: counts truncate calls, fails the next  */
/* fail_truncates of them with EUNAVAILABLE; with version 2, has none.     */

typedef struct shim {
	histd_driver base;          /* first: the driver the server sees */
	histd_driver *real;
} shim;

static pthread_mutex_t shim_lock = PTHREAD_MUTEX_INITIALIZER;
static int truncates, fail_truncates;

static histd_driver *
real(histd_driver *d)
{
	return ((shim *)d)->real;
}

static int
sh_create(histd_driver *d, const histd_session *in, histd_session **out)
{
	return histd_driver_session_create(real(d), in, out);
}

static int
sh_get(histd_driver *d, const char *t, const char *id, histd_session **out)
{
	return histd_driver_session_get(real(d), t, id, out);
}

static int
sh_resolve(histd_driver *d, const histd_session *in, histd_session **out,
	   int *created)
{
	return histd_driver_session_resolve(real(d), in, out, created);
}

static int
sh_list(histd_driver *d, const histd_list *q, histd_session_list *out)
{
	return histd_driver_session_list(real(d), q, out);
}

static int
sh_update(histd_driver *d, const char *t, const char *id, uint64_t er,
	  const histd_kv *labels, size_t nl, const uint8_t *config,
	  size_t cl, int64_t now, histd_session **out, uint64_t *cur)
{
	return histd_driver_session_update(real(d), t, id, er, labels, nl,
					   config, cl, now, out, cur);
}

static int
sh_delete(histd_driver *d, const char *t, const char *id, uint64_t er,
	  uint64_t *cur)
{
	return histd_driver_session_delete(real(d), t, id, er, cur);
}

static int
sh_fork(histd_driver *d, const char *t, const char *src, uint64_t up_to,
	const histd_session *in, histd_session **out)
{
	return histd_driver_session_fork(real(d), t, src, up_to, in, out);
}

static int
sh_append(histd_driver *d, const histd_append *a, histd_append_result *r)
{
	return histd_driver_append(real(d), a, r);
}

/* A driver that reads the summary apart from the messages (as postgres
 * does): the read leaves it to summary_get, before which `before_summary`
 * runs once, on the test's own thread (the context's worker reads too). */
static _Atomic int summary_apart;
static void (*before_summary)(void);
static pthread_t before_summary_thread;

static int
sh_read(histd_driver *d, const histd_read *q, histd_read_result *r)
{
	int rc = histd_driver_read(real(d), q, r);

	if (rc == 0 && summary_apart) {
		histd_record_free(r->summary);
		r->summary = NULL;
		r->summary_read = 0;
	}
	return rc;
}

static int
sh_tool_result(histd_driver *d, const char *t, const char *id,
	       const char *call, histd_record **out)
{
	return histd_driver_tool_result(real(d), t, id, call, out);
}

static int
sh_clear(histd_driver *d, const char *t, const char *id, uint64_t er,
	 uint64_t *rev, uint64_t *cleared, uint64_t *cur)
{
	return histd_driver_clear(real(d), t, id, er, rev, cleared, cur);
}

static int
sh_replace(histd_driver *d, const histd_append *a, histd_append_result *r,
	   uint64_t *cleared)
{
	return histd_driver_replace(real(d), a, r, cleared);
}

static int
sh_summary_put(histd_driver *d, const char *t, const char *id, uint64_t er,
	       const histd_record *s, uint64_t *rev, uint64_t *cur)
{
	return histd_driver_summary_put(real(d), t, id, er, s, rev, cur);
}

static int
sh_summary_get(histd_driver *d, const char *t, const char *id,
	       histd_record **out)
{
	void (*f)(void) = NULL;

	pthread_mutex_lock(&shim_lock);
	if (before_summary &&
	    pthread_equal(pthread_self(), before_summary_thread)) {
		f = before_summary;
		before_summary = NULL;
	}
	pthread_mutex_unlock(&shim_lock);
	if (f)
		f();
	return histd_driver_summary_get(real(d), t, id, out);
}

static void
sh_set_notify(histd_driver *d, histd_change_fn fn, void *ctx)
{
	histd_driver_set_notify(real(d), fn, ctx);
}

static void
sh_close(histd_driver *d)
{
	histd_driver_close(real(d));
	free(d);
}

static int
sh_truncate(histd_driver *d, const char *t, const char *id, uint64_t up_to,
	    uint64_t er, uint64_t *rev, uint64_t *cur)
{
	int fail;

	pthread_mutex_lock(&shim_lock);
	truncates++;
	fail = fail_truncates > 0;
	if (fail)
		fail_truncates--;
	pthread_mutex_unlock(&shim_lock);
	if (fail)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "storage is unreachable");
	return histd_driver_truncate(real(d), t, id, up_to, er, rev, cur);
}

/* The memory driver behind a shim of `version` (2: no truncate). */
static histd_driver *
shim_open(unsigned int version)
{
	shim *s = calloc(1, sizeof(*s));
	histd_driver_config dc = { 0 };

	assert_non_null(s);
	assert_int_equal(histd_driver_open("memory", &dc, &s->real), 0);
	s->base = (histd_driver){
		.version = version,
		.name = version < 3 ? "old" : "shim",
		.session_create = sh_create,
		.session_get = sh_get,
		.session_resolve = sh_resolve,
		.session_list = sh_list,
		.session_update = sh_update,
		.session_delete = sh_delete,
		.session_fork = sh_fork,
		.append = sh_append,
		.read = sh_read,
		.tool_result = sh_tool_result,
		.clear = sh_clear,
		.replace = sh_replace,
		.summary_put = sh_summary_put,
		.summary_get = sh_summary_get,
		.set_notify = sh_set_notify,
		.close = sh_close,
		.truncate = version >= 3 ? sh_truncate : NULL,
	};
	assert_int_equal(histd_driver_validate(&s->base), 0);
	return &s->base;
}

/* ---------------------------------------------------------------------- */
/* The server below the transport                                          */

static histd_driver *drv;
static histd_service *svc;
static histd_context *ctx;
static const histd_caller alice = { "alice", 0 };

/* The error sink: what subscribers would receive as plugin_error. */
static int sink_calls;
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
	(void)will_retry;
	pthread_mutex_lock(&shim_lock);
	sink_calls++;
	snprintf(sink_msg, sizeof(sink_msg), "%s: %s", plugin, message);
	pthread_mutex_unlock(&shim_lock);
}

static int
start(unsigned int version, const char *default_pipeline)
{
	histd_context_config cc = { 0 };
	histd_service_config sc;

	drv = shim_open(version);
	cc.default_pipeline = default_pipeline;
	cc.workers = 1;
	cc.max_retries = 2;
	cc.retry_base_us = 20000;
	if (histd_context_new(&ctx, drv, &cc))
		return -1;
	histd_context_set_error_sink(ctx, sink, NULL);
	histd_service_config_default(&sc);
	sc.context = ctx;
	if (histd_service_new(&svc, drv, &sc))
		return -1;
	ut_use(svc, &alice);
	pthread_mutex_lock(&shim_lock);
	truncates = fail_truncates = sink_calls = 0;
	sink_msg[0] = '\0';
	pthread_mutex_unlock(&shim_lock);
	return 0;
}

static int
setup(void **state)
{
	(void)state;
	return start(3, "");
}

static int
teardown(void **state)
{
	(void)state;
	histd_service_free(svc);
	histd_context_free(ctx);
	histd_driver_close(drv);
	svc = NULL;
	ctx = NULL;
	drv = NULL;
	return 0;
}

/* One message: text, a tool call (call_id) or a tool result (result). */
struct msg {
	Histd__V1__Message m;
	Histd__V1__ContentBlock b, ib, *bp, *ibp;
	Histd__V1__TextBlock t;
	Histd__V1__ToolCallBlock tc;
	Histd__V1__ToolResultBlock tr;
};

static void
msg_init(struct msg *x, Histd__V1__Role role, const char *text,
	 const char *call_id, const char *result)
{
	histd__v1__message__init(&x->m);
	histd__v1__content_block__init(&x->b);
	histd__v1__content_block__init(&x->ib);
	histd__v1__text_block__init(&x->t);
	histd__v1__tool_call_block__init(&x->tc);
	histd__v1__tool_result_block__init(&x->tr);
	x->bp = &x->b;
	x->ibp = &x->ib;
	x->t.text = (char *)(text ? text : "x");
	if (call_id) {
		x->tc.id = (char *)call_id;
		x->tc.name = "read_file";
		x->tc.arguments = "{}";
		x->b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
		x->b.tool_call = &x->tc;
	} else if (result) {
		x->ib.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		x->ib.text = &x->t;
		x->tr.tool_call_id = (char *)result;
		x->tr.tool_name = "read_file";
		x->tr.content = &x->ibp;
		x->tr.n_content = 1;
		x->b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		x->b.tool_result = &x->tr;
	} else {
		x->b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		x->b.text = &x->t;
	}
	x->m.role = role;
	x->m.content = &x->bp;
	x->m.n_content = 1;
}

static void
append_msgs(const char *id, struct msg *x, size_t n)
{
	Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *mp[16];
	int rc;

	assert_true(n <= 16);
	for (size_t i = 0; i < n; i++)
		mp[i] = &x[i].m;
	r.session_id = (char *)id;
	r.messages = mp;
	r.n_messages = n;
	rc = ut_call(HISTD_M_APPEND, &r.base, NULL, NULL);
	if (rc)
		fail_msg("append: %s", histd_error_message());
}

static void
append_text(const char *id, Histd__V1__Role role, const char *text)
{
	struct msg x;

	msg_init(&x, role, text, NULL, NULL);
	append_msgs(id, &x, 1);
}

/* Appends k texts "<id> text <from + i>" as one batch, users and
 * assistants in turn. */
static void
append_texts(const char *id, int from, int k)
{
	struct msg x[16];
	char text[16][48];

	for (int i = 0; i < k; i++) {
		snprintf(text[i], sizeof(text[i]), "text %d", from + i);
		msg_init(&x[i], (from + i) % 2 ? HISTD__V1__ROLE__ROLE_ASSISTANT
						: HISTD__V1__ROLE__ROLE_USER,
			 text[i], NULL, NULL);
	}
	append_msgs(id, x, (size_t)k);
}

/* An agent turn as one batch: user asks, assistant calls, tool answers,
 * assistant says. */
static void
turn(const char *id, int i)
{
	struct msg x[4];
	char q[48], c[32], a[48];

	snprintf(q, sizeof(q), "Question number %d.", i);
	snprintf(c, sizeof(c), "call-%d", i);
	snprintf(a, sizeof(a), "Answer number %d.", i);
	msg_init(&x[0], HISTD__V1__ROLE__ROLE_USER, q, NULL, NULL);
	msg_init(&x[1], HISTD__V1__ROLE__ROLE_ASSISTANT, NULL, c, NULL);
	msg_init(&x[2], HISTD__V1__ROLE__ROLE_TOOL,
		 "file contents that are long enough to be worth masking",
		 NULL, c);
	msg_init(&x[3], HISTD__V1__ROLE__ROLE_ASSISTANT, a, NULL, NULL);
	append_msgs(id, x, 4);
}

static Histd__V1__GetMessagesResponse *
get(const char *id, Histd__V1__View view)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	void *resp;
	int rc;

	r.session_id = (char *)id;
	r.view = view;
	r.limit = 1000;
	rc = ut_call(HISTD_M_GET_MESSAGES, &r.base,
		  &histd__v1__get_messages_response__descriptor, &resp);
	if (rc)
		fail_msg("get: %s", histd_error_message());
	return resp;
}

static Histd__V1__Session *
get_session(const char *id)
{
	Histd__V1__GetSessionRequest r = HISTD__V1__GET_SESSION_REQUEST__INIT;
	void *resp;

	r.session_id = (char *)id;
	assert_int_equal(ut_call(HISTD_M_GET_SESSION, &r.base,
			      &histd__v1__session__descriptor, &resp), 0);
	return resp;
}

/* The two sessions' CONTEXT views are the same messages, byte for byte
 * (with the seqs they have), and the same summary. */
static void
assert_same_context(const char *a, const char *b)
{
	Histd__V1__GetMessagesResponse *ga = get(a, HISTD__V1__VIEW__VIEW_CONTEXT);
	Histd__V1__GetMessagesResponse *gb = get(b, HISTD__V1__VIEW__VIEW_CONTEXT);

	assert_int_equal(ga->n_messages, gb->n_messages);
	for (size_t i = 0; i < ga->n_messages; i++) {
		Histd__V1__Message *ma = ga->messages[i], *mb = gb->messages[i];
		Google__Protobuf__Timestamp *ta = ma->created_at,
					    *tb = mb->created_at;
		size_t na, nb;
		uint8_t *pa, *pb;

		/* created_at differs between the two sessions' copies. */
		ma->created_at = mb->created_at = NULL;
		na = histd__v1__message__get_packed_size(ma);
		nb = histd__v1__message__get_packed_size(mb);
		pa = malloc(na ? na : 1);
		pb = malloc(nb ? nb : 1);
		histd__v1__message__pack(ma, pa);
		histd__v1__message__pack(mb, pb);
		ma->created_at = ta;
		mb->created_at = tb;
		if (na != nb || memcmp(pa, pb, na))
			fail_msg("CONTEXT message %zu (seq %llu) differs", i,
				 (unsigned long long)ma->seq);
		free(pa);
		free(pb);
	}
	assert_int_equal(ga->summary != NULL, gb->summary != NULL);
	if (ga->summary)
		assert_int_equal(ga->summary->covers_to_seq,
				 gb->summary->covers_to_seq);
	ut_free_msg(ga);
	ut_free_msg(gb);
}

static void
idle(void)
{
	assert_int_equal(histd_context_wait_idle(ctx, 20000), 0);
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void
retention_deletes_what_the_window_drops_and_keeps_system_messages(void **state)
{
	static const char *const del[] = {
		"window", "max_messages", "5", "window", "retention", "delete",
		NULL };
	static const char *const view[] = {
		"window", "max_messages", "5", NULL };
	Histd__V1__GetMessagesResponse *raw;
	Histd__V1__Session *s;
	int from = 0;

	(void)state;
	assert_int_equal(ut_create("del", del), 0);
	assert_int_equal(ut_create("view", view), 0);
	append_text("del", HISTD__V1__ROLE__ROLE_SYSTEM, "Be terse.");
	append_text("view", HISTD__V1__ROLE__ROLE_SYSTEM, "Be terse.");
	for (int k = 1; from < 30; k = k % 7 + 2) {
		int n = from + k > 30 ? 30 - from : k;

		append_texts("del", from, n);
		append_texts("view", from, n);
		from += n;
	}
	idle();

	raw = get("del", HISTD__V1__VIEW__VIEW_RAW);
	assert_int_equal(raw->n_messages, 6);
	assert_int_equal(raw->messages[0]->seq, 1);
	assert_string_equal(tc_text_of(raw->messages[0]), "Be terse.");
	for (size_t i = 1; i < 6; i++) {
		char want[32];

		/* Seqs as they were: text i at seq i + 2. */
		assert_int_equal(raw->messages[i]->seq, 26 + i);
		snprintf(want, sizeof(want), "text %zu", 24 + i);
		assert_string_equal(tc_text_of(raw->messages[i]), want);
	}
	ut_free_msg(raw);
	s = get_session("del");
	assert_int_equal(s->stats->message_count, 6);
	assert_int_equal(s->stats->last_seq, 31);
	ut_free_msg(s);
	assert_same_context("del", "view");

	/* Without retention nothing is deleted. */
	raw = get("view", HISTD__V1__VIEW__VIEW_RAW);
	assert_int_equal(raw->n_messages, 31);
	ut_free_msg(raw);
	assert_int_equal(sink_calls, 0);
}

static void
retention_never_splits_a_tool_call_from_its_result(void **state)
{
	static const char *const del[] = {
		"window", "max_messages", "5", "window", "retention", "delete",
		NULL };
	static const char *const view[] = {
		"window", "max_messages", "5", NULL };
	Histd__V1__GetMessagesResponse *raw;

	(void)state;
	assert_int_equal(ut_create("del", del), 0);
	assert_int_equal(ut_create("view", view), 0);
	append_text("del", HISTD__V1__ROLE__ROLE_SYSTEM, "Use tools.");
	append_text("view", HISTD__V1__ROLE__ROLE_SYSTEM, "Use tools.");
	for (int i = 0; i < 6; i++) {
		turn("del", i);
		turn("view", i);
		idle();
		raw = get("del", HISTD__V1__VIEW__VIEW_RAW);
		tc_assert_pairs_whole(raw);
		assert_string_equal(tc_text_of(raw->messages[0]), "Use tools.");
		/* The window holds the last 5 (the previous answer and the
		 * last turn: a safe start): the rest went. */
		if (i > 0)
			assert_int_equal(raw->n_messages, 1 + 5);
		ut_free_msg(raw);
		assert_same_context("del", "view");
	}
}

static void
retention_keeps_the_newest_summary_and_its_last_covered_message(void **state)
{
	static const char *const del[] = {
		"compaction", "keep_recent", "4",
		"window", "max_messages", "12", "window", "retention", "delete",
		NULL };
	Histd__V1__ReduceRequest r = HISTD__V1__REDUCE_REQUEST__INIT;
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *raw, *g;
	uint64_t to;

	(void)state;
	assert_int_equal(ut_create("sum", del), 0);
	append_text("sum", HISTD__V1__ROLE__ROLE_SYSTEM, "Sys.");
	for (int i = 0; i < 5; i++)
		turn("sum", i);
	idle();
	r.session_id = "sum";
	assert_int_equal(ut_call(HISTD_M_REDUCE, &r.base,
			      &histd__v1__reduce_response__descriptor,
			      (void **)&rr), 0);
	assert_non_null(rr->summary);
	to = rr->summary->covers_to_seq;
	ut_free_msg(rr);
	turn("sum", 5);
	idle();

	g = get("sum", HISTD__V1__VIEW__VIEW_CONTEXT);
	assert_non_null(g->summary);
	assert_int_equal(g->summary->covers_to_seq, to);
	assert_string_equal(tc_text_of(g->messages[0]), "Sys.");
	ut_free_msg(g);
	/* Everything before the summary's last covered message went; it
	 * and everything after it stay. */
	raw = get("sum", HISTD__V1__VIEW__VIEW_RAW);
	assert_string_equal(tc_text_of(raw->messages[0]), "Sys.");
	assert_int_equal(raw->messages[1]->seq, to);
	assert_int_equal(raw->messages[raw->n_messages - 1]->seq, 25);
	assert_int_equal(raw->n_messages, 1 + (25 - to + 1));
	ut_free_msg(raw);
}

static void
retention_with_a_token_budget_after_masking_keeps_what_the_view_shows(void **state)
{
	static const char *const del[] = {
		"masking", "keep_recent_results", "0",
		"window", "max_tokens", "120", "window", "retention", "delete",
		NULL };
	static const char *const view[] = {
		"masking", "keep_recent_results", "0",
		"window", "max_tokens", "120", NULL };
	Histd__V1__GetMessagesResponse *raw;

	(void)state;
	assert_int_equal(ut_create("tok", del), 0);
	assert_int_equal(ut_create("tokv", view), 0);
	append_text("tok", HISTD__V1__ROLE__ROLE_SYSTEM, "Sys.");
	append_text("tokv", HISTD__V1__ROLE__ROLE_SYSTEM, "Sys.");
	for (int i = 0; i < 10; i++) {
		turn("tok", i);
		turn("tokv", i);
	}
	idle();
	assert_same_context("tok", "tokv");
	raw = get("tok", HISTD__V1__VIEW__VIEW_RAW);
	assert_true(raw->n_messages < 41);
	tc_assert_pairs_whole(raw);
	ut_free_msg(raw);
}

/* Windows of 40 and of 31 messages over a system message at seq 1, 60
 * texts, a system message at 62 and 40 texts. After retention 42 or 33
 * messages are stored, more than a CONTEXT read loads first (32): the
 * view finds the system messages at or below cleared_to_seq through its
 * index, also when the load reaches the one at 62 but not the one at 1. */
static void
the_context_view_keeps_system_messages_below_the_deleted_range(void **state)
{
	static const char *const sizes[] = { "40", "31" };

	(void)state;
	for (size_t k = 0; k < 2; k++) {
		const char *const del[] = {
			"window", "max_messages", sizes[k],
			"window", "retention", "delete", NULL };
		const char *const view[] = {
			"window", "max_messages", sizes[k], NULL };
		Histd__V1__GetMessagesResponse *g, *raw;
		char a[16], b[16];

		snprintf(a, sizeof(a), "long%s", sizes[k]);
		snprintf(b, sizeof(b), "view%s", sizes[k]);
		assert_int_equal(ut_create(a, del), 0);
		assert_int_equal(ut_create(b, view), 0);
		append_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "sys one");
		append_text(b, HISTD__V1__ROLE__ROLE_SYSTEM, "sys one");
		for (int i = 0; i < 100; i += 10) {
			append_texts(a, i, 10);
			append_texts(b, i, 10);
			if (i == 50) {
				append_text(a, HISTD__V1__ROLE__ROLE_SYSTEM,
					    "sys two");
				append_text(b, HISTD__V1__ROLE__ROLE_SYSTEM,
					    "sys two");
			}
		}
		idle();
		raw = get(a, HISTD__V1__VIEW__VIEW_RAW);
		assert_int_equal(raw->n_messages, 2 + (size_t)atoi(sizes[k]));
		assert_int_equal(raw->messages[0]->seq, 1);
		assert_int_equal(raw->messages[1]->seq, 62);
		ut_free_msg(raw);
		g = get(a, HISTD__V1__VIEW__VIEW_CONTEXT);
		assert_string_equal(tc_text_of(g->messages[0]), "sys one");
		assert_string_equal(tc_text_of(g->messages[1]), "sys two");
		ut_free_msg(g);
		assert_same_context(a, b);
	}
}

static void
the_default_pipeline_can_ask_for_retention(void **state)
{
	Histd__V1__GetMessagesResponse *raw;

	(void)state;
	teardown(NULL);
	assert_int_equal(start(3, "window:max_messages=3,retention=delete"), 0);
	assert_int_equal(ut_create("d", NULL), 0);
	append_text("d", HISTD__V1__ROLE__ROLE_SYSTEM, "Sys.");
	append_texts("d", 0, 10);
	idle();
	raw = get("d", HISTD__V1__VIEW__VIEW_RAW);
	assert_int_equal(raw->n_messages, 4);
	assert_int_equal(raw->messages[1]->seq, 9);
	ut_free_msg(raw);
}

static void
retention_truncates_only_when_something_goes(void **state)
{
	static const char *const del[] = {
		"window", "max_messages", "10", "window", "retention", "delete",
		NULL };
	static const char *const view[] = {
		"window", "max_messages", "3", NULL };

	(void)state;
	assert_int_equal(ut_create("few", del), 0);
	assert_int_equal(ut_create("none", view), 0);
	append_text("few", HISTD__V1__ROLE__ROLE_SYSTEM, "Sys.");
	append_texts("few", 0, 10);
	append_texts("none", 0, 10);
	idle();
	/* The window holds all ten: no truncate at all. */
	assert_int_equal(truncates, 0);
	append_texts("few", 10, 4);
	idle();
	assert_int_equal(truncates, 1);
	/* A session without retention never truncates. */
	append_texts("none", 10, 1);
	idle();
	assert_int_equal(truncates, 1);
}

static void
a_failed_retention_is_reported_and_retried(void **state)
{
	static const char *const del[] = {
		"window", "max_messages", "2", "window", "retention", "delete",
		NULL };
	Histd__V1__GetMessagesResponse *raw;

	(void)state;
	assert_int_equal(ut_create("f", del), 0);
	pthread_mutex_lock(&shim_lock);
	fail_truncates = 1;
	pthread_mutex_unlock(&shim_lock);
	append_texts("f", 0, 6);
	idle();
	/* Failed once (reported, no conversation text), then retried with
	 * backoff and done. */
	assert_int_equal(sink_calls, 1);
	assert_non_null(strstr(sink_msg, "window: retention failed "
			       "(UNAVAILABLE)"));
	assert_null(strstr(sink_msg, "text"));
	assert_int_equal(truncates, 2);
	raw = get("f", HISTD__V1__VIEW__VIEW_RAW);
	assert_int_equal(raw->n_messages, 2);
	ut_free_msg(raw);
}

/* UpdateSession of id to one window of 5 with retention = delete. */
static int
update_retention(const char *id)
{
	Histd__V1__UpdateSessionRequest u = HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT, *pcs = &pc;
	Histd__V1__PluginConfig__OptionsEntry e[2], *ep[2] = { &e[0], &e[1] };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	char *path = "config";

	histd__v1__plugin_config__options_entry__init(&e[0]);
	histd__v1__plugin_config__options_entry__init(&e[1]);
	e[0].key = "max_messages";
	e[0].value = "5";
	e[1].key = "retention";
	e[1].value = "delete";
	pc.name = "window";
	pc.options = ep;
	pc.n_options = 2;
	pl.plugins = &pcs;
	pl.n_plugins = 1;
	c.pipeline = &pl;
	u.session_id = (char *)id;
	u.config = &c;
	mask.paths = &path;
	mask.n_paths = 1;
	u.update_mask = &mask;
	return ut_call(HISTD_M_UPDATE_SESSION, &u.base, NULL, NULL);
}

static void
retention_needs_a_driver_that_can_delete(void **state)
{
	static const char *const del[] = {
		"masking", "keep_recent_results", "1",
		"window", "max_messages", "5", "window", "retention", "delete",
		NULL };
	static const char *const view[] = {
		"window", "max_messages", "5", "window", "retention", "view",
		NULL };
	histd_context *c2 = NULL;
	histd_context_config cc = { 0 };

	(void)state;
	teardown(NULL);
	assert_int_equal(start(2, ""), 0);
	assert_int_equal(ut_create("no", del), HISTD_EPRECONDITION);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[1].options.retention: delete needs a "
		"storage driver that can delete old messages; the old driver "
		"cannot");
	assert_int_equal(ut_create("yes", view), 0);
	assert_int_equal(update_retention("yes"), HISTD_EPRECONDITION);
	assert_non_null(strstr(histd_error_message(), "the old driver cannot"));
	/* A default pipeline asking for it is refused at start. */
	cc.default_pipeline = "window:max_tokens=100,retention=delete";
	assert_int_equal(histd_context_new(&c2, drv, &cc), HISTD_EINVALID);
	assert_null(c2);
	assert_non_null(strstr(histd_error_message(), "default-pipeline"));
}

/* The shim, like every driver older than version 4, cannot list its
 * tenants: the TTL sweeper could not find what to sweep (context.c, beside
 * the retention checks). */
static void
session_ttl_needs_a_driver_that_lists_its_tenants(void **state)
{
	histd_context *c2 = NULL;
	histd_context_config cc = { 0 };

	(void)state;
	assert_false(histd_driver_can_list_tenants(drv));
	cc.session_ttl_us = 1000000;
	assert_int_equal(histd_context_new(&c2, drv, &cc), HISTD_EINVALID);
	assert_null(c2);
	assert_string_equal(histd_error_message(),
		"session-ttl needs a storage driver that lists its tenants; "
		"the shim driver cannot");
	cc.session_ttl_us = 0;
	assert_int_equal(histd_context_new(&c2, drv, &cc), 0);
	histd_context_free(c2);
}

static void
the_cleared_event_says_whether_system_messages_were_kept(void **state)
{
	histd_change c = {
		.kind = HISTD_CHANGE_CLEARED, .session_id = "s1",
		.revision = 9, .cleared_to_seq = 41, .system_kept = 1,
	};
	Histd__V1__HistoryEvent *e;
	histd_event *ev;

	(void)state;
	for (int kept = 1; kept >= 0; kept--) {
		c.system_kept = kept;
		ev = histd_event_from_change(&c);
		assert_non_null(ev);
		e = histd__v1__history_event__unpack(NULL, ev->len, ev->data);
		assert_non_null(e);
		assert_int_equal(e->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_CLEARED);
		assert_int_equal(e->cleared->cleared_to_seq, 41);
		assert_int_equal(e->cleared->system_kept, kept);
		assert_int_equal(ev->last_seq, 41);
		histd__v1__history_event__free_unpacked(e, NULL);
		histd_event_unref(ev);
	}
}

/* ---------------------------------------------------------------------- */
/* The file driver: a snapshot of what a truncate kept                      */

static void
remove_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;

	if (d) {
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(path);
}

static histd_driver *
file_open(const char *dir)
{
	histd_driver_config dc = { .data_dir = dir, .fsync_mode = "never" };
	histd_driver *d = NULL;

	assert_int_equal(histd_file_driver_open(&dc, &d), 0);
	return d;
}

/* The stored seqs of s1, and its counters. */
static void
file_expect(histd_driver *d, const uint64_t *seqs, size_t n,
	    uint64_t cleared, uint64_t tokens)
{
	histd_read q = { .tenant = "t", .session_id = "s1",
			 .want_session = 1 };
	histd_read_result res = { 0 };

	assert_int_equal(histd_driver_read(d, &q, &res), 0);
	assert_int_equal(res.records.n, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(res.records.v[i].seq, seqs[i]);
	assert_int_equal(res.cleared_to_seq, cleared);
	assert_int_equal(res.session->message_count, n);
	assert_int_equal(res.session->token_total, tokens);
	assert_int_equal(res.session->first_seq, seqs[0]);
	histd_read_result_clear(&res);
}

static void
a_file_snapshot_holds_the_system_messages_a_truncate_kept(void **state)
{
	static const uint64_t kept[] = { 1, 4, 6 };
	char dir[64] = "/tmp/histd-retention-XXXXXX";
	histd_session in = { .tenant = "t", .id = "s1" }, *out = NULL;
	histd_msg_in mi[6];
	uint8_t *packed[6];
	histd_append a = { .tenant = "t", .session_id = "s1", .msgs = mi,
			   .n_msgs = 6 };
	histd_append_result ar;
	histd_driver *d;
	uint64_t rev = 0, cur = 0;

	(void)state;
	assert_non_null(mkdtemp(dir));
	for (size_t i = 0; i < 6; i++) {
		struct msg x;
		size_t n;

		msg_init(&x, i == 0 || i == 3 ? HISTD__V1__ROLE__ROLE_SYSTEM
					      : HISTD__V1__ROLE__ROLE_USER,
			 "some words", NULL, NULL);
		n = histd__v1__message__get_packed_size(&x.m);
		packed[i] = malloc(n);
		histd__v1__message__pack(&x.m, packed[i]);
		mi[i] = (histd_msg_in){ .data = packed[i], .len = n,
					.token_estimate = 10 + (uint32_t)i };
	}
	d = file_open(dir);
	assert_int_equal(histd_driver_session_create(d, &in, &out), 0);
	histd_session_free(out);
	assert_int_equal(histd_driver_append(d, &a, &ar), 0);
	assert_int_equal(histd_driver_truncate(d, "t", "s1", 5, 0, &rev, &cur),
			 0);
	file_expect(d, kept, 3, 5, 10 + 13 + 15);
	histd_driver_close(d);
	/* Replayed from the log, then written into a snapshot, which the
	 * next open loads. */
	d = file_open(dir);
	file_expect(d, kept, 3, 5, 10 + 13 + 15);
	assert_int_equal(histd_file_driver_compact(d), 0);
	file_expect(d, kept, 3, 5, 10 + 13 + 15);
	histd_driver_close(d);
	d = file_open(dir);
	file_expect(d, kept, 3, 5, 10 + 13 + 15);
	histd_driver_close(d);
	for (size_t i = 0; i < 6; i++)
		free(packed[i]);
	remove_dir(dir);
}

/* Life B of "two": its own messages and a summary of them. */
static const char *const two_pl[] = { "compaction", "keep_recent", "2", NULL };

static void
make_two_again(void)
{
	Histd__V1__DeleteSessionRequest del =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__ReduceRequest red = HISTD__V1__REDUCE_REQUEST__INIT;

	del.session_id = "two";
	assert_int_equal(ut_call(HISTD_M_DELETE_SESSION, &del.base, NULL, NULL),
			 0);
	assert_int_equal(ut_create("two", two_pl), 0);
	for (int i = 0; i < 6; i++)
		append_text("two", HISTD__V1__ROLE__ROLE_USER, "bravo said this.");
	red.session_id = "two";
	assert_int_equal(ut_call(HISTD_M_REDUCE, &red.base, NULL, NULL), 0);
}

/* With a driver that reads the summary apart from the messages, a session
 * deleted and made again in between: the CONTEXT view never shows the new
 * life's summary over the old life's messages. */
static void
a_summary_read_apart_is_of_the_messages_life(void **state)
{
	Histd__V1__GetMessagesResponse *g;
	int alpha = 0, bravo = 0;

	(void)state;
	assert_int_equal(ut_create("two", two_pl), 0);
	for (int i = 0; i < 6; i++)
		append_text("two", HISTD__V1__ROLE__ROLE_USER, "alpha said this.");
	summary_apart = 1;
	pthread_mutex_lock(&shim_lock);
	before_summary = make_two_again;
	before_summary_thread = pthread_self();
	pthread_mutex_unlock(&shim_lock);
	g = get("two", HISTD__V1__VIEW__VIEW_CONTEXT);
	summary_apart = 0;
	assert_null(before_summary);
	for (size_t i = 0; i < g->n_messages; i++) {
		const Histd__V1__Message *m = g->messages[i];
		const char *t = m->n_content && m->content[0]->text
				? m->content[0]->text->text : "";

		alpha += strstr(t, "alpha") != NULL;
		bravo += strstr(t, "bravo") != NULL;
	}
	if (alpha && bravo)
		fail_msg("the view holds %d messages of the first life and %d "
			 "of the second", alpha, bravo);
	assert_true(bravo > 0);
	histd__v1__get_messages_response__free_unpacked(g, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			retention_deletes_what_the_window_drops_and_keeps_system_messages,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			retention_never_splits_a_tool_call_from_its_result,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			retention_keeps_the_newest_summary_and_its_last_covered_message,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			retention_with_a_token_budget_after_masking_keeps_what_the_view_shows,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_context_view_keeps_system_messages_below_the_deleted_range,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			the_default_pipeline_can_ask_for_retention, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			retention_truncates_only_when_something_goes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			a_failed_retention_is_reported_and_retried, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			retention_needs_a_driver_that_can_delete, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			session_ttl_needs_a_driver_that_lists_its_tenants,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			a_summary_read_apart_is_of_the_messages_life, setup,
			teardown),
		cmocka_unit_test(
			the_cleared_event_says_whether_system_messages_were_kept),
		cmocka_unit_test(
			a_file_snapshot_holds_the_system_messages_a_truncate_kept),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
