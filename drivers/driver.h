/*
 * histd storage drivers.
 *
 * A driver is a versioned struct of function pointers. An implementation
 * embeds `histd_driver` as its first member and casts down. Members are only
 * ever appended; `version` says which members an implementation fills.
 *
 * The server never calls a member directly: it calls the histd_driver_*
 * wrappers below, which validate arguments common to every driver, fill
 * defaults for optional callbacks, and are the one place for metrics and
 * fault injection. A driver is opened by name (histd_driver_open), which
 * validates the struct once, at start-up.
 *
 * Threads: every callback may be called from any thread, concurrently with
 * any other callback (close excepted: it is called once, when no other call
 * is running). Drivers synchronize internally.
 *
 * Errors: callbacks return 0 or a negative HISTD_E* code (histd_error.h) and
 * set the thread's error message with histd_error_set. Codes a caller acts
 * on: ENOTFOUND (no such session: also another tenant's), EEXISTS, ECONFLICT
 * (expected revision mismatch; *current_revision out-params say the actual
 * one), EINVALID, EPRECONDITION (idempotency key reused with another
 * request), ELIMIT, EUNAVAILABLE (storage unreachable: nothing changed, or
 * for writes: not acknowledged), ECORRUPT (stored data failed its checksum),
 * ENOMEM. On any error, nothing changed and out-parameters are untouched.
 *
 * Ownership: `T **out` out-parameters are owned by the caller and freed
 * with the matching histd_*_free below. Inputs are borrowed for the call;
 * a driver copies what it keeps.
 *
 * Data: drivers never interpret message content. A message is stored as
 * its packed Histd__V1__Message bytes with the seq field in front (see
 * histd_wire.h); the server tells the driver, beside the bytes, the token
 * estimate and the tool call ids a message issues and answers. Session
 * config is stored as opaque packed Histd__V1__SessionConfig bytes.
 * Search is the one exception: to find words, a driver reads the text of
 * the messages it holds (drivers/index/ does it for in-process drivers).
 *
 * Revisions: a session is created at revision 1; every successful write to
 * it (append, update, clear, replace, summary put) adds exactly 1.
 * Activity: each of those writes, and truncate, also sets the session's
 * active_at_us (histd_session) to the server time of the write; create and
 * fork set it to created_at_us. Embedding puts, reads and deletes do not.
 * Seqs: assigned by the driver, per session, starting at 1, strictly
 * increasing, never reused, not even after clear or replace. (A session
 * deleted and created again under the same id is a new session and starts
 * again at seq 1.)
 */
#ifndef HISTD_DRIVER_H
#define HISTD_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "histd_error.h"

/* 2 added search and embedding_put (optional). A version 1 driver stays
 * valid: its search wrappers answer EUNIMPL. 3 added truncate (optional),
 * 4 tenant_list (required from 4; an older driver's wrapper answers
 * EUNIMPL, and session TTL refuses it), 5 session_delete_life
 * (optional; its wrapper falls back to session_delete), 6 truncate_life,
 * summary_put_life and session_fork_life (optional; their wrappers fall
 * back to truncate, summary_put and session_fork), 7 embedding_put_life
 * (optional; its wrapper falls back to session_get, then embedding_put). */
#define HISTD_DRIVER_VERSION 7

/* ---------------------------------------------------------------------- */
/* Values passed to and from drivers                                       */

typedef struct histd_kv {
	char *key;
	char *value;
} histd_kv;

/*
 * A session's record. In inputs, only the fields named by each callback are
 * read. In outputs, every field is set; the struct and every pointer in it
 * are owned by the caller (histd_session_free).
 */
typedef struct histd_session {
	char *tenant;
	char *id;
	/* Context keys and labels, sorted by key, keys unique. */
	histd_kv *context_keys;
	size_t n_context_keys;
	histd_kv *labels;
	size_t n_labels;
	/* Packed Histd__V1__SessionConfig; may be NULL with config_len 0. */
	uint8_t *config;
	size_t config_len;
	int64_t created_at_us;
	int64_t updated_at_us;
	/*
	 * Server time of the session's last change of any kind: created_at_us
	 * for create and fork, now_us for update, append and replace, the
	 * driver's clock (histd_now_us) for clear, summary put and truncate.
	 * Not moved by reads or embedding puts. Unlike updated_at_us (which
	 * only UpdateSession moves) and a message's created_at (which a
	 * caller may set), it says when the session was last written: the
	 * session TTL sweeper judges idleness by it. 0: unknown (data a
	 * driver stored before it kept this, or a driver that does not keep
	 * it); callers then fall back to the session's other times.
	 */
	int64_t active_at_us;
	uint64_t revision;
	/* The last seq ever assigned (0: none). */
	uint64_t last_seq;
	/* Every seq <= cleared_to_seq was removed by clear or replace. */
	uint64_t cleared_to_seq;
	/* Over the messages stored now. */
	uint64_t message_count;
	uint64_t token_total;
	uint64_t bytes_total;   /* sum of stored record lengths */
	uint64_t first_seq;     /* oldest stored seq; 0 when none */
	uint64_t summary_count;
	/*
	 * Which life of the id this is: greater for a session created again
	 * under its id after a delete than for every earlier life, and the
	 * same through every change in between. Stable while the driver is
	 * open (not necessarily across a restart). 0: the driver does not
	 * tell. Subscribe keeps a stream to the life it read, so that an
	 * earlier life's late changes never reach it; the embedder stores no
	 * vector computed for an earlier life.
	 */
	uint64_t incarnation;
} histd_session;

