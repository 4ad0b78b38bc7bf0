/*
 * Compaction's summarizers (clients/summarizer.h) and its policy helpers.
 *
 * The compaction plugin names its summarizer in its options
 * ("summarizer": "extractive" by default). "extractive" is built in
 * (extractive.c); every other name goes to the source the server sets at
 * start (the provider-backed summarizers of clients/). Without a source,
 * only "extractive" exists.
 */
#ifndef HISTD_COMPACTION_H
#define HISTD_COMPACTION_H

#include "plugin.h"
#include "summarizer.h"

typedef struct histd_summarizer_source {
	/* 1 if name is a summarizer this source can open. Cheap, no I/O. */
	int (*exists)(void *arg, const char *name);
	/* Opens it: *out freed with (*out)->free. */
	int (*open)(void *arg, const char *name, histd_summarizer **out);
	void *arg;
} histd_summarizer_source;

/* Sets (src NULL: clears) the source; the struct is copied. Call at
 * start-up, before any request. */
void histd_compaction_set_source(const histd_summarizer_source *src);

/* Whether a summarizer of that name exists (extractive or the source's). */
int histd_summarizer_exists(const char *name);
/* Opens one by name; EINVALID for an unknown name. */
int histd_summarizer_open_named(const char *name, histd_summarizer **out);

/*
 * The extractive summarizer: deterministic, no LLM, no network. It is an
 * extract, not an abstract: for each message, oldest first, one line
 * "<role>: <first sentence of its text, at most 200 characters>", tool
 * calls as "assistant called <name>", tool results as "<name> returned:
 * <first sentence>" (or "... returned an error"), reasoning left out
 * (messages that give no line at all: "(N messages without text)"). The
 * lines of a previous summary come first. The text never exceeds
 * max_output_tokens (default 1024): over it, the oldest lines (the
 * previous summary's first) are dropped and replaced by one "(N earlier
 * lines omitted)" line at the top, whose N adds up over rolls (a previous
 * summary's own such line is counted, not kept), and a newest line that
 * alone does not fit is cut on a UTF-8 boundary. The same input always
 * gives the same text; model is "extractive".
 */
int histd_extractive_new(histd_summarizer **out);

#endif
