/*
 * Transcripts: every golden transcript (tests/providers/golden, built from
 * the providers' documented examples) survives import then export in its
 * own format, also after the messages were packed and unpacked as storage
 * does; converts to every other format into a body that format imports
 * again; and keeps tool calls paired with their results.
 */
#include <dirent.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "transcript.h"

typedef struct golden {
	char name[300];
	Histd__V1__Format format;
	char *json;
	size_t len;
} golden;

static golden goldens[64];
static size_t n_goldens;

static const Histd__V1__Format formats[] = {
	HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
	HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
	HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
	HISTD__V1__FORMAT__FORMAT_GEMINI,
	HISTD__V1__FORMAT__FORMAT_MISTRAL,
};

static int
format_of(const char *file, Histd__V1__Format *f)
{
	static const struct {
		const char *prefix;
		Histd__V1__Format f;
	} p[] = {
		{ "anthropic_", HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES },
		{ "openai_chat_", HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT },
		{ "openai_responses_", HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES },
		{ "gemini_", HISTD__V1__FORMAT__FORMAT_GEMINI },
		{ "mistral_", HISTD__V1__FORMAT__FORMAT_MISTRAL },
	};

	for (size_t i = 0; i < sizeof(p) / sizeof(p[0]); i++)
		if (!strncmp(file, p[i].prefix, strlen(p[i].prefix))) {
			*f = p[i].f;
			return 0;
		}
	return -1;
}

static int
load_goldens(void **state)
{
	DIR *d = opendir(GOLDEN_DIR);
	struct dirent *e;

	(void)state;
	if (!d)
		return -1;
	while ((e = readdir(d)) && n_goldens < 64) {
		golden *g = &goldens[n_goldens];
		char path[512];
		FILE *f;
		long n;

		if (!strstr(e->d_name, ".json") ||
		    format_of(e->d_name, &g->format))
			continue;
		snprintf(g->name, sizeof(g->name), "%s", e->d_name);
		snprintf(path, sizeof(path), "%s/%s", GOLDEN_DIR, e->d_name);
		if (!(f = fopen(path, "rb")))
			return -1;
		fseek(f, 0, SEEK_END);
		n = ftell(f);
		fseek(f, 0, SEEK_SET);
		g->json = malloc((size_t)n + 1);
		g->len = fread(g->json, 1, (size_t)n, f);
		g->json[g->len] = '\0';
		fclose(f);
		n_goldens++;
	}
	closedir(d);
	return n_goldens ? 0 : -1;
}

static int
free_goldens(void **state)
{
	(void)state;
	for (size_t i = 0; i < n_goldens; i++)
		free(goldens[i].json);
	return 0;
}

/* The transcript members of a body (what export writes). */
static json_t *
transcript_part(Histd__V1__Format f, const char *json)
{
	static const char *const keep[][3] = {
		[HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES] = { "system",
								  "messages" },
		[HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT] = { "messages" },
		[HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES] = { "instructions",
								"input" },
		[HISTD__V1__FORMAT__FORMAT_GEMINI] = { "systemInstruction",
						       "contents" },
		[HISTD__V1__FORMAT__FORMAT_MISTRAL] = { "messages" },
	};
	json_t *root = json_loads(json, 0, NULL), *out = json_object(), *v;
	const char *k;

	assert_non_null(root);
	json_object_foreach(root, k, v)
		for (int i = 0; i < 3 && keep[f][i]; i++)
			if (!strcmp(k, keep[f][i]))
				json_object_set(out, k, v);
	json_decref(root);
	return out;
}

static void
assert_same_json(const char *name, const char *want, const char *got,
		 Histd__V1__Format f)
{
	json_t *a = transcript_part(f, want), *b = json_loads(got, 0, NULL);

	assert_non_null(b);
	if (!json_equal(a, b)) {
		char *sa = json_dumps(a, JSON_INDENT(1) | JSON_SORT_KEYS);
		char *sb = json_dumps(b, JSON_INDENT(1) | JSON_SORT_KEYS);

		fprintf(stderr, "%s: round trip differs\n--- want\n%s\n--- got\n"
			"%s\n", name, sa, sb);
		free(sa);
		free(sb);
		fail();
	}
	json_decref(a);
	json_decref(b);
}

