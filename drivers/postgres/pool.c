/*
 * Connections, statements, binary parameters and results, and the one
 * place where SQLSTATE becomes a HISTD_E* code.
 *
 * Every connection has every statement prepared once, when it connects
 * (one round trip, in pipeline mode). Parameters and results travel in
 * PostgreSQL's binary format: message bytes are never hex-encoded, and
 * integers are never printed and parsed.
 */
#include "pg.h"

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>

#include "histd_wire.h"

/* timestamptz counts microseconds from 2000-01-01; we count from 1970. */
#define PG_EPOCH_OFFSET_US INT64_C(946684800000000)

/* ---------------------------------------------------------------------- */
/* Errors                                                                  */

/* The first line of a libpq or server message, for our one-line errors. */
static void
first_line(char *out, size_t size, const char *msg)
{
	size_t n = 0;

	if (!msg)
		msg = "";
	while (msg[n] && msg[n] != '\n' && n + 1 < size)
		n++;
	memcpy(out, msg, n);
	out[n] = '\0';
}

/* The connection this thread last gave up waiting on (pg_result), and
 * how long it waited in ms, until pg_error reports it. */
static _Thread_local const PGconn *timed_out;
static _Thread_local int64_t timed_out_ms;
/* Set when pg_error reported such a timeout: pg_txn does not try again
 * on a new connection, which would only wait as long once more. */
static _Thread_local int reported_timeout;

/* A connect that fails after this long ran into connect_timeout (libpq
 * gives it at least 2 s), not a refusal. */
#define PG_CONNECT_SLOW_US INT64_C(1000000)

/* A server that answers nothing is down until the listener's probe says
 * otherwise: calls fail at once instead of each waiting as long, and
 * every pooled connection is made anew. */
static void
pg_unresponsive(pg_driver *d)
{
	atomic_store(&d->db_up, 0);
	atomic_fetch_add(&d->gen, 1);
	pg_lost(d);
}

int
pg_timed_out(pg_driver *d, const PGconn *pg)
{
	if (!pg || pg != timed_out)
		return 0;
	timed_out = NULL;
	reported_timeout = 1;
	if (d)
		pg_unresponsive(d);
	return 1;
}

int
pg_error(pg_driver *d, PGconn *pg, const PGresult *r, int *retry)
{
	const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
	const char *primary = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
	char line[256];

	if (retry)
		*retry = 0;
	if (pg_timed_out(d, pg)) {
		if (timed_out_ms <= 0)
			return histd_error_set(HISTD_EUNAVAILABLE,
					       "PostgreSQL did not answer in time");
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "PostgreSQL did not answer within %" PRId64
				       " ms", timed_out_ms);
	}
	if (!pg || PQstatus(pg) != CONNECTION_OK || !r || !state) {
		first_line(line, sizeof(line),
			   primary ? primary : pg ? PQerrorMessage(pg) : "no connection");
		if (d)
			pg_lost(d);
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "PostgreSQL is unreachable: %s", line);
	}
	first_line(line, sizeof(line), primary);

	/* Transaction rollbacks the server asks us to retry. */
	if (!strcmp(state, "40001") || !strcmp(state, "40P01")) {
		if (retry)
			*retry = 1;
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "PostgreSQL: %s (retries exhausted)", line);
	}
	if (!strcmp(state, "23505")) {
		const char *cons = PQresultErrorField(r, PG_DIAG_CONSTRAINT_NAME);

		if (cons && !strcmp(cons, "sessions_tenant_id"))
			return histd_error_set(HISTD_EEXISTS,
					       "session id already exists");
		if (cons && !strcmp(cons, "sessions_tenant_context_keys"))
			return histd_error_set(HISTD_EEXISTS,
					       "another session has the same context_keys");
		return histd_error_set(HISTD_EEXISTS, "PostgreSQL: %s", line);
	}
	/* The server or our link to it is going or gone: connection
	 * exceptions (08), operator intervention (57: shutdown, cancel by
	 * timeout), insufficient resources (53: too many connections, disk
	 * full), system errors (58), a read-only server after a failover
	 * (25006), a lock timeout (55P03). Nothing was acknowledged. */
	if (!strncmp(state, "08", 2) || !strncmp(state, "57", 2) ||
	    !strncmp(state, "53", 2) || !strncmp(state, "58", 2) ||
	    !strcmp(state, "25006") || !strcmp(state, "55P03")) {
		if (!strncmp(state, "08", 2) || !strncmp(state, "57P0", 4))
			if (d)
				pg_lost(d);
		return histd_error_set(HISTD_EUNAVAILABLE, "PostgreSQL: %s", line);
	}
	/* Data exceptions (22: bad encoding, out of range) and program
	 * limits (54: a key too large for an index) come from the input. */
	if (!strncmp(state, "22", 2) || !strncmp(state, "54", 2))
		return histd_error_set(HISTD_EINVALID, "PostgreSQL: %s", line);
	return histd_error_set(HISTD_EINTERNAL, "PostgreSQL: %s (SQLSTATE %s)",
			       line, state);
}

