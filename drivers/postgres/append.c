/*
 * Append and replace, with group commit.
 *
 * Concurrent appends share transactions: a request is queued, and a
 * committer thread takes everything queued (up to max_batch requests) as
 * one batch whenever fewer than max_inflight batches run, runs it as one
 * transaction and settles each request. While a batch runs, the next one
 * gathers. An append that gives histd_append.on_result is copied and
 * answered through it by the committer (HISTD_DEFERRED): no server thread
 * waits on PostgreSQL for it. Other callers (replace, the conformance
 * suite, a full queue) wait for their result.
 *
 * A batch that has run PG_STALL_US (waiting on a row lock held elsewhere,
 * say) does not hold back the sessions it does not contain: while every
 * batch in flight is that old and the server itself still answers (a
 * probe by the listener, asked for then), another may start, with the
 * queued requests of the sessions no running batch holds (next_batch).
 * Those of the held sessions stay queued in their order.
 *
 * The fast path: a batch of plain appends (no expected revision, no
 * idempotency key, no tool call ids: nothing to check but the session) is
 * one statement, its own transaction, one round trip (ST_FAST_APPEND: lock
 * the sessions, give each request its seqs and revision in order, insert,
 * update the stats), followed in the same round trip by its notice as a
 * transaction of its own.
 *
 * The checked path, for every other batch, costs two round trips:
 *
 *   1. BEGIN; lock the batch's session rows (FOR UPDATE, in (tenant, id)
 *      order: no deadlock between batches or replicas); read the idempotency
 *      keys and tool calls the batch names.
 *   2. (in C: each request checked in order against the locked state as
 *      the earlier requests of the batch left it; a failing request is
 *      answered alone and leaves no trace) then one multi-row INSERT of
 *      every message (unnest of binary arrays), the tool call index, the
 *      session stats, the idempotency keys, COMMIT, and the notice.
 *
 * Session size limits (max_session_messages, max_session_bytes) are
 * checked against the locked session row: in C on the checked path, in
 * the statement itself on the fast path (ST_FAST_APPEND_LIMITED: no extra
 * round trip), whose refused requests run again on the checked path.
 *
 * So PostgreSQL sees a few statements and one WAL flush per batch instead
 * of per append. Notices are sent after COMMIT, not inside the
 * transaction: PostgreSQL serializes the commits of notifying transactions
 * (its notify lock is held through the WAL flush). (Measurements: README,
 * "PostgreSQL".)
 *
 * A request is acknowledged only after COMMIT returned. If the connection
 * dies after COMMIT was sent, every request of the batch gets EUNAVAILABLE
 * (not acknowledged; it may or may not be applied) and the listener
 * re-reads their sessions. If the batch fails for another reason and held
 * more than one request, each request is run again alone, so one bad
 * request cannot fail its neighbours.
 */
#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "histd_wire.h"
#include "pg.h"

/* Requests per batch, and message bytes per batch. */
#define PG_BATCH_MAX 64
#define PG_BATCH_BYTES (8u << 20)

typedef struct pg_req {
	const histd_append *a;
	int replace;
	/* Results, set by the leader. */
	int rc;
	char err[256];
	histd_append_result res;
	uint64_t cleared_to_seq;
	int done;
	pthread_cond_t cv;      /* its caller waits on it */
	struct pg_req *next;
	/* The committer's working state for this request. */
	int sess;               /* index in the batch's sessions; -1 none */
	int accepted;
	uint64_t key;           /* hash of (tenant, session id): held() */
	/* A deferred append (histd_append.on_result), answered by the
	 * committer and then freed; `a` points to `own`, the request's copy
	 * in the same allocation. NULL for a waiting caller. */
	histd_result_fn on_result;
	void *result_ctx;
	histd_append own;
} pg_req;

/* Deferred requests queued or running at most; past it a caller waits,
 * as before deferral, which bounds the memory a stuck database holds. */
#define PG_DEFER_MAX 4096

/* A batch that has run this long is taken as stalled (waiting on a lock
 * held elsewhere, or on a slow commit): another batch may start beside it
 * with the requests of sessions no running batch holds. A batch's round
 * trip is about a millisecond under load. */
#define PG_STALL_US 100000
/* How often a committer looks for the probe it asked for (pg_watch_probe)
 * to be answered. */
#define PG_PROBE_POLL_US 5000
/* Batches beyond max_inflight while those in flight are stalled, at most;
 * fewer if the pool is small (one connection stays for the reads). */
#define PG_STALL_EXTRA 4

/* A batch in flight: when it started (0: the slot is free) and what it
 * holds. One slot per committer. */
struct pg_running {
	int64_t started_us;
	pg_req **req;
	size_t n;
};

struct pg_group {
	pg_driver *d;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* idle committers wait on it (monotonic) */
	pg_req *head, *tail;
	int inflight;
	int max_inflight;
	int max_extra;          /* more batches beside stalled ones */
	size_t max_batch;
	size_t deferred;        /* deferred requests not yet answered */
	int idle;               /* committers waiting on cv */
	int watching;           /* of which with a timeout (next_batch) */
	int stop;
	pthread_t *threads;
	struct pg_running *running;     /* n_threads slots */
	int n_threads;
};

static void *committer_main(void *arg);