/* Import then export in the same format gives the same transcript. */
static void
round_trip_in_same_format_is_lossless(void **state)
{
	(void)state;
	for (size_t i = 0; i < n_goldens; i++) {
		golden *g = &goldens[i];
		histd_transcript t = { 0 };
		histd_strlist dropped = { 0 };
		char *out = NULL;
		int rc;

		rc = histd_transcript_from_json(g->format, g->json, g->len,
						NULL, &t);
		if (rc)
			fprintf(stderr, "%s: %s\n", g->name,
				histd_error_message());
		assert_int_equal(rc, 0);
		assert_true(t.n_messages > 0);
		assert_int_equal(histd_transcript_to_json(g->format, t.messages,
							  t.n_messages, &out,
							  &dropped), 0);
		for (size_t k = 0; k < dropped.n; k++)
			fprintf(stderr, "%s: dropped %s\n", g->name,
				dropped.v[k]);
		assert_int_equal(dropped.n, 0);
		assert_same_json(g->name, g->json, out, g->format);
		free(out);
		histd_strlist_clear(&dropped);
		histd_transcript_clear(&t);
	}
}

/* Storage keeps packed messages: provider_state must survive packing. */
static void
round_trip_survives_packing(void **state)
{
	(void)state;
	for (size_t i = 0; i < n_goldens; i++) {
		golden *g = &goldens[i];
		histd_transcript t = { 0 };
		Histd__V1__Message **un;
		char *out = NULL;

		assert_int_equal(histd_transcript_from_json(g->format, g->json,
							    g->len, NULL, &t),
				 0);
		un = calloc(t.n_messages, sizeof(*un));
		for (size_t k = 0; k < t.n_messages; k++) {
			size_t n = histd__v1__message__get_packed_size(
				t.messages[k]);
			uint8_t *buf = malloc(n ? n : 1);

			histd__v1__message__pack(t.messages[k], buf);
			un[k] = histd__v1__message__unpack(NULL, n, buf);
			assert_non_null(un[k]);
			free(buf);
		}
		assert_int_equal(histd_transcript_to_json(g->format, un,
							  t.n_messages, &out,
							  NULL), 0);
		assert_same_json(g->name, g->json, out, g->format);
		for (size_t k = 0; k < t.n_messages; k++)
			histd__v1__message__free_unpacked(un[k], NULL);
		free(un);
		free(out);
		histd_transcript_clear(&t);
	}
}

static void
count_tools(histd_transcript *t, size_t *calls, size_t *results)
{
	*calls = *results = 0;
	for (size_t i = 0; i < t->n_messages; i++)
		for (size_t j = 0; j < t->messages[i]->n_content; j++) {
			int c = t->messages[i]->content[j]->block_case;

			*calls += c == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
			*results +=
				c == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		}
}

/* Every transcript converts to every format; the target imports the
 * result again, with the same tool calls and results. */
static void
cross_format_output_imports_again(void **state)
{
	(void)state;
	for (size_t i = 0; i < n_goldens; i++) {
		golden *g = &goldens[i];
		histd_transcript t = { 0 };
		size_t calls, results;

		assert_int_equal(histd_transcript_from_json(g->format, g->json,
							    g->len, NULL, &t),
				 0);
		count_tools(&t, &calls, &results);
		for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]);
		     f++) {
			histd_transcript t2 = { 0 };
			histd_strlist dropped = { 0 };
			size_t c2, r2;
			char *out = NULL;
			int rc;

			assert_int_equal(histd_transcript_to_json(
				formats[f], t.messages, t.n_messages, &out,
				&dropped), 0);
			rc = histd_transcript_from_json(formats[f], out,
							strlen(out), NULL, &t2);
			if (rc)
				fprintf(stderr, "%s -> %s: %s\n%s\n", g->name,
					histd_format_name(formats[f]),
					histd_error_message(), out);
			assert_int_equal(rc, 0);
			count_tools(&t2, &c2, &r2);
			assert_int_equal(c2, calls);
			assert_int_equal(r2, results);
			/* Dropped lines name a path, never content. */
			for (size_t k = 0; k < dropped.n; k++)
				assert_true(!strncmp(dropped.v[k], "messages[",
						     9));
			free(out);
			histd_strlist_clear(&dropped);
			histd_transcript_clear(&t2);
		}
		histd_transcript_clear(&t);
	}
}

/* Anthropic's signed thinking never reaches another provider, and is
 * listed as dropped; Mistral, which verifies no signature, takes its text
 * and lists the signature. */