/* ---------------------------------------------------------------------- */
/* Connecting                                                              */

static int
prepare_all(pg_driver *d, PGconn *pg)
{
	int64_t deadline = pg_deadline(d);
	int rc = 0;

	/* One round trip for every statement. */
	if (!PQenterPipelineMode(pg))
		return pg_error(d, pg, NULL, NULL);
	for (int i = 0; i < ST_COUNT; i++)
		if (!PQsendPrepare(pg, pg_stmt_name[i], pg_stmt_sql[i], 0, NULL))
			return pg_error(d, pg, NULL, NULL);
	if (!PQpipelineSync(pg))
		return pg_error(d, pg, NULL, NULL);
	for (int i = 0; i < ST_COUNT; i++) {
		PGresult *r = pg_result(d, pg, deadline);

		if (!r)
			return pg_error(d, pg, NULL, NULL);
		if (PQresultStatus(r) != PGRES_COMMAND_OK && rc == 0) {
			if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED)
				rc = histd_error_set(HISTD_EINTERNAL,
						     "PostgreSQL: preparing statements aborted");
			else
				rc = pg_error(d, pg, r, NULL);
			if (rc == HISTD_EINTERNAL)
				histd_error_set(HISTD_EINTERNAL,
						"PostgreSQL: cannot prepare statement %s: %s",
						pg_stmt_name[i],
						PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)
						? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)
						: "aborted");
		}
		PQclear(r);
		r = pg_result(d, pg, deadline);    /* the NULL ending this statement */
		PQclear(r);
	}
	PGresult *sync = pg_result(d, pg, deadline);

	if (!sync || PQresultStatus(sync) != PGRES_PIPELINE_SYNC) {
		PQclear(sync);
		return rc ? rc : pg_error(d, pg, NULL, NULL);
	}
	PQclear(sync);
	if (!PQexitPipelineMode(pg))
		return rc ? rc : pg_error(d, pg, NULL, NULL);
	return rc;
}

/* Server notices (a CREATE ... IF NOT EXISTS that skipped, a FATAL on a
 * killed connection) are not for histd's log: the errors that matter
 * reach callers as codes. */
static void
quiet(void *arg, const char *message)
{
	(void)arg;
	(void)message;
}

/* Settings of every connection: reads join the session row and its
 * messages in one UNION ALL whose branches must come back in order (no
 * parallel plans). Connections that serve calls (`serving`) are made
 * non-blocking, so that pg_result bounds every wait, and get the
 * configured statement_timeout; the start's migrations and backfill run
 * unbounded. */
static int
session_settings(pg_driver *d, PGconn *pg, int serving)
{
	char sql[256];

	/* Read committed whatever the server's default: the statements
	 * count on each one seeing what committed before it began. */
	if (serving && d->timeout_ms > 0)
		snprintf(sql, sizeof(sql), "SET max_parallel_workers_per_gather"
			 " = 0; SET default_transaction_isolation = "
			 "'read committed'; SET statement_timeout = %d",
			 d->timeout_ms);
	else
		snprintf(sql, sizeof(sql),
			 "SET max_parallel_workers_per_gather = 0; SET "
			 "default_transaction_isolation = 'read committed'");
	if (serving && PQsetnonblocking(pg, 1) != 0)
		return pg_error(NULL, pg, NULL, NULL);
	return pg_simple(d, pg, sql, pg_deadline(d));
}

