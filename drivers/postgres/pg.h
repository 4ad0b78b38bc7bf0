/*
 * Internals of the postgres driver, shared by its files:
 *
 *   postgres.c  the vtable: sessions, reads, clear, truncate, summaries,
 *               open/close, the sessions-per-tenant limit
 *   append.c    append and replace: group commit of concurrent appends,
 *               the session size limits
 *   watch.c     change notices: ordering of the hook per session, the
 *               LISTEN thread, catch-up of changes made by other replicas
 *   pool.c      connections, prepared statements, parameters and results
 *               in binary form, SQLSTATE -> HISTD_E* (the one place)
 *   rows.c      values between histd and rows: jsonb labels, sessions,
 *               message columns, records with their seq in front
 *   schema.c    versioned migrations and the SQL of every statement
 *   search.c    search and embeddings: the searchable text of a message
 *               (tsvector), BM25 over it, cosine over stored vectors, and
 *               the backfill of rows stored before schema version 2
 *
 * Nothing here is seen outside drivers/postgres/.
 */
#ifndef HISTD_PG_H
#define HISTD_PG_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"

/* ---------------------------------------------------------------------- */
/* Statements (pool.c prepares every one on every connection)              */

enum pg_stmt {
	ST_SESSION_GET,
	ST_SESSION_GET_SID,
	ST_SESSION_CREATE,
	ST_SESSION_CREATE_LIMITED,
	ST_SESSION_BY_KEYS,
	ST_SESSION_RESOLVE,
	ST_SESSION_RESOLVE_LIMITED,
	ST_TENANT_LOCK,
	ST_SESSION_LOCK,
	ST_SESSION_LIST,
	ST_SESSION_LIST_LABELS,
	ST_TENANT_LIST,
	ST_SESSION_UPDATE,
	ST_SESSION_DELETE,
	ST_READ_AFTER,
	ST_READ_LAST,
	ST_TOOL_RESULT,
	ST_CLEAR,
	ST_TRUNCATE_PROBE,
	ST_TRUNCATE,
	ST_SUMMARY_PUT,
	ST_SUMMARY_GET,
	ST_FORK_SOURCE,
	ST_FORK_CREATE,
	ST_FORK_CREATE_LIMITED,
	ST_FORK_SIZE,
	ST_FORK_COPY,
	ST_FAST_APPEND,
	ST_FAST_APPEND_LIMITED,
	ST_BATCH_LOCK,
	ST_BATCH_IDEM,
	ST_BATCH_TOOLS,
	ST_INSERT_MESSAGES,
	ST_INSERT_CALLS,
	ST_ANSWER_CALLS,
	ST_UPDATE_STATS,
	ST_INSERT_IDEM,
	ST_REPLACE_WIPE,
	ST_NOTIFY,
	ST_NOTIFY_SESSIONS,
	ST_CATCH_UP,
	ST_WATCH_REVISIONS,
	ST_PURGE_IDEM,
	ST_SEARCH_LEXICAL,
	ST_SEARCH_SEMANTIC,
	ST_EMBEDDING_PUT,
	ST_BEGIN,
	ST_COMMIT,
	ST_ROLLBACK,
	ST_COUNT
};

/* Binary type OIDs (pg_type.h), for parameters and arrays. */
#define PG_OID_BOOL 16
#define PG_OID_BYTEA 17
#define PG_OID_INT8 20
#define PG_OID_INT2 21
#define PG_OID_INT4 23
#define PG_OID_TEXT 25
#define PG_OID_TIMESTAMPTZ 1184
#define PG_OID_FLOAT4 700

/* The LISTEN channel. */
#define PG_CHANNEL "histd"

/* ---------------------------------------------------------------------- */
/* Connections                                                             */

typedef struct pg_conn {
	PGconn *pg;
	/* The pool's generation when connected: older ones are reconnected
	 * before use (the server restarted under them). */
	unsigned int gen;
	struct pg_conn *next_free;
} pg_conn;