static void
foreign_reasoning_is_dropped_and_listed(void **state)
{
	const char *body =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\","
		"\"thinking\":\"hmm\",\"signature\":\"sig\"},{\"type\":\"text\","
		"\"text\":\"hello\"}]}]}";
	histd_transcript t = { 0 };

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES, body,
		strlen(body), NULL, &t), 0);
	for (size_t f = 1; f < sizeof(formats) / sizeof(formats[0]); f++) {
		histd_strlist dropped = { 0 };
		char *out = NULL;
		int found = 0;

		assert_int_equal(histd_transcript_to_json(formats[f],
			t.messages, t.n_messages, &out, &dropped), 0);
		int mistral = formats[f] == HISTD__V1__FORMAT__FORMAT_MISTRAL;

		assert_null(strstr(out, "\"sig\""));
		assert_int_equal(strstr(out, "\"hmm\"") != NULL, mistral);
		for (size_t k = 0; k < dropped.n; k++)
			found |= mistral
				? !strcmp(dropped.v[k], "messages[1].content[0]: "
					  "the signature of reasoning (kept: "
					  "its text)")
				: !strncmp(dropped.v[k], "messages[1].content[0]: "
					   "reasoning", 33);
		assert_true(found);
		free(out);
		histd_strlist_clear(&dropped);
	}
	histd_transcript_clear(&t);
}

/* Tool messages of OpenAI (one per result) become one Anthropic user turn
 * holding both results, as parallel calls require. */
static void
parallel_results_merge_into_one_anthropic_turn(void **state)
{
	const char *body =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"go\"},"
		"{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
		"{\"id\":\"a\",\"type\":\"function\",\"function\":{\"name\":"
		"\"f\",\"arguments\":\"{}\"}},{\"id\":\"b\",\"type\":"
		"\"function\",\"function\":{\"name\":\"g\",\"arguments\":"
		"\"{\\\"x\\\":1}\"}}]},"
		"{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"1\"},"
		"{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"2\"}]}";
	histd_transcript t = { 0 };
	json_t *root, *msgs;
	char *out = NULL;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT, body, strlen(body),
		NULL, &t), 0);
	assert_int_equal(histd_transcript_to_json(
		HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES, t.messages,
		t.n_messages, &out, NULL), 0);
	root = json_loads(out, 0, NULL);
	msgs = json_object_get(root, "messages");
	assert_int_equal(json_array_size(msgs), 3);
	assert_int_equal(json_array_size(json_object_get(
		json_array_get(msgs, 2), "content")), 2);
	assert_int_equal(json_array_size(json_object_get(
		json_array_get(msgs, 1), "content")), 2);
	json_decref(root);
	free(out);
	/* And Gemini: both responses in one user content, named. */
	assert_int_equal(histd_transcript_to_json(
		HISTD__V1__FORMAT__FORMAT_GEMINI, t.messages, t.n_messages,
		&out, NULL), 0);
	root = json_loads(out, 0, NULL);
	msgs = json_object_get(root, "contents");
	assert_int_equal(json_array_size(msgs), 3);
	assert_string_equal(json_string_value(json_object_get(json_object_get(
		json_array_get(json_object_get(json_array_get(msgs, 2),
					       "parts"), 1),
		"functionResponse"), "name")), "g");
	json_decref(root);
	free(out);
	histd_transcript_clear(&t);
}

/* A Gemini user turn of text then a functionResponse: Anthropic wants the
 * tool_result first in its user turn, and gets it so. */
static void
anthropic_user_turn_has_its_results_first(void **state)
{
	const char *body =
		"{\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":"
		"\"weather?\"}]},{\"role\":\"model\",\"parts\":[{"
		"\"functionCall\":{\"id\":\"c1\",\"name\":\"get_weather\","
		"\"args\":{\"city\":\"Paris\"}}}]},{\"role\":\"user\","
		"\"parts\":[{\"text\":\"here you go\"},{\"functionResponse\":"
		"{\"id\":\"c1\",\"name\":\"get_weather\",\"response\":{"
		"\"t\":20}}}]}]}";
	histd_transcript t = { 0 };
	json_t *root, *content;
	char *out = NULL;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_GEMINI, body, strlen(body), NULL,
		&t), 0);
	assert_int_equal(histd_transcript_to_json(
		HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES, t.messages,
		t.n_messages, &out, NULL), 0);
	root = json_loads(out, 0, NULL);
	assert_non_null(root);
	content = json_object_get(json_array_get(json_object_get(root,
		"messages"), 2), "content");
	assert_int_equal(json_array_size(content), 2);
	assert_string_equal(json_string_value(json_object_get(
		json_array_get(content, 0), "type")), "tool_result");
	assert_string_equal(json_string_value(json_object_get(
		json_array_get(content, 1), "type")), "text");
	json_decref(root);
	free(out);
	histd_transcript_clear(&t);
}

/* A block kind histd does not keep is dropped and listed inside a
 * tool_result as at the top level, not refused with the whole body. */
