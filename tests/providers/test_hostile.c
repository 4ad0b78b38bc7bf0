/*
 * Import under malformed and hostile input: every failure is EINVALID with
 * a message that names the JSON path and holds no conversation text, and
 * nothing crashes or leaks (run under ASan). What Import accepts is what
 * the server accepts (the same rules as service.c's message checks).
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

#define A HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES
#define C HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT
#define R HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES
#define G HISTD__V1__FORMAT__FORMAT_GEMINI
#define M HISTD__V1__FORMAT__FORMAT_MISTRAL

static const Histd__V1__Format formats[] = { A, C, R, G, M };

static int
import(Histd__V1__Format f, const char *json, size_t len,
       const histd_transcript_limits *lim)
{
	histd_transcript t = { 0 };
	int rc = histd_transcript_from_json(f, json, len, lim, &t);

	histd_transcript_clear(&t);
	return rc;
}

static void
assert_invalid(Histd__V1__Format f, const char *json, const char *want)
{
	int rc = import(f, json, strlen(json), NULL);

	if (rc != HISTD_EINVALID || !strstr(histd_error_message(), want)) {
		fprintf(stderr, "body %s\n  rc %d, message \"%s\"; wanted "
			"\"%s\"\n", json, rc, histd_error_message(), want);
		fail();
	}
	assert_null(strstr(histd_error_message(), "SECRET"));
}

static void
malformed_json_is_invalid(void **state)
{
	static const char *const bodies[] = {
		"", "{", "[]", "null", "\"x\"", "{\"messages\":[}",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]",
		"{\"a\":1,\"a\":2}", "{\"messages\":\"\xff\xfe\"}",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"\\u0000\"}]}",
	};

	(void)state;
	for (size_t f = 0; f < 5; f++)
		for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
			assert_int_equal(import(formats[f], bodies[i],
						strlen(bodies[i]), NULL),
					 HISTD_EINVALID);
}

static void
wrong_types_name_the_json_path(void **state)
{
	(void)state;
	assert_invalid(A, "{\"messages\":[{\"role\":\"user\",\"content\":"
		       "\"SECRET\"},{\"role\":\"user\",\"content\":[{\"type\":"
		       "\"text\",\"text\":\"SECRET\"},{\"type\":\"tool_result\","
		       "\"tool_use_id\":7}]}]}",
		       "messages[1].content[1].tool_use_id: expected a string, "
		       "got a number");
	assert_invalid(A, "{\"messages\":{}}",
		       "messages: expected an array, got an object");
	/* Valid JSON, but not an object: said as such. */
	assert_invalid(A, "\"SECRET\"", "json: expected an object");
	assert_invalid(C, "null", "json: expected an object");
	assert_invalid(A, "{\"messages\":[{\"role\":\"system\",\"content\":"
		       "\"x\"}]}", "messages[0].role: must be user or assistant");
	assert_invalid(A, "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		       "[{\"type\":\"tool_use\",\"id\":\"a\",\"name\":\"f\","
		       "\"input\":\"SECRET\"}]}]}",
		       "messages[0].content[0].input: expected an object");
	assert_invalid(A, "{\"messages\":[{\"role\":\"user\",\"content\":[{"
		       "\"type\":\"image\",\"source\":{\"type\":\"base64\","
		       "\"media_type\":\"image/png\",\"data\":\"SECRET!!\"}}]}]}",
		       "messages[0].content[0].source.data: not valid base64");
	assert_invalid(A, "{\"messages\":[{\"role\":\"user\",\"content\":[{"
		       "\"type\":\"SECRET\"}]}]}",
		       "messages[0].content[0].type: not a known block type");
	assert_invalid(C, "{\"messages\":[{\"role\":\"assistant\",\"content\":"
		       "null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
		       "\"function\":{\"name\":\"f\",\"arguments\":\"{SECRET\"}}"
		       "]}]}",
		       "messages[0].tool_calls[0].function.arguments: is not "
		       "valid JSON");
	assert_invalid(C, "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}"
		       "]}", "messages[0].tool_call_id: is required");
	/* Calls outside an assistant message would go unseen. */
	assert_invalid(C, "{\"messages\":[{\"role\":\"user\",\"content\":"
		       "\"x\",\"tool_calls\":[{\"id\":\"c\",\"type\":"
		       "\"function\",\"function\":{\"name\":\"f\","
		       "\"arguments\":\"{}\"}}]}]}",
		       "messages[0].tool_calls: only in assistant messages");
	assert_invalid(C, "{\"messages\":[{\"role\":\"user\",\"content\":[{"
		       "\"type\":\"image_url\",\"image_url\":5}]}]}",
		       "messages[0].content[0].image_url: expected an object");
	assert_invalid(R, "{\"input\":[{\"type\":\"function_call\","
		       "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":[]}]}",
		       "input[0].arguments: expected a string, got an array");
	assert_invalid(R, "{\"input\":[{\"type\":\"reasoning\",\"summary\":"
		       "[{\"type\":\"summary_text\",\"text\":1}]}]}",
		       "input[0].summary[0].text: expected a string");
	assert_invalid(R, "{\"input\":5}", "input: expected a string or an "
		       "array");
	assert_invalid(G, "{\"contents\":[{\"role\":\"model\",\"parts\":[{"
		       "\"functionCall\":{\"name\":\"f\",\"args\":[]}}]}]}",
		       "contents[0].parts[0].functionCall.args: expected an "
		       "object");
	assert_invalid(G, "{\"contents\":[{\"role\":\"user\",\"parts\":[{"
		       "\"functionResponse\":{\"name\":\"nope\",\"response\":{}}}"
		       "]}]}",
		       "contents[0].parts[0].functionResponse.name: answers no "
		       "earlier functionCall");
	assert_invalid(G, "{\"contents\":[{\"role\":\"tool\",\"parts\":[]}]}",
		       "contents[0].role: must be user or model");
	assert_invalid(M, "{\"messages\":[{\"role\":\"user\",\"content\":[{"
		       "\"type\":\"thinking\",\"thinking\":[]}]}]}",
		       "messages[0].content[0].type: thinking only in assistant");
	assert_invalid(M, "{\"messages\":[{\"role\":\"assistant\","
		       "\"tool_calls\":[{\"id\":\"\",\"function\":{\"name\":"
		       "\"f\",\"arguments\":\"{}\"}}]}]}",
		       "messages[0].tool_calls[0].id: must be 1..128 bytes");
}

