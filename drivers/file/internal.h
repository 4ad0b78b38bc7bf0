/*
 * What the files of the file driver share (see file.h for the design).
 *
 * format.c  frames, the record codec, the hash table
 * state.c   the in-memory state and the changes applied to it, shared by
 *           live calls (file.c) and recovery (load.c)
 * file.c    the driver's callbacks
 * wal.c     the log writer thread: group commit, rotation
 * files.c   names, whole writes, directory syncs, log lines
 * load.c    start-up: the data directory, snapshots, log replay
 * compact.c snapshots and compaction
 */
#ifndef HISTD_FILE_INTERNAL_H
#define HISTD_FILE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "index/index.h"
#include "file.h"

/* ---------------------------------------------------------------------- */
/* Format                                                                  */

/* 2: every log record that changes a session but update and delete
 * (those date themselves or need no date) carries the server time of the
 * change after the revision, and a snapshot's session its active_at_us
 * after updated_at. Files of version 1 still load (hf_load), their
 * sessions' activity unknown (0) where version 1 did not record it; new
 * files are written as version 2, and a version 1 log is never continued. */
#define HF_FORMAT_VERSION 2
#define HF_FRAME_HEADER 8
/* Largest body of one frame: appends above it are refused (ELIMIT). */
#define HF_FRAME_MAX 0x7ffffff0u
#define HF_MAGIC_LOG "histdlog"
#define HF_MAGIC_SNAPSHOT "histdsnp"
#define HF_MAGIC_LEN 8

enum hf_type {
	/* magic[8], version, generation; in a log that follows another,
	 * then the byte length that log ended at (in any version: readers
	 * before it ignore what follows the generation). */
	HF_T_FILE = 1,
	/* Log records. */
	HF_T_CREATE = 2,
	HF_T_UPDATE = 3,
	HF_T_DELETE = 4,
	HF_T_FORK = 5,
	HF_T_APPEND = 6,
	HF_T_CLEAR = 7,
	HF_T_REPLACE = 8,
	HF_T_SUMMARY = 9,
	/* A message's embedding (derived data: no revision). */
	HF_T_EMBED = 10,
	/* Messages up to a seq deleted (version 3 truncate). */
	HF_T_TRUNCATE = 11,
	/* Snapshot records: a session, then what it holds. */
	HF_T_S_SESSION = 16,
	HF_T_S_MSG = 17,
	HF_T_S_SUMMARY = 18,
	HF_T_S_TOOL = 19,
	HF_T_S_IDEM = 20,
	HF_T_S_END = 21,
	HF_T_S_EMBED = 22,      /* after the session's messages */
};

/* A growable byte buffer; a failed allocation sets oom and later puts do
 * nothing, so an encoder checks once at the end. */
typedef struct hf_buf {
	uint8_t *p;
	size_t len, cap;
	int oom;
} hf_buf;

int hf_buf_reserve(hf_buf *b, size_t more);
void hf_buf_free(hf_buf *b);
void hf_put_u8(hf_buf *b, uint8_t v);
void hf_put_varint(hf_buf *b, uint64_t v);
void hf_put_raw(hf_buf *b, const void *p, size_t n);
/* varint length, then the bytes. */
void hf_put_bytes(hf_buf *b, const void *p, size_t n);
void hf_put_str(hf_buf *b, const char *s);
void hf_put_kv(hf_buf *b, const histd_kv *kv, size_t n);
/* Starts a frame of this type; returns its offset for hf_frame_end. */
size_t hf_frame_begin(hf_buf *b, uint8_t type);
/* Fills in the length and checksum; EINVALID-free: the caller checks
 * b->oom and the size (HF_FRAME_MAX) itself. */
void hf_frame_end(hf_buf *b, size_t start);

/* A reader over one frame's body; a read past the end sets bad. */
typedef struct hf_rd {
	const uint8_t *p, *end;
	int bad;
} hf_rd;

uint8_t hf_get_u8(hf_rd *r);
uint64_t hf_get_varint(hf_rd *r);
/* Borrowed bytes; NULL (and bad) if short. */
const uint8_t *hf_get_bytes(hf_rd *r, size_t *len);
void hf_get_raw(hf_rd *r, void *out, size_t n);
/* A malloc'ed NUL-terminated copy of a string field; NULL if bad or out
 * of memory (*oom set then). Strings may not hold NUL bytes. */
