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
 * - messages also keep their words (tsv, tsv_tool: tsvectors made by
 *   search.c with histd's tokenizer) and embedding; sessions keep the
 *   sums of their messages' word counts, so that BM25's N and average
 *   length cost one row per session, not one per message.
 * - sessions is updated by every append: fillfactor 70 leaves room on the
 *   page for HOT updates (no index maintenance; no indexed column
 *   changes).
 * - sessions.truncate_revision tells a clear (clear_revision) from a
 *   truncate, which keeps system messages: a replica catching up must
 *   know which one it missed (watch.c).
 * - sessions.active_at is the server time of the session's last change
 *   (histd_session.active_at_us): every statement that moves revision
 *   sets it, in the same row update, so the TTL sweeper needs no read of
 *   messages. NULL for rows last written before schema version 6.
 */
#include "pg.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* pg_advisory_xact_lock key: "histdmig" as an integer. */
#define MIGRATION_LOCK "7523659058405034343"
/* The first of the two keys of the per-tenant lock ("hist"); the second is
 * a hash of the tenant. (Locks on one 64-bit key and on two 32-bit keys do
 * not collide.) */
#define TENANT_LOCK_CLASS "1751741300"
/* Role.ROLE_SYSTEM of histd.proto, as stored in messages.role: truncate
 * keeps these. */
#define ROLE_SYSTEM "1"

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

	/* 2: search (search.c). Each message's words as tsvectors (main
	 * text; text inside tool results, NULL when none) with their lengths
	 * in tokens, and its embedding; per session, the sums BM25 needs.
	 * Adding nullable columns and columns with a constant default
	 * rewrites nothing. Rows stored before have tsv NULL: the driver
	 * fills them at start (pg_backfill), found through
	 * messages_unindexed, which stays empty once they are done. */
	"ALTER TABLE messages ADD COLUMN tsv tsvector,"
	"  ADD COLUMN tsv_tool tsvector,"
	"  ADD COLUMN tsv_len integer NOT NULL DEFAULT 0,"
	"  ADD COLUMN tsv_tool_len integer NOT NULL DEFAULT 0,"
	"  ADD COLUMN embedding real[],"
	"  ADD COLUMN embedding_model text;"
	"ALTER TABLE sessions ADD COLUMN text_docs bigint NOT NULL DEFAULT 0,"
	"  ADD COLUMN text_len bigint NOT NULL DEFAULT 0,"
	"  ADD COLUMN any_docs bigint NOT NULL DEFAULT 0,"
	"  ADD COLUMN any_len bigint NOT NULL DEFAULT 0;"
	"CREATE INDEX messages_tsv ON messages USING gin (tsv);"
	"CREATE INDEX messages_tsv_tool ON messages USING gin (tsv_tool)"
	"  WHERE tsv_tool IS NOT NULL;"
	"CREATE INDEX messages_unindexed ON messages (sid) WHERE tsv IS NULL;",

	/* 3: truncate (driver version 3). The revision of the session's
	 * last truncate, beside clear_revision (its last clear or replace,
	 * which truncate does not set): a catch-up reports a truncate as
	 * CLEARED with system messages kept. A constant default rewrites
	 * nothing. */
	"ALTER TABLE sessions ADD COLUMN truncate_revision bigint NOT NULL"
	"  DEFAULT 0;",

	/* 4: context keys unique per tenant by their digest. A btree entry
	 * holds at most 2704 bytes, and the keys README allows reach about
	 * 20 KB: the index of version 1 refused them. Equal jsonb values
	 * print the same text (keys sorted, no duplicates); the statements
	 * compare the keys themselves too. A function, as convert_to is only
	 * stable (conversions may be redefined); from the database encoding
	 * to UTF8 it is the same every time. Builds the index from sessions
	 * once, under the migration's lock. */
	"CREATE FUNCTION histd_keys_digest(keys jsonb) RETURNS bytea"
	"  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE"
	"  AS $$SELECT pg_catalog.sha256(pg_catalog.convert_to(keys::text,"
	"  'UTF8'))$$;"
	"DROP INDEX sessions_tenant_context_keys;"
	"CREATE UNIQUE INDEX sessions_tenant_context_keys ON sessions"
	"  (tenant, histd_keys_digest(context_keys))"
	"  WHERE context_keys IS NOT NULL;",

	/* 5: the words fold Greek capitals with tonos or dialytika and final
	 * sigma (drivers/index): rows whose stored words hold one of those
	 * letters lose their words here, and the start's backfill
	 * (pg_backfill) makes them again, with their sessions' sums. One
	 * scan of messages; the regex escapes keep this text ASCII. */
	"UPDATE messages SET tsv = NULL"
	"  WHERE tsv::text ~ '[\\u0386\\u0388-\\u038A\\u038C\\u038E\\u038F"
	"\\u03AA\\u03AB\\u03C2]'"
	"  OR tsv_tool::text ~ '[\\u0386\\u0388-\\u038A\\u038C\\u038E"
	"\\u038F\\u03AA\\u03AB\\u03C2]';",

	/* 6: the server time of each session's last change, for the
	 * session TTL. Nullable, no default: rewrites nothing; NULL (rows
	 * written before) is unknown, and the sweeper dates those sessions
	 * as before, by their newest message. */
	"ALTER TABLE sessions ADD COLUMN active_at timestamptz;",
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

	/* Read committed whatever the server's default: a replica that
	 * waited for the lock must then see the version the one before it
	 * wrote (a snapshot taken at the lock would not). */
	if ((rc = run(d, pg, "BEGIN ISOLATION LEVEL READ COMMITTED", NULL)))
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
	"NULL, NULL, NULL, NULL, NULL, NULL, NULL"

/* The size of seq x as a protobuf varint (x: an SQL expression). */
#define VARINT_LEN(x) \
	"CASE WHEN " x " < 128 THEN 1 WHEN " x " < 16384 THEN 2" \
	" WHEN " x " < 2097152 THEN 3 WHEN " x " < 268435456 THEN 4" \
	" WHEN " x " < 34359738368 THEN 5 WHEN " x " < 4398046511104 THEN 6" \
	" WHEN " x " < 562949953421312 THEN 7" \
	" WHEN " x " < 72057594037927936 THEN 8 ELSE 9 END"

/* A stored message's record length as histd counts it (bytes_total): the
 * seq field (a key byte and the varint) in front of the packed bytes. */
#define RECORD_LEN "(octet_length(data) + 1 + " VARINT_LEN("seq") ")"

/* A session row's context_keys are the jsonb k (an SQL expression): found
 * by the digest index (schema version 4), confirmed by the keys. */
#define KEYS_ARE(k) \
	"histd_keys_digest(context_keys) = histd_keys_digest(" k "::jsonb)" \
	" AND context_keys = " k "::jsonb"

/* The conflict target of a resolve: that index. */
#define KEYS_CONFLICT \
	"ON CONFLICT (tenant, histd_keys_digest(context_keys))" \
	" WHERE context_keys IS NOT NULL"

/* Which session stands in the way of a create refused by the tenant's
 * limit ($1 tenant, $2 id, $3 context keys): 1 the id, 2 the keys, else 0;
 * a create that could not be made for either reason is EEXISTS, as it
 * would be without a limit. */
#define TAKEN(n_ok) \
	"CASE WHEN " n_ok " THEN 0" \
	" WHEN EXISTS (SELECT 1 FROM sessions WHERE tenant = $1::text" \
	"  AND id = $2::text) THEN 1" \
	" WHEN $3::jsonb IS NOT NULL AND EXISTS (SELECT 1 FROM sessions" \
	"  WHERE tenant = $1::text AND " KEYS_ARE("$3") ") THEN 2" \
	" ELSE 0 END"

/* The newest stored seq of session s, for exclude_newest ($9): last_seq
 * while cleared_to_seq is below it (everything above cleared_to_seq is
 * stored); after a clear or truncate of everything, the newest kept
 * system message, if any. */
#define NEWEST_SEQ \
	"CASE WHEN $9::int4 = 0 OR s.cleared_to_seq < s.last_seq THEN s.last_seq" \
	" ELSE coalesce((SELECT max(m.seq) FROM messages m WHERE m.sid = s.sid)," \
	" 0) END"

const char *const pg_stmt_name[ST_COUNT] = {
	[ST_SESSION_GET] = "session_get",
	[ST_SESSION_GET_SID] = "session_get_sid",
	[ST_SESSION_CREATE] = "session_create",
	[ST_SESSION_CREATE_LIMITED] = "session_create_limited",
	[ST_SESSION_BY_KEYS] = "session_by_keys",
	[ST_SESSION_RESOLVE] = "session_resolve",
	[ST_SESSION_RESOLVE_LIMITED] = "session_resolve_limited",
	[ST_TENANT_LOCK] = "tenant_lock",
	[ST_SESSION_LOCK] = "session_lock",
	[ST_SESSION_LIST] = "session_list",
	[ST_SESSION_LIST_LABELS] = "session_list_labels",
	[ST_TENANT_LIST] = "tenant_list",
	[ST_SESSION_UPDATE] = "session_update",
	[ST_SESSION_DELETE] = "session_delete",
	[ST_READ_AFTER] = "read_after",
	[ST_READ_LAST] = "read_last",
	[ST_TOOL_RESULT] = "tool_result",
	[ST_CLEAR] = "clear",
	[ST_TRUNCATE_PROBE] = "truncate_probe",
	[ST_TRUNCATE] = "truncate",
	[ST_SUMMARY_PUT] = "summary_put",
	[ST_SUMMARY_GET] = "summary_get",
	[ST_FORK_SOURCE] = "fork_source",
	[ST_FORK_CREATE] = "fork_create",
	[ST_FORK_CREATE_LIMITED] = "fork_create_limited",
	[ST_FORK_SIZE] = "fork_size",
	[ST_FORK_COPY] = "fork_copy",
	[ST_FAST_APPEND] = "fast_append",
	[ST_FAST_APPEND_LIMITED] = "fast_append_limited",
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
	[ST_SEARCH_LEXICAL] = "search_lexical",
	[ST_SEARCH_SEMANTIC] = "search_semantic",
	[ST_EMBEDDING_PUT] = "embedding_put",
	[ST_BEGIN] = "begin",
	[ST_COMMIT] = "commit",
	[ST_ROLLBACK] = "rollback",
};

/* The requests of a fast-path batch (ST_FAST_APPEND*), one row each. */
#define FAST_REQ \
	"WITH req AS (SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]," \
	"  $4::int8[]) WITH ORDINALITY AS r(tenant, id, n, tokens, ord)),"

/* The writes of a fast-path batch, given `plan`: a row per request to
 * apply (ord, sid, n, tokens, base: the seq before its first, rev); `at`:
 * the parameter of the batch's time (its sessions' active_at). */
#define FAST_WRITE(at) \
	" ins AS (INSERT INTO messages (sid, seq, revision, role, author," \
	"  created_at, token_estimate, data, tsv, tsv_tool, tsv_len," \
	"  tsv_tool_len)" \
	"  SELECT p.sid, p.base + m.k, p.rev, m.role, m.author, m.created_at," \
	"  m.tokens, m.data, m.tsv::tsvector, m.tool::tsvector, m.tl, m.ttl" \
	"  FROM unnest($5::int8[], $6::int8[], $7::int2[], $8::text[]," \
	"  $9::timestamptz[], $10::int4[], $11::bytea[], $12::text[]," \
	"  $13::text[], $14::int4[], $15::int4[])" \
	"  AS m(ord, k, role, author, created_at, tokens, data, tsv, tool, tl," \
	"  ttl)" \
	"  JOIN plan p ON p.ord = m.ord" \
	"  RETURNING sid, " RECORD_LEN " AS len, tsv_len, tsv_tool_len)," \
	" words AS (SELECT sid, count(*) FILTER (WHERE tsv_len > 0) AS td," \
	"  sum(tsv_len) AS tl," \
	"  count(*) FILTER (WHERE tsv_len + tsv_tool_len > 0) AS ad," \
	"  sum(tsv_len + tsv_tool_len) AS al FROM ins GROUP BY sid)," \
	" agg AS (SELECT p.sid, max(p.rev) AS rev, max(p.base + p.n) AS last_seq," \
	"  sum(p.n)::int8 AS n, sum(p.tokens)::int8 AS tokens," \
	"  min(p.base) + 1 AS first_new," \
	"  (SELECT sum(len) FROM ins WHERE ins.sid = p.sid)::int8 AS bytes" \
	"  FROM plan p GROUP BY p.sid)," \
	" upd AS (UPDATE sessions AS s SET revision = a.rev," \
	"  active_at = " at "::timestamptz," \
	"  last_seq = a.last_seq, message_count = s.message_count + a.n," \
	"  token_total = s.token_total + a.tokens," \
	"  bytes_total = s.bytes_total + a.bytes," \
	"  first_seq = CASE WHEN s.first_seq = 0 THEN a.first_new" \
	"  ELSE s.first_seq END," \
	"  text_docs = s.text_docs + w.td, text_len = s.text_len + w.tl," \
	"  any_docs = s.any_docs + w.ad, any_len = s.any_len + w.al" \
	"  FROM agg a JOIN words w ON w.sid = a.sid" \
	"  WHERE s.sid = a.sid RETURNING s.sid)"

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
	" created_at, updated_at, active_at, revision)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, $6::timestamptz, 1)"
	" RETURNING " PG_SESSION_COLS,

	/* As ST_SESSION_CREATE, under the tenant's lock (ST_TENANT_LOCK, an
	 * earlier statement of the transaction, so that this one's snapshot
	 * sees every create committed before it), only while the tenant has
	 * fewer than $7 sessions. Always one row: the tenant's sessions
	 * before, what is taken (TAKEN), and the new session's columns (NULL
	 * when not created). */
	[ST_SESSION_CREATE_LIMITED] =
	"WITH n AS (SELECT count(*) AS n FROM sessions WHERE tenant = $1::text),"
	" ins AS (INSERT INTO sessions AS s (tenant, id, context_keys, labels,"
	"  config, created_at, updated_at, active_at, revision)"
	"  SELECT $1::text, $2::text, $3::jsonb, $4::jsonb, $5::bytea,"
	"  $6::timestamptz, $6::timestamptz, $6::timestamptz, 1 FROM n"
	"  WHERE n.n < $7::int8"
	"  RETURNING " PG_SESSION_COLS ")"
	" SELECT n.n, " TAKEN("n.n < $7::int8") ", ins.*"
	" FROM n LEFT JOIN ins ON true",

	[ST_SESSION_BY_KEYS] =
	"SELECT " PG_SESSION_COLS " FROM sessions s"
	" WHERE s.tenant = $1 AND " KEYS_ARE("$2"),

	/* As ST_SESSION_CREATE; nothing when the keys are taken. */
	[ST_SESSION_RESOLVE] =
	"INSERT INTO sessions AS s (tenant, id, context_keys, labels, config,"
	" created_at, updated_at, active_at, revision)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, $6::timestamptz, 1)"
	" " KEYS_CONFLICT " DO NOTHING"
	" RETURNING " PG_SESSION_COLS,

	/* As ST_SESSION_RESOLVE, limited as ST_SESSION_CREATE_LIMITED (same
	 * row; taken: only the id, as resolve finds a holder of the keys). */
	[ST_SESSION_RESOLVE_LIMITED] =
	"WITH n AS (SELECT count(*) AS n FROM sessions WHERE tenant = $1::text),"
	" ins AS (INSERT INTO sessions AS s (tenant, id, context_keys, labels,"
	"  config, created_at, updated_at, active_at, revision)"
	"  SELECT $1::text, $2::text, $3::jsonb, $4::jsonb, $5::bytea,"
	"  $6::timestamptz, $6::timestamptz, $6::timestamptz, 1 FROM n"
	"  WHERE n.n < $7::int8"
	"  " KEYS_CONFLICT " DO NOTHING"
	"  RETURNING " PG_SESSION_COLS ")"
	" SELECT n.n, CASE WHEN n.n < $7::int8 THEN 0"
	"  WHEN EXISTS (SELECT 1 FROM sessions WHERE tenant = $1::text"
	"  AND id = $2::text) THEN 1 ELSE 0 END, ins.*"
	" FROM n LEFT JOIN ins ON true",

	/* Serializes the creates of one tenant ($1) when sessions per tenant
	 * are limited, on every replica, until the transaction ends. Tenants
	 * whose hashes collide only wait for each other. */
	[ST_TENANT_LOCK] =
	"SELECT 1 FROM pg_advisory_xact_lock(" TENANT_LOCK_CLASS ", hashtext($1))",

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

	/* The tenants above $1, at most $2 (limit + 1): a loose index scan,
	 * one probe of the (tenant, id) index per tenant, however many
	 * sessions each holds. */
	[ST_TENANT_LIST] =
	"WITH RECURSIVE t(tenant) AS ("
	" (SELECT tenant FROM sessions WHERE tenant > $1::text"
	"  ORDER BY tenant LIMIT 1)"
	" UNION ALL"
	" SELECT (SELECT s.tenant FROM sessions s WHERE s.tenant > t.tenant"
	"  ORDER BY s.tenant LIMIT 1)"
	" FROM t WHERE t.tenant IS NOT NULL)"
	"SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT $2::int8",

	/* $1 sid, $2 labels (NULL: keep), $3 set config?, $4 config,
	 * $5 updated_at */
	[ST_SESSION_UPDATE] =
	"UPDATE sessions AS s SET labels = COALESCE($2::jsonb, s.labels),"
	" config = CASE WHEN $3::bool THEN $4::bytea ELSE s.config END,"
	" updated_at = $5::timestamptz, active_at = $5::timestamptz,"
	" revision = s.revision + 1,"
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
	/* $3 after seq, $4 limit (NULL: none), $5 a byte budget (0: none):
	 * the rows that start within it, counting each message's stored
	 * bytes alone (fewer than its framed record), so every row the exact
	 * budget keeps comes, and perhaps a few more for the driver to
	 * drop. The last column: how many rows the limit alone gives. The
	 * windows run over the limited rows only; octet_length reads a
	 * stored value's size without detoasting it. */
	[ST_READ_AFTER] =
	"SELECT 0 AS k, " PG_SESSION_COLS ", NULL::int8, NULL::int4, NULL::bytea,"
	" NULL::int8"
	" FROM sessions s WHERE s.tenant = $1 AND s.id = $2"
	" UNION ALL"
	" (SELECT 1, " NULL_SESSION ", x.seq, x.token_estimate, x.data, x.total"
	"  FROM (SELECT y.*, count(*) OVER () AS total,"
	"   sum(octet_length(y.data)) OVER (ORDER BY y.seq ROWS UNBOUNDED PRECEDING)"
	"   - octet_length(y.data) AS before"
	"   FROM (SELECT m.seq, m.token_estimate, m.data FROM messages m"
	"    WHERE m.sid = (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2)"
	"    AND m.seq > $3::int8 ORDER BY m.seq LIMIT $4::int8) y) x"
	"  WHERE $5::int8 = 0 OR x.before < $5::int8 ORDER BY x.seq)",

	/* The newest $3, newest first; $4 a byte budget, as above, counted
	 * from the newest. */
	[ST_READ_LAST] =
	"SELECT 0 AS k, " PG_SESSION_COLS ", NULL::int8, NULL::int4, NULL::bytea,"
	" NULL::int8"
	" FROM sessions s WHERE s.tenant = $1 AND s.id = $2"
	" UNION ALL"
	" (SELECT 1, " NULL_SESSION ", x.seq, x.token_estimate, x.data, x.total"
	"  FROM (SELECT y.*, count(*) OVER () AS total,"
	"   sum(octet_length(y.data)) OVER (ORDER BY y.seq DESC"
	"    ROWS UNBOUNDED PRECEDING) - octet_length(y.data) AS before"
	"   FROM (SELECT m.seq, m.token_estimate, m.data FROM messages m"
	"    WHERE m.sid = (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2)"
	"    ORDER BY m.seq DESC LIMIT $3::int8) y) x"
	"  WHERE $4::int8 = 0 OR x.before < $4::int8 ORDER BY x.seq DESC)",

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
	" text_docs = 0, text_len = 0, any_docs = 0, any_len = 0,"
	" clear_revision = revision + 1, active_at = $2::timestamptz"
	" WHERE sid = $1::int8 RETURNING revision, cleared_to_seq",

	/* Whether truncate ($1 tenant, $2 id, $3 up_to_seq) has anything to
	 * delete: a message at or below the seq that is not a system one.
	 * Run after the session row is locked (a statement of its own: its
	 * snapshot sees the appends the lock waited for). */
	[ST_TRUNCATE_PROBE] =
	"SELECT EXISTS (SELECT 1 FROM messages WHERE sid = (SELECT sid"
	" FROM sessions WHERE tenant = $1 AND id = $2) AND seq <= $3::int8"
	" AND role <> " ROLE_SYSTEM ")",

	/* $1 sid, $2 up_to_seq, $3 the new revision, $4 its time. Deletes the messages at
	 * or below the seq that are not system ones (their vectors are
	 * columns), the tool calls they issued, the summaries covering no
	 * later seq; the stats drop by what was deleted. The statement sees
	 * the rows as before its deletes: first_seq is the first row that
	 * stays. */
	[ST_TRUNCATE] =
	"WITH d AS (DELETE FROM messages WHERE sid = $1::int8 AND seq <= $2::int8"
	"  AND role <> " ROLE_SYSTEM
	"  RETURNING seq, token_estimate, " RECORD_LEN " AS len, tsv_len,"
	"  tsv_tool_len),"
	" t AS (DELETE FROM tool_calls WHERE sid = $1::int8"
	"  AND call_seq IN (SELECT seq FROM d)),"
	" u AS (DELETE FROM summaries WHERE sid = $1::int8"
	"  AND covers_to_seq <= $2::int8 RETURNING 1),"
	" a AS (SELECT count(*) AS n, coalesce(sum(token_estimate), 0) AS tokens,"
	"  coalesce(sum(len), 0) AS bytes,"
	"  count(*) FILTER (WHERE tsv_len > 0) AS td,"
	"  coalesce(sum(tsv_len), 0) AS tl,"
	"  count(*) FILTER (WHERE tsv_len + tsv_tool_len > 0) AS ad,"
	"  coalesce(sum(tsv_len + tsv_tool_len), 0) AS al FROM d)"
	" UPDATE sessions AS s SET revision = $3::int8,"
	" cleared_to_seq = greatest(s.cleared_to_seq, $2::int8),"
	" message_count = s.message_count - a.n,"
	" token_total = s.token_total - a.tokens,"
	" bytes_total = s.bytes_total - a.bytes,"
	" first_seq = coalesce((SELECT m.seq FROM messages m WHERE m.sid = $1::int8"
	"  AND (m.seq > $2::int8 OR m.role = " ROLE_SYSTEM ")"
	"  ORDER BY m.seq LIMIT 1), 0),"
	" summary_count = s.summary_count - (SELECT count(*) FROM u),"
	" text_docs = s.text_docs - a.td, text_len = s.text_len - a.tl,"
	" any_docs = s.any_docs - a.ad, any_len = s.any_len - a.al,"
	" truncate_revision = $3::int8, active_at = $4::timestamptz"
	" FROM a WHERE s.sid = $1::int8 RETURNING s.revision, s.cleared_to_seq",

	/* $1 sid, $2 new revision, $3 covers_to_seq, $4 tokens, $5 data,
	 * $6 its time */
	[ST_SUMMARY_PUT] =
	"WITH ins AS (INSERT INTO summaries (sid, revision, covers_to_seq,"
	" token_estimate, data) VALUES ($1::int8, $2::int8, $3::int8, $4::int4,"
	" $5::bytea))"
	" UPDATE sessions SET revision = $2::int8, active_at = $6::timestamptz,"
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
	" created_at, updated_at, active_at, revision, last_seq, cleared_to_seq)"
	" VALUES ($1, $2, $3::jsonb, $4::jsonb, $5::bytea, $6::timestamptz,"
	" $6::timestamptz, $6::timestamptz, 1, $7::int8, $8::int8)"
	" RETURNING sid",

	/* As ST_FORK_CREATE, limited as ST_SESSION_CREATE_LIMITED ($9 the
	 * limit): the tenant's sessions before, what is taken, the new sid
	 * (NULL when not created). */
	[ST_FORK_CREATE_LIMITED] =
	"WITH n AS (SELECT count(*) AS n FROM sessions WHERE tenant = $1::text),"
	" ins AS (INSERT INTO sessions (tenant, id, context_keys, labels, config,"
	"  created_at, updated_at, active_at, revision, last_seq,"
	"  cleared_to_seq)"
	"  SELECT $1::text, $2::text, $3::jsonb, $4::jsonb, $5::bytea,"
	"  $6::timestamptz, $6::timestamptz, $6::timestamptz, 1, $7::int8,"
	"  $8::int8"
	"  FROM n WHERE n.n < $9::int8 RETURNING sid)"
	" SELECT n.n, " TAKEN("n.n < $9::int8") ", ins.sid"
	" FROM n LEFT JOIN ins ON true",

	/* What a fork of ($1 tenant, $2 id) up to seq $3 would hold: its
	 * messages and their record bytes (after ST_FORK_SOURCE locked the
	 * source). */
	[ST_FORK_SIZE] =
	"SELECT count(*), coalesce(sum(" RECORD_LEN "), 0)::int8 FROM messages"
	" WHERE sid = (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2)"
	" AND seq <= $3::int8",

	/* $1 source sid, $2 fork sid, $3 up_to_seq. Copied messages are at
	 * revision 1 (the fork's); copied summaries at revisions <= 0 in
	 * their order, so that neither looks like a later change. */
	[ST_FORK_COPY] =
	"WITH m AS (INSERT INTO messages (sid, seq, revision, role, author,"
	"  created_at, token_estimate, data, tsv, tsv_tool, tsv_len,"
	"  tsv_tool_len, embedding, embedding_model)"
	"  SELECT $2::int8, seq, 1, role, author, created_at, token_estimate, data,"
	"  tsv, tsv_tool, tsv_len, tsv_tool_len, embedding, embedding_model"
	"  FROM messages WHERE sid = $1::int8 AND seq <= $3::int8"
	"  RETURNING seq, token_estimate, " RECORD_LEN " AS len, tsv_len,"
	"  tsv_tool_len),"
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
	" summary_count = (SELECT count(*) FROM u),"
	" text_docs = (SELECT count(*) FILTER (WHERE tsv_len > 0) FROM m),"
	" text_len = (SELECT coalesce(sum(tsv_len), 0) FROM m),"
	" any_docs = (SELECT count(*) FILTER (WHERE tsv_len + tsv_tool_len > 0)"
	"  FROM m),"
	" any_len = (SELECT coalesce(sum(tsv_len + tsv_tool_len), 0) FROM m)"
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
	 * $8 author, $9 created_at, $10 tokens, $11 bytes, $12 tsv, $13
	 * tsv_tool, $14 tsv_len, $15 tsv_tool_len (per message); $16 the
	 * batch's time (its sessions' active_at: the newest now_us of its
	 * requests, which are gathered within a millisecond or so);
	 * (The notice goes in a transaction of its own: ST_NOTIFY_SESSIONS.) */
	[ST_FAST_APPEND] =
	FAST_REQ
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
	FAST_WRITE("$16")
	" SELECT p.ord, p.sid, p.base, p.rev FROM plan p",

	/*
	 * ST_FAST_APPEND when the session size is limited: per session, the
	 * requests in order while the session would hold at most $17
	 * messages and $18 record bytes (0: no limit) are applied; from the
	 * first that would not fit on, none (the caller runs those again,
	 * each checked after the others). $16: the packed length of each
	 * message (record bytes: that, the seq key and its varint); $19 the
	 * batch's time, as $16 of ST_FAST_APPEND. One row
	 * per request whose session exists: ordinal, sid, base, revision
	 * (NULL when not applied), applied, and the messages and bytes the
	 * session would hold with it and the requests before it.
	 */
	[ST_FAST_APPEND_LIMITED] =
	FAST_REQ
	" locked AS (SELECT l.* FROM (SELECT DISTINCT tenant COLLATE \"C\" AS"
	"  tenant, id COLLATE \"C\" AS id FROM req ORDER BY 1, 2) k,"
	"  LATERAL (SELECT s.sid, s.tenant, s.id, s.revision, s.last_seq,"
	"  s.message_count, s.bytes_total"
	"  FROM sessions s WHERE s.tenant = k.tenant AND s.id = k.id"
	"  FOR UPDATE) l),"
	" pre AS (SELECT r.ord, l.sid, r.n, r.tokens, l.revision,"
	"  l.message_count, l.bytes_total,"
	"  (l.last_seq + sum(r.n) OVER w - r.n)::int8 AS base"
	"  FROM req r JOIN locked l ON l.tenant = r.tenant AND l.id = r.id"
	"  WINDOW w AS (PARTITION BY l.sid ORDER BY r.ord)),"
	" lens AS (SELECT x.ord, sum(x.len + 1 + " VARINT_LEN("(p.base + x.k)")
	"  )::int8 AS bytes"
	"  FROM unnest($5::int8[], $6::int8[], $16::int4[]) AS x(ord, k, len)"
	"  JOIN pre p ON p.ord = x.ord GROUP BY x.ord),"
	" cum AS (SELECT p.*, p.message_count + sum(p.n) OVER w AS cn,"
	"  p.bytes_total + sum(g.bytes) OVER w AS cb"
	"  FROM pre p JOIN lens g ON g.ord = p.ord"
	"  WINDOW w AS (PARTITION BY p.sid ORDER BY p.ord)),"
	" fit AS (SELECT c.*, bool_and(($17::int8 = 0 OR c.cn <= $17::int8)"
	"  AND ($18::int8 = 0 OR c.cb <= $18::int8))"
	"  OVER (PARTITION BY c.sid ORDER BY c.ord) AS ok FROM cum c),"
	" plan AS (SELECT f.ord, f.sid, f.n, f.tokens, f.base,"
	"  f.revision + row_number() OVER (PARTITION BY f.sid ORDER BY f.ord)"
	"  AS rev FROM fit f WHERE f.ok),"
	FAST_WRITE("$19")
	" SELECT f.ord, f.sid, f.base, p.rev, f.ok, f.cn::int8, f.cb::int8"
	" FROM fit f LEFT JOIN plan p ON p.ord = f.ord",

	/* Locks the sessions of a batch, in (tenant, id) byte order: the
	 * same order in every batch of every replica, so no deadlock. Each
	 * is found by its key (LATERAL: an index lookup however small or
	 * bloated the table looks to the planner). */
	[ST_BATCH_LOCK] =
	"SELECT k.i, l.* FROM (SELECT * FROM unnest($1::text[], $2::text[])"
	"  WITH ORDINALITY AS u(tenant, id, i)"
	"  ORDER BY tenant COLLATE \"C\", id COLLATE \"C\") k,"
	" LATERAL (SELECT s.sid, s.revision, s.last_seq, s.message_count,"
	"  s.token_total, s.bytes_total, s.first_seq, s.text_docs, s.text_len,"
	"  s.any_docs, s.any_len FROM sessions s"
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
	" token_estimate, data, tsv, tsv_tool, tsv_len, tsv_tool_len)"
	" SELECT sid, seq, revision, role, author, created_at, tokens, data,"
	" tsv::tsvector, tool::tsvector, tl, ttl"
	" FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int2[],"
	" $5::text[], $6::timestamptz[], $7::int4[], $8::bytea[], $9::text[],"
	" $10::text[], $11::int4[], $12::int4[]) AS m(sid, seq, revision, role,"
	" author, created_at, tokens, data, tsv, tool, tl, ttl)",

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
	" bytes_total = v.bytes_total, first_seq = v.first_seq,"
	" text_docs = v.td, text_len = v.tl, any_docs = v.ad, any_len = v.al,"
	" active_at = v.at"
	" FROM unnest($1::int8[], $2::int8[], $3::int8[], $4::int8[], $5::int8[],"
	" $6::int8[], $7::int8[], $8::int8[], $9::int8[], $10::int8[],"
	" $11::int8[], $12::timestamptz[]) AS v(sid, revision, last_seq,"
	" message_count, token_total, bytes_total, first_seq, td, tl, ad, al,"
	" at)"
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
	 * tenants, $2 ids, $3 origin. Its commit does not wait for the WAL
	 * flush (synchronous_commit off for this transaction alone): the
	 * batch it announces is durable already, and a notice lost in a
	 * crash is made up for by the listeners' sweep, as any lost notice.
	 * One flush per batch instead of two. */
	[ST_NOTIFY_SESSIONS] =
	"SELECT set_config('synchronous_commit', 'off', true),"
	" pg_notify('" PG_CHANNEL "', string_agg($3 || ' 1 ' || s.revision"
	" || ' ' || s.sid, E'\n')) FROM sessions s"
	" WHERE (s.tenant, s.id) IN (SELECT * FROM unnest($1::text[], $2::text[]))",

	[ST_CATCH_UP] =
	"SELECT 0 AS k, s.revision, s.last_seq, s.cleared_to_seq,"
	" s.clear_revision, s.meta_revision, NULL::int4, NULL::bytea,"
	" s.truncate_revision"
	" FROM sessions s WHERE s.sid = $1::int8"
	" UNION ALL"
	" (SELECT 1, m.revision, m.seq, NULL, NULL, NULL, m.token_estimate, m.data,"
	"  NULL FROM messages m WHERE m.sid = $1::int8 AND m.seq > $2::int8"
	"  ORDER BY m.seq)"
	" UNION ALL"
	" (SELECT 2, u.revision, u.covers_to_seq, NULL, NULL, NULL,"
	"  u.token_estimate, u.data, NULL"
	"  FROM summaries u WHERE u.sid = $1::int8 AND u.revision > $3::int8"
	"  ORDER BY u.revision)",

	[ST_WATCH_REVISIONS] =
	"SELECT v.sid, s.revision FROM unnest($1::int8[]) AS v(sid)"
	" LEFT JOIN sessions s ON s.sid = v.sid",

	[ST_PURGE_IDEM] =
	"DELETE FROM idempotency_keys WHERE ctid IN (SELECT ctid"
	" FROM idempotency_keys WHERE expires_at < $1::timestamptz LIMIT 10000)",

	/*
	 * BM25 over the words of the tenant's messages (search.c). $1 tenant,
	 * $2 tsquery (the OR of the tokens), $3 the tokens, $4 scope (0 the
	 * tenant, 1 the ids $5, 2 the labels $6), $7 roles (bit per role; 0
	 * all), $8 1: with tool result text, $9 1: leave out each session's
	 * newest, $10 k.
	 * cand: the tenant's messages holding a token (the GIN indexes); tf:
	 * each token's count in each (a lexeme's positions are its
	 * occurrences); df over cand, N and the average length over the
	 * tenant (sessions' sums), as drivers/index/ computes them; then
	 * only the scope is scored. A session's newest stored message:
	 * NEWEST_SEQ.
	 */
	[ST_SEARCH_LEXICAL] =
	"WITH ten AS MATERIALIZED (SELECT s.sid, s.id, " NEWEST_SEQ " AS last_seq,"
	"  s.labels,"
	"  s.text_docs, s.text_len, s.any_docs, s.any_len"
	"  FROM sessions s WHERE s.tenant = $1),"
	" st AS (SELECT greatest(coalesce(sum(CASE WHEN $8::int4 = 1"
	"  THEN any_docs ELSE text_docs END), 0), 1)::float8 AS n,"
	"  greatest(coalesce(sum(CASE WHEN $8::int4 = 1"
	"  THEN any_len ELSE text_len END), 0), 1)::float8 AS total FROM ten),"
	" cand AS MATERIALIZED (SELECT m.sid, m.seq, m.role, m.tsv, m.tsv_tool,"
	"  (m.tsv_len + CASE WHEN $8::int4 = 1 THEN m.tsv_tool_len ELSE 0 END)"
	"  ::float8 AS dl"
	"  FROM messages m WHERE m.sid IN (SELECT sid FROM ten)"
	"  AND (m.tsv @@ $2::tsquery"
	"  OR ($8::int4 = 1 AND m.tsv_tool @@ $2::tsquery))),"
	" tf AS MATERIALIZED (SELECT c.sid, c.seq, u.lexeme,"
	"  sum(cardinality(u.positions))::float8 AS f"
	"  FROM cand c CROSS JOIN LATERAL (SELECT lexeme, positions"
	"  FROM unnest(c.tsv) UNION ALL SELECT lexeme, positions"
	"  FROM unnest(c.tsv_tool) WHERE $8::int4 = 1) u"
	"  WHERE u.lexeme = ANY($3::text[]) GROUP BY c.sid, c.seq, u.lexeme),"
	" df AS (SELECT lexeme, count(*)::float8 AS df FROM tf GROUP BY lexeme),"
	" sc AS (SELECT sid, id, last_seq FROM ten WHERE CASE $4::int4"
	"  WHEN 1 THEN id = ANY($5::text[]) WHEN 2 THEN labels @> $6::jsonb"
	"  ELSE true END),"
	" hit AS (SELECT c.sid, c.seq, sc.id,"
	"  sum(ln(1 + (st.n - df.df + 0.5) / (df.df + 0.5)) * tf.f * 2.2"
	"  / (tf.f + 1.2 * (0.25 + 0.75 * c.dl / (st.total / st.n)))) AS score"
	"  FROM cand c JOIN sc ON sc.sid = c.sid"
	"  JOIN tf ON tf.sid = c.sid AND tf.seq = c.seq"
	"  JOIN df ON df.lexeme = tf.lexeme CROSS JOIN st"
	"  WHERE ($7::int8 = 0 OR (c.role BETWEEN 0 AND 62"
	"  AND (($7::int8 >> c.role::int4) & 1) = 1))"
	"  AND NOT ($9::int4 = 1 AND c.seq = sc.last_seq)"
	"  GROUP BY c.sid, c.seq, sc.id"
	"  ORDER BY score DESC, sc.id, c.seq LIMIT $10::int8)"
	" SELECT h.id, h.seq, h.score, m.token_estimate, m.data"
	" FROM hit h JOIN messages m ON m.sid = h.sid AND m.seq = h.seq"
	" ORDER BY h.score DESC, h.id, h.seq",

	/* Cosine with the normalized query $2 (stored vectors are
	 * normalized) over the scope's vectors of model $3 and dimension $8,
	 * above 0 only, as the in-process drivers (driver.h: search); $4..$7,
	 * $9, $10 as in ST_SEARCH_LEXICAL. */
	[ST_SEARCH_SEMANTIC] =
	"WITH sc AS (SELECT s.sid, s.id, " NEWEST_SEQ " AS last_seq"
	"  FROM sessions s WHERE s.tenant = $1"
	"  AND CASE $4::int4 WHEN 1 THEN id = ANY($5::text[])"
	"  WHEN 2 THEN labels @> $6::jsonb ELSE true END),"
	" hit AS (SELECT m.sid, m.seq, sc.id, c.score"
	"  FROM messages m JOIN sc ON sc.sid = m.sid"
	"  CROSS JOIN LATERAL (SELECT coalesce(sum(a::float8 * b::float8), 0)"
	"  AS score FROM unnest(m.embedding, $2::float4[]) AS u(a, b)) c"
	"  WHERE m.embedding_model = $3 AND cardinality(m.embedding) = $8::int4"
	"  AND ($7::int8 = 0 OR (m.role BETWEEN 0 AND 62"
	"  AND (($7::int8 >> m.role::int4) & 1) = 1))"
	"  AND NOT ($9::int4 = 1 AND m.seq = sc.last_seq)"
	"  AND c.score > 0"
	"  ORDER BY c.score DESC, sc.id, m.seq LIMIT $10::int8)"
	" SELECT h.id, h.seq, h.score, m.token_estimate, m.data"
	" FROM hit h JOIN messages m ON m.sid = h.sid AND m.seq = h.seq"
	" ORDER BY h.score DESC, h.id, h.seq",

	/* $1 tenant, $2 id, $3 seq, $4 the normalized vector, $5 model,
	 * $6 the life (sid) it is for, 0: any. Whether the session, the
	 * message and the life were found: the message is updated only
	 * under the sid of that life, in this one statement, so a session
	 * made again under the id never takes it. Neither the revision nor
	 * anything a subscriber sees changes. */
	[ST_EMBEDDING_PUT] =
	"WITH s AS (SELECT sid FROM sessions WHERE tenant = $1 AND id = $2),"
	" l AS (SELECT sid FROM s WHERE $6::int8 = 0 OR sid = $6::int8),"
	" u AS (UPDATE messages AS m SET embedding = $4::float4[],"
	"  embedding_model = $5 FROM l WHERE m.sid = l.sid AND m.seq = $3::int8"
	"  RETURNING 1)"
	" SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM u),"
	"  (SELECT count(*) FROM l)",

	[ST_BEGIN] = "BEGIN",
	[ST_COMMIT] = "COMMIT",
	[ST_ROLLBACK] = "ROLLBACK",
};
