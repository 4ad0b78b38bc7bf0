/*
 * The file driver's callbacks (design in file.h).
 *
 * Every write follows the same steps, under the driver's write lock:
 *   1. find the session and check the request (nothing changed yet);
 *   2. prepare: every allocation the change needs, so applying it cannot
 *      fail;
 *   3. encode the log record (and the change to report) into the writer's
 *      buffer; a failure here (out of memory, log failed) undoes nothing
 *      but the buffer;
 *   4. apply the change and commit the record, which gives its lsn.
 * Then, with the lock released, it waits until that lsn is durable.
 * Reads copy what they need under the read lock and then wait until the
 * session's last change (s->lsn) is durable; answers about a session that
 * is not there wait for the last queued record, which may be its delete.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "histd_wire.h"
#include "internal.h"

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
not_found(void)
{
	return histd_error_set(HISTD_ENOTFOUND, "session not found");
}

/* ELIMIT if a session would hold n messages of `bytes` record bytes. */
static int
check_size(const hf_driver *d, uint64_t n, uint64_t bytes)
{
	if (d->max_msgs && n > d->max_msgs)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %llu messages; the limit is %llu",
				       (unsigned long long)n,
				       (unsigned long long)d->max_msgs);
	if (d->max_bytes && bytes > d->max_bytes)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %llu bytes; the limit is %llu",
				       (unsigned long long)bytes,
				       (unsigned long long)d->max_bytes);
	return 0;
}

/* ELIMIT if s, just inserted, made its tenant pass the session limit. */
static int
check_sessions(const hf_driver *d, const hf_session *s)
{
	if (d->max_sessions && s->tenant->n > d->max_sessions)
		return histd_error_set(HISTD_ELIMIT,
				       "the tenant has %zu sessions; the limit is %llu",
				       s->tenant->n - 1,
				       (unsigned long long)d->max_sessions);
	return 0;
}

static hf_session *
find(hf_driver *d, const char *tenant, const char *id)
{
	return hf_session_find(d, tenant, strlen(tenant), id, strlen(id));
}

/* Releases the lock and returns rc once what the answer reflects (up to
 * lsn) is durable; EUNAVAILABLE instead if the log failed first. */
static int
settle(hf_driver *d, uint64_t lsn, int rc)
{
	int w;

	pthread_rwlock_unlock(&d->lock);
	w = hf_wal_wait(d->wal, lsn, 0);
	return w ? w : rc;
}

/* An answer that shows no session: it may rest on a delete still queued. */
static int
settle_missing(hf_driver *d, int rc)
{
	return settle(d, hf_wal_last(d->wal), rc);
}

/* The lock is taken, the log has not failed: 0, else EUNAVAILABLE with the
 * lock released. */
static int
lock_write(hf_driver *d)
{
	pthread_rwlock_wrlock(&d->lock);
	if (hf_wal_failed(d->wal)) {
		pthread_rwlock_unlock(&d->lock);
		return HISTD_EUNAVAILABLE;
	}
	return 0;
}

static int
lock_read(hf_driver *d)
{
	if (hf_wal_failed(d->wal))
		return HISTD_EUNAVAILABLE;
	pthread_rwlock_rdlock(&d->lock);
	return 0;
}

/* Commits the record encoded since begin, releases the lock and waits for
 * it (or, for an append that asks, arranges to report it: HISTD_PENDING);
 * stamps the session (and an idempotency key) with its lsn. */
static int
commit(hf_driver *d, hf_session *s, hf_idem *e, int is_append,
       const histd_append *a)
{
	uint64_t log_bytes;
	uint64_t lsn = hf_wal_commit(d->wal, is_append, &log_bytes);
	int poke;

	if (s)
		s->lsn = lsn;
	if (e)
		e->lsn = lsn;
	poke = hf_compact_due(d, log_bytes);
	pthread_rwlock_unlock(&d->lock);
	if (poke)
		hf_maint_poke(d);
	if (a && a->on_durable)
		return hf_wal_wait_async(d->wal, lsn, 1, a->on_durable,
					 a->durable_ctx);
	return hf_wal_wait(d->wal, lsn, 1);
}

/* Ends an encoding: 0, or undoes it (ELIMIT for an oversized record,
 * ENOMEM) with the queue unlocked. want_note: the change is reported, so
 * a listener needs nt. */
static int
encoded(hf_driver *d, hf_buf *b, size_t mark, int want_note, hf_note *nt)
{
	if (!b->oom && b->len - mark - HF_FRAME_HEADER <= HF_FRAME_MAX &&
	    (!want_note || !d->notify || nt))
		return 0;
	hf_wal_abort(d->wal, mark, nt != NULL);
	if (!b->oom && b->len - mark - HF_FRAME_HEADER > HF_FRAME_MAX)
		return histd_error_set(HISTD_ELIMIT,
				       "the request is too large for one log record");
	return enomem();
}

/* A change to report, if anyone listens (under begin), with its records:
 * seq, token estimate, length and the offset of the bytes in the log
 * buffer, made a pointer when delivered. NULL if nobody listens or out of
 * memory; nothing is left queued then. */
static hf_note *
note_new(hf_driver *d, enum histd_change_kind kind, const hf_session *s,
	 uint64_t revision, const histd_record *recs, size_t k,
	 const size_t *offs)
{
	hf_note *nt;

	if (!d->notify || !(nt = hf_wal_note(d->wal)))
		return NULL;
	nt->kind = kind;
	nt->revision = revision;
	nt->cleared_to_seq = s->cleared_to_seq;
	nt->incarnation = s->incarnation;
	nt->tenant = strdup(s->tenant->name);
	nt->id = strdup(s->id);
	if (k && (nt->recs = malloc(k * sizeof(*nt->recs)))) {
		for (size_t i = 0; i < k; i++) {
			nt->recs[i] = recs[i];
			nt->recs[i].data = (uint8_t *)(uintptr_t)offs[i];
		}
		nt->n = k;
	}
	if (!nt->tenant || !nt->id || (k && !nt->recs)) {
		hf_wal_note_drop(d->wal);
		return NULL;
	}
	return nt;
}

/* ---------------------------------------------------------------------- */
/* Sessions                                                                */

static void
put_session_in(hf_buf *b, const hf_session *s)
{
	hf_put_bytes(b, s->id, s->id_len);
	hf_put_kv(b, s->ckeys, s->n_ckeys);
	hf_put_kv(b, s->labels, s->n_labels);
	hf_put_bytes(b, s->config, s->config_len);
	hf_put_varint(b, (uint64_t)s->created_at_us);
}

/* Inserts s (built from in) and logs its creation. On failure s is
 * destroyed and the lock released. */
