/*
 * The postgres driver alone (drivers/postgres/), on the test cluster: what
 * the conformance suite cannot see from the interface.
 *
 * - the schema: versioned, migrated once by replicas that start together,
 *   refused when newer than the binary;
 * - the columns stored beside each message's bytes;
 * - group commit: concurrent appends share transactions;
 * - reads planned on the primary key, whatever the session's size;
 * - two driver instances on one database behave as replicas: the second
 *   one's hook gets every change the first one makes, in revision order,
 *   with its records, also after its LISTEN connection was killed;
 *   truncates reach it as CLEARED keeping system messages, also when it
 *   catches up on changes it missed; an update or summary that a clear
 *   or truncate follows within one catch-up still reaches it;
 * - limits hold for writes racing on two instances;
 * - appends answered later through on_result (HISTD_DEFERRED) get the
 *   same results as waiting ones, from a copy of the request, and every
 *   one queued at close is answered;
 * - sessions of a database from before schema version 6 (no active_at)
 *   expire by the newest message's created_at (the session TTL sweeper of
 *   server/context.c on this driver), those written after by active_at.
 */
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "context.h"
#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "pg.h"
#include "pgharness.h"
#include "start_gate.h"

static const char *cluster;

static int
group_setup(void **state)
{
	(void)state;
	return pgh_cluster_dsn(&cluster);
}

typedef struct fixture {
	char *dsn;
	histd_driver *d;
} fixture;

static histd_driver *
open_driver(const char *dsn, int pool)
{
	histd_driver_config cfg = { .dsn = dsn, .pool_size = pool };
	histd_driver *d = NULL;
	int rc = histd_driver_open("postgres", &cfg, &d);

	if (rc)
		fail_msg("open: %s", histd_error_message());
	return d;
}

static int
setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	if (!f || !(f->dsn = pgh_new_database(cluster, "drv")))
		return -1;
	*state = f;
	return 0;
}

static int
teardown(void **state)
{
	fixture *f = *state;

	if (f->d)
		histd_driver_close(f->d);
	pgh_drop_database(f->dsn);
	free(f->dsn);
	free(f);
	return 0;
}

static long
sql_long(const char *dsn, const char *sql)
{
	PGresult *r = pgh_sql(dsn, sql);
	long v;

	assert_non_null(r);
	assert_int_equal(PQntuples(r), 1);
	v = strtol(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return v;
}

static void
create(histd_driver *d, const char *id)
{
	histd_session in = { .tenant = "t", .id = (char *)id,
			     .created_at_us = histd_now_us() };
	histd_session *out = NULL;

	if (histd_driver_session_create(d, &in, &out))
		fail_msg("create: %s", histd_error_message());
	histd_session_free(out);
}

/* A packed message, seq 0, with role, author, created_at and text. */
static uint8_t *
pack_message_as(Histd__V1__Role role, const char *text, const char *author,
		int64_t secs, size_t *len)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &b };
	uint8_t *out;

	t.text = (char *)text;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &t;
	m.role = role;
	m.n_content = 1;
	m.content = blocks;
	m.author = (char *)author;
	if (secs) {
		ts.seconds = secs;
		ts.nanos = 250000000;
		m.created_at = &ts;
	}
	*len = histd__v1__message__get_packed_size(&m);
	out = malloc(*len);
	assert_non_null(out);
	histd__v1__message__pack(&m, out);
	return out;
}

static uint8_t *
pack_message(const char *text, const char *author, int64_t secs, size_t *len)
{
	return pack_message_as(HISTD__V1__ROLE__ROLE_ASSISTANT, text, author, secs,
			       len);
}

/* Appends one message of that role (a plain append: the fast path). */
static int
append_as(histd_driver *d, const char *id, Histd__V1__Role role,
	  const char *text, histd_append_result *res)
{
	size_t len;
	uint8_t *data = pack_message_as(role, text, "planner", 0, &len);
	histd_msg_in m = { .data = data, .len = len, .token_estimate = 7 };
	histd_append a = { .tenant = "t", .session_id = id, .msgs = &m,
			   .n_msgs = 1, .now_us = histd_now_us() };
	histd_append_result r;
	int rc = histd_driver_append(d, &a, res ? res : &r);

	free(data);
	return rc;
}

static int
append_text(histd_driver *d, const char *id, const char *text,
	    histd_append_result *res)
{
	return append_as(d, id, HISTD__V1__ROLE__ROLE_ASSISTANT, text, res);
}

/* ------------------------------------------------------------------------
 * Schema */

static void
refuses_a_schema_newer_than_the_binary(void **state)
{
	fixture *f = *state;
	histd_driver_config cfg = { .dsn = f->dsn, .pool_size = 2 };
	histd_driver *d = NULL;
	PGresult *r;

	histd_driver_close(open_driver(f->dsn, 2));
	assert_int_equal(sql_long(f->dsn, "SELECT version FROM histd_schema"),
			 PG_SCHEMA_VERSION);
	r = pgh_sql(f->dsn, "UPDATE histd_schema SET version = version + 1");
	assert_non_null(r);
	PQclear(r);
	assert_int_equal(histd_driver_open("postgres", &cfg, &d), HISTD_EINVALID);
	assert_null(d);
	assert_non_null(strstr(histd_error_message(), "newer"));
}

/* Closes f->d, runs sql (which makes the database what an older version
 * left), and opens it again: migrated to this binary's version. */
static void
reopen_migrated(fixture *f, const char *sql)
{
	PGresult *r;

	histd_driver_close(f->d);
	r = pgh_sql(f->dsn, sql);
	assert_non_null(r);
	PQclear(r);
	f->d = open_driver(f->dsn, 2);
	assert_int_equal(sql_long(f->dsn, "SELECT version FROM histd_schema"),
			 PG_SCHEMA_VERSION);
}

/* A database of schema version 3, whose context keys were unique by the
 * keys themselves: opening migrates it to the digest index, and the
 * sessions it holds are found by their keys, and still unique. */
static void
a_version_3_database_keeps_its_sessions_by_context_keys(void **state)
{
	fixture *f = *state;
	histd_kv kv = { "chat", "c-1" };
	histd_session in = { .tenant = "t", .id = "old", .context_keys = &kv,
			     .n_context_keys = 1, .created_at_us = histd_now_us() };
	histd_session *out = NULL;
	int created = 42;

	f->d = open_driver(f->dsn, 2);
	assert_int_equal(histd_driver_session_create(f->d, &in, &out), 0);
	histd_session_free(out);
	out = NULL;
	reopen_migrated(f, "DROP INDEX sessions_tenant_context_keys;"
			"DROP FUNCTION histd_keys_digest(jsonb);"
			"CREATE UNIQUE INDEX sessions_tenant_context_keys ON sessions"
			" (tenant, context_keys) WHERE context_keys IS NOT NULL;"
			"ALTER TABLE sessions DROP COLUMN active_at;"
			"UPDATE histd_schema SET version = 3");
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM pg_indexes WHERE"
				  " indexname = 'sessions_tenant_context_keys' AND"
				  " indexdef LIKE '%histd_keys_digest%'"), 1);
	in.id = "new";
	assert_int_equal(histd_driver_session_resolve(f->d, &in, &out, &created), 0);
	assert_int_equal(created, 0);
	assert_string_equal(out->id, "old");
	histd_session_free(out);
	out = NULL;
	assert_int_equal(histd_driver_session_create(f->d, &in, &out), HISTD_EEXISTS);
	assert_non_null(strstr(histd_error_message(), "context_keys"));
}

/* Appends one message dated `secs` (Unix seconds) by its caller. */
static void
append_dated(histd_driver *d, const char *id, int64_t secs)
{
	size_t len;
	uint8_t *data = pack_message_as(HISTD__V1__ROLE__ROLE_USER, "imported",
					"planner", secs, &len);
	histd_msg_in m = { .data = data, .len = len, .token_estimate = 3 };
	histd_append a = { .tenant = "t", .session_id = id, .msgs = &m,
			   .n_msgs = 1, .now_us = histd_now_us() };
	histd_append_result r;

	assert_int_equal(histd_driver_append(d, &a, &r), 0);
	free(data);
}

/* Session id of tenant "t", which must exist; the caller frees it. */
static histd_session *
session_of(histd_driver *d, const char *id)
{
	histd_session *s = NULL;

	assert_int_equal(histd_driver_session_get(d, "t", id, &s), 0);
	return s;
}

/* The session's active_at_us is in [lo, hi]. */
static void
expect_active_at(histd_driver *d, const char *id, int64_t lo, int64_t hi)
{
	histd_session *s = session_of(d, id);

	assert_in_range(s->active_at_us, lo, hi);
	histd_session_free(s);
}

/* A database of schema version 4, whose sessions have no active_at:
 * opening adds the column, NULL (unknown) for every stored session, and
 * the TTL sweeper dates those by their newest message's created_at, as
 * before; a session written after the upgrade is dated by its write. */
