/*
 * What the provider modules share (internal to clients/).
 *
 * Each format module (anthropic.c, openai_chat.c, openai_responses.c,
 * gemini.c, mistral.c) fills one histd_format_ops: how to read a request
 * body into messages, how to write messages as one, and how to ask that
 * provider for a summary. common.c holds the JSON path tracking, the typed
 * getters that name the path in their errors, the builders of messages and
 * blocks, provider_state "extras" and base64.
 *
 * Extras: the members of a provider's object that histd has no field for
 * are copied into a JSON object stored as provider_state[state key] of the
 * message or block; export writes them back. Keys starting with '$' are
 * histd's own markers in that object (how content was shaped, a generated
 * id...) and are never written to a provider.
 */
#ifndef HISTD_PROVIDER_H
#define HISTD_PROVIDER_H

#include <jansson.h>
#include <stdarg.h>

#include "summarizer.h"
#include "transcript.h"

#define HISTD_PATH_MAX 256

/* Import context: the path being read, the limits, what was built. */
typedef struct histd_imp {
	const histd_transcript_limits *lim;
	const char *key;                 /* provider_state key */
	histd_transcript *t;
	char path[HISTD_PATH_MAX];
	size_t plen;
	/* Tool calls seen so far: for tool_name of results, and for formats
	 * that answer calls by name (Gemini). */
	struct histd_callref {
		char *id;
		char *name;
		int answered;
	} *calls;
	size_t n_calls, cap_calls;
	int tail_read;                   /* histd_imp_open_calls ran */
} histd_imp;

/* Export context. */
typedef struct histd_exp {
	const char *key;
	const char *format;              /* for dropped lines */
	histd_strlist *dropped;
	/* Tool call ids -> names seen so far (tool results without a name). */
	struct histd_callref *calls;
	size_t n_calls, cap_calls;
	int nomem;
} histd_exp;

typedef enum histd_auth_style {
	HISTD_AUTH_BEARER,        /* Authorization: Bearer KEY */
	HISTD_AUTH_ANTHROPIC,     /* x-api-key: KEY, anthropic-version */
	HISTD_AUTH_GOOGLE,        /* x-goog-api-key: KEY */
} histd_auth_style;

/* One summarization call, as the provider module builds it. */
typedef struct histd_summary_call {
	const char *model;
	const char *instructions;   /* the system prompt */
	const char *input;          /* the transcript rendered as text */
	uint32_t max_output_tokens;
} histd_summary_call;

typedef struct histd_format_ops {
	Histd__V1__Format format;
	const char *name;             /* histd_format_name */
	const char *key;              /* provider_state key */
	/* root is the parsed body (an object). 0 or EINVALID/ENOMEM. */
	int (*import)(histd_imp *im, json_t *root);
	/* *out: a new object. 0 or ENOMEM. */
	int (*export)(histd_exp *ex, Histd__V1__Message *const *m, size_t n,
		      json_t **out);

	/* Summarization. */
	const char *default_base_url;
	const char *key_env;          /* the API key's usual variable */
	histd_auth_style auth;
	/* The request URL for base and model; malloc'ed or NULL (ENOMEM). */
	char *(*summary_url)(const char *base, const char *model);
	json_t *(*summary_request)(const histd_summary_call *c);
	/* 0 with out filled (text, model, usage), or EUNAVAILABLE naming what
	 * is missing from the body. */
	int (*summary_response)(json_t *root, histd_summary_result *out);
} histd_format_ops;

extern const histd_format_ops histd_format_anthropic;
extern const histd_format_ops histd_format_openai_chat;
extern const histd_format_ops histd_format_openai_responses;
extern const histd_format_ops histd_format_gemini;
extern const histd_format_ops histd_format_mistral;

/* The module of a format; NULL if unknown. */
const histd_format_ops *histd_format_ops_get(Histd__V1__Format f);

/* ---------------------------------------------------------------------- */
/* Paths and errors (import)                                              */

/* Push ".key" / "[i]" onto the path; return the length to pop back to. */
size_t histd_imp_key(histd_imp *im, const char *key);
size_t histd_imp_idx(histd_imp *im, size_t i);
static inline void
histd_imp_pop(histd_imp *im, size_t len)
{
	im->plen = len;
	im->path[len] = '\0';
}

