/*
 * Search and embeddings on PostgreSQL.
 *
 * Lexical: each message row carries its words as two tsvectors (tsv: text,
 * reasoning, tool call name and arguments; tsv_tool: text inside tool
 * results), built here at insert with drivers/index/'s extraction and
 * tokenizer (not PostgreSQL's parser, which splits words differently), and
 * their lengths in tokens. A query is the OR of its distinct tokens as a
 * tsquery, which the GIN indexes answer; the statement (schema.c,
 * ST_SEARCH_LEXICAL) then scores the candidates with the in-process
 * index's BM25: k1 1.2, b 0.75, N, df and the average length over the
 * tenant's stored messages, whatever the scope, so both rank alike. N and
 * the lengths come from per-session sums kept by every write
 * (sessions.text_docs, text_len, any_docs, any_len); df from the
 * tenant's candidates.
 *
 * Semantic: messages.embedding holds the vector normalized to length 1;
 * cosine is a dot product with the normalized query, in SQL, over the
 * scope's messages of the same model and dimension; only a cosine above 0
 * is a hit (float8 sum of float4 products, as drivers/index/ computes it).
 *
 * Removed messages are deleted rows: a search's snapshot never sees them.
 */
#include <endian.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histd_wire.h"
#include "index/index.h"
#include "pg.h"

/* PostgreSQL keeps at most 256 positions per lexeme; a tsvector's words
 * must stay under 1 MB: a message's words past this budget (in literal
 * bytes) are not searchable. */
#define TSV_MAX_POS 256
#define TSV_BUDGET (256u << 10)
/* Distinct query tokens, as drivers/index/ takes them. */
#define QUERY_TERMS_MAX 32
/* Rows per backfill round trip. */
#define BACKFILL_ROWS 500

/* ---------------------------------------------------------------------- */
/* The words of a message                                                  */

typedef struct tok {
	uint32_t off, len;
	uint8_t tool;
} tok;

typedef struct toks {
	pg_buf chars;
	tok *v;
	size_t n, cap;
	int is_tool;
	int oom;
	int32_t len_main, len_tool;
} toks;

static void
tok_add(void *ctx, const char *s, size_t len)
{
	toks *t = ctx;

	if (t->oom)
		return;
	if (t->n == t->cap) {
		size_t nc = t->cap ? t->cap * 2 : 64;
		tok *v = realloc(t->v, nc * sizeof(*v));

		if (!v) {
			t->oom = 1;
			return;
		}
		t->v = v;
		t->cap = nc;
	}
	t->v[t->n++] = (tok){ (uint32_t)t->chars.len, (uint32_t)len,
			      (uint8_t)t->is_tool };
	pg_buf_put(&t->chars, s, len);
	if (t->chars.oom) {
		t->oom = 1;
		return;
	}
	if (t->is_tool) {
		if (t->len_tool < INT32_MAX)
			t->len_tool++;
	} else if (t->len_main < INT32_MAX) {
		t->len_main++;
	}
}

static void
text_add(void *ctx, const char *text, size_t len, int is_tool)
{
	toks *t = ctx;

	t->is_tool = is_tool;
	histd_index_tokens(text, len, tok_add, t);
}

/* Main text first, then tool text; each in byte order. */
static int
tok_cmp(const void *a, const void *b, void *chars)
{
	const tok *x = a, *y = b;
	uint32_t n = x->len < y->len ? x->len : y->len;
	int c;

	if (x->tool != y->tool)
		return (int)x->tool - (int)y->tool;
	c = memcmp((const char *)chars + x->off, (const char *)chars + y->off, n);
	return c ? c : (int)x->len - (int)y->len;
}

/* Appends "'lexeme':1,2,..,tf " to b, unless it would pass the budget. */
static void
put_lexeme(pg_buf *b, const char *s, size_t len, size_t tf)
{
	char num[16];
	size_t need = len * 2 + 4 + (tf < TSV_MAX_POS ? tf : TSV_MAX_POS) * 4;

	if (b->len + need > TSV_BUDGET)
		return;
	pg_buf_put(b, "'", 1);
	/* Tokens hold letters and digits only; escaped all the same, as
	 * the tsvector literal wants. */
	for (size_t i = 0; i < len; i++) {
		if (s[i] == '\'' || s[i] == '\\')
			pg_buf_put(b, "\\", 1);
		pg_buf_put(b, s + i, 1);
	}
	pg_buf_put(b, "':", 2);
	for (size_t i = 1; i <= tf && i <= TSV_MAX_POS; i++) {
		int n = snprintf(num, sizeof(num), i > 1 ? ",%zu" : "%zu", i);

		pg_buf_put(b, num, (size_t)n);
	}
	pg_buf_put(b, " ", 1);
}