static void
a_version_4_database_keeps_the_old_ttl_rule_for_its_sessions(void **state)
{
	fixture *f = *state;
	const int64_t day = INT64_C(86400);
	int64_t now = histd_now_us() / 1000000;
	histd_context_config cc = { .workers = 1, .max_retries = 1,
				    .retry_base_us = 1000,
				    .session_ttl_us = day * 1000000,
				    .sweep_interval_us = 3600 * INT64_C(1000000) };
	histd_context *ctx = NULL;
	histd_session in = { .tenant = "t",
			     .created_at_us = (now - 10 * day) * 1000000 };
	histd_session *out = NULL;

	/* Created ten days ago; each with a message appended now. */
	f->d = open_driver(f->dsn, 2);
	for (int i = 0; i < 3; i++) {
		in.id = (char *)(const char *[]){ "idle", "talking", "later" }[i];
		assert_int_equal(histd_driver_session_create(f->d, &in, &out), 0);
		histd_session_free(out);
		out = NULL;
	}
	append_dated(f->d, "idle", now - 5 * day);     /* imported: old */
	append_dated(f->d, "talking", now);
	expect_active_at(f->d, "idle", (now - 1) * 1000000, INT64_MAX);
	reopen_migrated(f, "ALTER TABLE sessions DROP COLUMN active_at;"
			"UPDATE histd_schema SET version = 4");
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM sessions"
				  " WHERE active_at IS NULL"), 3);
	expect_active_at(f->d, "idle", 0, 0);
	/* After the upgrade: dated by the append, not the message. */
	append_dated(f->d, "later", now - 5 * day);
	expect_active_at(f->d, "later", (now - 1) * 1000000, INT64_MAX);

	assert_int_equal(histd_context_new(&ctx, f->d, &cc), 0);
	/* "idle": its newest message says five days (the old rule, which
	 * an append's time could not correct before version 6). */
	assert_int_equal(histd_context_sweep(ctx), 1);
	assert_int_equal(histd_driver_session_get(f->d, "t", "idle", &out),
			 HISTD_ENOTFOUND);
	expect_active_at(f->d, "talking", 0, 0);
	expect_active_at(f->d, "later", (now - 1) * 1000000, INT64_MAX);
	assert_int_equal(histd_context_sweep(ctx), 0);
	histd_context_free(ctx);
}

static void replicas_starting_together_migrate_once(void **state);

static void *
open_close(void *arg)
{
	histd_driver_config cfg = { .dsn = arg, .pool_size = 1 };
	histd_driver *d = NULL;

	if (histd_driver_open("postgres", &cfg, &d) == 0) {
		histd_driver_close(d);
		return NULL;
	}
	return (void *)1;
}

/* Replicas starting together on a database whose default isolation is
 * repeatable read, which deploy/postgres.md does not forbid: one that
 * waited for the migration lock must still see the version written. */
static void
replicas_starting_together_migrate_once_under_repeatable_read(void **state)
{
	fixture *f = *state;
	PGresult *r = pgh_sql(f->dsn, "DO $$ BEGIN EXECUTE format('ALTER "
			      "DATABASE %I SET default_transaction_isolation "
			      "= ''repeatable read''', current_database()); "
			      "END $$");

	assert_non_null(r);
	PQclear(r);
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM pg_settings "
				  "WHERE name = 'default_transaction_isolation'"
				  " AND setting = 'repeatable read'"), 1);
	replicas_starting_together_migrate_once(state);
}

static void
replicas_starting_together_migrate_once(void **state)
{
	fixture *f = *state;
	pthread_t th[6];
	void *why[6];
	int rc;

	rc = start_threads(th, 6, open_close, f->dsn, 0, NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));

	/* All joined before any assertion, which would leave them running. */
	for (int i = 0; i < 6; i++)
		pthread_join(th[i], &why[i]);
	for (int i = 0; i < 6; i++)
		assert_null(why[i]);
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM histd_schema"), 1);
	assert_int_equal(sql_long(f->dsn, "SELECT version FROM histd_schema"),
			 PG_SCHEMA_VERSION);
}

static void
open_without_a_dsn_or_with_a_dead_one_fails_cleanly(void **state)
{
	histd_driver_config none = { 0 };
	histd_driver_config dead = {
		.dsn = "host=/nonexistent port=1 dbname=x connect_timeout=1",
	};
	histd_driver *d = NULL;

	(void)state;
	assert_int_equal(histd_driver_open("postgres", &none, &d), HISTD_EINVALID);
	assert_int_equal(histd_driver_open("postgres", &dead, &d), HISTD_EUNAVAILABLE);
	assert_null(d);
}

/* ------------------------------------------------------------------------
 * Storage */

static void
messages_keep_queryable_columns_beside_their_bytes(void **state)
{
	fixture *f = *state;
	size_t len;
	uint8_t *data = pack_message("hello", "planner", 1700000000, &len);
	histd_msg_in m = { .data = data, .len = len, .token_estimate = 42 };
	histd_append a = { .tenant = "t", .session_id = "s", .msgs = &m,
			   .n_msgs = 1, .now_us = histd_now_us() };
	histd_append_result res;
	histd_read q = { .tenant = "t", .session_id = "s" };
	histd_read_result rr = { 0 };
	PGresult *r;
	uint8_t *want;
	size_t want_len;

	f->d = open_driver(f->dsn, 2);
	create(f->d, "s");
	assert_int_equal(histd_driver_append(f->d, &a, &res), 0);
	r = pgh_sql(f->dsn, "SELECT role, author, extract(epoch FROM created_at)::numeric(20,3),"
		    " token_estimate, seq, encode(data, 'hex') FROM messages");
	assert_non_null(r);
	assert_int_equal(PQntuples(r), 1);
	assert_string_equal(PQgetvalue(r, 0, 0), "3");
	assert_string_equal(PQgetvalue(r, 0, 1), "planner");
	assert_string_equal(PQgetvalue(r, 0, 2), "1700000000.250");
	assert_string_equal(PQgetvalue(r, 0, 3), "42");
	assert_string_equal(PQgetvalue(r, 0, 4), "1");
	/* Stored: the packed message as given (the seq is a column); read:
	 * the record with its seq in front. */
	want = histd_wire_with_seq(1, data, len, &want_len);
	assert_int_equal(histd_driver_read(f->d, &q, &rr), 0);
	assert_int_equal(rr.records.n, 1);
	assert_int_equal(rr.records.v[0].len, want_len);
	assert_memory_equal(rr.records.v[0].data, want, want_len);
	assert_int_equal(strlen(PQgetvalue(r, 0, 5)), len * 2);
	PQclear(r);
	histd_read_result_clear(&rr);
	free(want);
	free(data);
}

typedef struct appender {
	histd_driver *d;
	char id[16];
	int n;
	int failed;
} appender;

static void *
append_many(void *arg)
{
	appender *a = arg;

	for (int i = 0; i < a->n; i++)
		if (append_text(a->d, a->id, "x", NULL) != 0)
			a->failed++;
	return NULL;
}

static void
concurrent_appends_share_commits(void **state)
{
	enum { CALLERS = 16, EACH = 40 };
	fixture *f = *state;
	pthread_t th[CALLERS];
	appender ap[CALLERS];
	long txns;
	int rc;

	f->d = open_driver(f->dsn, 16);
	for (int i = 0; i < CALLERS; i++) {
		ap[i] = (appender){ .d = f->d, .n = EACH };
		snprintf(ap[i].id, sizeof(ap[i].id), "s%d", i % 4);
		if (i < 4)
			create(f->d, ap[i].id);
	}
	rc = start_threads(th, CALLERS, append_many, ap, sizeof(ap[0]), NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	for (int i = 0; i < CALLERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < CALLERS; i++)
		assert_int_equal(ap[i].failed, 0);
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages"),
			 CALLERS * EACH);
	/* Rows written by one transaction share its xmin. */
	txns = sql_long(f->dsn, "SELECT count(DISTINCT xmin::text) FROM messages");
	print_message("%d appends in %ld transactions\n", CALLERS * EACH, txns);
	assert_true(txns < CALLERS * EACH / 2);
	/* And seqs per session are 1..n, each once. */
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM (SELECT sid FROM messages"
				  " GROUP BY sid HAVING max(seq) = count(*)"
				  " AND count(DISTINCT seq) = count(*)) x"), 4);
}

/* The plan of a statement, run as a prepared statement with values. */
static char *
plan_of(const char *dsn, const char *stmt_sql, const char *args)
{
	PGconn *c = PQconnectdb(dsn);
	PGresult *r;
	size_t cap = 4096, len = 0;
	char *out = calloc(1, cap), sql[16384];

	assert_int_equal(PQstatus(c), CONNECTION_OK);
	snprintf(sql, sizeof(sql), "PREPARE q AS %s", stmt_sql);
	r = PQexec(c, sql);
	assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
	PQclear(r);
	snprintf(sql, sizeof(sql), "EXPLAIN EXECUTE q(%s)", args);
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQresultErrorMessage(r));
	for (int i = 0; i < PQntuples(r); i++) {
		const char *line = PQgetvalue(r, i, 0);

		if (len + strlen(line) + 2 > cap) {
			cap = (len + strlen(line) + 2) * 2;
			out = realloc(out, cap);
		}
		len += (size_t)sprintf(out + len, "%s\n", line);
	}
	PQclear(r);
	PQfinish(c);
	return out;
}

