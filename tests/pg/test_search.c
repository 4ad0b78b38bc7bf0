/*
 * Search on the postgres driver (drivers/postgres/search.c), on the test
 * cluster: what the conformance suite cannot see from the interface.
 *
 * - the words stored beside each message, and the per-session sums;
 * - BM25 scores equal to the in-process index's (memory driver) on one
 *   corpus, with and without tool results;
 * - messages stored before schema version 2 are filled in at start;
 * - two driver instances on one database: what one appends or clears,
 *   the other's search sees at once.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "pg.h"
#include "pgharness.h"

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

static int
setup(void **state)
{
	fixture *f = calloc(1, sizeof(*f));

	if (!f || !(f->dsn = pgh_new_database(cluster, "search")))
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

static histd_driver *
open_pg(const char *dsn)
{
	histd_driver_config cfg = { .dsn = dsn, .pool_size = 2 };
	histd_driver *d = NULL;

	if (histd_driver_open("postgres", &cfg, &d))
		fail_msg("open: %s", histd_error_message());
	return d;
}

static const char *
sql_text(const char *dsn, const char *sql, char *buf, size_t cap)
{
	PGresult *r = pgh_sql(dsn, sql);

	assert_non_null(r);
	assert_int_equal(PQntuples(r), 1);
	snprintf(buf, cap, "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	return buf;
}

static void
sql_ok(const char *dsn, const char *sql)
{
	PGresult *r = pgh_sql(dsn, sql);

	assert_non_null(r);
	PQclear(r);
}

/* ---------------------------------------------------------------------- */
/* Messages                                                                */

typedef struct msg {
	uint8_t *data;
	size_t len;
	histd_tool_ref call, result;
	int has_call, has_result;
} msg;

static msg
pack(const Histd__V1__Message *m)
{
	msg out = { 0 };

	out.len = histd__v1__message__get_packed_size(m);
	out.data = malloc(out.len ? out.len : 1);
	assert_non_null(out.data);
	histd__v1__message__pack(m, out.data);
	return out;
}

static msg
text_msg(Histd__V1__Role role, const char *text)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b;

	t.text = (char *)text;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &t;
	m.role = role;
	m.n_content = 1;
	m.content = &bp;
	return pack(&m);
}

static msg
call_msg(const char *id, const char *name, const char *args)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ToolCallBlock tc = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b;
	msg out;

	tc.id = (char *)id;
	tc.name = (char *)name;
	tc.arguments = (char *)args;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b.tool_call = &tc;
	m.role = HISTD__V1__ROLE__ROLE_ASSISTANT;
	m.n_content = 1;
	m.content = &bp;
	out = pack(&m);
	out.call = (histd_tool_ref){ .id = id };
	out.has_call = 1;
	return out;
}

static msg
result_msg(const char *id, const char *text)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ToolResultBlock tr = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	Histd__V1__ContentBlock inner = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b, *ip = &inner;
	msg out;

	t.text = (char *)text;
	inner.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	inner.text = &t;
	tr.tool_call_id = (char *)id;
	tr.n_content = 1;
	tr.content = &ip;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b.tool_result = &tr;
	m.role = HISTD__V1__ROLE__ROLE_TOOL;
	m.n_content = 1;
	m.content = &bp;
	out = pack(&m);
	out.result = (histd_tool_ref){ .id = id };
	out.has_result = 1;
	return out;
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

/* Appends copies of the messages as one batch (the messages stay the
 * caller's). */
static void
append(histd_driver *d, const char *id, const msg *m, size_t n)
{
	histd_msg_in in[16];
	histd_append a = { .tenant = "t", .session_id = id, .msgs = in,
			   .n_msgs = n, .now_us = histd_now_us() };
	histd_append_result r;

	assert_true(n <= 16);
	for (size_t i = 0; i < n; i++)
		in[i] = (histd_msg_in){
			.data = m[i].data, .len = m[i].len, .token_estimate = 1,
			.calls = m[i].has_call ? &m[i].call : NULL,
			.n_calls = (size_t)m[i].has_call,
			.results = m[i].has_result ? &m[i].result : NULL,
			.n_results = (size_t)m[i].has_result,
		};
	if (histd_driver_append(d, &a, &r))
		fail_msg("append: %s", histd_error_message());
}

