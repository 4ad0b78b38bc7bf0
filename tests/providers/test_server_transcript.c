/*
 * server/transcript.c on the memory driver: a golden transcript imported,
 * appended as Append would (packed, with its tool call refs), and exported
 * through histd_transcript_export gives the same transcript; bad formats
 * and views name the field; an unknown session is NOT_FOUND.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../server/transcript.h"

static char *
slurp(const char *name, size_t *len)
{
	char path[512], *buf;
	FILE *f;
	long n;

	snprintf(path, sizeof(path), "%s/%s", GOLDEN_DIR, name);
	assert_non_null(f = fopen(path, "rb"));
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)n + 1);
	*len = fread(buf, 1, (size_t)n, f);
	buf[*len] = '\0';
	fclose(f);
	return buf;
}

/* Appends t's messages the way service.c does, minus token estimates. */
static void
append_all(histd_driver *d, histd_transcript *t)
{
	histd_msg_in *in = calloc(t->n_messages, sizeof(*in));
	histd_tool_ref *refs = calloc(256, sizeof(*refs));
	uint8_t **bufs = calloc(t->n_messages, sizeof(*bufs));
	histd_append a = { .tenant = "t", .session_id = "s1",
			   .msgs = in, .n_msgs = t->n_messages };
	histd_append_result res;
	size_t r = 0;

	for (size_t i = 0; i < t->n_messages; i++) {
		Histd__V1__Message *m = t->messages[i];
		size_t n = histd__v1__message__get_packed_size(m);

		bufs[i] = malloc(n);
		in[i].len = histd__v1__message__pack(m, bufs[i]);
		in[i].data = bufs[i];
		in[i].calls = &refs[r];
		for (size_t j = 0; j < m->n_content; j++)
			if (m->content[j]->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
				refs[r].id = m->content[j]->tool_call->id;
				refs[r++].block = (uint32_t)j;
				in[i].n_calls++;
			}
		in[i].results = &refs[r];
		for (size_t j = 0; j < m->n_content; j++)
			if (m->content[j]->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
				refs[r].id =
					m->content[j]->tool_result->tool_call_id;
				refs[r++].block = (uint32_t)j;
				in[i].n_results++;
			}
	}
	assert_int_equal(histd_driver_append(d, &a, &res), 0);
	for (size_t i = 0; i < t->n_messages; i++)
		free(bufs[i]);
	free(bufs);
	free(refs);
	free(in);
}

static void
import_append_export_is_lossless(void **state)
{
	static const struct {
		const char *file;
		Histd__V1__Format f;
		const char *keys[2];
	} cases[] = {
		{ "anthropic_thinking.json",
		  HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
		  { "system", "messages" } },
		{ "openai_responses_reasoning.json",
		  HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  { "instructions", "input" } },
		{ "gemini_function_calling.json",
		  HISTD__V1__FORMAT__FORMAT_GEMINI,
		  { "systemInstruction", "contents" } },
		/* instructions "" and arguments "": marks on the stored
		 * messages. */
		{ "openai_responses_empty_instructions.json",
		  HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  { "instructions", "input" } },
		{ "openai_chat_empty_arguments.json",
		  HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT, { "messages" } },
	};

	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		Histd__V1__ImportRequest ir = HISTD__V1__IMPORT_REQUEST__INIT;
		Histd__V1__ExportRequest er = HISTD__V1__EXPORT_REQUEST__INIT;
		Histd__V1__ExportResponse *resp;
		histd_session in = { .tenant = "t", .id = "s1" }, *s;
		histd_transcript t = { 0 };
		histd_driver *d;
		json_t *want, *got, *orig;
		uint8_t *out;
		size_t len;

		assert_int_equal(histd_driver_open("memory", &(histd_driver_config){ 0 }, &d), 0);
		assert_int_equal(histd_driver_session_create(d, &in, &s), 0);
		histd_session_free(s);
		ir.format = cases[c].f;
		ir.json = slurp(cases[c].file, &len);
		assert_int_equal(histd_transcript_import(NULL, NULL, &ir, NULL, &t), 0);
		append_all(d, &t);
		er.session_id = "s1";
		er.format = cases[c].f;
		er.view = HISTD__V1__VIEW__VIEW_CONTEXT;
		assert_int_equal(histd_transcript_export(d, "t", &er, 0, &out,
							 &len), 0);
		resp = histd__v1__export_response__unpack(NULL, len, out);
		assert_non_null(resp);
		assert_int_equal(resp->n_dropped, 0);
		orig = json_loads(ir.json, 0, NULL);
		want = json_object();
		for (int k = 0; k < 2; k++)
			if (json_object_get(orig, cases[c].keys[k]))
				json_object_set(want, cases[c].keys[k],
					json_object_get(orig, cases[c].keys[k]));
		got = json_loads(resp->json, 0, NULL);
		assert_true(json_equal(want, got));
		json_decref(orig);
		json_decref(want);
		json_decref(got);
		histd__v1__export_response__free_unpacked(resp, NULL);
		free(out);
		free(ir.json);
		histd_transcript_clear(&t);
		histd_driver_close(d);
	}
}

