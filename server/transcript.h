/*
 * The Export and Import RPCs on top of the driver and the provider formats
 * (clients/transcript.h). service.c calls these from its handlers, after it
 * has checked session_id, and keeps everything else an RPC does (tenant,
 * status mapping, the append path of Import) in one place.
 *
 * Export: reads the whole session (RAW; CONTEXT until the context pipeline
 * exists, then histd_transcript_export_messages with what the pipeline
 * gives), converts it, and packs an ExportResponse.
 *
 * Import: converts the body into messages (histd_transcript_import, which
 * may read the session's tail for Gemini's id-less responses); the caller
 * appends them exactly as Append would (validation, token estimate,
 * expected_revision, idempotency_key) and packs the answer with
 * histd_transcript_import_reply.
 *
 * Threads: reentrant. Errors: 0 or a negative HISTD_E* code with the
 * thread's message set; EINVALID messages name the field or JSON path.
 */
#ifndef HISTD_SERVER_TRANSCRIPT_H
#define HISTD_SERVER_TRANSCRIPT_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "histd/v1/histd.pb-c.h"
/* clients/transcript.h: this header shares its name. */
#include "../clients/transcript.h"

/* Checks req->format and req->view: 0 or EINVALID naming the field. */
int histd_transcript_check_request(const Histd__V1__ExportRequest *req);

/* histd_transcript_check_request, then reads every message of the
 * session through the driver (ENOTFOUND for an unknown session of the
 * tenant) and sets *out to the packed ExportResponse (malloc'ed; the
 * caller frees it with free()). A session whose stored messages pass
 * twice max_bytes (0: no limit) is not read further: ELIMIT, since its
 * transcript would not fit the max_bytes the caller allows an answer. */
int histd_transcript_export(histd_driver *d, const char *tenant,
			    const Histd__V1__ExportRequest *req,
			    size_t max_bytes, uint8_t **out, size_t *out_len);

/* ELIMIT saying that a transcript of `bytes`, or (stored) a session whose
 * stored messages are over `bytes`, does not fit an answer of max_bytes
 * (--max-response-bytes). */
int histd_transcript_too_large(size_t bytes, int stored, size_t max_bytes);

/* The packed ExportResponse of the given messages (borrowed). summary, if
 * not NULL, goes first as a system message ("Summary of the earlier
 * conversation: ..."), as the CONTEXT view starts with it. */
int histd_transcript_export_messages(Histd__V1__Format format,
				     Histd__V1__Message *const *messages,
				     size_t n,
				     const Histd__V1__Summary *summary,
				     uint8_t **out, size_t *out_len);

/* How many of the session's newest messages an Import reads to find the
 * tool calls still open before its body (below). */
#define HISTD_IMPORT_TAIL 100

/* Checks req->format, converts req->json into out (see
 * histd_transcript_from_json; lim NULL: defaults; the caller sets
 * max_string_bytes to its max_message_bytes and max_messages to its
 * max_messages_per_append). EINVALID when the body holds no message.
 *
 * With d (NULL: the body alone), a Gemini functionResponse without an id
 * may answer a call stored before the body: at the first such response,
 * the last HISTD_IMPORT_TAIL messages of req->session_id of tenant are
 * read once through the driver, and the calls no result there answers
 * come before the body's, oldest first. A call older than that tail is
 * not seen (EINVALID naming the response's name, as for no call). Other
 * formats, and bodies whose responses all have ids, read nothing. The
 * read's errors pass up as they are (ENOTFOUND for an unknown session of
 * the tenant). */
int histd_transcript_import(histd_driver *d, const char *tenant,
			    const Histd__V1__ImportRequest *req,
			    const histd_transcript_limits *lim,
			    histd_transcript *out);

/* As histd_transcript_import, with before_seq > 0: the tail is the
 * HISTD_IMPORT_TAIL messages before that seq, the session as an earlier
 * Import of the same body saw it when its messages were appended from
 * before_seq on (an idempotent retry converts the body as the first
 * attempt did). */
int histd_transcript_import_before(histd_driver *d, const char *tenant,
				   const Histd__V1__ImportRequest *req,
				   const histd_transcript_limits *lim,
				   uint64_t before_seq, histd_transcript *out);

/* rc, the error of the append an Import ran on t's messages. One that
 * names a message in histd's numbering ("messages[2].content[0]...") is
 * set again with where that message begins in the body added, unless
 * that is the same path: "(histd's messages[2] begins at input[1] in the
 * body)". */
int histd_transcript_import_error(const histd_transcript *t, int rc);

/* The packed ImportResponse: append (borrowed) and the dropped lines of
 * t. *out malloc'ed; the caller frees it with free(). */
int histd_transcript_import_reply(const Histd__V1__AppendResponse *append,
				  const histd_transcript *t, uint8_t **out,
				  size_t *out_len);

#endif