static void
reads_and_lists_use_indexes_not_scans(void **state)
{
	fixture *f = *state;
	PGresult *r;
	char *plan;

	f->d = open_driver(f->dsn, 2);
	create(f->d, "big");
	create(f->d, "small");
	/* 50,000 messages in one session, 100 in another. */
	r = pgh_sql(f->dsn,
		    "INSERT INTO messages (sid, seq, revision, role, author, created_at,"
		    " token_estimate, data) SELECT s.sid, g, g, 2, '', now(), 1, '\\x0a'"
		    " FROM sessions s, generate_series(1, 50000) g WHERE s.id = 'big';"
		    "INSERT INTO messages (sid, seq, revision, role, author, created_at,"
		    " token_estimate, data) SELECT s.sid, g, g, 2, '', now(), 1, '\\x0a'"
		    " FROM sessions s, generate_series(1, 100) g WHERE s.id = 'small';"
		    "INSERT INTO sessions (tenant, id, created_at, updated_at, revision)"
		    " SELECT 't', 'other-' || g, now(), now(), 1"
		    " FROM generate_series(1, 5000) g;"
		    "ANALYZE");
	assert_non_null(r);
	PQclear(r);

	plan = plan_of(f->dsn, pg_stmt_sql[ST_READ_LAST], "'t', 'big', 20, 4000000");
	assert_non_null(strstr(plan, "Index Scan Backward using messages_pkey"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	plan = plan_of(f->dsn, pg_stmt_sql[ST_READ_AFTER], "'t', 'big', 49000, 100, 4000000");
	assert_non_null(strstr(plan, "Index Scan using messages_pkey"));
	assert_null(strstr(plan, "Seq Scan on messages"));
	free(plan);
	/* The batch append finds its sessions by the (tenant, id) key. */
	plan = plan_of(f->dsn, pg_stmt_sql[ST_FAST_APPEND],
		       "'{t}', '{big}', '{1}', '{1}', '{1}', '{1}', '{2}', '{a}',"
		       " '{2024-01-01}', '{1}', '{\"\\\\x0a\"}', '{\"\"}', '{NULL}',"
		       " '{0}', '{0}', '2024-01-01'");
	assert_non_null(strstr(plan, "sessions_tenant_id"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	plan = plan_of(f->dsn, pg_stmt_sql[ST_FAST_APPEND_LIMITED],
		       "'{t}', '{big}', '{1}', '{1}', '{1}', '{1}', '{2}', '{a}',"
		       " '{2024-01-01}', '{1}', '{\"\\\\x0a\"}', '{\"\"}', '{NULL}',"
		       " '{0}', '{0}', '{1}', 100, 0, '2024-01-01'");
	assert_non_null(strstr(plan, "sessions_tenant_id"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	/* A resolve finds the holder of its keys by their digest. */
	plan = plan_of(f->dsn, pg_stmt_sql[ST_SESSION_BY_KEYS],
		       "'t', '{\"chat\": \"c-1\"}'");
	assert_non_null(strstr(plan, "sessions_tenant_context_keys"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	plan = plan_of(f->dsn, pg_stmt_sql[ST_SESSION_LIST], "'t', 'other-5', 101");
	assert_non_null(strstr(plan, "sessions_tenant_id"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	/* The count of a tenant's sessions for its limit reads the (tenant,
	 * id) index (here a tenant among many; counting 't', most of the
	 * table, the planner rightly scans it). */
	plan = plan_of(f->dsn, pg_stmt_sql[ST_SESSION_CREATE_LIMITED],
		       "'u', 'new', NULL, '{}', NULL, now(), 10");
	assert_non_null(strstr(plan, "sessions_tenant_id"));
	assert_null(strstr(plan, "Seq Scan"));
	free(plan);
	/* Truncate deletes a prefix by the primary key. */
	{
		char args[64];

		snprintf(args, sizeof(args), "%ld, 100, 5, now()",
			 sql_long(f->dsn, "SELECT sid FROM sessions WHERE id = 'big'"));
		plan = plan_of(f->dsn, pg_stmt_sql[ST_TRUNCATE], args);
		assert_non_null(strstr(plan, "messages_pkey"));
		assert_null(strstr(plan, "Seq Scan on messages"));
		free(plan);
	}
}

/* ------------------------------------------------------------------------
 * Two instances as replicas */

typedef struct seen_change {
	enum histd_change_kind kind;
	uint64_t revision;
	uint64_t cleared_to_seq;
	size_t n_records;
	uint64_t first_seq, last_seq;
	int records_null;
	int has_session;
	int system_kept;
} seen_change;

typedef struct hook {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	seen_change *v;
	size_t n, cap;
	uint64_t next_seq;     /* messages must come in seq order, no gap */
	/* ...but for messages a truncate removed before this instance caught
	 * up: they are skipped, and the CLEARED that follows covers them.
	 * gap_to: the highest seq skipped and not yet covered (0: none). */
	uint64_t gap_to;
	char gap[160];
	char error[160];
} hook;

/* Fails the test (h->mu held) on an order error or an uncovered gap. */
static void
hook_check(hook *h)
{
	if (h->error[0])
		fail_msg("%s", h->error);
	if (h->gap_to)
		fail_msg("%s, and no clear covered it", h->gap);
}

static void
on_change(void *ctx, const histd_change *c)
{
	hook *h = ctx;

	pthread_mutex_lock(&h->mu);
	if (h->n == h->cap) {
		h->cap = h->cap ? h->cap * 2 : 64;
		h->v = realloc(h->v, h->cap * sizeof(*h->v));
		if (!h->v)
			abort();
	}
	if (h->n && c->revision <= h->v[h->n - 1].revision && !h->error[0])
		snprintf(h->error, sizeof(h->error), "revision %" PRIu64 " after %"
			 PRIu64, c->revision, h->v[h->n - 1].revision);
	if (c->kind == HISTD_CHANGE_APPENDED) {
		for (size_t i = 0; c->records && i < c->n_records; i++) {
			uint64_t seq = c->records[i].seq;

			if (seq < h->next_seq && !h->error[0])
				snprintf(h->error, sizeof(h->error), "seq %" PRIu64
					 " after %" PRIu64, seq, h->next_seq - 1);
			if (seq > h->next_seq) {
				if (!h->gap_to)
					snprintf(h->gap, sizeof(h->gap), "seq %"
						 PRIu64 " after %" PRIu64, seq,
						 h->next_seq - 1);
				h->gap_to = seq - 1;
			}
			h->next_seq = seq + 1;
		}
	}
	if ((c->kind == HISTD_CHANGE_CLEARED ||
	     c->kind == HISTD_CHANGE_REPLACED) && h->gap_to &&
	    c->cleared_to_seq >= h->gap_to)
		h->gap_to = 0;
	/* A truncate clears below last_seq: appends go on after it. */
	if ((c->kind == HISTD_CHANGE_REPLACED || c->kind == HISTD_CHANGE_CLEARED) &&
	    (c->n_records ? c->records[c->n_records - 1].seq
			  : c->cleared_to_seq) + 1 > h->next_seq)
		h->next_seq = (c->n_records ? c->records[c->n_records - 1].seq
					    : c->cleared_to_seq) + 1;
	h->v[h->n++] = (seen_change){
		.kind = c->kind, .revision = c->revision,
		.cleared_to_seq = c->cleared_to_seq, .n_records = c->n_records,
		.first_seq = c->records && c->n_records ? c->records[0].seq : 0,
		.last_seq = c->records && c->n_records ? c->records[c->n_records - 1].seq : 0,
		.records_null = c->records == NULL,
		.has_session = c->session != NULL,
		.system_kept = c->system_kept,
	};
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* Waits until the hook saw revision `rev`. */
static void
wait_revision(hook *h, uint64_t rev, int timeout_ms)
{
	int64_t give_up = histd_mono_us() + (int64_t)timeout_ms * 1000;

	pthread_mutex_lock(&h->mu);
	while (!(h->n && h->v[h->n - 1].revision >= rev)) {
		struct timespec ts;

		if (histd_mono_us() > give_up) {
			pthread_mutex_unlock(&h->mu);
			fail_msg("revision %" PRIu64 " not notified within %d ms "
				 "(have %zu changes)", rev, timeout_ms, h->n);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&h->cv, &h->mu, &ts);
	}
	pthread_mutex_unlock(&h->mu);
}

static uint64_t
revision_of(histd_driver *d, const char *id)
{
	histd_session *s = session_of(d, id);
	uint64_t rev = s->revision;

	histd_session_free(s);
	return rev;
}

/* The second instance reads the session: a subscriber's snapshot. */
static void
track(histd_driver *d, const char *id)
{
	histd_read q = { .tenant = "t", .session_id = id, .last_n = 1 };
	histd_read_result r = { 0 };

	assert_int_equal(histd_driver_read(d, &q, &r), 0);
	histd_read_result_clear(&r);
}

static void
second_instance_gets_every_change_of_the_first_in_order(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	histd_append_result res;
	uint64_t rev, cleared;
	size_t len;
	uint8_t *sum;
	histd_record summary;
	histd_kv label = { "team", "red" };
	histd_session *upd = NULL;
	pthread_t th[4];
	appender ap[4];
	int rc;
	const enum histd_change_kind tail[] = {
		HISTD_CHANGE_CLEARED, HISTD_CHANGE_SUMMARY, HISTD_CHANGE_UPDATED,
		HISTD_CHANGE_DELETED,
	};

	f->d = open_driver(f->dsn, 8);
	d2 = open_driver(f->dsn, 4);
	histd_driver_set_notify(d2, on_change, &h);
	create(f->d, "s");
	track(d2, "s");

	for (int i = 0; i < 4; i++) {
		ap[i] = (appender){ .d = f->d, .n = 25 };
		snprintf(ap[i].id, sizeof(ap[i].id), "s");
	}
	rc = start_threads(th, 4, append_many, ap, sizeof(ap[0]), NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < 4; i++)
		assert_int_equal(ap[i].failed, 0);
	rev = revision_of(f->d, "s");
	assert_int_equal(rev, 101);
	wait_revision(&h, rev, 10000);
	assert_int_equal(h.next_seq, 101);
	for (size_t i = 0; i < h.n; i++) {
		assert_int_equal(h.v[i].kind, HISTD_CHANGE_APPENDED);
		assert_int_equal(h.v[i].records_null, 0);
	}

	/* Each change is waited for before the next: a replica that reads a
	 * change only after the session was deleted finds nothing left to
	 * read, and reports the deletion alone. */
	assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev, &cleared, NULL), 0);
	wait_revision(&h, rev, 10000);
	sum = pack_message("summary", "", 0, &len);
	summary = (histd_record){ .seq = 100, .token_estimate = 3, .len = (uint32_t)len,
				  .data = sum };
	assert_int_equal(histd_driver_summary_put(f->d, "t", "s", 0, &summary, &rev,
						  NULL), 0);
	free(sum);
	wait_revision(&h, rev, 10000);
	assert_int_equal(histd_driver_session_update(f->d, "t", "s", 0, &label, 1,
						     NULL, 0, histd_now_us(), &upd,
						     NULL), 0);
	histd_session_free(upd);
	rev = revision_of(f->d, "s");
	wait_revision(&h, rev, 10000);
	assert_int_equal(histd_driver_session_delete(f->d, "t", "s", 0, NULL), 0);
	wait_revision(&h, rev + 1, 10000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	assert_true(h.n >= 4);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(h.v[h.n - 4 + i].kind, tail[i]);
	assert_int_equal(h.v[h.n - 4].cleared_to_seq, 100);
	assert_int_equal(h.v[h.n - 3].n_records, 1);
	assert_int_equal(h.v[h.n - 2].has_session, 1);
	pthread_mutex_unlock(&h.mu);
	(void)res;
	histd_driver_close(d2);
	free(h.v);
}

static void
second_instance_catches_up_after_its_listener_was_killed(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	uint64_t rev;

	f->d = open_driver(f->dsn, 4);
	d2 = open_driver(f->dsn, 4);
	histd_driver_set_notify(d2, on_change, &h);
	create(f->d, "s");
	track(d2, "s");
	for (int round = 0; round < 5; round++) {
		PGresult *r = pgh_sql(f->dsn, "SELECT pg_terminate_backend(pid) FROM "
				      "pg_stat_activity WHERE application_name = "
				      "'histd listener' AND datname = current_database()");

		assert_non_null(r);
		PQclear(r);
		/* Appends while the listeners reconnect: their notices may be
		 * lost; the catch-up after the reconnect must cover them. */
		for (int i = 0; i < 20; i++)
			assert_int_equal(append_text(f->d, "s", "y", NULL), 0);
	}
	rev = revision_of(f->d, "s");
	wait_revision(&h, rev, 15000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	assert_int_equal(h.next_seq, 101);
	pthread_mutex_unlock(&h.mu);
	histd_driver_close(d2);
	free(h.v);
}

static void
own_changes_reach_the_hook_before_the_call_returns(void **state)
{
	fixture *f = *state;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	histd_append_result res;

	f->d = open_driver(f->dsn, 2);
	histd_driver_set_notify(f->d, on_change, &h);
	create(f->d, "s");
	for (int i = 0; i < 10; i++) {
		assert_int_equal(append_text(f->d, "s", "z", &res), 0);
		pthread_mutex_lock(&h.mu);
		assert_int_equal(h.n, (size_t)i + 1);
		assert_int_equal(h.v[i].revision, res.revision);
		assert_int_equal(h.v[i].first_seq, res.first_seq);
		pthread_mutex_unlock(&h.mu);
	}
	histd_driver_set_notify(f->d, NULL, NULL);
	free(h.v);
}

/* The backend of the newest listener connection (the last driver
 * opened): stopped, it delivers no notice until it continues, and then
 * all of them at once. */
static pid_t
newest_listener_backend(const char *dsn)
{
	return (pid_t)sql_long(dsn, "SELECT pid FROM pg_stat_activity WHERE "
			       "application_name = 'histd listener' AND datname "
			       "= current_database() ORDER BY backend_start DESC "
			       "LIMIT 1");
}

/* The index of the change of this kind at this revision; fails if none. */
static size_t
seen_at(hook *h, size_t from, enum histd_change_kind kind, uint64_t rev)
{
	for (size_t i = from; i < h->n; i++)
		if (h->v[i].kind == kind && h->v[i].revision == rev)
			return i;
	fail_msg("no change of kind %d at revision %" PRIu64, kind, rev);
	return 0;
}

/* A second instance that learns of several changes at once reads them in
 * one catch-up; a clear or truncate among them removes messages, not an
 * earlier UpdateSession (labels and config stay) nor a summary that
 * outlives the truncate: both still reach its hook, in order. */
static void
a_catch_up_keeps_the_update_and_summary_a_clear_or_truncate_follows(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	histd_kv label = { "team", "red" };
	histd_session *upd = NULL;
	histd_append_result res;
	histd_record summary;
	uint64_t rev, urev, crev, srev, cleared, cur;
	uint8_t *sum;
	size_t from, len, at_u, at_c, at_s;
	pid_t pid;

	f->d = open_driver(f->dsn, 4);
	d2 = open_driver(f->dsn, 4);
	histd_driver_set_notify(d2, on_change, &h);
	create(f->d, "s");
	track(d2, "s");
	assert_int_equal(append_text(f->d, "s", "a", NULL), 0);
	wait_revision(&h, revision_of(f->d, "s"), 10000);
	pid = newest_listener_backend(f->dsn);
	assert_true(pid > 0);

	/* An update, then a clear. */
	from = h.n;
	assert_int_equal(kill(pid, SIGSTOP), 0);
	assert_int_equal(histd_driver_session_update(f->d, "t", "s", 0, &label, 1,
						     NULL, 0, histd_now_us(), &upd,
						     NULL), 0);
	urev = upd->revision;
	histd_session_free(upd);
	assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &crev, &cleared,
					    NULL), 0);
	assert_int_equal(kill(pid, SIGCONT), 0);
	wait_revision(&h, crev, 15000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	at_u = seen_at(&h, from, HISTD_CHANGE_UPDATED, urev);
	at_c = seen_at(&h, from, HISTD_CHANGE_CLEARED, crev);
	assert_true(at_u < at_c);
	assert_int_equal(h.v[at_u].has_session, 1);
	pthread_mutex_unlock(&h.mu);

	/* A clear, appends, a summary of the last two, a truncate below it. */
	pid = newest_listener_backend(f->dsn);
	from = h.n;
	assert_int_equal(kill(pid, SIGSTOP), 0);
	assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &crev, &cleared,
					    NULL), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(append_text(f->d, "s", "b", &res), 0);
	sum = pack_message("summary", "", 0, &len);
	summary = (histd_record){ .seq = res.first_seq, .token_estimate = 3,
				  .len = (uint32_t)len, .data = sum };
	assert_int_equal(histd_driver_summary_put(f->d, "t", "s", 0, &summary,
						  &srev, NULL), 0);
	free(sum);
	assert_int_equal(histd_driver_truncate(f->d, "t", "s", res.first_seq - 2,
					       0, &rev, &cur), 0);
	assert_int_equal(kill(pid, SIGCONT), 0);
	wait_revision(&h, rev, 15000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	at_s = seen_at(&h, from, HISTD_CHANGE_SUMMARY, srev);
	assert_int_equal(h.v[at_s].n_records, 1);
	assert_int_equal(h.v[at_s].first_seq, res.first_seq);
	assert_int_equal(h.v[h.n - 1].revision, rev);
	pthread_mutex_unlock(&h.mu);
	histd_driver_close(d2);
	free(h.v);
}

/* ------------------------------------------------------------------------
 * Truncate, seen by a second instance */

static int
truncate_to(histd_driver *d, const char *id, uint64_t up_to)
{
	uint64_t rev, cur;

	return histd_driver_truncate(d, "t", id, up_to, 0, &rev, &cur);
}

static void
truncate_reaches_the_second_instance_as_cleared_keeping_system_messages(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	histd_append_result res;
	uint64_t rev;

	f->d = open_driver(f->dsn, 2);
	d2 = open_driver(f->dsn, 2);
	histd_driver_set_notify(d2, on_change, &h);
	create(f->d, "s");
	track(d2, "s");
	assert_int_equal(append_as(f->d, "s", HISTD__V1__ROLE__ROLE_SYSTEM,
				   "be brief", NULL), 0);
	for (int i = 0; i < 4; i++)
		assert_int_equal(append_text(f->d, "s", "w", &res), 0);
	assert_int_equal(truncate_to(f->d, "s", 4), 0);
	rev = revision_of(f->d, "s");
	wait_revision(&h, rev, 10000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	assert_int_equal(h.v[h.n - 1].kind, HISTD_CHANGE_CLEARED);
	assert_int_equal(h.v[h.n - 1].cleared_to_seq, 4);
	assert_int_equal(h.v[h.n - 1].system_kept, 1);
	pthread_mutex_unlock(&h.mu);
	/* The stored row says so too: a truncate, not a clear. */
	assert_int_equal(sql_long(f->dsn, "SELECT truncate_revision FROM sessions"),
			 rev);
	assert_int_equal(sql_long(f->dsn, "SELECT clear_revision FROM sessions"), 0);
	/* Left: the system message (seq 1) and seq 5. */
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages"), 2);
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages"
				  " WHERE (seq = 1 AND role = 1) OR seq = 5"), 2);
	histd_driver_close(d2);
	free(h.v);
}

/* A Clear of a session that holds nothing (new, or cleared already) moves
 * no cleared_to_seq, but it is a change at its revision all the same: the
 * second instance reports it, as the first does. */
static void
a_clear_of_an_empty_session_reaches_the_second_instance(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	hook h = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
		   .next_seq = 1 };
	histd_append_result res;
	uint64_t rev, cleared;
	const struct { enum histd_change_kind kind; uint64_t rev, cleared; } want[] = {
		{ HISTD_CHANGE_CLEARED, 2, 0 }, { HISTD_CHANGE_APPENDED, 3, 0 },
		{ HISTD_CHANGE_CLEARED, 4, 1 }, { HISTD_CHANGE_CLEARED, 5, 1 },
		{ HISTD_CHANGE_APPENDED, 6, 1 },
	};

	f->d = open_driver(f->dsn, 2);
	d2 = open_driver(f->dsn, 2);
	histd_driver_set_notify(d2, on_change, &h);
	create(f->d, "s");
	track(d2, "s");
	/* Each change is waited for: every one is caught up on its own. */
	assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev, &cleared, NULL), 0);
	assert_int_equal(rev, 2);
	wait_revision(&h, 2, 10000);
	assert_int_equal(append_text(f->d, "s", "a", &res), 0);
	wait_revision(&h, 3, 10000);
	for (uint64_t want_rev = 4; want_rev <= 5; want_rev++) {
		assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev, &cleared,
						    NULL), 0);
		assert_int_equal(rev, want_rev);
		wait_revision(&h, want_rev, 10000);
	}
	assert_int_equal(append_text(f->d, "s", "b", &res), 0);
	wait_revision(&h, 6, 10000);
	pthread_mutex_lock(&h.mu);
	hook_check(&h);
	assert_int_equal(h.n, 5);
	for (size_t i = 0; i < 5; i++) {
		assert_int_equal(h.v[i].kind, want[i].kind);
		assert_int_equal(h.v[i].revision, want[i].rev);
		if (want[i].kind == HISTD_CHANGE_CLEARED)
			assert_int_equal(h.v[i].cleared_to_seq, want[i].cleared);
	}
	pthread_mutex_unlock(&h.mu);
	histd_driver_close(d2);
	free(h.v);
}

/* What a subscriber holds, rebuilt from the changes alone: each seq's
 * role (0: not held). */
#define MIRROR_SEQS 256

typedef struct mirror {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t last_rev;
	int role[MIRROR_SEQS];
	int cleared_kept;        /* CLEARED changes with system_kept */
	int replaced;
	char error[160];
} mirror;

static int
record_role(const histd_record *r)
{
	Histd__V1__Message *m = histd__v1__message__unpack(NULL, r->len, r->data);
	int role = m ? (int)m->role : -1;

	if (m)
		histd__v1__message__free_unpacked(m, NULL);
	return role;
}

static void
mirror_add(mirror *m, const histd_change *c)
{
	if (!c->records && c->n_records && !m->error[0])
		snprintf(m->error, sizeof(m->error), "revision %" PRIu64
			 " came without its records", c->revision);
	for (size_t i = 0; c->records && i < c->n_records; i++) {
		uint64_t seq = c->records[i].seq;

		if (seq >= MIRROR_SEQS || m->role[seq]) {
			if (!m->error[0])
				snprintf(m->error, sizeof(m->error), "seq %" PRIu64
					 " delivered twice or out of range", seq);
			continue;
		}
		m->role[seq] = record_role(&c->records[i]);
	}
}

static void
mirror_change(void *ctx, const histd_change *c)
{
	mirror *m = ctx;

	pthread_mutex_lock(&m->mu);
	if (c->revision <= m->last_rev && !m->error[0])
		snprintf(m->error, sizeof(m->error), "revision %" PRIu64 " after %"
			 PRIu64, c->revision, m->last_rev);
	m->last_rev = c->revision;
	switch (c->kind) {
	case HISTD_CHANGE_APPENDED:
		mirror_add(m, c);
		break;
	case HISTD_CHANGE_REPLACED:
		/* Every message goes; the records are what the session holds. */
		memset(m->role, 0, sizeof(m->role));
		mirror_add(m, c);
		m->replaced++;
		break;
	case HISTD_CHANGE_CLEARED:
		for (uint64_t seq = 0; seq <= c->cleared_to_seq && seq < MIRROR_SEQS;
		     seq++)
			if (!(c->system_kept &&
			      m->role[seq] == HISTD__V1__ROLE__ROLE_SYSTEM))
				m->role[seq] = 0;
		m->cleared_kept += c->system_kept;
		break;
	default:
		break;
	}
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
}

static void
mirror_wait(mirror *m, uint64_t rev, int timeout_ms)
{
	int64_t give_up = histd_mono_us() + (int64_t)timeout_ms * 1000;

	pthread_mutex_lock(&m->mu);
	while (m->last_rev < rev) {
		struct timespec ts;

		if (histd_mono_us() > give_up) {
			pthread_mutex_unlock(&m->mu);
			fail_msg("revision %" PRIu64 " not notified within %d ms "
				 "(have %" PRIu64 ")", rev, timeout_ms, m->last_rev);
		}
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&m->cv, &m->mu, &ts);
	}
	pthread_mutex_unlock(&m->mu);
}

/* The mirror holds exactly what the session stores, with their roles. */
static void
expect_mirror_is_stored(mirror *m, histd_driver *d, const char *id)
{
	histd_read q = { .tenant = "t", .session_id = id };
	histd_read_result r = { 0 };
	int want[MIRROR_SEQS] = { 0 };

	assert_int_equal(histd_driver_read(d, &q, &r), 0);
	for (size_t i = 0; i < r.records.n; i++) {
		assert_true(r.records.v[i].seq < MIRROR_SEQS);
		want[r.records.v[i].seq] = record_role(&r.records.v[i]);
	}
	histd_read_result_clear(&r);
	pthread_mutex_lock(&m->mu);
	if (m->error[0])
		fail_msg("%s", m->error);
	for (int seq = 0; seq < MIRROR_SEQS; seq++)
		if (m->role[seq] != want[seq])
			fail_msg("seq %d: the changes say role %d, the session "
				 "stores role %d", seq, m->role[seq], want[seq]);
	pthread_mutex_unlock(&m->mu);
}

/* The pid of the one listener of this database not in `others` (a
 * comma-separated list, "0" for none); 0 if there is none yet. */
static long
listener_pid(const char *dsn, const char *others)
{
	char sql[512];
	PGresult *r;
	long pid = 0;

	snprintf(sql, sizeof(sql), "SELECT pid FROM pg_stat_activity WHERE "
		 "application_name = 'histd listener' AND datname = "
		 "current_database() AND pid NOT IN (%s)", others);
	r = pgh_sql(dsn, sql);
	assert_non_null(r);
	if (PQntuples(r) == 1)
		pid = strtol(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return pid;
}

/*
 * The second instance misses notices on purpose: its listener is killed
 * while a lock on idempotency_keys (which its reconnect prepares
 * statements on, and which plain appends, clear and truncate never touch)
 * holds the new listener back. The first instance writes meanwhile; once
 * the lock goes, the second catches up on the whole gap at once. Replayed
 * on a mirror, the changes it delivers must give what is stored: the
 * messages that outlived a truncate, its system messages, a clear before
 * or after it.
 */
static void
a_second_instance_that_missed_truncates_catches_up_to_the_stored_session(void **state)
{
	fixture *f = *state;
	histd_driver *d2;
	mirror m = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };
	const Histd__V1__Role SYS = HISTD__V1__ROLE__ROLE_SYSTEM,
		USER = HISTD__V1__ROLE__ROLE_USER;
	uint64_t rev, cleared;
	histd_session *s = NULL;
	char mine[32];
	long pid;

	/* One pooled connection: every write reuses it, none prepares. */
	f->d = open_driver(f->dsn, 1);
	snprintf(mine, sizeof(mine), "%ld", listener_pid(f->dsn, "0"));
	d2 = open_driver(f->dsn, 2);
	histd_driver_set_notify(d2, mirror_change, &m);
	create(f->d, "s");
	track(d2, "s");
	assert_int_equal(append_as(f->d, "s", SYS, "be brief", NULL), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(append_as(f->d, "s", USER, "u", NULL), 0);
	assert_int_equal(truncate_to(f->d, "s", 2), 0);
	mirror_wait(&m, revision_of(f->d, "s"), 10000);
	expect_mirror_is_stored(&m, f->d, "s");
	assert_int_equal(m.cleared_kept, 1);

	for (int round = 0; round < 3; round++) {
		PGconn *lk = PQconnectdb(f->dsn);
		PGresult *r;
		char sql[96];
		int kept = m.cleared_kept, replaced = m.replaced;

		assert_int_equal(PQstatus(lk), CONNECTION_OK);
		r = PQexec(lk, "BEGIN; LOCK TABLE idempotency_keys IN ACCESS "
			   "EXCLUSIVE MODE");
		assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
		PQclear(r);
		pid = listener_pid(f->dsn, mine);
		assert_true(pid > 0);
		snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%ld, 10000)",
			 pid);
		PQclear(pgh_sql(f->dsn, sql));

		assert_int_equal(histd_driver_session_get(f->d, "t", "s", &s), 0);
		switch (round) {
		case 0:
			/* Appends, a truncate of some of them, an append. */
			assert_int_equal(append_as(f->d, "s", USER, "a", NULL), 0);
			assert_int_equal(append_as(f->d, "s", SYS, "b", NULL), 0);
			assert_int_equal(append_as(f->d, "s", USER, "c", NULL), 0);
			assert_int_equal(truncate_to(f->d, "s", s->last_seq + 2), 0);
			assert_int_equal(append_as(f->d, "s", USER, "d", NULL), 0);
			break;
		case 1:
			/* A clear, then system and user messages, a truncate
			 * of everything: only the new system message stays. */
			assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev,
							    &cleared, NULL), 0);
			assert_int_equal(append_as(f->d, "s", SYS, "e", NULL), 0);
			assert_int_equal(append_as(f->d, "s", USER, "f", NULL), 0);
			assert_int_equal(append_as(f->d, "s", USER, "g", NULL), 0);
			assert_int_equal(truncate_to(f->d, "s", UINT64_MAX), 0);
			break;
		default:
			/* A truncate, then a clear that takes the system
			 * messages too, then an append. */
			assert_int_equal(append_as(f->d, "s", USER, "h", NULL), 0);
			assert_int_equal(truncate_to(f->d, "s", s->last_seq + 1), 0);
			assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev,
							    &cleared, NULL), 0);
			assert_int_equal(append_as(f->d, "s", USER, "i", NULL), 0);
			break;
		}
		histd_session_free(s);
		s = NULL;
		rev = revision_of(f->d, "s");
		/* Nothing of that can have reached the second instance. */
		pthread_mutex_lock(&m.mu);
		assert_true(m.last_rev < rev);
		pthread_mutex_unlock(&m.mu);
		r = PQexec(lk, "COMMIT");
		PQclear(r);
		PQfinish(lk);
		mirror_wait(&m, rev, 15000);
		expect_mirror_is_stored(&m, f->d, "s");
		/* The catch-up took the path this round is about. */
		if (round == 0)
			assert_int_equal(m.cleared_kept, kept + 1);
		if (round == 1)
			assert_int_equal(m.replaced, replaced + 1);
		if (round == 2)
			assert_int_equal(m.cleared_kept, kept);
		/* Its listener is back before the next round kills it. */
		for (int i = 0; i < 200 && !listener_pid(f->dsn, mine); i++)
			usleep(25000);
	}
	/* And live notices again. */
	assert_int_equal(append_as(f->d, "s", USER, "j", NULL), 0);
	assert_int_equal(append_as(f->d, "s", USER, "k", NULL), 0);
	assert_int_equal(histd_driver_session_get(f->d, "t", "s", &s), 0);
	assert_int_equal(truncate_to(f->d, "s", s->last_seq - 1), 0);
	histd_session_free(s);
	mirror_wait(&m, revision_of(f->d, "s"), 10000);
	expect_mirror_is_stored(&m, f->d, "s");
	histd_driver_close(d2);
}

