/*
 * Every status code of the API that applies without auth, over a real
 * channel: what the client sees, including the trailing metadata the API
 * promises. The server runs with small limits so they are cheap to hit.
 * (DEADLINE_EXCEEDED is the client's own: see test_subscribe.c.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "harness.h"

#define MAX_PER_APPEND 10
#define MAX_RECEIVE (256 * 1024)

static histd_proc *server;
static histd_client *client;

static int setup(void **state)
{
	(void)state;
	static const char *const flags[] = {
		"--max-messages-per-append", "10",
		"--max-message-bytes", "262144",
		"--idempotency-ttl", "1",
		NULL,
	};
	if (harness_start(&server, flags))
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

/* Calls name and fills st (reset first); the response is dropped. */
static void call_st(const char *name, const void *req,
		    const ProtobufCMessageDescriptor *resp_desc,
		    histd_status *st)
{
	ProtobufCMessage *resp = NULL;
	histd_status_reset(st);
	t_call(client, name, req, resp_desc, &resp, st);
	if (st->code != GRPC_STATUS_OK)
		assert_null(resp);
	histd_client_message_free(resp);
}

/* Asserts code and that the details contain every one of the NULL-ended
 * fragments. */
static void expect(const histd_status *st, grpc_status_code code, ...)
{
	assert_status(st, code);
	assert_non_null(st->details);
	/* One factual line. */
	assert_null(strchr(st->details, '\n'));
	va_list ap;
	va_start(ap, code);
	const char *frag;
	while ((frag = va_arg(ap, const char *))) {
		if (!strstr(st->details, frag))
			fprintf(stderr, "details \"%s\" lack \"%s\"\n",
				st->details, frag);
		assert_non_null(strstr(st->details, frag));
	}
	va_end(ap);
}

/* ------------------------------------------------------------------------ */

static void invalid_argument_names_the_field_path(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "inval-1");

	/* A message without a role, second in the batch. */
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 2;
	req.messages = tm_texts(a, 2, "fine");
	req.messages[1]->role = HISTD__V1__ROLE__ROLE_UNSPECIFIED;
	call_st("Append", &req, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "messages[1].role", NULL);

	/* Tool call arguments that are not JSON; the text stays out of the
	 * status. */
	Histd__V1__Message *m =
		tm_tool_call(a, "c1", "search", "{secret-argument-text");
	req.n_messages = 1;
	req.messages = &m;
	call_st("Append", &req, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT,
	       "messages[0].content[0].tool_call.arguments", NULL);
	assert_null(strstr(st.details, "secret"));

	/* A tool call in a user message. */
	m->role = HISTD__V1__ROLE__ROLE_USER;
	m->content[0]->tool_call->arguments = "{}";
	call_st("Append", &req, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT,
	       "messages[0].content[0].tool_call", NULL);

	/* No messages at all. */
	req.n_messages = 0;
	req.messages = NULL;
	call_st("Append", &req, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "messages", NULL);

	/* A session id outside [A-Za-z0-9._:-]. */
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	g.session_id = "no spaces/allowed";
	call_st("GetSession", &g, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "session_id", NULL);
	Histd__V1__CreateSessionRequest c =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	c.session_id = "bad id";
	call_st("CreateSession", &c, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "session_id", NULL);

	/* UpdateSession needs its mask, and only known paths. */
	Histd__V1__UpdateSessionRequest u =
		HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	u.session_id = id;
	call_st("UpdateSession", &u, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "update_mask", NULL);
	char *paths[2] = { "labels", "owner" };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	mask.n_paths = 2;
	mask.paths = paths;
	u.update_mask = &mask;
	call_st("UpdateSession", &u, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "update_mask.paths[1]",
	       NULL);

	/* ResolveSession without keys. */
	Histd__V1__ResolveSessionRequest r =
		HISTD__V1__RESOLVE_SESSION_REQUEST__INIT;
	call_st("ResolveSession", &r,
		&histd__v1__resolve_session_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "context_keys", NULL);

	/* A page token the server never gave. */
	Histd__V1__ListSessionsRequest l = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	l.page_token = "not-a-token";
	call_st("ListSessions", &l,
		&histd__v1__list_sessions_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "page_token", NULL);

	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void request_that_does_not_decode_is_invalid_argument(void **state)
{
	(void)state;
	/* A Message with seq set puts a varint in field 1, where an
	 * AppendRequest has a string: it does not decode as one. */
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	m.seq = 5;
	histd_status st;
	histd_status_init(&st);
	call_st("Append", &m, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_INVALID_ARGUMENT, "AppendRequest", NULL);
	histd_status_reset(&st);
}