int
pg_group_new(pg_driver *d)
{
	struct pg_group *g = calloc(1, sizeof(*g));
	const char *env = getenv("HISTD_PG_BATCH_MAX");
	pthread_condattr_t ca;
	int n_threads;

	if (!g)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	pthread_mutex_init(&g->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&g->cv, &ca);
	pthread_condattr_destroy(&ca);
	g->max_batch = PG_BATCH_MAX;
	/* Measurement knobs (README, "PostgreSQL"): 1 turns batching off. */
	if (env && atoi(env) >= 1 && atoi(env) <= 1024)
		g->max_batch = (size_t)atoi(env);
	/* Batches in flight at once. One: while it runs, the next batch
	 * gathers everything that arrives, and batches are largest; two
	 * measured slower (smaller batches, more processes on the CPU). The
	 * rest of the pool serves reads and other writes. */
	g->max_inflight = 1;
	env = getenv("HISTD_PG_BATCH_INFLIGHT");
	if (env && atoi(env) >= 1 && atoi(env) <= d->pool_size)
		g->max_inflight = atoi(env);
	g->max_extra = d->pool_size - g->max_inflight - 1;
	if (g->max_extra > PG_STALL_EXTRA)
		g->max_extra = PG_STALL_EXTRA;
	if (g->max_extra < 0)
		g->max_extra = 0;
	g->d = d;
	d->group = g;
	/* One committer more than batches in flight: while one answers its
	 * batch's callers, another starts the next batch. */
	n_threads = g->max_inflight + g->max_extra + 1;
	g->threads = calloc((size_t)n_threads, sizeof(*g->threads));
	g->running = calloc((size_t)n_threads, sizeof(*g->running));
	if (!g->threads || !g->running) {
		pg_group_free(d);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	for (int i = 0; i < n_threads; i++) {
		int err = pthread_create(&g->threads[i], NULL, committer_main, d);

		if (err) {
			pg_group_free(d);
			return histd_error_set(HISTD_EINTERNAL,
					       "cannot start a committer thread: %s",
					       strerror(err));
		}
		g->n_threads++;
	}
	return 0;
}

/* Stops the committers once the queue is empty: what is queued still
 * runs, so every deferred append is answered. */
void
pg_group_free(pg_driver *d)
{
	struct pg_group *g = d->group;

	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	g->stop = 1;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
	for (int i = 0; i < g->n_threads; i++)
		pthread_join(g->threads[i], NULL);
	free(g->threads);
	free(g->running);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
	d->group = NULL;
}

/* ---------------------------------------------------------------------- */
/* A batch's working state                                                 */

typedef struct bsess {
	const char *tenant, *id;
	int found;
	int64_t sid;
	uint64_t revision, last_seq, message_count, token_total, bytes_total,
		 first_seq;
	/* BM25's sums (search.c): messages with main text, their tokens;
	 * messages with any text, their tokens. */
	uint64_t text_docs, text_len, any_docs, any_len;
	int64_t active_at;      /* now_us of its last request written */
	int written;
} bsess;

/* A tool call id known to the batch: from the database or added by an
 * earlier request or message. */
typedef struct tcall {
	int sess;               /* -1: slot unused */
	const char *id;
	int answered;
	int row;                /* index in the calls insert; -1: in the DB */
} tcall;

/* An idempotency key row found in the database, by request. */
typedef struct idem_row {
	int found;
	uint8_t hash[HISTD_HASH_LEN];
	uint64_t first_seq, last_seq, revision;
	int64_t expires_us;
} idem_row;

typedef struct batch {
	pg_req **req;
	size_t n;
	bsess *sess;
	size_t n_sess;
	idem_row *idem;          /* by request */
	/* Tool calls: open addressing on (sess, id). */
	tcall *tc;
	size_t tc_cap;
	/* Undo log of one request's changes to tc: an entry it added
	 * (found again by key: removals move entries) or answered (by slot:
	 * insertions never move entries, and answers are undone first). */
	struct tundo { size_t slot; int added; int sess; const char *id; } *undo;
	size_t n_undo, undo_cap;
	/* Rows of the writes. */
	pg_array m_sid, m_seq, m_rev, m_role, m_author, m_created, m_tokens,
		 m_data, m_tsv, m_tool, m_tl, m_ttl;
	struct bcall { int64_t sid; const char *id; int64_t seq, result; } *calls;
	size_t n_calls, calls_cap;
	pg_array a_sid, a_id, a_seq;
	size_t n_answers;
	pg_array i_sid, i_key, i_hash, i_first, i_last, i_rev, i_exp;
	size_t n_idem;
	pg_buf notices;
	uint64_t origin;
	const pg_driver *d;      /* its limits */
} batch;

static void
arrays_init(batch *b)
{
	pg_arr_init(&b->m_sid, PG_OID_INT8);
	pg_arr_init(&b->m_seq, PG_OID_INT8);
	pg_arr_init(&b->m_rev, PG_OID_INT8);
	pg_arr_init(&b->m_role, PG_OID_INT2);
	pg_arr_init(&b->m_author, PG_OID_TEXT);
	pg_arr_init(&b->m_created, PG_OID_TIMESTAMPTZ);
	pg_arr_init(&b->m_tokens, PG_OID_INT4);
	pg_arr_init(&b->m_data, PG_OID_BYTEA);
	pg_arr_init(&b->m_tsv, PG_OID_TEXT);
	pg_arr_init(&b->m_tool, PG_OID_TEXT);
	pg_arr_init(&b->m_tl, PG_OID_INT4);
	pg_arr_init(&b->m_ttl, PG_OID_INT4);
	pg_arr_init(&b->a_sid, PG_OID_INT8);
	pg_arr_init(&b->a_id, PG_OID_TEXT);
	pg_arr_init(&b->a_seq, PG_OID_INT8);
	pg_arr_init(&b->i_sid, PG_OID_INT8);
	pg_arr_init(&b->i_key, PG_OID_TEXT);
	pg_arr_init(&b->i_hash, PG_OID_BYTEA);
	pg_arr_init(&b->i_first, PG_OID_INT8);
	pg_arr_init(&b->i_last, PG_OID_INT8);
	pg_arr_init(&b->i_rev, PG_OID_INT8);
	pg_arr_init(&b->i_exp, PG_OID_TIMESTAMPTZ);
}

static void
arrays_free(batch *b)
{
	pg_array *all[] = {
		&b->m_sid, &b->m_seq, &b->m_rev, &b->m_role, &b->m_author,
		&b->m_created, &b->m_tokens, &b->m_data, &b->m_tsv, &b->m_tool,
		&b->m_tl, &b->m_ttl, &b->a_sid, &b->a_id,
		&b->a_seq, &b->i_sid, &b->i_key, &b->i_hash, &b->i_first,
		&b->i_last, &b->i_rev, &b->i_exp,
	};

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		pg_arr_free(all[i]);
	b->n_calls = b->n_answers = b->n_idem = 0;
	pg_buf_free(&b->notices);
}

static int
grow(void **p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return 0;
	size_t cap2 = *cap ? *cap * 2 : 16;

	while (cap2 < need)
		cap2 *= 2;
	void *np = realloc(*p, cap2 * size);

	if (!np)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	*p = np;
	*cap = cap2;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Tool call index of the batch                                            */

static size_t
tc_hash(int sess, const char *id)
{
	uint64_t h = 1469598103934665603ull ^ (uint64_t)(unsigned)sess;

	for (const unsigned char *p = (const unsigned char *)id; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return (size_t)h;
}

static tcall *
tc_find(batch *b, int sess, const char *id, size_t *slot)
{
	size_t mask = b->tc_cap - 1;

	for (size_t i = tc_hash(sess, id) & mask;; i = (i + 1) & mask) {
		tcall *t = &b->tc[i];

		if (t->sess < 0) {
			if (slot)
				*slot = i;
			return NULL;
		}
		if (t->sess == sess && strcmp(t->id, id) == 0) {
			if (slot)
				*slot = i;
			return t;
		}
	}
}

/* Room for every ref of the batch, at most half full. */
static int
tc_init(batch *b)
{
	size_t refs = 0, cap = 64;

	for (size_t r = 0; r < b->n; r++) {
		const histd_append *a = b->req[r]->a;

		for (size_t i = 0; i < a->n_msgs; i++)
			refs += a->msgs[i].n_calls + a->msgs[i].n_results;
	}
	while (cap < refs * 2 + 16)
		cap *= 2;
	free(b->tc);
	b->tc = malloc(cap * sizeof(*b->tc));
	if (!b->tc)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	b->tc_cap = cap;
	for (size_t i = 0; i < cap; i++)
		b->tc[i].sess = -1;
	return 0;
}

static int
tc_add(batch *b, int sess, const char *id, int answered, int row, int log)
{
	size_t slot;

	if (tc_find(b, sess, id, &slot))
		return 0;
	b->tc[slot] = (tcall){ .sess = sess, .id = id, .answered = answered,
			       .row = row };
	if (log) {
		if (grow((void **)&b->undo, &b->undo_cap, b->n_undo + 1,
			 sizeof(*b->undo)))
			return HISTD_ENOMEM;
		b->undo[b->n_undo++] = (struct tundo){ slot, 1, sess, id };
	}
	return 0;
}

/* Removing from open addressing: re-insert the rest of the cluster. */
static void
tc_remove(batch *b, size_t slot)
{
	size_t mask = b->tc_cap - 1;

	b->tc[slot].sess = -1;
	for (size_t i = (slot + 1) & mask; b->tc[i].sess >= 0; i = (i + 1) & mask) {
		tcall t = b->tc[i];
		size_t j;

		b->tc[i].sess = -1;
		tc_find(b, t.sess, t.id, &j);
		b->tc[j] = t;
	}
}

/* Undoes a failed request's additions, newest first. Answers are undone
 * before additions are removed (removal moves slots). */
static void
tc_undo(batch *b)
{
	for (size_t k = b->n_undo; k-- > 0;)
		if (!b->undo[k].added)
			b->tc[b->undo[k].slot].answered = 0;
	for (size_t k = b->n_undo; k-- > 0;) {
		size_t slot;

		if (b->undo[k].added &&
		    tc_find(b, b->undo[k].sess, b->undo[k].id, &slot))
			tc_remove(b, slot);
	}
	b->n_undo = 0;
}

/* ---------------------------------------------------------------------- */
/* Checking and applying one request                                       */

static int
check_tools(batch *b, pg_req *rq)
{
	const histd_append *a = rq->a;

	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *m = &a->msgs[i];

		for (size_t j = 0; j < m->n_calls; j++) {
			int dup = tc_find(b, rq->sess, m->calls[j].id, NULL) != NULL;

			/* Twice in this message (added to the index below). */
			for (size_t k = 0; k < j && !dup; k++)
				dup = !strcmp(m->calls[k].id, m->calls[j].id);
			if (dup)
				return histd_error_set(HISTD_EINVALID,
						       "messages[%zu].content[%u].tool_call.id "
						       "is already used in this session",
						       i, m->calls[j].block);
		}
		for (size_t j = 0; j < m->n_results; j++) {
			tcall *t = tc_find(b, rq->sess, m->results[j].id, NULL);

			if (!t || t->answered)
				return histd_error_set(HISTD_EINVALID,
						       "messages[%zu].content[%u].tool_result."
						       "tool_call_id does not answer an open "
						       "tool call", i, m->results[j].block);
			t->answered = 1;
			if (grow((void **)&b->undo, &b->undo_cap, b->n_undo + 1,
				 sizeof(*b->undo)))
				return HISTD_ENOMEM;
			size_t slot;

			tc_find(b, rq->sess, m->results[j].id, &slot);
			b->undo[b->n_undo++] = (struct tundo){ slot, 0, rq->sess, NULL };
		}
		/* A message's calls are answerable from the next message. */
		for (size_t j = 0; j < m->n_calls; j++)
			if (tc_add(b, rq->sess, m->calls[j].id, 0, -1, 1))
				return HISTD_ENOMEM;
	}
	return 0;
}

/* The words of a message (search.c) into the insert's arrays; 0 or
 * ENOMEM. *len_main, *len_tool: its lengths in tokens. */
static int
put_words(pg_array *tsv, pg_array *tool, pg_array *tl, pg_array *ttl,
	  const histd_msg_in *m, int32_t *len_main, int32_t *len_tool)
{
	pg_text t;
	int rc = pg_text_build(&t, m->data, m->len);

	if (rc == 0) {
		pg_arr_bytes(tsv, t.main.p, t.main.len - 1);
		if (t.len_tool)
			pg_arr_bytes(tool, t.tool.p, t.tool.len - 1);
		else
			pg_arr_null(tool);
		pg_arr_i32(tl, t.len_main);
		pg_arr_i32(ttl, t.len_tool);
		*len_main = t.len_main;
		*len_tool = t.len_tool;
	}
	pg_text_free(&t);
	return rc;
}

int
pg_limit_size(const pg_driver *d, uint64_t n, uint64_t bytes)
{
	if (d->max_msgs && n > d->max_msgs)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %" PRIu64 " messages; "
				       "the limit is %" PRIu64, n, d->max_msgs);
	if (d->max_bytes && bytes > d->max_bytes)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %" PRIu64 " bytes; "
				       "the limit is %" PRIu64, bytes, d->max_bytes);
	return 0;
}

/* The session's size limits against what it would hold with the request
 * (a replace: only its messages). */
static int
check_size(const batch *b, const pg_req *rq)
{
	const histd_append *a = rq->a;
	const bsess *s = &b->sess[rq->sess];
	uint64_t n = rq->replace ? 0 : s->message_count;
	uint64_t bytes = rq->replace ? 0 : s->bytes_total;

	if (!b->d->max_msgs && !b->d->max_bytes)
		return 0;
	n += a->n_msgs;
	for (size_t i = 0; i < a->n_msgs; i++)
		bytes += pg_record_len(s->last_seq + 1 + i, a->msgs[i].len);
	return pg_limit_size(b->d, n, bytes);
}

