/*
 * The file driver's compaction: a snapshot of the state replaces the logs
 * before it (see file.h).
 *
 * The copy is taken under the write lock, and is cheap: session records
 * and the small tool and key tables are copied, message and summary arrays
 * are copied as arrays of pointers to the same bytes. While the snapshot
 * is written (lock released, writes going on into the new log), bytes the
 * state drops are not freed but kept in d->grave (hf_free_data), and freed
 * when the snapshot is done. Then the snapshot is mapped and every message
 * still stored as it was captured is re-pointed at its bytes there (they
 * are the same bytes): nothing refers to the older files any more, their
 * mappings go, and so does their disk space; messages that were malloc'ed
 * move to the page cache too. Crash safety is by order: the new log exists
 * and is durable before the snapshot, which is written to a .tmp name,
 * synced, renamed, and the rename synced before anything older is
 * removed. At every instant the directory holds a complete chain (see
 * load.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "histd_wire.h"
#include "internal.h"

/* Snapshot bytes buffered before each write. */
#define FLUSH_AT (4u << 20)
/* After a failed automatic compaction, the next try at the earliest. */
#define RETRY_US (60 * 1000000LL)

typedef struct cap_session {
	histd_session *rec;     /* the record fields */
	histd_record *msgs;     /* shallow: bytes shared with the state */
	size_t n_msgs;
	histd_record *sums;
	size_t n_sums;
	hf_tool **tools;        /* deep copies */
	size_t n_tools;
	hf_idem **idem;
	size_t n_idem;
	histd_vecs vecs;        /* deep copies: a clear may free the state's */
	uint64_t *offs;         /* where each message's bytes are in the snapshot */
} cap_session;

typedef struct capture {
	cap_session *v;
	size_t n;
} capture;

static int64_t
wall_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
capture_free(capture *c)
{
	for (size_t i = 0; i < c->n; i++) {
		cap_session *cs = &c->v[i];

		histd_session_free(cs->rec);
		free(cs->msgs);
		free(cs->offs);
		free(cs->sums);
		for (size_t j = 0; j < cs->n_tools; j++)
			free(cs->tools[j]);
		free(cs->tools);
		for (size_t j = 0; j < cs->n_idem; j++)
			free(cs->idem[j]);
		free(cs->idem);
		histd_vecs_clear(&cs->vecs);
	}
	free(c->v);
	*c = (capture){ 0 };
}

static void *
dup_mem(const void *p, size_t n)
{
	void *c = malloc(n ? n : 1);

	if (c && n)
		memcpy(c, p, n);
	return c;
}

/* Copies one session; ENOMEM leaves what was copied for capture_free. */
static int
capture_one(cap_session *cs, const hf_session *s, int64_t now)
{
	if (!(cs->rec = hf_session_export(s)))
		return -1;
	if (s->n_msgs) {
		if (!(cs->msgs = dup_mem(s->msgs, s->n_msgs * sizeof(*s->msgs))))
			return -1;
		cs->n_msgs = s->n_msgs;
	}
	if (s->n_sums) {
		if (!(cs->sums = dup_mem(s->sums, s->n_sums * sizeof(*s->sums))))
			return -1;
		cs->n_sums = s->n_sums;
	}
	if (s->tools.n && !(cs->tools = calloc(s->tools.n, sizeof(*cs->tools))))
		return -1;
	for (size_t i = 0; s->tools.s && i <= s->tools.mask; i++) {
		const hf_tool *t = s->tools.s[i].v;

		if (!t)
			continue;
		if (!(cs->tools[cs->n_tools] = dup_mem(t, sizeof(*t) + t->len + 1)))
			return -1;
		cs->n_tools++;
	}
	if (s->idem.n && !(cs->idem = calloc(s->idem.n, sizeof(*cs->idem))))
		return -1;
	for (size_t i = 0; s->idem.s && i <= s->idem.mask; i++) {
		const hf_idem *e = s->idem.s[i].v;

		/* Expired keys are dropped here for good. */
		if (!e || e->expires_us <= now)
			continue;
		if (!(cs->idem[cs->n_idem] = dup_mem(e, sizeof(*e) + e->len + 1)))
			return -1;
		cs->n_idem++;
	}
	if (histd_vecs_copy(&cs->vecs, &s->vecs, UINT64_MAX))
		return -1;
	return 0;
}