/* Numbers past what jansson holds (integers beyond 64 bits, reals beyond
 * a double) are valid JSON: the message says out of range, not "not valid
 * JSON", and names the member (never a key below it) or the arguments. */
static void
numbers_out_of_range_name_the_member(void **state)
{
	(void)state;
	assert_invalid(A, "{\"messages\":[{\"role\":\"user\",\"content\":"
		       "\"hi\"},{\"role\":\"assistant\",\"content\":[{\"type\":"
		       "\"tool_use\",\"id\":\"t1\",\"name\":\"f\",\"input\":{"
		       "\"SECRET\":[1,\"a,]\\\"}{\",12345678901234567890]}}]}]}",
		       "messages[1]: holds an integer out of range (more than 64 "
		       "bits) (line 1, column ");
	assert_invalid(A, "{\"messages\":[{\"role\":\"assistant\",\"content\""
		       ":[{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"f\","
		       "\"input\":{\"SECRET\":-9223372036854775809}}]}]}",
		       "messages[0]: holds an integer out of range (more than 64 "
		       "bits)");
	assert_invalid(G, "{\"contents\":[{\"role\":\"model\",\"parts\":["
		       "{\"functionCall\":{\"name\":\"f\",\"args\":{\"SECRET\":"
		       "1e400}}}]}]}",
		       "contents[0]: holds a number out of range (too large for "
		       "a double)");
	assert_invalid(R, "{\"max_output_tokens\":99999999999999999999,"
		       "\"input\":\"hi\"}",
		       "max_output_tokens: holds an integer out of range");
	/* Strings holding commas, brackets and escaped quotes do not move
	 * the element count. */
	assert_invalid(A, "{\"system\":\"x,[\",\"messages\":[\"a,]\\\",\","
		       "{\"role\":\"user\",\"content\":[1,"
		       "99999999999999999999]}]}",
		       "messages[1]: holds an integer out of range");
	assert_invalid(A, "99999999999999999999",
		       "json holds an integer out of range");
	/* Inside a string of arguments: the arguments are named. */
	assert_invalid(C, "{\"messages\":[{\"role\":\"assistant\","
		       "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
		       "\"function\":{\"name\":\"f\",\"arguments\":"
		       "\"{\\\"SECRET\\\":12345678901234567890}\"}}]}]}",
		       "messages[0].tool_calls[0].function.arguments: holds an "
		       "integer out of range (more than 64 bits)");
	assert_invalid(R, "{\"input\":[{\"type\":\"function_call\","
		       "\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
		       "\"[1e999]\"}]}",
		       "input[0].arguments: holds a number out of range");
	/* The phrase Append's check of tool_call.arguments uses too. */
	{
		static const struct {
			const char *json, *why;
		} w[] = {
			{ "18446744073709551616", "holds an integer out of "
			  "range (more than 64 bits)" },
			{ "[-9223372036854775809]", "holds an integer out of "
			  "range (more than 64 bits)" },
			{ "{\"x\":1e400}", "holds a number out of range (too "
			  "large for a double)" },
			{ "{\"x\":", "is not valid JSON: it ends before its "
			  "value does" },
		};
		json_error_t e;
		json_t *v;

		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++) {
			assert_null(json_loads(w[i].json, JSON_DECODE_ANY, &e));
			assert_string_equal(histd_json_error_why(&e), w[i].why);
		}
		/* 2^63 - 1 and -2^63 are in range. */
		v = json_loads("[9223372036854775807,-9223372036854775808]", 0,
			       &e);
		assert_non_null(v);
		json_decref(v);
	}
}