/* A stored message or summary. `data` points at `len` bytes: a packed
 * Message with its seq in front, or a packed Summary. */
typedef struct histd_record {
	uint64_t seq;           /* messages: the seq; summaries: covers_to_seq */
	uint32_t token_estimate;
	uint32_t len;
	uint8_t *data;
} histd_record;

/* A list of records, owned by the caller (histd_records_clear). Drivers
 * build it with histd_records_add, which copies the bytes. */
typedef struct histd_records {
	histd_record *v;
	size_t n;
	size_t cap;
	/* The copied bytes, in shared blocks (one malloc for many records);
	 * managed by histd_records_add and histd_records_clear only. */
	void *mem;
	/* Framed copies (histd_records_frame): each record's bytes preceded
	 * by a protobuf key and length, all in one buffer, the way a reply
	 * sends them. wire_n: how many of v[] are in it, from v[0]. Managed
	 * by the helpers only. */
	uint8_t *wire;
	size_t wire_len, wire_cap, wire_n;
	uint32_t wire_field;
} histd_records;

/* A tool call id a message issues (tool_call.id) or answers
 * (tool_result.tool_call_id), with the index of its content block, so that
 * errors can name the field path. */
typedef struct histd_tool_ref {
	const char *id;
	uint32_t block;
} histd_tool_ref;

/* One message to append. */
typedef struct histd_msg_in {
	const uint8_t *data;    /* packed Message with seq 0 (field absent) */
	size_t len;
	uint32_t token_estimate;
	const histd_tool_ref *calls;
	size_t n_calls;
	const histd_tool_ref *results;
	size_t n_results;
} histd_msg_in;

/*
 * How a driver reports, after it answered HISTD_PENDING, that an append is
 * durable: rc 0, or the error the append must answer after all (msg says
 * why; borrowed for the call). Called exactly once, from a driver thread,
 * possibly before the driver's append call has returned; it must not call
 * into the driver and must not block.
 */
typedef void (*histd_durable_fn)(void *ctx, int rc, const char *msg);

/* An append that is applied and will be reported through on_durable. */
#define HISTD_PENDING 1

typedef struct histd_append_result histd_append_result;

/*
 * How a driver answers, after it returned HISTD_DEFERRED, an append it
 * took to finish later: rc 0 with *res filled as append's answer 0 fills
 * it (the append is applied and durable), or the error the append answers
 * (msg says why; res->current_revision set for ECONFLICT). res and msg are
 * borrowed for the call. Called exactly once, from a driver thread,
 * possibly before the driver's append call has returned; it must not call
 * into the driver and must not block.
 */
typedef void (*histd_result_fn)(void *ctx, int rc,
				const histd_append_result *res,
				const char *msg);

/* An append taken to be answered later through on_result. */
#define HISTD_DEFERRED 2

typedef struct histd_append {
	const char *tenant;
	const char *session_id;
	/* 0: no check; else ECONFLICT unless the session is at this revision. */
	uint64_t expected_revision;
	/* NULL or "": no idempotency. Else the first append with this key is
	 * remembered with `request_hash` until `idem_expires_us`; a later
	 * append with the same key and hash returns the first result with
	 * replayed = 1 and changes nothing; with another hash, EPRECONDITION.
	 * The key check comes before the revision check. */
	const char *idempotency_key;
	const uint8_t *request_hash;   /* HISTD_HASH_LEN bytes */
	/* The server time of the call: for expiry of remembered keys, and
	 * the session's active_at_us after the append or replace. */
	int64_t now_us;
	int64_t idem_expires_us;
	const histd_msg_in *msgs;      /* 1..n messages */
	size_t n_msgs;
	/*
	 * Optional. A driver that makes an append durable after applying it
	 * (a log with group commit) may answer HISTD_PENDING instead of
	 * blocking the calling thread until then: *res is filled as for 0,
	 * the change is applied, and on_durable(durable_ctx, ...) follows
	 * once it is durable; the caller must not report success before. A
	 * driver may ignore these and block; with any answer other than
	 * HISTD_PENDING, on_durable is never called. Subscribers are
	 * notified, as always, only once the change is durable.
	 */
	histd_durable_fn on_durable;
	void *durable_ctx;
	/*
	 * Optional. A driver that learns an append's result only after a
	 * wait (a database round trip) may copy what it needs of the request
	 * and answer HISTD_DEFERRED at once: nothing in *res, the request
	 * need not outlive the call, and on_result(result_ctx, ...) gives the
	 * answer later. A driver may ignore these and block; with any answer
	 * other than HISTD_DEFERRED, on_result is never called.
	 */
	histd_result_fn on_result;
	void *result_ctx;
} histd_append;

#define HISTD_HASH_LEN 32

struct histd_append_result {
	uint64_t first_seq;
	uint64_t last_seq;
	uint64_t revision;
	int replayed;
	/* ECONFLICT: the session's current revision. */
	uint64_t current_revision;
};

