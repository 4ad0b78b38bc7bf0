/*
 * The context pipeline end to end, through the histd binary: pipeline
 * validation at CreateSession, the CONTEXT view (window, masking, the
 * summary), Reduce and its `reduced` event, automatic compaction from the
 * server's default pipeline, and a plugin loaded from a shared object.
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

static histd_proc *server;
static histd_client *client;
static char plugin_path[4096];

static int
setup(void **state)
{
	char flag[4200];
	const char *extra[] = {
		"--default-pipeline",
		"compaction:keep_recent=4,auto_reduce_when=messages>=30;"
		"window:max_messages=40",
		"--compaction-retry-base", "1",
		flag, NULL };

	(void)state;
	snprintf(flag, sizeof(flag), "--plugins=%s", plugin_path);
	if (harness_start(&server, extra))
		return -1;
	client = harness_client(server);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	histd_client_close(client);
	client = NULL;
	int rc = harness_stop(server);
	server = NULL;
	return rc;
}

/* A plugin with up to two options. */
static Histd__V1__PluginConfig *
plugin(tarena *a, const char *name, const char *k1, const char *v1,
       const char *k2, const char *v2)
{
	Histd__V1__PluginConfig *pc = ta_alloc(a, sizeof(*pc));
	void **opts = ta_alloc(a, 2 * sizeof(void *));

	histd__v1__plugin_config__init(pc);
	pc->name = ta_strdup(a, name);
	if (k1)
		opts[pc->n_options++] = tm_entry(a,
			&histd__v1__plugin_config__options_entry__descriptor,
			k1, v1);
	if (k2)
		opts[pc->n_options++] = tm_entry(a,
			&histd__v1__plugin_config__options_entry__descriptor,
			k2, v2);
	pc->options = (Histd__V1__PluginConfig__OptionsEntry **)opts;
	return pc;
}

/* A session whose pipeline is these n plugins, in this order. */
static grpc_status_code
create_pipeline(tarena *a, const char *id, Histd__V1__PluginConfig **pcs,
		size_t n)
{
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__SessionConfig *c = ta_alloc(a, sizeof(*c));
	Histd__V1__Pipeline *pl = ta_alloc(a, sizeof(*pl));
	Histd__V1__Session *out = NULL;
	histd_status st;
	grpc_status_code code;

	histd__v1__create_session_request__init(r);
	histd__v1__session_config__init(c);
	histd__v1__pipeline__init(pl);
	r->session_id = ta_strdup(a, id);
	pl->plugins = pcs;
	pl->n_plugins = n;
	c->pipeline = pl;
	r->config = c;
	histd_status_init(&st);
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor,
	       &out, &st);
	code = st.code;
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
	return code;
}

/* A session with one plugin and up to two options ("": no plugin). */
static grpc_status_code
create(tarena *a, const char *id, const char *name, const char *k1,
       const char *v1, const char *k2, const char *v2)
{
	Histd__V1__PluginConfig **pcs = ta_alloc(a, sizeof(*pcs));

	pcs[0] = plugin(a, name, k1, v1, k2, v2);
	return create_pipeline(a, id, pcs, name[0] ? 1 : 0);
}