/* Calls name, about a session that does not exist: NOT_FOUND. */
static void not_found(const char *name, const void *req,
		      const ProtobufCMessageDescriptor *resp_desc)
{
	histd_status st;
	histd_status_init(&st);
	call_st(name, req, resp_desc, &st);
	expect(&st, GRPC_STATUS_NOT_FOUND, NULL);
	histd_status_reset(&st);
}

static void unknown_session_is_not_found_for_every_method(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	const char *id = "never-created";

	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	g.session_id = (char *)id;
	not_found("GetSession", &g, &histd__v1__session__descriptor);
	/* The status never echoes more than the id, if that. */

	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = (char *)id;
	ap.n_messages = 1;
	ap.messages = tm_texts(a, 1, "lost");
	not_found("Append", &ap, &histd__v1__append_response__descriptor);

	Histd__V1__GetMessagesRequest gm = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	gm.session_id = (char *)id;
	not_found("GetMessages", &gm,
		  &histd__v1__get_messages_response__descriptor);

	Histd__V1__ClearRequest cl = HISTD__V1__CLEAR_REQUEST__INIT;
	cl.session_id = (char *)id;
	not_found("Clear", &cl, &histd__v1__clear_response__descriptor);

	Histd__V1__ReplaceRequest rp = HISTD__V1__REPLACE_REQUEST__INIT;
	rp.session_id = (char *)id;
	not_found("Replace", &rp, &histd__v1__replace_response__descriptor);

	Histd__V1__DeleteSessionRequest d =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	d.session_id = (char *)id;
	not_found("DeleteSession", &d,
		  &histd__v1__delete_session_response__descriptor);

	Histd__V1__ForkSessionRequest f = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	f.session_id = (char *)id;
	not_found("ForkSession", &f, &histd__v1__session__descriptor);

	/* Valid but for the session: a mask naming a field, a format. */
	char *labels_path[1] = { "labels" };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	mask.n_paths = 1;
	mask.paths = labels_path;
	Histd__V1__UpdateSessionRequest u =
		HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	u.session_id = (char *)id;
	u.update_mask = &mask;
	not_found("UpdateSession", &u, &histd__v1__session__descriptor);

	Histd__V1__ReduceRequest rd = HISTD__V1__REDUCE_REQUEST__INIT;
	rd.session_id = (char *)id;
	not_found("Reduce", &rd, &histd__v1__reduce_response__descriptor);

	Histd__V1__ExportRequest ex = HISTD__V1__EXPORT_REQUEST__INIT;
	ex.session_id = (char *)id;
	ex.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	not_found("Export", &ex, &histd__v1__export_response__descriptor);

	Histd__V1__ImportRequest im = HISTD__V1__IMPORT_REQUEST__INIT;
	im.session_id = (char *)id;
	im.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	im.json = "{\"messages\": [{\"role\": \"user\", \"content\": \"lost\"}]}";
	not_found("Import", &im, &histd__v1__import_response__descriptor);

	Histd__V1__SearchRequest se = HISTD__V1__SEARCH_REQUEST__INIT;
	se.session_id = (char *)id;
	se.query = "lost";
	not_found("Search", &se, &histd__v1__search_response__descriptor);

	/* A known session, an unknown tool call. */
	char *known = t_create_session(client, "nf-tools");
	Histd__V1__GetToolResultRequest tr =
		HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	tr.session_id = known;
	tr.tool_call_id = "no-such-call";
	call_st("GetToolResult", &tr,
		&histd__v1__get_tool_result_response__descriptor, &st);
	expect(&st, GRPC_STATUS_NOT_FOUND, NULL);

	/* Subscribe ends its stream with NOT_FOUND. */
	histd_client_stream *s = t_subscribe(client, id, 0);
	int res;
	assert_null(t_next_event(s, 10000, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	expect(histd_client_stream_status(s), GRPC_STATUS_NOT_FOUND, NULL);
	histd_client_stream_close(s);

	histd_status_reset(&st);
	free(known);
	ta_free(a);
}

static void create_with_a_taken_id_or_taken_keys_is_already_exists(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	free(t_create_session(client, "dup-1"));
	Histd__V1__CreateSessionRequest c =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	c.session_id = "dup-1";
	call_st("CreateSession", &c, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_ALREADY_EXISTS, NULL);

	Histd__V1__CreateSessionRequest__ContextKeysEntry *ck[1] = {
		tm_entry(a, &histd__v1__create_session_request__context_keys_entry__descriptor,
			 "chat", "dup-keys") };
	c.session_id = "dup-2";
	c.n_context_keys = 1;
	c.context_keys = ck;
	call_st("CreateSession", &c, &histd__v1__session__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	c.session_id = "dup-3";
	call_st("CreateSession", &c, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_ALREADY_EXISTS, NULL);

	/* A fork onto a taken id. */
	Histd__V1__ForkSessionRequest f = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	f.session_id = "dup-1";
	f.new_session_id = "dup-2";
	call_st("ForkSession", &f, &histd__v1__session__descriptor, &st);
	expect(&st, GRPC_STATUS_ALREADY_EXISTS, NULL);
	histd_status_reset(&st);
	ta_free(a);
}

/* The ABORTED contract: the current revision in the message and in the
 * trailing metadata "histd-revision". */
static void expect_conflict(const histd_status *st, uint64_t current)
{
	char rev[32];
	snprintf(rev, sizeof(rev), "%llu", (unsigned long long)current);
	expect(st, GRPC_STATUS_ABORTED, rev, NULL);
	const char *t = histd_status_trailer(st, "histd-revision");
	if (!t)
		t_print_status("no histd-revision trailer", st);
	assert_non_null(t);
	assert_string_equal(t, rev);
}

static void stale_expected_revision_is_aborted_with_the_revision_trailer(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "cas-1");
	/* revision 1 -> 2 -> 3 */
	assert_int_equal(t_append_texts(client, id, 1, "x", 1, NULL),
			 GRPC_STATUS_OK);
	assert_int_equal(t_append_texts(client, id, 1, "y", 2, NULL),
			 GRPC_STATUS_OK);

	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = id;
	ap.n_messages = 1;
	ap.messages = tm_texts(a, 1, "late");
	ap.expected_revision = 2;
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	expect_conflict(&st, 3);
	/* The stale append wrote nothing. */
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 2);
	histd_client_message_free(&g->base);

	Histd__V1__ClearRequest cl = HISTD__V1__CLEAR_REQUEST__INIT;
	cl.session_id = id;
	cl.expected_revision = 1;
	call_st("Clear", &cl, &histd__v1__clear_response__descriptor, &st);
	expect_conflict(&st, 3);

	Histd__V1__ReplaceRequest rp = HISTD__V1__REPLACE_REQUEST__INIT;
	rp.session_id = id;
	rp.expected_revision = 99;
	call_st("Replace", &rp, &histd__v1__replace_response__descriptor,
		&st);
	expect_conflict(&st, 3);

	Histd__V1__UpdateSessionRequest u =
		HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	u.session_id = id;
	char *paths[1] = { "labels" };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	mask.n_paths = 1;
	mask.paths = paths;
	u.update_mask = &mask;
	u.expected_revision = 2;
	call_st("UpdateSession", &u, &histd__v1__session__descriptor, &st);
	expect_conflict(&st, 3);

	Histd__V1__DeleteSessionRequest d =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	d.session_id = id;
	d.expected_revision = 2;
	call_st("DeleteSession", &d,
		&histd__v1__delete_session_response__descriptor, &st);
	expect_conflict(&st, 3);

	/* The right revision still works. */
	ap.expected_revision = 3;
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void idempotency_key_reused_with_another_request_is_failed_precondition(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "idem-fp");
	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = id;
	ap.n_messages = 1;
	ap.messages = tm_texts(a, 1, "first");
	ap.idempotency_key = "k-1";
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	ap.messages = tm_texts(a, 1, "second");
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_FAILED_PRECONDITION, "idempotency_key", NULL);
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 1);
	assert_string_equal(tm_first_text(g->messages[0]), "first 0");
	histd_client_message_free(&g->base);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void idempotency_key_is_forgotten_after_the_ttl(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "idem-ttl");
	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = id;
	ap.n_messages = 1;
	ap.messages = tm_texts(a, 1, "again");
	ap.idempotency_key = "k-ttl";
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	/* --idempotency-ttl 1: past it the same request appends again. */
	struct timespec ts = { 2, 200 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	Histd__V1__AppendResponse *r = NULL;
	histd_status_reset(&st);
	t_call(client, "Append", &ap, &histd__v1__append_response__descriptor,
	       &r, &st);
	assert_status(&st, GRPC_STATUS_OK);
	assert_false(r->replayed);
	assert_int_equal(r->first_seq, 2);
	histd_client_message_free(&r->base);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void too_many_messages_in_one_append_is_resource_exhausted(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "limit-count");
	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = id;
	ap.n_messages = MAX_PER_APPEND + 1;
	ap.messages = tm_texts(a, ap.n_messages, "many");
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "messages", "10", NULL);
	/* Replace has the same bound. */
	Histd__V1__ReplaceRequest rp = HISTD__V1__REPLACE_REQUEST__INIT;
	rp.session_id = id;
	rp.n_messages = ap.n_messages;
	rp.messages = ap.messages;
	call_st("Replace", &rp, &histd__v1__replace_response__descriptor,
		&st);
	expect(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);
	/* Exactly the limit is fine. */
	ap.n_messages = MAX_PER_APPEND;
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void request_over_max_message_bytes_is_resource_exhausted(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "limit-bytes");
	size_t n = MAX_RECEIVE + 4096;
	char *big = ta_alloc(a, n + 1);
	memset(big, 'x', n);
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER, big);
	Histd__V1__AppendRequest ap = HISTD__V1__APPEND_REQUEST__INIT;
	ap.session_id = id;
	ap.n_messages = 1;
	ap.messages = &m;
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	expect(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL);

	/* Nothing was appended and the server goes on serving; a request
	 * just under the limit passes. */
	Histd__V1__GetMessagesResponse *g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 0);
	histd_client_message_free(&g->base);
	big[MAX_RECEIVE - 1024] = '\0';
	m->content[0]->text->text = big;
	call_st("Append", &ap, &histd__v1__append_response__descriptor, &st);
	assert_status(&st, GRPC_STATUS_OK);
	g = t_get_raw(client, id, 0, 0);
	assert_int_equal(g->n_messages, 1);
	assert_int_equal(strlen(tm_first_text(g->messages[0])),
			 MAX_RECEIVE - 1024);
	histd_client_message_free(&g->base);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

int main(int argc, char **argv)
{
	if (harness_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(invalid_argument_names_the_field_path),
		cmocka_unit_test(request_that_does_not_decode_is_invalid_argument),
		cmocka_unit_test(unknown_session_is_not_found_for_every_method),
		cmocka_unit_test(create_with_a_taken_id_or_taken_keys_is_already_exists),
		cmocka_unit_test(stale_expected_revision_is_aborted_with_the_revision_trailer),
		cmocka_unit_test(idempotency_key_reused_with_another_request_is_failed_precondition),
		cmocka_unit_test(idempotency_key_is_forgotten_after_the_ttl),
		cmocka_unit_test(too_many_messages_in_one_append_is_resource_exhausted),
		cmocka_unit_test(request_over_max_message_bytes_is_resource_exhausted),
		cmocka_unit_test(sigterm_stops_the_server_with_exit_status_0),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