static void
anthropic_search_result_in_a_tool_result_is_dropped(void **state)
{
	const char *body =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"find\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":"
		"\"tool_use\",\"id\":\"s1\",\"name\":\"search\",\"input\":"
		"{}}]},{\"role\":\"user\",\"content\":[{\"type\":"
		"\"tool_result\",\"tool_use_id\":\"s1\",\"content\":["
		"{\"type\":\"text\",\"text\":\"found\"},"
		"{\"type\":\"search_result\",\"source\":\"https://e.com\","
		"\"title\":\"T\",\"content\":[{\"type\":\"text\",\"text\":"
		"\"body\"}]}]}]}]}";
	histd_transcript t = { 0 };
	int found = 0;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES, body,
		strlen(body), NULL, &t), 0);
	assert_int_equal(t.n_messages, 3);
	assert_int_equal(t.messages[2]->content[0]->tool_result->n_content, 1);
	for (size_t k = 0; k < t.dropped.n; k++)
		found |= strstr(t.dropped.v[k], "search_result") != NULL;
	assert_true(found);
	histd_transcript_clear(&t);
}

/* An assistant message as Append stores it: reasoning r (no provider
 * state unless the caller gives it) then the text "the answer". */
typedef struct reasoning_msg {
	Histd__V1__Message m;
	Histd__V1__ContentBlock r, t, *bp[2];
	Histd__V1__ReasoningBlock rb;
	Histd__V1__TextBlock tb;
} reasoning_msg;

static void
hold_reasoning(reasoning_msg *a, const char *text)
{
	*a = (reasoning_msg){
		.m = HISTD__V1__MESSAGE__INIT,
		.r = HISTD__V1__CONTENT_BLOCK__INIT,
		.t = HISTD__V1__CONTENT_BLOCK__INIT,
		.rb = HISTD__V1__REASONING_BLOCK__INIT,
		.tb = HISTD__V1__TEXT_BLOCK__INIT,
	};
	a->rb.text = (char *)text;
	a->r.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
	a->r.reasoning = &a->rb;
	a->tb.text = "the answer";
	a->t.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	a->t.text = &a->tb;
	a->bp[0] = &a->r;
	a->bp[1] = &a->t;
	a->m.role = HISTD__V1__ROLE__ROLE_ASSISTANT;
	a->m.content = a->bp;
	a->m.n_content = 2;
}

/* Exports a's message to f: its reasoning is left out, listed as
 * dropped with a line holding `why`; its text goes. */
static void
assert_reasoning_dropped(Histd__V1__Format f, reasoning_msg *a,
			 const char *why)
{
	Histd__V1__Message *mp = &a->m;
	histd_strlist dropped = { 0 };
	char *out = NULL;

	assert_int_equal(histd_transcript_to_json(f, &mp, 1, &out, &dropped),
			 0);
	assert_non_null(strstr(out, "the answer"));
	assert_null(strstr(out, "thinking"));
	assert_null(strstr(out, "reasoning"));
	assert_int_equal(dropped.n, 1);
	assert_non_null(strstr(dropped.v[0], why));
	free(out);
	histd_strlist_clear(&dropped);
}

/* Redacted reasoning whose bytes are not text cannot go in a JSON string:
 * it is dropped and listed, not answered as a lack of memory. */
static void
reasoning_bytes_that_are_not_text_are_dropped_on_export(void **state)
{
	static const uint8_t bin[] = { 0xff, 0xfe, 'a', 'b' };
	static const uint8_t rs_id[] = "{\"id\":\"rs_1\"}";
	Histd__V1__ContentBlock__ProviderStateEntry e =
		HISTD__V1__CONTENT_BLOCK__PROVIDER_STATE_ENTRY__INIT, *ep = &e;
	reasoning_msg a;

	(void)state;
	hold_reasoning(&a, "");
	a.rb.redacted = 1;
	a.rb.encrypted_data.data = (uint8_t *)bin;
	a.rb.encrypted_data.len = sizeof(bin);
	assert_reasoning_dropped(HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
				 &a, "not text");
	/* Responses writes only reasoning with its id. */
	e.key = "openai_responses";
	e.value.data = (uint8_t *)rs_id;
	e.value.len = sizeof(rs_id) - 1;
	a.r.provider_state = &ep;
	a.r.n_provider_state = 1;
	assert_reasoning_dropped(HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
				 &a, "not text");
}

/* Top-level members that are not the transcript are listed as dropped. */
static void
import_lists_non_transcript_members(void **state)
{
	const char *body = "{\"model\":\"m\",\"tools\":[],\"messages\":["
			   "{\"role\":\"user\",\"content\":\"hi\"}]}";
	histd_transcript t = { 0 };

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_MISTRAL, body, strlen(body), NULL,
		&t), 0);
	assert_int_equal(t.dropped.n, 2);
	assert_string_equal(t.dropped.v[0], "model: not part of the "
			    "transcript");
	histd_transcript_clear(&t);
}