/* Adds the rows of an accepted request. */
static int
apply(batch *b, pg_req *rq)
{
	const histd_append *a = rq->a;
	bsess *s = &b->sess[rq->sess];
	uint64_t seq = s->last_seq;

	s->revision++;
	if (rq->replace) {
		s->message_count = s->token_total = s->bytes_total = 0;
		s->text_docs = s->text_len = s->any_docs = s->any_len = 0;
		s->first_seq = 0;
		rq->cleared_to_seq = s->last_seq;
	}
	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *m = &a->msgs[i];
		pg_msg_cols mc;
		int32_t lm, lt;

		seq++;
		if (put_words(&b->m_tsv, &b->m_tool, &b->m_tl, &b->m_ttl, m, &lm,
			      &lt))
			return HISTD_ENOMEM;
		s->text_docs += lm > 0;
		s->text_len += (uint64_t)lm;
		s->any_docs += lm + lt > 0;
		s->any_len += (uint64_t)lm + (uint64_t)lt;
		pg_msg_scan(m->data, m->len, &mc);
		pg_arr_i64(&b->m_sid, s->sid);
		pg_arr_i64(&b->m_seq, (int64_t)seq);
		pg_arr_i64(&b->m_rev, (int64_t)s->revision);
		pg_arr_i16(&b->m_role, mc.role);
		if (mc.author_len && pg_utf8_ok(mc.author, mc.author_len))
			pg_arr_bytes(&b->m_author, mc.author, mc.author_len);
		else
			pg_arr_bytes(&b->m_author, "", 0);
		if (mc.has_created)
			pg_arr_ts(&b->m_created, mc.created_us);
		else
			pg_arr_null(&b->m_created);
		pg_arr_i32(&b->m_tokens, (int32_t)m->token_estimate);
		pg_arr_bytes(&b->m_data, m->data, m->len);
		s->message_count++;
		s->token_total += m->token_estimate;
		s->bytes_total += pg_record_len(seq, m->len);
		if (!s->first_seq)
			s->first_seq = seq;

		/* Answers first: a result answers an earlier message's call. */
		for (size_t j = 0; j < m->n_results; j++) {
			tcall *t = tc_find(b, rq->sess, m->results[j].id, NULL);

			if (t && t->row >= 0) {
				b->calls[t->row].result = (int64_t)seq;
			} else {
				pg_arr_i64(&b->a_sid, s->sid);
				pg_arr_text(&b->a_id, m->results[j].id);
				pg_arr_i64(&b->a_seq, (int64_t)seq);
				b->n_answers++;
			}
		}
		for (size_t j = 0; j < m->n_calls; j++) {
			tcall *t = tc_find(b, rq->sess, m->calls[j].id, NULL);

			if (grow((void **)&b->calls, &b->calls_cap, b->n_calls + 1,
				 sizeof(*b->calls)))
				return HISTD_ENOMEM;
			b->calls[b->n_calls] = (struct bcall){
				.sid = s->sid, .id = m->calls[j].id,
				.seq = (int64_t)seq, .result = 0,
			};
			if (t)
				t->row = (int)b->n_calls;
			b->n_calls++;
		}
	}
	s->last_seq = seq;
	s->active_at = a->now_us;
	s->written = 1;
	rq->res.first_seq = a->n_msgs ? s->last_seq - a->n_msgs + 1 : 0;
	rq->res.last_seq = a->n_msgs ? s->last_seq : 0;
	rq->res.revision = s->revision;
	rq->accepted = 1;

	if (!rq->replace && a->idempotency_key && *a->idempotency_key) {
		pg_arr_i64(&b->i_sid, s->sid);
		pg_arr_text(&b->i_key, a->idempotency_key);
		pg_arr_bytes(&b->i_hash, a->request_hash, HISTD_HASH_LEN);
		pg_arr_i64(&b->i_first, (int64_t)rq->res.first_seq);
		pg_arr_i64(&b->i_last, (int64_t)rq->res.last_seq);
		pg_arr_i64(&b->i_rev, (int64_t)rq->res.revision);
		pg_arr_ts(&b->i_exp, a->idem_expires_us);
		b->n_idem++;
	}
	pg_notice_line(&b->notices, b->origin, rq->replace ? HISTD_CHANGE_REPLACED
						  : HISTD_CHANGE_APPENDED,
		       s->revision, s->sid);
	return 0;
}

/* An idempotency key this batch already wrote for the session. */
static pg_req *
idem_in_batch(batch *b, size_t upto, int sess, const char *key)
{
	for (size_t r = 0; r < upto; r++) {
		pg_req *o = b->req[r];

		if (o->accepted && !o->replace && o->sess == sess &&
		    o->a->idempotency_key && !strcmp(o->a->idempotency_key, key))
			return o;
	}
	return NULL;
}

static void
fail(pg_req *rq, int rc)
{
	rq->rc = rc;
	snprintf(rq->err, sizeof(rq->err), "%s", histd_error_message());
}

/* Checks request r against the batch's state and applies it, or fails it
 * alone. Returns non-zero only for ENOMEM (the batch cannot go on). */
static int
process(batch *b, size_t r)
{
	pg_req *rq = b->req[r];
	const histd_append *a = rq->a;
	bsess *s;
	int rc;

	if (rq->rc)                      /* failed before the batch ran */
		return 0;
	if (rq->sess < 0 || !b->sess[rq->sess].found) {
		fail(rq, histd_error_set(HISTD_ENOTFOUND, "session not found"));
		return 0;
	}
	s = &b->sess[rq->sess];
	if (!rq->replace && a->idempotency_key && *a->idempotency_key) {
		pg_req *o = idem_in_batch(b, r, rq->sess, a->idempotency_key);
		const idem_row *row = &b->idem[r];

		if (o) {
			if (memcmp(o->a->request_hash, a->request_hash,
				   HISTD_HASH_LEN) != 0) {
				fail(rq, histd_error_set(HISTD_EPRECONDITION,
							 "idempotency_key was used with a "
							 "different request"));
				return 0;
			}
			rq->res = o->res;
			rq->res.replayed = 1;
			return 0;
		}
		if (row->found && row->expires_us > a->now_us) {
			if (memcmp(row->hash, a->request_hash, HISTD_HASH_LEN) != 0) {
				fail(rq, histd_error_set(HISTD_EPRECONDITION,
							 "idempotency_key was used with a "
							 "different request"));
				return 0;
			}
			rq->res = (histd_append_result){
				.first_seq = row->first_seq, .last_seq = row->last_seq,
				.revision = row->revision, .replayed = 1,
			};
			return 0;
		}
	}
	if (a->expected_revision && a->expected_revision != s->revision) {
		rq->res.current_revision = s->revision;
		fail(rq, histd_error_set(HISTD_ECONFLICT,
					 "expected_revision %" PRIu64 " does not match "
					 "the session's revision %" PRIu64,
					 a->expected_revision, s->revision));
		return 0;
	}
	b->n_undo = 0;
	rc = check_tools(b, rq);
	if (rc == 0)
		rc = check_size(b, rq);
	if (rc) {
		tc_undo(b);
		if (rc == HISTD_ENOMEM)
			return rc;
		fail(rq, rc);
		return 0;
	}
	b->n_undo = 0;
	return apply(b, rq);
}

/* ---------------------------------------------------------------------- */
/* The transaction                                                         */