/* ------------------------------------------------------------------------
 * Limits, on two instances at once */

static histd_driver *
open_limited(const char *dsn, uint64_t sessions, uint64_t msgs)
{
	histd_driver_config cfg = {
		.dsn = dsn, .pool_size = 4, .max_sessions_per_tenant = sessions,
		.max_session_messages = msgs,
	};
	histd_driver *d = NULL;

	if (histd_driver_open("postgres", &cfg, &d))
		fail_msg("open: %s", histd_error_message());
	return d;
}

typedef struct creator {
	histd_driver *d;
	int id;
	start_gate *go;
	int ok, limited, other;
	char error[160];
} creator;

static void
count_result(creator *c, int rc, const char *want)
{
	if (rc == 0)
		c->ok++;
	else if (rc == HISTD_ELIMIT && strstr(histd_error_message(), want))
		c->limited++;
	else if (!c->other++)
		snprintf(c->error, sizeof(c->error), "%d: %s", rc,
			 histd_error_message());
}

/* A create, a resolve of new keys and a fork, each a new session. */
static void *
create_three(void *arg)
{
	creator *c = arg;
	char id[3][32], key[16];
	histd_kv kv = { "who", key };
	histd_session in = { .tenant = "t", .created_at_us = histd_now_us() },
		*out = NULL;
	int created = 0;

	for (int i = 0; i < 3; i++)
		snprintf(id[i], sizeof(id[i]), "c%d-%d", c->id, i);
	snprintf(key, sizeof(key), "k%d", c->id);
	start_gate_wait(c->go);
	in.id = id[0];
	count_result(c, histd_driver_session_create(c->d, &in, &out),
		     "the limit is 5");
	histd_session_free(out);
	out = NULL;
	in.id = id[1];
	in.context_keys = &kv;
	in.n_context_keys = 1;
	count_result(c, histd_driver_session_resolve(c->d, &in, &out, &created),
		     "the limit is 5");
	histd_session_free(out);
	out = NULL;
	in.id = id[2];
	in.context_keys = NULL;
	in.n_context_keys = 0;
	count_result(c, histd_driver_session_fork(c->d, "t", "base", 0, &in, &out),
		     "the limit is 5");
	histd_session_free(out);
	return NULL;
}