int
pg_text_build(pg_text *t, const uint8_t *data, size_t len)
{
	toks k = { 0 };
	uint32_t role;

	memset(t, 0, sizeof(*t));
	/* Bytes that do not parse give the words before the fault, as in
	 * the in-process index. */
	(void)histd_index_message_text(data, len, &role, text_add, &k);
	if (!k.oom && k.n)
		qsort_r(k.v, k.n, sizeof(*k.v), tok_cmp, k.chars.p);
	for (size_t i = 0; !k.oom && i < k.n;) {
		size_t j = i;

		while (j < k.n && tok_cmp(&k.v[i], &k.v[j], k.chars.p) == 0)
			j++;
		put_lexeme(k.v[i].tool ? &t->tool : &t->main,
			   (const char *)k.chars.p + k.v[i].off, k.v[i].len, j - i);
		i = j;
	}
	pg_buf_put(&t->main, "", 1);
	pg_buf_put(&t->tool, "", 1);
	t->len_main = k.len_main;
	t->len_tool = k.len_tool;
	free(k.v);
	pg_buf_free(&k.chars);
	if (k.oom || t->main.oom || t->tool.oom)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	return 0;
}

void
pg_text_free(pg_text *t)
{
	pg_buf_free(&t->main);
	pg_buf_free(&t->tool);
}

/* ---------------------------------------------------------------------- */
/* Search                                                                  */

typedef struct qterms {
	char tok[QUERY_TERMS_MAX][HISTD_INDEX_TOKEN_MAX + 1];
	size_t len[QUERY_TERMS_MAX];
	size_t n;
} qterms;

static void
q_add(void *ctx, const char *tok, size_t len)
{
	qterms *q = ctx;

	if (q->n == QUERY_TERMS_MAX)
		return;
	for (size_t i = 0; i < q->n; i++)
		if (q->len[i] == len && memcmp(q->tok[i], tok, len) == 0)
			return;
	memcpy(q->tok[q->n], tok, len + 1);
	q->len[q->n++] = len;
}

enum { SCOPE_TENANT = 0, SCOPE_IDS = 1, SCOPE_LABELS = 2 };

typedef struct search_arg {
	enum pg_stmt st;
	pg_params p;
	histd_search_result res;
} search_arg;

static double
r_f64(const PGresult *r, int row, int col)
{
	uint64_t bits = (uint64_t)pg_r_i64(r, row, col);
	double v;

	memcpy(&v, &bits, sizeof(v));
	return v;
}

static int
search_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	search_arg *a = arg;
	PGresult *r;
	int rc;

	(void)commit_sent;
	histd_search_result_clear(&a->res);
	if ((rc = pg_exec(d, c, a->st, &a->p, &r, retry)))
		return rc;
	for (int i = 0; i < PQntuples(r) && rc == 0; i++) {
		size_t len;
		const char *data = pg_r_str(r, i, 4, &len);
		uint64_t seq = (uint64_t)pg_r_i64(r, i, 1);
		histd_record *rec = pg_record_msg(seq, (uint32_t)pg_r_i32(r, i, 3),
						  data, len);

		if (!rec) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			break;
		}
		rc = histd_search_result_add(&a->res, pg_r_str(r, i, 0, NULL),
					     r_f64(r, i, 2), seq, rec->token_estimate,
					     rec->data, rec->len);
		histd_record_free(rec);
	}
	PQclear(r);
	return rc;
}

