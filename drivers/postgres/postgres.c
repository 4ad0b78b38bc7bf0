/*
 * The postgres driver: histd's storage shared by several replicas.
 *
 * Every write is one transaction on a pooled connection, in at most two
 * round trips (libpq pipeline mode): BEGIN and SELECT ... FOR UPDATE of
 * the session row (the compare-and-swap on revision is checked in C with
 * the row locked), then the writes, a pg_notify for the other replicas
 * and COMMIT. The change hook runs after COMMIT returned (watch.c orders
 * it per session). Appends are batched across callers (append.c).
 *
 * Reads are single statements (one snapshot), the session row and its
 * messages in one UNION ALL.
 *
 * Limits (histd_driver_config) hold across replicas because PostgreSQL
 * decides them: with max_sessions_per_tenant, a create, resolve or fork
 * takes the tenant's advisory lock (ST_TENANT_LOCK) and counts the
 * tenant's sessions in its insert, in the same round trip; the session
 * size limits are checked against the locked session row (append.c, and
 * fork below).
 */
#include "postgres.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "histd_wire.h"

#include "pg.h"

static int
not_found(void)
{
	return histd_error_set(HISTD_ENOTFOUND, "session not found");
}

static int
conflict(uint64_t expected, uint64_t current, uint64_t *current_out)
{
	*current_out = current;
	return histd_error_set(HISTD_ECONFLICT,
			       "expected_revision %" PRIu64 " does not match the "
			       "session's revision %" PRIu64, expected, current);
}

/* A create that the tenant's limit stopped (a row of ST_*_LIMITED: the
 * tenant's sessions, what is taken): EEXISTS when the id or the keys are
 * taken, as without a limit; else ELIMIT. */
static int
tenant_full(const pg_driver *d, const PGresult *r, int row)
{
	int taken = pg_r_i32(r, row, 1);

	if (taken == 1)
		return histd_error_set(HISTD_EEXISTS, "session id already exists");
	if (taken == 2)
		return histd_error_set(HISTD_EEXISTS,
				       "another session has the same context_keys");
	return histd_error_set(HISTD_ELIMIT,
			       "the tenant has %" PRIu64 " sessions; the limit is %" PRIu64,
			       (uint64_t)pg_r_i64(r, row, 0), d->max_sessions);
}

/* ---------------------------------------------------------------------- */
/* Values                                                                  */

/* The parameters of a new session ($1..$6 of session_create, resolve and
 * fork_create). The JSON strings are the caller's to free. */
static int
session_params(pg_params *p, const histd_session *in, const char *tenant,
	       const uint8_t *config, size_t config_len, char **keys_json,
	       char **labels_json)
{
	int rc;

	*keys_json = *labels_json = NULL;
	if ((rc = pg_kv_json(in->context_keys, in->n_context_keys, 1,
			     "context_keys", keys_json)) ||
	    (rc = pg_kv_json(in->labels, in->n_labels, 0, "labels", labels_json))) {
		free(*keys_json);
		*keys_json = NULL;
		return rc;
	}
	if (!pg_utf8_ok(tenant, strlen(tenant)) || !pg_utf8_ok(in->id, strlen(in->id))) {
		free(*keys_json);
		free(*labels_json);
		*keys_json = *labels_json = NULL;
		return histd_error_set(HISTD_EINVALID, "session id is not valid UTF-8");
	}
	pg_p_text(p, tenant);
	pg_p_text(p, in->id);
	pg_p_text(p, *keys_json);
	pg_p_text(p, *labels_json);
	if (config && config_len)
		pg_p_bytes(p, config, config_len);
	else
		pg_p_null(p);
	pg_p_ts(p, in->created_at_us);
	return 0;
}