static int
create_locked(hf_driver *d, const char *tenant, hf_session *s,
	      histd_session **out)
{
	histd_session *rec = NULL;
	size_t mark;
	hf_buf *b;
	int rc;

	if ((rc = hf_session_insert(d, tenant, strlen(tenant), s))) {
		hf_session_destroy(d, s);
		return settle_missing(d, rc);
	}
	if ((rc = check_sessions(d, s)))
		goto undo;
	if (!(rec = hf_session_export(s))) {
		rc = enomem();
		goto undo;
	}
	if (!(b = hf_wal_begin(d->wal))) {
		rc = HISTD_EUNAVAILABLE;
		goto undo;
	}
	mark = hf_frame_begin(b, HF_T_CREATE);
	hf_put_str(b, tenant);
	put_session_in(b, s);
	hf_frame_end(b, mark);
	if ((rc = encoded(d, b, mark, 0, NULL)))
		goto undo;
	if ((rc = commit(d, s, NULL, 0, NULL))) {
		histd_session_free(rec);
		return rc;
	}
	*out = rec;
	return 0;
undo:
	hf_session_remove(d, s);
	hf_session_destroy(d, s);
	histd_session_free(rec);
	/* A limit may count creates not yet durable. */
	return settle_missing(d, rc);
}

static int
fd_session_create(histd_driver *dd, const histd_session *in,
		  histd_session **out)
{
	hf_driver *d = (hf_driver *)dd;
	hf_session *s = hf_session_new(in);
	int rc;

	if (!s)
		return enomem();
	if ((rc = lock_write(d))) {
		hf_session_destroy(d, s);
		return rc;
	}
	return create_locked(d, in->tenant, s, out);
}