/* Round trip 1: BEGIN, lock, idempotency keys, tool calls. */
static int
read_state(pg_driver *d, pg_conn *c, batch *b, int *retry)
{
	pg_array t1, i1, t2, i2, k2, t3, i3, c3;
	pg_params pl = { 0 }, pi = { 0 }, pt = { 0 };
	size_t *idem_req = NULL, *ref_req = NULL, n_idem = 0, n_refs = 0;
	size_t refs_cap = 0;
	const char **ref_id = NULL;
	PGresult *res[4] = { 0 };
	int rc = 0, replace = b->req[0]->replace;

	pg_arr_init(&t1, PG_OID_TEXT);
	pg_arr_init(&i1, PG_OID_TEXT);
	pg_arr_init(&t2, PG_OID_TEXT);
	pg_arr_init(&i2, PG_OID_TEXT);
	pg_arr_init(&k2, PG_OID_TEXT);
	pg_arr_init(&t3, PG_OID_TEXT);
	pg_arr_init(&i3, PG_OID_TEXT);
	pg_arr_init(&c3, PG_OID_TEXT);
	for (size_t s = 0; s < b->n_sess; s++) {
		pg_arr_text(&t1, b->sess[s].tenant);
		pg_arr_text(&i1, b->sess[s].id);
	}
	idem_req = malloc((b->n + 1) * sizeof(*idem_req));
	if (!idem_req)
		goto oom;
	for (size_t r = 0; r < b->n; r++) {
		const histd_append *a = b->req[r]->a;

		if (b->req[r]->rc || b->req[r]->sess < 0)
			continue;
		if (!replace && a->idempotency_key && *a->idempotency_key) {
			pg_arr_text(&t2, a->tenant);
			pg_arr_text(&i2, a->session_id);
			pg_arr_text(&k2, a->idempotency_key);
			idem_req[n_idem++] = r;
		}
		/* A replace is checked against an empty index. */
		if (replace)
			continue;
		for (size_t i = 0; i < a->n_msgs; i++) {
			const histd_msg_in *m = &a->msgs[i];

			for (size_t j = 0; j < m->n_calls + m->n_results; j++) {
				const char *id = j < m->n_calls ? m->calls[j].id
					: m->results[j - m->n_calls].id;

				if (n_refs == refs_cap) {
					size_t nc = refs_cap ? refs_cap * 2 : 16;
					size_t *p2 = realloc(ref_req, nc * sizeof(*p2));
					const char **p3;

					if (!p2)
						goto oom;
					ref_req = p2;
					p3 = realloc(ref_id, nc * sizeof(*p3));
					if (!p3)
						goto oom;
					ref_id = p3;
					refs_cap = nc;
				}
				ref_req[n_refs] = r;
				ref_id[n_refs] = id;
				n_refs++;
				pg_arr_text(&t3, a->tenant);
				pg_arr_text(&i3, a->session_id);
				pg_arr_text(&c3, id);
			}
		}
	}
	if (pg_arr_finish(&t1) || pg_arr_finish(&i1) || pg_arr_finish(&t2) ||
	    pg_arr_finish(&i2) || pg_arr_finish(&k2) || pg_arr_finish(&t3) ||
	    pg_arr_finish(&i3) || pg_arr_finish(&c3))
		goto oom;
	pg_p_array(&pl, &t1);
	pg_p_array(&pl, &i1);
	pg_p_array(&pi, &t2);
	pg_p_array(&pi, &i2);
	pg_p_array(&pi, &k2);
	pg_p_array(&pt, &t3);
	pg_p_array(&pt, &i3);
	pg_p_array(&pt, &c3);
	{
		const enum pg_stmt st[4] = {
			ST_BEGIN, ST_BATCH_LOCK,
			n_idem ? ST_BATCH_IDEM : ST_COUNT,
			n_refs ? ST_BATCH_TOOLS : ST_COUNT,
		};
		const pg_params *pp[4] = { NULL, &pl, &pi, &pt };

		rc = pg_pipeline(d, c, 4, st, pp, res, retry, 4);
	}
	if (rc)
		goto out;
	for (int i = 0; i < PQntuples(res[1]); i++) {
		int64_t k = pg_r_i64(res[1], i, 0) - 1;
		bsess *s;

		if (k < 0 || (size_t)k >= b->n_sess)
			continue;
		s = &b->sess[k];
		s->found = 1;
		s->sid = pg_r_i64(res[1], i, 1);
		s->revision = (uint64_t)pg_r_i64(res[1], i, 2);
		s->last_seq = (uint64_t)pg_r_i64(res[1], i, 3);
		s->message_count = (uint64_t)pg_r_i64(res[1], i, 4);
		s->token_total = (uint64_t)pg_r_i64(res[1], i, 5);
		s->bytes_total = (uint64_t)pg_r_i64(res[1], i, 6);
		s->first_seq = (uint64_t)pg_r_i64(res[1], i, 7);
		s->text_docs = (uint64_t)pg_r_i64(res[1], i, 8);
		s->text_len = (uint64_t)pg_r_i64(res[1], i, 9);
		s->any_docs = (uint64_t)pg_r_i64(res[1], i, 10);
		s->any_len = (uint64_t)pg_r_i64(res[1], i, 11);
	}
	for (int i = 0; res[2] && i < PQntuples(res[2]); i++) {
		int64_t k = pg_r_i64(res[2], i, 0) - 1;
		idem_row *row;
		size_t len;
		const char *h;

		if (k < 0 || (size_t)k >= n_idem)
			continue;
		row = &b->idem[idem_req[k]];
		h = pg_r_str(res[2], i, 1, &len);
		row->found = 1;
		memset(row->hash, 0, sizeof(row->hash));
		memcpy(row->hash, h, len < HISTD_HASH_LEN ? len : HISTD_HASH_LEN);
		row->first_seq = (uint64_t)pg_r_i64(res[2], i, 2);
		row->last_seq = (uint64_t)pg_r_i64(res[2], i, 3);
		row->revision = (uint64_t)pg_r_i64(res[2], i, 4);
		row->expires_us = pg_r_ts(res[2], i, 5);
	}
	for (int i = 0; res[3] && i < PQntuples(res[3]); i++) {
		int64_t k = pg_r_i64(res[3], i, 0) - 1;

		if (k < 0 || (size_t)k >= n_refs)
			continue;
		if ((rc = tc_add(b, b->req[ref_req[k]]->sess, ref_id[k],
				 pg_r_bool(res[3], i, 1), -1, 0)))
			goto out;
	}
	goto out;
oom:
	rc = histd_error_set(HISTD_ENOMEM, "out of memory");
out:
	for (int i = 0; i < 4; i++)
		PQclear(res[i]);
	pg_arr_free(&t1);
	pg_arr_free(&i1);
	pg_arr_free(&t2);
	pg_arr_free(&i2);
	pg_arr_free(&k2);
	pg_arr_free(&t3);
	pg_arr_free(&i3);
	pg_arr_free(&c3);
	free(idem_req);
	free(ref_req);
	free(ref_id);
	return rc;
}

/* Round trip 2: the writes, COMMIT, the notices. */
static int
write_all(pg_driver *d, pg_conn *c, batch *b, int *retry, int *commit_sent)
{
	pg_array c_sid, c_id, c_seq, c_res, s_sid, s_rev, s_last, s_mc, s_tt,
		 s_bt, s_fs, s_td, s_tl, s_ad, s_al, s_at, notes;
	pg_params pw = { 0 }, pm = { 0 }, pc = { 0 }, pa = { 0 }, ps = { 0 },
		  pi = { 0 }, pn = { 0 };
	PGresult *res[8] = { 0 };
	int rc = 0, replace = b->req[0]->replace, any = 0;
	int64_t replace_sid = 0;
	uint64_t replace_rev = 0;

	pg_arr_init(&c_sid, PG_OID_INT8);
	pg_arr_init(&c_id, PG_OID_TEXT);
	pg_arr_init(&c_seq, PG_OID_INT8);
	pg_arr_init(&c_res, PG_OID_INT8);
	pg_arr_init(&s_sid, PG_OID_INT8);
	pg_arr_init(&s_rev, PG_OID_INT8);
	pg_arr_init(&s_last, PG_OID_INT8);
	pg_arr_init(&s_mc, PG_OID_INT8);
	pg_arr_init(&s_tt, PG_OID_INT8);
	pg_arr_init(&s_bt, PG_OID_INT8);
	pg_arr_init(&s_fs, PG_OID_INT8);
	pg_arr_init(&s_td, PG_OID_INT8);
	pg_arr_init(&s_tl, PG_OID_INT8);
	pg_arr_init(&s_ad, PG_OID_INT8);
	pg_arr_init(&s_al, PG_OID_INT8);
	pg_arr_init(&s_at, PG_OID_TIMESTAMPTZ);
	pg_arr_init(&notes, PG_OID_TEXT);
	for (size_t i = 0; i < b->n_calls; i++) {
		pg_arr_i64(&c_sid, b->calls[i].sid);
		pg_arr_text(&c_id, b->calls[i].id);
		pg_arr_i64(&c_seq, b->calls[i].seq);
		if (b->calls[i].result)
			pg_arr_i64(&c_res, b->calls[i].result);
		else
			pg_arr_null(&c_res);
	}
	for (size_t s = 0; s < b->n_sess; s++) {
		bsess *x = &b->sess[s];

		if (!x->written)
			continue;
		any = 1;
		pg_arr_i64(&s_sid, x->sid);
		pg_arr_i64(&s_rev, (int64_t)x->revision);
		pg_arr_i64(&s_last, (int64_t)x->last_seq);
		pg_arr_i64(&s_mc, (int64_t)x->message_count);
		pg_arr_i64(&s_tt, (int64_t)x->token_total);
		pg_arr_i64(&s_bt, (int64_t)x->bytes_total);
		pg_arr_i64(&s_fs, (int64_t)x->first_seq);
		pg_arr_i64(&s_td, (int64_t)x->text_docs);
		pg_arr_i64(&s_tl, (int64_t)x->text_len);
		pg_arr_i64(&s_ad, (int64_t)x->any_docs);
		pg_arr_i64(&s_al, (int64_t)x->any_len);
		pg_arr_ts(&s_at, x->active_at);
		if (replace) {
			replace_sid = x->sid;
			replace_rev = x->revision;
		}
	}
	/* Notice payloads: whole lines, each payload under the limit. */
	for (size_t off = 0; off < b->notices.len;) {
		size_t end = off, cut = off;

		while (end < b->notices.len && end - off < PG_NOTICE_MAX) {
			if (b->notices.p[end++] == '\n')
				cut = end;
		}
		if (end == b->notices.len)
			cut = end;
		if (cut == off)
			cut = end;
		pg_arr_bytes(&notes, b->notices.p + off, cut - off);
		off = cut;
	}
	if (pg_arr_finish(&b->m_sid) || pg_arr_finish(&b->m_seq) ||
	    pg_arr_finish(&b->m_rev) || pg_arr_finish(&b->m_role) ||
	    pg_arr_finish(&b->m_author) || pg_arr_finish(&b->m_created) ||
	    pg_arr_finish(&b->m_tokens) || pg_arr_finish(&b->m_data) ||
	    pg_arr_finish(&b->m_tsv) || pg_arr_finish(&b->m_tool) ||
	    pg_arr_finish(&b->m_tl) || pg_arr_finish(&b->m_ttl) ||
	    pg_arr_finish(&b->a_sid) || pg_arr_finish(&b->a_id) ||
	    pg_arr_finish(&b->a_seq) || pg_arr_finish(&b->i_sid) ||
	    pg_arr_finish(&b->i_key) || pg_arr_finish(&b->i_hash) ||
	    pg_arr_finish(&b->i_first) || pg_arr_finish(&b->i_last) ||
	    pg_arr_finish(&b->i_rev) || pg_arr_finish(&b->i_exp) ||
	    pg_arr_finish(&c_sid) || pg_arr_finish(&c_id) ||
	    pg_arr_finish(&c_seq) || pg_arr_finish(&c_res) ||
	    pg_arr_finish(&s_sid) || pg_arr_finish(&s_rev) ||
	    pg_arr_finish(&s_last) || pg_arr_finish(&s_mc) ||
	    pg_arr_finish(&s_tt) || pg_arr_finish(&s_bt) ||
	    pg_arr_finish(&s_fs) || pg_arr_finish(&s_td) ||
	    pg_arr_finish(&s_tl) || pg_arr_finish(&s_ad) ||
	    pg_arr_finish(&s_al) || pg_arr_finish(&s_at) ||
	    pg_arr_finish(&notes)) {
		rc = histd_error_set(HISTD_ENOMEM, "out of memory");
		goto out;
	}
	if (replace) {
		pg_p_i64(&pw, replace_sid);
		pg_p_i64(&pw, (int64_t)replace_rev);
	}
	pg_p_array(&pm, &b->m_sid);
	pg_p_array(&pm, &b->m_seq);
	pg_p_array(&pm, &b->m_rev);
	pg_p_array(&pm, &b->m_role);
	pg_p_array(&pm, &b->m_author);
	pg_p_array(&pm, &b->m_created);
	pg_p_array(&pm, &b->m_tokens);
	pg_p_array(&pm, &b->m_data);
	pg_p_array(&pm, &b->m_tsv);
	pg_p_array(&pm, &b->m_tool);
	pg_p_array(&pm, &b->m_tl);
	pg_p_array(&pm, &b->m_ttl);
	pg_p_array(&pc, &c_sid);
	pg_p_array(&pc, &c_id);
	pg_p_array(&pc, &c_seq);
	pg_p_array(&pc, &c_res);
	pg_p_array(&pa, &b->a_sid);
	pg_p_array(&pa, &b->a_id);
	pg_p_array(&pa, &b->a_seq);
	pg_p_array(&ps, &s_sid);
	pg_p_array(&ps, &s_rev);
	pg_p_array(&ps, &s_last);
	pg_p_array(&ps, &s_mc);
	pg_p_array(&ps, &s_tt);
	pg_p_array(&ps, &s_bt);
	pg_p_array(&ps, &s_fs);
	pg_p_array(&ps, &s_td);
	pg_p_array(&ps, &s_tl);
	pg_p_array(&ps, &s_ad);
	pg_p_array(&ps, &s_al);
	pg_p_array(&ps, &s_at);
	pg_p_array(&pi, &b->i_sid);
	pg_p_array(&pi, &b->i_key);
	pg_p_array(&pi, &b->i_hash);
	pg_p_array(&pi, &b->i_first);
	pg_p_array(&pi, &b->i_last);
	pg_p_array(&pi, &b->i_rev);
	pg_p_array(&pi, &b->i_exp);
	pg_p_array(&pn, &notes);
	{
		const enum pg_stmt st[8] = {
			replace && any ? ST_REPLACE_WIPE : ST_COUNT,
			b->m_sid.n ? ST_INSERT_MESSAGES : ST_COUNT,
			b->n_calls ? ST_INSERT_CALLS : ST_COUNT,
			b->n_answers ? ST_ANSWER_CALLS : ST_COUNT,
			any ? ST_UPDATE_STATS : ST_COUNT,
			b->n_idem ? ST_INSERT_IDEM : ST_COUNT,
			ST_COMMIT,
			any ? ST_NOTIFY : ST_COUNT,
		};
		const pg_params *pp[8] = { &pw, &pm, &pc, &pa, &ps, &pi, NULL, &pn };

		/* Nothing written (every request failed or replayed): COMMIT
		 * only ends the transaction and its locks. */
		if (any)
			*commit_sent = 1;
		rc = pg_pipeline(d, c, 8, st, pp, res, retry, 7);
	}
out:
	for (int i = 0; i < 8; i++)
		PQclear(res[i]);
	pg_arr_free(&c_sid);
	pg_arr_free(&c_id);
	pg_arr_free(&c_seq);
	pg_arr_free(&c_res);
	pg_arr_free(&s_sid);
	pg_arr_free(&s_rev);
	pg_arr_free(&s_last);
	pg_arr_free(&s_mc);
	pg_arr_free(&s_tt);
	pg_arr_free(&s_bt);
	pg_arr_free(&s_fs);
	pg_arr_free(&s_td);
	pg_arr_free(&s_tl);
	pg_arr_free(&s_ad);
	pg_arr_free(&s_al);
	pg_arr_free(&s_at);
	pg_arr_free(&notes);
	return rc;
}

