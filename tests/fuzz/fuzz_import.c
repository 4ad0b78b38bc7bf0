/*
 * libFuzzer target: Import JSON, the provider transcript formats of
 * clients/transcript.h.
 *
 * Input: byte 0 picks the format (byte % 5 + 1: Anthropic Messages,
 * OpenAI Chat, OpenAI Responses, Gemini, Mistral), whether tight limits
 * apply ((byte / 5) % 2) and the format exported to for the cross-format
 * check ((byte / 10) % 5 + 1); the rest is the request body.
 *
 * Besides "no crash, no leak, no undefined behaviour", each run checks
 * what transcript.h promises:
 *   - from_json answers 0 or EINVALID (never EUNIMPL for a known format,
 *     never ENOMEM on a small input); EINVALID leaves the transcript
 *     empty and carries a one-line, non-empty message;
 *   - on success every message is there and packs;
 *   - to_json of the result succeeds in the same format and in another,
 *     and writes JSON that parses;
 *   - round trips are stable: importing what to_json wrote gives back
 *     the same messages, so a second export is the same JSON value.
 * A failed check abort()s, which libFuzzer reports as a crash. With
 * FUZZ_VERBOSE set in the environment, each run prints its answer.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transcript.h"

static void __attribute__((noreturn))
fail(const char *what, Histd__V1__Format f, int rc)
{
	fprintf(stderr, "fuzz_import: %s (format %s, rc %d %s: %s)\n", what,
		histd_format_name(f), rc, histd_error_name(rc),
		histd_error_message());
	abort();
}

/* to_json that must succeed and write a JSON object; *out: the text. */
static json_t *
export_ok(Histd__V1__Format f, const histd_transcript *t, char **out)
{
	histd_strlist dropped = { 0 };
	json_error_t err;
	json_t *j;
	char *text = NULL;
	int rc = histd_transcript_to_json(f, t->messages, t->n_messages, &text,
					  &dropped);

	histd_strlist_clear(&dropped);
	if (rc)
		fail("to_json failed on messages from_json made", f, rc);
	if (!text || !(j = json_loads(text, JSON_DECODE_ANY, &err)) ||
	    !json_is_object(j))
		fail("to_json wrote something that is not a JSON object", f, 0);
	if (out)
		*out = text;
	else
		free(text);
	return j;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Histd__V1__Format f, other;
	histd_transcript_limits lim;
	histd_transcript t = { 0 }, t2 = { 0 };
	json_t *first, *second, *cross;
	char *text = NULL;
	int rc;

	if (size < 1)
		return 0;
	f = (Histd__V1__Format)(data[0] % 5 + 1);
	other = (Histd__V1__Format)((data[0] / 10) % 5 + 1);
	histd_transcript_limits_default(&lim);
	if ((data[0] / 5) % 2) {
		lim.max_string_bytes = 64;
		lim.max_messages = 8;
		lim.max_depth = 8;
	}
	rc = histd_transcript_from_json(f, (const char *)data + 1, size - 1,
					&lim, &t);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "fuzz_import: %s: %s %s (%zu messages, %zu dropped)\n",
			histd_format_name(f), histd_error_name(rc),
			rc ? histd_error_message() : "", t.n_messages,
			t.dropped.n);
	if (rc) {
		if (rc != HISTD_EINVALID && rc != HISTD_ELIMIT)
			fail("from_json answered neither 0, EINVALID nor ELIMIT",
			     f, rc);
		if (t.n_messages || t.dropped.n)
			fail("a refused import left messages or dropped lines", f, rc);
		if (!histd_error_message()[0] ||
		    strchr(histd_error_message(), '\n'))
			fail("the error message is empty or not one line", f, rc);
		histd_transcript_clear(&t);
		return 0;
	}
	for (size_t i = 0; i < t.n_messages; i++) {
		if (!t.messages[i])
			fail("from_json left a NULL message", f, 0);
		protobuf_c_message_get_packed_size(&t.messages[i]->base);
	}

	/* Same format, twice: the second import of an export must succeed
	 * and export the same value. */
	first = export_ok(f, &t, &text);
	rc = histd_transcript_from_json(f, text, strlen(text), NULL, &t2);
	free(text);
	if (rc)
		fail("from_json refused what to_json wrote", f, rc);
	second = export_ok(f, &t2, NULL);
	if (!json_equal(first, second)) {
		char *a = json_dumps(first, JSON_SORT_KEYS);
		char *b = json_dumps(second, JSON_SORT_KEYS);

		fprintf(stderr, "fuzz_import: first export:  %s\n"
				"fuzz_import: second export: %s\n",
			a ? a : "?", b ? b : "?");
		free(a);
		free(b);
		fail("a round trip through the format is not stable", f, 0);
	}
	json_decref(first);
	json_decref(second);

	/* Another format: whatever it cannot express is dropped, never an
	 * error. */
	cross = export_ok(other, &t, NULL);
	json_decref(cross);

	histd_transcript_clear(&t);
	histd_transcript_clear(&t2);
	return 0;
}
