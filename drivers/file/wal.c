/*
 * The file driver's log writer: one thread, group commit (see file.h).
 *
 * Callers encode their record into `fill` under w->mu (and the driver's
 * lock, which orders them), then wait for `done_lsn` to reach their lsn.
 * The writer swaps `fill` for an empty buffer, writes it with one write(2),
 * syncs it with one fdatasync (always, batch), reports the changes in log
 * order, and only then publishes done_lsn: a call returns after its change
 * is durable and reported.
 *
 * Batch mode gathers: the writer waits, at most batch_window_us, until
 * three quarters as many records are queued as callers were recently
 * inside the driver at once (inside_max, a high-water mark of callers
 * between commit and return). A closed loop of N callers thus shares one
 * fsync among most of N; the slowest quarter joins the next batch instead
 * of holding this one. A wait that times out lowers the mark to who is
 * inside now, so callers that went away cost one window, once.
 *
 * Waking: each waiting caller sleeps on a futex word of its own, listed
 * with its lsn; the writer wakes exactly the callers its batch covers. (A
 * condition variable would wake every waiter, each to take the queue's
 * mutex in turn: on 2 cores that convoy cost more CPU than the log.)
 */
#include <errno.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "histd_wire.h"
#include "internal.h"

void (*hf_wal_sync_test_hook)(void);

/* Zeros written ahead of the log's end (always, batch): writes inside the
 * file's size leave fdatasync nothing but data to flush, where a growing
 * file costs a journal commit per sync. A quarter of the log, from 256 KiB
 * to 8 MiB, so that small logs stay small. */
#define PREALLOC_MIN ((uint64_t)256 << 10)
#define PREALLOC_MAX ((uint64_t)8 << 20)
/* A batch buffer kept for reuse up to this size; larger ones are freed. */
#define SPARE_KEEP (8u << 20)
/* Callers a batch waits for at most. */
#define GATHER_MAX 1024

/* A caller waiting for its lsn: on its own stack, woken by its futex
 * word; or, without blocking (hf_wal_wait_async), on the heap with a
 * function to call instead, freed after the call. */
typedef struct waiter {
	struct waiter *next;
	uint64_t lsn;
	_Atomic uint32_t state;         /* 0 waiting, 1 durable, 2 failed */
	histd_durable_fn fn;
	void *ctx;
	int writer;                     /* counted in w->inside */
} waiter;

static void
futex_wait(_Atomic uint32_t *word, uint32_t val)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, NULL,
		NULL, 0);
}

static void
futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL,
		0);
}

struct hf_wal {
	hf_driver *d;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t work;            /* the writer waits for records */
	pthread_cond_t done;            /* callers wait for durability */

	/* Under mu. */
	hf_buf fill;
	hf_buf spare;
	hf_note *notes;
	size_t n_notes, cap_notes;
	size_t fill_records, fill_appends;
	uint64_t enq_lsn;
	_Atomic int failed;             /* read without mu by hf_wal_failed */
	char errmsg[200];
	int stop;
	int idle;                       /* the writer waits for any record */
	size_t gather_want;             /* ...or for this many (0: no) */
	_Atomic size_t inside;          /* callers between commit and return */
	size_t inside_max;
	waiter *waiters;
	int rot_pending;
	size_t rot_at;
	uint64_t rot_gen, rot_done_gen;
	uint64_t gen_bytes;
	histd_file_stats st;

	_Atomic uint64_t done_lsn;

	/* Reports of asynchronous waiters (hf_wal_wait_async) are made by
	 * their own thread, so that the writer goes on to the next batch
	 * while the answers go out. */
	pthread_t reporter;
	pthread_mutex_t rmu;
	pthread_cond_t rwork;
	waiter *reports, **reports_tail; /* under rmu, in lsn order */
	int rstop;

	/* The writer's own. */
	int fd;
	uint64_t gen;
	uint64_t pos;                   /* where the next batch goes */
	uint64_t sync_us;               /* published into st under mu */
	uint64_t alloc;                 /* the file's size: zeros from pos */
};

static void
abs_deadline(struct timespec *ts, int64_t us_from_now)
{
	int64_t t = histd_mono_us() + us_from_now;

	ts->tv_sec = t / 1000000;
	ts->tv_nsec = (long)(t % 1000000) * 1000;
}

