/*
 * The schema, its migrations, and the SQL of every statement.
 *
 * Migrations are numbered from 1 and only ever appended. At start the
 * driver takes a transaction-scoped advisory lock (so that replicas
 * starting together migrate once), reads histd_schema.version, refuses a
 * database migrated by a newer histd, and applies the missing ones in the
 * same transaction: DDL is transactional in PostgreSQL, so a failed
 * migration leaves the schema as it was.
 *
 * Why the tables look as they do:
 * - sessions.sid, an identity, is the key every other table uses: 8 bytes
 *   instead of (tenant, id) in every index entry, and a deleted session
 *   recreated under the same id is a different sid.
 * - messages keep the packed Message (seq in front) as bytea beside the
 *   columns an operator may query: role, author, created_at, token
 *   estimate; the primary key (sid, seq) serves every read, oldest or
 *   newest first, in time proportional to what it returns.
 * - revision columns (messages.revision, summaries.revision,
 *   sessions.clear_revision / meta_revision) let a replica rebuild, from
 *   the tables alone, the changes it missed (watch.c).
 * - tenant and id sort in byte order (COLLATE "C"), as ListSessions
 *   pages by id.
 * - sessions is updated by every append: fillfactor 70 leaves room on the
 *   page for HOT updates (no index maintenance; no indexed column
 *   changes).
 */
#include "pg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* pg_advisory_xact_lock key: "histdmig" as an integer. */
#define MIGRATION_LOCK "7523659058405034343"

static const char *const migrations[] = {
	/* 1: the initial schema. */
	"CREATE TABLE sessions ("
	"  sid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
	"  tenant text COLLATE \"C\" NOT NULL,"
	"  id text COLLATE \"C\" NOT NULL,"
	"  context_keys jsonb,"
	"  labels jsonb NOT NULL DEFAULT '{}',"
	"  config bytea,"
	"  created_at timestamptz NOT NULL,"
	"  updated_at timestamptz NOT NULL,"
	"  revision bigint NOT NULL,"
	"  last_seq bigint NOT NULL DEFAULT 0,"
	"  cleared_to_seq bigint NOT NULL DEFAULT 0,"
	"  message_count bigint NOT NULL DEFAULT 0,"
	"  token_total bigint NOT NULL DEFAULT 0,"
	"  bytes_total bigint NOT NULL DEFAULT 0,"
	"  first_seq bigint NOT NULL DEFAULT 0,"
	"  summary_count bigint NOT NULL DEFAULT 0,"
	"  clear_revision bigint NOT NULL DEFAULT 0,"
	"  meta_revision bigint NOT NULL DEFAULT 0,"
	"  CONSTRAINT sessions_tenant_id UNIQUE (tenant, id)"
	") WITH (fillfactor = 70);"
	"CREATE UNIQUE INDEX sessions_tenant_context_keys ON sessions"
	"  (tenant, context_keys) WHERE context_keys IS NOT NULL;"
	"CREATE INDEX sessions_labels ON sessions USING gin (labels jsonb_path_ops);"
	"CREATE TABLE messages ("
	"  sid bigint NOT NULL,"
	"  seq bigint NOT NULL,"
	"  revision bigint NOT NULL,"
	"  role smallint NOT NULL,"
	"  author text NOT NULL,"
	"  created_at timestamptz,"
	"  token_estimate integer NOT NULL,"
	"  data bytea NOT NULL,"
	"  PRIMARY KEY (sid, seq)"
	");"
	"CREATE TABLE tool_calls ("
	"  sid bigint NOT NULL,"
	"  call_id text COLLATE \"C\" NOT NULL,"
	"  call_seq bigint NOT NULL,"
	"  result_seq bigint,"
	"  PRIMARY KEY (sid, call_id)"
	");"
	"CREATE TABLE summaries ("
	"  sid bigint NOT NULL,"
	"  revision bigint NOT NULL,"
	"  covers_to_seq bigint NOT NULL,"
	"  token_estimate integer NOT NULL,"
	"  data bytea NOT NULL,"
	"  PRIMARY KEY (sid, revision)"
	");"
	"CREATE INDEX summaries_newest ON summaries"
	"  (sid, covers_to_seq DESC, revision DESC);"
	"CREATE TABLE idempotency_keys ("
	"  sid bigint NOT NULL,"
	"  key text COLLATE \"C\" NOT NULL,"
	"  request_hash bytea NOT NULL,"
	"  first_seq bigint NOT NULL,"
	"  last_seq bigint NOT NULL,"
	"  revision bigint NOT NULL,"
	"  expires_at timestamptz NOT NULL,"
	"  PRIMARY KEY (sid, key)"
	");"
	"CREATE INDEX idempotency_keys_expires_at ON idempotency_keys (expires_at);",
};