char *hf_get_strdup(hf_rd *r, int *oom);
/* Decodes a pair list into malloc'ed pairs (histd_kv_free). */
int hf_get_kv(hf_rd *r, histd_kv **out, size_t *n);

enum hf_frame_status { HF_FRAME_OK, HF_FRAME_SHORT, HF_FRAME_BAD };

/* Examines the frame at p with avail bytes left in the file: OK with
 * *body_len set, SHORT if the file ends inside it, BAD if its length is
 * impossible or its checksum fails. */
enum hf_frame_status hf_frame_check(const uint8_t *p, size_t avail,
				    uint32_t *body_len);

/* Whether valid records start anywhere in [p, p + avail): a valid frame
 * followed by valid frames up to the end (or to zeros, or to a frame cut
 * short there). A frame inside a torn record's bytes (a message may hold
 * anything) is followed by the rest of that record's bytes instead. */
int hf_frame_find(const uint8_t *p, size_t avail);

/* Whether the bad frame at p is the last record torn inside the zeros
 * the writer prepared: its length fits in the avail bytes left, and only
 * zeros follow its extent (whatever its own bytes hold). */
int hf_frame_torn_in_zeros(const uint8_t *p, size_t avail);

/* Whether the n bytes at p are all zero. */
int hf_all_zero(const uint8_t *p, size_t n);

/* ---------------------------------------------------------------------- */
/* Hash table: open addressing, linear probing, backward-shift deletion.   */
/* Keys are bytes borrowed from the value they map to.                     */

typedef struct hf_slot {
	uint64_t h;
	const void *k;
	size_t klen;
	void *v;                /* NULL: empty */
} hf_slot;

typedef struct hf_map {
	hf_slot *s;
	size_t mask, n;
} hf_map;

void *hf_map_get(const hf_map *m, const void *k, size_t klen);
/* Room for n entries in all, so that hf_map_put cannot fail. */
int hf_map_reserve(hf_map *m, size_t n);
/* Inserts a key that is not in the map; room must be reserved. */
void hf_map_put(hf_map *m, const void *k, size_t klen, void *v);
/* Removes the key; returns its value or NULL. */
void *hf_map_del(hf_map *m, const void *k, size_t klen);
void hf_map_free(hf_map *m);

/* ---------------------------------------------------------------------- */
/* State                                                                   */

typedef struct hf_tool {
	uint64_t call_seq;
	uint64_t result_seq;    /* 0 while the call is open */
	uint32_t len;
	char id[];
} hf_tool;

typedef struct hf_idem {
	int64_t expires_us;
	uint64_t first_seq, last_seq, revision;
	uint64_t lsn;           /* the record that made it */
	uint8_t hash[HISTD_HASH_LEN];
	uint32_t len;
	char key[];
} hf_idem;

typedef struct hf_tenant hf_tenant;

typedef struct hf_session {
	hf_tenant *tenant;
	char *id;
	size_t id_len;
	histd_kv *ckeys;
	size_t n_ckeys;
	uint8_t *canon;         /* context keys, canonical; NULL if none */
	size_t canon_len;
	histd_kv *labels;
	size_t n_labels;
	uint8_t *config;
	size_t config_len;
	int64_t created_at_us, updated_at_us;
	int64_t active_at_us;   /* histd_session's; 0: unknown */
	uint64_t revision, last_seq, cleared_to_seq;
	uint64_t token_total, bytes_total;
	histd_record *msgs;     /* seq order */
	size_t n_msgs, cap_msgs;
	histd_record *sums;     /* put order */
	size_t n_sums, cap_sums, best_sum, sum_bytes;
	hf_map tools;           /* call id -> hf_tool */
	hf_map idem;            /* key -> hf_idem */
	size_t idem_swept;      /* keys left by the last sweep */
	/* For the live estimate: bytes of tool ids, of idempotency keys, and
	 * of the record fields (0: to compute). */
	uint64_t tool_bytes, idem_bytes, meta_bytes;
	uint64_t lsn;           /* the last record that changed it */
	uint64_t incarnation;   /* histd_session's, numbered when made */
	uint64_t live;          /* its estimated size in a snapshot */
	histd_vecs vecs;        /* embeddings, seq order (search.c) */
	uint64_t vec_bytes;     /* their frames in a snapshot, at most */
} hf_session;

