/*
 * The window's retention = delete through the histd binary, on the memory
 * and the file driver: old messages are deleted off the request path,
 * the system message stays, seqs stay, subscribers see a `cleared` event
 * with system_kept, the CONTEXT view is the same before and after and the
 * same as a twin session's without retention (which keeps everything), a
 * tool call and its result are never split, and on the file driver the
 * result survives a restart.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "transcript_check.h"

static histd_proc *server;
static histd_client *client;
static char data_dir[128];

/* How long a test waits for retention to catch up. */
#define POLL_MS 15000

static int
start(void)
{
	const char *file[] = { "--driver", "file", "--data-dir", data_dir,
			       NULL };

	if (harness_start(&server, data_dir[0] ? file : NULL))
		return -1;
	client = harness_client(server);
	return 0;
}

static int
stop(void)
{
	int rc;

	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	return rc;
}

static int
setup_memory(void **state)
{
	(void)state;
	data_dir[0] = '\0';
	return start();
}

static int
setup_file(void **state)
{
	(void)state;
	snprintf(data_dir, sizeof(data_dir), "/tmp/histd-retention-XXXXXX");
	if (!mkdtemp(data_dir))
		return -1;
	return start();
}

static int
teardown(void **state)
{
	int rc;

	(void)state;
	rc = stop();
	if (data_dir[0]) {
		char cmd[200];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", data_dir);
		if (system(cmd) != 0)
			rc = -1;
		data_dir[0] = '\0';
	}
	return rc;
}

/* A session whose pipeline is one window of max_messages, with
 * retention = delete when `del`. */
static void
create(tarena *a, const char *id, const char *max_messages, int del)
{
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__SessionConfig *c = ta_alloc(a, sizeof(*c));
	Histd__V1__Pipeline *pl = ta_alloc(a, sizeof(*pl));
	Histd__V1__PluginConfig *pc = ta_alloc(a, sizeof(*pc));
	Histd__V1__PluginConfig **pcs = ta_alloc(a, sizeof(*pcs));
	void **opts = ta_alloc(a, 2 * sizeof(void *));
	Histd__V1__Session *out = NULL;
	histd_status st;

	histd__v1__create_session_request__init(r);
	histd__v1__session_config__init(c);
	histd__v1__pipeline__init(pl);
	histd__v1__plugin_config__init(pc);
	r->session_id = ta_strdup(a, id);
	pc->name = "window";
	opts[pc->n_options++] = tm_entry(a,
		&histd__v1__plugin_config__options_entry__descriptor,
		"max_messages", max_messages);
	if (del)
		opts[pc->n_options++] = tm_entry(a,
			&histd__v1__plugin_config__options_entry__descriptor,
			"retention", "delete");
	pc->options = (Histd__V1__PluginConfig__OptionsEntry **)opts;
	pcs[0] = pc;
	pl->plugins = pcs;
	pl->n_plugins = 1;
	c->pipeline = pl;
	r->config = c;
	histd_status_init(&st);
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)out);
}

static void
append(tarena *a, const char *id, Histd__V1__Message **m, size_t n)
{
	Histd__V1__AppendRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__AppendResponse *out = NULL;
	histd_status st;

	histd__v1__append_request__init(r);
	r->session_id = ta_strdup(a, id);
	r->messages = m;
	r->n_messages = n;
	histd_status_init(&st);
	t_call(client, "Append", r, &histd__v1__append_response__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)out);
}

/* Appends the same messages to both sessions. */
static void
append_both(tarena *a, const char *x, const char *y, Histd__V1__Message **m,
	    size_t n)
{
	append(a, x, m, n);
	append(a, y, m, n);
}

static Histd__V1__GetMessagesResponse *
get_context(const char *id)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetMessagesResponse *out = NULL;
	histd_status st;

	r.session_id = (char *)id;
	r.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	histd_status_init(&st);
	t_call(client, "GetMessages", &r,
	       &histd__v1__get_messages_response__descriptor, &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	return out;
}

/* Polls RAW until it holds at most `max` messages (at most POLL_MS);
 * returns the last answer. */
static Histd__V1__GetMessagesResponse *
raw_at_most(const char *id, size_t max)
{
	int64_t end = t_now_ms() + POLL_MS;
	Histd__V1__GetMessagesResponse *g;

	for (;;) {
		g = t_get_raw(client, id, 0, 1000);
		if (g->n_messages <= max || t_now_ms() > end)
			return g;
		histd_client_message_free((ProtobufCMessage *)g);
		usleep(20 * 1000);
	}
}

/* The same messages, byte for byte; with `any_time`, created_at is left
 * out (a twin session's copies were appended at other instants). */