static void
sessions_per_tenant_limit_holds_for_creates_racing_on_two_instances(void **state)
{
	enum { THREADS = 8, LIMIT = 5 };
	fixture *f = *state;
	histd_driver *d2;
	pthread_t th[THREADS];
	creator c[THREADS];
	start_gate go;
	int ok = 0, limited = 0, rc;

	f->d = open_limited(f->dsn, LIMIT, 0);
	d2 = open_limited(f->dsn, LIMIT, 0);
	create(f->d, "base");
	assert_int_equal(append_text(f->d, "base", "forked", NULL), 0);
	start_gate_init(&go, THREADS);
	for (int i = 0; i < THREADS; i++)
		c[i] = (creator){ .d = i % 2 ? d2 : f->d, .id = i, .go = &go };
	rc = start_threads(th, THREADS, create_three, c, sizeof(c[0]), &go);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		if (c[i].other)
			fail_msg("creator %d: %s", i, c[i].error);
		ok += c[i].ok;
		limited += c[i].limited;
	}
	start_gate_destroy(&go);
	assert_int_equal(ok, LIMIT - 1);
	assert_int_equal(limited, 3 * THREADS - (LIMIT - 1));
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM sessions"), LIMIT);
	histd_driver_close(d2);
}

typedef struct sizer {
	histd_driver *d;
	int id, n;
	int msgs, limited, other;
	char error[160];
} sizer;