struct hf_tenant {
	char *name;
	size_t len;
	hf_map ids;             /* id -> session */
	hf_map ctx;             /* canonical context keys -> session */
	hf_session **sorted;    /* by id, byte order */
	size_t n, cap;
	/* Its search index: made by the first search, then kept in step by
	 * every write (search.c); NULL until then. Under the driver's lock
	 * (writes hold it exclusively). */
	histd_index *index;
};

typedef struct hf_wal hf_wal;
typedef struct hf_driver hf_driver;

/*
 * A read-only mapping of a verified log or snapshot file. Messages loaded
 * at start-up (and, after a compaction, every message the snapshot holds)
 * are not copied: their records point at their bytes here, in the page
 * cache. refs counts them; a mapping is unmapped when none is left, which
 * is also when the space of a file that compaction removed comes back.
 */
typedef struct hf_mapping {
	struct hf_mapping *next;
	uint8_t *base;
	size_t len;
	uint64_t refs;
} hf_mapping;

/* Maps fd (len bytes) read-only and lists it; NULL if it cannot. */
hf_mapping *hf_mapping_open(hf_driver *d, int fd, size_t len);
/* Unmaps the mappings nothing points into any more. */
void hf_mapping_sweep(hf_driver *d);
void hf_mapping_close_all(hf_driver *d);

/* Levels of hf_log_line, least severe first, as histd's --log-level. */
enum hf_log_level { HF_LOG_DEBUG, HF_LOG_INFO, HF_LOG_WARN, HF_LOG_ERROR };

enum hf_fsync { HF_FSYNC_ALWAYS, HF_FSYNC_BATCH, HF_FSYNC_NEVER };

struct hf_driver {
	histd_driver base;      /* first: the driver casts down */
	char *dir;
	int dirfd;
	int lockfd;
	enum hf_fsync mode;
	enum hf_log_level log_level;    /* hf_log_line writes from this up */
	histd_file_options opt;

	/* Guards everything below it but the counters marked otherwise. */
	pthread_rwlock_t lock;
	hf_map tenants;         /* name -> hf_tenant */
	hf_wal *wal;
	uint64_t gen;           /* generation being written */
	uint64_t live_bytes;
	uint64_t base_bytes;    /* snapshot and logs before the current */
	hf_mapping *mappings;   /* files records point into */
	/* While a compaction copies the state, message and summary bytes
	 * are freed here, after it, not at once. */
	int compacting;
	struct hf_grave { void *p; size_t len; } *grave;
	size_t n_grave, cap_grave;
	int grave_lost;         /* a deferral failed: leak rather than crash */

	histd_change_fn notify;
	void *notify_ctx;

	/* The compaction thread. */
	pthread_t maint;
	int maint_started;
	pthread_mutex_t maint_mu;
	pthread_cond_t maint_cv;
	int maint_stop, maint_want;
	int64_t maint_next_us;  /* no automatic retry before (after a failure) */
	pthread_mutex_t compact_mu;     /* one compaction at a time */
	uint64_t compactions;   /* under lock */
	uint64_t open_us;
	/* histd_driver_config's limits (0: none); read-only after open.
	 * Checked by live writes only: replay applies what was logged. */
	uint64_t max_sessions, max_msgs, max_bytes;
};

/* state.c: everything under d->lock (write-held for changes). */

hf_tenant *hf_tenant_find(hf_driver *d, const char *name, size_t len);
hf_session *hf_session_find(hf_driver *d, const char *tenant, size_t tlen,
			    const char *id, size_t ilen);
/* Canonical bytes of sorted context keys; NULL if out of memory. */
uint8_t *hf_canon(const histd_kv *kv, size_t n, size_t *len);
/* A new session at revision 1 from in's record fields (tenant not read);
 * NULL if out of memory. Not yet in any map. */
hf_session *hf_session_new(const histd_session *in);
void hf_session_destroy(hf_driver *d, hf_session *s);
/* EEXISTS (id, context keys) or ENOMEM; else inserts s into tenant's
 * maps, creating the tenant. */