/* EINVALID "<path>: <what>". */
int histd_imp_fail(histd_imp *im, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* EINVALID "<path>.<key>: <what>". */
int histd_imp_fail_at(histd_imp *im, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Tool arguments given as JSON text, at key: EINVALID at "<path>.<key>"
 * unless they are JSON holding no key twice in one object, no number out
 * of range, no deeper nesting and no longer strings than a body may. */
int histd_imp_check_args(histd_imp *im, const char *key, const char *args);
/* Adds "<path>: <what>" to the dropped list. */
int histd_imp_drop(histd_imp *im, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Adds "<key>: not part of the transcript" for a top-level member. Keys in
 * paths and in these lines show a control byte as \xNN: one line each. */
int histd_imp_drop_member(histd_imp *im, const char *key);

/* Typed members of obj. required: EINVALID if absent; otherwise *out is
 * NULL (or the default) when absent. null counts as absent only where
 * allow_null says so. Strings are borrowed from obj. */
int histd_get_str(histd_imp *im, json_t *obj, const char *key, int required,
		  const char **out);
int histd_get_obj(histd_imp *im, json_t *obj, const char *key, int required,
		  json_t **out);
int histd_get_arr(histd_imp *im, json_t *obj, const char *key, int required,
		  json_t **out);
int histd_get_bool(histd_imp *im, json_t *obj, const char *key, int *out);
/* A string, or null/absent (*out NULL). */
int histd_get_str_or_null(histd_imp *im, json_t *obj, const char *key,
			  const char **out);

/* Checks the value is an object / array (at the current path). */
int histd_expect_obj(histd_imp *im, json_t *v);

/* ---------------------------------------------------------------------- */
/* Building messages and blocks                                           */

/* A new message of `role` appended to the transcript (*out borrowed: the
 * transcript owns it). 0, ENOMEM, or ELIMIT when max_messages is
 * reached. */
int histd_msg_new(histd_imp *im, Histd__V1__Role role,
		  Histd__V1__Message **out);
/* Removes the last message if it is `m` and holds no block (a provider
 * message with nothing histd keeps); lists it as dropped. */
int histd_msg_drop_if_empty(histd_imp *im, Histd__V1__Message *m);

/* Appends a block to a message / to a tool result; 0 or ENOMEM (the block
 * is freed on failure). */
int histd_msg_add(Histd__V1__Message *m, Histd__V1__ContentBlock *b);
int histd_result_add(Histd__V1__ToolResultBlock *r, Histd__V1__ContentBlock *b);

/* New blocks; NULL if out of memory. Strings are copied. */
Histd__V1__ContentBlock *histd_blk_text(const char *s);
Histd__V1__ContentBlock *histd_blk_image_url(const char *url,
					     const char *media_type);
Histd__V1__ContentBlock *histd_blk_image_data(uint8_t *data, size_t len,
					      const char *media_type);
Histd__V1__ContentBlock *histd_blk_doc_url(const char *url,
					   const char *media_type,
					   const char *filename);
Histd__V1__ContentBlock *histd_blk_doc_data(uint8_t *data, size_t len,
					    const char *media_type,
					    const char *filename);
Histd__V1__ContentBlock *histd_blk_reasoning(const char *text,
					     const char *summary,
					     const char *signature,
					     const char *enc, size_t enc_len,
					     int redacted);
Histd__V1__ContentBlock *histd_blk_tool_call(const char *id, const char *name,
					     const char *arguments);
Histd__V1__ContentBlock *histd_blk_tool_result(const char *call_id,
					       const char *name, int is_error);
/* (histd_blk_image_data / doc_data take ownership of data, even on
 * failure.) */

/* A media type histd stores as an image (png, jpeg, gif, webp). */
int histd_image_type(const char *media_type);

/* Builds an image block if the media type is an image type histd keeps,
 * else a document block; takes data. NULL if out of memory. */
Histd__V1__ContentBlock *histd_blk_media_data(uint8_t *data, size_t len,
					      const char *media_type,
					      const char *filename);

/* Import: a url read at <path>.<key> that starts with "data:" must be
 * "data:<type>/<subtype>[;<name>=<value>]...[;base64],<data>": a comma, a
 * media type, only name=value parameters but a last "base64", then
 * canonical base64 (with base64) or no bad %-escape. EINVALID naming the
 * path if not, ENOMEM; 0 for any other url. */
int histd_imp_check_url(histd_imp *im, const char *key, const char *url);

/* A url that is "data:<type>;base64,<canonical base64>" with an image type
 * becomes an image data block; anything else stays a url. The form is
 * rebuilt exactly on export. Errors: ENOMEM only. Importers check the url
 * first (histd_imp_check_url). */
int histd_blk_from_url(const char *url, int as_document, const char *filename,
		       Histd__V1__ContentBlock **out);

/* ---------------------------------------------------------------------- */
/* Tool calls seen (import and export)                                    */

int histd_calls_add(struct histd_callref **v, size_t *n, size_t *cap,
		    const char *id, const char *name);
/* The name of call `id`, or NULL. */
const char *histd_calls_name(struct histd_callref *v, size_t n,
			     const char *id);
void histd_calls_free(struct histd_callref *v, size_t n);
/* Once per import (later calls return 0): puts the calls that lim->tail's
 * messages leave unanswered, by a result there or among the messages built
 * so far, in front of im->calls, oldest first. 0 without lim->tail; else
 * tail's error or ENOMEM. */
int histd_imp_open_calls(histd_imp *im);

/* ---------------------------------------------------------------------- */
/* provider_state and extras                                              */

/* Keys starting with '$' are our marks (below): a member of the input
 * whose key starts with '$' is never copied into extras, so a request
 * cannot forge a mark. No provider format has such keys. */
/* New object of the members of obj whose keys are not in known (NULL
 * terminated); NULL if out of memory. */
json_t *histd_extras(json_t *obj, const char *const *known);
/* Copies the members of src not in known into dst (object) under key
 * `sub` (a nested object) or, with sub NULL, at the top. 0 or ENOMEM. */
int histd_extras_into(json_t *dst, const char *sub, json_t *src,
		      const char *const *known);
/* Stores x (if it has members) as provider_state[key]; 0 or ENOMEM. */
int histd_msg_state(Histd__V1__Message *m, const char *key, json_t *x);
int histd_blk_state(Histd__V1__ContentBlock *b, const char *key, json_t *x);
/* Sets one member (a "$" mark) of provider_state[key] of m to v (stolen),
 * keeping the others; 0 or ENOMEM. */
int histd_msg_mark(Histd__V1__Message *m, const char *key, const char *name,
		   json_t *v);
/* provider_state[key] parsed as an object (new reference), or NULL. */
json_t *histd_msg_state_get(const Histd__V1__Message *m, const char *key);
json_t *histd_blk_state_get(const Histd__V1__ContentBlock *b, const char *key);
/* Whether a block carries state of another key than `key`. */
int histd_blk_foreign(const Histd__V1__ContentBlock *b, const char *key);
/* Writes the members of x (if any) not starting with '$' into obj where
 * obj lacks them; with sub, x[sub]. 0 or ENOMEM. */
int histd_extras_apply(json_t *obj, json_t *x, const char *sub);
/* x["$name"] as a string / bool / integer, or NULL / 0 / -1. */
const char *histd_mark_str(json_t *x, const char *name);
int histd_mark_bool(json_t *x, const char *name);
long long histd_mark_int(json_t *x, const char *name);

/* ---------------------------------------------------------------------- */
/* Export helpers                                                         */

/* Bytes (a bytes field the caller filled, e.g. encrypted reasoning) as a
 * JSON string: 0 with *out set, 0 with *out NULL when they are not UTF-8
 * text, or ENOMEM. */
int histd_json_bytes_text(const ProtobufCBinaryData *b, json_t **out);

/* Adds "<path>: <what>" to dropped (no-op without a list). */
void histd_exp_drop(histd_exp *ex, size_t i, long j, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* The text of a tool result's text blocks joined with "\n"; malloc'ed or
 * NULL. *other: set when it holds non-text blocks. */
char *histd_result_text(const Histd__V1__ToolResultBlock *r, int *other);
/* The tool call arguments of block j of message i as a JSON value (new
 * reference): "" -> {}. What does not go as it was is listed in dropped:
 * a key repeated in one object (Append takes it; the last one is kept),
 * text that does not parse (sent as {}). NULL: out of memory. */
json_t *histd_args_value(histd_exp *ex, size_t i, long j,
			 const char *arguments);
/* The JSON text of v (compact, order kept); malloc'ed or NULL. */
char *histd_json_text(json_t *v);

/* "data:<type>;base64,<b64>"; malloc'ed or NULL. */
char *histd_data_uri(const char *media_type, const uint8_t *data, size_t len);

/* ---------------------------------------------------------------------- */
/* base64 (RFC 4648, standard alphabet, padded)                           */

/* malloc'ed, NUL-terminated; NULL if out of memory. */
char *histd_b64_encode(const uint8_t *p, size_t len);
/* Strict: canonical input only (so that encode(decode(s)) == s).
 * 0 with *out malloc'ed (may be 0 bytes), EINVALID or ENOMEM. */
int histd_b64_decode(const char *s, size_t len, uint8_t **out,
		     size_t *out_len);

/* A token count of a provider's usage object (usage[key]), as the
 * Summary holds it: 0 when absent, not an integer or negative (a count
 * below zero is the provider's error, not a huge number), at most
 * UINT32_MAX. */
uint32_t histd_usage_count(json_t *usage, const char *key);

/* Text rendering of messages for summarization prompts; malloc'ed. */
char *histd_render_transcript(const char *previous,
			      Histd__V1__Message *const *m, size_t n);

#endif