/* Resets what an attempt computes, so pg_txn may run the body again. */
static int
batch_reset(batch *b)
{
	arrays_free(b);
	arrays_init(b);
	for (size_t s = 0; s < b->n_sess; s++) {
		const char *t = b->sess[s].tenant, *id = b->sess[s].id;

		b->sess[s] = (bsess){ .tenant = t, .id = id };
	}
	memset(b->idem, 0, b->n * sizeof(*b->idem));
	for (size_t r = 0; r < b->n; r++) {
		pg_req *rq = b->req[r];

		if (rq->rc && rq->sess >= 0)
			rq->rc = 0;     /* decided by the attempt, again */
		rq->accepted = 0;
		memset(&rq->res, 0, sizeof(rq->res));
		rq->cleared_to_seq = 0;
	}
	b->n_undo = 0;
	return tc_init(b);
}

static int
batch_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	batch *b = arg;
	int rc;

	if ((rc = batch_reset(b)) || (rc = read_state(d, c, b, retry)))
		return rc;
	for (size_t r = 0; r < b->n; r++)
		if ((rc = process(b, r)))
			return rc;
	return write_all(d, c, b, retry, commit_sent);
}

/* Sessions of the batch, each once; requests that cannot name a stored
 * session (not UTF-8) fail at once. */
static int
batch_sessions(batch *b)
{
	b->sess = calloc(b->n, sizeof(*b->sess));
	b->idem = calloc(b->n, sizeof(*b->idem));
	if (!b->sess || !b->idem)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (size_t r = 0; r < b->n; r++) {
		pg_req *rq = b->req[r];
		const histd_append *a = rq->a;
		size_t s;

		rq->sess = -1;
		if (!pg_utf8_ok(a->tenant, strlen(a->tenant)) ||
		    !pg_utf8_ok(a->session_id, strlen(a->session_id))) {
			fail(rq, histd_error_set(HISTD_ENOTFOUND, "session not found"));
			continue;
		}
		if (a->idempotency_key && *a->idempotency_key &&
		    !pg_utf8_ok(a->idempotency_key, strlen(a->idempotency_key))) {
			fail(rq, histd_error_set(HISTD_EINVALID,
						 "idempotency_key is not valid UTF-8"));
			continue;
		}
		for (size_t i = 0; i < a->n_msgs && !rq->rc; i++) {
			const histd_msg_in *m = &a->msgs[i];

			for (size_t j = 0; j < m->n_calls && !rq->rc; j++)
				if (!pg_utf8_ok(m->calls[j].id, strlen(m->calls[j].id)))
					fail(rq, histd_error_set(HISTD_EINVALID,
								 "messages[%zu].content[%u]."
								 "tool_call.id is not valid UTF-8",
								 i, m->calls[j].block));
			for (size_t j = 0; j < m->n_results && !rq->rc; j++)
				if (!pg_utf8_ok(m->results[j].id, strlen(m->results[j].id)))
					fail(rq, histd_error_set(HISTD_EINVALID,
								 "messages[%zu].content[%u]."
								 "tool_result.tool_call_id is not "
								 "valid UTF-8", i,
								 m->results[j].block));
		}
		if (rq->rc)
			continue;
		for (s = 0; s < b->n_sess; s++)
			if (!strcmp(b->sess[s].tenant, a->tenant) &&
			    !strcmp(b->sess[s].id, a->session_id))
				break;
		if (s == b->n_sess) {
			b->sess[s] = (bsess){ .tenant = a->tenant, .id = a->session_id };
			b->n_sess++;
		}
		rq->sess = (int)s;
	}
	return 0;
}

static void
batch_free(batch *b)
{
	arrays_free(b);
	free(b->sess);
	free(b->idem);
	free(b->tc);
	free(b->undo);
	free(b->calls);
}

/* Tells the hook, in batch order (revision order per session), with
 * records made from the callers' bytes (they wait for us). */
static void
notify_accepted(pg_driver *d, pg_req **reqs, size_t n, const int64_t *sids)
{
	histd_records recs = { 0 };

	for (size_t r = 0; r < n; r++) {
		pg_req *rq = reqs[r];
		const histd_append *a = rq->a;
		int ok = 1;

		if (!rq->accepted)
			continue;
		for (size_t i = 0; i < a->n_msgs && ok; i++)
			ok = pg_records_add_msg(&recs, rq->res.first_seq + i,
						a->msgs[i].token_estimate,
						a->msgs[i].data, a->msgs[i].len) == 0;
		if (!ok) {
			/* No memory for the copies: the listener re-reads it. */
			histd_records_clear(&recs);
			pg_watch_unknown(d, sids[r], a->tenant, a->session_id);
			continue;
		}
		histd_change ch = {
			.kind = rq->replace ? HISTD_CHANGE_REPLACED : HISTD_CHANGE_APPENDED,
			.tenant = a->tenant, .session_id = a->session_id,
			.revision = rq->res.revision,
			.cleared_to_seq = rq->replace ? rq->cleared_to_seq : 0,
			/* A non-NULL list even when empty: records == NULL
			 * means "read them yourself". */
			.records = recs.n ? recs.v : (const histd_record *)&recs,
			.n_records = recs.n,
		};
		pg_watch_local(d, sids[r], &ch, rq->res.last_seq ? rq->res.last_seq
							    : rq->cleared_to_seq);
		histd_records_clear(&recs);
	}
}