typedef struct histd_read {
	const char *tenant;
	const char *session_id;
	/* last_n > 0: the last_n newest messages (after_seq, limit ignored).
	 * Else messages with seq > after_seq in seq order, at most limit
	 * (limit 0: no limit). */
	uint64_t after_seq;
	uint32_t limit;
	uint32_t last_n;
	/* Non-zero: also return the session record in result->session. */
	int want_session;
	/* Non-zero: also the session's newest summary (as summary_get) in
	 * result->summary, NULL when it has none. A driver that reads it
	 * with the messages, at the same instant, sets summary_read; for
	 * one that does not, histd_driver_read gets it by summary_get after
	 * the read. */
	int want_summary;
	/* With want_session or want_summary: a revision of this session (of
	 * the one created at known_created_us) whose session record and
	 * summary the caller holds already (0: none). A driver that finds
	 * the session still there leaves result->session and
	 * result->summary NULL and sets result->known; one that does not
	 * look (optional) fills them as usual. */
	uint64_t known_revision;
	int64_t known_created_us;
	/* Non-zero: the caller will send the messages as this field of a
	 * protobuf message. A driver that knows the size of what it returns
	 * before copying may build result->records with histd_records_frame
	 * (optional; the records are the same either way), leaving
	 * frame_slack bytes spare for the caller's other fields. */
	uint32_t frame_field;
	uint32_t frame_slack;
	/* Non-zero: the caller keeps only the records whose framed sizes
	 * (1 + varint(len) + len each) add up to at most max_bytes, and at
	 * least one: the first ones of a forward read, the newest of a
	 * last_n read. A driver may honour it (optional; histd_read_budget)
	 * and return no more than those, so that a page of large messages
	 * is not copied only to be cut; it then sets has_more when the
	 * budget left out records the read would have returned. */
	uint64_t max_bytes;
} histd_read;

/* Everything is read at one instant: the messages are exactly those stored
 * at `revision`. */
typedef struct histd_read_result {
	histd_records records;
	uint64_t revision;
	uint64_t last_seq;
	uint64_t cleared_to_seq;
	int has_more;               /* more messages after the last returned;
	                             * with last_n: older ones of the last_n
	                             * that max_bytes left out */
	histd_session *session;     /* if want_session; caller frees */
	histd_record *summary;      /* if want_summary; caller frees */
	int summary_read;           /* set by a driver that filled summary */
	int known;                  /* at known_revision: nothing filled */
} histd_read_result;

typedef struct histd_list {
	const char *tenant;
	const char *after_id;       /* NULL or "": from the first id */
	uint32_t limit;             /* 1.. */
	const histd_kv *labels;     /* every pair must be among the labels */
	size_t n_labels;
} histd_list;

typedef struct histd_session_list {
	histd_session **v;
	size_t n;
	int has_more;
} histd_session_list;

/* A page of tenant names (tenant_list), owned by the caller
 * (histd_tenant_list_free). */
typedef struct histd_tenant_list {
	char **v;
	size_t n;
	int has_more;
	size_t cap;                 /* of v; histd_tenant_list_offer's */
} histd_tenant_list;

/* What changed, for subscribers. */
enum histd_change_kind {
	HISTD_CHANGE_APPENDED = 1,  /* records: the appended messages */
	HISTD_CHANGE_CLEARED,       /* cleared_to_seq */
	HISTD_CHANGE_REPLACED,      /* records: the new messages; cleared_to_seq */
	HISTD_CHANGE_SUMMARY,       /* records: one, the new summary */
	HISTD_CHANGE_UPDATED,       /* session: the record after the update */
	HISTD_CHANGE_DELETED,       /* revision: the last revision + 1 */
};

typedef struct histd_change {
	enum histd_change_kind kind;
	const char *tenant;
	const char *session_id;
	uint64_t revision;          /* the session's revision after the change */
	uint64_t cleared_to_seq;
	/* APPENDED, REPLACED, SUMMARY: the records. A driver that cannot give
	 * them (a change made by another replica) passes records == NULL and
	 * the receiver reads them. */
	const histd_record *records;
	size_t n_records;
	const histd_session *session;
	/* CLEARED by truncate: the system messages at or below cleared_to_seq
	 * are still stored (everything else up to it is gone). 0 for clear. */
	int system_kept;
	/* The session's histd_session.incarnation (the life the change was
	 * made to); 0: not known. */
	uint64_t incarnation;
} histd_change;

/*
 * Called once per committed change, after it is durable, in revision order
 * for each session, possibly while the driver holds internal locks: it must
 * not call into the driver and must not block. Everything it is given is
 * borrowed for the call.
 */
typedef void (*histd_change_fn)(void *ctx, const histd_change *change);

/* ---------------------------------------------------------------------- */
/* Search (version 2)                                                      */

enum histd_search_mode {
	HISTD_SEARCH_LEXICAL = 1,   /* BM25 over the words of the messages */
	HISTD_SEARCH_SEMANTIC = 2,  /* cosine of stored embedding vectors */
};

/* The most hits one search returns. */
#define HISTD_SEARCH_K_MAX 100

/*
 * One search. Scope, the first that applies: session_ids (n_session_ids >=
 * 1: exactly these sessions of the tenant; ids that do not exist are
 * ignored); labels (n_labels >= 1: the tenant's sessions whose labels
 * include every pair, sorted by key as in histd_list); else every session
 * of the tenant.
 *
 * What a message offers to LEXICAL search: the text of its text blocks, the
 * text and summary of reasoning blocks, the name and arguments of tool
 * calls, and, only with include_tool_results, the text blocks inside tool
 * results. Images, documents, metadata and provider state never match.
 * Tokens are lowercased runs of letters and digits (drivers/index/index.h
 * gives the exact rule a driver without its own text search uses).
 */