/* Plain appends of 1..3 messages (one batch per call). */
static void *
append_sizes(void *arg)
{
	sizer *z = arg;

	for (int i = 0; i < z->n; i++) {
		size_t k = 1 + (size_t)(z->id + i) % 3, len[3];
		uint8_t *data[3];
		histd_msg_in m[3];
		histd_append a = { .tenant = "t", .session_id = "s", .msgs = m,
				   .n_msgs = k, .now_us = histd_now_us() };
		histd_append_result res;
		int rc;

		for (size_t j = 0; j < k; j++) {
			data[j] = pack_message("sized", "", 0, &len[j]);
			m[j] = (histd_msg_in){ .data = data[j], .len = len[j],
					       .token_estimate = 1 };
		}
		rc = histd_driver_append(z->d, &a, &res);
		if (rc == 0)
			z->msgs += (int)k;
		else if (rc == HISTD_ELIMIT &&
			 strstr(histd_error_message(), "messages; the limit is 40"))
			z->limited++;
		else if (!z->other++)
			snprintf(z->error, sizeof(z->error), "%d: %s", rc,
				 histd_error_message());
		for (size_t j = 0; j < k; j++)
			free(data[j]);
	}
	return NULL;
}

static void
session_size_limit_holds_for_appends_racing_on_two_instances(void **state)
{
	enum { THREADS = 8, EACH = 10, LIMIT = 40 };
	fixture *f = *state;
	histd_driver *d2;
	pthread_t th[THREADS];
	sizer z[THREADS];
	histd_session *s = NULL;
	int msgs = 0, limited = 0, rc;

	f->d = open_limited(f->dsn, 0, LIMIT);
	d2 = open_limited(f->dsn, 0, LIMIT);
	create(f->d, "s");
	for (int i = 0; i < THREADS; i++)
		z[i] = (sizer){ .d = i % 2 ? d2 : f->d, .id = i, .n = EACH };
	rc = start_threads(th, THREADS, append_sizes, z, sizeof(z[0]), NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	for (int i = 0; i < THREADS; i++) {
		pthread_join(th[i], NULL);
		if (z[i].other)
			fail_msg("appender %d: %s", i, z[i].error);
		msgs += z[i].msgs;
		limited += z[i].limited;
	}
	assert_true(msgs <= LIMIT);
	assert_true(limited > 0);
	/* Single messages fill it to the limit exactly, then no more. */
	while ((rc = append_text(f->d, "s", "last", NULL)) == 0)
		msgs++;
	assert_int_equal(rc, HISTD_ELIMIT);
	assert_int_equal(msgs, LIMIT);
	assert_int_equal(histd_driver_session_get(d2, "t", "s", &s), 0);
	assert_int_equal(s->message_count, LIMIT);
	assert_int_equal(s->last_seq, LIMIT);
	histd_session_free(s);
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages"), LIMIT);
	/* A truncate makes room. */
	assert_int_equal(truncate_to(d2, "s", 10), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(append_text(f->d, "s", "room", NULL), 0);
	assert_int_equal(append_text(d2, "s", "over", NULL), HISTD_ELIMIT);
	histd_driver_close(d2);
}

/* A row lock held by a transaction outside histd (an operator's, another
 * tool's) holds an append of that session only until the statement
 * timeout: it then fails EUNAVAILABLE saying so, stores nothing, and the
 * session takes appends again once the lock is gone. */
static void
an_outside_lock_ends_an_append_at_the_statement_timeout(void **state)
{
	fixture *f = *state;
	histd_driver_config cfg = { .dsn = f->dsn, .pool_size = 2,
				    .timeout_ms = 300 };
	histd_session *s = NULL;
	PGconn *lk;
	PGresult *r;

	assert_int_equal(histd_driver_open("postgres", &cfg, &f->d), 0);
	create(f->d, "locked");
	create(f->d, "free");
	assert_int_equal(append_text(f->d, "locked", "before", NULL), 0);
	lk = PQconnectdb(f->dsn);
	assert_int_equal(PQstatus(lk), CONNECTION_OK);
	r = PQexec(lk, "BEGIN; SELECT 1 FROM sessions WHERE id = 'locked'"
		   " FOR UPDATE");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	PQclear(r);

	assert_int_equal(append_text(f->d, "locked", "waits", NULL),
			 HISTD_EUNAVAILABLE);
	assert_non_null(strstr(histd_error_message(), "statement timeout"));
	assert_int_equal(append_text(f->d, "free", "goes", NULL), 0);

	r = PQexec(lk, "ROLLBACK");
	PQclear(r);
	PQfinish(lk);
	assert_int_equal(append_text(f->d, "locked", "after", NULL), 0);
	assert_int_equal(histd_driver_session_get(f->d, "t", "locked", &s), 0);
	assert_int_equal(s->message_count, 2);
	assert_int_equal(s->last_seq, 2);
	histd_session_free(s);
}

/* Pooled connections the server closed while they sat idle (an
 * idle_session_timeout, pg_terminate_backend) are not handed out: the
 * next writes go through on new ones, instead of failing as "may not be
 * applied" with a server that never stopped answering. */
static void
pooled_connections_closed_while_idle_are_replaced(void **state)
{
	static const char *const others =
		"FROM pg_stat_activity WHERE datname = current_database() AND "
		"pid <> pg_backend_pid() AND application_name <> "
		"'histd listener'";
	fixture *f = *state;
	char sql[256];
	PGresult *r;
	int i;

	f->d = open_driver(f->dsn, 2);
	create(f->d, "s");
	assert_int_equal(append_text(f->d, "s", "before", NULL), 0);
	snprintf(sql, sizeof(sql), "SELECT count(pg_terminate_backend(pid)) %s",
		 others);
	assert_true(sql_long(f->dsn, sql) >= 1);
	/* Gone: their last words wait in our sockets. */
	snprintf(sql, sizeof(sql), "SELECT count(*) %s", others);
	for (i = 0; i < 100 && sql_long(f->dsn, sql) > 0; i++)
		usleep(50 * 1000);
	assert_int_equal(sql_long(f->dsn, sql), 0);

	if (append_text(f->d, "s", "after", NULL) != 0)
		fail_msg("append: %s", histd_error_message());
	create(f->d, "s2");
	r = pgh_sql(f->dsn, "SELECT count(*) FROM messages");
	assert_non_null(r);
	assert_string_equal(PQgetvalue(r, 0, 0), "2");
	PQclear(r);
}

/* ------------------------------------------------------------------------
 * Deferred appends (histd_append.on_result) */

typedef struct answer {
	pthread_mutex_t *mu;
	pthread_cond_t *cv;
	int calls;
	int rc;
	histd_append_result res;
	char msg[256];
} answer;

static void
on_result(void *ctx, int rc, const histd_append_result *res, const char *msg)
{
	answer *w = ctx;

	pthread_mutex_lock(w->mu);
	w->calls++;
	w->rc = rc;
	w->res = *res;
	snprintf(w->msg, sizeof(w->msg), "%s", msg);
	pthread_cond_broadcast(w->cv);
	pthread_mutex_unlock(w->mu);
}

static pthread_mutex_t defer_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t defer_cv = PTHREAD_COND_INITIALIZER;

/* Waits (30 s at most) until every one of ws has been answered. */
static void
wait_answers(answer *ws, size_t n)
{
	int64_t until = histd_now_us() + 30000000;

	pthread_mutex_lock(&defer_mu);
	for (size_t i = 0; i < n; i++)
		while (ws[i].calls == 0 && histd_now_us() < until) {
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 10000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&defer_cv, &defer_mu, &ts);
		}
	pthread_mutex_unlock(&defer_mu);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(ws[i].calls, 1);
}

/*
 * A deferred append whose request lives in buffers the caller scribbles
 * over as soon as the driver returned: the driver must have copied it.
 * calls/results: tool call ids it issues or answers (NULL: none).
 */
static void
append_deferred(histd_driver *d, const char *sid, const char *text,
		const char *call, const char *result, const char *key,
		uint64_t expected, answer *w)
{
	char id[64], k[64], tc[64], tr[64];
	uint8_t hash[HISTD_HASH_LEN];
	size_t len;
	uint8_t *data = pack_message(text, "planner", 0, &len);
	histd_tool_ref calls = { .id = tc }, results = { .id = tr };
	histd_msg_in m = { .data = data, .len = len, .token_estimate = 3 };
	histd_append_result unused;
	histd_append a = { .tenant = "t", .session_id = id, .msgs = &m,
			   .n_msgs = 1, .now_us = histd_now_us(),
			   .expected_revision = expected,
			   .on_result = on_result, .result_ctx = w };

	snprintf(id, sizeof(id), "%s", sid);
	if (call) {
		snprintf(tc, sizeof(tc), "%s", call);
		m.calls = &calls;
		m.n_calls = 1;
	}
	if (result) {
		snprintf(tr, sizeof(tr), "%s", result);
		m.results = &results;
		m.n_results = 1;
	}
	if (key) {
		snprintf(k, sizeof(k), "%s", key);
		memset(hash, 7, sizeof(hash));
		a.idempotency_key = k;
		a.request_hash = hash;
		a.idem_expires_us = a.now_us + 60000000;
	}
	w->mu = &defer_mu;
	w->cv = &defer_cv;
	assert_int_equal(histd_driver_append(d, &a, &unused), HISTD_DEFERRED);
	memset(data, 0xAA, len);
	memset(id, 'x', sizeof(id) - 1);
	memset(k, 'y', sizeof(k) - 1);
	memset(tc, 'z', sizeof(tc) - 1);
	memset(tr, 'z', sizeof(tr) - 1);
	memset(hash, 0, sizeof(hash));
	free(data);
}

typedef struct deferrer {
	histd_driver *d;
	char id[16];
	answer w[50];
} deferrer;

static void *
defer_many(void *arg)
{
	deferrer *t = arg;

	for (int i = 0; i < 50; i++) {
		char text[32];

		snprintf(text, sizeof(text), "m-%d", i);
		append_deferred(t->d, t->id, text, NULL, NULL, NULL, 0,
				&t->w[i]);
	}
	return NULL;
}

/* The text of a stored record ("m-7"), unpacked. */
static char *
record_text(const histd_record *r)
{
	Histd__V1__Message *m = histd__v1__message__unpack(NULL, r->len,
							    r->data);
	char *t;

	assert_non_null(m);
	assert_int_equal(m->n_content, 1);
	t = strdup(m->content[0]->text->text);
	histd__v1__message__free_unpacked(m, NULL);
	return t;
}

/* What the driver observer saw of appends: how many, and how many
 * reported an answer still to come instead of the append's result. */
static atomic_int observed_appends, observed_unsettled;

static void
observe(const char *op, int64_t duration_us, int rc)
{
	(void)duration_us;
	if (strcmp(op, "append") != 0)
		return;
	atomic_fetch_add(&observed_appends, 1);
	if (rc == HISTD_DEFERRED || rc == HISTD_PENDING)
		atomic_fetch_add(&observed_unsettled, 1);
}

static void
deferred_appends_are_answered_through_on_result(void **state)
{
	fixture *f = *state;
	deferrer t[4];
	pthread_t th[4];
	answer w[6] = { 0 };

	f->d = open_driver(f->dsn, 4);
	/* Each deferred append is observed once, with its answer. */
	atomic_store(&observed_appends, 0);
	atomic_store(&observed_unsettled, 0);
	histd_driver_set_observer(observe);
	for (int i = 0; i < 4; i++) {
		memset(&t[i], 0, sizeof(t[i]));
		t[i].d = f->d;
		snprintf(t[i].id, sizeof(t[i].id), "d%d", i);
		create(f->d, t[i].id);
	}
	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, defer_many, &t[i]), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);

	/* Each answered once, OK, with the seq and revision that its
	 * session gave it; the stored bytes are the request's, though the
	 * caller overwrote them as soon as the driver returned. */
	for (int i = 0; i < 4; i++) {
		histd_read q = { .tenant = "t", .session_id = t[i].id };
		histd_read_result rr = { 0 };
		int seen[51] = { 0 };

		wait_answers(t[i].w, 50);
		assert_int_equal(histd_driver_read(f->d, &q, &rr), 0);
		assert_int_equal(rr.records.n, 50);
		for (int k = 0; k < 50; k++) {
			answer *a = &t[i].w[k];
			uint64_t seq = a->res.first_seq;
			char want[32], *got;

			assert_int_equal(a->rc, 0);
			assert_int_equal(a->res.last_seq, seq);
			assert_true(seq >= 1 && seq <= 50);
			assert_int_equal(a->res.revision, seq + 1);
			assert_int_equal(a->res.replayed, 0);
			seen[seq]++;
			snprintf(want, sizeof(want), "m-%d", k);
			got = record_text(&rr.records.v[seq - 1]);
			assert_string_equal(got, want);
			free(got);
			/* One caller's appends keep its order. */
			if (k)
				assert_true(seq > t[i].w[k - 1].res.first_seq);
		}
		for (int k = 1; k <= 50; k++)
			assert_int_equal(seen[k], 1);
		histd_read_result_clear(&rr);
	}

	/* A conflict answers ECONFLICT with the current revision. */
	append_deferred(f->d, "d0", "stale", NULL, NULL, NULL, 3, &w[0]);
	wait_answers(&w[0], 1);
	assert_int_equal(w[0].rc, HISTD_ECONFLICT);
	assert_int_equal(w[0].res.current_revision, 51);

	/* A retry with the same key is answered with the first result. */
	append_deferred(f->d, "d1", "once", NULL, NULL, "key-1", 0, &w[1]);
	wait_answers(&w[1], 1);
	append_deferred(f->d, "d1", "once", NULL, NULL, "key-1", 0, &w[2]);
	wait_answers(&w[2], 1);
	assert_int_equal(w[1].rc, 0);
	assert_int_equal(w[2].rc, 0);
	assert_int_equal(w[2].res.replayed, 1);
	assert_int_equal(w[2].res.first_seq, w[1].res.first_seq);
	assert_int_equal(w[2].res.first_seq, 51);

	/* Tool call ids are the request's: a result answers the call
	 * issued before it, one for an unknown call is refused. */
	append_deferred(f->d, "d2", "calls", "call-1", NULL, NULL, 0, &w[3]);
	wait_answers(&w[3], 1);
	append_deferred(f->d, "d2", "answers", NULL, "call-1", NULL, 0, &w[4]);
	append_deferred(f->d, "d2", "stray", NULL, "call-2", NULL, 0, &w[5]);
	wait_answers(&w[4], 2);
	assert_int_equal(w[3].rc, 0);
	assert_int_equal(w[4].rc, 0);
	assert_int_equal(w[5].rc, HISTD_EINVALID);
	assert_non_null(strstr(w[5].msg, "tool_call_id"));
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages m JOIN"
			 " sessions s ON s.sid = m.sid WHERE s.id = 'd2'"), 52);
	histd_driver_set_observer(NULL);
	assert_int_equal(atomic_load(&observed_appends), 4 * 50 + 6);
	assert_int_equal(atomic_load(&observed_unsettled), 0);
}

