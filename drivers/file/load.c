/*
 * The file driver's start-up: the data directory, its lock, and recovery
 * of the state from the newest snapshot and the logs after it (see file.h
 * for the layout and the corruption policy).
 *
 * Files are mapped read-only and checked frame by frame; a record's bytes
 * are copied into the state, never referenced in the mapping.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* ---------------------------------------------------------------------- */
/* Replay                                                                  */

typedef struct replay {
	hf_driver *d;
	hf_mapping *map;        /* the file: records point into it */
	char path[4200];
	uint64_t off;           /* of the frame being applied */
	int snapshot;
	uint64_t version;       /* the file's format (HF_FORMAT_VERSION) */
	/* Snapshots: the session being filled and its final revision. */
	hf_session *cur;
	uint64_t cur_revision;
	uint64_t n_sessions, n_records;
	int ended;
} replay;

static int
corrupt(replay *r, const char *why)
{
	return histd_error_set(HISTD_ECORRUPT,
			       "data file %s: the record at offset %llu %s; histd will not open this data (see README, file driver recovery)",
			       r->path, (unsigned long long)r->off, why);
}

/* The session a log record names, or NULL. */
static hf_session *
rd_session(replay *r, hf_rd *rd)
{
	size_t tl, il;
	const uint8_t *t = hf_get_bytes(rd, &tl);
	const uint8_t *i = hf_get_bytes(rd, &il);

	if (rd->bad)
		return NULL;
	return hf_session_find(r->d, (const char *)t, tl, (const char *)i, il);
}

/* The server time of a change, which records carry from format 2 on;
 * 0 (unknown) in an older file. */
static int64_t
rd_at(const replay *r, hf_rd *rd)
{
	return r->version >= 2 ? (int64_t)hf_get_varint(rd) : 0;
}

/* The record fields of a session to create, decoded into in (strings the
 * caller frees with free_in). */
static int
rd_session_in(hf_rd *rd, histd_session *in)
{
	size_t cl;
	int oom = 0, rc;

	if (!(in->id = hf_get_strdup(rd, &oom)))
		return oom ? HISTD_ENOMEM : HISTD_ECORRUPT;
	if (!in->id[0])
		return HISTD_ECORRUPT;      /* no driver writes an empty id */
	if ((rc = hf_get_kv(rd, &in->context_keys, &in->n_context_keys)) ||
	    (rc = hf_get_kv(rd, &in->labels, &in->n_labels)))
		return rc;
	in->config = (uint8_t *)hf_get_bytes(rd, &cl);
	in->config_len = cl;
	in->created_at_us = (int64_t)hf_get_varint(rd);
	return rd->bad ? HISTD_ECORRUPT : 0;
}

static void
free_in(histd_session *in)
{
	free(in->id);
	histd_kv_free(in->context_keys, in->n_context_keys);
	histd_kv_free(in->labels, in->n_labels);
}

static int
oom_or(replay *r, int rc, const char *why)
{
	if (rc == HISTD_ENOMEM)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	return corrupt(r, why);
}

static int
do_create(replay *r, hf_rd *rd)
{
	size_t tl;
	const uint8_t *t = hf_get_bytes(rd, &tl);
	histd_session in = { 0 };
	hf_session *s;
	int rc = rd_session_in(rd, &in);

	if (rc || rd->p != rd->end || memchr(t, 0, tl)) {
		free_in(&in);
		return oom_or(r, rc, "does not decode");
	}
	s = hf_session_new(&in);
	free_in(&in);
	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if ((rc = hf_session_insert(r->d, (const char *)t, tl, s))) {
		hf_session_destroy(r->d, s);
		return oom_or(r, rc, "creates a session that exists");
	}
	return 0;
}

static int
do_update(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);
	int64_t now = (int64_t)hf_get_varint(rd);
	int has_labels = hf_get_u8(rd), has_config;
	histd_kv *labels = NULL;
	size_t n_labels = 0, cl;
	const uint8_t *config;
	uint8_t *copy = NULL;
	int rc = hf_get_kv(rd, &labels, &n_labels);

	has_config = hf_get_u8(rd);
	config = hf_get_bytes(rd, &cl);
	if (rc || rd->bad || rd->p != rd->end) {
		histd_kv_free(labels, n_labels);
		return oom_or(r, rc, "does not decode");
	}
	if (!s || rev != s->revision + 1) {
		histd_kv_free(labels, n_labels);
		return corrupt(r, "does not follow its session's state");
	}
	if (has_config && cl) {
		if (!(copy = malloc(cl))) {
			histd_kv_free(labels, n_labels);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
		memcpy(copy, config, cl);
	}
	if (!has_labels) {
		histd_kv_free(labels, n_labels);
		labels = NULL;
		n_labels = 0;
	}
	hf_apply_update(s, labels, n_labels, has_labels, copy,
			has_config ? cl : 0, has_config, now);
	s->meta_bytes = 0;
	hf_session_account(r->d, s);
	return 0;
}

static int
do_delete(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);

	if (rd->bad || rd->p != rd->end)
		return corrupt(r, "does not decode");
	if (!s || rev != s->revision + 1)
		return corrupt(r, "does not follow its session's state");
	hf_session_remove(r->d, s);
	hf_session_destroy(r->d, s);
	return 0;
}