typedef struct histd_search_query {
	const char *tenant;
	const char *const *session_ids;
	size_t n_session_ids;
	const histd_kv *labels;
	size_t n_labels;
	enum histd_search_mode mode;
	/* LEXICAL: the query, UTF-8, at least one token. */
	const char *text;
	/* SEMANTIC: the query vector (dim floats), compared only with the
	 * vectors stored under the same model and dimension. */
	const float *vector;
	uint32_t dim;
	const char *model;
	uint32_t k;                 /* 1..HISTD_SEARCH_K_MAX */
	/* Bit (1u << role) for every Role wanted (Histd__V1__Role values);
	 * 0: every role. */
	uint32_t roles;
	int include_tool_results;
	/* Leave out each session's newest stored message. */
	int exclude_newest;
} histd_search_query;

typedef struct histd_search_hit {
	char *session_id;           /* malloc'ed, the result's */
	double score;               /* higher is better */
} histd_search_hit;

/* Hits best first; hits[i]'s message is records.v[i] (seq in front, as
 * read returns it). Owned by the caller: histd_search_result_clear. */
typedef struct histd_search_result {
	histd_search_hit *hits;
	size_t n;
	histd_records records;
} histd_search_result;

/* ---------------------------------------------------------------------- */
/* The interface                                                           */

typedef struct histd_driver histd_driver;

struct histd_driver {
	/* HISTD_DRIVER_VERSION the implementation was written against. */
	unsigned int version;
	/* Its name as chosen in the configuration ("memory", "file", ...). */
	const char *name;

	/* Required. Creates a session from in->tenant, id, context_keys,
	 * labels, config, created_at_us (updated_at_us = active_at_us =
	 * created_at_us) at revision 1. EEXISTS if the id exists in the tenant, or if context
	 * keys are given and another session of the tenant has the same set. */
	int (*session_create)(histd_driver *d, const histd_session *in,
			      histd_session **out);

	/* Required. ENOTFOUND if no such session in the tenant. */
	int (*session_get)(histd_driver *d, const char *tenant, const char *id,
			   histd_session **out);

	/* Required. Get-or-create by in->context_keys (non-empty): if a session
	 * of in->tenant has exactly these keys, returns it with *created = 0;
	 * else creates it as session_create would (with in->id) and sets
	 * *created = 1. Atomic: two concurrent calls with the same keys return
	 * the same session, one of them created. */
	int (*session_resolve)(histd_driver *d, const histd_session *in,
			       histd_session **out, int *created);

	/* Required. The tenant's sessions with id > after_id in id order (byte
	 * order), filtered by labels, at most limit; has_more if more exist.
	 * out->v and each session are owned by the caller
	 * (histd_session_list_free). */
	int (*session_list)(histd_driver *d, const histd_list *q,
			    histd_session_list *out);

	/* Required. Replaces labels (if labels != NULL: the n_labels pairs) and
	 * config (if config != NULL), sets updated_at_us = active_at_us =
	 * now_us, adds 1 to the revision. expected_revision as in append
	 * (ECONFLICT, with *current_revision set). */
	int (*session_update)(histd_driver *d, const char *tenant,
			      const char *id, uint64_t expected_revision,
			      const histd_kv *labels, size_t n_labels,
			      const uint8_t *config, size_t config_len,
			      int64_t now_us, histd_session **out,
			      uint64_t *current_revision);

	/* Required. Deletes the session, its messages, summaries, tool call
	 * index and idempotency keys; notifies DELETED with the session's
	 * last revision + 1, so that subscribers see it as a newer change. */
	int (*session_delete)(histd_driver *d, const char *tenant,
			      const char *id, uint64_t expected_revision,
			      uint64_t *current_revision);

	/* Required. Creates `in` (tenant, id, labels, context_keys,
	 * created_at_us, which is also its updated_at_us and active_at_us;
	 * config copied from the source) holding the source's
	 * messages with seq <= up_to_seq (0: all) with their seqs, the
	 * summaries with covers_to_seq <= up_to_seq, and the tool call state
	 * of those messages. The fork's last_seq is min(up_to_seq, source
	 * last_seq) (source last_seq when up_to_seq is 0), its cleared_to_seq
	 * min(that, the source's), its revision 1. ENOTFOUND for the source,
	 * EEXISTS for the new id. */
	int (*session_fork)(histd_driver *d, const char *tenant,
			    const char *source_id, uint64_t up_to_seq,
			    const histd_session *in, histd_session **out);

	/*
	 * Required. Appends a->msgs as one atomic batch: all or nothing.
	 * Order of checks: session exists (ENOTFOUND); idempotency key (see
	 * histd_append); expected revision (ECONFLICT); tool references:
	 * every calls[].id must be new in the session and the batch (EINVALID,
	 * "messages[i].content[j].tool_call.id is already used in this
	 * session"); every results[].id must name a call issued earlier in the
	 * session or in an earlier message of the batch and not yet answered
	 * (EINVALID, "messages[i].content[j].tool_result.tool_call_id does not
	 * answer an open tool call"). Then assigns seqs last_seq+1.., stores
	 * each record (seq in front of the bytes), updates stats, adds 1 to
	 * the revision, remembers the idempotency key, and notifies
	 * HISTD_CHANGE_APPENDED before returning.
	 */
	int (*append)(histd_driver *d, const histd_append *a,
		      histd_append_result *res);

