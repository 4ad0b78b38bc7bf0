/*
 * Import through the real histd binary (integration harness, memory
 * driver): a Gemini functionResponse without an id answers the oldest open
 * call of its name, also when that call came in an earlier Import, as in
 * an agent loop that imports turn by turn. Checked with GetMessages: the
 * result's tool_call_id is the id histd made up for the call.
 *
 * argv[1] is the histd binary (harness.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "harness.h"

static histd_proc *server;
static histd_client *client;

static int
setup(void **state)
{
	(void)state;
	if (harness_start(&server, NULL))
		return -1;
	client = harness_client(server);
	return 0;
}

static int
teardown(void **state)
{
	int rc;

	(void)state;
	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	return rc;
}

#define USER_HI "{\"role\":\"user\",\"parts\":[{\"text\":\"hi\"}]}"
#define CALL(args) "{\"functionCall\":{\"name\":\"f\",\"args\":" args "}}"
#define RESP(name) "{\"role\":\"user\",\"parts\":[{\"functionResponse\":" \
	"{\"name\":\"" name "\",\"response\":{\"r\":1}}}]}"

/* Imports a body of format with idempotency key key (may be ""); returns
 * the status code, with the details in details (may be NULL) when it is
 * not OK, and the answer's first_seq and replayed in *first_seq and
 * *replayed (may be NULL) when it is. */
static grpc_status_code
import_body(Histd__V1__Format format, const char *session_id,
	    const char *body, const char *key, char *details, size_t dlen,
	    uint64_t *first_seq, int *replayed)
{
	Histd__V1__ImportRequest ir = HISTD__V1__IMPORT_REQUEST__INIT;
	Histd__V1__ImportResponse *resp = NULL;
	grpc_status_code code;
	histd_status st;

	ir.session_id = (char *)session_id;
	ir.format = format;
	ir.json = (char *)body;
	ir.idempotency_key = (char *)key;
	histd_status_init(&st);
	t_call(client, "Import", &ir, &histd__v1__import_response__descriptor,
	       &resp, &st);
	code = st.code;
	if (details)
		snprintf(details, dlen, "%s", st.details ? st.details : "");
	if (resp && resp->append) {
		if (first_seq)
			*first_seq = resp->append->first_seq;
		if (replayed)
			*replayed = resp->append->replayed;
	}
	if (resp)
		histd_client_message_free(&resp->base);
	histd_status_reset(&st);
	return code;
}

static grpc_status_code
import_gemini(const char *session_id, const char *body, char *details,
	      size_t dlen)
{
	return import_body(HISTD__V1__FORMAT__FORMAT_GEMINI, session_id, body,
			   "", details, dlen, NULL, NULL);
}

/* The user says hi; the model calls f (no id): one Import. */
static void
import_one_call(const char *session_id)
{
	assert_int_equal(import_gemini(session_id, "{\"contents\":[" USER_HI
				       ",{\"role\":\"model\",\"parts\":["
				       CALL("{}") "]}]}", NULL, 0),
			 GRPC_STATUS_OK);
}

/* The session holds n tool calls with ids histd made up and n results,
 * the i-th result answering the i-th call (in seq order). */
static void
assert_results_answer_calls(const char *session_id, size_t n)
{
	Histd__V1__GetMessagesResponse *r = t_get_raw(client, session_id, 0, 0);
	const char *calls[8], *results[8];
	size_t nc = 0, nr = 0;

	for (size_t i = 0; i < r->n_messages; i++)
		for (size_t j = 0; j < r->messages[i]->n_content; j++) {
			const Histd__V1__ContentBlock *b =
				r->messages[i]->content[j];

			assert_true(nc < 8 && nr < 8);
			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL)
				calls[nc++] = b->tool_call->id;
			else if (b->block_case ==
				 HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				results[nr++] = b->tool_result->tool_call_id;
		}
	assert_int_equal(nc, n);
	assert_int_equal(nr, n);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(strncmp(calls[i], "gemini_", 7), 0);
		assert_string_equal(results[i], calls[i]);
	}
	histd_client_message_free(&r->base);
}

static void
id_less_response_answers_a_call_of_an_earlier_import(void **state)
{
	char *id = t_create_session(client, "gemini-turns");

	(void)state;
	import_one_call(id);
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") "]}",
				       NULL, 0),
			 GRPC_STATUS_OK);
	assert_results_answer_calls(id, 1);
	free(id);
}