struct pg_watch;
struct pg_group;

typedef struct pg_driver {
	histd_driver base;
	char *dsn;
	int pool_size;
	/* histd_driver_config's timeout_ms (0: none). */
	int timeout_ms;

	pthread_mutex_t pool_mu;
	pthread_cond_t pool_cv;
	pg_conn *conns;              /* pool_size slots */
	pg_conn *free_list;          /* idle slots, connected or not */
	atomic_uint gen;             /* bumped when the server was lost */
	/* 1 while PostgreSQL answers (the listener decides), for ping and to
	 * fail fast during an outage instead of waiting on connects. */
	atomic_int db_up;
	/* histd_mono_us() when the listener's probe was last answered: the
	 * server itself answers, whatever a batch may be waiting on. */
	atomic_llong probed_us;

	struct pg_group *group;      /* append.c */
	struct pg_watch *watch;      /* watch.c */
	/* Random per process, in every notice we send, so the listener
	 * skips our own changes (the hook already had them). */
	uint64_t origin;
	/* histd_driver_config's limits (0: none); read-only after open. */
	uint64_t max_sessions;
	uint64_t max_msgs;
	uint64_t max_bytes;
} pg_driver;

/* Opens a connection to d->dsn with histd's session settings and, if
 * `prepare`, every statement prepared (the schema must exist). 0, or
 * EUNAVAILABLE with the message set. */
int pg_connect(pg_driver *d, PGconn **out, int prepare);

/* How long histd waits for an answer beyond the server's own
 * statement_timeout: a server that does not even cancel its statement by
 * then is stuck (stopped, or its host unreachable). */
#define PG_TIMEOUT_GRACE_MS 2000

/* The monotonic time (histd_mono_us) by which a statement sent now must
 * be answered; INT64_MAX when d->timeout_ms is 0. */
int64_t pg_deadline(const pg_driver *d);

/* PQgetResult, waiting for the server at most until `deadline` (pending
 * output is flushed first: connections are non-blocking). Past it the
 * connection's socket is shut down, so libpq reports it broken: this
 * call returns that error result, the connection is CONNECTION_BAD, and
 * pg_error names the timeout. */
PGresult *pg_result(pg_driver *d, PGconn *pg, int64_t deadline);

/* Runs `sql` (one or more statements, simple protocol) waiting at most
 * until `deadline`. 0 if every statement succeeded, else pg_error's code
 * for the first failure (the connection is not reported lost). */
int pg_simple(pg_driver *d, PGconn *pg, const char *sql, int64_t deadline);

/* Takes a connection from the pool, (re)connecting it if needed; waits
 * while all are busy. EUNAVAILABLE while PostgreSQL is down. */
int pg_acquire(pg_driver *d, pg_conn **out);
/* Gives it back; a broken one is closed and reconnected at next use. */
void pg_release(pg_driver *d, pg_conn *c);
/* The connection broke: tell the listener, which probes the server. */
void pg_lost(pg_driver *d);
/* If pg is the connection pg_result last gave up on: takes PostgreSQL as
 * down (with d: calls fail at once, health NOT_SERVING, pooled
 * connections made anew) until the listener's probe is answered, and
 * returns 1. pg_error does it; a caller that reports the failure itself
 * calls it. */
int pg_timed_out(pg_driver *d, const PGconn *pg);
/* A write committed and answered, but its notice (the statement after
 * the COMMIT) was not: drops c's connection (pg_timed_out) and has the
 * listener sweep for the missed change. */
void pg_notice_lost(pg_driver *d, pg_conn *c);

/* ---------------------------------------------------------------------- */
/* Parameters, in the binary format where it saves parsing                 */

#define PG_MAX_PARAMS 20

