/*
 * Transcripts in the providers' request formats.
 *
 * histd keeps messages in one provider-neutral form (Histd__V1__Message).
 * This is the one place that turns a list of them into the request body a
 * provider expects (to_json), and a provider's request body back into
 * messages (from_json), for the five formats of Histd__V1__Format:
 * Anthropic Messages, OpenAI Chat Completions, OpenAI Responses, Google
 * Gemini generateContent and Mistral chat completions. One module per
 * format lives in clients/providers/.
 *
 * Round trips. from_json then to_json in the same format gives back the
 * same transcript (compared as JSON values: key order and whitespace are
 * not kept). What the neutral form has no field for (an item id, a cache
 * control, whether content was a string or a list, a Gemini thought
 * signature) is kept in the provider_state of the message or block, under
 * the format's state key (histd_format_state_key): a JSON object, opaque to
 * the rest of histd. Across formats, everything the target can express is
 * written and the rest is listed in `dropped`, one line per thing:
 * "messages[3].content[0]: reasoning signed by another provider".
 *
 * Only the transcript is converted: from_json lists the request's other
 * top-level members (model, tools, max_tokens...) as dropped, and to_json
 * writes only the members that hold the transcript (Anthropic "system" and
 * "messages"; Chat and Mistral "messages"; Responses "instructions" and
 * "input"; Gemini "systemInstruction" and "contents"). The caller adds the
 * model and the rest.
 *
 * Validation is strict: a member of the wrong type, a missing required
 * member, an unknown role or block type, bad base64, tool arguments that are
 * not JSON, nesting deeper than max_depth: EINVALID with a message that
 * names the JSON path ("messages[3].content[1].tool_use_id: expected a
 * string") and never holds conversation text. The caller's limits
 * (max_json_bytes, max_string_bytes, max_messages) answer ELIMIT, named
 * the same way. Members a format defines that histd does not model are
 * kept (provider_state) rather than refused.
 *
 * Threads: every function is reentrant; nothing is shared.
 */
#ifndef HISTD_TRANSCRIPT_H
#define HISTD_TRANSCRIPT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"

/* Never deeper than this, whatever the limits say. */
#define HISTD_TRANSCRIPT_MAX_DEPTH 64

struct histd_transcript;

typedef struct histd_transcript_limits {
	size_t max_json_bytes;    /* the whole body; default 64 MiB */
	size_t max_string_bytes;  /* one JSON string (decoded); default 1 MiB
				   * (the server allows the base64 of its
				   * max_message_bytes) */
	size_t max_messages;      /* messages one import may produce; 1000 */
	unsigned max_depth;       /* nesting of arrays and objects; 64 */
	/* Optional (default NULL): what the body continues. A Gemini
	 * functionResponse without an id answers the oldest unanswered
	 * functionCall of its name; with tail set, the calls of what is
	 * already stored count too, before those of the body. from_json
	 * calls tail at most once, at the first such response, with
	 * tail_arg and an empty transcript to fill with the newest stored
	 * messages, oldest first; from_json clears it. tail returns 0 or a
	 * HISTD_E* code (its message set), which from_json returns as is. */
	int (*tail)(void *tail_arg, struct histd_transcript *out);
	void *tail_arg;
} histd_transcript_limits;

/* Fills the defaults above. */
void histd_transcript_limits_default(histd_transcript_limits *l);

/* A growable list of malloc'ed strings. */
typedef struct histd_strlist {
	char **v;
	size_t n;
	size_t cap;
} histd_strlist;

/* Appends a printf-formatted copy; 0 or ENOMEM. */
int histd_strlist_addf(histd_strlist *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Frees every string and the array; leaves the list empty. */
void histd_strlist_clear(histd_strlist *l);

/*
 * What from_json produced. Every message (and everything in it) is
 * malloc'ed piece by piece, so each one is freed with
 * histd__v1__message__free_unpacked(m, NULL); histd_transcript_clear does
 * that for all of them. A caller may take messages out (set the slot to
 * NULL) to keep them.
 *
 * origins: for each message of an import, the path of the body member it
 * begins at ("input[3]"), so that an error found later, in histd's own
 * numbering, can say where that message came from; empty when the
 * transcript was not made by from_json (or memory ran out for it).
 */
typedef struct histd_transcript {
	Histd__V1__Message **messages;
	size_t n_messages;
	size_t cap_messages;
	histd_strlist dropped;
	histd_strlist origins;
} histd_transcript;

void histd_transcript_clear(histd_transcript *t);

/* What a failed jansson parse found, as a phrase that follows the value's
 * name: "is not valid JSON", with the reason where jansson's error code
 * gives one ("is not valid JSON: it holds a \\u0000 (NUL) character").
 * Never quotes the input, as jansson's own text may. */
const char *histd_json_error_why(const json_error_t *e);
/* Appends m, which t then owns; 0, or ENOMEM with m still the caller's. */
int histd_transcript_add(histd_transcript *t, Histd__V1__Message *m);

/*
 * Converts a provider's request body (json, len bytes, UTF-8) into
 * messages appended to out->messages, oldest first, and lists in
 * out->dropped what it could not keep. lim NULL: the defaults.
 * Returns 0, EINVALID (malformed: the message names the JSON path; out is
 * left empty), EUNIMPL (format unknown) or ENOMEM.
 */
int histd_transcript_from_json(Histd__V1__Format format, const char *json,
			       size_t len, const histd_transcript_limits *lim,
			       histd_transcript *out);

/*
 * Writes messages[0..n) as the request body of `format` into *json
 * (malloc'ed, NUL-terminated, compact; the caller frees it with free()) and
 * appends to `dropped` (may be NULL) what the format cannot express.
 * Messages are borrowed. Returns 0, EUNIMPL (format unknown) or ENOMEM;
 * messages the server accepted never fail to convert.
 */
int histd_transcript_to_json(Histd__V1__Format format,
			     Histd__V1__Message *const *messages, size_t n,
			     char **json, histd_strlist *dropped);

/* "anthropic_messages", "openai_chat", "openai_responses", "gemini",
 * "mistral"; NULL for an unknown format. */
const char *histd_format_name(Histd__V1__Format format);

/* The provider_state key a format keeps its data under: "anthropic",
 * "openai_chat", "openai_responses", "gemini", "mistral"; NULL if unknown. */
const char *histd_format_state_key(Histd__V1__Format format);

/* The format named by histd_format_name or by a provider name
 * ("anthropic", "openai" = Chat, "google"); EINVALID if none. */
int histd_format_parse(const char *name, Histd__V1__Format *out);

#endif