/* ---------------------------------------------------------------------- */
/* The fast path: plain appends in one statement                           */

/* Nothing to check but the session: no expected revision, no idempotency
 * key, no tool call ids. */
static int
plain(const pg_req *rq)
{
	const histd_append *a = rq->a;

	if (rq->replace || a->expected_revision ||
	    (a->idempotency_key && *a->idempotency_key))
		return 0;
	for (size_t i = 0; i < a->n_msgs; i++)
		if (a->msgs[i].n_calls || a->msgs[i].n_results)
			return 0;
	return 1;
}

/* At most this many requests go through the fast path at once: its
 * notice (one line each) must stay under PostgreSQL's 8000 bytes. */
#define FAST_MAX 100

typedef struct fast {
	pg_req **req;
	size_t n;
	int64_t *sid;
	/* By request: refused by a size limit (ST_FAST_APPEND_LIMITED). */
	unsigned char *over;
	uint64_t origin;
	const pg_driver *d;
} fast;

/*
 * The batch's statement, then its notice, as two transactions in one
 * round trip (a Sync after each). The notice must not be part of the
 * batch's transaction: PostgreSQL serializes the commits of notifying
 * transactions, WAL flush included, and batches would queue behind each
 * other. A notice lost because histd died between the two is made up for
 * by the listeners' periodic sweep (watch.c).
 *
 * The statement runs in the implicit transaction of the extended protocol,
 * which PostgreSQL commits when it reaches the Sync: the statement's rows
 * arrive before that commit. Only the first PGRES_PIPELINE_SYNC says the
 * batch committed; a connection lost between the rows and it (a fast
 * shutdown terminates backends there) leaves the outcome unknown, and the
 * batch answers EUNAVAILABLE, never OK.
 */
static int
fast_pipeline(pg_driver *d, pg_conn *c, enum pg_stmt st, const pg_params *p,
	      const pg_params *np, PGresult **out, int *retry)
{
	PGconn *pg = c->pg;
	PGresult *r, *res[2] = { NULL, NULL };
	int64_t deadline = pg_deadline(d);
	int rc = 0, broken = 0, committed = 0, had_rows;

	*retry = 0;
	if (!PQenterPipelineMode(pg) ||
	    !PQsendQueryPrepared(pg, pg_stmt_name[st], p->n, p->values,
				 p->lengths, p->formats, 1) ||
	    !PQpipelineSync(pg) ||
	    !PQsendQueryPrepared(pg, pg_stmt_name[ST_NOTIFY_SESSIONS], np->n,
				 np->values, np->lengths, np->formats, 1) ||
	    !PQpipelineSync(pg)) {
		rc = pg_error(d, pg, NULL, retry);
		PQfinish(c->pg);
		c->pg = NULL;
		return rc;
	}
	for (int i = 0; i < 2 && !broken; i++) {
		r = pg_result(d, pg, deadline);
		if (!r) {
			broken = 1;
			break;
		}
		if (PQresultStatus(r) == PGRES_TUPLES_OK) {
			res[i] = r;
		} else {
			/* The batch's error counts; the notice's does not (the
			 * sweep covers a missing notice). */
			if (i == 0)
				rc = pg_error(d, pg, r, retry);
			PQclear(r);
		}
		while ((r = pg_result(d, pg, deadline)) != NULL)
			PQclear(r);
		r = pg_result(d, pg, deadline);
		if (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC)
			broken = 1;
		else if (i == 0)
			committed = 1;
		PQclear(r);
		if (PQstatus(pg) != CONNECTION_OK)
			broken = 1;
	}
	if (!broken && !PQexitPipelineMode(pg))
		broken = 1;
	PQclear(res[1]);
	if (broken) {
		if (res[0] && rc == 0 && committed) {
			/* Committed and answered; only the notice is lost. */
			pg_notice_lost(d, c);
			*out = res[0];
			return 0;
		}
		had_rows = res[0] != NULL;
		PQclear(res[0]);
		if (rc == 0 && had_rows) {
			/* The rows came, the commit's answer did not: it may
			 * or may not have happened. Not retried (pg_txn:
			 * commit sent, connection lost); the sweep re-reads
			 * in case it did. */
			*retry = 0;
			pg_timed_out(d, pg);
			rc = histd_error_set(HISTD_EUNAVAILABLE,
				"PostgreSQL did not confirm the commit: the "
				"write may not be applied");
			pg_watch_sweep(d);
		} else if (rc == 0) {
			rc = pg_error(d, pg, NULL, retry);
		}
		PQfinish(c->pg);
		c->pg = NULL;
		return rc;
	}
	if (rc) {
		PQclear(res[0]);
		return rc;
	}
	*out = res[0];
	return 0;
}

static int
fast_body(pg_driver *d, pg_conn *c, void *arg, int *retry, int *commit_sent)
{
	fast *f = arg;
	pg_array tenant, id, n, tokens, m_ord, m_k, m_role, m_author, m_created,
		 m_tokens, m_data, m_tsv, m_tool, m_tl, m_ttl, m_len;
	/* In parameter order; m_len ($16) only with a size limit. */
	pg_array *all[] = { &tenant, &id, &n, &tokens, &m_ord, &m_k, &m_role,
			    &m_author, &m_created, &m_tokens, &m_data, &m_tsv,
			    &m_tool, &m_tl, &m_ttl, &m_len };
	const size_t n_all = sizeof(all) / sizeof(all[0]);
	int limited = f->d->max_msgs || f->d->max_bytes;
	pg_params p = { 0 };
	char origin[24];
	PGresult *r = NULL;
	int64_t at = 0;         /* the batch's time: its newest now_us */
	int rc = 0;

	pg_arr_init(&tenant, PG_OID_TEXT);
	pg_arr_init(&id, PG_OID_TEXT);
	pg_arr_init(&n, PG_OID_INT8);
	pg_arr_init(&tokens, PG_OID_INT8);
	pg_arr_init(&m_ord, PG_OID_INT8);
	pg_arr_init(&m_k, PG_OID_INT8);
	pg_arr_init(&m_role, PG_OID_INT2);
	pg_arr_init(&m_author, PG_OID_TEXT);
	pg_arr_init(&m_created, PG_OID_TIMESTAMPTZ);
	pg_arr_init(&m_tokens, PG_OID_INT4);
	pg_arr_init(&m_data, PG_OID_BYTEA);
	pg_arr_init(&m_tsv, PG_OID_TEXT);
	pg_arr_init(&m_tool, PG_OID_TEXT);
	pg_arr_init(&m_tl, PG_OID_INT4);
	pg_arr_init(&m_ttl, PG_OID_INT4);
	pg_arr_init(&m_len, PG_OID_INT4);
	for (size_t r = 0; r < f->n && rc == 0; r++) {
		const histd_append *a = f->req[r]->a;
		int64_t tok = 0;

		if (a->now_us > at)
			at = a->now_us;
		f->req[r]->accepted = 0;
		f->over[r] = 0;
		for (size_t i = 0; i < a->n_msgs; i++) {
			const histd_msg_in *m = &a->msgs[i];
			pg_msg_cols mc;
			int32_t lm, lt;

			if (put_words(&m_tsv, &m_tool, &m_tl, &m_ttl, m, &lm, &lt)) {
				rc = HISTD_ENOMEM;
				break;
			}
			pg_msg_scan(m->data, m->len, &mc);
			pg_arr_i64(&m_ord, (int64_t)r + 1);
			pg_arr_i64(&m_k, (int64_t)i + 1);
			pg_arr_i16(&m_role, mc.role);
			if (mc.author_len && pg_utf8_ok(mc.author, mc.author_len))
				pg_arr_bytes(&m_author, mc.author, mc.author_len);
			else
				pg_arr_bytes(&m_author, "", 0);
			if (mc.has_created)
				pg_arr_ts(&m_created, mc.created_us);
			else
				pg_arr_null(&m_created);
			pg_arr_i32(&m_tokens, (int32_t)m->token_estimate);
			pg_arr_bytes(&m_data, m->data, m->len);
			pg_arr_i32(&m_len, (int32_t)m->len);
			tok += m->token_estimate;
		}
		pg_arr_text(&tenant, a->tenant);
		pg_arr_text(&id, a->session_id);
		pg_arr_i64(&n, (int64_t)a->n_msgs);
		pg_arr_i64(&tokens, tok);
	}
	for (size_t i = 0; i < n_all && rc == 0; i++)
		if (pg_arr_finish(all[i]))
			rc = HISTD_ENOMEM;
	if (rc == 0) {
		pg_params np = { 0 };

		/* m_len, the last, only for the limited statement. */
		for (size_t i = 0; i < (limited ? n_all : n_all - 1); i++)
			pg_p_array(&p, all[i]);
		if (limited) {
			pg_p_i64(&p, (int64_t)f->d->max_msgs);
			pg_p_i64(&p, (int64_t)f->d->max_bytes);
		}
		pg_p_ts(&p, at);        /* the last parameter of both */
		snprintf(origin, sizeof(origin), "%016" PRIx64, f->origin);
		pg_p_array(&np, &tenant);
		pg_p_array(&np, &id);
		pg_p_text(&np, origin);
		/* One statement, its own transaction: once it is sent, a
		 * lost connection leaves the outcome unknown. */
		*commit_sent = 1;
		rc = fast_pipeline(d, c, limited ? ST_FAST_APPEND_LIMITED
					       : ST_FAST_APPEND, &p, &np, &r, retry);
	}
	for (int i = 0; rc == 0 && i < PQntuples(r); i++) {
		int64_t ord = pg_r_i64(r, i, 0) - 1;
		pg_req *rq;

		if (ord < 0 || (size_t)ord >= f->n)
			continue;
		if (limited && !pg_r_bool(r, i, 4)) {
			f->over[ord] = 1;
			continue;
		}
		rq = f->req[ord];
		f->sid[ord] = pg_r_i64(r, i, 1);
		rq->res.first_seq = (uint64_t)pg_r_i64(r, i, 2) + 1;
		rq->res.last_seq = rq->res.first_seq + rq->a->n_msgs - 1;
		rq->res.revision = (uint64_t)pg_r_i64(r, i, 3);
		rq->accepted = 1;
	}
	PQclear(r);
	for (size_t i = 0; i < n_all; i++)
		pg_arr_free(all[i]);
	return rc;
}