	/* Required. Reads messages as histd_read says. ENOTFOUND if no such
	 * session. res->records and res->session are the caller's. */
	int (*read)(histd_driver *d, const histd_read *q,
		    histd_read_result *res);

	/* Required. The message holding the tool result for call_id: *out is
	 * one record owned by the caller (histd_record_free). ENOTFOUND if no
	 * session, or no stored result answers that call. */
	int (*tool_result)(histd_driver *d, const char *tenant, const char *id,
			   const char *call_id, histd_record **out);

	/* Required. Removes every message and summary and the tool call
	 * index; keeps last_seq; sets cleared_to_seq = last_seq; +1 revision;
	 * notifies CLEARED. */
	int (*clear)(histd_driver *d, const char *tenant, const char *id,
		     uint64_t expected_revision, uint64_t *revision,
		     uint64_t *cleared_to_seq, uint64_t *current_revision);

	/* Required. Atomically: clear, then append msgs (0..n) checked as a
	 * batch against an empty tool call index; +1 revision in all;
	 * notifies REPLACED with the new records. res->first_seq/last_seq are
	 * 0 when n_msgs is 0. Idempotency fields of `a` are ignored. */
	int (*replace)(histd_driver *d, const histd_append *a,
		       histd_append_result *res, uint64_t *cleared_to_seq);

	/* Required. Stores a summary record (packed Summary, seq =
	 * covers_to_seq); +1 revision; notifies SUMMARY. expected_revision as
	 * in append. */
	int (*summary_put)(histd_driver *d, const char *tenant, const char *id,
			   uint64_t expected_revision, const histd_record *summary,
			   uint64_t *revision, uint64_t *current_revision);

	/* Required. The newest summary (largest covers_to_seq, newest put on a
	 * tie): *out owned by the caller; *out = NULL (and 0) when none. */
	int (*summary_get)(histd_driver *d, const char *tenant, const char *id,
			   histd_record **out);

	/* Required. Sets the change hook (fn NULL: none). Called before any
	 * write; changes made before it are not reported. */
	void (*set_notify)(histd_driver *d, histd_change_fn fn, void *ctx);

	/* Optional. 0 when the storage answers; EUNAVAILABLE otherwise.
	 * Default: always 0. */
	int (*ping)(histd_driver *d);

	/* Required. Frees the driver and everything it holds. */
	void (*close)(histd_driver *d);

	/* ---- version 2 ---- */

	/*
	 * Optional (the wrapper answers EUNIMPL "the driver cannot search").
	 * The k best messages of q's scope, best first, ties by session id
	 * then seq. LEXICAL: BM25 (k1 1.2, b 0.75, or the storage's own full
	 * text ranking) over the text histd_search_query describes; a message
	 * matches if it holds at least one query token. SEMANTIC: cosine
	 * similarity with q->vector over the messages holding a vector of
	 * q->model and q->dim (embedding_put); a message matches if its
	 * cosine (a double sum of the float products) is above 0: a vector
	 * orthogonal or opposite to the query's is not a hit. Both: only roles in q->roles,
	 * only stored messages (a cleared, replaced or deleted message is
	 * never returned once that call has returned), and not the newest of
	 * its session with exclude_newest. A scope with no session, or no
	 * match, is 0 with no hits, not ENOTFOUND. out is zeroed by the
	 * wrapper and the caller's on success. Any thread. EINVALID for a
	 * query without a token (LEXICAL).
	 */
	int (*search)(histd_driver *d, const histd_search_query *q,
		      histd_search_result *out);

	/*
	 * Optional (without it the wrapper answers EUNIMPL and semantic
	 * search falls back to lexical). Stores v (dim floats, copied) as the
	 * embedding of message seq under `model`, replacing one stored
	 * before; it goes when the message goes (clear, replace, delete) and
	 * is copied by fork with the message. Does not change the revision
	 * and notifies nothing: it is derived data. Durable drivers keep it
	 * across restarts. ENOTFOUND if no such session or no stored message
	 * with that seq (it may have been cleared meanwhile). Any thread.
	 */
	int (*embedding_put)(histd_driver *d, const char *tenant,
			     const char *id, uint64_t seq, const char *model,
			     const float *v, uint32_t dim);

	/* --- version 3 --- */

	/* Optional (the retention option of the context pipeline needs it).
	 * Deletes the stored messages with seq <= up_to_seq whose role is not
	 * SYSTEM (their tool call state, vectors, and the summaries with
	 * covers_to_seq <= up_to_seq), keeping system messages, every later
	 * message, last_seq and seqs as they are; sets cleared_to_seq to
	 * max(cleared_to_seq, up_to_seq); +1 revision; notifies CLEARED with
	 * cleared_to_seq = up_to_seq and system_kept = 1. So after a truncate
	 * the only messages at or below cleared_to_seq are system messages,
	 * and reads return them as usual (after_seq, last_n count them).
	 * An up_to_seq above last_seq counts as last_seq (later seqs must stay
	 * above cleared_to_seq). A tool call whose call message is deleted is
	 * forgotten, even if its result message stays. message_count,
	 * token_total and bytes_total drop by what was deleted. A session with
	 * no non-system message at or below up_to_seq changes nothing and
	 * answers 0 with the current revision. expected_revision as in
	 * append. */
	int (*truncate)(histd_driver *d, const char *tenant, const char *id,
			uint64_t up_to_seq, uint64_t expected_revision,
			uint64_t *revision, uint64_t *current_revision);