/* Reports the changes of one written batch, in log order. */
static void
deliver(hf_wal *w, const hf_buf *b, hf_note *notes, size_t n)
{
	hf_driver *d = w->d;

	for (size_t i = 0; i < n; i++) {
		hf_note *nt = &notes[i];
		histd_change c;

		for (size_t j = 0; j < nt->n; j++)
			nt->recs[j].data = b->p + (uintptr_t)nt->recs[j].data;
		c = (histd_change){
			.kind = nt->kind,
			.tenant = nt->tenant,
			.session_id = nt->id,
			.revision = nt->revision,
			.cleared_to_seq = nt->cleared_to_seq,
			.system_kept = nt->system_kept,
			.records = nt->recs,
			.n_records = nt->n,
			.session = nt->session,
			.incarnation = nt->incarnation,
		};
		if (d->notify)
			d->notify(d->notify_ctx, &c);
	}
}

static void
notes_free(hf_note *notes, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(notes[i].tenant);
		free(notes[i].id);
		free(notes[i].recs);
		histd_session_free(notes[i].session);
	}
	free(notes);
}

/* Batch mode: waits (mu held) for the callers expected to join. */
static void
gather(hf_wal *w)
{
	/* Three quarters: the last ones are the slowest round trips, and
	 * join the next batch rather than hold this one. */
	size_t want = (w->inside_max * 3 + 3) / 4;
	int64_t t0 = histd_mono_us();
	struct timespec dl;
	int timed_out = 0;

	if (want > GATHER_MAX)
		want = GATHER_MAX;
	if (want <= 1 || w->fill_records >= want)
		return;
	abs_deadline(&dl, w->d->opt.batch_window_us);
	w->gather_want = want;
	while (w->fill_records < want && !w->stop && !w->rot_pending) {
		if (pthread_cond_timedwait(&w->work, &w->mu, &dl) == ETIMEDOUT) {
			timed_out = 1;
			break;
		}
	}
	w->gather_want = 0;
	if (timed_out) {
		size_t in = atomic_load(&w->inside);

		w->inside_max = in ? in : 1;
	}
	w->st.gather_us += (uint64_t)(histd_mono_us() - t0);
}

/* The log failed: what, and why (one line). Every later write fails with
 * it. */
static int
log_failed(hf_wal *w, const char *what, const char *why)
{
	char g[32];

	snprintf(w->errmsg, sizeof(w->errmsg),
		 "storage failed (%s: %s); writes are not acknowledged until histd restarts",
		 what, why);
	snprintf(g, sizeof(g), "%llu", (unsigned long long)w->gen);
	hf_log_line(w->d, HF_LOG_ERROR, "file driver: log write failed", "dir", w->d->dir,
		    "generation", g, "error", why, NULL);
	return -1;
}

static int
log_error(hf_wal *w, const char *what, int err)
{
	return log_failed(w, what, strerror(err));
}

/* Writes n bytes at the log's end, first extending the zeros ahead of it
 * if they run out. 0 or -errno. */
static int
put(hf_wal *w, const uint8_t *p, size_t n, uint64_t *syncs)
{
	static const uint8_t zeros[64 << 10];
	int rc;

	if (w->d->mode != HF_FSYNC_NEVER && w->pos + n > w->alloc) {
		uint64_t ahead = w->pos / 4, to;

		ahead = ahead < PREALLOC_MIN ? PREALLOC_MIN
			: ahead > PREALLOC_MAX ? PREALLOC_MAX : ahead;
		to = w->pos + n + ahead;

		while (w->alloc < to) {
			size_t k = to - w->alloc < sizeof(zeros) ? (size_t)(to - w->alloc)
								 : sizeof(zeros);

			if ((rc = hf_pwrite_all(w->fd, zeros, k, w->alloc)))
				return rc;
			w->alloc += k;
		}
		if (fdatasync(w->fd) != 0)
			return -errno;
		(*syncs)++;
	}
	if ((rc = hf_pwrite_all(w->fd, p, n, w->pos)))
		return rc;
	w->pos += n;
	if (w->pos > w->alloc)
		w->alloc = w->pos;
	return 0;
}