static void
assert_same_messages(Histd__V1__GetMessagesResponse *x,
		     Histd__V1__GetMessagesResponse *y, int any_time)
{
	assert_int_equal(x->n_messages, y->n_messages);
	for (size_t i = 0; i < x->n_messages; i++) {
		Histd__V1__Message *mx = x->messages[i], *my = y->messages[i];
		Google__Protobuf__Timestamp *tx = mx->created_at,
					    *ty = my->created_at;
		size_t nx, ny;
		uint8_t *px, *py;

		if (any_time)
			mx->created_at = my->created_at = NULL;
		nx = histd__v1__message__get_packed_size(mx);
		ny = histd__v1__message__get_packed_size(my);
		px = malloc(nx ? nx : 1);
		py = malloc(ny ? ny : 1);
		histd__v1__message__pack(mx, px);
		histd__v1__message__pack(my, py);
		if (nx != ny || memcmp(px, py, nx))
			fail_msg("message %zu (seq %llu) differs", i,
				 (unsigned long long)mx->seq);
		free(px);
		free(py);
		mx->created_at = tx;
		my->created_at = ty;
	}
}

/* Reads events until a `cleared` one; returns it (the caller frees it) or
 * NULL if none came within POLL_MS. */
static Histd__V1__HistoryEvent *
next_cleared(histd_client_stream *s)
{
	int64_t end = t_now_ms() + POLL_MS;

	while (t_now_ms() < end) {
		int res;
		Histd__V1__HistoryEvent *ev = t_next_event(s, 1000, &res);

		if (res == HISTD_STREAM_END)
			return NULL;
		if (!ev)
			continue;
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_CLEARED)
			return ev;
		histd_client_message_free((ProtobufCMessage *)ev);
	}
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void
retention_deletes_what_the_window_drops_and_keeps_the_system_message(void **state)
{
	tarena *a = ta_new();
	Histd__V1__Message *sys[] = {
		tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "You are terse.") };
	Histd__V1__GetMessagesResponse *before, *after, *twin, *raw;
	Histd__V1__HistoryEvent *ev;
	histd_client_stream *sub;
	int sent = 0, res;

	(void)state;
	create(a, "ret", "5", 1);
	create(a, "keep", "5", 0);
	sub = t_subscribe(client, "ret", 0);
	append_both(a, "ret", "keep", sys, 1);
	/* 30 messages in appends of 1 to 8. */
	for (int k = 1; sent < 30; k = k % 8 + 1) {
		int n = sent + k > 30 ? 30 - sent : k;
		Histd__V1__Message **m = ta_alloc(a, (size_t)n * sizeof(*m));

		for (int i = 0; i < n; i++)
			m[i] = tm_text(a, (sent + i) % 2 ?
					  HISTD__V1__ROLE__ROLE_ASSISTANT :
					  HISTD__V1__ROLE__ROLE_USER,
				       ta_printf(a, "message %d", sent + i));
		append_both(a, "ret", "keep", m, (size_t)n);
		sent += n;
	}
	before = get_context("ret");

	/* Off the request path: wait for it, bounded. */
	raw = raw_at_most("ret", 6);
	assert_int_equal(raw->n_messages, 6);
	assert_int_equal(raw->messages[0]->seq, 1);
	assert_int_equal(raw->messages[0]->role, HISTD__V1__ROLE__ROLE_SYSTEM);
	assert_string_equal(tm_first_text(raw->messages[0]), "You are terse.");
	for (size_t i = 1; i < 6; i++) {
		/* Seqs unchanged: message k was stored at seq k + 2. */
		assert_int_equal(raw->messages[i]->seq, 26 + i);
		assert_string_equal(tm_first_text(raw->messages[i]),
				    ta_printf(a, "message %zu", 24 + i));
	}
	histd_client_message_free((ProtobufCMessage *)raw);

	/* Subscribers learn that system messages stayed. */
	ev = next_cleared(sub);
	assert_non_null(ev);
	assert_true(ev->cleared->system_kept);
	assert_true(ev->cleared->cleared_to_seq >= 2);
	assert_true(ev->cleared->cleared_to_seq <= 26);
	histd_client_message_free((ProtobufCMessage *)ev);
	histd_client_stream_cancel(sub);
	histd_client_stream_close(sub);

	/* The CONTEXT view is what it was, and the twin's. */
	after = get_context("ret");
	assert_same_messages(before, after, 0);
	twin = get_context("keep");
	assert_same_messages(after, twin, 1);
	histd_client_message_free((ProtobufCMessage *)before);
	histd_client_message_free((ProtobufCMessage *)after);
	histd_client_message_free((ProtobufCMessage *)twin);

	/* Without retention nothing is ever deleted. */
	raw = t_get_raw(client, "keep", 0, 1000);
	assert_int_equal(raw->n_messages, 31);
	histd_client_message_free((ProtobufCMessage *)raw);

	/* A subscriber resuming after the system message, inside the
	 * deleted range, gets one `replaced` event holding every stored
	 * message, the system message too. */
	sub = t_subscribe(client, "ret", 3);
	ev = t_next_event(sub, 10000, &res);
	assert_non_null(ev);
	assert_int_equal(ev->event_case,
			 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
	assert_int_equal(ev->replaced->n_messages, 6);
	assert_int_equal(ev->replaced->messages[0]->seq, 1);
	assert_int_equal(ev->replaced->messages[5]->seq, 31);
	histd_client_message_free((ProtobufCMessage *)ev);
	histd_client_stream_cancel(sub);
	histd_client_stream_close(sub);
	ta_free(a);
}