static char *
nested(const char *open, const char *close, size_t depth)
{
	size_t lo = strlen(open), lc = strlen(close);
	char *s = malloc(depth * (lo + lc) + 64), *p = s;

	for (size_t i = 0; i < depth; i++, p += lo)
		memcpy(p, open, lo);
	*p++ = '1';
	for (size_t i = 0; i < depth; i++, p += lc)
		memcpy(p, close, lc);
	*p = '\0';
	return s;
}

static void
deep_nesting_is_refused(void **state)
{
	char *deep = nested("[", "]", 200000), *body;

	(void)state;
	/* Far past jansson's own limit: a parse error, no stack overflow,
	 * and the error says why. */
	assert_invalid(A, deep, "json is not valid JSON: it is nested deeper "
		       "than 64 levels");
	free(deep);
	/* jansson refuses \u0000, which a C string could not hold. */
	assert_invalid(A, "{\"messages\":[{\"role\":\"user\",\"content\":"
		       "\"a\\u0000b\"}]}",
		       "json is not valid JSON: it holds a \\u0000 (NUL) character");
	/* Past ours (64) inside tool arguments: the path stops at the
	 * message, since the keys below are conversation data. */
	deep = nested("{\"SECRET\":", "}", 70);
	assert_true(asprintf(&body, "{\"messages\":[{\"role\":\"assistant\","
			     "\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
			     "\"name\":\"f\",\"input\":%s}]}]}", deep) > 0);
	assert_invalid(A, body, "messages[0]: nested deeper than 64 levels");
	free(body);
	free(deep);
	/* 60 levels are fine. */
	deep = nested("{\"k\":", "}", 58);
	assert_true(asprintf(&body, "{\"messages\":[{\"role\":\"assistant\","
			     "\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
			     "\"name\":\"f\",\"input\":%s}]}]}", deep) > 0);
	assert_int_equal(import(A, body, strlen(body), NULL), 0);
	free(body);
	free(deep);
}

/* Tool arguments given as JSON text (Chat, Mistral, Responses) follow
 * the rules of arguments given as JSON (Anthropic input, Gemini args):
 * no nesting past 64 levels, no key twice in one object, which export to
 * those formats would otherwise write or silently merge. */
static void
arguments_as_text_follow_the_body_rules(void **state)
{
	char *deep = nested("{\\\"SECRET\\\":", "}", 70), *body;

	(void)state;
	assert_true(asprintf(&body, "{\"messages\":[{\"role\":\"assistant\","
			     "\"tool_calls\":[{\"id\":\"c1\",\"type\":"
			     "\"function\",\"function\":{\"name\":\"f\","
			     "\"arguments\":\"%s\"}}]}]}", deep) > 0);
	assert_invalid(C, body, "messages[0].tool_calls[0].function."
		       "arguments: nested deeper than 64 levels");
	assert_invalid(M, body, "messages[0].tool_calls[0].function."
		       "arguments: nested deeper than 64 levels");
	free(body);
	free(deep);
	/* 55 levels, as deep as an Anthropic input may be, are fine. */
	for (size_t levels = 70; levels >= 55; levels -= 15) {
		deep = nested("{\\\"SECRET\\\":", "}", levels);
		assert_true(asprintf(&body, "{\"input\":[{\"type\":"
				     "\"function_call\",\"call_id\":\"c1\","
				     "\"name\":\"f\",\"arguments\":\"%s\"}]}",
				     deep) > 0);
		if (levels > 64)
			assert_invalid(R, body, "input[0].arguments: nested "
				       "deeper than 64 levels");
		else
			assert_int_equal(import(R, body, strlen(body), NULL),
					 0);
		free(body);
		free(deep);
	}
	assert_invalid(C, "{\"messages\":[{\"role\":\"assistant\","
		       "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
		       "\"function\":{\"name\":\"f\",\"arguments\":"
		       "\"{\\\"SECRET\\\":1,\\\"SECRET\\\":2}\"}}]}]}",
		       "messages[0].tool_calls[0].function.arguments: is not "
		       "valid JSON: it repeats a key in one object");
	assert_invalid(R, "{\"input\":[{\"type\":\"function_call\","
		       "\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
		       "\"[{\\\"a\\\":1,\\\"a\\\":1}]\"}]}",
		       "input[0].arguments: is not valid JSON: it repeats a key "
		       "in one object");
}