int
pg_search(histd_driver *drv, const histd_search_query *q,
	  histd_search_result *out)
{
	pg_driver *d = (pg_driver *)drv;
	search_arg a = { 0 };
	pg_array ids, terms, vec;
	pg_buf tsq = { 0 };
	char *labels = NULL;
	float *qn = NULL;
	qterms *qt = NULL;
	int scope = SCOPE_TENANT, rc = 0, empty = 0;

	pg_arr_init(&ids, PG_OID_TEXT);
	pg_arr_init(&terms, PG_OID_TEXT);
	pg_arr_init(&vec, PG_OID_FLOAT4);
	if (q->mode == HISTD_SEARCH_LEXICAL) {
		if (!(qt = malloc(sizeof(*qt)))) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
		qt->n = 0;
		histd_index_tokens(q->text, strlen(q->text), q_add, qt);
		if (!qt->n) {
			rc = histd_error_set(HISTD_EINVALID,
					     "query has no word to search for");
			goto out;
		}
	} else {
		if (!(qn = malloc(q->dim * sizeof(*qn)))) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
		memcpy(qn, q->vector, q->dim * sizeof(*qn));
		if (histd_vec_normalize(qn, q->dim)) {
			rc = histd_error_set(HISTD_EINVALID, "the query vector is zero");
			goto out;
		}
		/* A model name PostgreSQL could not store matches nothing. */
		empty = !pg_utf8_ok(q->model, strlen(q->model));
	}
	/* Names that are not UTF-8 cannot be stored: they match nothing. */
	empty |= !pg_utf8_ok(q->tenant, strlen(q->tenant));
	if (q->n_session_ids) {
		scope = SCOPE_IDS;
		for (size_t i = 0; i < q->n_session_ids; i++)
			if (pg_utf8_ok(q->session_ids[i], strlen(q->session_ids[i])))
				pg_arr_text(&ids, q->session_ids[i]);
		empty |= ids.n == 0;
	} else if (q->n_labels) {
		scope = SCOPE_LABELS;
		if (pg_kv_json(q->labels, q->n_labels, 0, "label_selector", &labels))
			empty = 1;
	}
	if (empty)
		goto out;

	pg_p_text(&a.p, q->tenant);
	if (q->mode == HISTD_SEARCH_LEXICAL) {
		for (size_t i = 0; i < qt->n; i++) {
			/* Tokens hold no quote or backslash (letters and
			 * digits only). */
			if (i)
				pg_buf_put(&tsq, " | ", 3);
			pg_buf_put(&tsq, "'", 1);
			pg_buf_put(&tsq, qt->tok[i], qt->len[i]);
			pg_buf_put(&tsq, "'", 1);
			pg_arr_bytes(&terms, qt->tok[i], qt->len[i]);
		}
		pg_buf_put(&tsq, "", 1);
		if (tsq.oom || pg_arr_finish(&terms)) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
		pg_p_text(&a.p, (const char *)tsq.p);
		pg_p_array(&a.p, &terms);
		a.st = ST_SEARCH_LEXICAL;
	} else {
		for (uint32_t i = 0; i < q->dim; i++)
			pg_arr_f32(&vec, qn[i]);
		if (pg_arr_finish(&vec)) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
		pg_p_array(&a.p, &vec);
		pg_p_text(&a.p, q->model);
		a.st = ST_SEARCH_SEMANTIC;
	}
	if (pg_arr_finish(&ids)) {
		rc = histd_error_set(HISTD_ENOMEM, "out of memory");
		goto out;
	}
	pg_p_i32(&a.p, scope);
	if (scope == SCOPE_IDS)
		pg_p_array(&a.p, &ids);
	else
		pg_p_null(&a.p);
	pg_p_text(&a.p, labels);
	pg_p_i64(&a.p, (int64_t)q->roles);
	pg_p_i32(&a.p, q->mode == HISTD_SEARCH_LEXICAL ? !!q->include_tool_results
						       : (int32_t)q->dim);
	pg_p_i32(&a.p, !!q->exclude_newest);
	pg_p_i64(&a.p, (int64_t)q->k);
	rc = pg_txn(d, search_body, &a, NULL);
out:
	if (rc == 0)
		*out = a.res;
	else
		histd_search_result_clear(&a.res);
	pg_arr_free(&ids);
	pg_arr_free(&terms);
	pg_arr_free(&vec);
	pg_buf_free(&tsq);
	free(labels);
	free(qn);
	free(qt);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Embeddings                                                              */

typedef struct emb_arg {
	pg_params p;
	int found_session, found_message, found_life;
} emb_arg;

static int
emb_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	emb_arg *a = arg;
	PGresult *r;
	int rc;

	/* One statement, idempotent: running it again is harmless. */
	(void)commit_sent;
	if ((rc = pg_exec(d, c, ST_EMBEDDING_PUT, &a->p, &r, retry)))
		return rc;
	a->found_session = pg_r_i64(r, 0, 0) > 0;
	a->found_message = pg_r_i64(r, 0, 1) > 0;
	a->found_life = pg_r_i64(r, 0, 2) > 0;
	PQclear(r);
	return 0;
}