	/* --- version 4 --- */

	/* Required from version 4. The tenants that hold at least one
	 * session now, with a name > after (NULL or "": from the first), in
	 * byte order, at most limit (1..); has_more if more exist. A tenant
	 * whose sessions were all deleted is not listed. Every tenant in the
	 * storage counts: those stored before a restart, and, for a driver
	 * several replicas share, those other replicas wrote. out->v and
	 * each name are owned by the caller (histd_tenant_list_free). This
	 * is how the session TTL sweeper finds what to sweep. */
	int (*tenant_list)(histd_driver *d, const char *after, uint32_t limit,
			   histd_tenant_list *out);

	/* --- version 5 --- */

	/* Optional. session_delete of one life of the session: when the
	 * session under the id is not the life `incarnation`
	 * (histd_session.incarnation; it was deleted and created again since
	 * that was read), ENOTFOUND and nothing changes. The session TTL
	 * sweeper deletes with it, so that a session created again after the
	 * sweeper listed the idle one is never taken for it, even at the
	 * same revision. */
	int (*session_delete_life)(histd_driver *d, const char *tenant,
				   const char *id, uint64_t expected_revision,
				   uint64_t incarnation,
				   uint64_t *current_revision);

	/* --- version 6 --- */

	/* Optional; half a pair without truncate. truncate of one life of
	 * the session: when the session under the id is not the life
	 * `incarnation` (0: any life), ENOTFOUND and nothing changes, as in
	 * session_delete_life. A session deleted and created again starts
	 * again at revision 1, so an expected revision alone does not tell
	 * the lives apart: retention computes up_to_seq from one life and
	 * truncates with this, so that it never deletes another life's
	 * messages. */
	int (*truncate_life)(histd_driver *d, const char *tenant,
			     const char *id, uint64_t up_to_seq,
			     uint64_t expected_revision, uint64_t incarnation,
			     uint64_t *revision, uint64_t *current_revision);

	/* Optional. summary_put of one life of the session: when the
	 * session under the id is not the life `incarnation` (0: any life),
	 * ENOTFOUND and nothing changes, as in session_delete_life.
	 * Compaction stores with it, so that a summary of one life's
	 * messages never lands in a session created again under the id
	 * (it would show that text and hide the new life's messages up to
	 * its covers_to_seq). */
	int (*summary_put_life)(histd_driver *d, const char *tenant,
				const char *id, uint64_t expected_revision,
				uint64_t incarnation,
				const histd_record *summary, uint64_t *revision,
				uint64_t *current_revision);

	/* Optional. session_fork from one life of the source: when the
	 * session under source_id is not the life `source_incarnation` (0:
	 * any life), ENOTFOUND and nothing is created. ForkSession gives
	 * the fork the source's labels, read before the fork: with this, a
	 * fork never holds one life's messages under another life's
	 * labels. */
	int (*session_fork_life)(histd_driver *d, const char *tenant,
				 const char *source_id,
				 uint64_t source_incarnation,
				 uint64_t up_to_seq, const histd_session *in,
				 histd_session **out);

	/* --- version 7 --- */

	/* Optional; half a pair without embedding_put. embedding_put into
	 * one life of the session: when the session under the id is not the
	 * life `incarnation` (0: any life), ENOTFOUND and nothing is stored,
	 * as in session_delete_life; the check and the store are one step,
	 * with no delete or create of the id between them. A session deleted
	 * and created again starts again at seq 1, so a seq alone does not
	 * tell the lives apart: the embedder stores with this the vectors it
	 * computed from one life's messages, so that they never land on the
	 * messages of a later life under the same seqs (a search would match
	 * them for text they do not hold). */
	int (*embedding_put_life)(histd_driver *d, const char *tenant,
				  const char *id, uint64_t incarnation,
				  uint64_t seq, const char *model,
				  const float *v, uint32_t dim);
};

/* Driver options from the configuration. Each driver reads its own. */
typedef struct histd_driver_config {
	const char *data_dir;        /* file */
	const char *fsync_mode;      /* file: always | batch | never */
	/* The least severe level a driver writes to stderr: debug, info,
	 * warn or error; NULL or "" is info. histd passes its --log-level. */
	const char *log_level;
	const char *dsn;             /* postgres */
	int pool_size;               /* postgres */
	/* postgres: milliseconds a statement may run (PostgreSQL's
	 * statement_timeout on every pooled connection); histd waits for an
	 * answer PG_TIMEOUT_GRACE_MS longer, then drops the connection and
	 * the call answers EUNAVAILABLE. 0: no limit. */
	int timeout_ms;
	/*
	 * Limits every driver of version >= 3 enforces atomically, 0 for
	 * none. A write that would pass one changes nothing and answers
	 * HISTD_ELIMIT naming the limit:
	 *  - max_sessions_per_tenant: session_create, session_resolve (when
	 *    it would create) and session_fork count the tenant's sessions;
	 *    "the tenant has N sessions; the limit is M";
	 *  - max_session_messages / max_session_bytes: append, replace and
	 *    session_fork check the messages the session would hold
	 *    (message_count, bytes_total as in histd_session);
	 *    "the session would hold N messages; the limit is M".
	 * An idempotent replay (replayed = 1) is not a write and passes.
	 */
	uint64_t max_sessions_per_tenant;
	uint64_t max_session_messages;
	uint64_t max_session_bytes;
} histd_driver_config;