/*
 * The deferred appends queued when the driver closes are run and answered
 * before close returns: none is left unanswered.
 */
static void
close_answers_every_queued_deferred_append(void **state)
{
	fixture *f = *state;
	answer w[40] = { 0 };

	f->d = open_driver(f->dsn, 2);
	create(f->d, "c");
	for (int i = 0; i < 40; i++)
		append_deferred(f->d, "c", "q", NULL, NULL, NULL, 0, &w[i]);
	histd_driver_close(f->d);
	f->d = NULL;
	for (int i = 0; i < 40; i++) {
		assert_int_equal(w[i].calls, 1);
		assert_int_equal(w[i].rc, 0);
	}
	assert_int_equal(sql_long(f->dsn, "SELECT count(*) FROM messages"), 40);
}

int
main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(refuses_a_schema_newer_than_the_binary),
		T(a_version_3_database_keeps_its_sessions_by_context_keys),
		T(a_version_4_database_keeps_the_old_ttl_rule_for_its_sessions),
		T(replicas_starting_together_migrate_once),
		T(replicas_starting_together_migrate_once_under_repeatable_read),
		T(open_without_a_dsn_or_with_a_dead_one_fails_cleanly),
		T(messages_keep_queryable_columns_beside_their_bytes),
		T(concurrent_appends_share_commits),
		T(reads_and_lists_use_indexes_not_scans),
		T(second_instance_gets_every_change_of_the_first_in_order),
		T(second_instance_catches_up_after_its_listener_was_killed),
		T(own_changes_reach_the_hook_before_the_call_returns),
		T(a_catch_up_keeps_the_update_and_summary_a_clear_or_truncate_follows),
		T(truncate_reaches_the_second_instance_as_cleared_keeping_system_messages),
		T(a_clear_of_an_empty_session_reaches_the_second_instance),
		T(a_second_instance_that_missed_truncates_catches_up_to_the_stored_session),
		T(sessions_per_tenant_limit_holds_for_creates_racing_on_two_instances),
		T(session_size_limit_holds_for_appends_racing_on_two_instances),
		T(an_outside_lock_ends_an_append_at_the_statement_timeout),
		T(pooled_connections_closed_while_idle_are_replaced),
		T(deferred_appends_are_answered_through_on_result),
		T(close_answers_every_queued_deferred_append),
	};

	return cmocka_run_group_tests(tests, group_setup, NULL);
}