/* Cuts the zeros ahead of the end: a closed log is exact. */
static int
trim(hf_wal *w)
{
	if (w->alloc == w->pos)
		return 0;
	if (ftruncate(w->fd, (off_t)w->pos) != 0)
		return -errno;
	w->alloc = w->pos;
	return 0;
}

/* Writes one batch: up to the rotation point in the old log, the rest in
 * the new one. Returns 0 or -1 (w->errmsg set, mu not held). */
static int
write_batch(hf_wal *w, const hf_buf *b, int rot, size_t rot_at,
	    uint64_t rot_gen, uint64_t *syncs)
{
	size_t head = rot ? rot_at : b->len;
	int rc;

	if ((rc = put(w, b->p, head, syncs)))
		return log_error(w, "write", -rc);
	if (rot) {
		int nfd;

		/* Every log but the last is complete and synced, whatever
		 * the mode: recovery relies on it, and checks its length
		 * against the one the next log's header records. */
		if ((rc = trim(w)))
			return log_error(w, "ftruncate", -rc);
		if (fdatasync(w->fd) != 0)
			return log_error(w, "fdatasync", errno);
		(*syncs)++;
		nfd = hf_log_create(w->d, rot_gen, w->pos);
		if (nfd < 0)    /* its message says why: ENOSPC, EMFILE... */
			return log_failed(w, "create log", histd_error_message());
		close(w->fd);
		w->fd = nfd;
		w->gen = rot_gen;
		w->pos = w->alloc = (uint64_t)lseek(nfd, 0, SEEK_END);
		/* b->p is NULL when the rotation found nothing queued. */
		if (b->len > head &&
		    (rc = put(w, b->p + head, b->len - head, syncs)))
			return log_error(w, "write", -rc);
	}
	if (w->d->mode != HF_FSYNC_NEVER && b->len) {
		int64_t t0 = histd_mono_us();

		if (hf_wal_sync_test_hook)
			hf_wal_sync_test_hook();
		if (fdatasync(w->fd) != 0)
			return log_error(w, "fdatasync", errno);
		w->sync_us += (uint64_t)(histd_mono_us() - t0);
		(*syncs)++;
	}
	return 0;
}

/* Unlinks (mu held) the waiters whose lsn is at most upto. */
static waiter *
take_waiters(hf_wal *w, uint64_t upto)
{
	waiter **pp = &w->waiters, *out = NULL;

	while (*pp) {
		waiter *x = *pp;

		if (x->lsn <= upto) {
			*pp = x->next;
			x->next = out;
			out = x;
		} else {
			pp = &x->next;
		}
	}
	return out;
}

static void
wake_waiters(hf_wal *w, waiter *x, uint32_t state)
{
	waiter *head = NULL, **tail = &head;

	while (x) {
		/* Read all of a waiter before the store: a blocking one may
		 * return at once and its stack be reused, so after the store
		 * nothing but its futex word is touched (a wake on a reused
		 * word is spurious at worst, and futex users recheck). */
		waiter *next = x->next;

		if (x->fn) {
			atomic_store(&x->state, state);
			if (x->writer)
				atomic_fetch_sub(&w->inside, 1);
			x->next = NULL;
			*tail = x;
			tail = &x->next;
		} else {
			atomic_store(&x->state, state);
			futex_wake(&x->state);
		}
		x = next;
	}
	if (!head)
		return;
	pthread_mutex_lock(&w->rmu);
	*w->reports_tail = head;
	w->reports_tail = tail;
	pthread_cond_signal(&w->rwork);
	pthread_mutex_unlock(&w->rmu);
}

static void *
reporter_main(void *arg)
{
	hf_wal *w = arg;
	char msg[sizeof(w->errmsg)];

	pthread_mutex_lock(&w->rmu);
	for (;;) {
		waiter *x;

		while (!w->reports && !w->rstop)
			pthread_cond_wait(&w->rwork, &w->rmu);
		if (!w->reports)
			break;
		x = w->reports;
		w->reports = NULL;
		w->reports_tail = &w->reports;
		pthread_mutex_unlock(&w->rmu);
		while (x) {
			waiter *next = x->next;
			int ok = atomic_load(&x->state) == 1;

			if (!ok) {
				pthread_mutex_lock(&w->mu);
				memcpy(msg, w->errmsg, sizeof(msg));
				pthread_mutex_unlock(&w->mu);
			}
			x->fn(x->ctx, ok ? 0 : HISTD_EUNAVAILABLE, ok ? "" : msg);
			free(x);
			x = next;
		}
		pthread_mutex_lock(&w->rmu);
	}
	pthread_mutex_unlock(&w->rmu);
	return NULL;
}