static void
free_msgs(msg *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(m[i].data);
}

static size_t
hits(histd_driver *d, const char *text, int tool, histd_search_result *r)
{
	histd_search_query q = {
		.tenant = "t", .mode = HISTD_SEARCH_LEXICAL, .text = text,
		.k = 50, .include_tool_results = tool,
	};

	memset(r, 0, sizeof(*r));
	if (histd_driver_search(d, &q, r))
		fail_msg("search '%s': %s", text, histd_error_message());
	return r->n;
}

static size_t
count(histd_driver *d, const char *text)
{
	histd_search_result r;
	size_t n = hits(d, text, 0, &r);

	histd_search_result_clear(&r);
	return n;
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void
messages_store_their_words_and_sessions_the_sums(void **state)
{
	fixture *f = *state;
	msg m[] = {
		text_msg(HISTD__V1__ROLE__ROLE_USER, "Hello, hello WORLD!"),
		call_msg("c1", "lookup", "{\"q\": \"hello\"}"),
		result_msg("c1", "found it"),
	};
	char buf[256];

	f->d = open_pg(f->dsn);
	create(f->d, "s");
	append(f->d, "s", m, 3);
	/* Positions are occurrences (1..tf), not offsets. */
	assert_string_equal(sql_text(f->dsn, "SELECT tsv::text || '|' ||"
				     " coalesce(tsv_tool::text, 'NULL') || '|' ||"
				     " tsv_len || '|' || tsv_tool_len FROM messages"
				     " WHERE seq = 1", buf, sizeof(buf)),
			    "'hello':1,2 'world':1|NULL|3|0");
	assert_string_equal(sql_text(f->dsn, "SELECT tsv::text || '|' ||"
				     " tsv_len FROM messages WHERE seq = 2",
				     buf, sizeof(buf)),
			    "'hello':1 'lookup':1 'q':1|3");
	assert_string_equal(sql_text(f->dsn, "SELECT tsv::text || '|' ||"
				     " tsv_tool::text || '|' || tsv_tool_len"
				     " FROM messages WHERE seq = 3", buf, sizeof(buf)),
			    "|'found':1 'it':1|2");
	assert_string_equal(sql_text(f->dsn, "SELECT text_docs || ' ' || text_len"
				     " || ' ' || any_docs || ' ' || any_len"
				     " FROM sessions", buf, sizeof(buf)),
			    "2 6 3 8");
	free_msgs(m, 3);
}

/* The same corpus in the memory driver and in PostgreSQL: the same hits
 * in the same order with the same scores (the in-process index adds in
 * single precision). */
static void
scores_agree_with_the_in_process_index(void **state)
{
	fixture *f = *state;
	static const char *const texts[] = {
		"the quick brown fox jumps over the lazy dog",
		"a quick question about the fox",
		"dogs and foxes are not the same word",
		"the the the the the fox",
		"nothing to see here",
		"brown bread, brown sugar, brown rice and a brown fox",
	};
	static const char *const queries[] = {
		"fox", "the fox", "brown quick", "lazy dog", "sunny lisbon",
		"weather", "the",
	};
	histd_driver *mem = NULL;
	histd_driver_config none = { 0 };

	f->d = open_pg(f->dsn);
	assert_int_equal(histd_driver_open("memory", &none, &mem), 0);
	for (int k = 0; k < 2; k++) {
		histd_driver *d = k ? mem : f->d;
		msg m[8];
		size_t n = 0;

		create(d, "a");
		create(d, "b");
		for (size_t i = 0; i < 6; i++)
			m[n++] = text_msg(HISTD__V1__ROLE__ROLE_USER, texts[i]);
		append(d, "a", m, 4);
		append(d, "b", m + 4, 2);
		free_msgs(m, n);
		m[0] = call_msg("c1", "weather", "{\"city\": \"Lisbon\"}");
		m[1] = result_msg("c1", "sunny in lisbon, the fox sleeps");
		append(d, "b", m, 2);
		free_msgs(m, 2);
		/* A word more often than PostgreSQL keeps positions of
		 * (256): both count it 256 times. */
		{
			char many[300 * 4 + 1];

			for (int r = 0; r < 300; r++)
				memcpy(many + 4 * r, "fox ", 4);
			many[300 * 4] = '\0';
			m[0] = text_msg(HISTD__V1__ROLE__ROLE_USER, many);
			append(d, "b", m, 1);
			free_msgs(m, 1);
		}
	}
	for (size_t i = 0; i < sizeof(queries) / sizeof(queries[0]); i++)
		for (int tool = 0; tool < 2; tool++) {
			histd_search_result a, b;

			hits(f->d, queries[i], tool, &a);
			hits(mem, queries[i], tool, &b);
			if (a.n != b.n)
				fail_msg("'%s' tool %d: %zu hits, the index %zu",
					 queries[i], tool, a.n, b.n);
			for (size_t j = 0; j < a.n; j++) {
				double x = a.hits[j].score, y = b.hits[j].score;

				if (strcmp(a.hits[j].session_id, b.hits[j].session_id) ||
				    a.records.v[j].seq != b.records.v[j].seq ||
				    fabs(x - y) > 1e-4 * fabs(y))
					fail_msg("'%s' tool %d hit %zu: %s/%llu %.6f, the "
						 "index %s/%llu %.6f", queries[i], tool, j,
						 a.hits[j].session_id,
						 (unsigned long long)a.records.v[j].seq, x,
						 b.hits[j].session_id,
						 (unsigned long long)b.records.v[j].seq, y);
			}
			histd_search_result_clear(&a);
			histd_search_result_clear(&b);
		}
	histd_driver_close(mem);
}

/* Session "s" with messages m, stored by a driver closed again: a
 * database for the test to take back to an older schema. */
static void
store_and_close(fixture *f, msg *m, size_t n)
{
	f->d = open_pg(f->dsn);
	create(f->d, "s");
	append(f->d, "s", m, n);
	histd_driver_close(f->d);
	f->d = NULL;
}

/* A database of schema version 1 with messages: opening migrates it and
 * fills the words of the stored messages and the sums. */
static void
messages_stored_before_version_2_are_searchable_after_start(void **state)
{
	fixture *f = *state;
	msg m[] = {
		text_msg(HISTD__V1__ROLE__ROLE_USER, "an old needle"),
		call_msg("c1", "probe", "{}"),
		result_msg("c1", "old tool needle"),
	};
	char buf[128];

	store_and_close(f, m, 3);
	/* Back to version 1: what migration 2 added goes (its indexes with
	 * its columns). */
	sql_ok(f->dsn, "ALTER TABLE messages DROP COLUMN tsv, DROP COLUMN tsv_tool,"
	       " DROP COLUMN tsv_len, DROP COLUMN tsv_tool_len,"
	       " DROP COLUMN embedding, DROP COLUMN embedding_model");
	/* And what later migrations added, as a version 1 database has none
	 * of it. */
	sql_ok(f->dsn, "ALTER TABLE sessions DROP COLUMN text_docs,"
	       " DROP COLUMN text_len, DROP COLUMN any_docs, DROP COLUMN any_len,"
	       " DROP COLUMN truncate_revision, DROP COLUMN active_at");
	sql_ok(f->dsn, "DROP INDEX sessions_tenant_context_keys;"
	       " DROP FUNCTION histd_keys_digest(jsonb);"
	       " CREATE UNIQUE INDEX sessions_tenant_context_keys ON sessions"
	       " (tenant, context_keys) WHERE context_keys IS NOT NULL");
	sql_ok(f->dsn, "UPDATE histd_schema SET version = 1");

	f->d = open_pg(f->dsn);
	assert_int_equal(atoi(sql_text(f->dsn, "SELECT version FROM histd_schema",
				       buf, sizeof(buf))), PG_SCHEMA_VERSION);
	assert_string_equal(sql_text(f->dsn, "SELECT count(*) FROM messages"
				     " WHERE tsv IS NULL", buf, sizeof(buf)), "0");
	assert_string_equal(sql_text(f->dsn, "SELECT text_docs || ' ' || text_len"
				     " || ' ' || any_docs || ' ' || any_len"
				     " FROM sessions", buf, sizeof(buf)),
			    "2 4 3 7");
	assert_int_equal(count(f->d, "needle"), 1);
	{
		histd_search_result r;

		assert_int_equal(hits(f->d, "needle", 1, &r), 2);
		histd_search_result_clear(&r);
	}
	free_msgs(m, 3);
}

/* A database of schema version 4, whose words kept Greek capitals with
 * tonos and final sigma as they were (and had no sessions.active_at, which
 * version 6 adds): opening (version 5) makes the words
 * of those rows again, so the word in small letters finds them, and the
 * sums stay right. */
static void
greek_words_stored_before_version_5_fold_after_start(void **state)
{
	fixture *f = *state;
	msg m[] = {
		text_msg(HISTD__V1__ROLE__ROLE_USER, "ΣΊΣΥΦΟΣ ΆΝΘΡΩΠΟΣ"),
		text_msg(HISTD__V1__ROLE__ROLE_USER, "plain words"),
	};
	char buf[128], sums[128];

	store_and_close(f, m, 2);
	sql_text(f->dsn, "SELECT text_docs || ' ' || text_len || ' ' ||"
		 " any_docs || ' ' || any_len FROM sessions", sums, sizeof(sums));
	/* The words as version 4 wrote them: capitals with tonos kept,
	 * final sigma as sigma. */
	sql_ok(f->dsn, "UPDATE messages SET tsv = $$'σΊσυφοσ':1"
	       " 'Άνθρωποσ':2$$::tsvector WHERE seq = 1");
	sql_ok(f->dsn, "ALTER TABLE sessions DROP COLUMN active_at");
	sql_ok(f->dsn, "UPDATE histd_schema SET version = 4");
	f->d = open_pg(f->dsn);
	assert_int_equal(count(f->d, "σίσυφος"), 1);
	assert_int_equal(count(f->d, "άνθρωπος"), 1);
	assert_int_equal(count(f->d, "plain"), 1);
	assert_int_equal(atoi(sql_text(f->dsn, "SELECT version FROM histd_schema",
				       buf, sizeof(buf))), PG_SCHEMA_VERSION);
	assert_string_equal(sql_text(f->dsn, "SELECT text_docs || ' ' ||"
				     " text_len || ' ' || any_docs || ' ' ||"
				     " any_len FROM sessions", buf, sizeof(buf)),
			    sums);
	free_msgs(m, 2);
}

/* Two instances on one database, as two replicas: a search through one
 * sees what the other wrote as soon as its call returned. */
static void
what_one_replica_appends_another_finds_at_once(void **state)
{
	fixture *f = *state;
	histd_driver *b;
	msg plain = text_msg(HISTD__V1__ROLE__ROLE_USER, "replicated needle");
	msg tools[] = {
		call_msg("c1", "needle_finder", "{\"where\": \"haystack\"}"),
		result_msg("c1", "found"),
	};
	uint64_t rev, cleared;

	f->d = open_pg(f->dsn);
	b = open_pg(f->dsn);
	create(f->d, "s");
	assert_int_equal(count(b, "needle"), 0);
	/* The fast path (a plain append), then the checked one (tool ids). */
	append(f->d, "s", &plain, 1);
	assert_int_equal(count(b, "needle"), 1);
	append(f->d, "s", tools, 2);
	assert_int_equal(count(b, "haystack"), 1);
	assert_int_equal(histd_driver_clear(f->d, "t", "s", 0, &rev, &cleared,
					    NULL), 0);
	assert_int_equal(count(b, "needle"), 0);
	assert_int_equal(count(b, "haystack"), 0);
	histd_driver_close(b);
	free(plain.data);
	free_msgs(tools, 2);
}

static void
embeddings_replace_one_another_and_are_copied_by_fork(void **state)
{
	fixture *f = *state;
	msg m = text_msg(HISTD__V1__ROLE__ROLE_USER, "vector holder");
	const float v1[] = { 3, 4 }, v2[] = { 0, 2 }, qv[] = { 0, 1 };
	histd_search_query q = {
		.tenant = "t", .mode = HISTD_SEARCH_SEMANTIC, .vector = qv,
		.dim = 2, .model = "m", .k = 5,
	};
	histd_session in = { .tenant = "t", .id = "fork",
			     .created_at_us = histd_now_us() };
	histd_session *out = NULL;
	histd_search_result r = { 0 };
	char buf[128];

	f->d = open_pg(f->dsn);
	create(f->d, "s");
	append(f->d, "s", &m, 1);
	assert_int_equal(histd_driver_embedding_put(f->d, "t", "s", 1, "m", v1, 2), 0);
	/* Stored normalized. */
	assert_string_equal(sql_text(f->dsn, "SELECT embedding::text FROM messages",
				     buf, sizeof(buf)), "{0.6,0.8}");
	assert_int_equal(histd_driver_embedding_put(f->d, "t", "s", 1, "m", v2, 2), 0);
	assert_int_equal(histd_driver_embedding_put(f->d, "t", "nope", 1, "m", v2,
						    2), HISTD_ENOTFOUND);
	assert_int_equal(histd_driver_session_fork(f->d, "t", "s", 0, &in, &out), 0);
	histd_session_free(out);
	assert_int_equal(histd_driver_search(f->d, &q, &r), 0);
	assert_int_equal(r.n, 2);
	assert_string_equal(r.hits[0].session_id, "fork");
	assert_string_equal(r.hits[1].session_id, "s");
	assert_true(fabs(r.hits[0].score - 1.0) < 1e-6);
	histd_search_result_clear(&r);
	/* A vector of another dimension is not compared. */
	q.vector = v1;
	q.dim = 1;
	assert_int_equal(histd_driver_search(f->d, &q, &r), 0);
	assert_int_equal(r.n, 0);
	histd_search_result_clear(&r);
	free(m.data);
}

/* exclude_newest leaves out each session's newest stored message: after a
 * truncate of everything but a system message, that system message. */
static size_t
newest_excluded(histd_driver *d, enum histd_search_mode mode)
{
	const float qv[] = { 1, 0 };
	histd_search_query q = {
		.tenant = "t", .mode = mode, .text = "needle", .vector = qv,
		.dim = 2, .model = "m", .k = 10, .exclude_newest = 1,
	};
	histd_search_result r = { 0 };
	size_t n;

	if (histd_driver_search(d, &q, &r))
		fail_msg("search: %s", histd_error_message());
	n = r.n;
	histd_search_result_clear(&r);
	return n;
}

static void
exclude_newest_after_a_truncate_leaves_out_the_newest_kept_message(void **state)
{
	fixture *f = *state;
	msg m[3] = {
		text_msg(HISTD__V1__ROLE__ROLE_SYSTEM, "needle rules"),
		text_msg(HISTD__V1__ROLE__ROLE_USER, "needle question"),
		text_msg(HISTD__V1__ROLE__ROLE_USER, "needle again"),
	};
	const float v[] = { 1, 0 };
	uint64_t rev, cur;

	f->d = open_pg(f->dsn);
	create(f->d, "s");
	append(f->d, "s", m, 3);
	for (uint64_t seq = 1; seq <= 3; seq++)
		assert_int_equal(histd_driver_embedding_put(f->d, "t", "s", seq, "m",
							    v, 2), 0);
	assert_int_equal(newest_excluded(f->d, HISTD_SEARCH_LEXICAL), 2);
	/* Seq 3 stays: still the newest. */
	assert_int_equal(histd_driver_truncate(f->d, "t", "s", 2, 0, &rev, &cur), 0);
	assert_int_equal(newest_excluded(f->d, HISTD_SEARCH_LEXICAL), 1);
	assert_int_equal(newest_excluded(f->d, HISTD_SEARCH_SEMANTIC), 1);
	/* Only the system message (seq 1) is left: it is the newest. */
	assert_int_equal(histd_driver_truncate(f->d, "t", "s", 3, 0, &rev, &cur), 0);
	assert_int_equal(count(f->d, "needle"), 1);
	assert_int_equal(newest_excluded(f->d, HISTD_SEARCH_LEXICAL), 0);
	assert_int_equal(newest_excluded(f->d, HISTD_SEARCH_SEMANTIC), 0);
	free_msgs(m, 3);
}

/* The plan of a statement, run as a prepared statement with values. */
static char *
plan_of(const char *dsn, const char *stmt_sql, const char *args)
{
	PGconn *c = PQconnectdb(dsn);
	PGresult *r;
	size_t len = 0;
	char *out = calloc(1, 65536), *sql = malloc(strlen(stmt_sql) + 256);

	assert_non_null(out);
	assert_non_null(sql);
	assert_int_equal(PQstatus(c), CONNECTION_OK);
	sprintf(sql, "PREPARE q AS %s", stmt_sql);
	r = PQexec(c, sql);
	assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
	PQclear(r);
	sprintf(sql, "EXPLAIN EXECUTE q(%s)", args);
	r = PQexec(c, sql);
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	for (int i = 0; i < PQntuples(r); i++)
		len += (size_t)snprintf(out + len, 65536 - len, "%s\n",
					PQgetvalue(r, i, 0));
	PQclear(r);
	PQfinish(c);
	free(sql);
	return out;
}

/* A rare word among many messages is found through the GIN index, not by
 * reading the tenant's messages. */
static void
lexical_search_uses_the_gin_index(void **state)
{
	fixture *f = *state;
	char *plan;
	PGresult *r;

	f->d = open_pg(f->dsn);
	create(f->d, "big");
	r = pgh_sql(f->dsn,
		    "INSERT INTO messages (sid, seq, revision, role, author, created_at,"
		    " token_estimate, data, tsv, tsv_len)"
		    " SELECT s.sid, g, g, 2, '', now(), 1, '\\x0a',"
		    " ('filler:1 w' || g || ':1')::tsvector, 2"
		    " FROM sessions s, generate_series(1, 30000) g WHERE s.id = 'big';"
		    "UPDATE sessions SET last_seq = 30000, text_docs = 30000,"
		    " text_len = 60000");
	assert_non_null(r);
	PQclear(r);
	/* VACUUM moves GIN's pending list into the index, as autovacuum
	 * does after a burst of inserts. */
	sql_ok(f->dsn, "VACUUM ANALYZE messages");
	plan = plan_of(f->dsn, pg_stmt_sql[ST_SEARCH_LEXICAL],
		       "'t', '''w77''', '{w77}', 0, NULL, NULL, 0, 0, 0, 10");
	if (!strstr(plan, "messages_tsv") || strstr(plan, "Seq Scan on messages"))
		fail_msg("plan:\n%s", plan);
	free(plan);
	assert_int_equal(count(f->d, "w77"), 1);
}

int
main(void)
{
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(messages_store_their_words_and_sessions_the_sums),
		T(scores_agree_with_the_in_process_index),
		T(messages_stored_before_version_2_are_searchable_after_start),
		T(greek_words_stored_before_version_5_fold_after_start),
		T(what_one_replica_appends_another_finds_at_once),
		T(embeddings_replace_one_another_and_are_copied_by_fork),
		T(lexical_search_uses_the_gin_index),
		T(exclude_newest_after_a_truncate_leaves_out_the_newest_kept_message),
	};

	return cmocka_run_group_tests(tests, group_setup, NULL);
}