static int
do_fork(replay *r, hf_rd *rd)
{
	size_t tl;
	const uint8_t *t = rd->p;
	hf_session *src = rd_session(r, rd), *f;
	uint64_t src_rev = hf_get_varint(rd), up_to = hf_get_varint(rd);
	histd_session in = { 0 };
	int rc = rd_session_in(rd, &in);

	/* The tenant again, for the insert. */
	if (!rc) {
		hf_rd again = { t, rd->end, 0 };

		t = hf_get_bytes(&again, &tl);
	}
	if (rc || rd->p != rd->end) {
		free_in(&in);
		return oom_or(r, rc, "does not decode");
	}
	if (!src || src->revision != src_rev) {
		free_in(&in);
		return corrupt(r, "forks a session that is not in the logged state");
	}
	f = hf_fork_build(src, up_to, &in);
	free_in(&in);
	if (!f)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if ((rc = hf_session_insert(r->d, (const char *)t, tl, f))) {
		hf_session_destroy(r->d, f);
		return oom_or(r, rc, "creates a session that exists");
	}
	return 0;
}

/* The messages of an append or replace record; small appends (the usual)
 * use the inline arrays, so a replay allocates nothing per record. */
#define SMALL_BATCH 4
#define SMALL_REFS 8

typedef struct msgs {
	hf_driver *d;
	hf_mapping *map;
	histd_record *recs;
	hf_msgrefs *refs;
	hf_ref *pool;
	size_t *at;             /* pool offsets: calls, then results */
	size_t k, n_pool, cap_pool;
	histd_record recs_in[SMALL_BATCH];
	hf_msgrefs refs_in[SMALL_BATCH];
	size_t at_in[2 * SMALL_BATCH];
	hf_ref pool_in[SMALL_REFS];
} msgs;

static void
msgs_free(msgs *m)
{
	for (size_t i = 0; m->recs && i < m->k; i++)
		hf_free_data(m->d, m->recs[i].data, m->recs[i].len);
	if (m->recs != m->recs_in)
		free(m->recs);
	if (m->refs != m->refs_in)
		free(m->refs);
	if (m->at != m->at_in)
		free(m->at);
	if (m->pool != m->pool_in)
		free(m->pool);
	m->recs = NULL;
	m->k = 0;
}

static int
rd_refs(hf_rd *rd, msgs *m, size_t *n_out)
{
	uint64_t n = hf_get_varint(rd);

	if (rd->bad || n > (uint64_t)(rd->end - rd->p))
		return HISTD_ECORRUPT;
	*n_out = (size_t)n;
	if (m->n_pool + n > m->cap_pool) {
		size_t cap = m->cap_pool * 2;
		hf_ref *v;

		while (cap < m->n_pool + n)
			cap *= 2;
		if (!(v = malloc(cap * sizeof(*v))))
			return HISTD_ENOMEM;
		memcpy(v, m->pool, m->n_pool * sizeof(*v));
		if (m->pool != m->pool_in)
			free(m->pool);
		m->pool = v;
		m->cap_pool = cap;
	}
	for (size_t j = 0; j < n; j++) {
		size_t len;
		const uint8_t *id = hf_get_bytes(rd, &len);

		if (!id)
			return HISTD_ECORRUPT;
		m->pool[m->n_pool++] = (hf_ref){ (const char *)id, len, 0 };
	}
	return 0;
}

/* Decodes k messages with seqs first.. into m; their bytes stay in the
 * mapping. heap: the records array must be malloc'ed (replace keeps it). */
static int
rd_msgs(hf_rd *rd, msgs *m, uint64_t first, int heap)
{
	uint64_t k = hf_get_varint(rd);
	int rc = 0;

	m->pool = m->pool_in;
	m->cap_pool = SMALL_REFS;
	m->recs = m->recs_in;
	m->refs = m->refs_in;
	m->at = m->at_in;
	if (rd->bad || k > (uint64_t)(rd->end - rd->p))
		return HISTD_ECORRUPT;
	if (!k) {
		m->recs = NULL;         /* an empty replace stores no array */
		return 0;
	}
	if (heap || k > SMALL_BATCH) {
		if (!(m->recs = calloc((size_t)k, sizeof(*m->recs))))
			return HISTD_ENOMEM;
	}
	if (k > SMALL_BATCH &&
	    (!(m->refs = calloc((size_t)k, sizeof(*m->refs))) ||
	     !(m->at = calloc(2 * (size_t)k, sizeof(*m->at)))))
		return HISTD_ENOMEM;
	for (size_t i = 0; i < k && rc == 0; i++) {
		uint64_t tok = hf_get_varint(rd);
		size_t len = (size_t)hf_get_varint(rd);
		const uint8_t *data = rd->p;

		if (rd->bad || len == 0 || len > (size_t)(rd->end - rd->p) ||
		    tok > UINT32_MAX || len > UINT32_MAX) {
			rc = HISTD_ECORRUPT;
			break;
		}
		rd->p += len;
		/* The bytes stay in the file's mapping (never written). */
		m->recs[i] = (histd_record){ .seq = first + i,
					     .token_estimate = (uint32_t)tok,
					     .len = (uint32_t)len,
					     .data = (uint8_t *)(uintptr_t)data };
		m->map->refs++;
		m->k = i + 1;
		m->at[i] = m->n_pool;
		if ((rc = rd_refs(rd, m, &m->refs[i].n_calls)))
			break;
		m->at[k + i] = m->n_pool;
		rc = rd_refs(rd, m, &m->refs[i].n_results);
	}
	/* Pointers once the pool stopped moving. */
	for (size_t i = 0; rc == 0 && i < k; i++) {
		m->refs[i].calls = m->pool + m->at[i];
		m->refs[i].results = m->pool + m->at[k + i];
	}
	return rc;
}