static void
huge_strings_are_refused(void **state)
{
	histd_transcript_limits lim;
	size_t n = 2u << 20;
	char *big = malloc(n + 200);
	int k;

	(void)state;
	histd_transcript_limits_default(&lim);
	k = sprintf(big, "{\"messages\":[{\"role\":\"user\",\"content\":\"");
	memset(big + k, 'S', n);
	strcpy(big + k + n, "\"}]}");
	assert_int_equal(import(C, big, strlen(big), &lim), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "messages[0]: a string "
			       "is 2097152 bytes; the limit is 1048576"));
	lim.max_json_bytes = 1000;
	assert_int_equal(import(C, big, strlen(big), &lim), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "json is"));
	free(big);
}

static void
message_count_is_limited(void **state)
{
	histd_transcript_limits lim;
	char body[4096];
	size_t o;

	(void)state;
	histd_transcript_limits_default(&lim);
	lim.max_messages = 3;
	o = (size_t)sprintf(body, "{\"messages\":[");
	for (int i = 0; i < 4; i++)
		o += (size_t)sprintf(body + o, "%s{\"role\":\"user\","
				     "\"content\":\"m\"}", i ? "," : "");
	strcpy(body + o, "]}");
	assert_int_equal(import(M, body, strlen(body), &lim), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "messages[3]: more than "
			       "3 messages"));
}

/* The rules service.c checks on append (check_message): what Import
 * returns must pass them. */
static void
assert_server_accepts(histd_transcript *t)
{
	for (size_t i = 0; i < t->n_messages; i++) {
		Histd__V1__Message *m = t->messages[i];

		assert_true(m->n_content > 0);
		for (size_t j = 0; j < m->n_content; j++) {
			Histd__V1__ContentBlock *b = m->content[j];
			int c = b->block_case;

			if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM)
				assert_int_equal(c,
					HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT);
			if (m->role == HISTD__V1__ROLE__ROLE_TOOL)
				assert_int_equal(c,
					HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT);
			switch (c) {
			case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
				assert_true(b->text->text[0]);
				break;
			case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING: {
				Histd__V1__ReasoningBlock *r = b->reasoning;

				assert_int_equal(m->role,
					HISTD__V1__ROLE__ROLE_ASSISTANT);
				assert_true(r->text[0] || r->summary[0] ||
					    r->signature[0] ||
					    r->encrypted_data.len);
				break;
			}
			case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
				assert_int_equal(m->role,
					HISTD__V1__ROLE__ROLE_ASSISTANT);
				assert_true(b->tool_call->id[0]);
				assert_true(b->tool_call->name[0]);
				break;
			case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
				assert_true(b->tool_result->tool_call_id[0]);
				assert_true(m->role ==
						    HISTD__V1__ROLE__ROLE_USER ||
					    m->role ==
						    HISTD__V1__ROLE__ROLE_TOOL);
				break;
			case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
				if (b->image->source_case ==
				    HISTD__V1__IMAGE_BLOCK__SOURCE_DATA)
					assert_true(b->image->data.len &&
						    b->image->media_type[0]);
				else
					assert_true(b->image->url[0]);
				break;
			case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
				if (b->document->source_case ==
				    HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA)
					assert_true(b->document->data.len &&
						    b->document->media_type[0]);
				else
					assert_true(b->document->url[0]);
				break;
			default:
				fail();
			}
		}
	}
}

/* Imports one body: EINVALID, or messages the server accepts and that
 * every format exports. */