typedef struct pg_params {
	int n;
	const char *values[PG_MAX_PARAMS];
	int lengths[PG_MAX_PARAMS];
	int formats[PG_MAX_PARAMS];
	char scratch[PG_MAX_PARAMS][8];
} pg_params;

void pg_p_i64(pg_params *p, int64_t v);
void pg_p_i32(pg_params *p, int32_t v);
/* NUL-terminated text (NULL: SQL NULL), sent in text format. */
void pg_p_text(pg_params *p, const char *s);
/* Bytes (NULL with len 0: empty, not NULL). */
void pg_p_bytes(pg_params *p, const void *data, size_t len);
void pg_p_null(pg_params *p);
/* Microseconds since the Unix epoch as a timestamptz. */
void pg_p_ts(pg_params *p, int64_t us);

/* A growable byte buffer (arrays, notice payloads). */
typedef struct pg_buf {
	uint8_t *p;
	size_t len, cap;
	int oom;
} pg_buf;

void pg_buf_put(pg_buf *b, const void *data, size_t len);
void pg_buf_free(pg_buf *b);

/* A one-dimensional array parameter in binary form. Begin, add elements,
 * end; the buffer is then the parameter value. */
typedef struct pg_array {
	pg_buf buf;
	uint32_t elem_oid;
	int32_t n;
	int has_null;
} pg_array;

void pg_arr_init(pg_array *a, uint32_t elem_oid);
void pg_arr_i64(pg_array *a, int64_t v);
void pg_arr_i32(pg_array *a, int32_t v);
void pg_arr_i16(pg_array *a, int16_t v);
void pg_arr_bytes(pg_array *a, const void *data, size_t len);
void pg_arr_text(pg_array *a, const char *s);
void pg_arr_ts(pg_array *a, int64_t us);
void pg_arr_f32(pg_array *a, float v);
void pg_arr_null(pg_array *a);
/* Finishes the header; 0 or ENOMEM. */
int pg_arr_finish(pg_array *a);
void pg_p_array(pg_params *p, pg_array *a);
void pg_arr_free(pg_array *a);

/* ---------------------------------------------------------------------- */
/* Results (always requested in binary)                                    */

int64_t pg_r_i64(const PGresult *r, int row, int col);
int32_t pg_r_i32(const PGresult *r, int row, int col);
int pg_r_bool(const PGresult *r, int row, int col);
int pg_r_null(const PGresult *r, int row, int col);
/* Text and bytea: the value, NUL-terminated by libpq, and its length. */
const char *pg_r_str(const PGresult *r, int row, int col, size_t *len);
int64_t pg_r_ts(const PGresult *r, int row, int col);

/* Messages are stored as packed without their seq (the seq is a column);
 * the driver hands them out as records with the seq in front. */
int pg_records_add_msg(histd_records *l, uint64_t seq, uint32_t tokens,
		       const void *data, size_t len);
/* The same as one malloc'ed record (histd_record_free); NULL if out of
 * memory. */
histd_record *pg_record_msg(uint64_t seq, uint32_t tokens, const void *data,
			    size_t len);
/* Stored length of a record: the seq field in front of len bytes. */
size_t pg_record_len(uint64_t seq, size_t len);

/* ---------------------------------------------------------------------- */
/* Running statements                                                      */

/* The one SQLSTATE -> HISTD_E* mapping. Sets the message and returns the
 * code; *retry (may be NULL) says whether running the transaction again
 * may succeed (serialization failure, deadlock). A NULL result or a dead
 * connection is EUNAVAILABLE. */
int pg_error(pg_driver *d, PGconn *pg, const PGresult *r, int *retry);

/* Runs a prepared statement; *out is the result (PQclear it) on success.
 * On failure returns pg_error's code (and *retry). */
int pg_exec(pg_driver *d, pg_conn *c, enum pg_stmt st, const pg_params *p,
	    PGresult **out, int *retry);