static void
bad_requests_name_the_field(void **state)
{
	Histd__V1__ExportRequest er = HISTD__V1__EXPORT_REQUEST__INIT;
	Histd__V1__ImportRequest ir = HISTD__V1__IMPORT_REQUEST__INIT;
	histd_transcript t = { 0 };
	histd_driver *d;
	uint8_t *out;
	size_t len;

	(void)state;
	assert_int_equal(histd_driver_open("memory", &(histd_driver_config){ 0 }, &d), 0);
	er.session_id = "nope";
	assert_int_equal(histd_transcript_export(d, "t", &er, 0, &out, &len),
			 HISTD_EINVALID);
	assert_string_equal(histd_error_message(), "format is required");
	er.format = 99;
	assert_int_equal(histd_transcript_export(d, "t", &er, 0, &out, &len),
			 HISTD_EINVALID);
	er.format = HISTD__V1__FORMAT__FORMAT_MISTRAL;
	er.view = 7;
	assert_int_equal(histd_transcript_export(d, "t", &er, 0, &out, &len),
			 HISTD_EINVALID);
	er.view = 0;
	assert_int_equal(histd_transcript_export(d, "t", &er, 0, &out, &len),
			 HISTD_ENOTFOUND);
	ir.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	ir.json = "{\"messages\":[]}";
	assert_int_equal(histd_transcript_import(NULL, NULL, &ir, NULL, &t),
			 HISTD_EINVALID);
	histd_driver_close(d);
}

static void
import_reply_carries_dropped(void **state)
{
	Histd__V1__ImportRequest ir = HISTD__V1__IMPORT_REQUEST__INIT;
	Histd__V1__AppendResponse ar = HISTD__V1__APPEND_RESPONSE__INIT;
	Histd__V1__ImportResponse *r;
	histd_transcript t = { 0 };
	uint8_t *out;
	size_t len;

	(void)state;
	ir.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	ir.json = "{\"model\":\"x\",\"messages\":[{\"role\":\"user\","
		  "\"content\":\"hi\"}]}";
	assert_int_equal(histd_transcript_import(NULL, NULL, &ir, NULL, &t), 0);
	ar.first_seq = 1;
	ar.last_seq = 1;
	assert_int_equal(histd_transcript_import_reply(&ar, &t, &out, &len),
			 0);
	r = histd__v1__import_response__unpack(NULL, len, out);
	assert_non_null(r);
	assert_int_equal(r->append->last_seq, 1);
	assert_int_equal(r->n_dropped, 1);
	histd__v1__import_response__free_unpacked(r, NULL);
	free(out);
	histd_transcript_clear(&t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(import_append_export_is_lossless),
		cmocka_unit_test(bad_requests_name_the_field),
		cmocka_unit_test(import_reply_carries_dropped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
