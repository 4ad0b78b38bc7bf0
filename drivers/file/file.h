/*
 * The file driver: histd's durable embedded default. No database to
 * install; every session lives in memory, as in the memory driver, and
 * every change is written to an append-only log in a data directory before
 * it is acknowledged.
 *
 * Data directory
 *   (the directory)         flock(LOCK_EX|LOCK_NB): one histd per directory
 *   LOCK                    locked the same way (earlier versions lock
 *                           only this file)
 *   log-<gen>.hsd           the log of generation <gen> (16 hex digits)
 *   snapshot-<gen>.hsd      the whole state as of the start of log-<gen>
 *   *.tmp                   a snapshot being written (removed at start)
 * The state is the newest snapshot (none: empty) plus the logs from its
 * generation on, replayed in order. Every log but the last is complete.
 *
 * Records (both kinds of file)
 *   frame = u32le len | u32le crc32(len bytes, body) | body[len]
 *   body  = u8 type | fields (protobuf-style varints; strings and bytes as a
 *           varint length and the bytes)
 * The first frame of a file names its kind, format version and generation.
 * Log records carry results, not requests: the seqs, revisions,
 * timestamps, idempotency key, hash and expiry the live call assigned, so
 * a replay is deterministic and checks that each record follows its
 * session's state (a record that does not is corruption). A snapshot ends
 * with a frame counting what it holds; one without it is incomplete.
 *
 * Order and durability
 *   One read-write lock guards the state. A write checks, prepares every
 *   allocation, appends its record to the log buffer and applies itself,
 *   all under the lock, so the log's order is the order of application.
 *   One writer thread takes the buffer, writes it and fsyncs it (group
 *   commit: everything queued meanwhile shares one fdatasync), then calls
 *   the change hook for each record in log order, then wakes the callers.
 *   A call (reads too) returns only once the state it saw is durable, so
 *   no answer ever shows what a crash could take back.
 *   fsync=always  every write is synced before it is answered; the writer
 *                 syncs as soon as anything is queued.
 *   fsync=batch   the same promise; the writer waits up to 1 ms for most
 *                 of the callers it expects (3/4 of as many as were
 *                 recently inside the driver at once) to gather more
 *                 writes per sync.
 *   fsync=never   a write is answered once write(2) took it: it survives
 *                 a crash of histd, not of the machine.
 *   A failed write or fsync stops the driver: every later call answers
 *   EUNAVAILABLE until histd restarts and recovers from the files.
 *
 * Recovery
 *   A bad frame (short, bad length or checksum) in the last log after
 *   which no valid frame exists is a torn tail: it is truncated and a
 *   warning line is written on stderr. Zeros from a frame boundary to the
 *   end of the last log are space the writer prepared: cut, with an info
 *   line; zeros ending any other file are corruption. A log that follows
 *   another records in its header the length that one was closed at; if
 *   both are replayed and the length differs (a log cut, even at a frame
 *   boundary), that is corruption. A bad frame anywhere
 *   else, a frame that does not follow its session's state, a bad
 *   snapshot or a missing generation is corruption: open fails with
 *   ECORRUPT naming the file and offset, and histd refuses to start. Nothing is silently dropped, and
 *   a refused open leaves the logs and snapshots as they were.
 *   Checksums are checked on a second thread ahead of the replay (two
 *   frames in three; the replay checks the third before applying it).
 *
 * Memory
 *   Messages loaded at open are not copied: each record points at its
 *   bytes in a read-only shared mapping of the verified file, i.e. in the
 *   page cache (counted per mapping; unmapped when no record is left in
 *   it). Messages appended since are one malloc'ed block each. Either way a
 *   message costs 24 bytes of index in its session's array. Nobody else may
 *   change the files while histd runs: the LOCK keeps other histds out,
 *   and a file truncated from outside would fault on read.
 *
 * Space
 *   Clear, Replace and Delete leave obsolete records in the logs. When the
 *   files exceed compact_min_bytes and more than compact_garbage_ratio of
 *   them is obsolete (against an upper bound of what a snapshot would
 *   hold), a background thread compacts: under the lock it copies the
 *   state's index (message bytes shared; their frees deferred meanwhile)
 *   and rotates the log to a new generation; then it writes
 *   snapshot-<new>.tmp, fsyncs it, renames it, fsyncs the directory,
 *   deletes the older files, and re-points every message still stored as
 *   captured at its bytes in the mapped snapshot, so no mapping keeps a
 *   deleted file's space. The same check runs at open; a compaction
 *   that fails there (no room for the snapshot) is retried later, as
 *   online, and the open goes on. Every new or renamed file is made
 *   durable by an fsync of the directory.
 */
#ifndef HISTD_FILE_H
#define HISTD_FILE_H

#include <stdint.h>

#include "driver.h"

/* Tuning of one file driver (histd_file_driver_open_ex). */
typedef struct histd_file_options {
	/* Compact when the files hold at least this many bytes... */
	uint64_t compact_min_bytes;      /* default 64 MiB */
	/* ...and more than this share of them is obsolete. */
	double compact_garbage_ratio;    /* default 0.5 */
	/* batch mode: the longest a write waits for others to share its
	 * fsync. */
	int64_t batch_window_us;         /* default 1000 */
} histd_file_options;

/* Fills the defaults above. */
void histd_file_options_default(histd_file_options *opt);

/*
 * Opens (creating it if needed) the data directory cfg->data_dir with
 * cfg->fsync_mode (always, batch or never; NULL or "": batch), recovers the
 * state, and starts the writer. EINVALID for a missing data_dir or an
 * unknown mode; EUNAVAILABLE if another process holds the directory ("data
 * directory ... is in use by another process") or it cannot be read or
 * written; ECORRUPT if the data fails its checks (nothing is changed then);
 * ENOMEM. *out is freed with histd_driver_close, which flushes and syncs
 * everything and writes one JSON line of statistics on stderr.
 */
int histd_file_driver_open(const histd_driver_config *cfg, histd_driver **out);

/* The same with explicit tuning (NULL: defaults). */
int histd_file_driver_open_ex(const histd_driver_config *cfg,
			      const histd_file_options *opt,
			      histd_driver **out);

/* Counters of a file driver since it was opened. */
typedef struct histd_file_stats {
	uint64_t records;        /* log records written */
	uint64_t appends;        /* of which Append records */
	uint64_t batches;        /* writes of the log buffer */
	uint64_t fsyncs;         /* fdatasync calls on logs */
	uint64_t bytes;          /* log bytes written */
	uint64_t sync_us;        /* time spent in fdatasync */
	uint64_t gather_us;      /* batch mode: time spent waiting for writers */
	uint64_t compactions;    /* snapshots written */
	uint64_t file_bytes;     /* snapshot + logs now, estimated */
	uint64_t live_bytes;     /* what a snapshot would hold, estimated */
	uint64_t open_us;        /* time histd_file_driver_open took */
} histd_file_stats;

/* Fills *out. d must be a file driver (EINVALID otherwise). */
int histd_file_driver_stats(histd_driver *d, histd_file_stats *out);

/* Compacts now, whatever the garbage ratio, and returns when the snapshot
 * is durable and the old files are gone. For tests and operators. */
int histd_file_driver_compact(histd_driver *d);

#endif