/* Keys starting with '$' are histd's own marks in provider_state: an
 * input part carrying "$refusal" stays the text it is, an image carrying
 * "$detail" gets no detail, and both members come back as they came. */
static void
dollar_keys_cannot_forge_marks(void **state)
{
	const char *body =
		"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		"\"input_text\",\"text\":\"hi\",\"$refusal\":true},"
		"{\"type\":\"input_image\",\"image_url\":"
		"\"https://example.com/a.png\",\"$detail\":\"x\"}]}]}";
	histd_transcript t = { 0 };
	json_t *root, *part;
	char *out = NULL;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, body, strlen(body),
		NULL, &t), 0);
	assert_int_equal(t.n_messages, 1);
	assert_int_equal(t.dropped.n, 0);
	assert_int_equal(histd_transcript_to_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, t.messages,
		t.n_messages, &out, NULL), 0);
	root = json_loads(out, 0, NULL);
	part = json_array_get(json_object_get(json_array_get(
		json_object_get(root, "input"), 0), "content"), 0);
	assert_string_equal(json_string_value(json_object_get(part, "type")),
			    "input_text");
	assert_true(json_is_true(json_object_get(part, "$refusal")));
	part = json_array_get(json_object_get(json_array_get(
		json_object_get(root, "input"), 0), "content"), 1);
	assert_string_equal(json_string_value(json_object_get(part,
							      "$detail")), "x");
	/* The image came without "detail" and goes out without it. */
	assert_null(json_object_get(part, "detail"));
	json_decref(root);
	free(out);
	histd_transcript_clear(&t);
}

/* A data: URI with nothing after ";base64," stays a URL image. */
static void
empty_data_uri_stays_a_url(void **state)
{
	const char *body =
		"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		"\"image_url\",\"image_url\":{\"url\":"
		"\"data:image/png;base64,\"}}]}]}";
	histd_transcript t = { 0 };
	const Histd__V1__ContentBlock *b;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT, body, strlen(body), NULL,
		&t), 0);
	b = t.messages[0]->content[0];
	assert_int_equal(b->block_case, HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE);
	assert_int_equal(b->image->source_case,
			 HISTD__V1__IMAGE_BLOCK__SOURCE_URL);
	assert_string_equal(b->image->url, "data:image/png;base64,");
	histd_transcript_clear(&t);
}

/* A file's data URI that Import keeps as a URL (a parameter besides
 * base64, or an empty payload) goes back as the file's inline data in the
 * same format: nothing dropped, the same transcript. */
static void
file_data_uri_kept_as_a_url_round_trips(void **state)
{
	static const struct {
		Histd__V1__Format f;
		const char *body;
	} cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"text\",\"text\":\"read this\"},{\"type\":\"file\","
		  "\"file\":{\"file_data\":\"data:text/plain;charset=utf-8;"
		  "base64,aGVsbG8=\",\"filename\":\"a.txt\"}}]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"type\":\"message\",\"role\":\"user\","
		  "\"content\":[{\"type\":\"input_file\",\"file_data\":"
		  "\"data:application/pdf;base64,\",\"filename\":"
		  "\"a.pdf\"}]}]}" },
	};

	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		histd_transcript t = { 0 };
		histd_strlist dropped = { 0 };
		char *out = NULL;

		assert_int_equal(histd_transcript_from_json(cases[c].f,
			cases[c].body, strlen(cases[c].body), NULL, &t), 0);
		assert_int_equal(histd_transcript_to_json(cases[c].f,
			t.messages, t.n_messages, &out, &dropped), 0);
		assert_int_equal(dropped.n, 0);
		assert_same_json("file data URI", cases[c].body, out,
				 cases[c].f);
		free(out);
		histd_strlist_clear(&dropped);
		histd_transcript_clear(&t);
	}
}

/* A key holding a control byte is named with it as \xNN: dropped lines
 * and error messages stay one line. */
static void
keys_with_control_bytes_stay_on_one_line(void **state)
{
	const char *body =
		"{\"input\":[{\"role\":\"user\",\"content\":\"hi\"}],"
		"\"mo\\ndel\":\"x\"}";
	const char *long_body =
		"{\"instructio\\ns\":\"a string longer than sixty-four bytes, "
		"which the tight limit refuses\"}";
	histd_transcript_limits lim;
	histd_transcript t = { 0 };

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, body, strlen(body),
		NULL, &t), 0);
	assert_int_equal(t.dropped.n, 1);
	assert_string_equal(t.dropped.v[0],
			    "mo\\x0adel: not part of the transcript");
	histd_transcript_clear(&t);

	histd_transcript_limits_default(&lim);
	lim.max_string_bytes = 64;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, long_body,
		strlen(long_body), &lim, &t), HISTD_ELIMIT);
	assert_null(strchr(histd_error_message(), '\n'));
	assert_non_null(strstr(histd_error_message(), "instructio\\x0as"));
	histd_transcript_clear(&t);
}