static int
fd_session_get(histd_driver *dd, const char *tenant, const char *id,
	       histd_session **out)
{
	hf_driver *d = (hf_driver *)dd;
	histd_session *rec;
	hf_session *s;
	int rc;

	if ((rc = lock_read(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if (!(rec = hf_session_export(s)))
		return settle(d, 0, enomem());
	if ((rc = settle(d, s->lsn, 0))) {
		histd_session_free(rec);
		return rc;
	}
	*out = rec;
	return 0;
}

static int
fd_session_resolve(histd_driver *dd, const histd_session *in,
		   histd_session **out, int *created)
{
	hf_driver *d = (hf_driver *)dd;
	size_t tlen = strlen(in->tenant), clen;
	uint8_t *canon = hf_canon(in->context_keys, in->n_context_keys, &clen);
	histd_session *rec;
	hf_session *s;
	hf_tenant *t;
	int rc;

	if (!canon)
		return enomem();
	/* The common case, under the read lock: it exists. Else again under
	 * the write lock, which makes check-and-create atomic. */
	for (int pass = 0; pass < 2; pass++) {
		if ((rc = pass ? lock_write(d) : lock_read(d))) {
			free(canon);
			return rc;
		}
		t = hf_tenant_find(d, in->tenant, tlen);
		s = t ? hf_map_get(&t->ctx, canon, clen) : NULL;
		if (s) {
			uint64_t lsn = s->lsn;

			free(canon);
			if (!(rec = hf_session_export(s)))
				return settle(d, 0, enomem());
			if ((rc = settle(d, lsn, 0))) {
				histd_session_free(rec);
				return rc;
			}
			*out = rec;
			*created = 0;
			return 0;
		}
		if (!pass)
			pthread_rwlock_unlock(&d->lock);
	}
	free(canon);
	if (!(s = hf_session_new(in))) {
		pthread_rwlock_unlock(&d->lock);
		return enomem();
	}
	if ((rc = create_locked(d, in->tenant, s, out)))
		return rc;
	*created = 1;
	return 0;
}

static int
fd_session_list(histd_driver *dd, const histd_list *q, histd_session_list *out)
{
	hf_driver *d = (hf_driver *)dd;
	histd_session_list l = { 0 };
	const char *after = q->after_id && *q->after_id ? q->after_id : NULL;
	hf_tenant *t;
	size_t lo = 0, cap = 0;
	int rc;

	if ((rc = lock_read(d)))
		return rc;
	t = hf_tenant_find(d, q->tenant, strlen(q->tenant));
	if (t && after) {
		size_t hi = t->n;

		/* The first id above after_id. */
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;

			if (strcmp(t->sorted[mid]->id, after) <= 0)
				lo = mid + 1;
			else
				hi = mid;
		}
	}
	for (size_t i = lo; t && i < t->n; i++) {
		const hf_session *s = t->sorted[i];
		histd_session *rec;

		if (!histd_kv_contains(s->labels, s->n_labels, q->labels,
				       q->n_labels))
			continue;
		if (l.n == q->limit) {
			l.has_more = 1;
			break;
		}
		if (l.n == cap) {
			size_t ncap = cap ? cap * 2 : 16;
			histd_session **v = realloc(l.v, ncap * sizeof(*v));

			if (!v)
				goto oom;
			l.v = v;
			cap = ncap;
		}
		if (!(rec = hf_session_export(s)))
			goto oom;
		l.v[l.n++] = rec;
	}
	if ((rc = settle_missing(d, 0))) {
		histd_session_list_free(&l);
		return rc;
	}
	*out = l;
	return 0;
oom:
	histd_session_list_free(&l);
	return settle(d, 0, enomem());
}

/* Tenants stay in the map once made: those with no session left are
 * skipped. One pass over the map per page. */
static int
fd_tenant_list(histd_driver *dd, const char *after, uint32_t limit,
	       histd_tenant_list *out)
{
	hf_driver *d = (hf_driver *)dd;
	histd_tenant_list l = { 0 };
	int rc = 0;

	if ((rc = lock_read(d)))
		return rc;
	for (size_t i = 0; d->tenants.s && i <= d->tenants.mask && !rc; i++) {
		const hf_tenant *t = d->tenants.s[i].v;

		if (t && t->n)
			rc = histd_tenant_list_offer(&l, after, limit, t->name);
	}
	/* An absent tenant may rest on a delete still queued. */
	if ((rc = settle_missing(d, rc))) {
		histd_tenant_list_free(&l);
		return rc;
	}
	*out = l;
	return 0;
}

/* New labels and config, copied for one holder. */
typedef struct upd_vals {
	histd_kv *labels;
	uint8_t *config;
} upd_vals;

static int
upd_dup(upd_vals *v, const histd_kv *labels, size_t n_labels,
	const uint8_t *config, size_t config_len)
{
	*v = (upd_vals){ 0 };
	if (labels && histd_kv_dup(&v->labels, labels, n_labels))
		return -1;
	if (config && config_len) {
		if (!(v->config = malloc(config_len)))
			return -1;
		memcpy(v->config, config, config_len);
	}
	return 0;
}

static void
upd_free(upd_vals *v, size_t n_labels)
{
	histd_kv_free(v->labels, n_labels);
	free(v->config);
	*v = (upd_vals){ 0 };
}

/* Makes a record exported before the update show it. */
static void
upd_rec(histd_session *r, upd_vals *v, const histd_kv *labels,
	size_t n_labels, const uint8_t *config, size_t config_len,
	int64_t now_us, uint64_t revision)
{
	if (labels) {
		histd_kv_free(r->labels, r->n_labels);
		r->labels = v->labels;
		r->n_labels = n_labels;
	}
	if (config) {
		free(r->config);
		r->config = v->config;
		r->config_len = config_len;
	}
	*v = (upd_vals){ 0 };
	r->updated_at_us = r->active_at_us = now_us;
	r->revision = revision;
}

static int
fd_session_update(histd_driver *dd, const char *tenant, const char *id,
		  uint64_t expected_revision, const histd_kv *labels,
		  size_t n_labels, const uint8_t *config, size_t config_len,
		  int64_t now_us, histd_session **out,
		  uint64_t *current_revision)
{
	hf_driver *d = (hf_driver *)dd;
	upd_vals sv = { 0 }, rv = { 0 }, nv = { 0 };
	histd_session *rec = NULL, *nrec = NULL;
	size_t nl = labels ? n_labels : 0, cl = config ? config_len : 0, mark;
	hf_note *nt = NULL;
	hf_session *s;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if ((rc = hf_check_revision(s, expected_revision, current_revision)))
		return settle(d, s->lsn, rc);
	/* Three copies of the new values (the session's, the caller's
	 * record, the reported record), all made before anything changes. */
	if (upd_dup(&sv, labels, nl, config, cl) ||
	    upd_dup(&rv, labels, nl, config, cl) ||
	    !(rec = hf_session_export(s)) ||
	    (d->notify && (upd_dup(&nv, labels, nl, config, cl) ||
			   !(nrec = hf_session_export(s))))) {
		rc = enomem();
		goto out;
	}
	if (!(b = hf_wal_begin(d->wal))) {
		rc = HISTD_EUNAVAILABLE;
		goto out;
	}
	mark = hf_frame_begin(b, HF_T_UPDATE);
	hf_put_str(b, tenant);
	hf_put_str(b, id);
	hf_put_varint(b, s->revision + 1);
	hf_put_varint(b, (uint64_t)now_us);
	hf_put_u8(b, labels != NULL);
	hf_put_kv(b, labels, nl);
	hf_put_u8(b, config != NULL);
	hf_put_bytes(b, config, cl);
	hf_frame_end(b, mark);
	nt = note_new(d, HISTD_CHANGE_UPDATED, s, s->revision + 1, NULL, 0, NULL);
	if ((rc = encoded(d, b, mark, 1, nt)))
		goto out;

	hf_apply_update(s, sv.labels, nl, labels != NULL, sv.config, cl,
			config != NULL, now_us);
	sv = (upd_vals){ 0 };
	hf_session_account(d, s);
	upd_rec(rec, &rv, labels, nl, config, cl, now_us, s->revision);
	if (nt) {
		upd_rec(nrec, &nv, labels, nl, config, cl, now_us, s->revision);
		nt->session = nrec;
		nrec = NULL;
	}
	rc = commit(d, s, NULL, 0, NULL);
	if (rc == 0)
		*out = rec;
	else
		histd_session_free(rec);
	return rc;
out:
	upd_free(&sv, nl);
	upd_free(&rv, nl);
	upd_free(&nv, nl);
	histd_session_free(rec);
	histd_session_free(nrec);
	pthread_rwlock_unlock(&d->lock);
	return rc;
}

/*
 * The prologue of delete, clear and truncate: the write lock, the session
 * (NOT_FOUND) and its revision (ABORTED). 0 with the lock held and *out
 * set; else the answer, the lock released.
 */
static int
lock_session(hf_driver *d, const char *tenant, const char *id,
	     uint64_t expected_revision, uint64_t *current_revision,
	     hf_session **out)
{
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(*out = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if ((rc = hf_check_revision(*out, expected_revision,
				    current_revision)))
		return settle(d, (*out)->lsn, rc);
	return 0;
}

/* 0 when s is the life `incarnation` (0: any); else ENOTFOUND, the lock
 * released. */
static int
check_life(hf_driver *d, const hf_session *s, uint64_t incarnation)
{
	if (incarnation && s->incarnation != incarnation)
		return settle(d, s->lsn, histd_error_set(HISTD_ENOTFOUND,
			"session not found (it was deleted and created again)"));
	return 0;
}

/* Begins the log record `type` of session s in b: tenant, id, the
 * revision it makes and, but for a delete, `at`: the server time of the
 * change (format 2). */
static void
record_head(hf_buf *b, uint8_t type, const char *tenant, const char *id,
	    const hf_session *s, int64_t at, size_t *mark)
{
	*mark = hf_frame_begin(b, type);
	hf_put_str(b, tenant);
	hf_put_str(b, id);
	hf_put_varint(b, s->revision + 1);
	if (type != HF_T_DELETE)
		hf_put_varint(b, (uint64_t)at);
}

/* record_head in the log's buffer. NULL when the log takes nothing (the
 * lock released). */
static hf_buf *
record_begin(hf_driver *d, uint8_t type, const char *tenant, const char *id,
	     const hf_session *s, int64_t at, size_t *mark)
{
	hf_buf *b = hf_wal_begin(d->wal);

	if (!b) {
		pthread_rwlock_unlock(&d->lock);
		return NULL;
	}
	record_head(b, type, tenant, id, s, at, mark);
	return b;
}

/* Ends the record and queues it with its change notice `kind`; 0, or the
 * error with the lock released (ELIMIT, ENOMEM). *nt: the notice, NULL
 * when nobody listens. */
static int
record_end(hf_driver *d, hf_buf *b, size_t mark, enum histd_change_kind kind,
	   const hf_session *s, hf_note **nt)
{
	int rc;

	hf_frame_end(b, mark);
	/* Reported as one more revision, as the memory driver does. */
	*nt = note_new(d, kind, s, s->revision + 1, NULL, 0, NULL);
	if ((rc = encoded(d, b, mark, 1, *nt)))
		pthread_rwlock_unlock(&d->lock);
	return rc;
}

/* A record of nothing but its head (delete, clear). */
static int
record_plain(hf_driver *d, uint8_t type, enum histd_change_kind kind,
	     const char *tenant, const char *id, const hf_session *s,
	     int64_t at, hf_note **nt)
{
	size_t mark;
	hf_buf *b = record_begin(d, type, tenant, id, s, at, &mark);

	return b ? record_end(d, b, mark, kind, s, nt) : HISTD_EUNAVAILABLE;
}

static int
fd_session_delete_life(histd_driver *dd, const char *tenant, const char *id,
		       uint64_t expected_revision, uint64_t incarnation,
		       uint64_t *current_revision)
{
	hf_driver *d = (hf_driver *)dd;
	hf_note *nt;
	hf_session *s;
	int rc;

	if ((rc = lock_session(d, tenant, id, expected_revision,
			       current_revision, &s)) ||
	    (rc = check_life(d, s, incarnation)))
		return rc;
	if ((rc = record_plain(d, HF_T_DELETE, HISTD_CHANGE_DELETED, tenant, id,
			       s, 0, &nt)))
		return rc;
	hf_index_forget(s);
	hf_session_remove(d, s);
	hf_session_destroy(d, s);
	return commit(d, NULL, NULL, 0, NULL);
}

static int
fd_session_delete(histd_driver *dd, const char *tenant, const char *id,
		  uint64_t expected_revision, uint64_t *current_revision)
{
	return fd_session_delete_life(dd, tenant, id, expected_revision, 0,
				      current_revision);
}

static int
fd_session_fork_life(histd_driver *dd, const char *tenant,
		     const char *source_id, uint64_t source_incarnation,
		     uint64_t up_to_seq, const histd_session *in,
		     histd_session **out)
{
	hf_driver *d = (hf_driver *)dd;
	histd_session *rec = NULL;
	hf_session *src, *f;
	size_t mark;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(src = find(d, tenant, source_id)))
		return settle_missing(d, not_found());
	if ((rc = check_life(d, src, source_incarnation)))
		return rc;
	if (find(d, tenant, in->id))
		return settle_missing(d, histd_error_set(HISTD_EEXISTS,
							 "session id already exists"));
	if (!(f = hf_fork_build(src, up_to_seq, in)))
		return settle(d, 0, enomem());
	if ((rc = hf_session_insert(d, tenant, strlen(tenant), f))) {
		hf_session_destroy(d, f);
		return settle_missing(d, rc);
	}
	if ((rc = check_sessions(d, f)) ||
	    (rc = check_size(d, f->n_msgs, f->bytes_total)))
		goto undo;
	if (!(rec = hf_session_export(f))) {
		rc = enomem();
		goto undo;
	}
	if (!(b = hf_wal_begin(d->wal))) {
		rc = HISTD_EUNAVAILABLE;
		goto undo;
	}
	mark = hf_frame_begin(b, HF_T_FORK);
	hf_put_str(b, tenant);
	hf_put_str(b, source_id);
	hf_put_varint(b, src->revision);
	hf_put_varint(b, up_to_seq);
	put_session_in(b, f);
	hf_frame_end(b, mark);
	if ((rc = encoded(d, b, mark, 0, NULL)))
		goto undo;
	hf_index_sync(f);
	if ((rc = commit(d, f, NULL, 0, NULL))) {
		histd_session_free(rec);
		return rc;
	}
	*out = rec;
	return 0;
undo:
	hf_session_remove(d, f);
	hf_session_destroy(d, f);
	histd_session_free(rec);
	/* A limit may count creates, or appends to the source, not yet
	 * durable. */
	return settle_missing(d, rc);
}

static int
fd_session_fork(histd_driver *dd, const char *tenant, const char *source_id,
		uint64_t up_to_seq, const histd_session *in,
		histd_session **out)
{
	return fd_session_fork_life(dd, tenant, source_id, 0, up_to_seq, in,
				    out);
}

/* ---------------------------------------------------------------------- */
/* Messages                                                                */

/* The batch's stored records (seq in front) and tool references. */
typedef struct built {
	histd_record *recs;
	hf_msgrefs *refs;
	hf_ref *pool;
	size_t *offs;
	size_t k;
} built;

static void
built_free(built *bt)
{
	for (size_t i = 0; bt->recs && i < bt->k; i++)
		free(bt->recs[i].data);
	free(bt->recs);
	free(bt->refs);
	free(bt->pool);
	free(bt->offs);
	*bt = (built){ 0 };
}

static int
build(built *bt, const histd_append *a, uint64_t first_seq)
{
	size_t k = a->n_msgs, total = 0, used = 0;

	*bt = (built){ 0 };
	for (size_t i = 0; i < k; i++)
		total += a->msgs[i].n_calls + a->msgs[i].n_results;
	if ((k && (!(bt->recs = calloc(k, sizeof(*bt->recs))) ||
		   !(bt->refs = calloc(k, sizeof(*bt->refs))) ||
		   !(bt->offs = calloc(k, sizeof(*bt->offs))))) ||
	    (total && !(bt->pool = malloc(total * sizeof(*bt->pool)))))
		goto oom;
	bt->k = k;
	for (size_t i = 0; i < k; i++) {
		const histd_msg_in *m = &a->msgs[i];
		size_t len;
		uint8_t *blk = histd_wire_with_seq(first_seq + i, m->data, m->len,
						   &len);

		if (!blk)
			goto oom;
		bt->recs[i] = (histd_record){ .seq = first_seq + i,
					      .token_estimate = m->token_estimate,
					      .len = (uint32_t)len, .data = blk };
		/* pool is NULL when no message names a tool call. */
		bt->refs[i].calls = bt->pool ? bt->pool + used : NULL;
		bt->refs[i].n_calls = m->n_calls;
		for (size_t j = 0; j < m->n_calls; j++)
			bt->pool[used++] = (hf_ref){ m->calls[j].id,
						     strlen(m->calls[j].id),
						     m->calls[j].block };
		bt->refs[i].results = bt->pool ? bt->pool + used : NULL;
		bt->refs[i].n_results = m->n_results;
		for (size_t j = 0; j < m->n_results; j++)
			bt->pool[used++] = (hf_ref){ m->results[j].id,
						     strlen(m->results[j].id),
						     m->results[j].block };
	}
	return 0;
oom:
	built_free(bt);
	return enomem();
}

/* Messages as append and replace log them (recs: the prepared batch's). */
static void
put_msgs(hf_buf *b, const built *bt, const histd_record *recs)
{
	hf_put_varint(b, bt->k);
	for (size_t i = 0; i < bt->k; i++) {
		const hf_msgrefs *r = &bt->refs[i];

		hf_put_varint(b, recs[i].token_estimate);
		hf_put_varint(b, recs[i].len);
		bt->offs[i] = b->len;
		hf_put_raw(b, recs[i].data, recs[i].len);
		hf_put_varint(b, r->n_calls);
		for (size_t j = 0; j < r->n_calls; j++)
			hf_put_bytes(b, r->calls[j].id, r->calls[j].len);
		hf_put_varint(b, r->n_results);
		for (size_t j = 0; j < r->n_results; j++)
			hf_put_bytes(b, r->results[j].id, r->results[j].len);
	}
}

static uint64_t
recs_bytes(const histd_record *recs, size_t k)
{
	uint64_t b = 0;

	for (size_t i = 0; i < k; i++)
		b += recs[i].len;
	return b;
}

static int
fd_append(histd_driver *dd, const histd_append *a, histd_append_result *res)
{
	hf_driver *d = (hf_driver *)dd;
	const char *key = a->idempotency_key;
	size_t klen = key ? strlen(key) : 0, mark;
	hf_idem *e = NULL, *fresh = NULL;
	hf_batch batch = { 0 };
	built bt = { 0 };
	hf_note *nt;
	hf_session *s;
	uint64_t first;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(s = find(d, a->tenant, a->session_id)))
		return settle_missing(d, not_found());
	hf_idem_purge(s, a->now_us);
	if (klen && (e = hf_map_get(&s->idem, key, klen)) &&
	    e->expires_us > a->now_us) {
		if (memcmp(e->hash, a->request_hash, HISTD_HASH_LEN) != 0)
			return settle(d, e->lsn, histd_error_set(HISTD_EPRECONDITION,
								 "idempotency_key was used with a different request"));
		/* The first answer, once the append it answers is durable. */
		res->first_seq = e->first_seq;
		res->last_seq = e->last_seq;
		res->revision = e->revision;
		res->replayed = 1;
		return settle(d, e->lsn, 0);
	}
	/* e, if set, is an expired key: renewed in place below. */
	if ((rc = hf_check_revision(s, a->expected_revision,
				    &res->current_revision)))
		return settle(d, s->lsn, rc);
	first = s->last_seq + 1;
	if ((rc = build(&bt, a, first)))
		goto out;
	if ((rc = hf_batch_prepare(&batch, s, bt.recs, bt.k, bt.refs, 0)))
		goto out;
	bt.recs = NULL;                 /* the batch's now */
	if ((rc = check_size(d, s->n_msgs + batch.k,
			     s->bytes_total + recs_bytes(batch.recs, batch.k))))
		goto out;
	if (klen && !e &&
	    (!(fresh = hf_idem_new(key, klen)) ||
	     hf_map_reserve(&s->idem, s->idem.n + 1))) {
		rc = enomem();
		goto out;
	}
	if (!(b = hf_wal_begin(d->wal))) {
		rc = HISTD_EUNAVAILABLE;
		goto out;
	}
	record_head(b, HF_T_APPEND, a->tenant, a->session_id, s, a->now_us,
		    &mark);
	hf_put_varint(b, first);
	put_msgs(b, &bt, batch.recs);
	hf_put_bytes(b, key, klen);
	if (klen) {
		hf_put_raw(b, a->request_hash, HISTD_HASH_LEN);
		hf_put_varint(b, (uint64_t)a->idem_expires_us);
	}
	hf_frame_end(b, mark);
	nt = note_new(d, HISTD_CHANGE_APPENDED, s, s->revision + 1, batch.recs,
		      batch.k, bt.offs);
	if ((rc = encoded(d, b, mark, 1, nt)))
		goto out;

	/* Nothing below fails. */
	hf_batch_apply(d, &batch, s, a->now_us);
	hf_index_sync(s);
	if (klen) {
		hf_apply_idem(s, e, fresh, a->request_hash, a->idem_expires_us,
			      first, 0);
		e = e ? e : fresh;
		fresh = NULL;
	}
	hf_session_account(d, s);
	res->first_seq = first;
	res->last_seq = s->last_seq;
	res->revision = s->revision;
	res->replayed = 0;
	built_free(&bt);
	return commit(d, s, klen ? e : NULL, 1, a);
out:
	hf_batch_free(d, &batch);
	built_free(&bt);
	free(fresh);
	/* A refusal may rest on the session's changes not yet durable (a
	 * tool call id taken, the size limit reached): answered once they
	 * are, as every other answer. */
	return settle(d, s->lsn, rc);
}

static int
fd_read(histd_driver *dd, const histd_read *q, histd_read_result *res)
{
	hf_driver *d = (hf_driver *)dd;
	hf_session *s;
	size_t from, to;
	int rc, budget_cut;

	if ((rc = lock_read(d)))
		return rc;
	if (!(s = find(d, q->tenant, q->session_id)))
		return settle_missing(d, not_found());
	if (q->last_n) {
		from = s->n_msgs > q->last_n ? s->n_msgs - q->last_n : 0;
		to = s->n_msgs;
	} else {
		from = hf_first_after(s->msgs, s->n_msgs, q->after_seq);
		to = q->limit && s->n_msgs - from > q->limit ? from + q->limit
							      : s->n_msgs;
	}
	budget_cut = histd_read_budget(q, s->msgs, &from, &to);
	if (histd_records_reserve(&res->records, q,
				  to > from ? s->msgs + from : NULL, to - from))
		goto oom;
	for (size_t i = from; i < to; i++) {
		const histd_record *r = &s->msgs[i];

		if (histd_records_add(&res->records, r->seq, r->token_estimate,
				      r->data, r->len))
			goto oom;
	}
	if (histd_read_known(q, s->revision, s->created_at_us))
		res->known = 1;
	else if (q->want_session && !(res->session = hf_session_export(s)))
		goto oom;
	if (q->want_summary && s->n_sums && !res->known) {
		const histd_record *b = &s->sums[s->best_sum];

		if (!(res->summary = histd_record_new(b->seq, b->token_estimate,
						      b->data, b->len)))
			goto oom;
	}
	res->summary_read = q->want_summary != 0;
	res->revision = s->revision;
	res->last_seq = s->last_seq;
	res->cleared_to_seq = s->cleared_to_seq;
	res->has_more = to < s->n_msgs || budget_cut;
	if ((rc = settle(d, s->lsn, 0)))
		histd_read_result_clear(res);
	return rc;
oom:
	histd_read_result_clear(res);
	return settle(d, 0, enomem());
}

static int
fd_tool_result(histd_driver *dd, const char *tenant, const char *id,
	       const char *call_id, histd_record **out)
{
	hf_driver *d = (hf_driver *)dd;
	const hf_tool *t;
	histd_record *r;
	hf_session *s;
	size_t i;
	int rc;

	if ((rc = lock_read(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	t = hf_map_get(&s->tools, call_id, strlen(call_id));
	i = t && t->result_seq ? hf_first_after(s->msgs, s->n_msgs,
						t->result_seq - 1) : s->n_msgs;
	if (i == s->n_msgs || s->msgs[i].seq != t->result_seq)
		return settle(d, s->lsn, histd_error_set(HISTD_ENOTFOUND,
							 "no stored tool result answers tool_call_id"));
	if (!(r = histd_record_new(s->msgs[i].seq, s->msgs[i].token_estimate,
				   s->msgs[i].data, s->msgs[i].len)))
		return settle(d, 0, enomem());
	if ((rc = settle(d, s->lsn, 0))) {
		histd_record_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

static int
fd_clear(histd_driver *dd, const char *tenant, const char *id,
	 uint64_t expected_revision, uint64_t *revision,
	 uint64_t *cleared_to_seq, uint64_t *current_revision)
{
	hf_driver *d = (hf_driver *)dd;
	hf_session *s;
	hf_note *nt;
	int64_t at = histd_now_us();
	int rc;

	if ((rc = lock_session(d, tenant, id, expected_revision,
			       current_revision, &s)) ||
	    (rc = record_plain(d, HF_T_CLEAR, HISTD_CHANGE_CLEARED, tenant, id,
			       s, at, &nt)))
		return rc;
	hf_apply_clear(d, s, at);
	hf_index_clear(s);
	if (nt)
		nt->cleared_to_seq = s->cleared_to_seq;
	hf_session_account(d, s);
	*revision = s->revision;
	*cleared_to_seq = s->cleared_to_seq;
	return commit(d, s, NULL, 0, NULL);
}

static int
fd_replace(histd_driver *dd, const histd_append *a, histd_append_result *res,
	   uint64_t *cleared_to_seq)
{
	hf_driver *d = (hf_driver *)dd;
	hf_batch batch = { 0 };
	built bt = { 0 };
	hf_session *s;
	hf_note *nt;
	uint64_t first;
	size_t mark;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(s = find(d, a->tenant, a->session_id)))
		return settle_missing(d, not_found());
	if ((rc = hf_check_revision(s, a->expected_revision,
				    &res->current_revision)))
		return settle(d, s->lsn, rc);
	first = s->last_seq + 1;
	if ((rc = build(&bt, a, first)) ||
	    (rc = hf_batch_prepare(&batch, s, bt.recs, bt.k, bt.refs, 1)))
		goto out;
	bt.recs = NULL;                 /* the batch's now */
	if ((rc = check_size(d, batch.k, recs_bytes(batch.recs, batch.k))))
		goto out;
	if (!(b = hf_wal_begin(d->wal))) {
		rc = HISTD_EUNAVAILABLE;
		goto out;
	}
	record_head(b, HF_T_REPLACE, a->tenant, a->session_id, s, a->now_us,
		    &mark);
	hf_put_varint(b, first);
	put_msgs(b, &bt, batch.recs);
	hf_frame_end(b, mark);
	nt = note_new(d, HISTD_CHANGE_REPLACED, s, s->revision + 1, batch.recs,
		      batch.k, bt.offs);
	if ((rc = encoded(d, b, mark, 1, nt)))
		goto out;

	hf_batch_apply(d, &batch, s, a->now_us);
	hf_index_clear(s);
	hf_index_sync(s);
	if (nt)
		nt->cleared_to_seq = s->cleared_to_seq;
	hf_session_account(d, s);
	res->first_seq = bt.k ? first : 0;
	res->last_seq = bt.k ? s->last_seq : 0;
	res->revision = s->revision;
	res->replayed = 0;
	*cleared_to_seq = s->cleared_to_seq;
	built_free(&bt);
	return commit(d, s, NULL, 0, NULL);
out:
	hf_batch_free(d, &batch);
	built_free(&bt);
	pthread_rwlock_unlock(&d->lock);
	return rc;
}

static int
fd_truncate_life(histd_driver *dd, const char *tenant, const char *id,
		 uint64_t up_to_seq, uint64_t expected_revision,
		 uint64_t incarnation, uint64_t *revision,
		 uint64_t *current_revision)
{
	hf_driver *d = (hf_driver *)dd;
	int64_t at = histd_now_us();
	void **victims;
	hf_session *s;
	hf_note *nt;
	size_t mark;
	hf_buf *b;
	int rc;

	if ((rc = lock_session(d, tenant, id, expected_revision,
			       current_revision, &s)) ||
	    (rc = check_life(d, s, incarnation)))
		return rc;
	if (!hf_truncate_deletes(s, up_to_seq)) {
		*revision = s->revision;
		return settle(d, s->lsn, 0);
	}
	/* Nothing stored is above last_seq: cleared_to_seq never passes it. */
	if (up_to_seq > s->last_seq)
		up_to_seq = s->last_seq;
	if (!(victims = malloc((s->tools.n ? s->tools.n : 1) * sizeof(*victims))))
		return settle(d, 0, enomem());
	if (!(b = record_begin(d, HF_T_TRUNCATE, tenant, id, s, at, &mark))) {
		free(victims);
		return HISTD_EUNAVAILABLE;
	}
	hf_put_varint(b, up_to_seq);
	if ((rc = record_end(d, b, mark, HISTD_CHANGE_CLEARED, s, &nt))) {
		free(victims);
		return rc;
	}
	hf_apply_truncate(d, s, up_to_seq, victims, at);
	free(victims);
	/* The index drops a session's documents only wholesale: it forgets
	 * the session and reads what is left again. */
	hf_index_forget(s);
	hf_index_sync(s);
	if (nt) {
		nt->cleared_to_seq = up_to_seq;
		nt->system_kept = 1;
	}
	hf_session_account(d, s);
	*revision = s->revision;
	return commit(d, s, NULL, 0, NULL);
}

static int
fd_truncate(histd_driver *dd, const char *tenant, const char *id,
	    uint64_t up_to_seq, uint64_t expected_revision, uint64_t *revision,
	    uint64_t *current_revision)
{
	return fd_truncate_life(dd, tenant, id, up_to_seq, expected_revision, 0,
				revision, current_revision);
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                               */

static int
fd_summary_put_life(histd_driver *dd, const char *tenant, const char *id,
		    uint64_t expected_revision, uint64_t incarnation,
		    const histd_record *summary, uint64_t *revision,
		    uint64_t *current_revision)
{
	hf_driver *d = (hf_driver *)dd;
	histd_record r = *summary;
	int64_t at = histd_now_us();
	hf_session *s;
	hf_note *nt;
	size_t mark, off;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if ((rc = hf_check_revision(s, expected_revision, current_revision)))
		return settle(d, s->lsn, rc);
	if ((rc = check_life(d, s, incarnation)))
		return rc;
	if (hf_sums_reserve(s, s->n_sums + 1) ||
	    !(r.data = malloc(summary->len ? summary->len : 1)))
		return settle(d, 0, enomem());
	if (summary->len)
		memcpy(r.data, summary->data, summary->len);
	if (!(b = hf_wal_begin(d->wal))) {
		free(r.data);
		pthread_rwlock_unlock(&d->lock);
		return HISTD_EUNAVAILABLE;
	}
	record_head(b, HF_T_SUMMARY, tenant, id, s, at, &mark);
	hf_put_varint(b, r.seq);
	hf_put_varint(b, r.token_estimate);
	hf_put_varint(b, r.len);
	off = b->len;
	hf_put_raw(b, r.data, r.len);
	hf_frame_end(b, mark);
	nt = note_new(d, HISTD_CHANGE_SUMMARY, s, s->revision + 1, &r, 1, &off);
	if ((rc = encoded(d, b, mark, 1, nt))) {
		free(r.data);
		pthread_rwlock_unlock(&d->lock);
		return rc;
	}
	hf_apply_summary(s, &r, at);
	hf_session_account(d, s);
	*revision = s->revision;
	return commit(d, s, NULL, 0, NULL);
}

static int
fd_summary_put(histd_driver *dd, const char *tenant, const char *id,
	       uint64_t expected_revision, const histd_record *summary,
	       uint64_t *revision, uint64_t *current_revision)
{
	return fd_summary_put_life(dd, tenant, id, expected_revision, 0,
				   summary, revision, current_revision);
}

/* ---------------------------------------------------------------------- */
/* Embeddings                                                              */

/* The life is checked under the write lock that logs and applies the
 * vector, so the log holds it after the records of the life it went to:
 * replay stores it there by tenant and id alone. */
static int
fd_embedding_put_life(histd_driver *dd, const char *tenant, const char *id,
		      uint64_t incarnation, uint64_t seq, const char *model,
		      const float *v, uint32_t dim)
{
	hf_driver *d = (hf_driver *)dd;
	histd_vec *x;
	hf_session *s;
	size_t i, mark;
	hf_buf *b;
	int rc;

	if ((rc = lock_write(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if ((rc = check_life(d, s, incarnation)))
		return rc;
	i = hf_first_after(s->msgs, s->n_msgs, seq - 1);
	if (i == s->n_msgs || s->msgs[i].seq != seq)
		return settle(d, s->lsn, histd_error_set(HISTD_ENOTFOUND,
				 "no stored message has seq %llu",
				 (unsigned long long)seq));
	if (hf_vecs_reserve(s)) {
		pthread_rwlock_unlock(&d->lock);
		return enomem();
	}
	x = histd_vec_new(seq, (uint8_t)histd_index_message_role(s->msgs[i].data,
								 s->msgs[i].len),
			  model, v, dim);
	if (!x) {
		/* The wrapper refused a vector that cannot be normalized. */
		pthread_rwlock_unlock(&d->lock);
		return enomem();
	}
	if (!(b = hf_wal_begin(d->wal))) {
		free(x);
		pthread_rwlock_unlock(&d->lock);
		return HISTD_EUNAVAILABLE;
	}
	/* The normalized vector is logged: replay stores the same floats. */
	mark = hf_frame_begin(b, HF_T_EMBED);
	hf_put_str(b, tenant);
	hf_put_str(b, id);
	hf_put_vec(b, x);
	hf_frame_end(b, mark);
	if ((rc = encoded(d, b, mark, 0, NULL))) {
		free(x);
		pthread_rwlock_unlock(&d->lock);
		return rc;
	}
	hf_vec_put(s, x);
	hf_session_account(d, s);
	return commit(d, s, NULL, 0, NULL);
}

static int
fd_embedding_put(histd_driver *dd, const char *tenant, const char *id,
		 uint64_t seq, const char *model, const float *v, uint32_t dim)
{
	return fd_embedding_put_life(dd, tenant, id, 0, seq, model, v, dim);
}

static int
fd_summary_get(histd_driver *dd, const char *tenant, const char *id,
	       histd_record **out)
{
	hf_driver *d = (hf_driver *)dd;
	histd_record *r = NULL;
	hf_session *s;
	int rc;

	if ((rc = lock_read(d)))
		return rc;
	if (!(s = find(d, tenant, id)))
		return settle_missing(d, not_found());
	if (s->n_sums) {
		const histd_record *b = &s->sums[s->best_sum];

		if (!(r = histd_record_new(b->seq, b->token_estimate, b->data,
					   b->len)))
			return settle(d, 0, enomem());
	}
	if ((rc = settle(d, s->lsn, 0))) {
		histd_record_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The driver                                                              */

static void
fd_set_notify(histd_driver *dd, histd_change_fn fn, void *ctx)
{
	hf_driver *d = (hf_driver *)dd;

	/* Set before any write (driver.h); the writer thread reads it only
	 * for records queued after, under the queue's mutex. */
	pthread_rwlock_wrlock(&d->lock);
	d->notify = fn;
	d->notify_ctx = ctx;
	pthread_rwlock_unlock(&d->lock);
}

static int
fd_ping(histd_driver *dd)
{
	hf_driver *d = (hf_driver *)dd;

	return hf_wal_failed(d->wal) ? HISTD_EUNAVAILABLE : 0;
}

static void
free_state(hf_driver *d)
{
	for (size_t i = 0; d->tenants.s && i <= d->tenants.mask; i++) {
		hf_tenant *t = d->tenants.s[i].v;

		if (!t)
			continue;
		for (size_t j = 0; j < t->n; j++)
			hf_session_destroy(d, t->sorted[j]);
		hf_map_free(&t->ids);
		hf_map_free(&t->ctx);
		histd_index_free(t->index);
		free(t->sorted);
		free(t->name);
		free(t);
	}
	hf_map_free(&d->tenants);
	for (size_t i = 0; i < d->n_grave; i++)
		hf_free_data(d, d->grave[i].p, d->grave[i].len);
	free(d->grave);
	hf_mapping_close_all(d);
}

static void
log_stats(hf_driver *d)
{
	histd_file_stats st;
	char v[10][32];

	histd_file_driver_stats(&d->base, &st);
	snprintf(v[0], sizeof(v[0]), "%llu", (unsigned long long)st.records);
	snprintf(v[1], sizeof(v[1]), "%llu", (unsigned long long)st.appends);
	snprintf(v[2], sizeof(v[2]), "%llu", (unsigned long long)st.batches);
	snprintf(v[3], sizeof(v[3]), "%llu", (unsigned long long)st.fsyncs);
	snprintf(v[4], sizeof(v[4]), "%.2f",
		 st.fsyncs ? (double)st.appends / (double)st.fsyncs : 0.0);
	snprintf(v[5], sizeof(v[5]), "%llu", (unsigned long long)st.bytes);
	snprintf(v[6], sizeof(v[6]), "%llu", (unsigned long long)st.compactions);
	snprintf(v[7], sizeof(v[7]), "%llu", (unsigned long long)st.open_us);
	snprintf(v[8], sizeof(v[8]), "%llu", (unsigned long long)st.sync_us);
	snprintf(v[9], sizeof(v[9]), "%llu", (unsigned long long)st.gather_us);
	hf_log_line(d, HF_LOG_INFO, "file driver closed", "dir", d->dir,
		    "records", v[0], "appends", v[1], "batches", v[2],
		    "fsyncs", v[3], "appends_per_fsync", v[4], "bytes", v[5],
		    "compactions", v[6], "open_us", v[7], "sync_us", v[8],
		    "gather_us", v[9], NULL);
}

static void
fd_close(histd_driver *dd)
{
	hf_driver *d = (hf_driver *)dd;

	hf_maint_stop(d);
	if (d->wal) {
		hf_wal_stop(d->wal);
		log_stats(d);
		hf_wal_free(d->wal);
		d->wal = NULL;
	}
	free_state(d);
	if (d->dirfd >= 0)
		close(d->dirfd);
	/* Closing the lock file releases the flock. */
	if (d->lockfd >= 0)
		close(d->lockfd);
	pthread_mutex_destroy(&d->compact_mu);
	pthread_mutex_destroy(&d->maint_mu);
	pthread_cond_destroy(&d->maint_cv);
	pthread_rwlock_destroy(&d->lock);
	free(d->dir);
	free(d);
}

void
histd_file_options_default(histd_file_options *opt)
{
	*opt = (histd_file_options){
		.compact_min_bytes = 64u << 20,
		.compact_garbage_ratio = 0.5,
		.batch_window_us = 1000,
	};
}

int
histd_file_driver_stats(histd_driver *dd, histd_file_stats *out)
{
	hf_driver *d = (hf_driver *)dd;

	if (!dd || !out || !dd->name || strcmp(dd->name, "file") != 0 ||
	    dd->close != fd_close)
		return histd_error_set(HISTD_EINVALID, "not a file driver");
	*out = (histd_file_stats){ 0 };
	if (d->wal)
		hf_wal_stats(d->wal, out);
	pthread_rwlock_rdlock(&d->lock);
	out->compactions = d->compactions;
	out->live_bytes = d->live_bytes;
	out->file_bytes = d->base_bytes + (d->wal ? hf_wal_bytes(d->wal) : 0);
	pthread_rwlock_unlock(&d->lock);
	out->open_us = d->open_us;
	return 0;
}

int
histd_file_driver_compact(histd_driver *dd)
{
	if (!dd || !dd->name || strcmp(dd->name, "file") != 0 ||
	    dd->close != fd_close)
		return histd_error_set(HISTD_EINVALID, "not a file driver");
	return hf_compact((hf_driver *)dd, 1);
}

static int
parse_mode(const char *s, enum hf_fsync *mode)
{
	if (!s || !*s || strcmp(s, "batch") == 0)
		*mode = HF_FSYNC_BATCH;
	else if (strcmp(s, "always") == 0)
		*mode = HF_FSYNC_ALWAYS;
	else if (strcmp(s, "never") == 0)
		*mode = HF_FSYNC_NEVER;
	else
		return histd_error_set(HISTD_EINVALID,
				       "fsync must be always, batch or never (got '%s')",
				       s);
	return 0;
}

int
histd_file_driver_open_ex(const histd_driver_config *cfg,
			  const histd_file_options *opt, histd_driver **out)
{
	int64_t t0 = histd_mono_us();
	pthread_rwlockattr_t attr;
	enum hf_fsync mode = HF_FSYNC_BATCH;
	hf_driver *d;
	uint64_t gen = 0, size = 0;
	int rc, level, fd = -1;

	if (!cfg || !cfg->data_dir || !*cfg->data_dir)
		return histd_error_set(HISTD_EINVALID,
				       "data_dir is required by the file driver");
	if ((rc = parse_mode(cfg->fsync_mode, &mode)))
		return rc;
	if ((level = hf_log_level_parse(cfg->log_level)) < 0)
		return histd_error_set(HISTD_EINVALID,
				       "log level must be debug, info, warn or error (got '%s')",
				       cfg->log_level);
	if (!(d = calloc(1, sizeof(*d))))
		return enomem();
	d->base = (histd_driver){
		.version = HISTD_DRIVER_VERSION,
		.name = "file",
		.session_create = fd_session_create,
		.session_get = fd_session_get,
		.session_resolve = fd_session_resolve,
		.session_list = fd_session_list,
		.session_update = fd_session_update,
		.session_delete = fd_session_delete,
		.session_fork = fd_session_fork,
		.append = fd_append,
		.read = fd_read,
		.tool_result = fd_tool_result,
		.clear = fd_clear,
		.replace = fd_replace,
		.summary_put = fd_summary_put,
		.summary_get = fd_summary_get,
		.set_notify = fd_set_notify,
		.ping = fd_ping,
		.close = fd_close,
		.search = hf_search,
		.embedding_put = fd_embedding_put,
		.truncate = fd_truncate,
		.tenant_list = fd_tenant_list,
		.session_delete_life = fd_session_delete_life,
		.truncate_life = fd_truncate_life,
		.summary_put_life = fd_summary_put_life,
		.session_fork_life = fd_session_fork_life,
		.embedding_put_life = fd_embedding_put_life,
	};
	d->max_sessions = cfg->max_sessions_per_tenant;
	d->max_msgs = cfg->max_session_messages;
	d->max_bytes = cfg->max_session_bytes;
	d->dirfd = d->lockfd = -1;
	d->mode = mode;
	d->log_level = (enum hf_log_level)level;
	if (opt)
		d->opt = *opt;
	else
		histd_file_options_default(&d->opt);
	pthread_rwlockattr_init(&attr);
	/* Writers preferred: a stream of reads must not starve appends. */
	pthread_rwlockattr_setkind_np(&attr,
				      PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&d->lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	pthread_mutex_init(&d->compact_mu, NULL);
	pthread_mutex_init(&d->maint_mu, NULL);
	pthread_cond_init(&d->maint_cv, NULL);
	if (!(d->dir = strdup(cfg->data_dir))) {
		fd_close(&d->base);
		return enomem();
	}
	if ((rc = hf_load(d, &fd, &gen, &size))) {
		fd_close(&d->base);
		return rc;
	}
	d->gen = gen;
	if ((rc = hf_wal_start(&d->wal, d, fd, gen, size))) {
		close(fd);
		fd_close(&d->base);
		return rc;
	}
	if ((rc = hf_maint_start(d))) {
		fd_close(&d->base);
		return rc;
	}
	/* Above the garbage ratio: compact now. The data is whole and
	 * loaded whether or not that works (a full disk may have no room for
	 * the snapshot), so only a failed log stops the open; anything else
	 * is retried later, as online. */
	if (hf_compact_wanted(d) && (rc = hf_compact(d, 0))) {
		if (hf_wal_failed(d->wal)) {
			fd_close(&d->base);
			return rc;
		}
		hf_maint_failed(d);
	}
	d->open_us = (uint64_t)(histd_mono_us() - t0);
	*out = &d->base;
	return 0;
}

int
histd_file_driver_open(const histd_driver_config *cfg, histd_driver **out)
{
	return histd_file_driver_open_ex(cfg, NULL, out);
}