int hf_session_insert(hf_driver *d, const char *tenant, size_t tlen,
		      hf_session *s);
void hf_session_remove(hf_driver *d, hf_session *s);
/* The caller's copy of the session record; NULL if out of memory. */
histd_session *hf_session_export(const hf_session *s);
/* Recomputes s->live and the driver's total. */
void hf_session_account(hf_driver *d, hf_session *s);
/* First index of s->msgs whose seq is > seq. */
size_t hf_first_after(const histd_record *v, size_t n, uint64_t seq);
int hf_msgs_reserve(hf_session *s, size_t n);
int hf_sums_reserve(hf_session *s, size_t n);
/* Frees message or summary bytes (malloc'ed or in a mapping) now, or after
 * the running compaction. d may be NULL (then malloc'ed). */
void hf_free_data(hf_driver *d, void *p, size_t len);
void hf_drop_messages(hf_driver *d, hf_session *s);
void hf_drop_summaries(hf_driver *d, hf_session *s);
void hf_drop_tools(hf_map *tools);
void hf_drop_idem(hf_map *idem);
int hf_check_revision(const hf_session *s, uint64_t expected,
		      uint64_t *current);

/* A tool reference of a batch, from a live call or a log record. */
typedef struct hf_ref {
	const char *id;
	size_t len;
	uint32_t block;
} hf_ref;

typedef struct hf_msgrefs {
	const hf_ref *calls;
	size_t n_calls;
	const hf_ref *results;
	size_t n_results;
} hf_msgrefs;

/* A batch of messages checked and prepared so that applying it cannot
 * fail (hf_batch_prepare, then hf_batch_apply or hf_batch_free). */
typedef struct hf_stage_ref {
	const char *id;
	size_t len;
	uint64_t call_seq;
	uint64_t result_seq;
	hf_tool *old;           /* answers a call made before the batch */
	hf_tool *fresh;         /* a call of the batch, to insert */
} hf_stage_ref;

typedef struct hf_batch {
	histd_record *recs;     /* built records, owned until applied */
	size_t k;
	uint64_t first_seq;
	hf_stage_ref *refs;
	size_t n_refs, n_fresh;
	hf_map staged;          /* id -> hf_stage_ref */
	hf_map new_tools;       /* replace: the new index, reserved */
	int replace;
	int borrowed;           /* recs (the array) is the caller's */
} hf_batch;

/* Checks the batch's tool references against s's index (replace: an empty
 * one), reserves room, and takes ownership of recs (k records, seqs
 * s->last_seq + 1..). EINVALID naming the field, or ENOMEM; on failure
 * recs are still the caller's. */
int hf_batch_prepare(hf_batch *b, hf_session *s, histd_record *recs,
		     size_t k, const hf_msgrefs *refs, int replace);
/* Applies it: the messages are stored, the index updated, the revision
 * bumped, active_at_us set to at. Replace first drops what the session
 * held. In these hf_apply_* functions, `at` is the server time of the
 * change as logged (0 when replaying a version 1 record: unknown). */
void hf_batch_apply(hf_driver *d, hf_batch *b, hf_session *s, int64_t at);
void hf_batch_free(hf_driver *d, hf_batch *b);

/* Drops messages, summaries and the tool index; +1 revision. */
void hf_apply_clear(hf_driver *d, hf_session *s, int64_t at);
/* Whether a stored message is a system message (the role read from its
 * bytes; one that does not parse is not). Truncate keeps those. */
int hf_is_system(const histd_record *r);
/* Whether truncate up to up_to would delete something: a non-system
 * message stored at or below it. */
int hf_truncate_deletes(const hf_session *s, uint64_t up_to);
/* Deletes the non-system messages with seq <= up_to (up_to <= last_seq,
 * hf_truncate_deletes true), their vectors, the tool calls they issued and
 * the summaries with covers_to_seq <= up_to; system messages stay;
 * cleared_to_seq = max(it, up_to); +1 revision. victims: room for
 * s->tools.n pointers, scratch. Live calls and replay both use it, so a
 * restart gives the same state. */