static char *
round_trip(Histd__V1__Format f, const char *body)
{
	histd_transcript t = { 0 };
	char *out = NULL;

	assert_int_equal(histd_transcript_from_json(f, body, strlen(body),
						    NULL, &t), 0);
	assert_int_equal(histd_transcript_to_json(f, t.messages, t.n_messages,
						  &out, NULL), 0);
	histd_transcript_clear(&t);
	return out;
}

/* Makes m a message of role holding the one block *bp. */
static void
hold_one(Histd__V1__Message *m, Histd__V1__Role role,
	 Histd__V1__ContentBlock **bp)
{
	m->role = role;
	m->n_content = 1;
	m->content = bp;
}

/* Makes m an assistant message holding one call c1 of f with arguments,
 * as Append stores it; *bp is b, which holds c. */
static void
hold_call(Histd__V1__Message *m, Histd__V1__ContentBlock **bp,
	  Histd__V1__ToolCallBlock *c, const char *arguments)
{
	c->id = "c1";
	c->name = "f";
	c->arguments = (char *)arguments;
	(*bp)->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	(*bp)->tool_call = c;
	hold_one(m, HISTD__V1__ROLE__ROLE_ASSISTANT, bp);
}

/* A body in a format, for the tables of round trips below. */
typedef struct body_case {
	Histd__V1__Format f;
	const char *body;
} body_case;

/* Each body of cases comes back from import then export as it came. */
static void
assert_bodies_round_trip(const char *name, const body_case *cases, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char *out = round_trip(cases[i].f, cases[i].body);

		assert_same_json(name, cases[i].body, out, cases[i].f);
		free(out);
	}
}

/* A user message holding b alone, as Append stores it, goes out in
 * Responses holding `want`. */
static void
assert_appended_in_responses(Histd__V1__ContentBlock *b, const char *want)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	char *out;

	hold_one(&m, HISTD__V1__ROLE__ROLE_USER, &b);
	assert_int_equal(histd_transcript_to_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, &mp, 1, &out,
		NULL), 0);
	assert_non_null(strstr(out, want));
	free(out);
}

/* instructions "" or null (no system message in histd) and tool
 * arguments "" come back as they came; a tool call appended with no
 * arguments still goes out as "{}". */
static void
empty_instructions_and_arguments_round_trip(void **state)
{
	static const body_case cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"instructions\":\"\",\"input\":\"hi\"}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"instructions\":null,\"input\":[{\"role\":\"user\","
		  "\"content\":\"hi\"}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"instructions\":\"\",\"input\":[{\"role\":"
		  "\"developer\",\"content\":\"be brief\"},{\"role\":"
		  "\"user\",\"content\":\"hi\"}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"type\":\"function_call\",\"call_id\":"
		  "\"c1\",\"name\":\"f\",\"arguments\":\"\"}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
		  "[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
		  "{\"name\":\"f\",\"arguments\":\"\"}}]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_MISTRAL,
		  "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":"
		  "[{\"id\":\"c1\",\"function\":{\"name\":\"f\","
		  "\"arguments\":\"\"}}]}]}" },
	};
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__ToolCallBlock c = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	char *out;

	(void)state;
	assert_bodies_round_trip("empty", cases,
				 sizeof(cases) / sizeof(cases[0]));
	/* Appended, not imported: "" is "no arguments", sent as "{}". */
	hold_call(&m, &bp, &c, "");
	for (size_t f = 1; f < sizeof(formats) / sizeof(formats[0]); f++) {
		if (formats[f] == HISTD__V1__FORMAT__FORMAT_GEMINI)
			continue;
		assert_int_equal(histd_transcript_to_json(formats[f], &mp, 1,
							  &out, NULL), 0);
		assert_non_null(strstr(out, "\"arguments\":\"{}\""));
		assert_null(strstr(out, "instructions"));
		free(out);
	}
}

/* Arguments an Append stored with a key twice in one object go to the
 * formats that take an object with the last one, and that is listed;
 * formats that take the text send it as it is. */