static void
open_calls_of_one_name_are_answered_oldest_first_across_imports(void **state)
{
	char *id = t_create_session(client, "gemini-oldest");

	(void)state;
	/* Two parallel calls of f; then one response per Import; then a
	 * body with a response (to the stored call), a new call and a
	 * response (to the new call). */
	assert_int_equal(import_gemini(id, "{\"contents\":[" USER_HI ","
				       "{\"role\":\"model\",\"parts\":["
				       CALL("{\"a\":1}") "," CALL("{\"a\":2}")
				       "]}]}", NULL, 0),
			 GRPC_STATUS_OK);
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") "]}",
				       NULL, 0),
			 GRPC_STATUS_OK);
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") ","
				       "{\"role\":\"model\",\"parts\":["
				       CALL("{\"a\":3}") "]}," RESP("f") "]}",
				       NULL, 0),
			 GRPC_STATUS_OK);
	assert_results_answer_calls(id, 3);
	free(id);
}

static void
id_less_response_without_an_open_call_names_the_field(void **state)
{
	char *id = t_create_session(client, "gemini-unanswered");
	char details[256];

	(void)state;
	import_one_call(id);
	/* Another name: no open call. */
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("g") "]}",
				       details, sizeof(details)),
			 GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(details, "contents[0].parts[0]."
			       "functionResponse.name"));
	/* f answered: a second response has no open call either. */
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") "]}",
				       NULL, 0),
			 GRPC_STATUS_OK);
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") "]}",
				       details, sizeof(details)),
			 GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(details, "contents[0].parts[0]."
			       "functionResponse.name"));
	free(id);
}

static void
a_call_older_than_the_tail_is_not_seen(void **state)
{
	char *id = t_create_session(client, "gemini-tail");
	char details[256];

	(void)state;
	import_one_call(id);
	/* 100 messages after the call: the call falls out of the tail
	 * (HISTD_IMPORT_TAIL). */
	assert_int_equal(t_append_texts(client, id, 100, "filler", 0, NULL),
			 GRPC_STATUS_OK);
	assert_int_equal(import_gemini(id, "{\"contents\":[" RESP("f") "]}",
				       details, sizeof(details)),
			 GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(details, "functionResponse.name"));
	free(id);
}

/* A retried Import (same idempotency_key) whose id-less response
 * answered a call of an earlier Import: its own first attempt answered
 * that call, yet the retry gets the first answer, replayed, and appends
 * nothing. */
static void
retried_import_of_an_id_less_response_is_replayed(void **state)
{
	char *id = t_create_session(client, "gemini-retry");
	const char *body = "{\"contents\":[" RESP("f") "]}";
	char details[256];
	uint64_t first = 0, again = 0;
	int replayed = -1;

	(void)state;
	import_one_call(id);
	assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI, id, body, "turn-2", NULL, 0,
					   &first, &replayed),
			 GRPC_STATUS_OK);
	assert_int_equal(replayed, 0);
	assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI, id, body, "turn-2", details,
					   sizeof(details), &again,
					   &replayed),
			 GRPC_STATUS_OK);
	assert_int_equal(replayed, 1);
	assert_int_equal(again, first);
	assert_results_answer_calls(id, 1);
	/* A key never used: the body's own error. */
	assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI, id, body, "turn-3", details,
					   sizeof(details), NULL, NULL),
			 GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(details, "contents[0].parts[0]."
			       "functionResponse.name"));
	free(id);
}

/* An error the append finds names histd's message; the body's numbering
 * differs (a system prompt, items grouped), so the message says where in
 * the body that message begins, and says nothing more when both agree. */
static void
append_errors_say_where_the_message_begins_in_the_body(void **state)
{
	static const struct {
		Histd__V1__Format format;
		const char *body, *origin;
	} cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
		  "{\"system\":\"s\",\"messages\":[{\"role\":\"user\","
		  "\"content\":\"q\"},{\"role\":\"user\",\"content\":[{"
		  "\"type\":\"tool_result\",\"tool_use_id\":\"zz\","
		  "\"content\":\"r\"}]}]}",
		  " (histd's messages[2] begins at messages[1] in the body)" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"instructions\":\"s\",\"input\":[{\"role\":\"user\","
		  "\"content\":\"q\"},{\"type\":\"function_call_output\","
		  "\"call_id\":\"zz\",\"output\":\"r\"}]}",
		  " (histd's messages[2] begins at input[1] in the body)" },
		{ HISTD__V1__FORMAT__FORMAT_GEMINI,
		  "{\"systemInstruction\":{\"parts\":[{\"text\":\"s\"}]},"
		  "\"contents\":[" USER_HI ",{\"role\":\"user\",\"parts\":"
		  "[{\"functionResponse\":{\"id\":\"zz\",\"name\":\"f\","
		  "\"response\":{}}}]}]}",
		  " (histd's messages[2] begins at contents[1] in the body)" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
		  "{\"role\":\"tool\",\"tool_call_id\":\"zz\","
		  "\"content\":\"r\"}]}",
		  "" },
	};
	const char *what = "messages[%u].content[0].tool_result.tool_call_id "
			   "does not answer an open tool call%s";

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *id = t_create_session(client, NULL);
		char details[512], want[512];
		Histd__V1__GetMessagesResponse *raw;

		assert_int_equal(import_body(cases[i].format, id,
					     cases[i].body, "", details,
					     sizeof(details), NULL, NULL),
				 GRPC_STATUS_INVALID_ARGUMENT);
		snprintf(want, sizeof(want), what, cases[i].origin[0] ? 2 : 1,
			 cases[i].origin);
		assert_string_equal(details, want);
		/* Nothing was stored. */
		raw = t_get_raw(client, id, 0, 10);
		assert_int_equal(raw->n_messages, 0);
		histd_client_message_free(&raw->base);
		free(id);
	}
}