/* A text[] of notice lines as a parameter of ST_NOTIFY. */
static int
notice_param(pg_driver *d, pg_params *p, pg_array *arr, int kind,
	     uint64_t revision, int64_t sid)
{
	pg_buf b = { 0 };

	pg_notice_line(&b, d->origin, kind, revision, sid);
	pg_arr_init(arr, PG_OID_TEXT);
	pg_arr_bytes(arr, b.p, b.len);
	pg_buf_free(&b);
	if (pg_arr_finish(arr))
		return HISTD_ENOMEM;
	pg_p_array(p, arr);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The lock every single-session write starts with                         */

typedef struct locked {
	int64_t sid;
	uint64_t revision;
	uint64_t last_seq;
	uint64_t cleared_to_seq;
} locked;

/* BEGIN and SELECT ... FOR UPDATE in one round trip; ENOTFOUND, then
 * ECONFLICT (with *current) against expected (0: none). */
static int
lock_session(pg_driver *d, pg_conn *c, const char *tenant, const char *id,
	     uint64_t expected, locked *l, uint64_t *current, int *retry)
{
	pg_params p = { 0 };
	const enum pg_stmt st[2] = { ST_BEGIN, ST_SESSION_LOCK };
	const pg_params *pp[2] = { NULL, &p };
	PGresult *res[2];
	int rc;

	pg_p_text(&p, tenant);
	pg_p_text(&p, id);
	rc = pg_pipeline(d, c, 2, st, pp, res, retry, 2);
	if (rc)
		return rc;
	PQclear(res[0]);
	if (PQntuples(res[1]) == 0) {
		PQclear(res[1]);
		return not_found();
	}
	l->sid = pg_r_i64(res[1], 0, 0);
	l->revision = (uint64_t)pg_r_i64(res[1], 0, 1);
	l->last_seq = (uint64_t)pg_r_i64(res[1], 0, 2);
	l->cleared_to_seq = (uint64_t)pg_r_i64(res[1], 0, 3);
	PQclear(res[1]);
	if (expected && expected != l->revision)
		return conflict(expected, l->revision, current);
	return 0;
}

/* ENOTFOUND when the locked session is not the life `life` (0: any): the
 * sid is the life (pg_row_session). */
static int
check_life(const locked *l, uint64_t life)
{
	if (life && (uint64_t)l->sid != life)
		return histd_error_set(HISTD_ENOTFOUND, "session not found "
				       "(it was deleted and created again)");
	return 0;
}

/* The write, COMMIT and the notice in one round trip. The notice runs
 * after the COMMIT, as a transaction of its own (PostgreSQL serializes
 * the commits of notifying transactions); it is best effort: the
 * listeners' sweep finds a change whose notice was lost. *out (may be
 * NULL) gets the write's result. */
static int
write_commit(pg_driver *d, pg_conn *c, enum pg_stmt write, const pg_params *wp,
	     int kind, uint64_t revision, int64_t sid, PGresult **out,
	     int *retry, int *commit_sent)
{
	pg_params np = { 0 };
	pg_array arr;
	const enum pg_stmt st[3] = { write, ST_COMMIT, ST_NOTIFY };
	const pg_params *pp[3] = { wp, NULL, &np };
	PGresult *res[3];
	int rc;

	if (notice_param(d, &np, &arr, kind, revision, sid)) {
		pg_arr_free(&arr);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	*commit_sent = 1;
	rc = pg_pipeline(d, c, 3, st, pp, res, retry, 2);
	pg_arr_free(&arr);
	if (rc)
		return rc;
	if (out)
		*out = res[0];
	else
		PQclear(res[0]);
	PQclear(res[1]);
	PQclear(res[2]);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Sessions                                                                */

struct create_arg {
	const histd_session *in;
	histd_session *out;
	int64_t sid;
};

static int
create_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct create_arg *a = arg;
	pg_params p = { 0 };
	char *kj, *lj;
	PGresult *r;
	int rc;

	rc = session_params(&p, a->in, a->in->tenant, a->in->config,
			    a->in->config_len, &kj, &lj);
	if (rc)
		return rc;
	/* Either way the create commits as it is answered (the explicit
	 * COMMIT, or the implicit one at the Sync): a connection lost from
	 * here leaves it unknown, and a blind retry would find the session
	 * it may have created and answer ALREADY_EXISTS. */
	*commit_sent = 1;
	if (d->max_sessions) {
		/* The lock, then the counted insert (its snapshot sees every
		 * create the lock waited for), in one round trip. */
		pg_params lp = { 0 };
		const enum pg_stmt st[4] = {
			ST_BEGIN, ST_TENANT_LOCK, ST_SESSION_CREATE_LIMITED, ST_COMMIT,
		};
		const pg_params *pp[4] = { NULL, &lp, &p, NULL };
		PGresult *res[4];

		pg_p_text(&lp, a->in->tenant);
		pg_p_i64(&p, (int64_t)d->max_sessions);
		rc = pg_pipeline(d, c, 4, st, pp, res, retry, 4);
		free(kj);
		free(lj);
		if (rc)
			return rc;
		PQclear(res[0]);
		PQclear(res[1]);
		PQclear(res[3]);
		if (pg_r_null(res[2], 0, 2))
			rc = tenant_full(d, res[2], 0);
		else
			rc = pg_row_session(res[2], 0, 2, &a->out, &a->sid);
		PQclear(res[2]);
		return rc;
	}
	rc = pg_exec(d, c, ST_SESSION_CREATE, &p, &r, retry);
	free(kj);
	free(lj);
	if (rc)
		return rc;
	rc = pg_row_session(r, 0, 0, &a->out, &a->sid);
	PQclear(r);
	return rc;
}

static int
pg_session_create(histd_driver *drv, const histd_session *in, histd_session **out)
{
	pg_driver *d = (pg_driver *)drv;
	struct create_arg a = { .in = in };
	int rc = pg_txn(d, create_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

struct get_arg {
	const char *tenant, *id;
	histd_session *out;
};

static int
get_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct get_arg *a = arg;
	pg_params p = { 0 };
	PGresult *r;
	int rc;

	(void)commit_sent;
	pg_p_text(&p, a->tenant);
	pg_p_text(&p, a->id);
	if ((rc = pg_exec(d, c, ST_SESSION_GET, &p, &r, retry)))
		return rc;
	if (PQntuples(r) == 0)
		rc = not_found();
	else
		rc = pg_row_session(r, 0, 0, &a->out, NULL);
	PQclear(r);
	return rc;
}

static int
pg_session_get(histd_driver *drv, const char *tenant, const char *id,
	       histd_session **out)
{
	struct get_arg a = { .tenant = tenant, .id = id };
	int rc = pg_txn((pg_driver *)drv, get_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

struct resolve_arg {
	const histd_session *in;
	histd_session *out;
	int created;
};

/*
 * Resolve under the tenant's limit: a session holding the keys is found
 * without the lock; else, in one round trip, the lock, the counted insert
 * (nothing if the keys are taken meanwhile, or the tenant is full) and
 * the holder of the keys, then COMMIT. p: session_params and the limit;
 * k: tenant and keys.
 */
static int
resolve_limited(pg_driver *d, pg_conn *c, struct resolve_arg *a,
		const pg_params *p, const pg_params *k, int *retry)
{
	pg_params lp = { 0 };
	const enum pg_stmt st[5] = {
		ST_BEGIN, ST_TENANT_LOCK, ST_SESSION_RESOLVE_LIMITED,
		ST_SESSION_BY_KEYS, ST_COMMIT,
	};
	const pg_params *pp[5] = { NULL, &lp, p, k, NULL };
	PGresult *r, *res[5];
	int rc;

	if ((rc = pg_exec(d, c, ST_SESSION_BY_KEYS, k, &r, retry)))
		return rc;
	if (PQntuples(r) == 1) {
		a->created = 0;
		rc = pg_row_session(r, 0, 0, &a->out, NULL);
		PQclear(r);
		return rc;
	}
	PQclear(r);
	pg_p_text(&lp, a->in->tenant);
	/* A holder of the keys created and deleted between the statements
	 * (by a replica without the limit) shows as neither: again. */
	for (int i = 0; i < 10; i++) {
		int settled = 1;

		if ((rc = pg_pipeline(d, c, 5, st, pp, res, retry, 5)))
			return rc;
		PQclear(res[0]);
		PQclear(res[1]);
		PQclear(res[4]);
		if (!pg_r_null(res[2], 0, 2)) {
			a->created = 1;
			rc = pg_row_session(res[2], 0, 2, &a->out, NULL);
		} else if (PQntuples(res[3]) == 1) {
			a->created = 0;
			rc = pg_row_session(res[3], 0, 0, &a->out, NULL);
		} else if ((uint64_t)pg_r_i64(res[2], 0, 0) >= d->max_sessions) {
			rc = tenant_full(d, res[2], 0);
		} else {
			settled = 0;
		}
		PQclear(res[2]);
		PQclear(res[3]);
		if (settled)
			return rc;
	}
	return histd_error_set(HISTD_EUNAVAILABLE, "session resolve did not "
			       "settle: concurrent create and delete");
}

static int
resolve_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct resolve_arg *a = arg;
	pg_params p = { 0 }, k = { 0 };
	char *kj, *lj;
	PGresult *r = NULL;
	int rc;

	(void)commit_sent;
	rc = session_params(&p, a->in, a->in->tenant, a->in->config,
			    a->in->config_len, &kj, &lj);
	if (rc)
		return rc;
	pg_p_text(&k, a->in->tenant);
	pg_p_text(&k, kj);
	if (d->max_sessions) {
		pg_p_i64(&p, (int64_t)d->max_sessions);
		rc = resolve_limited(d, c, a, &p, &k, retry);
		free(kj);
		free(lj);
		return rc;
	}
	/* Insert unless the keys are taken, else read the holder. A holder
	 * committed after this statement's snapshot, or deleted between the
	 * two statements, shows as neither: go round again. */
	for (int i = 0; i < 10; i++) {
		if ((rc = pg_exec(d, c, ST_SESSION_RESOLVE, &p, &r, retry)))
			break;
		if (PQntuples(r) == 1) {
			a->created = 1;
			break;
		}
		PQclear(r);
		r = NULL;
		if ((rc = pg_exec(d, c, ST_SESSION_BY_KEYS, &k, &r, retry)))
			break;
		if (PQntuples(r) == 1) {
			a->created = 0;
			break;
		}
		PQclear(r);
		r = NULL;
	}
	free(kj);
	free(lj);
	if (rc == 0 && !r)
		rc = histd_error_set(HISTD_EUNAVAILABLE, "session resolve did not "
				     "settle: concurrent create and delete");
	if (rc == 0)
		rc = pg_row_session(r, 0, 0, &a->out, NULL);
	PQclear(r);
	return rc;
}

static int
pg_session_resolve(histd_driver *drv, const histd_session *in,
		   histd_session **out, int *created)
{
	struct resolve_arg a = { .in = in };
	int rc = pg_txn((pg_driver *)drv, resolve_body, &a, NULL);

	if (rc == 0) {
		*out = a.out;
		*created = a.created;
	}
	return rc;
}

struct list_arg {
	const histd_list *q;
	histd_session_list out;
};

static int
list_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct list_arg *a = arg;
	pg_params p = { 0 };
	char *lj = NULL;
	PGresult *r;
	int rc, n;

	(void)commit_sent;
	if (a->q->n_labels &&
	    (rc = pg_kv_json(a->q->labels, a->q->n_labels, 0, "labels", &lj)))
		return rc;
	pg_p_text(&p, a->q->tenant);
	pg_p_text(&p, a->q->after_id ? a->q->after_id : "");
	pg_p_i64(&p, (int64_t)a->q->limit + 1);
	if (lj)
		pg_p_text(&p, lj);
	rc = pg_exec(d, c, lj ? ST_SESSION_LIST_LABELS : ST_SESSION_LIST, &p, &r,
		     retry);
	free(lj);
	if (rc)
		return rc;
	n = PQntuples(r);
	if ((uint32_t)n > a->q->limit) {
		a->out.has_more = 1;
		n = (int)a->q->limit;
	}
	a->out.v = n ? calloc((size_t)n, sizeof(*a->out.v)) : NULL;
	if (n && !a->out.v) {
		PQclear(r);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n; i++) {
		if ((rc = pg_row_session(r, i, 0, &a->out.v[i], NULL))) {
			histd_session_list_free(&a->out);
			PQclear(r);
			return rc;
		}
		a->out.n++;
	}
	PQclear(r);
	return 0;
}

static int
pg_session_list(histd_driver *drv, const histd_list *q, histd_session_list *out)
{
	struct list_arg a = { .q = q };
	int rc = pg_txn((pg_driver *)drv, list_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

struct tenants_arg {
	const char *after;
	uint32_t limit;
	histd_tenant_list out;
};

static int
tenants_body(pg_driver *d, pg_conn *c, void *arg, int *retry,
	     int *commit_sent)
{
	struct tenants_arg *a = arg;
	pg_params p = { 0 };
	PGresult *r;
	int rc, n;

	(void)commit_sent;
	pg_p_text(&p, a->after ? a->after : "");
	pg_p_i64(&p, (int64_t)a->limit + 1);
	if ((rc = pg_exec(d, c, ST_TENANT_LIST, &p, &r, retry)))
		return rc;
	n = PQntuples(r);
	if ((uint32_t)n > a->limit) {
		a->out.has_more = 1;
		n = (int)a->limit;
	}
	a->out.v = n ? calloc((size_t)n, sizeof(*a->out.v)) : NULL;
	if (n && !a->out.v) {
		PQclear(r);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	a->out.cap = (size_t)n;
	for (int i = 0; i < n; i++) {
		if (!(a->out.v[i] = strdup(pg_r_str(r, i, 0, NULL)))) {
			histd_tenant_list_free(&a->out);
			PQclear(r);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
		a->out.n++;
	}
	PQclear(r);
	return 0;
}

static int
pg_tenant_list(histd_driver *drv, const char *after, uint32_t limit,
	       histd_tenant_list *out)
{
	struct tenants_arg a = { .after = after, .limit = limit };
	int rc = pg_txn((pg_driver *)drv, tenants_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

struct update_arg {
	const char *tenant, *id;
	uint64_t expected;
	const histd_kv *labels;
	size_t n_labels;
	const uint8_t *config;
	size_t config_len;
	int64_t now_us;
	histd_session *out;
	int64_t sid;
	uint64_t current;
};

static int
update_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct update_arg *a = arg;
	pg_params p = { 0 };
	char *lj = NULL;
	PGresult *r;
	locked l;
	int rc;

	if (a->labels && (rc = pg_kv_json(a->labels, a->n_labels, 0, "labels", &lj)))
		return rc;
	rc = lock_session(d, c, a->tenant, a->id, a->expected, &l, &a->current,
			  retry);
	if (rc) {
		free(lj);
		return rc;
	}
	pg_p_i64(&p, l.sid);
	pg_p_text(&p, lj);
	{
		/* bool in binary: one byte. */
		static const char yes = 1, no = 0;
		int i = p.n++;

		p.values[i] = a->config ? &yes : &no;
		p.lengths[i] = 1;
		p.formats[i] = 1;
	}
	if (a->config && a->config_len)
		pg_p_bytes(&p, a->config, a->config_len);
	else
		pg_p_null(&p);
	pg_p_ts(&p, a->now_us);
	/* Known before the COMMIT: an unanswered one has the session
	 * re-read (pg_watch_unknown). */
	a->sid = l.sid;
	rc = write_commit(d, c, ST_SESSION_UPDATE, &p, HISTD_CHANGE_UPDATED,
			  l.revision + 1, l.sid, &r, retry, commit_sent);
	free(lj);
	if (rc)
		return rc;
	rc = pg_row_session(r, 0, 0, &a->out, NULL);
	PQclear(r);
	return rc;
}

static int
pg_session_update(histd_driver *drv, const char *tenant, const char *id,
		  uint64_t expected_revision, const histd_kv *labels,
		  size_t n_labels, const uint8_t *config, size_t config_len,
		  int64_t now_us, histd_session **out, uint64_t *current_revision)
{
	pg_driver *d = (pg_driver *)drv;
	struct update_arg a = {
		.tenant = tenant, .id = id, .expected = expected_revision,
		.labels = labels, .n_labels = n_labels, .config = config,
		.config_len = config_len, .now_us = now_us,
	};
	int unknown = 0;
	int rc = pg_txn(d, update_body, &a, &unknown);

	if (rc == 0) {
		histd_change ch = {
			.kind = HISTD_CHANGE_UPDATED, .tenant = tenant,
			.session_id = id, .revision = a.out->revision,
			.cleared_to_seq = a.out->cleared_to_seq, .session = a.out,
		};

		pg_watch_local(d, a.sid, &ch, a.out->last_seq);
		*out = a.out;
	} else if (rc == HISTD_ECONFLICT) {
		*current_revision = a.current;
	} else if (unknown && a.sid) {
		pg_watch_unknown(d, a.sid, tenant, id);
	}
	return rc;
}

struct delete_arg {
	const char *tenant, *id;
	uint64_t expected;
	locked l;
	uint64_t current;
	uint64_t life;          /* 0: any */
};

static int
delete_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct delete_arg *a = arg;
	pg_params p = { 0 };
	int rc;

	rc = lock_session(d, c, a->tenant, a->id, a->expected, &a->l, &a->current,
			  retry);
	if (rc || (rc = check_life(&a->l, a->life)))
		return rc;
	pg_p_i64(&p, a->l.sid);
	return write_commit(d, c, ST_SESSION_DELETE, &p, HISTD_CHANGE_DELETED,
			    a->l.revision + 1, a->l.sid, NULL, retry, commit_sent);
}

static int
pg_session_delete_life(histd_driver *drv, const char *tenant, const char *id,
		       uint64_t expected_revision, uint64_t incarnation,
		       uint64_t *current_revision)
{
	pg_driver *d = (pg_driver *)drv;
	struct delete_arg a = { .tenant = tenant, .id = id,
				.expected = expected_revision,
				.life = incarnation };
	int unknown = 0;
	int rc = pg_txn(d, delete_body, &a, &unknown);

	if (rc == 0) {
		histd_change ch = {
			.kind = HISTD_CHANGE_DELETED, .tenant = tenant,
			.session_id = id, .revision = a.l.revision + 1,
			.cleared_to_seq = a.l.cleared_to_seq,
		};

		pg_watch_local(d, a.l.sid, &ch, a.l.last_seq);
	} else if (rc == HISTD_ECONFLICT) {
		*current_revision = a.current;
	} else if (unknown && a.l.sid) {
		pg_watch_unknown(d, a.l.sid, tenant, id);
	}
	return rc;
}

static int
pg_session_delete(histd_driver *drv, const char *tenant, const char *id,
		  uint64_t expected_revision, uint64_t *current_revision)
{
	return pg_session_delete_life(drv, tenant, id, expected_revision, 0,
				      current_revision);
}

struct fork_arg {
	const char *tenant, *source;
	uint64_t source_life;   /* 0: any */
	uint64_t up_to;
	const histd_session *in;
	histd_session *out;
};

/*
 * Three round trips: BEGIN and the source row locked FOR SHARE (with the
 * tenant's lock first when sessions are limited, and what the fork would
 * hold when sizes are); the new session row; the copy and COMMIT.
 */
static int
fork_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct fork_arg *a = arg;
	pg_params p = { 0 }, lp = { 0 }, zp = { 0 }, np = { 0 }, cp = { 0 };
	int sized = d->max_msgs || d->max_bytes;
	const enum pg_stmt st1[4] = {
		ST_BEGIN, d->max_sessions ? ST_TENANT_LOCK : ST_COUNT,
		ST_FORK_SOURCE, sized ? ST_FORK_SIZE : ST_COUNT,
	};
	const pg_params *pp1[4] = { NULL, &lp, &p, &zp };
	PGresult *res[4], *r;
	char *kj = NULL, *lj = NULL;
	uint8_t *config = NULL;
	size_t config_len = 0;
	int64_t src_sid, new_sid;
	uint64_t last, cleared, n_msgs = 0, n_bytes = 0;
	int rc;

	pg_p_text(&lp, a->tenant);
	pg_p_text(&p, a->tenant);
	pg_p_text(&p, a->source);
	pg_p_text(&zp, a->tenant);
	pg_p_text(&zp, a->source);
	pg_p_i64(&zp, a->up_to && a->up_to < INT64_MAX ? (int64_t)a->up_to
						       : INT64_MAX);
	if ((rc = pg_pipeline(d, c, 4, st1, pp1, res, retry, 4)))
		return rc;
	PQclear(res[0]);
	PQclear(res[1]);
	if (res[3]) {
		n_msgs = (uint64_t)pg_r_i64(res[3], 0, 0);
		n_bytes = (uint64_t)pg_r_i64(res[3], 0, 1);
		PQclear(res[3]);
	}
	r = res[2];
	if (PQntuples(r) == 0) {
		PQclear(r);
		return not_found();
	}
	src_sid = pg_r_i64(r, 0, 0);
	/* The sid is the life (pg_row_session). */
	if (a->source_life && (uint64_t)src_sid != a->source_life) {
		PQclear(r);
		return histd_error_set(HISTD_ENOTFOUND, "session not found "
				       "(it was deleted and created again)");
	}
	last = (uint64_t)pg_r_i64(r, 0, 1);
	cleared = (uint64_t)pg_r_i64(r, 0, 2);
	if (a->up_to && a->up_to < last)
		last = a->up_to;
	if (cleared > last)
		cleared = last;
	if (!pg_r_null(r, 0, 3)) {
		const char *cfg = pg_r_str(r, 0, 3, &config_len);

		if (config_len && !(config = malloc(config_len))) {
			PQclear(r);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
		if (config_len)
			memcpy(config, cfg, config_len);
	}
	PQclear(r);

	rc = session_params(&np, a->in, a->tenant, config, config_len, &kj, &lj);
	if (rc)
		goto out;
	pg_p_i64(&np, (int64_t)last);
	pg_p_i64(&np, (int64_t)cleared);
	if (d->max_sessions)
		pg_p_i64(&np, (int64_t)d->max_sessions);
	if ((rc = pg_exec(d, c, d->max_sessions ? ST_FORK_CREATE_LIMITED
						: ST_FORK_CREATE, &np, &r, retry)))
		goto out;
	/* As the memory driver checks: the id, the size, then the tenant. */
	if (d->max_sessions && pg_r_null(r, 0, 2)) {
		if (pg_r_i32(r, 0, 1) != 1 && sized)
			rc = pg_limit_size(d, n_msgs, n_bytes);
		if (rc == 0)
			rc = tenant_full(d, r, 0);
		PQclear(r);
		goto out;
	}
	new_sid = pg_r_i64(r, 0, d->max_sessions ? 2 : 0);
	PQclear(r);
	if (sized && (rc = pg_limit_size(d, n_msgs, n_bytes)))
		goto out;

	pg_p_i64(&cp, src_sid);
	pg_p_i64(&cp, new_sid);
	pg_p_i64(&cp, (int64_t)last);
	{
		const enum pg_stmt st2[2] = { ST_FORK_COPY, ST_COMMIT };
		const pg_params *pp2[2] = { &cp, NULL };

		*commit_sent = 1;
		if ((rc = pg_pipeline(d, c, 2, st2, pp2, res, retry, 2)))
			goto out;
		PQclear(res[1]);
		rc = pg_row_session(res[0], 0, 0, &a->out, NULL);
		PQclear(res[0]);
	}
out:
	free(config);
	free(kj);
	free(lj);
	return rc;
}

static int
pg_session_fork_life(histd_driver *drv, const char *tenant,
		     const char *source_id, uint64_t source_incarnation,
		     uint64_t up_to_seq, const histd_session *in,
		     histd_session **out)
{
	struct fork_arg a = { .tenant = tenant, .source = source_id,
			      .source_life = source_incarnation,
			      .up_to = up_to_seq, .in = in };
	int rc = pg_txn((pg_driver *)drv, fork_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

static int
pg_session_fork(histd_driver *drv, const char *tenant, const char *source_id,
		uint64_t up_to_seq, const histd_session *in, histd_session **out)
{
	return pg_session_fork_life(drv, tenant, source_id, 0, up_to_seq, in,
				    out);
}

/* ---------------------------------------------------------------------- */
/* Reads                                                                   */

struct read_arg {
	const histd_read *q;
	histd_read_result res;
	int64_t sid;
};

static int
read_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct read_arg *a = arg;
	const histd_read *q = a->q;
	pg_params p = { 0 };
	PGresult *r;
	int rc, n, found = 0, want, total = -1, skip = 0;
	int64_t budget = q->max_bytes > INT64_MAX ? 0 : (int64_t)q->max_bytes;
	uint64_t size = 0;

	(void)commit_sent;
	histd_read_result_clear(&a->res);
	pg_p_text(&p, q->tenant);
	pg_p_text(&p, q->session_id);
	if (q->last_n) {
		pg_p_i64(&p, q->last_n);
		pg_p_i64(&p, budget);
		rc = pg_exec(d, c, ST_READ_LAST, &p, &r, retry);
	} else {
		pg_p_i64(&p, (int64_t)q->after_seq);
		if (q->limit)
			pg_p_i64(&p, (int64_t)q->limit + 1);
		else
			pg_p_null(&p);
		pg_p_i64(&p, budget);
		rc = pg_exec(d, c, ST_READ_AFTER, &p, &r, retry);
	}
	if (rc)
		return rc;
	n = PQntuples(r);
	want = n;
	for (int i = 0; i < n; i++) {
		if (pg_r_i32(r, i, 0) != 0)
			continue;
		found = 1;
		a->sid = pg_r_i64(r, i, 1);
		a->res.revision = (uint64_t)pg_r_i64(r, i, 1 + 8);
		a->res.last_seq = (uint64_t)pg_r_i64(r, i, 1 + 9);
		a->res.cleared_to_seq = (uint64_t)pg_r_i64(r, i, 1 + 10);
		if (q->want_session &&
		    (rc = pg_row_session(r, i, 1, &a->res.session, NULL))) {
			PQclear(r);
			return rc;
		}
		want--;
	}
	if (!found) {
		PQclear(r);
		return not_found();
	}
	/* The rows the limit alone gives, of which the budget may have
	 * left some out (every message row says it). */
	for (int i = 0; i < n && total < 0; i++)
		if (pg_r_i32(r, i, 0) == 1)
			total = (int)pg_r_i64(r, i, 1 + PG_SESSION_NCOLS + 3);
	if (total < 0)
		total = 0;
	if (!q->last_n && q->limit && (uint32_t)total > q->limit) {
		a->res.has_more = 1;
		total = (int)q->limit;
	}
	if (want > total)
		want = total;
	if (want < total)
		a->res.has_more = 1;    /* the budget left rows out */
	/* The exact budget (histd_read.max_bytes), over the message rows in
	 * the order it keeps them, which is the statement's: the first, or
	 * the newest with last_n. */
	for (int i = 0, kept = 0; i < n && kept < want; i++) {
		uint64_t rl, one;
		size_t len;

		if (pg_r_i32(r, i, 0) != 1)
			continue;
		(void)pg_r_str(r, i, 1 + PG_SESSION_NCOLS + 2, &len);
		rl = pg_record_len((uint64_t)pg_r_i64(r, i, 1 + PG_SESSION_NCOLS),
				   len);
		one = 1 + histd_wire_varint_size(rl) + rl;
		if (budget && kept > 0 && size + one > (uint64_t)budget) {
			a->res.has_more = 1;
			skip = want - kept;
			want = kept;
			break;
		}
		size += one;
		kept++;
	}
	/* Added in seq order: with last_n from the oldest message row, past
	 * the older ones the budget left out. */
	if (!q->last_n)
		skip = 0;
	/* Message rows: oldest first after a seq, newest first for last_n. */
	for (int k = 0, added = 0; k < n && added < want; k++) {
		int i = q->last_n ? n - 1 - k : k;
		size_t len;
		const char *data;

		if (pg_r_i32(r, i, 0) != 1)
			continue;
		data = pg_r_str(r, i, 1 + PG_SESSION_NCOLS + 2, &len);
		if (skip) {
			skip--;
			continue;
		}
		rc = pg_records_add_msg(&a->res.records,
					(uint64_t)pg_r_i64(r, i, 1 + PG_SESSION_NCOLS),
					(uint32_t)pg_r_i32(r, i, 1 + PG_SESSION_NCOLS + 1),
					data, len);
		if (rc) {
			PQclear(r);
			return rc;
		}
		added++;
	}
	PQclear(r);
	return 0;
}

static int
pg_read(histd_driver *drv, const histd_read *q, histd_read_result *res)
{
	pg_driver *d = (pg_driver *)drv;
	struct read_arg a = { .q = q };
	int rc = pg_txn(d, read_body, &a, NULL);

	if (rc == 0) {
		pg_watch_seen(d, a.sid, q->tenant, q->session_id, a.res.revision,
			      a.res.last_seq, a.res.cleared_to_seq);
		*res = a.res;
	} else {
		histd_read_result_clear(&a.res);
	}
	return rc;
}

struct tool_arg {
	const char *tenant, *id, *call_id;
	histd_record *out;
};

static int
tool_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct tool_arg *a = arg;
	pg_params p = { 0 };
	PGresult *r;
	size_t len;
	const char *data;
	int rc;

	(void)commit_sent;
	pg_p_text(&p, a->tenant);
	pg_p_text(&p, a->id);
	if (!pg_utf8_ok(a->call_id, strlen(a->call_id)))
		return histd_error_set(HISTD_ENOTFOUND,
				       "no stored tool result answers tool_call_id");
	pg_p_text(&p, a->call_id);
	if ((rc = pg_exec(d, c, ST_TOOL_RESULT, &p, &r, retry)))
		return rc;
	if (PQntuples(r) == 0) {
		PQclear(r);
		return not_found();
	}
	if (pg_r_null(r, 0, 1)) {
		PQclear(r);
		return histd_error_set(HISTD_ENOTFOUND,
				       "no stored tool result answers tool_call_id");
	}
	data = pg_r_str(r, 0, 3, &len);
	a->out = pg_record_msg((uint64_t)pg_r_i64(r, 0, 1),
			       (uint32_t)pg_r_i32(r, 0, 2), data, len);
	PQclear(r);
	return a->out ? 0 : histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
pg_tool_result(histd_driver *drv, const char *tenant, const char *id,
	       const char *call_id, histd_record **out)
{
	struct tool_arg a = { .tenant = tenant, .id = id, .call_id = call_id };
	int rc = pg_txn((pg_driver *)drv, tool_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Clear and summaries                                                     */

struct clear_arg {
	const char *tenant, *id;
	uint64_t expected;
	locked l;
	uint64_t revision, cleared, current;
};

static int
clear_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct clear_arg *a = arg;
	pg_params p = { 0 };
	PGresult *r;
	int rc;

	rc = lock_session(d, c, a->tenant, a->id, a->expected, &a->l, &a->current,
			  retry);
	if (rc)
		return rc;
	pg_p_i64(&p, a->l.sid);
	pg_p_ts(&p, histd_now_us());    /* active_at: clear carries no time */
	rc = write_commit(d, c, ST_CLEAR, &p, HISTD_CHANGE_CLEARED,
			  a->l.revision + 1, a->l.sid, &r, retry, commit_sent);
	if (rc)
		return rc;
	a->revision = (uint64_t)pg_r_i64(r, 0, 0);
	a->cleared = (uint64_t)pg_r_i64(r, 0, 1);
	PQclear(r);
	return 0;
}

static int
pg_clear(histd_driver *drv, const char *tenant, const char *id,
	 uint64_t expected_revision, uint64_t *revision,
	 uint64_t *cleared_to_seq, uint64_t *current_revision)
{
	pg_driver *d = (pg_driver *)drv;
	struct clear_arg a = { .tenant = tenant, .id = id,
			       .expected = expected_revision };
	int unknown = 0;
	int rc = pg_txn(d, clear_body, &a, &unknown);

	if (rc == 0) {
		histd_change ch = {
			.kind = HISTD_CHANGE_CLEARED, .tenant = tenant,
			.session_id = id, .revision = a.revision,
			.cleared_to_seq = a.cleared,
		};

		pg_watch_local(d, a.l.sid, &ch, a.l.last_seq);
		*revision = a.revision;
		*cleared_to_seq = a.cleared;
	} else if (rc == HISTD_ECONFLICT) {
		*current_revision = a.current;
	} else if (unknown && a.l.sid) {
		pg_watch_unknown(d, a.l.sid, tenant, id);
	}
	return rc;
}

struct truncate_arg {
	const char *tenant, *id;
	uint64_t up_to, expected;
	uint64_t life;          /* 0: any */
	locked l;
	uint64_t revision, cleared, current;
	int changed;
};

/* BEGIN, the session row locked and whether anything is to delete, in one
 * round trip; then the delete, COMMIT and the notice in another. With
 * nothing to delete, the transaction ends and nothing changed. */
static int
truncate_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct truncate_arg *a = arg;
	pg_params p = { 0 }, q = { 0 }, w = { 0 };
	const enum pg_stmt st[3] = { ST_BEGIN, ST_SESSION_LOCK, ST_TRUNCATE_PROBE };
	const pg_params *pp[3] = { NULL, &p, &q };
	/* Seqs are below 2^63; a larger up_to_seq is last_seq anyway. */
	int64_t up_to = a->up_to < INT64_MAX ? (int64_t)a->up_to : INT64_MAX;
	PGresult *res[3], *r;
	int rc, any;

	a->changed = 0;
	pg_p_text(&p, a->tenant);
	pg_p_text(&p, a->id);
	pg_p_text(&q, a->tenant);
	pg_p_text(&q, a->id);
	pg_p_i64(&q, up_to);
	if ((rc = pg_pipeline(d, c, 3, st, pp, res, retry, 3)))
		return rc;
	PQclear(res[0]);
	if (PQntuples(res[1]) == 0) {
		PQclear(res[1]);
		PQclear(res[2]);
		return not_found();
	}
	a->l.sid = pg_r_i64(res[1], 0, 0);
	a->l.revision = (uint64_t)pg_r_i64(res[1], 0, 1);
	a->l.last_seq = (uint64_t)pg_r_i64(res[1], 0, 2);
	a->l.cleared_to_seq = (uint64_t)pg_r_i64(res[1], 0, 3);
	any = pg_r_bool(res[2], 0, 0);
	PQclear(res[1]);
	PQclear(res[2]);
	if (a->expected && a->expected != a->l.revision)
		return conflict(a->expected, a->l.revision, &a->current);
	if ((rc = check_life(&a->l, a->life)))
		return rc;
	if (!any) {
		a->revision = a->l.revision;
		return pg_exec(d, c, ST_COMMIT, NULL, NULL, retry);
	}
	if ((uint64_t)up_to > a->l.last_seq)
		up_to = (int64_t)a->l.last_seq;
	pg_p_i64(&w, a->l.sid);
	pg_p_i64(&w, up_to);
	pg_p_i64(&w, (int64_t)a->l.revision + 1);
	pg_p_ts(&w, histd_now_us());
	rc = write_commit(d, c, ST_TRUNCATE, &w, HISTD_CHANGE_CLEARED,
			  a->l.revision + 1, a->l.sid, &r, retry, commit_sent);
	if (rc)
		return rc;
	a->revision = (uint64_t)pg_r_i64(r, 0, 0);
	a->cleared = (uint64_t)pg_r_i64(r, 0, 1);
	a->changed = 1;
	PQclear(r);
	return 0;
}

static int
pg_truncate_life(histd_driver *drv, const char *tenant, const char *id,
		 uint64_t up_to_seq, uint64_t expected_revision,
		 uint64_t incarnation, uint64_t *revision,
		 uint64_t *current_revision)
{
	pg_driver *d = (pg_driver *)drv;
	struct truncate_arg a = { .tenant = tenant, .id = id, .up_to = up_to_seq,
				  .expected = expected_revision,
				  .life = incarnation };
	int unknown = 0;
	int rc = pg_txn(d, truncate_body, &a, &unknown);

	if (rc == 0) {
		if (a.changed) {
			histd_change ch = {
				.kind = HISTD_CHANGE_CLEARED, .tenant = tenant,
				.session_id = id, .revision = a.revision,
				.cleared_to_seq = a.cleared, .system_kept = 1,
			};

			pg_watch_local(d, a.l.sid, &ch, a.l.last_seq);
		}
		*revision = a.revision;
	} else if (rc == HISTD_ECONFLICT) {
		*current_revision = a.current;
	} else if (unknown && a.l.sid) {
		pg_watch_unknown(d, a.l.sid, tenant, id);
	}
	return rc;
}

static int
pg_truncate(histd_driver *drv, const char *tenant, const char *id,
	    uint64_t up_to_seq, uint64_t expected_revision, uint64_t *revision,
	    uint64_t *current_revision)
{
	return pg_truncate_life(drv, tenant, id, up_to_seq, expected_revision, 0,
				revision, current_revision);
}

struct summary_arg {
	const char *tenant, *id;
	uint64_t expected;
	uint64_t life;          /* 0: any */
	const histd_record *summary;
	locked l;
	uint64_t current;
};

static int
summary_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	struct summary_arg *a = arg;
	pg_params p = { 0 };
	int rc;

	rc = lock_session(d, c, a->tenant, a->id, a->expected, &a->l, &a->current,
			  retry);
	if (rc || (rc = check_life(&a->l, a->life)))
		return rc;
	pg_p_i64(&p, a->l.sid);
	pg_p_i64(&p, (int64_t)a->l.revision + 1);
	pg_p_i64(&p, (int64_t)a->summary->seq);
	pg_p_i32(&p, (int32_t)a->summary->token_estimate);
	pg_p_bytes(&p, a->summary->data, a->summary->len);
	pg_p_ts(&p, histd_now_us());
	return write_commit(d, c, ST_SUMMARY_PUT, &p, HISTD_CHANGE_SUMMARY,
			    a->l.revision + 1, a->l.sid, NULL, retry, commit_sent);
}

static int
pg_summary_put_life(histd_driver *drv, const char *tenant, const char *id,
		    uint64_t expected_revision, uint64_t incarnation,
		    const histd_record *summary, uint64_t *revision,
		    uint64_t *current_revision)
{
	pg_driver *d = (pg_driver *)drv;
	struct summary_arg a = { .tenant = tenant, .id = id,
				 .expected = expected_revision,
				 .life = incarnation, .summary = summary };
	int unknown = 0;
	int rc = pg_txn(d, summary_body, &a, &unknown);

	if (rc == 0) {
		histd_change ch = {
			.kind = HISTD_CHANGE_SUMMARY, .tenant = tenant,
			.session_id = id, .revision = a.l.revision + 1,
			.cleared_to_seq = a.l.cleared_to_seq,
			.records = summary, .n_records = 1,
		};

		pg_watch_local(d, a.l.sid, &ch, a.l.last_seq);
		*revision = a.l.revision + 1;
	} else if (rc == HISTD_ECONFLICT) {
		*current_revision = a.current;
	} else if (unknown && a.l.sid) {
		pg_watch_unknown(d, a.l.sid, tenant, id);
	}
	return rc;
}

static int
pg_summary_put(histd_driver *drv, const char *tenant, const char *id,
	       uint64_t expected_revision, const histd_record *summary,
	       uint64_t *revision, uint64_t *current_revision)
{
	return pg_summary_put_life(drv, tenant, id, expected_revision, 0,
				   summary, revision, current_revision);
}

struct summary_get_arg {
	const char *tenant, *id;
	histd_record *out;
};

static int
summary_get_body(pg_driver *d, pg_conn *c, void *arg, int *retry,
		 int *commit_sent)
{
	struct summary_get_arg *a = arg;
	pg_params p = { 0 };
	PGresult *r;
	size_t len;
	const char *data;
	int rc;

	(void)commit_sent;
	pg_p_text(&p, a->tenant);
	pg_p_text(&p, a->id);
	if ((rc = pg_exec(d, c, ST_SUMMARY_GET, &p, &r, retry)))
		return rc;
	if (PQntuples(r) == 0) {
		PQclear(r);
		return not_found();
	}
	a->out = NULL;
	if (!pg_r_null(r, 0, 1)) {
		data = pg_r_str(r, 0, 3, &len);
		a->out = histd_record_new((uint64_t)pg_r_i64(r, 0, 1),
					  (uint32_t)pg_r_i32(r, 0, 2),
					  (const uint8_t *)data, len);
		if (!a->out) {
			PQclear(r);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
	}
	PQclear(r);
	return 0;
}

static int
pg_summary_get(histd_driver *drv, const char *tenant, const char *id,
	       histd_record **out)
{
	struct summary_get_arg a = { .tenant = tenant, .id = id };
	int rc = pg_txn((pg_driver *)drv, summary_get_body, &a, NULL);

	if (rc == 0)
		*out = a.out;
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Lifecycle                                                               */

static void
pg_set_notify(histd_driver *drv, histd_change_fn fn, void *ctx)
{
	pg_watch_set_notify((pg_driver *)drv, fn, ctx);
}

static int
pg_ping(histd_driver *drv)
{
	pg_driver *d = (pg_driver *)drv;

	if (!atomic_load(&d->db_up))
		return histd_error_set(HISTD_EUNAVAILABLE, "PostgreSQL is unreachable");
	return 0;
}

static void
pg_close(histd_driver *drv)
{
	pg_driver *d = (pg_driver *)drv;

	if (!d)
		return;
	/* The committers first: a batch they finish may use the watch. */
	pg_group_free(d);
	pg_watch_stop(d);
	if (d->conns) {
		for (int i = 0; i < d->pool_size; i++)
			if (d->conns[i].pg)
				PQfinish(d->conns[i].pg);
		free(d->conns);
	}
	pthread_cond_destroy(&d->pool_cv);
	pthread_mutex_destroy(&d->pool_mu);
	free(d->dsn);
	free(d);
}

/* The default pool when the configuration gives none. */
#define PG_POOL_DEFAULT 8
#define PG_POOL_MAX 1000
/* statement_timeout takes an int of ms; a day is more than any call. */
#define PG_TIMEOUT_MAX_MS 86400000

int
histd_postgres_driver_open(const histd_driver_config *cfg, histd_driver **out)
{
	pg_driver *d;
	PGconn *pg = NULL;
	int rc;

	if (!cfg || !cfg->dsn || !*cfg->dsn)
		return histd_error_set(HISTD_EINVALID,
				       "dsn is required by the postgres driver");
	if (cfg->pool_size < 0 || cfg->pool_size > PG_POOL_MAX)
		return histd_error_set(HISTD_EINVALID,
				       "pool_size must be 1..%d", PG_POOL_MAX);
	if (cfg->timeout_ms < 0 || cfg->timeout_ms > PG_TIMEOUT_MAX_MS)
		return histd_error_set(HISTD_EINVALID,
				       "timeout_ms must be 0..%d", PG_TIMEOUT_MAX_MS);
	d = calloc(1, sizeof(*d));
	if (!d)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	d->base = (histd_driver){
		.version = 7,
		.name = "postgres",
		.session_create = pg_session_create,
		.session_get = pg_session_get,
		.session_resolve = pg_session_resolve,
		.session_list = pg_session_list,
		.session_update = pg_session_update,
		.session_delete = pg_session_delete,
		.session_fork = pg_session_fork,
		.append = pg_append,
		.read = pg_read,
		.tool_result = pg_tool_result,
		.clear = pg_clear,
		.replace = pg_replace,
		.summary_put = pg_summary_put,
		.summary_get = pg_summary_get,
		.set_notify = pg_set_notify,
		.ping = pg_ping,
		.close = pg_close,
		.search = pg_search,
		.embedding_put = pg_embedding_put,
		.truncate = pg_truncate,
		.tenant_list = pg_tenant_list,
		.session_delete_life = pg_session_delete_life,
		.truncate_life = pg_truncate_life,
		.summary_put_life = pg_summary_put_life,
		.session_fork_life = pg_session_fork_life,
		.embedding_put_life = pg_embedding_put_life,
	};
	/* Every replica must be given the same limits: each enforces its
	 * own (README, "PostgreSQL"). */
	d->max_sessions = cfg->max_sessions_per_tenant;
	d->max_msgs = cfg->max_session_messages;
	d->max_bytes = cfg->max_session_bytes;
	pthread_mutex_init(&d->pool_mu, NULL);
	{
		/* pg_acquire waits on the monotonic clock. */
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&d->pool_cv, &ca);
		pthread_condattr_destroy(&ca);
	}
	atomic_init(&d->gen, 1);
	atomic_init(&d->db_up, 1);
	atomic_init(&d->probed_us, 0);
	d->pool_size = cfg->pool_size ? cfg->pool_size : PG_POOL_DEFAULT;
	d->timeout_ms = cfg->timeout_ms;
	d->dsn = strdup(cfg->dsn);
	d->conns = calloc((size_t)d->pool_size, sizeof(*d->conns));
	if (!d->dsn || !d->conns) {
		pg_close(&d->base);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	if (getrandom(&d->origin, sizeof(d->origin), 0) != sizeof(d->origin))
		d->origin = (uint64_t)histd_now_us() ^ ((uint64_t)getpid() << 32);

	/* The schema first: the pool's connections prepare statements on
	 * its tables. */
	if ((rc = pg_connect(d, &pg, 0)) || (rc = pg_migrate(d, pg)) ||
	    (rc = pg_backfill(d, pg))) {
		if (pg)
			PQfinish(pg);
		pg_close(&d->base);
		return rc;
	}
	PQfinish(pg);
	for (int i = 0; i < d->pool_size; i++) {
		d->conns[i].next_free = d->free_list;
		d->free_list = &d->conns[i];
	}
	/* One connection now, so that a bad DSN or schema fails the start. */
	{
		pg_conn *c;

		if ((rc = pg_acquire(d, &c))) {
			pg_close(&d->base);
			return rc;
		}
		pg_release(d, c);
	}
	if ((rc = pg_group_new(d)) || (rc = pg_watch_start(d))) {
		pg_close(&d->base);
		return rc;
	}
	*out = &d->base;
	return 0;
}