static void
repeated_argument_keys_are_listed_where_an_object_goes(void **state)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__ToolCallBlock c = HISTD__V1__TOOL_CALL_BLOCK__INIT;

	(void)state;
	hold_call(&m, &bp, &c, "{\"a\":1,\"a\":2}");
	for (size_t f = 0; f < sizeof(formats) / sizeof(formats[0]); f++) {
		int object = formats[f] ==
				     HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES ||
			     formats[f] == HISTD__V1__FORMAT__FORMAT_GEMINI;
		histd_strlist dropped = { 0 };
		char *out = NULL;

		assert_int_equal(histd_transcript_to_json(formats[f], &mp, 1,
							  &out, &dropped), 0);
		if (object) {
			assert_non_null(strstr(out, "{\"a\":2}"));
			assert_int_equal(dropped.n, 1);
			assert_string_equal(dropped.v[0], "messages[0].content[0]: "
					    "a key repeated in one object of "
					    "the tool arguments (the last one "
					    "kept)");
		} else {
			assert_non_null(strstr(out, "{\\\"a\\\":1,"));
			assert_int_equal(dropped.n, 0);
		}
		free(out);
		histd_strlist_clear(&dropped);
	}
}

/* A Responses input_image without "detail" (in a message and in a
 * function_call_output) comes back without it; an image a caller appended
 * goes out with "detail": "auto". */
static void
responses_image_without_detail_round_trips(void **state)
{
	const char *body =
		"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		"\"input_image\",\"image_url\":\"https://example.com/a.png\"}"
		"]},{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":"
		"\"f\",\"arguments\":\"{}\"},{\"type\":"
		"\"function_call_output\",\"call_id\":\"c1\",\"output\":[{"
		"\"type\":\"input_image\",\"image_url\":"
		"\"data:image/png;base64,iVBORw0KGgo=\"}]}]}";
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;
	char *out;

	(void)state;
	out = round_trip(HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, body);
	assert_same_json("no detail", body, out,
			 HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES);
	free(out);

	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	img.url = "https://example.com/a.png";
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b.image = &img;
	assert_appended_in_responses(&b, "\"detail\":\"auto\"");
}

/* Members of a chat message its role (or Mistral) does not read come back
 * as they came: a refusal in Mistral or in a user message, a tool_call_id
 * outside a tool message, an empty tool_calls outside an assistant one. */
static void
chat_members_a_role_does_not_read_round_trip(void **state)
{
	static const body_case cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_MISTRAL,
		  "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "\"x\",\"refusal\":null}]}" },
		{ HISTD__V1__FORMAT__FORMAT_MISTRAL,
		  "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "\"x\",\"refusal\":\"no\"}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"user\",\"content\":\"x\","
		  "\"refusal\":\"no\",\"tool_call_id\":\"c1\"}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"system\",\"content\":\"x\","
		  "\"tool_calls\":[]}]}" },
	};

	(void)state;
	assert_bodies_round_trip("unread", cases,
				 sizeof(cases) / sizeof(cases[0]));
}

/* A Responses function_call_output whose output is a list of parts (one
 * text, or none) comes back as a list, not as the string an appended
 * result gets. */
static void
responses_output_list_round_trips(void **state)
{
	static const body_case cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"type\":\"function_call\",\"call_id\":"
		  "\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
		  "\"function_call_output\",\"call_id\":\"c1\",\"output\":"
		  "[{\"type\":\"input_text\",\"text\":\"ok\"}]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"type\":\"function_call\",\"call_id\":"
		  "\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
		  "\"function_call_output\",\"call_id\":\"c1\",\"output\":"
		  "[]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"type\":\"function_call\",\"call_id\":"
		  "\"c1\",\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":"
		  "\"function_call_output\",\"call_id\":\"c1\",\"output\":"
		  "\"\"}]}" },
	};

	(void)state;
	assert_bodies_round_trip("output list", cases,
				 sizeof(cases) / sizeof(cases[0]));
}

/* An assistant message's "tool_calls": null (what the OpenAI SDK's
 * model_dump() writes) or [] holds no call and comes back as it came. */
static void
chat_null_or_empty_tool_calls_round_trip(void **state)
{
	static const body_case cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
		  "{\"role\":\"assistant\",\"content\":\"hello\","
		  "\"refusal\":null,\"tool_calls\":null,\"audio\":null}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
		  "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "\"hello\",\"tool_calls\":[]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_MISTRAL,
		  "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "\"hello\",\"tool_calls\":null}]}" },
		{ HISTD__V1__FORMAT__FORMAT_MISTRAL,
		  "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		  "\"hello\",\"tool_calls\":[]}]}" },
	};

	(void)state;
	assert_bodies_round_trip("no calls", cases,
				 sizeof(cases) / sizeof(cases[0]));
}

/* Anthropic requires the signature of a thinking block: Import refuses one
 * without it, naming the path, rather than keep what Export cannot write.
 * Reasoning a caller appended (no signature) is dropped and listed. */