/* A body of n Gemini turns: the user's text (a `fill` byte repeated
 * text_len times, "hi" when 0), then, if image_len, one image of that
 * many bytes (zeros, as base64). malloc'ed. */
static char *
gemini_body(size_t n, size_t text_len, char fill, size_t image_len)
{
	size_t b64 = (image_len + 2) / 3 * 4;
	size_t cap = 64 + n * (64 + text_len) + b64 + 128, o;
	char *s = malloc(cap);

	assert_non_null(s);
	o = (size_t)sprintf(s, "{\"contents\":[");
	for (size_t i = 0; i < n; i++) {
		o += (size_t)sprintf(s + o, "%s{\"role\":\"user\",\"parts\":"
				     "[{\"text\":\"", i ? "," : "");
		if (text_len) {
			memset(s + o, fill, text_len);
			o += text_len;
		} else {
			o += (size_t)sprintf(s + o, "hi");
		}
		o += (size_t)sprintf(s + o, "\"}");
		if (image_len && i == n - 1) {
			o += (size_t)sprintf(s + o, ",{\"inlineData\":{"
					     "\"mimeType\":\"image/png\","
					     "\"data\":\"");
			memset(s + o, 'A', b64);
			o += b64;
			o += (size_t)sprintf(s + o, "\"}}");
		}
		o += (size_t)sprintf(s + o, "]}");
	}
	sprintf(s + o, "]}");
	return s;
}

/* The limits Append answers RESOURCE_EXHAUSTED for are RESOURCE_EXHAUSTED
 * on Import too, and change nothing: more messages than
 * --max-messages-per-append (1000), a string too long to be the base64 of
 * a stored message, a message over --max-stored-message-bytes (1 MiB).
 * An image whose base64 is longer than 1 MiB but whose bytes fit is
 * stored, as Append stores it. */
static void
limits_are_resource_exhausted_as_on_append(void **state)
{
	struct {
		size_t n, text_len, image_len;
		const char *says;
	} over[] = {
		{ 1001, 0, 0, "more than 1000 messages" },
		{ 1, 1500000, 0, "a string is 1500000 bytes" },
		{ 1, 1200000, 0, "bytes; the limit is 1048576 (histd" },
	};
	Histd__V1__GetMessagesResponse *raw;
	char details[512];
	char *body;

	(void)state;
	free(t_create_session(client, "limits"));
	for (size_t i = 0; i < sizeof(over) / sizeof(over[0]); i++) {
		body = gemini_body(over[i].n, over[i].text_len, 'w',
				   over[i].image_len);
		assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI,
					     "limits", body, "", details,
					     sizeof(details), NULL, NULL),
				 GRPC_STATUS_RESOURCE_EXHAUSTED);
		if (!strstr(details, over[i].says))
			fail_msg("case %zu: \"%s\" does not say \"%s\"", i,
				 details, over[i].says);
		free(body);
		raw = t_get_raw(client, "limits", 0, 10);
		assert_int_equal(raw->n_messages, 0);
		histd_client_message_free(&raw->base);
	}
	/* 900,000 bytes of image: 1,200,000 characters of base64. */
	body = gemini_body(1, 0, 'w', 900000);
	assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI, "limits",
				     body, "", details, sizeof(details), NULL,
				     NULL),
			 GRPC_STATUS_OK);
	free(body);
	raw = t_get_raw(client, "limits", 0, 10);
	assert_int_equal(raw->n_messages, 1);
	histd_client_message_free(&raw->base);
}

/* Export of the session's view in format; the status code, the details
 * in details. */