static void run_batch(pg_driver *d, pg_req **reqs, size_t n, int may_fast);

/* Runs plain appends through the fast path; 0, or the batch's error
 * (*unknown set if COMMIT may have happened). Requests a size limit
 * refused run again, in order, on the checked path: a later one may fit
 * where an earlier did not, and the first gets its error there. */
static int
run_fast(pg_driver *d, pg_req **reqs, size_t n, int64_t *sids, int *unknown)
{
	unsigned char over[FAST_MAX];
	pg_req *again[FAST_MAX];
	size_t n_again = 0;
	fast f = { .req = reqs, .n = n, .sid = sids, .over = over,
		   .origin = d->origin, .d = d };
	int rc = pg_txn(d, fast_body, &f, unknown);

	if (rc)
		return rc;
	for (size_t r = 0; r < n; r++) {
		if (reqs[r]->accepted)
			continue;
		if (over[r])
			again[n_again++] = reqs[r];
		else
			fail(reqs[r], histd_error_set(HISTD_ENOTFOUND,
						      "session not found"));
	}
	notify_accepted(d, reqs, n, sids);
	if (n_again)
		run_batch(d, again, n_again, 0);
	return 0;
}

static void run_one(pg_driver *d, pg_req *rq);

/* Runs a batch as one transaction and settles every request in it;
 * plain appends on the fast path if may_fast. */
static void
run_batch(pg_driver *d, pg_req **reqs, size_t n, int may_fast)
{
	batch b = { .req = reqs, .n = n, .origin = d->origin, .d = d };
	int unknown = 0, rc;

	int fast_ok = may_fast && n <= FAST_MAX;

	for (size_t r = 0; r < n; r++) {
		reqs[r]->rc = 0;
		reqs[r]->accepted = 0;
		reqs[r]->sess = -1;
		if (fast_ok && (!plain(reqs[r]) ||
				!pg_utf8_ok(reqs[r]->a->tenant, strlen(reqs[r]->a->tenant)) ||
				!pg_utf8_ok(reqs[r]->a->session_id,
					    strlen(reqs[r]->a->session_id))))
			fast_ok = 0;
	}
	if (fast_ok) {
		int64_t sids[FAST_MAX] = { 0 };

		rc = run_fast(d, reqs, n, sids, &unknown);
		if (rc == 0)
			return;
		if (n > 1 && rc != HISTD_EUNAVAILABLE && rc != HISTD_ENOMEM && !unknown) {
			for (size_t r = 0; r < n; r++)
				run_one(d, reqs[r]);
			return;
		}
		if (unknown)
			pg_watch_sweep(d);
		for (size_t r = 0; r < n; r++) {
			reqs[r]->accepted = 0;
			fail(reqs[r], rc);
		}
		return;
	}
	arrays_init(&b);
	rc = batch_sessions(&b);
	if (rc == 0)
		rc = pg_txn(d, batch_body, &b, &unknown);
	if (rc == 0) {
		int64_t sids[1024];

		for (size_t r = 0; r < n; r++)
			sids[r] = reqs[r]->sess >= 0 ? b.sess[reqs[r]->sess].sid : 0;
		notify_accepted(d, reqs, n, sids);
		batch_free(&b);
		return;
	}
	if (n > 1 && rc != HISTD_EUNAVAILABLE && rc != HISTD_ENOMEM && !unknown) {
		/* Something of one request failed the whole batch: find it. */
		batch_free(&b);
		for (size_t r = 0; r < n; r++)
			run_one(d, reqs[r]);
		return;
	}
	for (size_t r = 0; r < n; r++) {
		if (unknown && reqs[r]->accepted)
			pg_watch_unknown(d, b.sess[reqs[r]->sess].sid,
					 reqs[r]->a->tenant, reqs[r]->a->session_id);
		reqs[r]->accepted = 0;
		fail(reqs[r], rc);
		reqs[r]->res.current_revision = 0;
	}
	batch_free(&b);
}

static void
run_one(pg_driver *d, pg_req *rq)
{
	pg_req *one[1] = { rq };

	run_batch(d, one, 1, 1);
}

/* ---------------------------------------------------------------------- */
/* The queue                                                               */

/* The hash of a request's session, for held(). */
static uint64_t
session_key(const histd_append *a)
{
	uint64_t h = 1469598103934665603ull;
	const char *parts[2] = { a->tenant ? a->tenant : "", a->session_id };

	for (int i = 0; i < 2; i++) {
		for (const unsigned char *p = (const unsigned char *)parts[i]; *p; p++)
			h = (h ^ *p) * 1099511628211ull;
		h = (h ^ 0xff) * 1099511628211ull;
	}
	return h;
}

/* Whether a running batch holds rq's session (g->mu held). */
static int
held(const struct pg_group *g, const pg_req *rq)
{
	const histd_append *a = rq->a;

	for (int i = 0; i < g->n_threads; i++) {
		const struct pg_running *run = &g->running[i];

		for (size_t k = 0; k < run->n; k++) {
			const histd_append *b = run->req[k]->a;

			if (run->req[k]->key == rq->key &&
			    !strcmp(a->session_id, b->session_id) &&
			    !strcmp(a->tenant ? a->tenant : "",
				    b->tenant ? b->tenant : ""))
				return 1;
		}
	}
	return 0;
}

/* Whether a queued request's session is held by no running batch (g->mu
 * held). */
static int
any_free(const struct pg_group *g)
{
	for (const pg_req *rq = g->head; rq; rq = rq->next)
		if (!held(g, rq))
			return 1;
	return 0;
}

/* Takes the next batch off the queue (g->mu held): what is queued, up to
 * max_batch requests and PG_BATCH_BYTES of messages; a replace alone.
 * With skip_held, requests of sessions a running batch holds stay queued,
 * in their order. */
static size_t
take(struct pg_group *g, pg_req **batch, size_t max, int skip_held)
{
	size_t n = 0, bytes = 0;
	pg_req **link = &g->head, *kept = NULL;

	while (*link && n < max) {
		pg_req *h = *link;
		size_t sz = 0;

		if (skip_held && held(g, h)) {
			kept = h;
			link = &h->next;
			continue;
		}
		if (n && (h->replace || batch[0]->replace))
			break;
		for (size_t i = 0; i < h->a->n_msgs; i++)
			sz += h->a->msgs[i].len;
		if (n && bytes + sz > PG_BATCH_BYTES)
			break;
		bytes += sz;
		*link = h->next;
		if (g->tail == h)
			g->tail = kept;
		h->next = NULL;
		batch[n++] = h;
	}
	return n;
}

/*
 * Whether another batch may start beside max_inflight or more in flight
 * (g->mu held): when every one of them has run PG_STALL_US and (if
 * `probe`) the listener's probe was answered since the youngest began, up
 * to max_extra more. Else *wake_us (if given) says when to look again, or
 * stays 0 if no more may start in any case.
 */
static int
stalled(const struct pg_group *g, int64_t now, int64_t *wake_us, int probe)
{
	int64_t youngest = 0;

	if (g->inflight < g->max_inflight ||
	    g->inflight >= g->max_inflight + g->max_extra)
		return 0;
	for (int i = 0; i < g->n_threads; i++)
		if (g->running[i].started_us > youngest)
			youngest = g->running[i].started_us;
	if (now - youngest < PG_STALL_US) {
		if (wake_us)
			*wake_us = youngest + PG_STALL_US;
		return 0;
	}
	/* Only while the server itself answers: its probe was answered
	 * since the youngest began. A hung server would keep another batch
	 * waiting too, on its statement or on a connect. If a queued
	 * request could run, the listener probes now, not at its tick. */
	if (probe && atomic_load(&g->d->probed_us) <= youngest) {
		int asked = any_free(g);

		if (asked)
			pg_watch_probe(g->d);
		if (wake_us)
			*wake_us = now + (asked ? PG_PROBE_POLL_US : PG_STALL_US);
		return 0;
	}
	return 1;
}

/*
 * The next batch a committer may start (g->mu held), registered in a free
 * slot of g->running: everything queued while fewer than max_inflight
 * batches run. While those in flight are stalled, the requests of
 * sessions no running batch holds, so one session whose row is locked
 * elsewhere does not hold back the others. 0 if none may start now;
 * *wake_us then says when that changes without a signal (0: only on a
 * signal).
 */