static void
anthropic_thinking_without_signature_is_refused(void **state)
{
	const char *body =
		"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
		"{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\","
		"\"thinking\":\"hmm\"},{\"type\":\"text\",\"text\":"
		"\"hello\"}]}]}";
	histd_transcript t = { 0 };
	reasoning_msg a;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES, body,
		strlen(body), NULL, &t), HISTD_EINVALID);
	assert_string_equal(histd_error_message(), "messages[1].content[0]."
			    "signature: is required");
	histd_transcript_clear(&t);

	hold_reasoning(&a, "hmm");
	assert_reasoning_dropped(HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
				 &a, "messages[0].content[0]: reasoning "
				 "without a signature");
}

/* A Responses input_file without a filename, or with "", comes back so;
 * a document a caller appended goes out as inline data named "document",
 * as the API wants a filename with it. */
static void
responses_file_without_filename_round_trips(void **state)
{
	static const body_case cases[] = {
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"input_file\",\"file_data\":"
		  "\"data:application/pdf;base64,JVBERi0=\"}]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"input_file\",\"file_data\":"
		  "\"data:application/pdf;base64,JVBERi0=\",\"filename\":"
		  "\"\"}]}]}" },
		{ HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
		  "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		  "\"input_file\",\"file_url\":\"https://example.com/a.pdf\","
		  "\"filename\":\"\"}]}]}" },
	};
	static const uint8_t pdf[] = "%PDF-";
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__DocumentBlock doc = HISTD__V1__DOCUMENT_BLOCK__INIT;

	(void)state;
	assert_bodies_round_trip("no filename", cases,
				 sizeof(cases) / sizeof(cases[0]));

	doc.source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
	doc.data.data = (uint8_t *)pdf;
	doc.data.len = sizeof(pdf) - 1;
	doc.media_type = "application/pdf";
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT;
	b.document = &doc;
	assert_appended_in_responses(&b, "\"filename\":\"document\"");
}

/* OpenAI requires the id of a reasoning input item: Import refuses one
 * without it, naming the path, and Export drops and lists reasoning that
 * has none (a caller appended it), rather than send what OpenAI
 * refuses. */
static void
responses_reasoning_without_id_is_refused(void **state)
{
	const char *body =
		"{\"input\":[{\"role\":\"user\",\"content\":\"hi\"},"
		"{\"type\":\"reasoning\",\"summary\":[{\"type\":"
		"\"summary_text\",\"text\":\"hmm\"}]}]}";
	histd_transcript t = { 0 };
	reasoning_msg a;

	(void)state;
	assert_int_equal(histd_transcript_from_json(
		HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES, body, strlen(body),
		NULL, &t), HISTD_EINVALID);
	assert_string_equal(histd_error_message(), "input[1].id: is required");
	histd_transcript_clear(&t);

	hold_reasoning(&a, "hmm");
	assert_reasoning_dropped(HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
				 &a, "messages[0].content[0]: reasoning "
				 "without the id OpenAI requires");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(round_trip_in_same_format_is_lossless),
		cmocka_unit_test(round_trip_survives_packing),
		cmocka_unit_test(cross_format_output_imports_again),
		cmocka_unit_test(foreign_reasoning_is_dropped_and_listed),
		cmocka_unit_test(parallel_results_merge_into_one_anthropic_turn),
		cmocka_unit_test(anthropic_user_turn_has_its_results_first),
		cmocka_unit_test(anthropic_search_result_in_a_tool_result_is_dropped),
		cmocka_unit_test(reasoning_bytes_that_are_not_text_are_dropped_on_export),
		cmocka_unit_test(import_lists_non_transcript_members),
		cmocka_unit_test(dollar_keys_cannot_forge_marks),
		cmocka_unit_test(empty_data_uri_stays_a_url),
		cmocka_unit_test(file_data_uri_kept_as_a_url_round_trips),
		cmocka_unit_test(keys_with_control_bytes_stay_on_one_line),
		cmocka_unit_test(empty_instructions_and_arguments_round_trip),
		cmocka_unit_test(
			repeated_argument_keys_are_listed_where_an_object_goes),
		cmocka_unit_test(responses_image_without_detail_round_trips),
		cmocka_unit_test(chat_members_a_role_does_not_read_round_trip),
		cmocka_unit_test(responses_output_list_round_trips),
		cmocka_unit_test(chat_null_or_empty_tool_calls_round_trip),
		cmocka_unit_test(anthropic_thinking_without_signature_is_refused),
		cmocka_unit_test(responses_file_without_filename_round_trips),
		cmocka_unit_test(responses_reasoning_without_id_is_refused),
	};

	return cmocka_run_group_tests(tests, load_goldens, free_goldens);
}