void hf_apply_truncate(hf_driver *d, hf_session *s, uint64_t up_to,
		       void **victims, int64_t at);
/* Stores r (its bytes now the session's; room reserved); +1 revision. */
void hf_apply_summary(hf_session *s, const histd_record *r, int64_t at);
/* Takes labels (if has_labels) and config (if has_config); +1 revision;
 * updated_at_us and active_at_us = now_us. */
void hf_apply_update(hf_session *s, histd_kv *labels, size_t n_labels,
		     int has_labels, uint8_t *config, size_t config_len,
		     int has_config, int64_t now_us);
/* The fork of src as session_fork describes it; NULL if out of memory. */
hf_session *hf_fork_build(const hf_session *src, uint64_t up_to_seq,
			  const histd_session *in);
hf_idem *hf_idem_new(const char *key, size_t len);
/* After an append: remembers its result under old (an expired entry of the
 * same key, renewed) or fresh (room reserved in s->idem). */
void hf_apply_idem(hf_session *s, hf_idem *old, hf_idem *fresh,
		   const uint8_t *hash, int64_t expires_us, uint64_t first_seq,
		   uint64_t lsn);
/* Frees expired keys, now and then. */
void hf_idem_purge(hf_session *s, int64_t now_us);

/* ---------------------------------------------------------------------- */
/* Log writer (wal.c)                                                      */

/* A change to report once durable. Record bytes are offsets into the
 * batch buffer until delivery. */
typedef struct hf_note {
	enum histd_change_kind kind;
	char *tenant, *id;
	uint64_t revision, cleared_to_seq;
	int system_kept;        /* CLEARED by truncate */
	histd_record *recs;
	size_t n;
	histd_session *session;
	uint64_t incarnation;
} hf_note;

int hf_wal_start(hf_wal **out, hf_driver *d, int fd, uint64_t gen,
		 uint64_t size);
/* Locks the queue and returns the buffer to encode one record into;
 * NULL with EUNAVAILABLE set if the log has failed (nothing locked). */
hf_buf *hf_wal_begin(hf_wal *w);
/* A notification to send after the record (under begin); NULL if out of
 * memory. */
hf_note *hf_wal_note(hf_wal *w);
/* Drops what was encoded since mark (and a note made since), unlocks. */
void hf_wal_abort(hf_wal *w, size_t mark, int had_note);
/* Drops the note made last (under begin). */
void hf_wal_note_drop(hf_wal *w);
/* Queues the record (and its note), unlocks; returns its lsn and the bytes
 * of the current log file, queued ones included. */
uint64_t hf_wal_commit(hf_wal *w, int is_append, uint64_t *log_bytes);
/* Waits until lsn is durable (written, in never mode). 0, or EUNAVAILABLE
 * if the log failed first. writer: a caller that committed (counted for
 * the batch estimate). */
int hf_wal_wait(hf_wal *w, uint64_t lsn, int writer);
/* hf_wal_wait without blocking: 0 (or EUNAVAILABLE) at once if lsn's fate
 * is known, else HISTD_PENDING and fn(ctx, rc, msg) is called once, from
 * the writer thread, when it is. */
int hf_wal_wait_async(hf_wal *w, uint64_t lsn, int writer,
		      histd_durable_fn fn, void *ctx);
/* The lsn of the last queued record. */
uint64_t hf_wal_last(hf_wal *w);
/* Whether the log has failed (EUNAVAILABLE set then). */
int hf_wal_failed(hf_wal *w);
/* Under the driver's write lock: the next records go to log-<gen>. */
int hf_wal_rotate(hf_wal *w, uint64_t gen);
/* Waits until the rotation to gen is done and durable. */
int hf_wal_rotated(hf_wal *w, uint64_t gen);
/* Bytes queued for or written to the current log file. */
uint64_t hf_wal_bytes(hf_wal *w);
void hf_wal_stats(hf_wal *w, histd_file_stats *st);
/* Flushes, syncs, stops the thread, closes the log (stats stay). */
void hf_wal_stop(hf_wal *w);
void hf_wal_free(hf_wal *w);

/* ---------------------------------------------------------------------- */
/* Files (load.c, compact.c)                                               */