static void
try_body(Histd__V1__Format f, const char *json, size_t len)
{
	histd_transcript t = { 0 };
	int rc = histd_transcript_from_json(f, json, len, NULL, &t);

	if (rc) {
		assert_int_equal(rc, HISTD_EINVALID);
		return;
	}
	assert_server_accepts(&t);
	for (size_t k = 0; k < 5; k++) {
		char *out = NULL;

		assert_int_equal(histd_transcript_to_json(formats[k],
			t.messages, t.n_messages, &out, NULL), 0);
		free(out);
	}
	histd_transcript_clear(&t);
}

typedef struct golden {
	Histd__V1__Format f;
	json_t *root;
	char *text;
} golden;

static size_t
load(golden *g, size_t max)
{
	DIR *d = opendir(GOLDEN_DIR);
	struct dirent *e;
	size_t n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) && n < max) {
		char path[600];

		if (!strstr(e->d_name, ".json"))
			continue;
		if (!strncmp(e->d_name, "anthropic_", 10))
			g[n].f = A;
		else if (!strncmp(e->d_name, "openai_chat_", 12))
			g[n].f = C;
		else if (!strncmp(e->d_name, "openai_responses_", 17))
			g[n].f = R;
		else if (!strncmp(e->d_name, "gemini_", 7))
			g[n].f = G;
		else if (!strncmp(e->d_name, "mistral_", 8))
			g[n].f = M;
		else
			continue;
		snprintf(path, sizeof(path), "%s/%s", GOLDEN_DIR, e->d_name);
		g[n].root = json_load_file(path, 0, NULL);
		assert_non_null(g[n].root);
		g[n].text = json_dumps(g[n].root, JSON_COMPACT);
		n++;
	}
	closedir(d);
	return n;
}

/* Every node of a golden replaced, one at a time, by each JSON type. */
static void
sweep(golden *g, json_t *node, size_t *count)
{
	json_t *alts[7];
	const char *k;
	json_t *v;
	size_t i;

	alts[0] = json_null();
	alts[1] = json_integer(-1);
	alts[2] = json_string("");
	alts[3] = json_array();
	alts[4] = json_object();
	alts[5] = json_true();
	alts[6] = json_string("SECRET");
	if (json_is_object(node)) {
		json_object_foreach(node, k, v) {
			json_t *keep = json_incref(v);

			for (size_t a = 0; a < 7; a++) {
				char *s;

				json_object_set(node, k, alts[a]);
				s = json_dumps(g->root, JSON_COMPACT);
				try_body(g->f, s, strlen(s));
				free(s);
				(*count)++;
			}
			json_object_set(node, k, keep);
			json_decref(keep);
			sweep(g, v, count);
		}
	} else if (json_is_array(node)) {
		json_array_foreach(node, i, v) {
			json_t *keep = json_incref(v);

			for (size_t a = 0; a < 7; a++) {
				char *s;

				json_array_set(node, i, alts[a]);
				s = json_dumps(g->root, JSON_COMPACT);
				try_body(g->f, s, strlen(s));
				free(s);
				(*count)++;
			}
			json_array_set(node, i, keep);
			json_decref(keep);
			sweep(g, v, count);
		}
	}
	for (size_t a = 0; a < 7; a++)
		json_decref(alts[a]);
}

static void
every_member_of_the_wrong_type_is_handled(void **state)
{
	golden g[32];
	size_t n = load(g, 32), count = 0;

	(void)state;
	for (size_t i = 0; i < n; i++) {
		sweep(&g[i], g[i].root, &count);
		json_decref(g[i].root);
		free(g[i].text);
	}
	assert_true(count > 1000);
}

static void
random_byte_damage_never_crashes(void **state)
{
	golden g[32];
	size_t n = load(g, 32);
	unsigned seed = 12345;

	(void)state;
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(g[i].text);
		char *buf = malloc(len + 1);

		for (int round = 0; round < 300; round++) {
			memcpy(buf, g[i].text, len + 1);
			for (int k = 0; k < 1 + round % 4; k++) {
				size_t at = (size_t)rand_r(&seed) % len;

				buf[at] = "{}[]\",:0a\\ \x01\x80"[rand_r(&seed) %
								  14];
			}
			try_body(g[i].f, buf, len);
			/* And cut short. */
			try_body(g[i].f, buf, (size_t)rand_r(&seed) % len);
		}
		free(buf);
		json_decref(g[i].root);
		free(g[i].text);
	}
}

/* Every place an importer takes a URL refuses a malformed data: URI,
 * naming the path; well-formed data URIs and other URLs pass. */