int
pg_simple(pg_driver *d, PGconn *pg, const char *sql, int64_t deadline)
{
	PGresult *r;
	int rc = 0;

	if (!PQsendQuery(pg, sql))
		return pg_error(NULL, pg, NULL, NULL);
	/* A result per statement, then NULL; the first failure counts. */
	while ((r = pg_result(d, pg, deadline)) != NULL) {
		ExecStatusType st = PQresultStatus(r);

		if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK && rc == 0)
			rc = pg_error(NULL, pg, r, NULL);
		PQclear(r);
	}
	if (rc == 0 && PQstatus(pg) != CONNECTION_OK)
		rc = pg_error(NULL, pg, NULL, NULL);
	return rc;
}

int
pg_connect(pg_driver *d, PGconn **out, int prepare)
{
	/* Our defaults come first: keywords in the DSN (expanded from dbname)
	 * override them. Keepalives find a dead peer that never answers. */
	const char *keys[] = {
		"connect_timeout", "keepalives", "keepalives_idle",
		"keepalives_interval", "keepalives_count", "application_name",
		"dbname", NULL,
	};
	const char *vals[] = {
		"3", "1", "10", "5", "3", "histd", d->dsn, NULL,
	};
	char line[256];
	PGconn *pg;
	int rc;

	pg = PQconnectdbParams(keys, vals, 1);
	if (!pg)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (PQstatus(pg) != CONNECTION_OK) {
		first_line(line, sizeof(line), PQerrorMessage(pg));
		PQfinish(pg);
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "PostgreSQL is unreachable: %s", line);
	}
	PQsetNoticeProcessor(pg, quiet, NULL);
	timed_out = NULL;       /* a new connection, maybe at a freed one's address */
	rc = session_settings(d, pg, prepare);
	if (rc == 0 && prepare)
		rc = prepare_all(d, pg);
	if (rc) {
		PQfinish(pg);
		return rc;
	}
	*out = pg;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The pool                                                                */

/* Whether an idle pooled connection is still open. The server may have
 * closed it meanwhile (idle_session_timeout, pg_terminate_backend): its
 * FATAL message and end of stream wait unread, and libpq still says OK.
 * A pooled connection neither listens nor has a statement running, so
 * the server has nothing to tell it: anything to read means it is going,
 * and a new one is made. */
static int
still_open(PGconn *pg)
{
	struct pollfd pf = { .fd = PQsocket(pg), .events = POLLIN };

	if (PQstatus(pg) != CONNECTION_OK || pf.fd < 0)
		return 0;
	return poll(&pf, 1, 0) == 0;
}

