/*
 * Every RPC of histd.v1.HistoryService over a real channel, on its happy
 * path, plus the health service and the answers for methods that are not
 * there (UNIMPLEMENTED).
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

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"

static histd_proc *server;
static histd_client *client;

static int setup(void **state)
{
	(void)state;
	if (harness_start(&server, NULL))
		return -1;
	client = harness_client(server);
	return 0;
}

/* Normally the last test has stopped the server already. */
static int teardown(void **state)
{
	(void)state;
	histd_client_close(client);
	client = NULL;
	int rc = harness_stop(server);
	server = NULL;
	return rc;
}

static void sigterm_stops_the_server_with_exit_status_0(void **state)
{
	(void)state;
	histd_client_close(client);
	client = NULL;
	histd_proc *p = server;
	server = NULL;
	assert_int_equal(harness_stop(p), 0);
}

/* Calls a method and asserts OK; returns the response. */
static void *call_ok(const char *name, const void *req,
		     const ProtobufCMessageDescriptor *resp_desc)
{
	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(client, name, req, resp_desc, &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	assert_non_null(resp);
	histd_status_reset(&st);
	return resp;
}

/* Calls a method through c and returns its status code (the status is
 * reset). */
static grpc_status_code call_code(histd_client *c, const char *name,
				  const void *req,
				  const ProtobufCMessageDescriptor *resp_desc)
{
	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(c, name, req, resp_desc, &resp, &st);
	grpc_status_code code = st.code;
	histd_client_message_free(resp);
	histd_status_reset(&st);
	return code;
}

static const char *label_of(const Histd__V1__Session *s, const char *key)
{
	for (size_t i = 0; i < s->n_labels; i++)
		if (!strcmp(s->labels[i]->key, key))
			return s->labels[i]->value;
	return NULL;
}

/* ------------------------------------------------------------------------ */

static void create_session_with_empty_id_assigns_a_uuid(void **state)
{
	(void)state;
	Histd__V1__CreateSessionRequest req =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s =
		call_ok("CreateSession", &req, &histd__v1__session__descriptor);
	assert_int_equal(strlen(s->id), 36);
	assert_int_equal(s->id[8], '-');
	assert_int_equal(s->revision, 1);
	assert_non_null(s->created_at);
	histd_client_message_free(&s->base);
}

static void create_then_get_session_returns_keys_labels_and_stats(void **state)
{
	(void)state;
	tarena *a = ta_new();
	Histd__V1__CreateSessionRequest req =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	req.session_id = "rpc-get-1";
	Histd__V1__CreateSessionRequest__ContextKeysEntry *ck[1] = {
		tm_entry(a, &histd__v1__create_session_request__context_keys_entry__descriptor,
			 "chat", "get-1") };
	Histd__V1__CreateSessionRequest__LabelsEntry *lb[2] = {
		tm_entry(a, &histd__v1__create_session_request__labels_entry__descriptor,
			 "team", "blue"),
		tm_entry(a, &histd__v1__create_session_request__labels_entry__descriptor,
			 "env", "test") };
	req.n_context_keys = 1;
	req.context_keys = ck;
	req.n_labels = 2;
	req.labels = lb;
	Histd__V1__Session *s =
		call_ok("CreateSession", &req, &histd__v1__session__descriptor);
	assert_string_equal(s->id, "rpc-get-1");
	histd_client_message_free(&s->base);

	assert_int_equal(t_append_texts(client, "rpc-get-1", 3, "hello", 0,
					NULL),
			 GRPC_STATUS_OK);
	s = t_get_session(client, "rpc-get-1");
	assert_string_equal(s->id, "rpc-get-1");
	assert_int_equal(s->n_context_keys, 1);
	assert_string_equal(s->context_keys[0]->key, "chat");
	assert_string_equal(s->context_keys[0]->value, "get-1");
	assert_string_equal(label_of(s, "team"), "blue");
	assert_string_equal(label_of(s, "env"), "test");
	assert_int_equal(s->revision, 2);
	assert_non_null(s->stats);
	assert_int_equal(s->stats->message_count, 3);
	assert_int_equal(s->stats->last_seq, 3);
	assert_int_equal(s->stats->first_seq, 1);
	assert_true(s->stats->token_estimate > 0);
	assert_true(s->stats->bytes > 0);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void resolve_session_gives_the_same_session_for_the_same_keys(void **state)
{
	(void)state;
	tarena *a = ta_new();
	Histd__V1__ResolveSessionRequest req =
		HISTD__V1__RESOLVE_SESSION_REQUEST__INIT;
	Histd__V1__ResolveSessionRequest__ContextKeysEntry *ck[2] = {
		tm_entry(a, &histd__v1__resolve_session_request__context_keys_entry__descriptor,
			 "user", "u-42"),
		tm_entry(a, &histd__v1__resolve_session_request__context_keys_entry__descriptor,
			 "chat", "c-7") };
	req.n_context_keys = 2;
	req.context_keys = ck;
	Histd__V1__ResolveSessionResponse *r1 = call_ok(
		"ResolveSession", &req,
		&histd__v1__resolve_session_response__descriptor);
	assert_true(r1->created);
	assert_non_null(r1->session);
	Histd__V1__ResolveSessionResponse *r2 = call_ok(
		"ResolveSession", &req,
		&histd__v1__resolve_session_response__descriptor);
	assert_false(r2->created);
	assert_string_equal(r1->session->id, r2->session->id);

	/* Other keys: another session. */
	ck[1] = tm_entry(a, &histd__v1__resolve_session_request__context_keys_entry__descriptor,
			 "chat", "c-8");
	Histd__V1__ResolveSessionResponse *r3 = call_ok(
		"ResolveSession", &req,
		&histd__v1__resolve_session_response__descriptor);
	assert_true(r3->created);
	assert_string_not_equal(r1->session->id, r3->session->id);
	histd_client_message_free(&r1->base);
	histd_client_message_free(&r2->base);
	histd_client_message_free(&r3->base);
	ta_free(a);
}

static void list_sessions_pages_in_id_order_and_filters_by_labels(void **state)
{
	(void)state;
	tarena *a = ta_new();
	/* Five sessions labelled for this test, plus two others. */
	for (int i = 0; i < 7; i++) {
		Histd__V1__CreateSessionRequest req =
			HISTD__V1__CREATE_SESSION_REQUEST__INIT;
		req.session_id = ta_printf(a, "list-%d", i);
		Histd__V1__CreateSessionRequest__LabelsEntry *lb[1] = {
			tm_entry(a, &histd__v1__create_session_request__labels_entry__descriptor,
				 "suite", i < 5 ? "list" : "other") };
		req.n_labels = 1;
		req.labels = lb;
		Histd__V1__Session *s = call_ok(
			"CreateSession", &req, &histd__v1__session__descriptor);
		histd_client_message_free(&s->base);
	}

	Histd__V1__ListSessionsRequest req = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__ListSessionsRequest__LabelSelectorEntry *sel[1] = {
		tm_entry(a, &histd__v1__list_sessions_request__label_selector_entry__descriptor,
			 "suite", "list") };
	req.n_label_selector = 1;
	req.label_selector = sel;
	req.page_size = 2;
	char *token = NULL;
	int seen = 0, pages = 0;
	for (;;) {
		req.page_token = token ? token : "";
		Histd__V1__ListSessionsResponse *r = call_ok(
			"ListSessions", &req,
			&histd__v1__list_sessions_response__descriptor);
		assert_true(r->n_sessions <= 2);
		for (size_t i = 0; i < r->n_sessions; i++) {
			char want[16];
			snprintf(want, sizeof(want), "list-%d", seen++);
			assert_string_equal(r->sessions[i]->id, want);
			assert_string_equal(label_of(r->sessions[i], "suite"),
					    "list");
		}
		pages++;
		free(token);
		token = r->next_page_token[0] ? strdup(r->next_page_token)
					      : NULL;
		histd_client_message_free(&r->base);
		if (!token)
			break;
		assert_true(pages < 10);
	}
	assert_int_equal(seen, 5);
	assert_int_equal(pages, 3);
	ta_free(a);
}

static void update_session_replaces_labels_named_by_the_mask(void **state)
{
	(void)state;
	tarena *a = ta_new();
	char *id = t_create_session(client, "update-1");
	Histd__V1__UpdateSessionRequest req =
		HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	req.session_id = id;
	Histd__V1__UpdateSessionRequest__LabelsEntry *lb[1] = {
		tm_entry(a, &histd__v1__update_session_request__labels_entry__descriptor,
			 "stage", "two") };
	req.n_labels = 1;
	req.labels = lb;
	char *paths[1] = { "labels" };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	mask.n_paths = 1;
	mask.paths = paths;
	req.update_mask = &mask;
	req.expected_revision = 1;
	Histd__V1__Session *s =
		call_ok("UpdateSession", &req, &histd__v1__session__descriptor);
	assert_string_equal(label_of(s, "stage"), "two");
	assert_int_equal(s->revision, 2);
	histd_client_message_free(&s->base);
	s = t_get_session(client, id);
	assert_string_equal(label_of(s, "stage"), "two");
	histd_client_message_free(&s->base);
	free(id);
	ta_free(a);
}

static void delete_session_then_get_is_not_found(void **state)
{
	(void)state;
	char *id = t_create_session(client, "delete-1");
	assert_int_equal(t_append_texts(client, id, 2, "bye", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__DeleteSessionRequest req =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	req.session_id = id;
	Histd__V1__DeleteSessionResponse *r = call_ok(
		"DeleteSession", &req,
		&histd__v1__delete_session_response__descriptor);
	histd_client_message_free(&r->base);
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	g.session_id = id;
	assert_int_equal(call_code(client, "GetSession", &g,
				   &histd__v1__session__descriptor),
			 GRPC_STATUS_NOT_FOUND);
	free(id);
}

static void fork_session_copies_messages_up_to_seq_and_keeps_seqs(void **state)
{
	(void)state;
	char *id = t_create_session(client, "fork-src");
	assert_int_equal(t_append_texts(client, id, 5, "src", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__ForkSessionRequest req = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	req.session_id = id;
	req.up_to_seq = 3;
	req.new_session_id = "fork-dst";
	Histd__V1__Session *s =
		call_ok("ForkSession", &req, &histd__v1__session__descriptor);
	assert_string_equal(s->id, "fork-dst");
	histd_client_message_free(&s->base);

	Histd__V1__GetMessagesResponse *g = t_get_raw(client, "fork-dst", 0, 0);
	assert_int_equal(g->n_messages, 3);
	for (size_t i = 0; i < 3; i++) {
		char want[16];
		snprintf(want, sizeof(want), "src %zu", i);
		assert_int_equal(g->messages[i]->seq, i + 1);
		assert_string_equal(tm_first_text(g->messages[i]), want);
	}
	histd_client_message_free(&g->base);

	/* The fork continues after the copied seqs. */
	Histd__V1__AppendResponse *ar = NULL;
	assert_int_equal(t_append_texts(client, "fork-dst", 1, "dst", 0, &ar),
			 GRPC_STATUS_OK);
	assert_int_equal(ar->first_seq, 4);
	histd_client_message_free(&ar->base);
	/* The source is untouched. */
	g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 5);
	histd_client_message_free(&g->base);
	free(id);
}

static void append_assigns_increasing_seqs_and_bumps_the_revision(void **state)
{
	(void)state;
	char *id = t_create_session(client, "append-1");
	Histd__V1__AppendResponse *r = NULL;
	assert_int_equal(t_append_texts(client, id, 3, "a", 1, &r),
			 GRPC_STATUS_OK);
	assert_int_equal(r->first_seq, 1);
	assert_int_equal(r->last_seq, 3);
	assert_int_equal(r->revision, 2);
	assert_int_equal(r->n_token_estimates, 3);
	for (size_t i = 0; i < 3; i++)
		assert_true(r->token_estimates[i] > 0);
	assert_false(r->replayed);
	histd_client_message_free(&r->base);
	assert_int_equal(t_append_texts(client, id, 2, "b", 2, &r),
			 GRPC_STATUS_OK);
	assert_int_equal(r->first_seq, 4);
	assert_int_equal(r->last_seq, 5);
	assert_int_equal(r->revision, 3);
	histd_client_message_free(&r->base);
	free(id);
}

static void append_round_trips_tool_calls_results_metadata_and_state(void **state)
{
	(void)state;
	tarena *a = ta_new();
	char *id = t_create_session(client, "tools-1");
	Histd__V1__Message *msgs[4];
	msgs[0] = tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "be brief");
	msgs[1] = tm_text(a, HISTD__V1__ROLE__ROLE_USER, "weather in Oslo?");
	msgs[2] = tm_tool_call(a, "call_1", "get_weather",
			       "{\"city\":\"Oslo\"}");
	msgs[3] = tm_tool_result(a, "call_1", "get_weather", "-3 C, snow");
	/* Annotations and opaque provider data survive the round trip. */
	msgs[2]->author = "planner";
	Histd__V1__Message__MetadataEntry *md[1] = {
		tm_entry(a, &histd__v1__message__metadata_entry__descriptor,
			 "trace", "t-1") };
	msgs[2]->n_metadata = 1;
	msgs[2]->metadata = md;
	Histd__V1__Message__ProviderStateEntry *ps =
		ta_alloc(a, sizeof(*ps));
	histd__v1__message__provider_state_entry__init(ps);
	ps->key = "anthropic";
	static const uint8_t opaque[] = { 0, 1, 2, 0xff, 0 };
	ps->value.data = (uint8_t *)opaque;
	ps->value.len = sizeof(opaque);
	msgs[2]->n_provider_state = 1;
	msgs[2]->provider_state = &ps;

	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 4;
	req.messages = msgs;
	Histd__V1__AppendResponse *r = call_ok(
		"Append", &req, &histd__v1__append_response__descriptor);
	assert_int_equal(r->last_seq, 4);
	histd_client_message_free(&r->base);

	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 4);
	assert_int_equal(g->messages[0]->role, HISTD__V1__ROLE__ROLE_SYSTEM);
	const Histd__V1__Message *call = g->messages[2];
	assert_int_equal(call->role, HISTD__V1__ROLE__ROLE_ASSISTANT);
	assert_string_equal(call->author, "planner");
	assert_int_equal(call->content[0]->block_case,
			 HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL);
	assert_string_equal(call->content[0]->tool_call->id, "call_1");
	assert_string_equal(call->content[0]->tool_call->name, "get_weather");
	assert_string_equal(call->content[0]->tool_call->arguments,
			    "{\"city\":\"Oslo\"}");
	assert_int_equal(call->n_metadata, 1);
	assert_string_equal(call->metadata[0]->value, "t-1");
	assert_int_equal(call->n_provider_state, 1);
	assert_int_equal(call->provider_state[0]->value.len, sizeof(opaque));
	assert_memory_equal(call->provider_state[0]->value.data, opaque,
			    sizeof(opaque));
	assert_non_null(call->created_at);
	assert_true(call->token_estimate > 0);
	const Histd__V1__Message *res = g->messages[3];
	assert_int_equal(res->content[0]->block_case,
			 HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT);
	assert_string_equal(res->content[0]->tool_result->tool_call_id,
			    "call_1");
	const Histd__V1__ToolResultBlock *tb = res->content[0]->tool_result;
	assert_int_equal(tb->n_content, 1);
	assert_int_equal(tb->content[0]->block_case,
			 HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT);
	assert_string_equal(tb->content[0]->text->text, "-3 C, snow");
	histd_client_message_free(&g->base);

	/* The original result by its call id. */
	Histd__V1__GetToolResultRequest tr =
		HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	tr.session_id = id;
	tr.tool_call_id = "call_1";
	Histd__V1__GetToolResultResponse *t = call_ok(
		"GetToolResult", &tr,
		&histd__v1__get_tool_result_response__descriptor);
	assert_int_equal(t->seq, 4);
	assert_non_null(t->result);
	assert_string_equal(t->result->tool_call_id, "call_1");
	assert_string_equal(t->result->tool_name, "get_weather");
	assert_non_null(t->message);
	assert_int_equal(t->message->seq, 4);
	histd_client_message_free(&t->base);
	free(id);
	ta_free(a);
}

static void get_messages_pages_by_after_seq_and_reads_the_last_n(void **state)
{
	(void)state;
	char *id = t_create_session(client, "pages-1");
	assert_int_equal(t_append_texts(client, id, 25, "p", 0, NULL),
			 GRPC_STATUS_OK);
	uint64_t after = 0, expect = 1;
	int pages = 0;
	do {
		Histd__V1__GetMessagesResponse *g =
			t_get_raw(client, id, after, 10);
		assert_true(g->n_messages <= 10);
		for (size_t i = 0; i < g->n_messages; i++)
			assert_int_equal(g->messages[i]->seq, expect++);
		assert_int_equal(g->revision, 2);
		after = g->next_after_seq;
		pages++;
		histd_client_message_free(&g->base);
	} while (after && pages < 10);
	assert_int_equal(expect, 26);
	assert_int_equal(pages, 3);

	Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	req.session_id = id;
	req.last_n = 4;
	Histd__V1__GetMessagesResponse *g = call_ok(
		"GetMessages", &req, &histd__v1__get_messages_response__descriptor);
	assert_int_equal(g->n_messages, 4);
	assert_int_equal(g->messages[0]->seq, 22);
	assert_int_equal(g->messages[3]->seq, 25);
	assert_string_equal(tm_first_text(g->messages[3]), "p 24");
	assert_true(g->token_estimate > 0);
	histd_client_message_free(&g->base);

	/* The CONTEXT view of a session with no pipeline holds everything. */
	req.last_n = 0;
	req.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	req.limit = 1000;
	g = call_ok("GetMessages", &req,
		    &histd__v1__get_messages_response__descriptor);
	assert_int_equal(g->n_messages, 25);
	histd_client_message_free(&g->base);
	free(id);
}

static void clear_removes_messages_and_seqs_keep_growing(void **state)
{
	(void)state;
	char *id = t_create_session(client, "clear-1");
	assert_int_equal(t_append_texts(client, id, 3, "old", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__ClearRequest req = HISTD__V1__CLEAR_REQUEST__INIT;
	req.session_id = id;
	req.expected_revision = 2;
	Histd__V1__ClearResponse *r =
		call_ok("Clear", &req, &histd__v1__clear_response__descriptor);
	assert_int_equal(r->cleared_to_seq, 3);
	assert_int_equal(r->revision, 3);
	histd_client_message_free(&r->base);
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 0);
	histd_client_message_free(&g->base);
	Histd__V1__AppendResponse *ar = NULL;
	assert_int_equal(t_append_texts(client, id, 1, "new", 0, &ar),
			 GRPC_STATUS_OK);
	assert_int_equal(ar->first_seq, 4);
	histd_client_message_free(&ar->base);
	free(id);
}

static void replace_installs_new_messages_with_new_seqs(void **state)
{
	(void)state;
	tarena *a = ta_new();
	char *id = t_create_session(client, "replace-1");
	assert_int_equal(t_append_texts(client, id, 4, "old", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__ReplaceRequest req = HISTD__V1__REPLACE_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 2;
	req.messages = tm_texts(a, 2, "restored");
	Histd__V1__ReplaceResponse *r =
		call_ok("Replace", &req, &histd__v1__replace_response__descriptor);
	assert_int_equal(r->first_seq, 5);
	assert_int_equal(r->last_seq, 6);
	assert_int_equal(r->revision, 3);
	histd_client_message_free(&r->base);
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 2);
	assert_int_equal(g->messages[0]->seq, 5);
	assert_string_equal(tm_first_text(g->messages[0]), "restored 0");
	assert_string_equal(tm_first_text(g->messages[1]), "restored 1");
	histd_client_message_free(&g->base);
	free(id);
	ta_free(a);
}

static void append_retried_with_its_idempotency_key_replays_the_answer(void **state)
{
	(void)state;
	tarena *a = ta_new();
	char *id = t_create_session(client, "idem-1");
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 2;
	req.messages = tm_texts(a, 2, "once");
	req.idempotency_key = "key-1";
	Histd__V1__AppendResponse *r1 = call_ok(
		"Append", &req, &histd__v1__append_response__descriptor);
	assert_false(r1->replayed);
	Histd__V1__AppendResponse *r2 = call_ok(
		"Append", &req, &histd__v1__append_response__descriptor);
	assert_true(r2->replayed);
	assert_int_equal(r2->first_seq, r1->first_seq);
	assert_int_equal(r2->last_seq, r1->last_seq);
	assert_int_equal(r2->revision, r1->revision);
	histd_client_message_free(&r1->base);
	histd_client_message_free(&r2->base);
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 2);
	histd_client_message_free(&g->base);
	free(id);
	ta_free(a);
}

static void subscribe_streams_an_append(void **state)
{
	(void)state;
	char *id = t_create_session(client, "sub-rpc-1");
	histd_client_stream *s = t_subscribe(client, id, 0);
	assert_int_equal(t_append_texts(client, id, 2, "live", 0, NULL),
			 GRPC_STATUS_OK);
	int res;
	size_t got = 0;
	while (got < 2) {
		Histd__V1__HistoryEvent *ev = t_next_event(s, 10000, &res);
		assert_int_equal(res, HISTD_STREAM_MESSAGE);
		assert_string_equal(ev->session_id, id);
		assert_int_equal(ev->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		for (size_t i = 0; i < ev->appended->n_messages; i++)
			assert_int_equal(ev->appended->messages[i]->seq, ++got);
		histd_client_message_free(&ev->base);
	}
	histd_client_stream_close(s);
	free(id);
}

static void import_then_export_round_trips_over_the_wire(void **state)
{
	(void)state;
	const char *body =
		"{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
		"{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
		"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{"
		"\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
		"\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18 C\"}]}";
	char *id = t_create_session(client, "import-1");
	Histd__V1__ImportRequest ir = HISTD__V1__IMPORT_REQUEST__INIT;
	Histd__V1__ImportResponse *iresp = NULL;
	histd_status st;

	ir.session_id = id;
	ir.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	ir.json = (char *)body;
	histd_status_init(&st);
	assert_int_equal(t_call(client, "Import", &ir,
				&histd__v1__import_response__descriptor,
				&iresp, &st), 0);
	assert_non_null(iresp->append);
	assert_int_equal(iresp->append->first_seq, 1);
	assert_int_equal(iresp->append->last_seq, 4);
	assert_int_equal(iresp->n_dropped, 0);
	histd_client_message_free(&iresp->base);
	histd_status_reset(&st);

	/* The tool result is stored as a tool_result for call_1. */
	Histd__V1__GetToolResultRequest tr = HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	Histd__V1__GetToolResultResponse *tresp = NULL;
	tr.session_id = id;
	tr.tool_call_id = "call_1";
	assert_int_equal(t_call(client, "GetToolResult", &tr,
				&histd__v1__get_tool_result_response__descriptor,
				&tresp, &st), 0);
	assert_int_equal(tresp->seq, 4);
	histd_client_message_free(&tresp->base);
	histd_status_reset(&st);

	/* Exported in the same format: the same request body. */
	Histd__V1__ExportRequest er = HISTD__V1__EXPORT_REQUEST__INIT;
	Histd__V1__ExportResponse *eresp = NULL;
	er.session_id = id;
	er.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	assert_int_equal(t_call(client, "Export", &er,
				&histd__v1__export_response__descriptor,
				&eresp, &st), 0);
	assert_non_null(strstr(eresp->json, "\"tool_call_id\":\"call_1\""));
	assert_non_null(strstr(eresp->json, "\"name\":\"get_weather\""));
	assert_non_null(strstr(eresp->json, "\"role\":\"system\""));
	histd_client_message_free(&eresp->base);
	histd_status_reset(&st);

	/* And as Anthropic wants it: the system prompt at the top. */
	er.format = HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES;
	assert_int_equal(t_call(client, "Export", &er,
				&histd__v1__export_response__descriptor,
				&eresp, &st), 0);
	assert_non_null(strstr(eresp->json, "\"system\""));
	assert_non_null(strstr(eresp->json, "\"tool_use\""));
	assert_non_null(strstr(eresp->json, "\"tool_result\""));
	histd_client_message_free(&eresp->base);
	histd_status_reset(&st);

	/* Malformed JSON: INVALID_ARGUMENT naming the path; nothing appended. */
	ir.json = "{\"messages\":[{\"role\":7}]}";
	assert_int_not_equal(t_call(client, "Import", &ir,
				    &histd__v1__import_response__descriptor,
				    &iresp, &st), 0);
	assert_int_equal(st.code, GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(st.details, "messages[0].role"));
	histd_status_reset(&st);
	free(id);
}

static void reduce_compacts_into_a_summary(void **state)
{
	(void)state;
	char *id = t_create_session(client, "reduce-1");
	Histd__V1__ReduceRequest rr = HISTD__V1__REDUCE_REQUEST__INIT;
	Histd__V1__ReduceResponse *rresp = NULL;
	histd_status st;

	assert_int_equal(t_append_texts(client, id, 40, "turn", 0, NULL),
			 GRPC_STATUS_OK);
	rr.session_id = id;
	rr.max_entries = 10;
	histd_status_init(&st);
	assert_int_equal(t_call(client, "Reduce", &rr,
				&histd__v1__reduce_response__descriptor,
				&rresp, &st), 0);
	assert_non_null(rresp->summary);
	assert_true(rresp->summary->covers_to_seq > 0);
	assert_true(rresp->summary->covers_to_seq < 40);
	histd_client_message_free(&rresp->base);
	histd_status_reset(&st);
	free(id);
}

static void unknown_method_is_unimplemented(void **state)
{
	(void)state;
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	req.session_id = "x";
	const char *paths[] = {
		"/histd.v1.HistoryService/NoSuchMethod",
		"/no.such.Service/Get",
		"/grpc.health.v1.Health/NoSuchMethod",
	};
	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		ProtobufCMessage *resp = NULL;
		histd_status st;
		histd_status_init(&st);
		int64_t t0 = t_now_ms();
		int rc = histd_client_unary(client, paths[i], &req.base,
					    &histd__v1__session__descriptor,
					    T_TIMEOUT_MS, NULL, &resp, &st);
		assert_status(&st, GRPC_STATUS_UNIMPLEMENTED);
		assert_int_equal(rc, histd_status_to_error(GRPC_STATUS_UNIMPLEMENTED));
		assert_null(resp);
		/* Answered, not left to the deadline. */
		assert_true(t_now_ms() - t0 < T_TIMEOUT_MS / 2);
		histd_status_reset(&st);
	}
}

static Grpc__Health__V1__HealthCheckResponse__ServingStatus
health(const char *service, grpc_status_code expect)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	req.service = (char *)service;
	Grpc__Health__V1__HealthCheckResponse *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	histd_client_unary(client, HISTD_PATH_HEALTH_CHECK, &req.base,
			   &grpc__health__v1__health_check_response__descriptor,
			   T_TIMEOUT_MS, NULL, (ProtobufCMessage **)&resp, &st);
	assert_status(&st, expect);
	histd_status_reset(&st);
	Grpc__Health__V1__HealthCheckResponse__ServingStatus s =
		resp ? resp->status
		     : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__UNKNOWN;
	histd_client_message_free(resp ? &resp->base : NULL);
	return s;
}

static void health_check_serves_the_server_and_the_service(void **state)
{
	(void)state;
	assert_int_equal(health("", GRPC_STATUS_OK),
			 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
	assert_int_equal(health("histd.v1.HistoryService", GRPC_STATUS_OK),
			 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
	health("no.such.Service", GRPC_STATUS_NOT_FOUND);
}

static void metadata_sent_by_the_client_is_accepted(void **state)
{
	(void)state;
	/* Custom request metadata must not disturb a call. */
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	char *id = t_create_session(client, "md-1");
	req.session_id = id;
	const char *md[] = { "x-request-id", "r-1", "x-trace", "abc", NULL };
	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	assert_int_equal(histd_client_unary(client, HISTD_PATH("GetSession"),
					    &req.base,
					    &histd__v1__session__descriptor,
					    T_TIMEOUT_MS, md, &resp, &st),
			 0);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);
	histd_status_reset(&st);
	free(id);
}

/* ------------------------------------------------------------------------
 * The client library's own answers. */

static void client_rejects_bad_arguments_without_a_call(void **state)
{
	(void)state;
	histd_client *c = NULL;
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	opt.version = 99;
	assert_int_equal(histd_client_open_ex(server->target, &opt, &c),
			 histd_status_to_error(GRPC_STATUS_INVALID_ARGUMENT));
	assert_null(c);
	assert_int_equal(histd_client_open(NULL, &c),
			 histd_status_to_error(GRPC_STATUS_INVALID_ARGUMENT));

	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	assert_int_equal(histd_client_unary(client, HISTD_PATH("GetSession"),
					    NULL, &histd__v1__session__descriptor,
					    T_TIMEOUT_MS, NULL, &resp, &st),
			 histd_status_to_error(GRPC_STATUS_INVALID_ARGUMENT));
	assert_status(&st, GRPC_STATUS_INVALID_ARGUMENT);
	assert_null(resp);
	histd_status_reset(&st);
}

static void call_to_a_port_nobody_listens_on_is_unavailable_at_once(void **state)
{
	(void)state;
	histd_client *c = NULL;
	/* Port 1 is privileged: nothing of ours listens there. */
	assert_int_equal(histd_client_open("127.0.0.1:1", &c), 0);
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	req.session_id = "x";
	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	int64_t t0 = t_now_ms();
	int rc = histd_client_unary(c, HISTD_PATH("GetSession"), &req.base,
				    &histd__v1__session__descriptor,
				    T_TIMEOUT_MS, NULL, &resp, &st);
	assert_status(&st, GRPC_STATUS_UNAVAILABLE);
	assert_int_equal(rc, histd_status_to_error(GRPC_STATUS_UNAVAILABLE));
	/* Fails fast, not at the deadline. */
	assert_true(t_now_ms() - t0 < T_TIMEOUT_MS / 2);
	histd_status_reset(&st);
	histd_client_close(c);
}

#define MD_KEY "key-md-0123456789abcdef"

/* The first event of a Subscribe from seq 0 through c: its status code, and
 * an appended event when OK. */
static grpc_status_code subscribe_code(histd_client *c, const char *id)
{
	histd_client_stream *s = t_subscribe(c, id, 0);
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, 10000, &res);
	grpc_status_code code = GRPC_STATUS_OK;
	if (ev)
		assert_int_equal(ev->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
	else
		code = histd_client_stream_status(s)->code;
	histd_client_message_free((ProtobufCMessage *)ev);
	histd_client_stream_close(s);
	return code;
}

/* A server that wants a key, which only the client's default metadata
 * carries: with it unary and streaming calls (also one with metadata of
 * its own) are OK; a client whose default metadata lacks it is
 * UNAUTHENTICATED on the same calls. */
static void default_metadata_of_the_client_goes_with_every_call(void **state)
{
	(void)state;
	char dir[] = "/tmp/histd-md-XXXXXX", keys[64];
	assert_non_null(mkdtemp(dir));
	snprintf(keys, sizeof(keys), "%s/keys", dir);
	FILE *f = fopen(keys, "w");
	assert_non_null(f);
	assert_true(fputs(MD_KEY " tenant-md\n", f) >= 0);
	assert_int_equal(fclose(f), 0);
	const char *const args[] = { "--api-keys-file", keys, NULL };
	histd_proc *p = NULL;
	assert_int_equal(harness_start(&p, args), 0);

	static const char *const md[] = { "x-client", "integration",
		"authorization", "Bearer " MD_KEY, NULL };
	static const char *const md_keyless[] = { "x-client", "integration",
						  NULL };
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	histd_client *c = NULL, *keyless = NULL;
	opt.metadata_kv = md;
	assert_int_equal(histd_client_open_ex(p->target, &opt, &c), 0);
	opt.metadata_kv = md_keyless;
	assert_int_equal(histd_client_open_ex(p->target, &opt, &keyless), 0);

	char *id = t_create_session(c, "md-default");
	assert_int_equal(t_append_texts(c, id, 1, "m", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	g.session_id = id;
	static const char *const own[] = { "x-request-id", "r-1", NULL };
	ProtobufCMessage *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	histd_client_unary(c, HISTD_PATH("GetSession"), &g.base,
			   &histd__v1__session__descriptor, T_TIMEOUT_MS, own,
			   &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);
	histd_status_reset(&st);
	assert_int_equal(subscribe_code(c, id), GRPC_STATUS_OK);

	Histd__V1__CreateSessionRequest cr =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	assert_int_equal(call_code(keyless, "CreateSession", &cr,
				   &histd__v1__session__descriptor),
			 GRPC_STATUS_UNAUTHENTICATED);
	assert_int_equal(call_code(keyless, "GetSession", &g,
				   &histd__v1__session__descriptor),
			 GRPC_STATUS_UNAUTHENTICATED);
	assert_int_equal(subscribe_code(keyless, id),
			 GRPC_STATUS_UNAUTHENTICATED);

	free(id);
	histd_client_close(keyless);
	histd_client_close(c);
	assert_int_equal(harness_stop(p), 0);
	assert_int_equal(unlink(keys), 0);
	assert_int_equal(rmdir(dir), 0);
}

int main(int argc, char **argv)
{
	if (harness_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(create_session_with_empty_id_assigns_a_uuid),
		cmocka_unit_test(create_then_get_session_returns_keys_labels_and_stats),
		cmocka_unit_test(resolve_session_gives_the_same_session_for_the_same_keys),
		cmocka_unit_test(list_sessions_pages_in_id_order_and_filters_by_labels),
		cmocka_unit_test(update_session_replaces_labels_named_by_the_mask),
		cmocka_unit_test(delete_session_then_get_is_not_found),
		cmocka_unit_test(fork_session_copies_messages_up_to_seq_and_keeps_seqs),
		cmocka_unit_test(append_assigns_increasing_seqs_and_bumps_the_revision),
		cmocka_unit_test(append_round_trips_tool_calls_results_metadata_and_state),
		cmocka_unit_test(get_messages_pages_by_after_seq_and_reads_the_last_n),
		cmocka_unit_test(clear_removes_messages_and_seqs_keep_growing),
		cmocka_unit_test(replace_installs_new_messages_with_new_seqs),
		cmocka_unit_test(append_retried_with_its_idempotency_key_replays_the_answer),
		cmocka_unit_test(subscribe_streams_an_append),
		cmocka_unit_test(import_then_export_round_trips_over_the_wire),
		cmocka_unit_test(reduce_compacts_into_a_summary),
		cmocka_unit_test(unknown_method_is_unimplemented),
		cmocka_unit_test(health_check_serves_the_server_and_the_service),
		cmocka_unit_test(metadata_sent_by_the_client_is_accepted),
		cmocka_unit_test(client_rejects_bad_arguments_without_a_call),
		cmocka_unit_test(call_to_a_port_nobody_listens_on_is_unavailable_at_once),
		cmocka_unit_test(default_metadata_of_the_client_goes_with_every_call),
		cmocka_unit_test(sigterm_stops_the_server_with_exit_status_0),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