/* Several statements in one round trip (libpq pipeline mode): every
 * statement is sent, then one sync. res[i] gets statement i's result, or
 * NULL if it failed or was skipped after a failure. Returns 0 if all
 * succeeded, else the first error (and *retry). Statements with
 * st[i] == ST_COUNT are skipped (not sent). Statements from index
 * `best_effort` on (n: none) may fail without failing the call: they run
 * after a COMMIT, in a transaction of their own (a notice). */
int pg_pipeline(pg_driver *d, pg_conn *c, size_t n, const enum pg_stmt *st,
		const pg_params *const *p, PGresult **res, int *retry,
		size_t best_effort);

/* A transaction body for pg_txn: runs its statements on c. Sets
 * *commit_sent once COMMIT went out (after that a lost connection means
 * "unknown", not "nothing happened"). */
typedef int (*pg_txn_fn)(pg_driver *d, pg_conn *c, void *arg, int *retry,
			 int *commit_sent);

/* Runs fn with a pooled connection; runs it again, up to a few times, when
 * it failed with *retry set, or lost the connection before COMMIT was
 * sent. A write whose COMMIT went out without an answer is EUNAVAILABLE
 * (not acknowledged) and *unknown is set (may be NULL). */
int pg_txn(pg_driver *d, pg_txn_fn fn, void *arg, int *unknown);

/* ROLLBACK if a transaction is open (after an error in a body). */
void pg_rollback(pg_driver *d, pg_conn *c);

/* ---------------------------------------------------------------------- */
/* Schema (schema.c)                                                       */

/* The schema version this binary writes. */
#define PG_SCHEMA_VERSION 6

/* Creates or upgrades the schema under an advisory lock; refuses (EINVALID)
 * a database whose schema is newer than this binary. */
int pg_migrate(pg_driver *d, PGconn *pg);

/* The SQL of every statement, indexed by enum pg_stmt. */
extern const char *const pg_stmt_sql[ST_COUNT];
extern const char *const pg_stmt_name[ST_COUNT];

/* ---------------------------------------------------------------------- */
/* Sessions as rows                                                        */

/* The columns every statement returning a whole session selects, in this
 * order (PG_SESSION_COLS), starting at some column; pg_row_session turns
 * them into a histd_session. */
#define PG_SESSION_COLS \
	"s.sid, s.tenant, s.id, s.context_keys, s.labels, s.config, " \
	"s.created_at, s.updated_at, s.revision, s.last_seq, " \
	"s.cleared_to_seq, s.message_count, s.token_total, s.bytes_total, " \
	"s.first_seq, s.summary_count, s.active_at"
#define PG_SESSION_NCOLS 17

/* Builds *out from the row; *sid (may be NULL) gets the internal id.
 * 0, ENOMEM or ECORRUPT (unreadable JSON). */
int pg_row_session(const PGresult *r, int row, int col, histd_session **out,
		   int64_t *sid);

/* JSON text of pairs as a jsonb object; NULL with n 0 (when null_if_empty)
 * or "{}". EINVALID if a string is not UTF-8 (field names the list). */
int pg_kv_json(const histd_kv *kv, size_t n, int null_if_empty,
	       const char *field, char **out);

/* Whether s is valid UTF-8 without NUL (what PostgreSQL text accepts). */
int pg_utf8_ok(const char *s, size_t len);

/* ---------------------------------------------------------------------- */
/* Append (append.c)                                                       */

int pg_group_new(pg_driver *d);
void pg_group_free(pg_driver *d);
int pg_append(histd_driver *drv, const histd_append *a, histd_append_result *res);
int pg_replace(histd_driver *drv, const histd_append *a, histd_append_result *res,
	       uint64_t *cleared_to_seq);
/* ELIMIT, naming the limit, if a session holding n messages of `bytes`
 * record bytes would pass d's max_session_messages or max_session_bytes;
 * else 0. */
int pg_limit_size(const pg_driver *d, uint64_t n, uint64_t bytes);