static int
do_batch(replay *r, hf_rd *rd, int replace)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);
	int64_t at = rd_at(r, rd);
	uint64_t first = hf_get_varint(rd);
	msgs m = { .d = r->d, .map = r->map };
	hf_batch b = { 0 };
	hf_idem *e = NULL, *fresh = NULL;
	uint8_t hash[HISTD_HASH_LEN];
	int64_t expires = 0;
	const uint8_t *key = NULL;
	size_t klen = 0;
	int rc = rd_msgs(rd, &m, first, replace);

	if (!rc && !replace) {
		key = hf_get_bytes(rd, &klen);
		if (klen) {
			hf_get_raw(rd, hash, sizeof(hash));
			expires = (int64_t)hf_get_varint(rd);
		}
	}
	if (rc || rd->bad || rd->p != rd->end) {
		rc = oom_or(r, rc, "does not decode");
		goto out;
	}
	if (!s || rev != s->revision + 1 || first != s->last_seq + 1 ||
	    (!replace && !m.k)) {
		rc = corrupt(r, "does not follow its session's state");
		goto out;
	}
	if ((rc = hf_batch_prepare(&b, s, m.recs, m.k, m.refs, replace))) {
		rc = oom_or(r, rc, "has tool references its session's state does not allow");
		goto out;
	}
	/* The batch's now: the bytes, and the array unless inline. */
	b.borrowed = m.recs == m.recs_in;
	m.recs = m.recs_in;
	m.k = 0;
	if (klen) {
		e = hf_map_get(&s->idem, key, klen);
		if (!e && (!(fresh = hf_idem_new((const char *)key, klen)) ||
			   hf_map_reserve(&s->idem, s->idem.n + 1))) {
			free(fresh);
			hf_batch_free(r->d, &b);
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
	}
	hf_batch_apply(r->d, &b, s, at);
	if (klen)
		hf_apply_idem(s, e, fresh, hash, expires, first, 0);
	hf_session_account(r->d, s);
out:
	msgs_free(&m);
	return rc;
}

static int
do_clear(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);
	int64_t at = rd_at(r, rd);

	if (rd->bad || rd->p != rd->end)
		return corrupt(r, "does not decode");
	if (!s || rev != s->revision + 1)
		return corrupt(r, "does not follow its session's state");
	hf_apply_clear(r->d, s, at);
	hf_session_account(r->d, s);
	return 0;
}