/* A driver's constructor, as listed in the registry (driver.c). */
typedef int (*histd_driver_open_fn)(const histd_driver_config *cfg,
				    histd_driver **out);

/* ---------------------------------------------------------------------- */
/* Opening, and the wrappers every caller uses                             */

/* Opens the driver registered under `name` and validates it: a known
 * version, every required callback set. EINVALID names what is wrong
 * (unknown driver, bad version, missing callback). *out is freed with
 * histd_driver_close. */
int histd_driver_open(const char *name, const histd_driver_config *cfg,
		      histd_driver **out);

/* Validates an already built driver struct (used by histd_driver_open and
 * by tests that wrap a driver). */
int histd_driver_validate(const histd_driver *d);

/* The names of the registered drivers, NULL-terminated. */
const char *const *histd_driver_names(void);

int histd_driver_session_create(histd_driver *d, const histd_session *in,
				histd_session **out);
int histd_driver_session_get(histd_driver *d, const char *tenant,
			     const char *id, histd_session **out);
int histd_driver_session_resolve(histd_driver *d, const histd_session *in,
				 histd_session **out, int *created);
int histd_driver_session_list(histd_driver *d, const histd_list *q,
			      histd_session_list *out);
int histd_driver_session_update(histd_driver *d, const char *tenant,
				const char *id, uint64_t expected_revision,
				const histd_kv *labels, size_t n_labels,
				const uint8_t *config, size_t config_len,
				int64_t now_us, histd_session **out,
				uint64_t *current_revision);
int histd_driver_session_delete(histd_driver *d, const char *tenant,
				const char *id, uint64_t expected_revision,
				uint64_t *current_revision);
/* session_delete_life; a driver without it deletes by revision alone. */
int histd_driver_session_delete_life(histd_driver *d, const char *tenant,
				     const char *id, uint64_t expected_revision,
				     uint64_t incarnation,
				     uint64_t *current_revision);
int histd_driver_session_fork(histd_driver *d, const char *tenant,
			      const char *source_id, uint64_t up_to_seq,
			      const histd_session *in, histd_session **out);
/* session_fork_life; a driver without it forks whatever life is there. */
int histd_driver_session_fork_life(histd_driver *d, const char *tenant,
				   const char *source_id,
				   uint64_t source_incarnation,
				   uint64_t up_to_seq, const histd_session *in,
				   histd_session **out);
int histd_driver_append(histd_driver *d, const histd_append *a,
			histd_append_result *res);
int histd_driver_read(histd_driver *d, const histd_read *q,
		      histd_read_result *res);
int histd_driver_tool_result(histd_driver *d, const char *tenant,
			     const char *id, const char *call_id,
			     histd_record **out);
int histd_driver_clear(histd_driver *d, const char *tenant, const char *id,
		       uint64_t expected_revision, uint64_t *revision,
		       uint64_t *cleared_to_seq, uint64_t *current_revision);
int histd_driver_replace(histd_driver *d, const histd_append *a,
			 histd_append_result *res, uint64_t *cleared_to_seq);
int histd_driver_summary_put(histd_driver *d, const char *tenant,
			     const char *id, uint64_t expected_revision,
			     const histd_record *summary, uint64_t *revision,
			     uint64_t *current_revision);
/* summary_put_life; a driver without it stores by revision alone. */
int histd_driver_summary_put_life(histd_driver *d, const char *tenant,
				  const char *id, uint64_t expected_revision,
				  uint64_t incarnation,
				  const histd_record *summary,
				  uint64_t *revision,
				  uint64_t *current_revision);
int histd_driver_summary_get(histd_driver *d, const char *tenant,
			     const char *id, histd_record **out);
void histd_driver_set_notify(histd_driver *d, histd_change_fn fn, void *ctx);
int histd_driver_ping(histd_driver *d);
/* q is checked (tenant, mode, k in 1..HISTD_SEARCH_K_MAX, text or vector,
 * sorted labels, non-empty session ids); *out is the caller's on success. */
int histd_driver_search(histd_driver *d, const histd_search_query *q,
			histd_search_result *out);
int histd_driver_embedding_put(histd_driver *d, const char *tenant,
			       const char *id, uint64_t seq, const char *model,
			       const float *v, uint32_t dim);
/* embedding_put_life. A driver without it is asked for the session
 * (session_get) and stores with embedding_put if that is the life
 * `incarnation`, else ENOTFOUND: a session made again between the two
 * calls can still take the vector. */
int histd_driver_embedding_put_life(histd_driver *d, const char *tenant,
				    const char *id, uint64_t incarnation,
				    uint64_t seq, const char *model,
				    const float *v, uint32_t dim);
/* Whether the driver can search (version 2 with search set). */
int histd_driver_can_search(const histd_driver *d);
/* Whether it can also store embeddings (embedding_put set). */
int histd_driver_can_embed(const histd_driver *d);
/* Whether the driver can delete old messages (version 3 with truncate). */
int histd_driver_can_truncate(const histd_driver *d);

/* Called by every wrapper after its driver callback, with the callback's
 * name ("append", "read", ...), how long it took and what it returned: the
 * hook for metrics. An append answered later (HISTD_PENDING, or
 * HISTD_DEFERRED) is reported when its answer comes, with that answer,
 * from the driver's thread. Set once at start (NULL: none);
 * process-wide. */