/* ---------------------------------------------------------------------- */
/* Search (search.c)                                                       */

/*
 * The searchable text of one message as stored beside it: two tsvector
 * literals (main text; tool result text) and their lengths in tokens, made
 * with the extraction and tokenizer of drivers/index/ so that PostgreSQL
 * finds what the in-process drivers find. A lexeme's positions are its
 * occurrences 1..tf (at most 256, PostgreSQL's limit), not offsets: BM25
 * needs the count, and nothing uses phrase search. `main`, `tool` are
 * NUL-terminated ("" when no token).
 */
typedef struct pg_text {
	pg_buf main, tool;
	int32_t len_main, len_tool;
} pg_text;

/* 0 or ENOMEM; t is the caller's (pg_text_free) either way. */
int pg_text_build(pg_text *t, const uint8_t *data, size_t len);
void pg_text_free(pg_text *t);

int pg_search(histd_driver *drv, const histd_search_query *q,
	      histd_search_result *out);
int pg_embedding_put(histd_driver *drv, const char *tenant, const char *id,
		     uint64_t seq, const char *model, const float *v,
		     uint32_t dim);
int pg_embedding_put_life(histd_driver *drv, const char *tenant,
			  const char *id, uint64_t incarnation, uint64_t seq,
			  const char *model, const float *v, uint32_t dim);

/* Fills the search columns of messages stored before schema version 2 (or
 * by an older histd since), one session per transaction, on connection pg
 * (not pooled). 0, or the error. */
int pg_backfill(pg_driver *d, PGconn *pg);

/* ---------------------------------------------------------------------- */
/* Change notices (watch.c)                                                */

int pg_watch_start(pg_driver *d);
void pg_watch_stop(pg_driver *d);
void pg_watch_set_notify(pg_driver *d, histd_change_fn fn, void *ctx);

/* What a local write tells the watcher after its COMMIT, for the session
 * `sid`: delivered to the hook now if it is the next revision of the
 * session, else held until the revisions before it are delivered. `c` is
 * borrowed. */
void pg_watch_local(pg_driver *d, int64_t sid, const histd_change *c,
		    uint64_t last_seq);

/* A local write whose COMMIT has no answer: the listener re-reads the
 * session. */
void pg_watch_unknown(pg_driver *d, int64_t sid, const char *tenant,
		      const char *id);

/* A read saw the session at this state: track it (a subscriber may be
 * reading its snapshot), so changes made elsewhere are delivered. */
void pg_watch_seen(pg_driver *d, int64_t sid, const char *tenant,
		   const char *id, uint64_t revision, uint64_t last_seq,
		   uint64_t cleared_to_seq);

/* Writes whose sessions are not known had no answer to COMMIT: the
 * listener re-reads every tracked session that moved. */
void pg_watch_sweep(pg_driver *d);

/* Asks the listener to probe the server now rather than at its next
 * tick: a committer whose batches stalled waits for an answered probe
 * (probed_us) before it starts another batch. */
void pg_watch_probe(pg_driver *d);

/* Wakes the listener (the connection pool saw the server go away). */
void pg_watch_kick(pg_driver *d);

/* Appends one notice line to *b: "<origin> <kind> <revision> <sid>\n".
 * A NOTIFY payload holds whole lines, at most PG_NOTICE_MAX bytes. */
#define PG_NOTICE_MAX 7000
void pg_notice_line(pg_buf *b, uint64_t origin, int kind, uint64_t revision,
		    int64_t sid);

/* Reading the protobuf fields stored beside the bytes (role, author,
 * created_at) without unpacking the message. */
typedef struct pg_msg_cols {
	int16_t role;
	const char *author;         /* points into the data; not terminated */
	size_t author_len;
	int has_created;
	int64_t created_us;
} pg_msg_cols;

void pg_msg_scan(const uint8_t *data, size_t len, pg_msg_cols *out);

#endif