static void *
writer_main(void *arg)
{
	hf_wal *w = arg;
	waiter *wake;

	pthread_mutex_lock(&w->mu);
	for (;;) {
		hf_buf mine;
		hf_note *notes;
		size_t n_notes, records, appends, rot_at = 0;
		uint64_t end_lsn, rot_gen = 0, syncs = 0;
		int rot, rc;

		while (!w->fill.len && !w->rot_pending && !w->stop && !w->failed) {
			w->idle = 1;
			pthread_cond_wait(&w->work, &w->mu);
			w->idle = 0;
		}
		if (w->failed || (w->stop && !w->fill.len && !w->rot_pending))
			break;
		if (w->d->mode == HF_FSYNC_BATCH && !w->stop && !w->rot_pending)
			gather(w);

		mine = w->fill;
		w->fill = w->spare;
		w->spare = (hf_buf){ 0 };
		notes = w->notes;
		n_notes = w->n_notes;
		w->notes = NULL;
		w->n_notes = w->cap_notes = 0;
		records = w->fill_records;
		appends = w->fill_appends;
		w->fill_records = w->fill_appends = 0;
		end_lsn = w->enq_lsn;
		rot = w->rot_pending;
		rot_at = w->rot_at;
		rot_gen = w->rot_gen;
		w->rot_pending = 0;
		pthread_mutex_unlock(&w->mu);

		rc = write_batch(w, &mine, rot, rot_at, rot_gen, &syncs);
		if (rc == 0)
			deliver(w, &mine, notes, n_notes);
		notes_free(notes, n_notes);

		pthread_mutex_lock(&w->mu);
		if (rc) {
			w->failed = 1;
		} else {
			atomic_store(&w->done_lsn, end_lsn);
			if (rot)
				w->rot_done_gen = rot_gen;
			w->gen_bytes = w->pos;
			w->st.records += records;
			w->st.appends += appends;
			w->st.batches++;
			w->st.fsyncs += syncs;
			w->st.bytes += mine.len;
			w->st.sync_us = w->sync_us;
		}
		mine.len = 0;
		mine.oom = 0;
		if (mine.cap > SPARE_KEEP || w->spare.p)
			hf_buf_free(&mine);
		w->spare = w->spare.p ? w->spare : mine;
		wake = take_waiters(w, rc ? UINT64_MAX : end_lsn);
		if (rot || rc)
			pthread_cond_broadcast(&w->done);
		pthread_mutex_unlock(&w->mu);
		wake_waiters(w, wake, rc ? 2 : 1);
		pthread_mutex_lock(&w->mu);
	}
	/* Stopping: everything written is synced, even in never mode, so a
	 * clean shutdown loses nothing; and the log is left exact. */
	if (!w->failed) {
		int rc = trim(w);

		if (rc)
			log_error(w, "ftruncate at close", -rc);
		else if (fdatasync(w->fd) != 0)
			log_error(w, "fdatasync at close", errno);
		else
			w->st.fsyncs++;
	}
	wake = take_waiters(w, UINT64_MAX);
	pthread_cond_broadcast(&w->done);
	pthread_mutex_unlock(&w->mu);
	/* Only a failed log leaves waiters behind. */
	wake_waiters(w, wake, 2);
	return NULL;
}