typedef void (*histd_driver_observer)(const char *op, int64_t duration_us,
				      int rc);
void histd_driver_set_observer(histd_driver_observer fn);
int histd_driver_truncate(histd_driver *d, const char *tenant,
			  const char *id, uint64_t up_to_seq,
			  uint64_t expected_revision, uint64_t *revision,
			  uint64_t *current_revision);
/* truncate_life; a driver without it truncates by revision alone. */
int histd_driver_truncate_life(histd_driver *d, const char *tenant,
			       const char *id, uint64_t up_to_seq,
			       uint64_t expected_revision,
			       uint64_t incarnation, uint64_t *revision,
			       uint64_t *current_revision);
/* EUNIMPL for a driver older than version 4; *out is the caller's on
 * success. */
int histd_driver_tenant_list(histd_driver *d, const char *after,
			     uint32_t limit, histd_tenant_list *out);
/* Whether the driver lists its tenants (version 4). */
int histd_driver_can_list_tenants(const histd_driver *d);
void histd_driver_close(histd_driver *d);

/* ---------------------------------------------------------------------- */
/* Helpers for values (drivers and callers both use them)                  */

void histd_session_free(histd_session *s);
/* Deep copy; NULL if out of memory. */
histd_session *histd_session_dup(const histd_session *s);
/* A fresh histd_session.incarnation for a driver that numbers its
 * sessions' lives in memory: never 0, never the same twice in the
 * process. */
uint64_t histd_incarnation_next(void);
void histd_session_list_free(histd_session_list *l);
/* Frees every name and the array; the struct is left empty. */
void histd_tenant_list_free(histd_tenant_list *l);
/* For a driver that walks its tenants in no order: offers a copy of
 * `name` to l, which keeps, sorted, the `limit` smallest names above
 * `after` (NULL or "": every name) offered to it, and sets has_more once
 * it leaves one out. Offer each tenant once. 0 or ENOMEM (l unchanged). */
int histd_tenant_list_offer(histd_tenant_list *l, const char *after,
			    uint32_t limit, const char *name);

/* Appends a copy of data to the list; 0 or ENOMEM. */
int histd_records_add(histd_records *l, uint64_t seq, uint32_t token_estimate,
		      const uint8_t *data, size_t len);
/* Makes the next n histd_records_add calls on the empty list l, of `bytes`
 * bytes in all, copy into one buffer, each record behind the key and
 * length of protobuf field `field`, with `slack` bytes spare at the end;
 * 0 or ENOMEM. */
int histd_records_frame(histd_records *l, uint32_t field, size_t n,
			size_t bytes, size_t slack);
/* Makes room in the empty list l for copies of the n records src, the
 * answer to read q: framed if q asks (histd_records_frame), else plain;
 * 0 or ENOMEM. */
int histd_records_reserve(histd_records *l, const histd_read *q,
			  const histd_record *src, size_t n);
/* For a driver that honours q->max_bytes: narrows the range [*from, *to)
 * of the records v (those read q returns, in seq order) to what the
 * budget keeps: *to lowered for a forward read, *from raised for a last_n
 * read. Returns 1 if it left any out (for has_more), else 0. Reads only
 * the lengths of the records it keeps, and one more. */
int histd_read_budget(const histd_read *q, const histd_record *v,
		      size_t *from, size_t *to);
/* 1 if read q may leave out the session and summary of a session now at
 * `revision`, created at created_us (q->known_revision): the caller holds
 * them. */
int histd_read_known(const histd_read *q, uint64_t revision,
		     int64_t created_us);
/* The framed buffer, if it holds every record of l with at least `slack`
 * bytes spare after them (else NULL, and l keeps it), handed to the
 * caller (free it); *len is the bytes used. Records still point into it:
 * take it last. */
uint8_t *histd_records_take_wire(histd_records *l, size_t slack,
				 size_t *len);
/* Frees the records' bytes and the array; the struct itself is not freed
 * and is left empty. */
void histd_records_clear(histd_records *l);
/* A single malloc'ed record with a copy of data; NULL if out of memory. */
histd_record *histd_record_new(uint64_t seq, uint32_t token_estimate,
			       const uint8_t *data, size_t len);
void histd_record_free(histd_record *r);

/* Frees what a read result holds (records, session) and zeroes it. */
void histd_read_result_clear(histd_read_result *r);
/* Frees what a search result holds and zeroes it. */
void histd_search_result_clear(histd_search_result *r);
/* Appends a hit (session id copied, the record's bytes copied): 0 or
 * ENOMEM (then r is unchanged). */
int histd_search_result_add(histd_search_result *r, const char *session_id,
			    double score, uint64_t seq, uint32_t token_estimate,
			    const uint8_t *data, size_t len);

/* Copies n pairs (strdup of keys and values); NULL with n 0, or ENOMEM. */
int histd_kv_dup(histd_kv **out, const histd_kv *in, size_t n);
void histd_kv_free(histd_kv *kv, size_t n);
/* Whether two sorted pair lists are equal. */
int histd_kv_equal(const histd_kv *a, size_t na, const histd_kv *b, size_t nb);
/* Whether every pair of `sub` is in `set` (both sorted). */
int histd_kv_contains(const histd_kv *set, size_t nset, const histd_kv *sub,
		      size_t nsub);

#endif