static void
append(tarena *a, const char *id, Histd__V1__Message *m)
{
	Histd__V1__AppendRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__Message **mm = ta_alloc(a, sizeof(*mm));
	Histd__V1__AppendResponse *out = NULL;
	histd_status st;

	histd__v1__append_request__init(r);
	r->session_id = ta_strdup(a, id);
	mm[0] = m;
	r->messages = mm;
	r->n_messages = 1;
	histd_status_init(&st);
	t_call(client, "Append", r, &histd__v1__append_response__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

/* user, assistant tool call, tool result, assistant answer. With
 * user_result the result comes in a user message that also says something
 * (Anthropic's shape), so dropping the result alone would leave the
 * message in the view. */
static void
turn(tarena *a, const char *id, int i, int user_result)
{
	Histd__V1__Message *res;
	char cid[32];

	snprintf(cid, sizeof(cid), "call-%d", i);
	append(a, id, tm_text(a, HISTD__V1__ROLE__ROLE_USER,
			      ta_printf(a, "Question %d.", i)));
	append(a, id, tm_tool_call(a, cid, "read_file", "{}"));
	res = tm_tool_result(a, cid, "read_file",
			     "a result long enough to mask");
	if (user_result) {
		Histd__V1__ContentBlock **b = ta_alloc(a, 2 * sizeof(*b));

		b[0] = res->content[0];
		b[1] = tm_text(a, HISTD__V1__ROLE__ROLE_USER,
			       ta_printf(a, "Result %d, thanks.", i))->content[0];
		res->role = HISTD__V1__ROLE__ROLE_USER;
		res->content = b;
		res->n_content = 2;
	}
	append(a, id, res);
	append(a, id, tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT,
			      ta_printf(a, "Answer %d.", i)));
}

static Histd__V1__GetMessagesResponse *
get_context(tarena *a, const char *id)
{
	Histd__V1__GetMessagesRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__GetMessagesResponse *out = NULL;
	histd_status st;

	histd__v1__get_messages_request__init(r);
	r->session_id = ta_strdup(a, id);
	r->view = HISTD__V1__VIEW__VIEW_CONTEXT;
	histd_status_init(&st);
	t_call(client, "GetMessages", r,
	       &histd__v1__get_messages_response__descriptor, &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	return out;
}

static void
pipelines_are_checked_at_create_session(void **state)
{
	tarena *a = ta_new();

	(void)state;
	assert_int_equal(create(a, "bad1", "no_such_plugin", NULL, NULL, NULL,
				NULL), GRPC_STATUS_INVALID_ARGUMENT);
	assert_int_equal(create(a, "bad2", "masking", "include_tools", "a",
				"exclude_tools", "b"),
			 GRPC_STATUS_INVALID_ARGUMENT);
	assert_int_equal(create(a, "bad3", "window", "max_messages", "-1",
				NULL, NULL), GRPC_STATUS_INVALID_ARGUMENT);
	assert_int_equal(create(a, "ok1", "window", "max_messages", "5", NULL,
				NULL), GRPC_STATUS_OK);
	ta_free(a);
}

/* Whether message i's block b is a tool result whose call is in the view
 * before it. */
static int
result_follows_its_call(const Histd__V1__GetMessagesResponse *g, size_t i,
			const Histd__V1__ContentBlock *b)
{
	for (size_t j = 0; j < i; j++)
		for (size_t k = 0; k < g->messages[j]->n_content; k++) {
			const Histd__V1__ContentBlock *c =
				g->messages[j]->content[k];

			if (c->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
			    strcmp(c->tool_call->id,
				   b->tool_result->tool_call_id) == 0)
				return 1;
		}
	return 0;
}

/*
 * A system message and four turns (user, tool call, tool result in a user
 * message that also says something, answer): 17 messages. The window of
 * the last 10 non-system messages would start at turn 1's result, cut
 * from its call; it starts later, at "Answer 1.", and keeps 9 (a view that
 * only dropped the orphan block would keep its message: 10). Masking
 * (keep_recent_results=1) leaves turn 3's result and masks the one other
 * result in view, turn 2's.
 */
static void
context_view_windows_and_masks_without_splitting_pairs(void **state)
{
	tarena *a = ta_new();
	Histd__V1__PluginConfig *pcs[2];
	Histd__V1__GetMessagesResponse *g;
	int results = 0, masked = 0;

	(void)state;
	pcs[0] = plugin(a, "masking", "keep_recent_results", "1", NULL, NULL);
	pcs[1] = plugin(a, "window", "max_messages", "10", NULL, NULL);
	assert_int_equal(create_pipeline(a, "ctx1", pcs, 2), GRPC_STATUS_OK);
	append(a, "ctx1", tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "Be kind."));
	for (int i = 0; i < 4; i++)
		turn(a, "ctx1", i, 1);
	g = get_context(a, "ctx1");
	assert_int_equal(g->n_messages, 1 + 9);
	assert_string_equal(tm_first_text(g->messages[0]), "Be kind.");
	assert_string_equal(tm_first_text(g->messages[1]), "Answer 1.");
	assert_string_equal(tm_first_text(g->messages[9]), "Answer 3.");
	for (size_t i = 0; i < g->n_messages; i++)
		for (size_t k = 0; k < g->messages[i]->n_content; k++) {
			Histd__V1__ContentBlock *b = g->messages[i]->content[k];

			if (b->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				continue;
			assert_true(result_follows_its_call(g, i, b));
			results++;
			if (strstr(b->tool_result->content[0]->text->text,
				   "[tool result masked: tool_call_id=call-"))
				masked++;
		}
	assert_int_equal(results, 2);
	assert_int_equal(masked, 1);
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

static void
reduce_publishes_a_reduced_event_and_the_view_starts_with_it(void **state)
{
	tarena *a = ta_new();
	Histd__V1__ReduceRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__ReduceResponse *rr = NULL;
	Histd__V1__GetMessagesResponse *g;
	Histd__V1__HistoryEvent *ev;
	histd_client_stream *s;
	histd_status st;
	int res, got_reduced = 0;

	(void)state;
	histd_status_init(&st);
	/* An empty pipeline: Reduce uses compaction's defaults. */
	assert_int_equal(create(a, "red1", "", NULL, NULL, NULL, NULL),
			 GRPC_STATUS_OK);
	append(a, "red1", tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "Sys."));
	for (int i = 0; i < 5; i++)
		turn(a, "red1", i, 0);
	s = t_subscribe(client, "red1", 21);
	histd__v1__reduce_request__init(r);
	r->session_id = "red1";
	histd_status_init(&st);
	t_call(client, "Reduce", r, &histd__v1__reduce_response__descriptor,
	       &rr, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	assert_non_null(rr->summary);
	assert_true(rr->summary->covers_to_seq >= 2);
	while ((ev = t_next_event(s, 10000, &res))) {
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_REDUCED) {
			assert_int_equal(ev->reduced->summary->covers_to_seq,
					 rr->summary->covers_to_seq);
			got_reduced = 1;
		}
		histd_client_message_free((ProtobufCMessage *)ev);
		if (got_reduced)
			break;
	}
	assert_true(got_reduced);
	histd_client_stream_cancel(s);
	histd_client_stream_close(s);

	g = get_context(a, "red1");
	assert_non_null(g->summary);
	assert_string_equal(tm_first_text(g->messages[0]), "Sys.");
	assert_int_equal(g->messages[1]->role, HISTD__V1__ROLE__ROLE_USER);
	assert_memory_equal(tm_first_text(g->messages[1]),
			    "[Earlier conversation summary: ", 31);
	assert_true(g->messages[2]->seq > rr->summary->covers_to_seq);
	/* The response's summary is the one applied, its text sent once:
	 * in the summary message, not again in the summary field. */
	assert_int_equal(g->summary->covers_to_seq, rr->summary->covers_to_seq);
	assert_string_equal(g->summary->model, rr->summary->model);
	assert_string_equal(g->summary->text, "");
	assert_true(rr->summary->text[0] != '\0');
	assert_non_null(strstr(tm_first_text(g->messages[1]),
			       rr->summary->text));
	histd_client_message_free((ProtobufCMessage *)g);
	histd_client_message_free((ProtobufCMessage *)rr);
	ta_free(a);
}

static void
the_default_pipeline_compacts_automatically(void **state)
{
	tarena *a = ta_new();
	Histd__V1__GetMessagesResponse *g = NULL;
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__Session *out = NULL;
	histd_status st;

	(void)state;
	/* No config: the server's default pipeline (auto at 30). */
	histd__v1__create_session_request__init(r);
	r->session_id = "auto1";
	histd_status_init(&st);
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)out);
	for (int i = 0; i < 8; i++)
		turn(a, "auto1", i, 0);
	for (int tries = 0; tries < 100; tries++) {
		g = get_context(a, "auto1");
		if (g->summary)
			break;
		histd_client_message_free((ProtobufCMessage *)g);
		g = NULL;
		usleep(100 * 1000);
	}
	assert_non_null(g);
	assert_non_null(g->summary);
	assert_int_equal(g->messages[0]->role, HISTD__V1__ROLE__ROLE_USER);
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

static void
a_shared_object_plugin_is_used_like_a_built_in_one(void **state)
{
	tarena *a = ta_new();
	Histd__V1__GetMessagesResponse *g;
	Histd__V1__Message *m;

	(void)state;
	assert_int_equal(create(a, "so1", "hide_author", "authors", "debug",
				NULL, NULL), GRPC_STATUS_OK);
	assert_int_equal(create(a, "so2", "hide_author", NULL, NULL, NULL,
				NULL), GRPC_STATUS_INVALID_ARGUMENT);
	append(a, "so1", tm_text(a, HISTD__V1__ROLE__ROLE_USER, "hello"));
	m = tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT, "internal note");
	m->author = "debug";
	append(a, "so1", m);
	append(a, "so1", tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT, "hi"));
	g = get_context(a, "so1");
	assert_int_equal(g->n_messages, 2);
	assert_string_equal(tm_first_text(g->messages[1]), "hi");
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