int
hf_wal_start(hf_wal **out, hf_driver *d, int fd, uint64_t gen, uint64_t size)
{
	pthread_condattr_t ca;
	hf_wal *w = calloc(1, sizeof(*w));
	int rc;

	if (!w)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	w->d = d;
	w->fd = fd;
	w->gen = gen;
	w->gen_bytes = size;
	w->pos = w->alloc = size;
	w->inside_max = 1;
	atomic_init(&w->done_lsn, 0);
	pthread_mutex_init(&w->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->work, &ca);
	pthread_cond_init(&w->done, NULL);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&w->rmu, NULL);
	pthread_cond_init(&w->rwork, NULL);
	w->reports_tail = &w->reports;
	rc = pthread_create(&w->reporter, NULL, reporter_main, w);
	if (rc == 0) {
		rc = pthread_create(&w->thread, NULL, writer_main, w);
		if (rc != 0) {
			pthread_mutex_lock(&w->rmu);
			w->rstop = 1;
			pthread_cond_signal(&w->rwork);
			pthread_mutex_unlock(&w->rmu);
			pthread_join(w->reporter, NULL);
		}
	}
	if (rc != 0) {
		pthread_cond_destroy(&w->rwork);
		pthread_mutex_destroy(&w->rmu);
		pthread_cond_destroy(&w->work);
		pthread_cond_destroy(&w->done);
		pthread_mutex_destroy(&w->mu);
		free(w);
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot start the log writer: %s", strerror(rc));
	}
	*out = w;
	return 0;
}

hf_buf *
hf_wal_begin(hf_wal *w)
{
	pthread_mutex_lock(&w->mu);
	if (w->failed || w->stop) {
		histd_error_set(HISTD_EUNAVAILABLE, "%s",
				w->failed ? w->errmsg : "storage is closing");
		pthread_mutex_unlock(&w->mu);
		return NULL;
	}
	return &w->fill;
}

hf_note *
hf_wal_note(hf_wal *w)
{
	if (w->n_notes == w->cap_notes) {
		size_t cap = w->cap_notes ? w->cap_notes * 2 : 16;
		hf_note *v = realloc(w->notes, cap * sizeof(*v));

		if (!v)
			return NULL;
		w->notes = v;
		w->cap_notes = cap;
	}
	w->notes[w->n_notes] = (hf_note){ 0 };
	return &w->notes[w->n_notes++];
}

void
hf_wal_note_drop(hf_wal *w)
{
	if (w->n_notes) {
		hf_note *nt = &w->notes[--w->n_notes];

		free(nt->tenant);
		free(nt->id);
		free(nt->recs);
		histd_session_free(nt->session);
	}
}

void
hf_wal_abort(hf_wal *w, size_t mark, int had_note)
{
	w->fill.len = mark;
	w->fill.oom = 0;
	if (had_note)
		hf_wal_note_drop(w);
	pthread_mutex_unlock(&w->mu);
}

uint64_t
hf_wal_commit(hf_wal *w, int is_append, uint64_t *log_bytes)
{
	uint64_t lsn = ++w->enq_lsn;
	int wake;

	w->fill_records++;
	w->fill_appends += is_append != 0;
	{
		size_t in = atomic_fetch_add(&w->inside, 1) + 1;

		if (in > w->inside_max)
			w->inside_max = in;
	}
	*log_bytes = w->gen_bytes + w->fill.len;
	wake = w->idle || (w->gather_want && w->fill_records >= w->gather_want);
	pthread_mutex_unlock(&w->mu);
	if (wake)
		pthread_cond_signal(&w->work);
	return lsn;
}

int
hf_wal_wait(hf_wal *w, uint64_t lsn, int writer)
{
	waiter me = { .lsn = lsn };
	int rc = 0;

	if (atomic_load(&w->done_lsn) < lsn) {
		pthread_mutex_lock(&w->mu);
		if (atomic_load(&w->done_lsn) >= lsn) {
			atomic_store(&me.state, 1);
		} else if (w->failed) {
			atomic_store(&me.state, 2);
		} else {
			me.next = w->waiters;
			w->waiters = &me;
		}
		pthread_mutex_unlock(&w->mu);
		while (atomic_load(&me.state) == 0)
			futex_wait(&me.state, 0);
		if (atomic_load(&me.state) != 1) {
			pthread_mutex_lock(&w->mu);
			rc = histd_error_set(HISTD_EUNAVAILABLE, "%s", w->errmsg);
			pthread_mutex_unlock(&w->mu);
		}
	}
	if (writer)
		atomic_fetch_sub(&w->inside, 1);
	return rc;
}