static int
do_truncate(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);
	int64_t at = rd_at(r, rd);
	uint64_t up_to = hf_get_varint(rd);
	void **victims;

	if (rd->bad || rd->p != rd->end)
		return corrupt(r, "does not decode");
	/* Written only when it deleted something: replay must too. */
	if (!s || rev != s->revision + 1 || up_to > s->last_seq ||
	    !hf_truncate_deletes(s, up_to))
		return corrupt(r, "does not follow its session's state");
	if (!(victims = malloc((s->tools.n ? s->tools.n : 1) * sizeof(*victims))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	hf_apply_truncate(r->d, s, up_to, victims, at);
	free(victims);
	hf_session_account(r->d, s);
	return 0;
}

static int
do_summary(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	uint64_t rev = hf_get_varint(rd);
	int64_t at = rd_at(r, rd);
	histd_record rec = { .seq = hf_get_varint(rd) };
	uint64_t tok = hf_get_varint(rd), len = hf_get_varint(rd);

	if (rd->bad || tok > UINT32_MAX || len != (uint64_t)(rd->end - rd->p))
		return corrupt(r, "does not decode");
	if (!s || rev != s->revision + 1)
		return corrupt(r, "does not follow its session's state");
	rec.token_estimate = (uint32_t)tok;
	rec.len = (uint32_t)len;
	if (hf_sums_reserve(s, s->n_sums + 1) ||
	    !(rec.data = malloc(len ? len : 1)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	memcpy(rec.data, rd->p, len);
	hf_apply_summary(s, &rec, at);
	hf_session_account(r->d, s);
	return 0;
}

static int
do_embed(replay *r, hf_rd *rd)
{
	hf_session *s = rd_session(r, rd);
	histd_vec *x;
	int rc;

	if (rd->bad)
		return corrupt(r, "does not decode");
	if (!s)
		return corrupt(r, "does not follow its session's state");
	if ((rc = hf_get_vec(rd, s, &x)))
		return oom_or(r, rc, "does not decode");
	if (!x)
		return 0;
	if (hf_vecs_reserve(s)) {
		free(x);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	hf_vec_put(s, x);
	hf_session_account(r->d, s);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Snapshot records                                                        */

/* Ends the session being filled: its revision as recorded. */
static void
snap_finish(replay *r)
{
	if (r->cur) {
		r->cur->revision = r->cur_revision;
		hf_session_account(r->d, r->cur);
		r->cur = NULL;
	}
}

static int
snap_session(replay *r, hf_rd *rd)
{
	size_t tl;
	const uint8_t *t = hf_get_bytes(rd, &tl);
	histd_session in = { 0 };
	hf_session *s;
	uint64_t n_msgs;
	int rc = rd_session_in(rd, &in);

	snap_finish(r);
	if (rc) {
		free_in(&in);
		return oom_or(r, rc, "does not decode");
	}
	s = hf_session_new(&in);
	free_in(&in);
	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	s->updated_at_us = (int64_t)hf_get_varint(rd);
	s->active_at_us = rd_at(r, rd);
	r->cur_revision = hf_get_varint(rd);
	/* Version 1 did not keep it: known only for a session never changed
	 * since it was created (or forked). */
	if (r->version < 2 && r->cur_revision == 1)
		s->active_at_us = s->created_at_us;
	s->last_seq = hf_get_varint(rd);
	s->cleared_to_seq = hf_get_varint(rd);
	n_msgs = hf_get_varint(rd);
	if (rd->bad || rd->p != rd->end || !t || !tl || memchr(t, 0, tl) ||
	    n_msgs > s->last_seq) {
		hf_session_destroy(r->d, s);
		return corrupt(r, "does not decode");
	}
	/* The count is a hint from the file: reserve at most a modest
	 * amount up front; the messages themselves grow the array. */
	if (hf_msgs_reserve(s, n_msgs < 65536 ? (size_t)n_msgs : 65536) ||
	    (rc = hf_session_insert(r->d, (const char *)t, tl, s))) {
		hf_session_destroy(r->d, s);
		return oom_or(r, rc ? rc : HISTD_ENOMEM,
			      "holds a session twice");
	}
	r->cur = s;
	r->n_sessions++;
	return 0;
}

static int
snap_msg(replay *r, hf_rd *rd, int summary)
{
	hf_session *s = r->cur;
	histd_record rec = { .seq = hf_get_varint(rd) };
	uint64_t tok = hf_get_varint(rd), len = hf_get_varint(rd);

	if (rd->bad || tok > UINT32_MAX || len != (uint64_t)(rd->end - rd->p) ||
	    (!summary && (!len || rec.seq == 0)))
		return corrupt(r, "does not decode");
	if (!s || (!summary && (rec.seq > s->last_seq ||
				(s->n_msgs && rec.seq <= s->msgs[s->n_msgs - 1].seq))))
		return corrupt(r, "does not fit the snapshot's session");
	rec.token_estimate = (uint32_t)tok;
	rec.len = (uint32_t)len;
	/* Every seq up to cleared_to_seq is gone but the system messages a
	 * truncate kept: nothing else may come back. */
	rec.data = (uint8_t *)(uintptr_t)rd->p;
	if (!summary && rec.seq <= s->cleared_to_seq && !hf_is_system(&rec))
		return corrupt(r, "does not fit the snapshot's session");
	if (summary ? hf_sums_reserve(s, s->n_sums + 1)
		    : hf_msgs_reserve(s, s->n_msgs + 1))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	/* Messages stay in the file's mapping; summaries, few, are copied. */
	if (!summary) {
		rec.data = (uint8_t *)(uintptr_t)rd->p;
		r->map->refs++;
	} else if ((rec.data = malloc(len ? len : 1))) {
		memcpy(rec.data, rd->p, len);
	} else {
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	if (summary) {
		/* Revision: set at the end; activity: as recorded. */
		hf_apply_summary(s, &rec, s->active_at_us);
	} else {
		s->msgs[s->n_msgs++] = rec;
		s->token_total += rec.token_estimate;
		s->bytes_total += rec.len;
	}
	return 0;
}

static int
snap_tool(replay *r, hf_rd *rd)
{
	hf_session *s = r->cur;
	size_t len;
	const uint8_t *id = hf_get_bytes(rd, &len);
	uint64_t call = hf_get_varint(rd), result = hf_get_varint(rd);
	hf_tool *t;

	if (rd->bad || rd->p != rd->end || !s)
		return corrupt(r, "does not decode");
	if (hf_map_get(&s->tools, id, len))
		return corrupt(r, "holds a tool call twice");
	if (hf_map_reserve(&s->tools, s->tools.n + 1) ||
	    !(t = malloc(sizeof(*t) + len + 1)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	t->call_seq = call;
	t->result_seq = result;
	t->len = (uint32_t)len;
	memcpy(t->id, id, len);
	t->id[len] = '\0';
	hf_map_put(&s->tools, t->id, t->len, t);
	s->tool_bytes += len;
	return 0;
}

static int
snap_idem(replay *r, hf_rd *rd)
{
	hf_session *s = r->cur;
	size_t len;
	const uint8_t *key = hf_get_bytes(rd, &len);
	hf_idem *e;

	if (rd->bad || !s || !len)
		return corrupt(r, "does not decode");
	if (hf_map_get(&s->idem, key, len))
		return corrupt(r, "holds an idempotency key twice");
	if (hf_map_reserve(&s->idem, s->idem.n + 1) ||
	    !(e = hf_idem_new((const char *)key, len)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	hf_get_raw(rd, e->hash, HISTD_HASH_LEN);
	e->expires_us = (int64_t)hf_get_varint(rd);
	e->first_seq = hf_get_varint(rd);
	e->last_seq = hf_get_varint(rd);
	e->revision = hf_get_varint(rd);
	if (rd->bad || rd->p != rd->end) {
		free(e);
		return corrupt(r, "does not decode");
	}
	hf_map_put(&s->idem, e->key, e->len, e);
	s->idem_bytes += len;
	return 0;
}

static int
snap_embed(replay *r, hf_rd *rd)
{
	hf_session *s = r->cur;
	histd_vec *x;
	int rc;

	if (!s)
		return corrupt(r, "does not decode");
	if ((rc = hf_get_vec(rd, s, &x)))
		return oom_or(r, rc, "does not decode");
	if (!x)
		return corrupt(r, "does not fit the snapshot's session");
	if (hf_vecs_reserve(s)) {
		free(x);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	hf_vec_put(s, x);
	return 0;
}

static int
snap_end(replay *r, hf_rd *rd)
{
	uint64_t sessions = hf_get_varint(rd), records = hf_get_varint(rd);

	snap_finish(r);
	if (rd->bad || rd->p != rd->end || sessions != r->n_sessions ||
	    records != r->n_records)
		return corrupt(r, "does not match what the snapshot holds");
	r->ended = 1;
	return 0;
}

static int
apply_frame(replay *r, const uint8_t *body, uint32_t len)
{
	hf_rd rd = { body + 1, body + len, 0 };
	uint8_t type = body[0];

	if (r->ended)
		return corrupt(r, "follows the end of the snapshot");
	if (r->snapshot) {
		if (type != HF_T_S_END)
			r->n_records++;
		switch (type) {
		case HF_T_S_SESSION: return snap_session(r, &rd);
		case HF_T_S_MSG: return snap_msg(r, &rd, 0);
		case HF_T_S_SUMMARY: return snap_msg(r, &rd, 1);
		case HF_T_S_TOOL: return snap_tool(r, &rd);
		case HF_T_S_IDEM: return snap_idem(r, &rd);
		case HF_T_S_EMBED: return snap_embed(r, &rd);
		case HF_T_S_END: return snap_end(r, &rd);
		default: return corrupt(r, "has a type snapshots do not hold");
		}
	}
	switch (type) {
	case HF_T_CREATE: return do_create(r, &rd);
	case HF_T_UPDATE: return do_update(r, &rd);
	case HF_T_DELETE: return do_delete(r, &rd);
	case HF_T_FORK: return do_fork(r, &rd);
	case HF_T_APPEND: return do_batch(r, &rd, 0);
	case HF_T_CLEAR: return do_clear(r, &rd);
	case HF_T_REPLACE: return do_batch(r, &rd, 1);
	case HF_T_SUMMARY: return do_summary(r, &rd);
	case HF_T_EMBED: return do_embed(r, &rd);
	case HF_T_TRUNCATE: return do_truncate(r, &rd);
	default: return corrupt(r, "has a type logs do not hold");
	}
}

/* Whether the header frame at p names this kind and generation, in a
 * format this histd reads (1..HF_FORMAT_VERSION, *version). *prev_len:
 * the length the log before it ended at, or 0 if the header does not say
 * (a first log, a snapshot, a histd before it recorded that). */
static int
header_ok(const uint8_t *p, size_t size, const char *magic, uint64_t gen,
	  size_t *hdr_len, uint64_t *version, uint64_t *prev_len)
{
	uint32_t len;
	hf_rd rd;
	char m[HF_MAGIC_LEN];

	if (hf_frame_check(p, size, &len) != HF_FRAME_OK || p[HF_FRAME_HEADER] != HF_T_FILE)
		return 0;
	rd = (hf_rd){ p + HF_FRAME_HEADER + 1, p + HF_FRAME_HEADER + len, 0 };
	hf_get_raw(&rd, m, sizeof(m));
	*version = hf_get_varint(&rd);
	if (memcmp(m, magic, HF_MAGIC_LEN) != 0 || *version < 1 ||
	    *version > HF_FORMAT_VERSION || hf_get_varint(&rd) != gen ||
	    rd.bad)
		return 0;
	*prev_len = rd.p < rd.end ? hf_get_varint(&rd) : 0;
	if (rd.bad)
		return 0;
	*hdr_len = HF_FRAME_HEADER + len;
	return 1;
}

/* The log before r's (generation gen) ended at len bytes when replayed,
 * where r's header says it ended at said: records were lost from its end
 * (or added to it) after the writer closed it. */
static int
prev_len_differs(const replay *r, uint64_t gen, uint64_t len, uint64_t said)
{
	char name[64];

	hf_log_name(name, sizeof(name), gen - 1);
	return histd_error_set(HISTD_ECORRUPT,
			       "data file %s/%s ends at %llu bytes but %s says it ended at %llu: %s; histd will not open this data (see README, file driver recovery)",
			       r->d->dir, name, (unsigned long long)len, r->path,
			       (unsigned long long)said,
			       len < said ? "truncated" : "it grew after the next log began");
}

/* Cuts the last log at off and says so (at level, with what): a torn
 * record, or the zeros the writer had prepared ahead of the last record,
 * which only a histd that did not stop cleanly leaves (said too, because
 * zeros are also what a lost disk block reads as). */
static int
cut_tail(replay *r, int fd, uint64_t off, uint64_t size,
	 enum hf_log_level level, const char *what)
{
	char o[32], n[32];

	if (ftruncate(fd, (off_t)off) != 0 || fdatasync(fd) != 0)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot truncate the end of %s: %s",
				       r->path, strerror(errno));
	if (off == size)
		return 0;       /* an empty file: nothing was cut */
	snprintf(o, sizeof(o), "%llu", (unsigned long long)off);
	snprintf(n, sizeof(n), "%llu", (unsigned long long)(size - off));
	hf_log_line(r->d, level, what, "file", r->path, "offset", o, "bytes", n,
		    NULL);
	return 0;
}

#define TORN "file driver: truncated a torn record at the end of the log"

/*
 * Checks frames ahead of the replay on another core: the checksums cost
 * more than the rest of the load. The verifier walks the chain of frame
 * lengths and checks two frames in three; the replay checks the third
 * itself, before applying it. A frame is applied only once it and every
 * frame before it passed, so a damaged length the verifier walked past
 * unchecked stops the replay at that frame, as it would alone.
 */
typedef struct verifier {
	const uint8_t *p;
	size_t size, start;
	_Atomic size_t ok_to;   /* every frame before it is whole and valid */
	_Atomic int done;       /* ok_to is final: the end, or a bad frame */
	_Atomic int stop;
	pthread_t th;
	int started;
} verifier;

#define VERIFY_PUBLISH (256u << 10)
#define VERIFY_MIN_FILE (4u << 20)

static uint32_t
frame_len(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* Frame idx (from 0 after the header) is the replay's to check. */
static int
replay_checks(size_t idx)
{
	return idx % 3 == 0;
}

static void *
verify_main(void *arg)
{
	verifier *v = arg;
	size_t off = v->start, published = off;

	for (size_t idx = 0; off < v->size &&
	     !atomic_load_explicit(&v->stop, memory_order_relaxed); idx++) {
		uint32_t len;

		if (!replay_checks(idx)) {
			if (hf_frame_check(v->p + off, v->size - off, &len) != HF_FRAME_OK)
				break;
		} else {
			/* Walked only: the length must at least fit. */
			if (v->size - off < HF_FRAME_HEADER)
				break;
			len = frame_len(v->p + off);
			if (!len || len > HF_FRAME_MAX ||
			    len > v->size - off - HF_FRAME_HEADER)
				break;
		}
		off += HF_FRAME_HEADER + (size_t)len;
		if (off - published >= VERIFY_PUBLISH) {
			atomic_store_explicit(&v->ok_to, off, memory_order_release);
			published = off;
		}
	}
	atomic_store_explicit(&v->ok_to, off, memory_order_release);
	atomic_store_explicit(&v->done, 1, memory_order_release);
	return NULL;
}

/* How far frames from off on are known valid (waiting for the verifier
 * if it is behind); off itself when the frame at off must be checked
 * here. */
static size_t
verified_to(verifier *v, size_t off)
{
	if (!v->started)
		return off;
	for (;;) {
		int done = atomic_load_explicit(&v->done, memory_order_acquire);
		size_t ok = atomic_load_explicit(&v->ok_to, memory_order_acquire);

		if (off < ok || done)
			return ok > off ? ok : off;
		sched_yield();
	}
}

/* Stops the verifier, if it runs: before the file is cut, since it may
 * be reading past the cut (pages beyond a file's end fault). */
static void
verifier_stop(verifier *v)
{
	if (v->started) {
		atomic_store(&v->stop, 1);
		pthread_join(v->th, NULL);
		v->started = 0;
	}
}

/*
 * Replays one file. last: the last log, whose torn tail is cut (and whose
 * torn header is rewritten). prev_size: the size of log-<gen - 1> if it
 * was replayed just before, which the header (if it records one) must
 * match; else 0. *size_out: its size afterwards; *version: its format.
 */
static int
replay_file(hf_driver *d, uint64_t gen, int snapshot, int last,
	    uint64_t prev_size, uint64_t *size_out, uint64_t *version)
{
	replay r = { .d = d, .snapshot = snapshot,
		     .version = HF_FORMAT_VERSION };
	verifier v = { 0 };
	char name[64];
	const uint8_t *p = NULL;
	struct stat st;
	size_t size, off = 0, hdr, ok_to = 0, idx = 0;
	uint64_t said = 0;
	int fd, rc = 0;

	if (snapshot)
		hf_snapshot_name(name, sizeof(name), gen);
	else
		hf_log_name(name, sizeof(name), gen);
	snprintf(r.path, sizeof(r.path), "%s/%s", d->dir, name);
	fd = openat(d->dirfd, name, (last ? O_RDWR : O_RDONLY) | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot open %s: %s",
				     r.path, strerror(errno));
		goto out;
	}
	size = (size_t)st.st_size;
	if (size) {
		if (!(r.map = hf_mapping_open(d, fd, size))) {
			rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot map %s: %s",
					     r.path, strerror(errno));
			goto out;
		}
		/* Pinned while replayed: a clear in it must not unmap it. */
		r.map->refs++;
		p = r.map->base;
	}
	if (!header_ok(p, size, snapshot ? HF_MAGIC_SNAPSHOT : HF_MAGIC_LOG, gen,
		       &hdr, &r.version, &said)) {
		r.version = HF_FORMAT_VERSION;  /* rewritten so, below */
		hf_buf b = { 0 };

		/* A log created just before a crash: nothing in it could
		 * have been acknowledged. */
		if (!last || snapshot || (size && hf_frame_find(p + 1, size - 1))) {
			rc = corrupt(&r, "is not a valid file header");
			goto out;
		}
		if ((rc = cut_tail(&r, fd, 0, size, HF_LOG_WARN, TORN)))
			goto out;
		hf_put_file_header(&b, HF_MAGIC_LOG, gen, prev_size);
		rc = b.oom ? HISTD_ENOMEM : hf_write_all(fd, b.p, b.len);
		if (rc == 0 && fdatasync(fd) != 0)
			rc = -errno;
		*size_out = b.len;
		hf_buf_free(&b);
		if (rc)
			rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot write %s",
					     r.path);
		goto out;
	}
	if (prev_size && said && said != prev_size) {
		rc = prev_len_differs(&r, gen, prev_size, said);
		goto out;
	}
	off = hdr;
	if (size - off >= VERIFY_MIN_FILE) {
		v = (verifier){ .p = p, .size = size, .start = off };
		atomic_init(&v.ok_to, off);
		v.started = pthread_create(&v.th, NULL, verify_main, &v) == 0;
	}
	while (off < size) {
		uint32_t len = 0;
		enum hf_frame_status fs = HF_FRAME_OK;

		if (off >= ok_to)
			ok_to = verified_to(&v, off);
		if (off < ok_to && !replay_checks(idx))
			len = frame_len(p + off);
		else
			fs = hf_frame_check(p + off, size - off, &len);
		r.off = off;
		if (fs == HF_FRAME_OK) {
			if ((rc = apply_frame(&r, p + off + HF_FRAME_HEADER, len)))
				goto out;
			off += HF_FRAME_HEADER + (size_t)len;
			idx++;
			continue;
		}
		/* Zeros from a frame boundary to the end: the space the
		 * writer had prepared, not a record. Only the last log can
		 * have any: a log is trimmed and synced before the next one
		 * begins, and a snapshot is written exact. */
		if (hf_all_zero(p + off, size - off)) {
			if (!last || snapshot) {
				rc = corrupt(&r, "is zeros (only the last log may end "
					     "in zeros)");
				goto out;
			}
			verifier_stop(&v);
			if ((rc = cut_tail(&r, fd, off, size, HF_LOG_INFO,
					   "file driver: cut the zeros prepared "
					   "after the last record (histd had not "
					   "stopped cleanly)")))
				goto out;
			size = off;
			break;
		}
		/* A bad frame: a torn tail only if nothing valid follows,
		 * and only in the last log. One whose extent ends in the
		 * prepared zeros is the torn last record, whatever frames
		 * its own bytes hold (a message may hold anything). */
		if (!last || snapshot ||
		    (!hf_frame_torn_in_zeros(p + off, size - off) &&
		     hf_frame_find(p + off + 1, size - off - 1))) {
			const char *why = "fails its checksum";

			/* Cut short: by the end of a file that should be
			 * whole (a snapshot, a log before the last), or
			 * with valid records after it in the last log. */
			if (fs == HF_FRAME_SHORT)
				why = snapshot ? "is cut short: the snapshot "
					"ends inside it"
				    : !last ? "is cut short: the log ends "
					"inside it, and a log before the last "
					"is always whole"
				    : "is cut short and followed by valid "
					"records";
			rc = corrupt(&r, why);
			goto out;
		}
		verifier_stop(&v);
		if ((rc = cut_tail(&r, fd, off, size, HF_LOG_WARN, TORN)))
			goto out;
		size = off;
	}
	if (snapshot && !r.ended) {
		r.off = off;
		rc = corrupt(&r, "is missing: the snapshot has no end");
		goto out;
	}
	*size_out = size;
out:
	verifier_stop(&v);
	snap_finish(&r);
	*version = r.version;
	if (r.map)
		r.map->refs--;          /* unmapped by hf_load if unused */
	if (fd >= 0)
		close(fd);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* The directory                                                           */

typedef struct gens {
	uint64_t *v;
	size_t n, cap;
} gens;

static int
gens_add(gens *g, uint64_t x)
{
	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 8;
		uint64_t *v = realloc(g->v, cap * sizeof(*v));

		if (!v)
			return -1;
		g->v = v;
		g->cap = cap;
	}
	g->v[g->n++] = x;
	return 0;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static int
parse_gen(const char *name, const char *prefix, uint64_t *gen)
{
	size_t pl = strlen(prefix);
	char *end;

	if (strncmp(name, prefix, pl) != 0 || strlen(name) != pl + 16 + 4 ||
	    strcmp(name + pl + 16, ".hsd") != 0)
		return 0;
	*gen = strtoull(name + pl, &end, 16);
	return end == name + pl + 16 && *gen > 0;
}

/* Lists logs and snapshots; removes leftover temporary files. */
static int
scan_dir(hf_driver *d, gens *logs, gens *snaps)
{
	int dfd = dup(d->dirfd), removed = 0;
	struct dirent *e;
	DIR *dir;

	if (dfd < 0 || !(dir = fdopendir(dfd))) {
		if (dfd >= 0)
			close(dfd);
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot list data directory %s: %s", d->dir,
				       strerror(errno));
	}
	rewinddir(dir);
	while ((e = readdir(dir))) {
		uint64_t g;
		size_t nl = strlen(e->d_name);

		if (parse_gen(e->d_name, "log-", &g)) {
			if (gens_add(logs, g))
				goto oom;
		} else if (parse_gen(e->d_name, "snapshot-", &g)) {
			if (gens_add(snaps, g))
				goto oom;
		} else if (nl > 4 && strcmp(e->d_name + nl - 4, ".tmp") == 0 &&
			   strncmp(e->d_name, "snapshot-", 9) == 0) {
			/* A compaction that did not finish. */
			unlinkat(d->dirfd, e->d_name, 0);
			removed = 1;
		}
	}
	closedir(dir);
	if (logs->n)
		qsort(logs->v, logs->n, sizeof(*logs->v), cmp_u64);
	if (snaps->n)
		qsort(snaps->v, snaps->n, sizeof(*snaps->v), cmp_u64);
	return removed ? hf_sync_dir(d) : 0;
oom:
	closedir(dir);
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

/* flock(fd) without waiting; what: "" for the directory, or the file's
 * name in it. */
static int
lock_fd(hf_driver *d, int fd, const char *what)
{
	if (flock(fd, LOCK_EX | LOCK_NB) == 0)
		return 0;
	if (errno == EWOULDBLOCK)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "data directory %s is in use by another process",
				       d->dir);
	return histd_error_set(HISTD_EUNAVAILABLE, "cannot lock %s%s: %s", d->dir,
			       what, strerror(errno));
}

static int
open_dir(hf_driver *d)
{
	int rc;

	if (mkdir(d->dir, 0700) == 0) {
		/* A new directory: its name must be durable too, or a crash
		 * could take it with everything acknowledged in it. */
		char *parent = strdup(d->dir), *slash;
		size_t n;
		int pfd, err = 0;

		if (!parent)
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		n = strlen(parent);
		while (n > 1 && parent[n - 1] == '/')   /* "data/" */
			parent[--n] = '\0';
		slash = strrchr(parent, '/');
		if (slash == parent)
			slash[1] = '\0';
		else if (slash)
			*slash = '\0';
		pfd = open(slash ? parent : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (pfd < 0 || fsync(pfd) != 0)
			err = errno;
		if (pfd >= 0)
			close(pfd);
		if (err) {
			rc = histd_error_set(HISTD_EUNAVAILABLE,
					     "cannot make the new data directory %s durable (fsync of %s: %s)",
					     d->dir, slash ? parent : ".", strerror(err));
			free(parent);
			rmdir(d->dir);  /* so that the next start checks again */
			return rc;
		}
		free(parent);
	} else if (errno != EEXIST) {
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot create data directory %s: %s", d->dir,
				       strerror(errno));
	}
	d->dirfd = open(d->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (d->dirfd < 0)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot open data directory %s: %s", d->dir,
				       strerror(errno));
	/* The directory itself is locked: a LOCK file can be removed while
	 * histd runs, and the next histd would then lock a new one. LOCK is
	 * locked too, for a histd of an earlier version (which locks only
	 * that) starting on the same directory. */
	if ((rc = lock_fd(d, d->dirfd, "")))
		return rc;
	d->lockfd = openat(d->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (d->lockfd < 0)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot open %s/LOCK: %s", d->dir,
				       strerror(errno));
	return lock_fd(d, d->lockfd, "/LOCK");
}

int
hf_remove_before(hf_driver *d, uint64_t gen)
{
	gens logs = { 0 }, snaps = { 0 };
	char name[64];
	int removed = 0, rc;

	if ((rc = scan_dir(d, &logs, &snaps)))
		goto out;
	for (size_t i = 0; i < logs.n + snaps.n; i++) {
		int is_log = i < logs.n;
		uint64_t g = is_log ? logs.v[i] : snaps.v[i - logs.n];

		if (g >= gen)
			continue;
		if (is_log)
			hf_log_name(name, sizeof(name), g);
		else
			hf_snapshot_name(name, sizeof(name), g);
		if (unlinkat(d->dirfd, name, 0) == 0)
			removed = 1;
		else if (errno != ENOENT)
			/* Garbage that is never read again: said, and left
			 * for the next try. */
			hf_log_line(d, HF_LOG_WARN, "file driver: cannot remove "
				    "an obsolete file", "dir", d->dir, "file",
				    name, "error", strerror(errno), NULL);
	}
	rc = removed ? hf_sync_dir(d) : 0;
out:
	free(logs.v);
	free(snaps.v);
	return rc;
}

/* Syncs log-<gen> to the disk. */
static int
log_sync(hf_driver *d, uint64_t gen)
{
	char name[64];
	int fd, rc = 0;

	hf_log_name(name, sizeof(name), gen);
	fd = openat(d->dirfd, name, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || fdatasync(fd) != 0)
		rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot sync %s/%s: %s",
				     d->dir, name, strerror(errno));
	if (fd >= 0)
		close(fd);
	return rc;
}

int
hf_load(hf_driver *d, int *fd_out, uint64_t *gen_out, uint64_t *size_out)
{
	gens logs = { 0 }, snaps = { 0 };
	uint64_t base = 0, first = 1, last_gen, size = 0;
	uint64_t version = HF_FORMAT_VERSION;
	size_t i0 = 0;
	char name[64];
	int rc, fd;

	if ((rc = open_dir(d)) || (rc = scan_dir(d, &logs, &snaps)))
		goto out;
	if (snaps.n)
		base = first = snaps.v[snaps.n - 1];
	while (i0 < logs.n && logs.v[i0] < first)
		i0++;
	/* The logs from the snapshot's generation on, with no gap. */
	for (size_t i = i0; i < logs.n; i++) {
		if (logs.v[i] != first + (i - i0)) {
			hf_log_name(name, sizeof(name), first + (i - i0));
			rc = histd_error_set(HISTD_ECORRUPT,
					     "data directory %s: %s is missing; histd will not open this data (see README, file driver recovery)",
					     d->dir, name);
			goto out;
		}
	}
	/* Compaction creates log-<gen> before snapshot-<gen>: a snapshot
	 * without its log lost what came after it. */
	if (base && i0 == logs.n) {
		hf_log_name(name, sizeof(name), base);
		rc = histd_error_set(HISTD_ECORRUPT,
				     "data directory %s: %s is missing; histd will not open this data (see README, file driver recovery)",
				     d->dir, name);
		goto out;
	}
	if (base) {
		if ((rc = replay_file(d, base, 1, 0, 0, &size, &version)))
			goto out;
		d->base_bytes += size;
	}
	for (size_t i = i0; i < logs.n; i++) {
		int last = i + 1 == logs.n;

		/* A log after the first checks the one before it. */
		if ((rc = replay_file(d, logs.v[i], 0, last, i > i0 ? size : 0,
				      &size, &version)))
			goto out;
		if (!last)
			d->base_bytes += size;
	}
	hf_mapping_sweep(d);
	if ((rc = hf_remove_before(d, first)))
		goto out;
	if (i0 < logs.n && version < HF_FORMAT_VERSION) {
		/* The last log is of an older format, whose records the next
		 * ones would not decode as: it ends here (synced, as every
		 * log before the last is) and the next generation begins. */
		if ((rc = log_sync(d, logs.v[logs.n - 1])))
			goto out;
		d->base_bytes += size;
	}
	if (i0 == logs.n || version < HF_FORMAT_VERSION) {
		/* A new directory, or a new log after an older one. */
		last_gen = i0 == logs.n ? first : logs.v[logs.n - 1] + 1;
		fd = hf_log_create(d, last_gen, i0 == logs.n ? 0 : size);
		if (fd < 0) {
			rc = fd;
			goto out;
		}
		size = (uint64_t)lseek(fd, 0, SEEK_END);
	} else {
		last_gen = logs.v[logs.n - 1];
		hf_log_name(name, sizeof(name), last_gen);
		fd = openat(d->dirfd, name, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || lseek(fd, 0, SEEK_END) != (off_t)size) {
			rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot open %s/%s: %s",
					     d->dir, name, strerror(errno));
			if (fd >= 0)
				close(fd);
			goto out;
		}
	}
	*fd_out = fd;
	*gen_out = last_gen;
	*size_out = size;
out:
	free(logs.v);
	free(snaps.v);
	return rc;
}
