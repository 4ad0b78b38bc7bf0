/*
 * The context pipeline in the server: the CONTEXT view of GetMessages,
 * Reduce, compaction off the request path, and the session TTL.
 *
 * CONTEXT view. What an agent sends its model next, built per read:
 *   1. the session's pipeline (its config, or the server's default when
 *      the config has none) over the newest messages after the newest
 *      summary, loading more only when a plugin asks (plugin.h);
 *   2. the fix-up: system messages first (every one, also those the
 *      summary covers), then the summary as a user message whose text
 *      starts "[Earlier conversation summary: ", then the rest, with no
 *      tool_result without its tool_call and no tool_call without its
 *      results;
 *   3. the response: unchanged messages are the stored bytes; changed
 *      ones (masked) are packed again; GetMessagesResponse.summary is the
 *      summary applied; a request's last_n (> 0) windows the result once
 *      more; a view larger than max_response_bytes loses its oldest
 *      non-system messages until it fits. next_after_seq is 0.
 * The summary applies whenever the session has one, whatever the pipeline
 * (a Reduce on a session without a compaction plugin still shows).
 *
 * System messages are found without reading the whole session on every
 * read: an in-memory index per session (seqs and bytes of its system
 * messages) is built once by scanning the stored messages and then
 * extended with what was appended since; it is checked against the
 * session's created_at and cleared_to_seq, so a clear, a replace or a
 * session deleted and created again rebuilds it.
 *
 * Compaction. At most one per session at a time in this process (Reduce
 * waits for a running automatic one). It reads the messages after the
 * previous summary, asks the pipeline's reducer (compaction with its
 * defaults when the pipeline has none), checks what it returns (a cut that
 * is not safe, plugin.h histd_reduce, is EINTERNAL; an empty text
 * EUNAVAILABLE; nothing stored either way; a text above the reducer's
 * max_summary_tokens is cut to fit, with one log line), and stores the
 * Summary with summary_put_life at the session's current revision and the
 * life it read, re-checked so that a concurrent append (seqs after the
 * covered range) only retries the put and a concurrent clear or replace,
 * or a delete (even one created again under the id since, at the same
 * revision), drops the summary. Storage of
 * messages never changes; the driver's SUMMARY change becomes a `reduced`
 * event.
 *
 * Automatic compaction. histd_context_after_append only marks the
 * session and wakes a worker (no I/O on the Append path). A worker reads
 * the session's totals, runs the pipeline's after_append checks
 * (auto_reduce_when) and compacts when one holds. A failure leaves history
 * unchanged, is reported through the error sink (a plugin_error event)
 * and is retried with exponential backoff (retry_base, doubling, at most
 * 60 s) up to max_retries times.
 *
 * Retention. A pipeline whose window has retention = delete makes the
 * same worker, after an append and after the compaction check (a
 * compaction due and failing skips it: what is due for a summary gets one
 * first), delete with truncate (driver version 3) the non-system messages
 * older than where that window starts in the CONTEXT view: the view is
 * built from the RAW tail as for a read and the pipeline's transforms up
 * to that window run on it. Never the newest summary's covers_to_seq or
 * above (the summary stays), never a message holding a tool call whose
 * result is not stored yet or anything after it (the driver would forget
 * the call and refuse the result), nothing when the window keeps no
 * message, no truncate when only system messages would go. It
 * truncates at the revision and life it read (truncate_life): a write in
 * between, or a delete even if the id was created again since and
 * written up to that revision, makes it read again, then retry shortly
 * after. A failure is reported and retried like
 * a compaction's, with plugin "window". The CONTEXT view and the system
 * index find the system messages a truncate kept at or below
 * cleared_to_seq.
 *
 * TTL. With session_ttl set, a sweeper deletes every session idle for
 * longer: no change to it (updated_at, its newest message's created_at,
 * appends seen by this process) for session_ttl. It deletes at the
 * revision it saw, so a session written meanwhile stays. It sweeps every
 * tenant the driver holds sessions of (histd_driver_tenant_list), whether
 * or not this process has served it: sessions stored before a restart and
 * those other replicas wrote expire too. histd_context_new refuses a
 * session_ttl with a driver that cannot list its tenants.
 *
 * Threads: every function may be called from any thread.
 */
#ifndef HISTD_CONTEXT_H
#define HISTD_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "histd/v1/histd.pb-c.h"