int
hf_wal_wait_async(hf_wal *w, uint64_t lsn, int writer, histd_durable_fn fn,
		  void *ctx)
{
	waiter *me;
	int rc = HISTD_PENDING;

	if (atomic_load(&w->done_lsn) >= lsn)
		return hf_wal_wait(w, lsn, writer);
	/* Out of memory: block instead, which needs none. */
	if (!(me = calloc(1, sizeof(*me))))
		return hf_wal_wait(w, lsn, writer);
	me->lsn = lsn;
	me->fn = fn;
	me->ctx = ctx;
	me->writer = writer;
	pthread_mutex_lock(&w->mu);
	if (atomic_load(&w->done_lsn) >= lsn) {
		rc = 0;
	} else if (w->failed) {
		rc = histd_error_set(HISTD_EUNAVAILABLE, "%s", w->errmsg);
	} else {
		me->next = w->waiters;
		w->waiters = me;
		me = NULL;
	}
	pthread_mutex_unlock(&w->mu);
	if (me) {
		free(me);
		if (writer)
			atomic_fetch_sub(&w->inside, 1);
	}
	return rc;
}

uint64_t
hf_wal_last(hf_wal *w)
{
	uint64_t lsn;

	pthread_mutex_lock(&w->mu);
	lsn = w->enq_lsn;
	pthread_mutex_unlock(&w->mu);
	return lsn;
}

int
hf_wal_failed(hf_wal *w)
{
	if (!atomic_load(&w->failed))
		return 0;
	pthread_mutex_lock(&w->mu);
	histd_error_set(HISTD_EUNAVAILABLE, "%s", w->errmsg);
	pthread_mutex_unlock(&w->mu);
	return 1;
}

int
hf_wal_rotate(hf_wal *w, uint64_t gen)
{
	int wake;

	pthread_mutex_lock(&w->mu);
	if (w->failed || w->stop || w->rot_pending) {
		pthread_mutex_unlock(&w->mu);
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "the log cannot be rotated now");
	}
	w->rot_pending = 1;
	w->rot_at = w->fill.len;
	w->rot_gen = gen;
	wake = w->idle || w->gather_want;
	pthread_mutex_unlock(&w->mu);
	if (wake)
		pthread_cond_signal(&w->work);
	return 0;
}

int
hf_wal_rotated(hf_wal *w, uint64_t gen)
{
	int rc = 0;

	pthread_mutex_lock(&w->mu);
	while (w->rot_done_gen < gen && !w->failed)
		pthread_cond_wait(&w->done, &w->mu);
	if (w->rot_done_gen < gen)
		rc = histd_error_set(HISTD_EUNAVAILABLE, "%s", w->errmsg);
	pthread_mutex_unlock(&w->mu);
	return rc;
}

uint64_t
hf_wal_bytes(hf_wal *w)
{
	uint64_t b;

	pthread_mutex_lock(&w->mu);
	b = w->gen_bytes + w->fill.len;
	pthread_mutex_unlock(&w->mu);
	return b;
}

void
hf_wal_stats(hf_wal *w, histd_file_stats *st)
{
	pthread_mutex_lock(&w->mu);
	st->records = w->st.records;
	st->appends = w->st.appends;
	st->batches = w->st.batches;
	st->fsyncs = w->st.fsyncs;
	st->bytes = w->st.bytes;
	st->sync_us = w->st.sync_us;
	st->gather_us = w->st.gather_us;
	pthread_mutex_unlock(&w->mu);
}

void
hf_wal_stop(hf_wal *w)
{
	if (!w)
		return;
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_signal(&w->work);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	/* The writer has handed over every report: send them, then stop. */
	pthread_mutex_lock(&w->rmu);
	w->rstop = 1;
	pthread_cond_signal(&w->rwork);
	pthread_mutex_unlock(&w->rmu);
	pthread_join(w->reporter, NULL);
	close(w->fd);
	w->fd = -1;
}

void
hf_wal_free(hf_wal *w)
{
	if (!w)
		return;
	hf_buf_free(&w->fill);
	hf_buf_free(&w->spare);
	notes_free(w->notes, w->n_notes);
	pthread_cond_destroy(&w->work);
	pthread_cond_destroy(&w->done);
	pthread_mutex_destroy(&w->mu);
	pthread_cond_destroy(&w->rwork);
	pthread_mutex_destroy(&w->rmu);
	free(w);
}