static void
retention_never_splits_a_tool_call_from_its_result(void **state)
{
	tarena *a = ta_new();
	Histd__V1__Message *sys[] = {
		tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "Use the tools.") };
	Histd__V1__GetMessagesResponse *raw, *ctx, *twin;

	(void)state;
	create(a, "tools", "5", 1);
	create(a, "tools_keep", "5", 0);
	append_both(a, "tools", "tools_keep", sys, 1);
	for (int i = 0; i < 8; i++) {
		const char *id = ta_printf(a, "call-%d", i);
		Histd__V1__Message *turn[] = {
			tm_text(a, HISTD__V1__ROLE__ROLE_USER,
				ta_printf(a, "Question %d.", i)),
			tm_tool_call(a, id, "read_file", "{}"),
			tm_tool_result(a, id, "read_file", "the contents"),
			tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT,
				ta_printf(a, "Answer %d.", i)),
		};

		/* A call and its result in separate appends, too. */
		append_both(a, "tools", "tools_keep", turn, 2);
		append_both(a, "tools", "tools_keep", &turn[2], 2);
		raw = t_get_raw(client, "tools", 0, 1000);
		tc_assert_pairs_whole(raw);
		histd_client_message_free((ProtobufCMessage *)raw);
	}
	/* The window's 5 are the last answer and the last turn. */
	raw = raw_at_most("tools", 6);
	assert_int_equal(raw->n_messages, 6);
	assert_string_equal(tm_first_text(raw->messages[0]), "Use the tools.");
	assert_int_equal(raw->messages[5]->seq, 33);
	tc_assert_pairs_whole(raw);
	histd_client_message_free((ProtobufCMessage *)raw);
	ctx = get_context("tools");
	twin = get_context("tools_keep");
	assert_same_messages(ctx, twin, 1);
	histd_client_message_free((ProtobufCMessage *)ctx);
	histd_client_message_free((ProtobufCMessage *)twin);
	ta_free(a);
}

static void
retention_survives_a_restart(void **state)
{
	tarena *a = ta_new();
	Histd__V1__Message *m[13];
	Histd__V1__GetMessagesResponse *raw, *ctx, *ctx2;

	(void)state;
	create(a, "dur", "4", 1);
	m[0] = tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "Stay.");
	for (int i = 1; i < 13; i++)
		m[i] = tm_text(a, i % 2 ? HISTD__V1__ROLE__ROLE_USER :
				   HISTD__V1__ROLE__ROLE_ASSISTANT,
			       ta_printf(a, "m%d", i));
	append(a, "dur", m, 13);
	raw = raw_at_most("dur", 5);
	assert_int_equal(raw->n_messages, 5);
	histd_client_message_free((ProtobufCMessage *)raw);
	ctx = get_context("dur");

	assert_int_equal(stop(), 0);
	assert_int_equal(start(), 0);
	raw = t_get_raw(client, "dur", 0, 1000);
	assert_int_equal(raw->n_messages, 5);
	assert_int_equal(raw->messages[0]->seq, 1);
	assert_string_equal(tm_first_text(raw->messages[0]), "Stay.");
	assert_int_equal(raw->messages[1]->seq, 10);
	histd_client_message_free((ProtobufCMessage *)raw);
	ctx2 = get_context("dur");
	assert_same_messages(ctx, ctx2, 0);
	histd_client_message_free((ProtobufCMessage *)ctx);
	histd_client_message_free((ProtobufCMessage *)ctx2);
	ta_free(a);
}

#define M(f) cmocka_unit_test_setup_teardown(f, setup_memory, teardown)
#define F(f) cmocka_unit_test_setup_teardown(f, setup_file, teardown)

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		M(retention_deletes_what_the_window_drops_and_keeps_the_system_message),
		M(retention_never_splits_a_tool_call_from_its_result),
		F(retention_deletes_what_the_window_drops_and_keeps_the_system_message),
		F(retention_never_splits_a_tool_call_from_its_result),
		F(retention_survives_a_restart),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