int
pg_acquire(pg_driver *d, pg_conn **out)
{
	pg_conn *c;
	int rc;

	/* A wait for a free connection is bounded as a statement is: with
	 * every connection held by slow statements, calls fail rather than
	 * queue without end (and hold back the committer). */
	if (d->timeout_ms > 0) {
		struct timespec until;

		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_sec += (d->timeout_ms + PG_TIMEOUT_GRACE_MS) / 1000;
		until.tv_nsec += (long)((d->timeout_ms + PG_TIMEOUT_GRACE_MS) %
					1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_mutex_lock(&d->pool_mu);
		while (!d->free_list &&
		       pthread_cond_timedwait(&d->pool_cv, &d->pool_mu,
					      &until) != ETIMEDOUT)
			;
	} else {
		pthread_mutex_lock(&d->pool_mu);
		while (!d->free_list)
			pthread_cond_wait(&d->pool_cv, &d->pool_mu);
	}
	if (!d->free_list) {
		pthread_mutex_unlock(&d->pool_mu);
		return histd_error_set(HISTD_EUNAVAILABLE, "no PostgreSQL "
				       "connection came free within %d ms "
				       "(all %d in use: --pool-size)",
				       d->timeout_ms + PG_TIMEOUT_GRACE_MS,
				       d->pool_size);
	}
	c = d->free_list;
	d->free_list = c->next_free;
	pthread_mutex_unlock(&d->pool_mu);

	if (c->pg && (c->gen != atomic_load(&d->gen) || !still_open(c->pg))) {
		PQfinish(c->pg);
		c->pg = NULL;
	}
	if (!c->pg) {
		int64_t started;

		/* During an outage, fail at once rather than each call
		 * waiting out a connect: the listener probes the server and
		 * says when it is back. */
		if (!atomic_load(&d->db_up)) {
			pg_release(d, c);
			return histd_error_set(HISTD_EUNAVAILABLE,
					       "PostgreSQL is unreachable");
		}
		started = histd_mono_us();
		c->gen = atomic_load(&d->gen);
		rc = pg_connect(d, &c->pg, 1);
		if (rc) {
			pg_release(d, c);
			/* Refused at once, the listener sees for itself. A
			 * connect that waited (connect_timeout: a hung server,
			 * or a host that drops packets) says the server does
			 * not answer: down, or every call would wait as long. */
			if (rc == HISTD_EUNAVAILABLE &&
			    histd_mono_us() - started >= PG_CONNECT_SLOW_US)
				pg_unresponsive(d);
			else if (rc == HISTD_EUNAVAILABLE)
				pg_lost(d);
			return rc;
		}
	}
	*out = c;
	return 0;
}

void
pg_release(pg_driver *d, pg_conn *c)
{
	if (c->pg && (PQstatus(c->pg) != CONNECTION_OK ||
		      PQpipelineStatus(c->pg) != PQ_PIPELINE_OFF ||
		      PQtransactionStatus(c->pg) != PQTRANS_IDLE)) {
		/* Broken, or left in a state we cannot trust: start over. */
		PQfinish(c->pg);
		c->pg = NULL;
	}
	pthread_mutex_lock(&d->pool_mu);
	c->next_free = d->free_list;
	d->free_list = c;
	pthread_cond_signal(&d->pool_cv);
	pthread_mutex_unlock(&d->pool_mu);
}

void
pg_lost(pg_driver *d)
{
	pg_watch_kick(d);
}

void
pg_notice_lost(pg_driver *d, pg_conn *c)
{
	pg_timed_out(d, c->pg);
	PQfinish(c->pg);
	c->pg = NULL;
	pg_watch_sweep(d);
}

/* ---------------------------------------------------------------------- */
/* Running statements                                                      */

static int
result_ok(const PGresult *r)
{
	ExecStatusType s = PQresultStatus(r);

	return s == PGRES_COMMAND_OK || s == PGRES_TUPLES_OK;
}

int64_t
pg_deadline(const pg_driver *d)
{
	if (d->timeout_ms <= 0)
		return INT64_MAX;
	return histd_mono_us() +
	       (int64_t)(d->timeout_ms + PG_TIMEOUT_GRACE_MS) * 1000;
}

PGresult *
pg_result(pg_driver *d, PGconn *pg, int64_t deadline)
{
	if (timed_out != pg)
		timed_out = NULL;
	for (;;) {
		int pending = PQflush(pg);        /* 1: output left to send */
		struct pollfd pf = { .fd = PQsocket(pg), .events = POLLIN };
		int64_t left;
		int n;

		if (pending < 0 || (!pending && !PQisBusy(pg)) || pf.fd < 0)
			break;          /* an answer, or an error PQgetResult gives */
		left = deadline - histd_mono_us();
		if (left <= 0) {
			/* Stuck: from now on libpq sees the connection closed. */
			shutdown(pf.fd, SHUT_RDWR);
			timed_out = pg;
			timed_out_ms = d->timeout_ms > 0
				       ? d->timeout_ms + PG_TIMEOUT_GRACE_MS : 0;
			break;
		}
		if (pending)
			pf.events |= POLLOUT;
		n = poll(&pf, 1, left / 1000 >= INT_MAX ? INT_MAX
			 : (int)((left + 999) / 1000));
		if (n < 0 && errno != EINTR)
			break;
		if (n > 0 && (pf.revents & (POLLIN | POLLERR | POLLHUP)) &&
		    !PQconsumeInput(pg))
			break;
	}
	return PQgetResult(pg);
}

int
pg_exec(pg_driver *d, pg_conn *c, enum pg_stmt st, const pg_params *p,
	PGresult **out, int *retry)
{
	static const pg_params none = { 0 };
	int64_t deadline = pg_deadline(d);
	PGresult *r = NULL, *next;
	int rc;

	if (!p)
		p = &none;
	if (retry)
		*retry = 0;
	if (!PQsendQueryPrepared(c->pg, pg_stmt_name[st], p->n, p->values,
				 p->lengths, p->formats, 1))
		return pg_error(d, c->pg, NULL, retry);
	/* One statement: its result, then NULL (the last result counts, as
	 * with PQexec). */
	while ((next = pg_result(d, c->pg, deadline)) != NULL) {
		PQclear(r);
		r = next;
	}
	if (r && result_ok(r)) {
		if (out)
			*out = r;
		else
			PQclear(r);
		return 0;
	}
	rc = pg_error(d, c->pg, r, retry);
	PQclear(r);
	return rc;
}

int
pg_pipeline(pg_driver *d, pg_conn *c, size_t n, const enum pg_stmt *st,
	    const pg_params *const *p, PGresult **res, int *retry,
	    size_t best_effort)
{
	size_t got = 0;        /* required statements answered OK */
	size_t required = 0;

	static const pg_params none = { 0 };
	PGconn *pg = c->pg;
	int64_t deadline = pg_deadline(d);
	int rc = 0, broken = 0;
	PGresult *r;

	if (retry)
		*retry = 0;
	for (size_t i = 0; i < n; i++) {
		res[i] = NULL;
		if (i < best_effort && st[i] != ST_COUNT)
			required++;
	}
	if (!PQenterPipelineMode(pg))
		return pg_error(d, pg, NULL, retry);
	for (size_t i = 0; i < n; i++) {
		const pg_params *pp = p[i] ? p[i] : &none;

		if (st[i] == ST_COUNT)
			continue;
		if (!PQsendQueryPrepared(pg, pg_stmt_name[st[i]], pp->n, pp->values,
					 pp->lengths, pp->formats, 1)) {
			/* Nothing can be read back reliably: drop it. */
			rc = pg_error(d, pg, NULL, retry);
			PQfinish(c->pg);
			c->pg = NULL;
			return rc;
		}
	}
	if (!PQpipelineSync(pg)) {
		rc = pg_error(d, pg, NULL, retry);
		PQfinish(c->pg);
		c->pg = NULL;
		return rc;
	}
	for (size_t i = 0; i < n && !broken; i++) {
		if (st[i] == ST_COUNT)
			continue;
		/* statement_timeout counts each statement from its own start,
		 * so may the wait for its answer (lock waits one after the
		 * other are not a server that stopped answering). */
		if (i > 0)
			deadline = pg_deadline(d);
		r = pg_result(d, pg, deadline);
		if (!r) {
			broken = 1;
			break;
		}
		if (result_ok(r)) {
			res[i] = r;
			if (i < best_effort)
				got++;
		} else {
			if (rc == 0 && i < best_effort &&
			    PQresultStatus(r) != PGRES_PIPELINE_ABORTED)
				rc = pg_error(d, pg, r, retry);
			if (PQstatus(pg) != CONNECTION_OK)
				broken = 1;
			PQclear(r);
		}
		/* Each statement's results end with a NULL. */
		while (!broken && (r = pg_result(d, pg, deadline)) != NULL) {
			PQclear(r);
			if (PQstatus(pg) != CONNECTION_OK)
				broken = 1;
		}
	}
	if (!broken) {
		r = pg_result(d, pg, deadline);
		if (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC)
			broken = 1;
		PQclear(r);
	}
	if (!broken && !PQexitPipelineMode(pg))
		broken = 1;
	if (broken && rc == 0 && got == required && best_effort < n) {
		/* Everything that matters was answered; only a notice after
		 * the COMMIT is lost. */
		pg_notice_lost(d, c);
		return 0;
	}
	if (broken) {
		if (rc == 0)
			rc = pg_error(d, pg, NULL, retry);
		for (size_t i = 0; i < n; i++) {
			PQclear(res[i]);
			res[i] = NULL;
		}
		PQfinish(c->pg);
		c->pg = NULL;
		return rc;
	}
	if (rc) {
		for (size_t i = 0; i < n; i++) {
			PQclear(res[i]);
			res[i] = NULL;
		}
	}
	return rc;
}

void
pg_rollback(pg_driver *d, pg_conn *c)
{
	if (c->pg && PQstatus(c->pg) == CONNECTION_OK &&
	    PQpipelineStatus(c->pg) == PQ_PIPELINE_OFF &&
	    PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
		PGresult *r;

		/* Failing, the connection is dropped at release. */
		if (pg_exec(d, c, ST_ROLLBACK, NULL, &r, NULL) == 0)
			PQclear(r);
	}
}

/* Attempts of one transaction: serialization failures and deadlocks are
 * retried a few times; a connection lost before COMMIT once, on a new
 * connection (the server may have restarted since it was pooled). */
#define PG_TXN_ATTEMPTS 5

int
pg_txn(pg_driver *d, pg_txn_fn fn, void *arg, int *unknown)
{
	int lost_retries = 0;
	int rc = 0;

	for (int attempt = 0; attempt < PG_TXN_ATTEMPTS; attempt++) {
		pg_conn *c;
		int retry = 0, commit_sent = 0, broken;

		reported_timeout = 0;
		rc = pg_acquire(d, &c);
		if (rc)
			return rc;
		rc = fn(d, c, arg, &retry, &commit_sent);
		broken = !c->pg || PQstatus(c->pg) != CONNECTION_OK;
		if (rc && !broken)
			pg_rollback(d, c);
		pg_release(d, c);
		if (rc == 0)
			return 0;
		if (broken && rc == HISTD_EUNAVAILABLE) {
			if (commit_sent) {
				char why[256];

				if (unknown)
					*unknown = 1;
				snprintf(why, sizeof(why), "%s", histd_error_message());
				return histd_error_set(HISTD_EUNAVAILABLE,
						       "%s during commit: the write may "
						       "not be applied", why);
			}
			if (lost_retries++ == 0 && !reported_timeout)
				continue;
			return rc;
		}
		if (!retry)
			return rc;
	}
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Parameters                                                              */

static void
put_be64(char *out, uint64_t v)
{
	v = htobe64(v);
	memcpy(out, &v, 8);
}

void
pg_p_i64(pg_params *p, int64_t v)
{
	int i = p->n++;

	put_be64(p->scratch[i], (uint64_t)v);
	p->values[i] = p->scratch[i];
	p->lengths[i] = 8;
	p->formats[i] = 1;
}

void
pg_p_i32(pg_params *p, int32_t v)
{
	int i = p->n++;
	uint32_t be = htobe32((uint32_t)v);

	memcpy(p->scratch[i], &be, 4);
	p->values[i] = p->scratch[i];
	p->lengths[i] = 4;
	p->formats[i] = 1;
}

void
pg_p_text(pg_params *p, const char *s)
{
	int i = p->n++;

	p->values[i] = s;
	p->lengths[i] = 0;
	p->formats[i] = 0;
}

void
pg_p_bytes(pg_params *p, const void *data, size_t len)
{
	int i = p->n++;

	p->values[i] = len ? data : "";
	p->lengths[i] = (int)len;
	p->formats[i] = 1;
}

void
pg_p_null(pg_params *p)
{
	int i = p->n++;

	p->values[i] = NULL;
	p->lengths[i] = 0;
	p->formats[i] = 1;
}

void
pg_p_ts(pg_params *p, int64_t us)
{
	pg_p_i64(p, us - PG_EPOCH_OFFSET_US);
}

/* ---------------------------------------------------------------------- */
/* Buffers and arrays                                                      */

void
pg_buf_put(pg_buf *b, const void *data, size_t len)
{
	if (b->oom)
		return;
	if (b->len + len > b->cap) {
		size_t cap = b->cap ? b->cap : 256;
		uint8_t *np;

		while (cap < b->len + len)
			cap *= 2;
		np = realloc(b->p, cap);
		if (!np) {
			b->oom = 1;
			return;
		}
		b->p = np;
		b->cap = cap;
	}
	if (len)
		memcpy(b->p + b->len, data, len);
	b->len += len;
}

void
pg_buf_free(pg_buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* Header: ndim, has-null flag, element type, then size and lower bound of
 * the one dimension; pg_arr_finish fills what is known only at the end. */
#define ARR_HEADER 20

void
pg_arr_init(pg_array *a, uint32_t elem_oid)
{
	uint8_t zero[ARR_HEADER] = { 0 };

	memset(a, 0, sizeof(*a));
	a->elem_oid = elem_oid;
	pg_buf_put(&a->buf, zero, sizeof(zero));
}

static void
arr_elem(pg_array *a, const void *data, int32_t len)
{
	uint32_t be = htobe32((uint32_t)len);

	pg_buf_put(&a->buf, &be, 4);
	if (len > 0)
		pg_buf_put(&a->buf, data, (size_t)len);
	a->n++;
}

void
pg_arr_i64(pg_array *a, int64_t v)
{
	char b[8];

	put_be64(b, (uint64_t)v);
	arr_elem(a, b, 8);
}

void
pg_arr_i32(pg_array *a, int32_t v)
{
	uint32_t be = htobe32((uint32_t)v);

	arr_elem(a, &be, 4);
}

void
pg_arr_i16(pg_array *a, int16_t v)
{
	uint16_t be = htobe16((uint16_t)v);

	arr_elem(a, &be, 2);
}

void
pg_arr_bytes(pg_array *a, const void *data, size_t len)
{
	arr_elem(a, data, (int32_t)len);
}

void
pg_arr_text(pg_array *a, const char *s)
{
	arr_elem(a, s, (int32_t)strlen(s));
}

void
pg_arr_ts(pg_array *a, int64_t us)
{
	pg_arr_i64(a, us - PG_EPOCH_OFFSET_US);
}

void
pg_arr_f32(pg_array *a, float v)
{
	uint32_t bits, be;

	memcpy(&bits, &v, 4);
	be = htobe32(bits);
	arr_elem(a, &be, 4);
}

void
pg_arr_null(pg_array *a)
{
	uint32_t be = htobe32(UINT32_MAX);   /* length -1 */

	pg_buf_put(&a->buf, &be, 4);
	a->n++;
	a->has_null = 1;
}

int
pg_arr_finish(pg_array *a)
{
	uint32_t h[5];

	if (a->buf.oom)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (a->n == 0) {
		/* An empty array has no dimensions. */
		h[0] = 0;
		h[1] = 0;
		h[2] = htobe32(a->elem_oid);
		memcpy(a->buf.p, h, 12);
		a->buf.len = 12;
		return 0;
	}
	h[0] = htobe32(1);
	h[1] = htobe32(a->has_null ? 1 : 0);
	h[2] = htobe32(a->elem_oid);
	h[3] = htobe32((uint32_t)a->n);
	h[4] = htobe32(1);
	memcpy(a->buf.p, h, sizeof(h));
	return 0;
}

void
pg_p_array(pg_params *p, pg_array *a)
{
	pg_p_bytes(p, a->buf.p, a->buf.len);
}

void
pg_arr_free(pg_array *a)
{
	pg_buf_free(&a->buf);
}

/* ---------------------------------------------------------------------- */
/* Results                                                                 */

int64_t
pg_r_i64(const PGresult *r, int row, int col)
{
	uint64_t v;

	if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 8)
		return 0;
	memcpy(&v, PQgetvalue(r, row, col), 8);
	return (int64_t)be64toh(v);
}

int32_t
pg_r_i32(const PGresult *r, int row, int col)
{
	uint32_t v;

	if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 4)
		return 0;
	memcpy(&v, PQgetvalue(r, row, col), 4);
	return (int32_t)be32toh(v);
}

int
pg_r_bool(const PGresult *r, int row, int col)
{
	return !PQgetisnull(r, row, col) && PQgetlength(r, row, col) == 1 &&
	       PQgetvalue(r, row, col)[0] != 0;
}

int
pg_r_null(const PGresult *r, int row, int col)
{
	return PQgetisnull(r, row, col);
}

const char *
pg_r_str(const PGresult *r, int row, int col, size_t *len)
{
	if (len)
		*len = (size_t)PQgetlength(r, row, col);
	return PQgetvalue(r, row, col);
}

int64_t
pg_r_ts(const PGresult *r, int row, int col)
{
	if (PQgetisnull(r, row, col))
		return 0;
	return pg_r_i64(r, row, col) + PG_EPOCH_OFFSET_US;
}