static void
malformed_data_uris_name_the_json_path(void **state)
{
	static const struct {
		Histd__V1__Format f;
		const char *body;   /* %s: the URL */
		const char *path;
	} sites[] = {
		{ A, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"image\",\"source\":{\"type\":\"url\",\"url\":\"%s\"}}]}]}",
		  "messages[0].content[0].source.url" },
		{ A, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"document\",\"source\":{\"type\":\"url\",\"url\":\"%s\"}}]}]}",
		  "messages[0].content[0].source.url" },
		{ C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"image_url\",\"image_url\":{\"url\":\"%s\"}}]}]}",
		  "messages[0].content[0].image_url.url" },
		{ C, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"file\",\"file\":{\"file_data\":\"%s\",\"filename\":"
		     "\"a.pdf\"}}]}]}",
		  "messages[0].content[0].file.file_data" },
		{ M, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"image_url\",\"image_url\":\"%s\"}]}]}",
		  "messages[0].content[0].image_url" },
		{ M, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"image_url\",\"image_url\":{\"url\":\"%s\"}}]}]}",
		  "messages[0].content[0].image_url.url" },
		{ M, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"document_url\",\"document_url\":\"%s\"}]}]}",
		  "messages[0].content[0].document_url" },
		{ R, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"input_image\",\"image_url\":\"%s\"}]}]}",
		  "input[0].content[0].image_url" },
		{ R, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"input_file\",\"file_data\":\"%s\",\"filename\":"
		     "\"a.pdf\"}]}]}",
		  "input[0].content[0].file_data" },
		{ R, "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":"
		     "\"input_file\",\"file_url\":\"%s\"}]}]}",
		  "input[0].content[0].file_url" },
		{ G, "{\"contents\":[{\"role\":\"user\",\"parts\":[{\"fileData\":"
		     "{\"mimeType\":\"image/png\",\"fileUri\":\"%s\"}}]}]}",
		  "contents[0].parts[0].fileData.fileUri" },
	};
	static const char *const bad[] = {
		"data:SECRET",                          /* no comma */
		"data:image/png;base64,SECRET@@",       /* not base64 */
		"data:image/png;base64,SECRETx",        /* not a multiple of 4 */
		"data:image/png;base64,AB==",           /* not canonical */
		"data:image/png;base64,SECR ET=",       /* a space */
		"data:;base64,AAAA",                    /* no media type */
		"data:image;base64,AAAA",               /* no subtype */
		"data:,SECRET",                         /* no media type */
		"data:image/png;base6,AAAA",            /* not base64 */
		"data:image/png;base64;x=y,AAAA",       /* base64 not last */
		"data:text/plain,SECRET%zz",            /* bad %-escape */
	};
	static const char *const good[] = {
		"data:image/png;base64,AAAA",
		"data:application/pdf;base64,JVBERi0=",
		"data:text/plain;charset=utf-8,a%20b",
		"data:image/png;base64,",
		"https://example.com/a.png",
	};
	char body[1024];

	(void)state;
	for (size_t i = 0; i < sizeof(sites) / sizeof(sites[0]); i++) {
		for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
			snprintf(body, sizeof(body), sites[i].body, bad[k]);
			assert_invalid(sites[i].f, body, sites[i].path);
			assert_non_null(strstr(histd_error_message(),
					       "data: URI"));
		}
		for (size_t k = 0; k < sizeof(good) / sizeof(good[0]); k++) {
			/* file_data takes data URIs only. */
			if (strncmp(good[k], "data:", 5) &&
			    strstr(sites[i].path, "file_data"))
				continue;
			snprintf(body, sizeof(body), sites[i].body, good[k]);
			if (import(sites[i].f, body, strlen(body), NULL)) {
				fprintf(stderr, "body %s\n  refused: %s\n",
					body, histd_error_message());
				fail();
			}
		}
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(malformed_json_is_invalid),
		cmocka_unit_test(wrong_types_name_the_json_path),
		cmocka_unit_test(deep_nesting_is_refused),
		cmocka_unit_test(numbers_out_of_range_name_the_member),
		cmocka_unit_test(arguments_as_text_follow_the_body_rules),
		cmocka_unit_test(huge_strings_are_refused),
		cmocka_unit_test(message_count_is_limited),
		cmocka_unit_test(every_member_of_the_wrong_type_is_handled),
		cmocka_unit_test(random_byte_damage_never_crashes),
		cmocka_unit_test(malformed_data_uris_name_the_json_path),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