typedef struct histd_context_config {
	/* The server's default pipeline (histd_pipeline_parse syntax);
	 * NULL or "": empty (CONTEXT = RAW, apart from summaries). */
	const char *default_pipeline;
	/* Shared objects to load as plugins, comma-separated. */
	const char *plugin_paths;
	int workers;               /* compaction threads; 0: 1 */
	int max_retries;           /* automatic compaction; default 5 */
	int64_t retry_base_us;     /* first backoff; 0: 1 s */
	int64_t session_ttl_us;    /* 0: sessions never expire */
	int64_t sweep_interval_us; /* 0: 60 s */
	/* What the context keeps of a session (caches, compaction state) is
	 * freed once the session has been idle this long, and at least
	 * session_ttl_us; 0: 10 minutes. */
	int64_t entry_idle_us;
} histd_context_config;

/*
 * Where plugin errors go: the server publishes them to the session's
 * subscribers as a HistoryEvent plugin_error (histd_hub_publish_plugin_error
 * has this signature, with the hub as arg). revision is the session's
 * current one, incarnation the life (histd_session.incarnation) of the
 * session the failed work read; an error of an earlier life is not
 * reported. message is one line without conversation text. Called from a
 * worker or a Reduce call, with no lock of the context held; must not
 * block.
 */
typedef void (*histd_plugin_error_fn)(void *arg, const char *tenant,
				      const char *session_id,
				      uint64_t revision, uint64_t incarnation,
				      const char *plugin, const char *message,
				      int will_retry);

typedef struct histd_context histd_context;

/* Loads the plugin shared objects, parses the default pipeline (EINVALID
 * naming what is wrong, also a window with retention = delete when the
 * driver cannot delete old messages), starts the workers and the sweeper.
 * The driver is borrowed and must outlive the context. It also tells
 * histd_context_validate, process-wide, whether the driver can delete old
 * messages (until this context is freed). */
int histd_context_new(histd_context **out, histd_driver *d,
		      const histd_context_config *cfg);

/* Sets the error sink (fn NULL: none). Call before serving. */
void histd_context_set_error_sink(histd_context *x, histd_plugin_error_fn fn,
				  void *arg);

/* Stops the sweeper and the workers (a running compaction finishes; the
 * queued ones are dropped) and frees the context. NULL is allowed. */
void histd_context_free(histd_context *x);

/* How many sessions the context keeps an entry for (tests, metrics). */
size_t histd_context_entries(histd_context *x);

/* ---------------------------------------------------------------------- */
/* The service's seams. x may be NULL: no default pipeline, Reduce runs    */
/* (one per session at a time), after_append does nothing.                 */

/* CreateSession/UpdateSession: EINVALID for an unknown plugin or a bad
 * option, naming the field path ("config.pipeline.plugins[1].options...");
 * EPRECONDITION (FAILED_PRECONDITION) for a window with retention =
 * delete when the driver of the server's context cannot delete old
 * messages ("config.pipeline.plugins[1].options.retention: delete needs a
 * storage driver that can delete old messages; the X driver cannot").
 */
int histd_context_validate(const Histd__V1__SessionConfig *c,
			   const char *field);

/* The CONTEXT view as a packed GetMessagesResponse in *out (malloc'ed). */
int histd_context_get_messages(histd_context *x, histd_driver *d,
			       const char *tenant,
			       const Histd__V1__GetMessagesRequest *r,
			       size_t max_response_bytes, uint8_t **out,
			       size_t *len);

/* Reduce: compacts now; a packed ReduceResponse in *out (malloc'ed). On a
 * summarizer failure the error is returned (EUNAVAILABLE, ...) and
 * reported through the sink with will_retry 0. */
int histd_context_reduce(histd_context *x, histd_driver *d,
			 const char *tenant,
			 const Histd__V1__ReduceRequest *r, uint8_t **out,
			 size_t *len);

/* After a successful Append (not a replayed one): never blocks, no I/O. */
void histd_context_after_append(histd_context *x, histd_driver *d,
				const char *tenant, const char *session_id);

/* For tests: waits until no compaction is queued or running (at most
 * timeout_ms); 0 if idle, -1 on timeout. Retries scheduled later count as
 * queued. */
int histd_context_wait_idle(histd_context *x, int timeout_ms);

/* Runs one TTL sweep now (tests). Returns the sessions deleted. */
int histd_context_sweep(histd_context *x);

/* The session's config may have changed (created, updated, deleted or
 * forked here): the next append checks its pipeline again. */
void histd_context_config_changed(histd_context *x, const char *tenant,
				  const char *session_id);

#endif