/* "log-%016llx.hsd" / "snapshot-%016llx.hsd" into buf. */
void hf_log_name(char *buf, size_t size, uint64_t gen);
void hf_snapshot_name(char *buf, size_t size, uint64_t gen);
/* Appends the first frame of a file: its kind (magic), format version and
 * generation, and prev_len unless 0: the length log-<gen - 1> ended at,
 * trimmed and synced, for recovery to find it cut short. */
void hf_put_file_header(hf_buf *b, const char *magic, uint64_t gen,
			uint64_t prev_len);
/* Creates log-<gen> with its header (prev_len as above), synced, and syncs
 * the directory; returns the fd or a negative HISTD_E* code. */
int hf_log_create(hf_driver *d, uint64_t gen, uint64_t prev_len);
/* Writes all of p (at off) or returns -errno. */
int hf_write_all(int fd, const void *p, size_t n);
int hf_pwrite_all(int fd, const void *p, size_t n, uint64_t off);
int hf_sync_dir(hf_driver *d);
/* Parses a level name (NULL or "" is info); -1 if it is none. */
int hf_log_level_parse(const char *s);
/* One JSON line on stderr, in histd's log format, unless level is below
 * the driver's (cfg->log_level). kv: NULL-terminated key, value pairs. */
void hf_log_line(const hf_driver *d, enum hf_log_level level,
		 const char *msg, ...) __attribute__((sentinel));

/* ---------------------------------------------------------------------- */
/* Search (search.c)                                                       */

/* After a write to s, under the write lock: its tenant's index (if made)
 * follows. sync: messages were added (append, replace, fork); clear:
 * they all went (clear, first half of replace); forget: before s is
 * destroyed by a delete. */
void hf_index_sync(hf_session *s);
void hf_index_clear(hf_session *s);
void hf_index_forget(hf_session *s);
int hf_search(histd_driver *dd, const histd_search_query *q,
	      histd_search_result *out);

/* Embeddings, live (file.c) and replayed (load.c). Bytes of one vector's
 * frame in a snapshot, at most. */
#define HF_VEC_FRAME(dim, model_len) (40 + (uint64_t)(model_len) + 4 * (uint64_t)(dim))
/* Room for one more vector in s: 0 or ENOMEM. */
int hf_vecs_reserve(hf_session *s);
/* Stores x (room reserved), replacing a vector of the same seq. */
void hf_vec_put(hf_session *s, histd_vec *x);
/* Encodes a vector's fields (seq, model, dim, floats) after the caller's
 * own (log: tenant, id). */
void hf_put_vec(hf_buf *b, const histd_vec *x);
/* Decodes them into a new vector of the message at index i of s->msgs
 * (role from the message): 0, ECORRUPT (does not decode) or ENOMEM.
 * *x NULL when no stored message has that seq. */
int hf_get_vec(hf_rd *rd, const hf_session *s, histd_vec **x);

/* Removes the logs and snapshots of generations below gen, and syncs the
 * directory. A file that cannot be removed is logged and left: it is
 * never read again. */
int hf_remove_before(hf_driver *d, uint64_t gen);

/* Recovers the state from the directory and returns the log to continue
 * (fd, generation, size). */
int hf_load(hf_driver *d, int *fd, uint64_t *gen, uint64_t *size);

/* Compaction: now (force) or only above the garbage ratio. */
int hf_compact(hf_driver *d, int force);
/* Tests only (NULL in histd): called by a compaction once its snapshot is
 * durable, without the driver's lock, before the messages are re-pointed
 * at the snapshot; what it writes races the compaction. */
extern void (*hf_compact_test_hook)(hf_driver *d);
/* Tests only (NULL in histd): called by the log's writer before each
 * fdatasync of a batch, with the batch written but not yet durable. */
extern void (*hf_wal_sync_test_hook)(void);
int hf_compact_wanted(hf_driver *d);
/* The same from the current log's size, under the driver's lock. */
int hf_compact_due(hf_driver *d, uint64_t log_bytes);
int hf_maint_start(hf_driver *d);
void hf_maint_stop(hf_driver *d);
/* After a write: wakes the compaction thread if it is time. */
void hf_maint_poke(hf_driver *d);
/* A compaction outside the thread failed: logged, retried later. */
void hf_maint_failed(hf_driver *d);

#endif