static grpc_status_code
export_status(const char *session_id, Histd__V1__View view,
	      Histd__V1__Format format, char *details, size_t dlen)
{
	Histd__V1__ExportRequest er = HISTD__V1__EXPORT_REQUEST__INIT;
	Histd__V1__ExportResponse *resp = NULL;
	grpc_status_code code;
	histd_status st;

	er.session_id = (char *)session_id;
	er.view = view;
	er.format = format;
	histd_status_init(&st);
	t_call(client, "Export", &er, &histd__v1__export_response__descriptor,
	       &resp, &st);
	code = st.code;
	snprintf(details, dlen, "%s", st.details ? st.details : "");
	if (resp)
		histd_client_message_free(&resp->base);
	histd_status_reset(&st);
	return code;
}

/* An Export is one answer: a transcript over --max-response-bytes is
 * RESOURCE_EXHAUSTED naming it, in both views, and a session whose
 * stored messages pass twice the limit is not read to the end first. A
 * bad format is INVALID_ARGUMENT before anything is read, in both views. */
static void
an_export_larger_than_an_answer_is_resource_exhausted(void **state)
{
	const char *extra[] = { "--max-response-bytes", "20000", NULL };
	struct {
		const char *id;
		size_t n;
		grpc_status_code code;
		const char *says;
	} cases[] = {
		{ "fits", 5, GRPC_STATUS_OK, "" },
		{ "big", 25, GRPC_STATUS_RESOURCE_EXHAUSTED,
		  "bytes; an Export answer is at most 20000 "
		  "(--max-response-bytes)" },
		{ "huge", 50, GRPC_STATUS_RESOURCE_EXHAUSTED,
		  "the session's messages are over 40000 bytes" },
	};
	const Histd__V1__View views[] = { HISTD__V1__VIEW__VIEW_RAW,
					  HISTD__V1__VIEW__VIEW_CONTEXT };
	histd_client *saved = client;
	histd_proc *narrow;
	char details[512];
	int status;

	(void)state;
	assert_int_equal(harness_start(&narrow, extra), 0);
	client = harness_client(narrow);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *body = gemini_body(cases[i].n, 1000, 'w', 0);

		free(t_create_session(client, cases[i].id));
		assert_int_equal(import_body(HISTD__V1__FORMAT__FORMAT_GEMINI,
					     cases[i].id, body, "", details,
					     sizeof(details), NULL, NULL),
				 GRPC_STATUS_OK);
		free(body);
		for (size_t v = 0; v < 2; v++) {
			assert_int_equal(export_status(cases[i].id, views[v],
					 HISTD__V1__FORMAT__FORMAT_GEMINI,
					 details, sizeof(details)),
					 cases[i].code);
			if (!strstr(details, cases[i].says))
				fail_msg("%s: \"%s\" does not say \"%s\"",
					 cases[i].id, details, cases[i].says);
		}
	}
	for (size_t v = 0; v < 2; v++) {
		assert_int_equal(export_status("no-such-session", views[v],
					       HISTD__V1__FORMAT__FORMAT_UNSPECIFIED,
					       details, sizeof(details)),
				 GRPC_STATUS_INVALID_ARGUMENT);
		assert_string_equal(details, "format is required");
	}
	histd_client_close(client);
	client = saved;
	status = harness_stop(narrow);
	assert_int_equal(status, 0);
}

static void
an_unknown_session_stays_not_found(void **state)
{
	(void)state;
	/* The tail read and the append both say NOT_FOUND. */
	assert_int_equal(import_gemini("no-such-session",
				       "{\"contents\":[" RESP("f") "]}",
				       NULL, 0),
			 GRPC_STATUS_NOT_FOUND);
	assert_int_equal(import_gemini("no-such-session",
				       "{\"contents\":[" USER_HI "]}", NULL, 0),
			 GRPC_STATUS_NOT_FOUND);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(
			id_less_response_answers_a_call_of_an_earlier_import),
		cmocka_unit_test(
			open_calls_of_one_name_are_answered_oldest_first_across_imports),
		cmocka_unit_test(
			id_less_response_without_an_open_call_names_the_field),
		cmocka_unit_test(a_call_older_than_the_tail_is_not_seen),
		cmocka_unit_test(
			retried_import_of_an_id_less_response_is_replayed),
		cmocka_unit_test(
			append_errors_say_where_the_message_begins_in_the_body),
		cmocka_unit_test(an_unknown_session_stays_not_found),
		cmocka_unit_test(limits_are_resource_exhausted_as_on_append),
		cmocka_unit_test(
			an_export_larger_than_an_answer_is_resource_exhausted),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