static int
capture_state(hf_driver *d, capture *c)
{
	size_t total = 0, k = 0;
	int64_t now = wall_us();

	for (size_t i = 0; d->tenants.s && i <= d->tenants.mask; i++) {
		const hf_tenant *t = d->tenants.s[i].v;

		if (t)
			total += t->n;
	}
	*c = (capture){ 0 };
	if (total && !(c->v = calloc(total, sizeof(*c->v))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (size_t i = 0; d->tenants.s && i <= d->tenants.mask; i++) {
		const hf_tenant *t = d->tenants.s[i].v;

		for (size_t j = 0; t && j < t->n; j++) {
			c->n = ++k;
			if (capture_one(&c->v[k - 1], t->sorted[j], now)) {
				capture_free(c);
				return histd_error_set(HISTD_ENOMEM, "out of memory");
			}
		}
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Writing the snapshot                                                    */

typedef struct snap_writer {
	int fd;
	hf_buf b;
	uint64_t frames, bytes;
	int err;                /* errno of the first failure */
} snap_writer;

static void
sw_flush(snap_writer *w, int force)
{
	int rc;

	if (w->err || (!force && w->b.len < FLUSH_AT))
		return;
	if (w->b.oom) {
		w->err = ENOMEM;
		return;
	}
	if ((rc = hf_write_all(w->fd, w->b.p, w->b.len))) {
		w->err = -rc;
		return;
	}
	w->bytes += w->b.len;
	w->b.len = 0;
}

static void
sw_end(snap_writer *w, size_t mark)
{
	hf_frame_end(&w->b, mark);
	w->frames++;
	sw_flush(w, 0);
}

static void
write_session(snap_writer *w, cap_session *cs)
{
	const histd_session *r = cs->rec;
	size_t m = hf_frame_begin(&w->b, HF_T_S_SESSION);

	hf_put_str(&w->b, r->tenant);
	hf_put_str(&w->b, r->id);
	hf_put_kv(&w->b, r->context_keys, r->n_context_keys);
	hf_put_kv(&w->b, r->labels, r->n_labels);
	hf_put_bytes(&w->b, r->config, r->config_len);
	hf_put_varint(&w->b, (uint64_t)r->created_at_us);
	hf_put_varint(&w->b, (uint64_t)r->updated_at_us);
	hf_put_varint(&w->b, (uint64_t)r->active_at_us);       /* format 2 */
	hf_put_varint(&w->b, r->revision);
	hf_put_varint(&w->b, r->last_seq);
	hf_put_varint(&w->b, r->cleared_to_seq);
	hf_put_varint(&w->b, cs->n_msgs);
	sw_end(w, m);
	/* Without room for the offsets, the session is just not re-pointed. */
	cs->offs = cs->n_msgs ? malloc(cs->n_msgs * sizeof(*cs->offs)) : NULL;
	for (size_t i = 0; i < cs->n_msgs + cs->n_sums && !w->err; i++) {
		int sum = i >= cs->n_msgs;
		const histd_record *x = sum ? &cs->sums[i - cs->n_msgs] : &cs->msgs[i];

		m = hf_frame_begin(&w->b, sum ? HF_T_S_SUMMARY : HF_T_S_MSG);
		hf_put_varint(&w->b, x->seq);
		hf_put_varint(&w->b, x->token_estimate);
		hf_put_varint(&w->b, x->len);
		if (!sum && cs->offs)
			cs->offs[i] = w->bytes + w->b.len;
		hf_put_raw(&w->b, x->data, x->len);
		sw_end(w, m);
	}
	/* After the messages: loading one needs its message (the role). */
	for (size_t i = 0; i < cs->vecs.n && !w->err; i++) {
		m = hf_frame_begin(&w->b, HF_T_S_EMBED);
		hf_put_vec(&w->b, cs->vecs.v[i]);
		sw_end(w, m);
	}
	for (size_t i = 0; i < cs->n_tools && !w->err; i++) {
		const hf_tool *t = cs->tools[i];

		m = hf_frame_begin(&w->b, HF_T_S_TOOL);
		hf_put_bytes(&w->b, t->id, t->len);
		hf_put_varint(&w->b, t->call_seq);
		hf_put_varint(&w->b, t->result_seq);
		sw_end(w, m);
	}
	for (size_t i = 0; i < cs->n_idem && !w->err; i++) {
		const hf_idem *e = cs->idem[i];

		m = hf_frame_begin(&w->b, HF_T_S_IDEM);
		hf_put_bytes(&w->b, e->key, e->len);
		hf_put_raw(&w->b, e->hash, HISTD_HASH_LEN);
		hf_put_varint(&w->b, (uint64_t)e->expires_us);
		hf_put_varint(&w->b, e->first_seq);
		hf_put_varint(&w->b, e->last_seq);
		hf_put_varint(&w->b, e->revision);
		sw_end(w, m);
	}
}

static int
stopping(hf_driver *d)
{
	int stop;

	pthread_mutex_lock(&d->maint_mu);
	stop = d->maint_stop;
	pthread_mutex_unlock(&d->maint_mu);
	return stop;
}

/* Writes snapshot-<gen>: .tmp, sync, rename, sync the directory. */
static int
write_snapshot(hf_driver *d, capture *c, uint64_t gen, uint64_t *size)
{
	char tmp[80], name[64];
	snap_writer w = { .fd = -1 };
	size_t m;
	int rc = 0;

	hf_snapshot_name(name, sizeof(name), gen);
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	w.fd = openat(d->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
		      0600);
	if (w.fd < 0)
		return histd_error_set(HISTD_EUNAVAILABLE, "cannot create %s/%s: %s",
				       d->dir, tmp, strerror(errno));
	hf_put_file_header(&w.b, HF_MAGIC_SNAPSHOT, gen, 0);
	for (size_t i = 0; i < c->n && !w.err; i++) {
		if ((i & 255) == 0 && stopping(d)) {
			rc = histd_error_set(HISTD_EUNAVAILABLE,
					     "compaction stopped: the driver is closing");
			break;
		}
		write_session(&w, &c->v[i]);
	}
	m = hf_frame_begin(&w.b, HF_T_S_END);
	hf_put_varint(&w.b, c->n);
	hf_put_varint(&w.b, w.frames);
	hf_frame_end(&w.b, m);
	sw_flush(&w, 1);
	if (!rc && !w.err && fdatasync(w.fd) != 0)
		w.err = errno;
	if (!rc && w.err)
		rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot write %s/%s: %s",
				     d->dir, tmp, strerror(w.err));
	close(w.fd);
	hf_buf_free(&w.b);
	if (!rc && renameat(d->dirfd, tmp, d->dirfd, name) != 0)
		rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot rename %s/%s: %s",
				     d->dir, tmp, strerror(errno));
	if (rc) {
		unlinkat(d->dirfd, tmp, 0);
		return rc;
	}
	*size = w.bytes;
	return hf_sync_dir(d);
}

void (*hf_compact_test_hook)(hf_driver *d);

/*
 * Under the write lock, after the snapshot is durable: points every message
 * still stored as captured at its copy in the snapshot's mapping, and lets
 * go of the old bytes (a mapping of an older file, or malloc'ed memory).
 * Messages stored since, or sessions cleared, deleted or recreated since,
 * are left alone: their records no longer hold the captured pointers.
 * Both lists are in seq order, and a truncate since may have removed
 * messages between those kept (system messages stay), so they are
 * matched by seq, not by index.
 */
static void
repoint(hf_driver *d, const capture *c, uint64_t gen)
{
	char name[64];
	struct stat st;
	hf_mapping *map;
	int fd, err;

	hf_snapshot_name(name, sizeof(name), gen);
	fd = openat(d->dirfd, name, O_RDONLY | O_CLOEXEC);
	map = fd >= 0 && fstat(fd, &st) == 0
		      ? hf_mapping_open(d, fd, (size_t)st.st_size) : NULL;
	err = errno;
	if (fd >= 0)
		close(fd);
	if (!map) {
		/* Nothing is lost: the old files stay mapped until
		 * restart, and hold their space until then. */
		hf_log_line(d, HF_LOG_WARN, "file driver: cannot map the new "
			    "snapshot; the old files keep their space until "
			    "restart", "dir", d->dir, "error", strerror(err),
			    NULL);
		return;
	}
	map->refs++;            /* pinned while filled */
	for (size_t i = 0; i < c->n; i++) {
		const cap_session *cs = &c->v[i];
		hf_session *s;
		size_t j = 0, k = 0;

		if (!cs->offs)
			continue;
		s = hf_session_find(d, cs->rec->tenant, strlen(cs->rec->tenant),
				    cs->rec->id, strlen(cs->rec->id));
		while (s && j < s->n_msgs && k < cs->n_msgs) {
			histd_record *r = &s->msgs[j];

			if (r->seq < cs->msgs[k].seq) {
				j++;
				continue;
			}
			if (r->seq > cs->msgs[k].seq) {
				k++;
				continue;
			}
			if (r->data == cs->msgs[k].data &&
			    cs->offs[k] + r->len <= map->len) {
				hf_free_data(d, r->data, r->len);
				r->data = map->base + cs->offs[k];
				map->refs++;
			}
			j++;
			k++;
		}
	}
	map->refs--;
	hf_mapping_sweep(d);
}

int
hf_compact_due(hf_driver *d, uint64_t log_bytes)
{
	uint64_t file = d->base_bytes + log_bytes;
	uint64_t garbage = file > d->live_bytes ? file - d->live_bytes : 0;

	return !d->compacting && file >= d->opt.compact_min_bytes &&
	       (double)garbage > d->opt.compact_garbage_ratio * (double)file;
}

int
hf_compact_wanted(hf_driver *d)
{
	int due;

	pthread_rwlock_rdlock(&d->lock);
	due = hf_compact_due(d, hf_wal_bytes(d->wal));
	pthread_rwlock_unlock(&d->lock);
	return due;
}

int
hf_compact(hf_driver *d, int force)
{
	capture c = { 0 };
	uint64_t gen, old_log, size = 0;
	char g[32], b[32];
	int rc;

	pthread_mutex_lock(&d->compact_mu);
	pthread_rwlock_wrlock(&d->lock);
	if (hf_wal_failed(d->wal)) {
		rc = HISTD_EUNAVAILABLE;
		goto unlock;
	}
	if (!force && !hf_compact_due(d, hf_wal_bytes(d->wal))) {
		rc = 0;
		goto unlock;
	}
	if ((rc = capture_state(d, &c)))
		goto unlock;
	gen = d->gen + 1;
	old_log = hf_wal_bytes(d->wal);
	if ((rc = hf_wal_rotate(d->wal, gen)))
		goto unlock;
	d->gen = gen;
	d->base_bytes += old_log;
	d->compacting = 1;
	pthread_rwlock_unlock(&d->lock);

	rc = hf_wal_rotated(d->wal, gen);
	if (rc == 0)
		rc = write_snapshot(d, &c, gen, &size);
	/* The snapshot is durable: the older files are garbage now, and a
	 * failure to remove them only leaves them for the next start. */
	if (rc == 0 && hf_remove_before(d, gen))
		hf_log_line(d, HF_LOG_WARN, "file driver: cannot remove obsolete files",
			    "dir", d->dir, "error", histd_error_message(), NULL);
	if (rc == 0 && hf_compact_test_hook)
		hf_compact_test_hook(d);

	pthread_rwlock_wrlock(&d->lock);
	d->compacting = 0;
	for (size_t i = 0; i < d->n_grave; i++)
		hf_free_data(d, d->grave[i].p, d->grave[i].len);
	d->n_grave = 0;
	if (rc == 0) {
		repoint(d, &c, gen);
		d->base_bytes = size;
		d->compactions++;
	}
unlock:
	pthread_rwlock_unlock(&d->lock);
	capture_free(&c);
	if (rc == 0 && d->compactions && size) {
		snprintf(g, sizeof(g), "%llu", (unsigned long long)d->gen);
		snprintf(b, sizeof(b), "%llu", (unsigned long long)size);
		hf_log_line(d, HF_LOG_INFO, "file driver: compacted", "dir", d->dir,
			    "generation", g, "snapshot_bytes", b, NULL);
	}
	pthread_mutex_unlock(&d->compact_mu);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* The compaction thread                                                   */

/* A compaction failed (its reason in histd_error_message): said, and
 * tried again after RETRY_US. */
static void
failed_locked(hf_driver *d)
{
	hf_log_line(d, HF_LOG_WARN, "file driver: compaction failed; retrying later",
		    "dir", d->dir, "error", histd_error_message(), NULL);
	d->maint_next_us = histd_mono_us() + RETRY_US;
}

static void *
maint_main(void *arg)
{
	hf_driver *d = arg;

	pthread_mutex_lock(&d->maint_mu);
	for (;;) {
		int rc;

		while (!d->maint_want && !d->maint_stop)
			pthread_cond_wait(&d->maint_cv, &d->maint_mu);
		if (d->maint_stop)
			break;
		d->maint_want = 0;
		pthread_mutex_unlock(&d->maint_mu);
		rc = hf_compact(d, 0);
		pthread_mutex_lock(&d->maint_mu);
		if (rc && !d->maint_stop)
			failed_locked(d);
	}
	pthread_mutex_unlock(&d->maint_mu);
	return NULL;
}

void
hf_maint_failed(hf_driver *d)
{
	pthread_mutex_lock(&d->maint_mu);
	failed_locked(d);
	pthread_mutex_unlock(&d->maint_mu);
}

int
hf_maint_start(hf_driver *d)
{
	int rc = pthread_create(&d->maint, NULL, maint_main, d);

	if (rc != 0)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot start the compaction thread: %s",
				       strerror(rc));
	d->maint_started = 1;
	return 0;
}

void
hf_maint_stop(hf_driver *d)
{
	if (!d->maint_started)
		return;
	pthread_mutex_lock(&d->maint_mu);
	d->maint_stop = 1;
	pthread_cond_signal(&d->maint_cv);
	pthread_mutex_unlock(&d->maint_mu);
	pthread_join(d->maint, NULL);
	d->maint_started = 0;
}

void
hf_maint_poke(hf_driver *d)
{
	pthread_mutex_lock(&d->maint_mu);
	if (!d->maint_want && histd_mono_us() >= d->maint_next_us) {
		d->maint_want = 1;
		pthread_cond_signal(&d->maint_cv);
	}
	pthread_mutex_unlock(&d->maint_mu);
}