#define N_MIGRATIONS (sizeof(migrations) / sizeof(migrations[0]))

_Static_assert(N_MIGRATIONS == PG_SCHEMA_VERSION,
	       "PG_SCHEMA_VERSION is the number of migrations");

static int
run(pg_driver *d, PGconn *pg, const char *sql, PGresult **out)
{
	PGresult *r = PQexec(pg, sql);
	ExecStatusType st = PQresultStatus(r);
	int rc;

	if (r && (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)) {
		if (out)
			*out = r;
		else
			PQclear(r);
		return 0;
	}
	rc = pg_error(d, pg, r, NULL);
	PQclear(r);
	return rc;
}

int
pg_migrate(pg_driver *d, PGconn *pg)
{
	PGresult *r = NULL;
	long version = 0;
	char sql[128];
	int rc;

	if ((rc = run(d, pg, "BEGIN", NULL)))
		return rc;
	if ((rc = run(d, pg, "SELECT pg_advisory_xact_lock(" MIGRATION_LOCK ")", NULL)) ||
	    (rc = run(d, pg, "CREATE TABLE IF NOT EXISTS histd_schema "
		      "(version integer NOT NULL)", NULL)) ||
	    (rc = run(d, pg, "SELECT version FROM histd_schema", &r)))
		goto fail;
	if (PQntuples(r) > 0)
		version = strtol(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	r = NULL;
	if (version > PG_SCHEMA_VERSION) {
		rc = histd_error_set(HISTD_EINVALID,
				     "PostgreSQL schema version %ld is newer than this "
				     "histd supports (%d): upgrade histd",
				     version, PG_SCHEMA_VERSION);
		goto fail;
	}
	for (long v = version; v < PG_SCHEMA_VERSION; v++) {
		if ((rc = run(d, pg, migrations[v], NULL))) {
			char msg[512];

			snprintf(msg, sizeof(msg), "%s", histd_error_message());
			rc = histd_error_set(rc, "schema migration %ld failed: %s",
					     v + 1, msg);
			goto fail;
		}
	}
	snprintf(sql, sizeof(sql), "%s %d",
		 version == 0 ? "INSERT INTO histd_schema (version) VALUES ("
			      : "UPDATE histd_schema SET version =",
		 PG_SCHEMA_VERSION);
	if (version == 0)
		strcat(sql, ")");
	if (version != PG_SCHEMA_VERSION && (rc = run(d, pg, sql, NULL)))
		goto fail;
	return run(d, pg, "COMMIT", NULL);
fail:
	PQclear(r);
	{
		PGresult *rb = PQexec(pg, "ROLLBACK");
		PQclear(rb);
	}
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Statements                                                              */

/* A session row's columns as NULLs, for the message branch of a UNION. */
#define NULL_SESSION \
	"NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, " \
	"NULL, NULL, NULL, NULL, NULL, NULL"

/* A stored message's record length as histd counts it (bytes_total): the
 * seq field (a key byte and the varint) in front of the packed bytes. */
#define RECORD_LEN \
	"(octet_length(data) + 1 + CASE" \
	" WHEN seq < 128 THEN 1 WHEN seq < 16384 THEN 2" \
	" WHEN seq < 2097152 THEN 3 WHEN seq < 268435456 THEN 4" \
	" WHEN seq < 34359738368 THEN 5 WHEN seq < 4398046511104 THEN 6" \
	" WHEN seq < 562949953421312 THEN 7 WHEN seq < 72057594037927936 THEN 8" \
	" ELSE 9 END)"

const char *const pg_stmt_name[ST_COUNT] = {
	[ST_SESSION_GET] = "session_get",
	[ST_SESSION_GET_SID] = "session_get_sid",
	[ST_SESSION_CREATE] = "session_create",
	[ST_SESSION_BY_KEYS] = "session_by_keys",
	[ST_SESSION_RESOLVE] = "session_resolve",
	[ST_SESSION_LOCK] = "session_lock",
	[ST_SESSION_LIST] = "session_list",
	[ST_SESSION_LIST_LABELS] = "session_list_labels",
	[ST_SESSION_UPDATE] = "session_update",
	[ST_SESSION_DELETE] = "session_delete",
	[ST_READ_AFTER] = "read_after",
	[ST_READ_LAST] = "read_last",
	[ST_TOOL_RESULT] = "tool_result",
	[ST_CLEAR] = "clear",
	[ST_SUMMARY_PUT] = "summary_put",
	[ST_SUMMARY_GET] = "summary_get",
	[ST_FORK_SOURCE] = "fork_source",
	[ST_FORK_CREATE] = "fork_create",
	[ST_FORK_COPY] = "fork_copy",
	[ST_FAST_APPEND] = "fast_append",
	[ST_BATCH_LOCK] = "batch_lock",
	[ST_BATCH_IDEM] = "batch_idem",
	[ST_BATCH_TOOLS] = "batch_tools",
	[ST_INSERT_MESSAGES] = "insert_messages",
	[ST_INSERT_CALLS] = "insert_calls",
	[ST_ANSWER_CALLS] = "answer_calls",
	[ST_UPDATE_STATS] = "update_stats",
	[ST_INSERT_IDEM] = "insert_idem",
	[ST_REPLACE_WIPE] = "replace_wipe",
	[ST_NOTIFY] = "notify",
	[ST_NOTIFY_SESSIONS] = "notify_sessions",
	[ST_CATCH_UP] = "catch_up",
	[ST_WATCH_REVISIONS] = "watch_revisions",
	[ST_PURGE_IDEM] = "purge_idem",
	[ST_BEGIN] = "begin",
	[ST_COMMIT] = "commit",
	[ST_ROLLBACK] = "rollback",
};

const char *const pg_stmt_sql[ST_COUNT] = {
	[ST_SESSION_GET] =
	"SELECT " PG_SESSION_COLS " FROM sessions s"
	" WHERE s.tenant = $1 AND s.id = $2",

	[ST_SESSION_GET_SID] =
	"SELECT " PG_SESSION_COLS " FROM sessions s WHERE s.sid = $1::int8",

	/* $1 tenant, $2 id, $3 context keys, $4 labels, $5 config,
	 * $6 created_at */
	[ST_SESSION_CREATE] =
	"INSERT INTO sessions AS s (tenant, id, context_keys, labels, config,"
	" created_at, updated_at, revision)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, 1)"
	" RETURNING " PG_SESSION_COLS,

	[ST_SESSION_BY_KEYS] =
	"SELECT " PG_SESSION_COLS " FROM sessions s"
	" WHERE s.tenant = $1 AND s.context_keys = $2::jsonb",

	/* As ST_SESSION_CREATE; nothing when the keys are taken. */
	[ST_SESSION_RESOLVE] =
	"INSERT INTO sessions AS s (tenant, id, context_keys, labels, config,"
	" created_at, updated_at, revision)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, 1)"
	" ON CONFLICT (tenant, context_keys) WHERE context_keys IS NOT NULL"
	" DO NOTHING"
	" RETURNING " PG_SESSION_COLS,

	[ST_SESSION_LOCK] =
	"SELECT sid, revision, last_seq, cleared_to_seq FROM sessions"
	" WHERE tenant = $1 AND id = $2 FOR UPDATE",

	/* Keyset pagination on the (tenant, id) index. $3: limit + 1. */
	[ST_SESSION_LIST] =
	"SELECT " PG_SESSION_COLS " FROM sessions s"
	" WHERE s.tenant = $1 AND s.id > $2 ORDER BY s.id LIMIT $3::int8",

	[ST_SESSION_LIST_LABELS] =
	"SELECT " PG_SESSION_COLS " FROM sessions s"
	" WHERE s.tenant = $1 AND s.id > $2 AND s.labels @> $4::jsonb"
	" ORDER BY s.id LIMIT $3::int8",

	/* $1 sid, $2 labels (NULL: keep), $3 set config?, $4 config,
	 * $5 updated_at */
	[ST_SESSION_UPDATE] =
	"UPDATE sessions AS s SET labels = COALESCE($2::jsonb, s.labels),"
	" config = CASE WHEN $3::bool THEN $4::bytea ELSE s.config END,"
	" updated_at = $5::timestamptz, revision = s.revision + 1,"
	" meta_revision = s.revision + 1"
	" WHERE s.sid = $1::int8 RETURNING " PG_SESSION_COLS,

	[ST_SESSION_DELETE] =
	"WITH m AS (DELETE FROM messages WHERE sid = $1::int8),"
	" t AS (DELETE FROM tool_calls WHERE sid = $1::int8),"
	" u AS (DELETE FROM summaries WHERE sid = $1::int8),"
	" i AS (DELETE FROM idempotency_keys WHERE sid = $1::int8)"
	" DELETE FROM sessions WHERE sid = $1::int8",

	/* The session row (k = 0) and the messages after $3, at most $4
	 * (NULL: all), read by one statement: one snapshot. */
	[ST_READ_AFTER] =
	"SELECT 0 AS k, " PG_SESSION_COLS ", NULL::int8, NULL::int4, NULL::bytea"
	" FROM sessions s WHERE s.tenant = $1 AND s.id = $2"
	" UNION ALL"
	" (SELECT 1, " NULL_SESSION ", m.seq, m.token_estimate, m.data"
	"  FROM messages m"
	"  WHERE m.sid = (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2)"
	"  AND m.seq > $3::int8 ORDER BY m.seq LIMIT $4::int8)",

	/* The newest $3, newest first. */
	[ST_READ_LAST] =
	"SELECT 0 AS k, " PG_SESSION_COLS ", NULL::int8, NULL::int4, NULL::bytea"
	" FROM sessions s WHERE s.tenant = $1 AND s.id = $2"
	" UNION ALL"
	" (SELECT 1, " NULL_SESSION ", m.seq, m.token_estimate, m.data"
	"  FROM messages m"
	"  WHERE m.sid = (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2)"
	"  ORDER BY m.seq DESC LIMIT $3::int8)",

	[ST_TOOL_RESULT] =
	"SELECT s.sid, m.seq, m.token_estimate, m.data FROM sessions s"
	" LEFT JOIN tool_calls t ON t.sid = s.sid AND t.call_id = $3"
	" LEFT JOIN messages m ON m.sid = s.sid AND m.seq = t.result_seq"
	" WHERE s.tenant = $1 AND s.id = $2",

	[ST_CLEAR] =
	"WITH m AS (DELETE FROM messages WHERE sid = $1::int8),"
	" t AS (DELETE FROM tool_calls WHERE sid = $1::int8),"
	" u AS (DELETE FROM summaries WHERE sid = $1::int8)"
	" UPDATE sessions SET revision = revision + 1,"
	" cleared_to_seq = last_seq, message_count = 0, token_total = 0,"
	" bytes_total = 0, first_seq = 0, summary_count = 0,"
	" clear_revision = revision + 1"
	" WHERE sid = $1::int8 RETURNING revision, cleared_to_seq",

	/* $1 sid, $2 new revision, $3 covers_to_seq, $4 tokens, $5 data */
	[ST_SUMMARY_PUT] =
	"WITH ins AS (INSERT INTO summaries (sid, revision, covers_to_seq,"
	" token_estimate, data) VALUES ($1::int8, $2::int8, $3::int8, $4::int4,"
	" $5::bytea))"
	" UPDATE sessions SET revision = $2::int8,"
	" summary_count = summary_count + 1 WHERE sid = $1::int8",

	[ST_SUMMARY_GET] =
	"SELECT s.sid, u.covers_to_seq, u.token_estimate, u.data FROM sessions s"
	" LEFT JOIN LATERAL (SELECT covers_to_seq, token_estimate, data"
	"  FROM summaries WHERE sid = s.sid"
	"  ORDER BY covers_to_seq DESC, revision DESC LIMIT 1) u ON true"
	" WHERE s.tenant = $1 AND s.id = $2",

	/* Shared lock: the source holds still while it is copied. */
	[ST_FORK_SOURCE] =
	"SELECT sid, last_seq, cleared_to_seq, config FROM sessions"
	" WHERE tenant = $1 AND id = $2 FOR SHARE",

	/* $1..$6 as session_create, $7 last_seq, $8 cleared_to_seq */
	[ST_FORK_CREATE] =
	"INSERT INTO sessions (tenant, id, context_keys, labels, config,"
	" created_at, updated_at, revision, last_seq, cleared_to_seq)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, 1, $7::int8, $8::int8)"
	" RETURNING sid",

	/* $1 source sid, $2 fork sid, $3 up_to_seq. Copied messages are at
	 * revision 1 (the fork's); copied summaries at revisions <= 0 in
	 * their order, so that neither looks like a later change. */
	[ST_FORK_COPY] =
	"WITH m AS (INSERT INTO messages (sid, seq, revision, role, author,"
	"  created_at, token_estimate, data)"
	"  SELECT $2::int8, seq, 1, role, author, created_at, token_estimate, data"
	"  FROM messages WHERE sid = $1::int8 AND seq <= $3::int8"
	"  RETURNING seq, token_estimate, " RECORD_LEN " AS len),"
	" t AS (INSERT INTO tool_calls (sid, call_id, call_seq, result_seq)"
	"  SELECT $2::int8, call_id, call_seq,"
	"  CASE WHEN result_seq <= $3::int8 THEN result_seq END"
	"  FROM tool_calls WHERE sid = $1::int8 AND call_seq <= $3::int8),"
	" u AS (INSERT INTO summaries (sid, revision, covers_to_seq,"
	"  token_estimate, data)"
	"  SELECT $2::int8, 1 - row_number() OVER (ORDER BY revision DESC),"
	"  covers_to_seq, token_estimate, data"
	"  FROM summaries WHERE sid = $1::int8 AND covers_to_seq <= $3::int8"
	"  RETURNING 1)"
	" UPDATE sessions AS s SET"
	" message_count = (SELECT count(*) FROM m),"
	" token_total = (SELECT coalesce(sum(token_estimate), 0) FROM m),"
	" bytes_total = (SELECT coalesce(sum(len), 0) FROM m),"
	" first_seq = (SELECT coalesce(min(seq), 0) FROM m),"
	" summary_count = (SELECT count(*) FROM u)"
	" WHERE s.sid = $2::int8 RETURNING " PG_SESSION_COLS,

	/* A batch of plain appends (no expected revision, no idempotency
	 * key, no tool call ids) in one statement, its own transaction:
	 * lock the sessions (by key, in the order of ST_BATCH_LOCK), give
	 * each request its seqs and
	 * revision after the requests before it, insert, update the stats,
	 * notify. One row per request whose session exists: ordinal, sid,
	 * the seq before its first, its revision.
	 * $1 tenants, $2 ids, $3 messages, $4 tokens (per request);
	 * $5 request ordinal, $6 index in the request (1..), $7 role,
	 * $8 author, $9 created_at, $10 tokens, $11 bytes (per message);
	 * (The notice goes in a transaction of its own: ST_NOTIFY_SESSIONS.) */
	[ST_FAST_APPEND] =
	"WITH req AS (SELECT * FROM unnest($1::text[], $2::text[], $3::int8[],"
	"  $4::int8[]) WITH ORDINALITY AS r(tenant, id, n, tokens, ord)),"
	" locked AS (SELECT l.* FROM (SELECT DISTINCT tenant COLLATE \"C\" AS"
	"  tenant, id COLLATE \"C\" AS id FROM req ORDER BY 1, 2) k,"
	"  LATERAL (SELECT s.sid, s.tenant, s.id, s.revision, s.last_seq"
	"  FROM sessions s WHERE s.tenant = k.tenant AND s.id = k.id"
	"  FOR UPDATE) l),"
	" plan AS (SELECT r.ord, l.sid, r.n, r.tokens,"
	"  (l.last_seq + sum(r.n) OVER w - r.n)::int8 AS base,"
	"  l.revision + row_number() OVER w AS rev"
	"  FROM req r JOIN locked l ON l.tenant = r.tenant AND l.id = r.id"
	"  WINDOW w AS (PARTITION BY l.sid ORDER BY r.ord)),"
	" ins AS (INSERT INTO messages (sid, seq, revision, role, author,"
	"  created_at, token_estimate, data)"
	"  SELECT p.sid, p.base + m.k, p.rev, m.role, m.author, m.created_at,"
	"  m.tokens, m.data"
	"  FROM unnest($5::int8[], $6::int8[], $7::int2[], $8::text[],"
	"  $9::timestamptz[], $10::int4[], $11::bytea[])"
	"  AS m(ord, k, role, author, created_at, tokens, data)"
	"  JOIN plan p ON p.ord = m.ord"
	"  RETURNING sid, " RECORD_LEN " AS len),"
	" agg AS (SELECT p.sid, max(p.rev) AS rev, max(p.base + p.n) AS last_seq,"
	"  sum(p.n)::int8 AS n, sum(p.tokens)::int8 AS tokens,"
	"  min(p.base) + 1 AS first_new,"
	"  (SELECT sum(len) FROM ins WHERE ins.sid = p.sid)::int8 AS bytes"
	"  FROM plan p GROUP BY p.sid),"
	" upd AS (UPDATE sessions AS s SET revision = a.rev,"
	"  last_seq = a.last_seq, message_count = s.message_count + a.n,"
	"  token_total = s.token_total + a.tokens,"
	"  bytes_total = s.bytes_total + a.bytes,"
	"  first_seq = CASE WHEN s.first_seq = 0 THEN a.first_new"
	"  ELSE s.first_seq END"
	"  FROM agg a WHERE s.sid = a.sid RETURNING s.sid)"
	" SELECT p.ord, p.sid, p.base, p.rev FROM plan p",

	/* Locks the sessions of a batch, in (tenant, id) byte order: the
	 * same order in every batch of every replica, so no deadlock. Each
	 * is found by its key (LATERAL: an index lookup however small or
	 * bloated the table looks to the planner). */
	[ST_BATCH_LOCK] =
	"SELECT k.i, l.* FROM (SELECT * FROM unnest($1::text[], $2::text[])"
	"  WITH ORDINALITY AS u(tenant, id, i)"
	"  ORDER BY tenant COLLATE \"C\", id COLLATE \"C\") k,"
	" LATERAL (SELECT s.sid, s.revision, s.last_seq, s.message_count,"
	"  s.token_total, s.bytes_total, s.first_seq FROM sessions s"
	"  WHERE s.tenant = k.tenant AND s.id = k.id FOR UPDATE) l",

	[ST_BATCH_IDEM] =
	"SELECT k.i, i.request_hash, i.first_seq, i.last_seq, i.revision,"
	" i.expires_at"
	" FROM unnest($1::text[], $2::text[], $3::text[])"
	"  WITH ORDINALITY AS k(tenant, id, key, i)"
	" JOIN sessions s ON s.tenant = k.tenant AND s.id = k.id"
	" JOIN idempotency_keys i ON i.sid = s.sid AND i.key = k.key",

	[ST_BATCH_TOOLS] =
	"SELECT k.i, t.result_seq IS NOT NULL"
	" FROM unnest($1::text[], $2::text[], $3::text[])"
	"  WITH ORDINALITY AS k(tenant, id, call_id, i)"
	" JOIN sessions s ON s.tenant = k.tenant AND s.id = k.id"
	" JOIN tool_calls t ON t.sid = s.sid AND t.call_id = k.call_id",

	[ST_INSERT_MESSAGES] =
	"INSERT INTO messages (sid, seq, revision, role, author, created_at,"
	" token_estimate, data)"
	" SELECT * FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int2[],"
	" $5::text[], $6::timestamptz[], $7::int4[], $8::bytea[])",

	[ST_INSERT_CALLS] =
	"INSERT INTO tool_calls (sid, call_id, call_seq, result_seq)"
	" SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[])",

	[ST_ANSWER_CALLS] =
	"UPDATE tool_calls AS t SET result_seq = v.seq"
	" FROM unnest($1::int8[], $2::text[], $3::int8[]) AS v(sid, call_id, seq)"
	" WHERE t.sid = v.sid AND t.call_id = v.call_id",

	[ST_UPDATE_STATS] =
	"UPDATE sessions AS s SET revision = v.revision, last_seq = v.last_seq,"
	" message_count = v.message_count, token_total = v.token_total,"
	" bytes_total = v.bytes_total, first_seq = v.first_seq"
	" FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],"
	" $6::int8[], $7::int8[]) AS v(sid, revision, last_seq, message_count,"
	" token_total, bytes_total, first_seq)"
	" WHERE s.sid = v.sid",

	/* A key found expired is overwritten. */
	[ST_INSERT_IDEM] =
	"INSERT INTO idempotency_keys AS i (sid, key, request_hash, first_seq,"
	" last_seq, revision, expires_at)"
	" SELECT * FROM unnest($1::int8[], $2::text[], $3::bytea[], $4::int8[],"
	" $5::int8[], $6::int8[], $7::timestamptz[])"
	" ON CONFLICT (sid, key) DO UPDATE SET"
	" request_hash = EXCLUDED.request_hash, first_seq = EXCLUDED.first_seq,"
	" last_seq = EXCLUDED.last_seq, revision = EXCLUDED.revision,"
	" expires_at = EXCLUDED.expires_at",

	/* $1 sid, $2 the replace's revision */
	[ST_REPLACE_WIPE] =
	"WITH m AS (DELETE FROM messages WHERE sid = $1::int8),"
	" t AS (DELETE FROM tool_calls WHERE sid = $1::int8),"
	" u AS (DELETE FROM summaries WHERE sid = $1::int8)"
	" UPDATE sessions SET cleared_to_seq = last_seq, summary_count = 0,"
	" clear_revision = $2::int8 WHERE sid = $1::int8",

	[ST_NOTIFY] =
	"SELECT pg_notify('" PG_CHANNEL "', p) FROM unnest($1::text[]) AS p",

	/* What changed in a session since revision $3 / seq $2 (watch.c):
	 * the session row, the messages after $2, the summaries after $3. */
	/* The notice of a fast-path batch, as a transaction of its own
	 * after the batch's: the latest revision of each session. $1
	 * tenants, $2 ids, $3 origin. */
	[ST_NOTIFY_SESSIONS] =
	"SELECT pg_notify('" PG_CHANNEL "', string_agg($3 || ' 1 ' || s.revision"
	" || ' ' || s.sid, E'\n')) FROM sessions s"
	" WHERE (s.tenant, s.id) IN (SELECT * FROM unnest($1::text[], $2::text[]))",

	[ST_CATCH_UP] =
	"SELECT 0 AS k, s.revision, s.last_seq, s.cleared_to_seq,"
	" s.clear_revision, s.meta_revision, NULL::int4, NULL::bytea"
	" FROM sessions s WHERE s.sid = $1::int8"
	" UNION ALL"
	" (SELECT 1, m.revision, m.seq, NULL, NULL, NULL, m.token_estimate, m.data"
	"  FROM messages m WHERE m.sid = $1::int8 AND m.seq > $2::int8"
	"  ORDER BY m.seq)"
	" UNION ALL"
	" (SELECT 2, u.revision, u.covers_to_seq, NULL, NULL, NULL,"
	"  u.token_estimate, u.data"
	"  FROM summaries u WHERE u.sid = $1::int8 AND u.revision > $3::int8"
	"  ORDER BY u.revision)",

	[ST_WATCH_REVISIONS] =
	"SELECT v.sid, s.revision FROM unnest($1::int8[]) AS v(sid)"
	" LEFT JOIN sessions s ON s.sid = v.sid",

	[ST_PURGE_IDEM] =
	"DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid"
	" FROM idempotency_keys WHERE expires_at < $1::timestamptz LIMIT 10000)",

	[ST_BEGIN] = "BEGIN",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
};