static size_t
next_batch(struct pg_group *g, pg_req **batch, int64_t *wake_us)
{
	int64_t now;
	size_t n = 0;
	struct pg_running *run = g->running;

	*wake_us = 0;
	if (!g->head && !g->inflight)
		return 0;
	now = histd_mono_us();
	if (g->head && g->inflight < g->max_inflight)
		n = take(g, batch, g->max_batch, 0);
	else if (g->head && stalled(g, now, wake_us, 1))
		n = take(g, batch, g->max_batch, 1);
	if (!n) {
		/* A request queued while the batches in flight were young
		 * woke nobody but a watcher (enqueue): while any runs, look
		 * again now and then, in case it stalls. */
		if (!*wake_us && g->inflight)
			*wake_us = now + PG_STALL_US;
		return 0;
	}
	while (run->started_us)         /* a slot per committer: one is free */
		run++;
	*run = (struct pg_running){ now, batch, n };
	g->inflight++;
	return n;
}

/* Queues rq (g->mu held) and wakes an idle committer that may run it. */
static void
enqueue(struct pg_group *g, pg_req *rq)
{
	rq->key = session_key(rq->a);
	if (g->tail)
		g->tail->next = rq;
	else
		g->head = rq;
	g->tail = rq;
	/* Stalled, the woken committer waits for the probe itself. With
	 * batches in flight and no idle committer watching them (all went
	 * idle on an empty queue), one is woken to watch: rq may have to
	 * pass a batch that stalls later. */
	if (g->idle && (g->inflight < g->max_inflight ||
			(g->inflight && !g->watching) ||
			(stalled(g, histd_mono_us(), NULL, 0) && !held(g, rq))))
		pthread_cond_signal(&g->cv);
}

/* Gives a deferred request its answer, then frees it. */
static void
answer(pg_req *rq)
{
	if (rq->rc == 0)
		rq->on_result(rq->result_ctx, 0, &rq->res, "");
	else {
		histd_append_result res = { 0 };

		if (rq->rc == HISTD_ECONFLICT)
			res.current_revision = rq->res.current_revision;
		rq->on_result(rq->result_ctx, rq->rc, &res, rq->err);
	}
	free(rq);
}

/* Waits on g->cv (g->mu held) until signalled or, if wake_us, until then. */
static void
idle_wait(struct pg_group *g, int64_t wake_us)
{
	g->idle++;
	if (wake_us) {
		struct timespec ts = { (time_t)(wake_us / 1000000),
				       (long)(wake_us % 1000000) * 1000 };

		g->watching++;
		pthread_cond_timedwait(&g->cv, &g->mu, &ts);
		g->watching--;
	} else {
		pthread_cond_wait(&g->cv, &g->mu);
	}
	g->idle--;
}

/*
 * A committer thread: runs the next batch whenever one may start
 * (next_batch), then settles it. A waiting caller is woken on its own
 * condition variable; a deferred request is answered here, after the
 * batch is off the books, so another committer can start the next batch
 * meanwhile. At stop, what is queued still runs.
 */
static void *
committer_main(void *arg)
{
	pg_driver *d = arg;
	struct pg_group *g = d->group;
	pg_req *batch[1024], *later[1024];

	pthread_mutex_lock(&g->mu);
	for (;;) {
		size_t n, n_later = 0;
		int64_t wake_us;

		while (!(n = next_batch(g, batch, &wake_us))) {
			if (g->stop && !g->head)
				goto out;
			idle_wait(g, wake_us);
		}
		pthread_mutex_unlock(&g->mu);
		run_batch(d, batch, n, 1);
		pthread_mutex_lock(&g->mu);
		g->inflight--;
		for (int i = 0; i < g->n_threads; i++)
			if (g->running[i].req == batch)
				g->running[i] = (struct pg_running){ 0 };
		for (size_t i = 0; i < n; i++) {
			if (batch[i]->on_result) {
				later[n_later++] = batch[i];
				continue;
			}
			batch[i]->done = 1;
			pthread_cond_signal(&batch[i]->cv);
		}
		if (g->head && g->idle)
			pthread_cond_signal(&g->cv);
		if (!n_later)
			continue;
		g->deferred -= n_later;
		pthread_mutex_unlock(&g->mu);
		for (size_t i = 0; i < n_later; i++)
			answer(later[i]);
		pthread_mutex_lock(&g->mu);
	}
out:
	pthread_mutex_unlock(&g->mu);
	return NULL;
}

/* A waiting caller's request: queued, and waited for. */
static int
submit(pg_driver *d, pg_req *rq)
{
	struct pg_group *g = d->group;

	pthread_cond_init(&rq->cv, NULL);
	pthread_mutex_lock(&g->mu);
	enqueue(g, rq);
	while (!rq->done)
		pthread_cond_wait(&rq->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
	pthread_cond_destroy(&rq->cv);
	if (rq->rc)
		histd_error_set(rq->rc, "%s", rq->err);
	return rq->rc;
}

/* Rounds a size up to pointer alignment. */
#define ALIGNED(n) (((n) + sizeof(void *) - 1) & ~(sizeof(void *) - 1))

static size_t
str_size(const char *s)
{
	return s ? strlen(s) + 1 : 0;
}

static const char *
str_put(char **at, const char *s)
{
	size_t n = str_size(s);
	char *p = *at;

	if (!s)
		return NULL;
	memcpy(p, s, n);
	*at += n;
	return p;
}

/*
 * A deferred request: one allocation holding the request and a copy of
 * everything a->... points to, so the caller's request may go at once.
 * NULL without memory.
 */
static pg_req *
req_copy(const histd_append *a)
{
	size_t n_refs = 0, bytes = 0, head;
	histd_msg_in *msgs;
	histd_tool_ref *refs;
	pg_req *rq;
	char *at;

	bytes += str_size(a->tenant) + str_size(a->session_id) +
		 str_size(a->idempotency_key);
	if (a->request_hash)
		bytes += HISTD_HASH_LEN;
	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *m = &a->msgs[i];

		n_refs += m->n_calls + m->n_results;
		bytes += m->len;
		for (size_t k = 0; k < m->n_calls; k++)
			bytes += str_size(m->calls[k].id);
		for (size_t k = 0; k < m->n_results; k++)
			bytes += str_size(m->results[k].id);
	}
	head = ALIGNED(sizeof(*rq)) + ALIGNED(a->n_msgs * sizeof(*msgs)) +
	       n_refs * sizeof(*refs);
	if (!(rq = calloc(1, head + bytes)))
		return NULL;
	msgs = (histd_msg_in *)(void *)((char *)rq + ALIGNED(sizeof(*rq)));
	refs = (histd_tool_ref *)(void *)((char *)msgs +
					  ALIGNED(a->n_msgs * sizeof(*msgs)));
	at = (char *)rq + head;
	rq->own = *a;
	rq->own.on_durable = NULL;
	rq->own.durable_ctx = NULL;
	rq->own.on_result = NULL;
	rq->own.result_ctx = NULL;
	rq->own.tenant = str_put(&at, a->tenant);
	rq->own.session_id = str_put(&at, a->session_id);
	rq->own.idempotency_key = str_put(&at, a->idempotency_key);
	if (a->request_hash) {
		memcpy(at, a->request_hash, HISTD_HASH_LEN);
		rq->own.request_hash = (const uint8_t *)at;
		at += HISTD_HASH_LEN;
	}
	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *m = &a->msgs[i];

		msgs[i] = *m;
		memcpy(at, m->data, m->len);
		msgs[i].data = (const uint8_t *)at;
		at += m->len;
		msgs[i].calls = refs;
		for (size_t k = 0; k < m->n_calls; k++, refs++) {
			refs->block = m->calls[k].block;
			refs->id = str_put(&at, m->calls[k].id);
		}
		msgs[i].results = refs;
		for (size_t k = 0; k < m->n_results; k++, refs++) {
			refs->block = m->results[k].block;
			refs->id = str_put(&at, m->results[k].id);
		}
	}
	rq->own.msgs = msgs;
	rq->a = &rq->own;
	rq->on_result = a->on_result;
	rq->result_ctx = a->result_ctx;
	return rq;
}

/* Queues a copy of a to be answered through a->on_result: HISTD_DEFERRED,
 * or 0 if the caller should wait instead (the queue holds PG_DEFER_MAX
 * deferred requests already, or no memory for the copy). */
static int
defer(pg_driver *d, const histd_append *a)
{
	struct pg_group *g = d->group;
	pg_req *rq;

	if (!a->on_result || !(rq = req_copy(a)))
		return 0;
	pthread_mutex_lock(&g->mu);
	if (g->deferred >= PG_DEFER_MAX) {
		pthread_mutex_unlock(&g->mu);
		free(rq);
		return 0;
	}
	g->deferred++;
	enqueue(g, rq);
	pthread_mutex_unlock(&g->mu);
	return HISTD_DEFERRED;
}

int
pg_append(histd_driver *drv, const histd_append *a, histd_append_result *res)
{
	pg_req rq = { .a = a };
	int rc = defer((pg_driver *)drv, a);

	if (rc)
		return rc;
	rc = submit((pg_driver *)drv, &rq);
	if (rc == 0)
		*res = rq.res;
	else if (rc == HISTD_ECONFLICT)
		res->current_revision = rq.res.current_revision;
	return rc;
}

int
pg_replace(histd_driver *drv, const histd_append *a, histd_append_result *res,
	   uint64_t *cleared_to_seq)
{
	pg_req rq = { .a = a, .replace = 1 };
	int rc = submit((pg_driver *)drv, &rq);

	if (rc == 0) {
		*res = rq.res;
		*cleared_to_seq = rq.cleared_to_seq;
	} else if (rc == HISTD_ECONFLICT) {
		res->current_revision = rq.res.current_revision;
	}
	return rc;
}