/* An author's name is one of the list's or not: "debug|tracer" (nor
 * "|debug") is neither debug nor tracer, and a '|' at the name's start
 * does not read before the list. */
static void
a_shared_object_plugin_matches_whole_author_names(void **state)
{
	static const char *const kept[] = { "debug|tracer", "|debug", "tracer|",
					    "debu", "racer" };
	tarena *a = ta_new();
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	assert_int_equal(create(a, "so3", "hide_author", "authors",
				"debug|tracer", NULL, NULL), GRPC_STATUS_OK);
	for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++) {
		Histd__V1__Message *m =
			tm_text(a, HISTD__V1__ROLE__ROLE_USER, kept[i]);

		m->author = (char *)kept[i];
		append(a, "so3", m);
	}
	g = get_context(a, "so3");
	assert_int_equal(g->n_messages, sizeof(kept) / sizeof(kept[0]));
	for (size_t i = 0; i < g->n_messages; i++)
		assert_string_equal(g->messages[i]->author, kept[i]);
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(pipelines_are_checked_at_create_session),
		cmocka_unit_test(
			context_view_windows_and_masks_without_splitting_pairs),
		cmocka_unit_test(
			reduce_publishes_a_reduced_event_and_the_view_starts_with_it),
		cmocka_unit_test(the_default_pipeline_compacts_automatically),
		cmocka_unit_test(
			a_shared_object_plugin_is_used_like_a_built_in_one),
		cmocka_unit_test(
			a_shared_object_plugin_matches_whole_author_names),
	};
	char *slash;

	if (harness_init(argc, argv))
		return 1;
	/* build/server/histd -> build/plugins/examples/ */
	snprintf(plugin_path, sizeof(plugin_path), "%s",
		 argc > 1 ? argv[1] : getenv("HISTD_BIN"));
	if ((slash = strrchr(plugin_path, '/')))
		*slash = '\0';
	strncat(plugin_path,
		"/../plugins/examples/histd_plugin_hide_author.so",
		sizeof(plugin_path) - strlen(plugin_path) - 1);
	return cmocka_run_group_tests(tests, setup, teardown);
}