int
pg_embedding_put_life(histd_driver *drv, const char *tenant, const char *id,
		      uint64_t incarnation, uint64_t seq, const char *model,
		      const float *v, uint32_t dim)
{
	emb_arg a = { 0 };
	pg_array vec;
	float *vn;
	int rc;

	if (!pg_utf8_ok(tenant, strlen(tenant)) || !pg_utf8_ok(id, strlen(id)))
		return histd_error_set(HISTD_ENOTFOUND, "session not found");
	if (!pg_utf8_ok(model, strlen(model)))
		return histd_error_set(HISTD_EINVALID,
				       "embedding model is not valid UTF-8");
	if (seq > INT64_MAX)
		return histd_error_set(HISTD_ENOTFOUND,
				       "no stored message has seq %llu",
				       (unsigned long long)seq);
	/* The life is a sid: one beyond them is no session's. */
	if (incarnation > INT64_MAX)
		return histd_error_set(HISTD_ENOTFOUND, "session not found "
				       "(it was deleted and created again)");
	if (!(vn = malloc((size_t)dim * sizeof(*vn))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	memcpy(vn, v, (size_t)dim * sizeof(*vn));
	if (histd_vec_normalize(vn, dim)) {
		free(vn);
		return histd_error_set(HISTD_EINVALID, "the embedding is a zero vector");
	}
	pg_arr_init(&vec, PG_OID_FLOAT4);
	for (uint32_t i = 0; i < dim; i++)
		pg_arr_f32(&vec, vn[i]);
	free(vn);
	if (pg_arr_finish(&vec)) {
		pg_arr_free(&vec);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	pg_p_text(&a.p, tenant);
	pg_p_text(&a.p, id);
	pg_p_i64(&a.p, (int64_t)seq);
	pg_p_array(&a.p, &vec);
	pg_p_text(&a.p, model);
	pg_p_i64(&a.p, (int64_t)incarnation);
	rc = pg_txn((pg_driver *)drv, emb_body, &a, NULL);
	pg_arr_free(&vec);
	if (rc)
		return rc;
	if (!a.found_session)
		return histd_error_set(HISTD_ENOTFOUND, "session not found");
	if (!a.found_life)
		return histd_error_set(HISTD_ENOTFOUND, "session not found "
				       "(it was deleted and created again)");
	if (!a.found_message)
		return histd_error_set(HISTD_ENOTFOUND,
				       "no stored message has seq %llu",
				       (unsigned long long)seq);
	return 0;
}

int
pg_embedding_put(histd_driver *drv, const char *tenant, const char *id,
		 uint64_t seq, const char *model, const float *v, uint32_t dim)
{
	return pg_embedding_put_life(drv, tenant, id, 0, seq, model, v, dim);
}

/* ---------------------------------------------------------------------- */
/* Backfill                                                                */

static int
exec_params(pg_driver *d, PGconn *pg, const char *sql, const pg_params *p,
	    PGresult **out)
{
	PGresult *r = PQexecParams(pg, sql, p ? p->n : 0, NULL,
				   p ? p->values : NULL, p ? p->lengths : NULL,
				   p ? p->formats : NULL, 1);
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

/* One batch of a session's rows without words; *n_done: how many. */
static int
backfill_rows(pg_driver *d, PGconn *pg, int64_t sid, int *n_done)
{
	pg_params p = { 0 }, u = { 0 };
	pg_array seq, tsv, tool, len, tool_len;
	PGresult *r = NULL;
	int rc = 0, n;

	pg_p_i64(&p, sid);
	pg_p_i32(&p, BACKFILL_ROWS);
	if ((rc = exec_params(d, pg, "SELECT seq, data FROM messages"
			      " WHERE sid = $1::int8 AND tsv IS NULL"
			      " ORDER BY seq LIMIT $2::int4", &p, &r)))
		return rc;
	n = PQntuples(r);
	*n_done = n;
	if (n == 0) {
		PQclear(r);
		return 0;
	}
	pg_arr_init(&seq, PG_OID_INT8);
	pg_arr_init(&tsv, PG_OID_TEXT);
	pg_arr_init(&tool, PG_OID_TEXT);
	pg_arr_init(&len, PG_OID_INT4);
	pg_arr_init(&tool_len, PG_OID_INT4);
	for (int i = 0; i < n && rc == 0; i++) {
		size_t dl;
		const char *data = pg_r_str(r, i, 1, &dl);
		pg_text t;

		if ((rc = pg_text_build(&t, (const uint8_t *)data, dl)) == 0) {
			pg_arr_i64(&seq, pg_r_i64(r, i, 0));
			pg_arr_bytes(&tsv, t.main.p, t.main.len - 1);
			if (t.len_tool)
				pg_arr_bytes(&tool, t.tool.p, t.tool.len - 1);
			else
				pg_arr_null(&tool);
			pg_arr_i32(&len, t.len_main);
			pg_arr_i32(&tool_len, t.len_tool);
		}
		pg_text_free(&t);
	}
	PQclear(r);
	if (rc == 0 && (pg_arr_finish(&seq) || pg_arr_finish(&tsv) ||
			pg_arr_finish(&tool) || pg_arr_finish(&len) ||
			pg_arr_finish(&tool_len)))
		rc = HISTD_ENOMEM;
	if (rc == 0) {
		pg_p_i64(&u, sid);
		pg_p_array(&u, &seq);
		pg_p_array(&u, &tsv);
		pg_p_array(&u, &tool);
		pg_p_array(&u, &len);
		pg_p_array(&u, &tool_len);
		rc = exec_params(d, pg, "UPDATE messages AS m SET"
				 " tsv = v.tsv::tsvector, tsv_tool = v.tool::tsvector,"
				 " tsv_len = v.len, tsv_tool_len = v.tool_len"
				 " FROM unnest($2::int8[], $3::text[], $4::text[],"
				 " $5::int4[], $6::int4[]) AS v(seq, tsv, tool, len,"
				 " tool_len)"
				 " WHERE m.sid = $1::int8 AND m.seq = v.seq", &u, NULL);
	}
	pg_arr_free(&seq);
	pg_arr_free(&tsv);
	pg_arr_free(&tool);
	pg_arr_free(&len);
	pg_arr_free(&tool_len);
	return rc;
}

/* A session's rows, then its sums, in one transaction with the session
 * row locked: appends of other replicas wait, and the sums read after the
 * lock count every committed message. */
static int
backfill_session(pg_driver *d, PGconn *pg, int64_t sid)
{
	pg_params p = { 0 };
	int rc, n = 0;

	pg_p_i64(&p, sid);
	if ((rc = exec_params(d, pg, "BEGIN", NULL, NULL)) ||
	    (rc = exec_params(d, pg, "SELECT 1 FROM sessions WHERE sid = $1::int8"
			      " FOR UPDATE", &p, NULL)))
		goto fail;
	do {
		if ((rc = backfill_rows(d, pg, sid, &n)))
			goto fail;
	} while (n == BACKFILL_ROWS);
	if ((rc = exec_params(d, pg, "UPDATE sessions AS s SET"
			      " text_docs = x.td, text_len = x.tl, any_docs = x.ad,"
			      " any_len = x.al"
			      " FROM (SELECT count(*) FILTER (WHERE tsv_len > 0) AS td,"
			      " coalesce(sum(tsv_len), 0) AS tl,"
			      " count(*) FILTER (WHERE tsv_len + tsv_tool_len > 0) AS ad,"
			      " coalesce(sum(tsv_len + tsv_tool_len), 0) AS al"
			      " FROM messages WHERE sid = $1::int8) x"
			      " WHERE s.sid = $1::int8", &p, NULL)) ||
	    (rc = exec_params(d, pg, "COMMIT", NULL, NULL)))
		goto fail;
	return 0;
fail:
	PQclear(PQexec(pg, "ROLLBACK"));
	return rc;
}

int
pg_backfill(pg_driver *d, PGconn *pg)
{
	for (;;) {
		PGresult *r;
		int rc, n;

		/* The partial index messages_unindexed holds exactly these
		 * rows: cheap when there are none. */
		if ((rc = exec_params(d, pg, "SELECT DISTINCT sid FROM messages"
				      " WHERE tsv IS NULL LIMIT 100", NULL, &r)))
			return rc;
		n = PQntuples(r);
		for (int i = 0; i < n && rc == 0; i++)
			rc = backfill_session(d, pg, pg_r_i64(r, i, 0));
		PQclear(r);
		if (rc) {
			char msg[256];

			snprintf(msg, sizeof(msg), "%s", histd_error_message());
			return histd_error_set(rc, "filling the search columns of "
					       "stored messages failed: %s", msg);
		}
		if (n == 0)
			return 0;
	}
}
