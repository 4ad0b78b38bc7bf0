/*
 * Summarizers: what compaction (plugins/compaction.c) calls to turn older
 * messages into a summary.
 *
 * A summarizer is a versioned struct of function pointers; an
 * implementation embeds `histd_summarizer` first and casts down. Members
 * are only ever appended. Built in: the provider-backed ones of clients/
 * (an LLM through each provider's API) and the extractive one of plugins/
 * (deterministic, no LLM). Chosen by name in the compaction plugin's
 * options; opened with histd_summarizer_open.
 *
 * Threads: summarize may be called from several threads at once (at most
 * one call per session at a time). It blocks (network calls); compaction
 * runs it off the request path.
 */
#ifndef HISTD_SUMMARIZER_H
#define HISTD_SUMMARIZER_H

#include <stddef.h>
#include <stdint.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"

#define HISTD_SUMMARIZER_VERSION 1

typedef struct histd_summary_request {
	/* The previous summary, to merge with (rolling); NULL if none. */
	const char *previous;
	/* The messages to summarize, oldest first (borrowed). */
	Histd__V1__Message *const *messages;
	size_t n_messages;
	/* Instructions; NULL: the summarizer's default prompt. */
	const char *prompt;
	/* Upper bound of the summary's length in tokens; 0: default. */
	uint32_t max_output_tokens;
	/* Give up after this long (milliseconds); 0: the summarizer's. */
	uint32_t timeout_ms;
} histd_summary_request;

typedef struct histd_summary_result {
	char *text;            /* malloc'ed; the caller frees */
	char *model;           /* malloc'ed; which model (or "extractive") */
	uint32_t input_tokens; /* usage as the provider reported it (0 if none) */
	uint32_t output_tokens;
	/* The most tokens (tokens.h estimate) the text should hold, from
	 * the bound the summarizer kept to or asked the provider for (with
	 * room for the provider's own counting); 0 if none. The host cuts a
	 * longer text. */
	uint32_t max_output_tokens;
} histd_summary_result;

typedef struct histd_summarizer histd_summarizer;

struct histd_summarizer {
	unsigned int version;
	const char *name;
	/* Required. 0 with *out filled, or a negative HISTD_E* code with the
	 * thread's message set, naming the provider (EUNAVAILABLE: provider
	 * unreachable or 5xx, retried by the caller with backoff; ELIMIT:
	 * rate limited; EPRECONDITION: the provider refused histd's API key
	 * or request, HTTP 4xx: a server-side fault, not retried). On error
	 * *out is untouched. */
	int (*summarize)(histd_summarizer *s, const histd_summary_request *req,
			 histd_summary_result *out);
	/* Required. */
	void (*free)(histd_summarizer *s);
};

/* Frees what a result holds and zeroes it. */
void histd_summary_result_clear(histd_summary_result *r);

#endif
