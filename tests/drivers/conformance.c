/*
 * The driver conformance suite (see conformance.h).
 *
 * Every test checks one promise of drivers/driver.h, only through the
 * histd_driver_* wrappers. Messages are real packed Histd__V1__Message
 * bytes, as the server would send them; stored records are checked by
 * unpacking them (the seq must be in the bytes) and packing them back.
 *
 * Worker threads never call cmocka's asserts (they longjmp on the test's
 * thread only): they record what they saw, and the test checks it after
 * joining them.
 */
#include "conformance.h"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"

#define TA "tenant-a"
#define TB "tenant-b"
/* created_at_us of test sessions, and the clock of idempotency keys. */
#define T0 INT64_C(1700000000000000)

#define USER HISTD__V1__ROLE__ROLE_USER
#define ASSISTANT HISTD__V1__ROLE__ROLE_ASSISTANT
#define SYSTEM HISTD__V1__ROLE__ROLE_SYSTEM

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
/* A list of tool call ids and its length, for tmsg_calls/tmsg_results. */
#define IDS(...) ((const char *const[]){__VA_ARGS__}), \
	N_OF(((const char *const[]){__VA_ARGS__}))

#define expect_ok(call) do { \
	int rc_ = (call); \
	if (rc_ != 0) \
		fail_msg("%s: %s: %s", #call, histd_error_name(rc_), \
			 histd_error_message()); \
} while (0)

/* The code, and an error message set (the contract asks for both). */
#define expect_err(code, call) do { \
	int rc_; \
	histd_error_clear(); \
	rc_ = (call); \
	if (rc_ != (code)) \
		fail_msg("%s: got %s (%s), want %s", #call, \
			 histd_error_name(rc_), histd_error_message(), \
			 histd_error_name(code)); \
	if (histd_error_message()[0] == '\0') \
		fail_msg("%s: %s without an error message", #call, \
			 histd_error_name(rc_)); \
} while (0)

#define expect_eq(got, want, what) do { \
	unsigned long long g_ = (got), w_ = (want); \
	if (g_ != w_) \
		fail_msg("%s: got %llu, want %llu", (what), g_, w_); \
} while (0)

/* Out-parameters preset to these must still hold them after an error. */
static char sentinel_byte;
#define SENTINEL_SESSION ((histd_session *)(void *)&sentinel_byte)
#define SENTINEL_RECORD ((histd_record *)(void *)&sentinel_byte)
#define SENTINEL_U64 UINT64_C(0x5e5e5e5e5e5e5e5e)

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		abort();
	return p;
}

static char *xstrdup(const char *s)
{
	char *p = strdup(s);

	if (!p)
		abort();
	return p;
}

/* ---------------------------------------------------------------------- */
/* What the notify hook saw                                                */

typedef struct change_copy {
	enum histd_change_kind kind;
	char *tenant;
	char *session_id;
	uint64_t revision;
	uint64_t cleared_to_seq;
	int system_kept;
	int has_records;            /* records were not NULL */
	histd_records records;
	histd_session *session;     /* NULL if none was given */
	uint64_t incarnation;
} change_copy;

typedef struct change_log {
	pthread_mutex_t mu;
	change_copy *v;
	size_t n;
	size_t cap;
} change_log;

/* The hook copies what it is lent. It runs on the writer's thread, maybe
 * under the driver's locks: it takes only its own short mutex, and aborts
 * rather than report running out of memory. */
static void change_log_hook(void *ctx, const histd_change *c)
{
	change_log *log = ctx;
	change_copy cc;
	size_t i;

	memset(&cc, 0, sizeof(cc));
	cc.kind = c->kind;
	cc.tenant = xstrdup(c->tenant ? c->tenant : "");
	cc.session_id = xstrdup(c->session_id ? c->session_id : "");
	cc.revision = c->revision;
	cc.cleared_to_seq = c->cleared_to_seq;
	cc.system_kept = c->system_kept;
	cc.incarnation = c->incarnation;
	if (c->records) {
		cc.has_records = 1;
		for (i = 0; i < c->n_records; i++)
			if (histd_records_add(&cc.records, c->records[i].seq,
					      c->records[i].token_estimate,
					      c->records[i].data,
					      c->records[i].len))
				abort();
	}
	if (c->session && !(cc.session = histd_session_dup(c->session)))
		abort();

	pthread_mutex_lock(&log->mu);
	if (log->n == log->cap) {
		size_t cap = log->cap ? 2 * log->cap : 64;
		change_copy *v = realloc(log->v, cap * sizeof(*v));

		if (!v)
			abort();
		log->v = v;
		log->cap = cap;
	}
	log->v[log->n++] = cc;
	pthread_mutex_unlock(&log->mu);
}

static void change_log_free(change_log *log)
{
	size_t i;

	for (i = 0; i < log->n; i++) {
		free(log->v[i].tenant);
		free(log->v[i].session_id);
		histd_records_clear(&log->v[i].records);
		histd_session_free(log->v[i].session);
	}
	free(log->v);
	pthread_mutex_destroy(&log->mu);
}

/* ---------------------------------------------------------------------- */
/* One test's world: a driver on a fresh store                             */

typedef struct ctest {
	const histd_conformance_fixture *fx;
	histd_driver_config cfg;
	void *store;
	histd_driver *d;
	change_log log;
} ctest;

static int conf_setup(void **state)
{
	const histd_conformance_fixture *fx = *state;
	ctest *t = calloc(1, sizeof(*t));
	int rc;

	if (!t)
		return -1;
	t->fx = fx;
	pthread_mutex_init(&t->log.mu, NULL);
	rc = fx->store_new(fx->ctx, &t->cfg, &t->store);
	if (rc) {
		print_error("fresh %s store: %s: %s\n", fx->driver,
			    histd_error_name(rc), histd_error_message());
		pthread_mutex_destroy(&t->log.mu);
		free(t);
		return -1;
	}
	rc = histd_driver_open(fx->driver, &t->cfg, &t->d);
	if (rc) {
		print_error("opening driver %s: %s: %s\n", fx->driver,
			    histd_error_name(rc), histd_error_message());
		if (fx->store_free)
			fx->store_free(fx->ctx, t->store);
		pthread_mutex_destroy(&t->log.mu);
		free(t);
		return -1;
	}
	/* Before any write: changes made before it are not reported. */
	histd_driver_set_notify(t->d, change_log_hook, &t->log);
	*state = t;
	return 0;
}

static int conf_teardown(void **state)
{
	ctest *t = *state;

	histd_driver_close(t->d);
	if (t->fx->store_free)
		t->fx->store_free(t->fx->ctx, t->store);
	change_log_free(&t->log);
	free(t);
	return 0;
}

/* How long a test waits for changes a driver reports from another thread. */
#define CHANGE_WAIT_US (10 * 1000 * 1000)

static int changes_seen(ctest *t, const char *tenant, const char *id,
			size_t min_n, uint64_t min_revision)
{
	size_t i, n = 0;
	int rev_seen = min_revision == 0;

	for (i = 0; i < t->log.n; i++) {
		if (strcmp(t->log.v[i].tenant, tenant) != 0 ||
		    strcmp(t->log.v[i].session_id, id) != 0)
			continue;
		n++;
		if (t->log.v[i].revision >= min_revision)
			rev_seen = 1;
	}
	return n >= min_n && rev_seen;
}

/*
 * The changes of one session in the order the hook saw them, once it has
 * seen at least min_n of them and one at min_revision or later (0: any).
 * The header promises APPENDED before append returns, but a driver may
 * report other changes from its own thread a little later, so this waits
 * (up to CHANGE_WAIT_US). To show that a failed write reported nothing,
 * tests make a successful write after it and wait for that one: changes
 * come in revision order, so anything reported for the failure would come
 * first. *out is a malloc'ed array of pointers into the log, valid while
 * nothing writes.
 */
static size_t changes_wait(ctest *t, const char *tenant, const char *id,
			   size_t min_n, uint64_t min_revision,
			   const change_copy ***out)
{
	const change_copy **v;
	int64_t waited = 0;
	size_t i, n = 0;

	pthread_mutex_lock(&t->log.mu);
	while (!changes_seen(t, tenant, id, min_n, min_revision) &&
	       waited < CHANGE_WAIT_US) {
		pthread_mutex_unlock(&t->log.mu);
		nanosleep(&(struct timespec){ .tv_nsec = 1000 * 1000 }, NULL);
		waited += 1000;
		pthread_mutex_lock(&t->log.mu);
	}
	v = xmalloc(t->log.n * sizeof(*v));
	for (i = 0; i < t->log.n; i++)
		if (strcmp(t->log.v[i].tenant, tenant) == 0 &&
		    strcmp(t->log.v[i].session_id, id) == 0)
			v[n++] = &t->log.v[i];
	pthread_mutex_unlock(&t->log.mu);
	*out = v;
	return n;
}

/* The revisions of the session's changes are exactly from, from + 1, ..,
 * to, all reported by the time the one at `to` is. */
static void expect_change_revisions(ctest *t, const char *tenant,
				    const char *id, uint64_t from, uint64_t to)
{
	const change_copy **c;
	size_t i, n;

	n = changes_wait(t, tenant, id, 0, to, &c);
	for (i = 0; i < n; i++)
		if (c[i]->revision != from + i) {
			unsigned long long got = c[i]->revision;

			free(c);
			fail_msg("change #%zu of %s: revision %llu, want %llu",
				 i, id, got, (unsigned long long)(from + i));
		}
	free(c);
	expect_eq(n, to - from + 1, "changes notified");
}

/* ---------------------------------------------------------------------- */
/* Messages as the server sends them                                       */

#define TMSG_MAX_REFS 4

/* A packed Message (seq 0) with the token estimate and tool refs the server
 * would pass beside it. Owns its bytes and ids (tmsg_free). */
typedef struct tmsg {
	uint8_t *data;
	size_t len;
	uint32_t tokens;
	histd_tool_ref calls[TMSG_MAX_REFS];
	size_t n_calls;
	histd_tool_ref results[TMSG_MAX_REFS];
	size_t n_results;
} tmsg;

static void tmsg_pack(tmsg *m, const Histd__V1__Message *msg, uint32_t tokens)
{
	m->len = histd__v1__message__get_packed_size(msg);
	m->data = xmalloc(m->len);
	histd__v1__message__pack(msg, m->data);
	m->tokens = tokens;
}

/* A message of one text block. */
static void tmsg_text(tmsg *m, Histd__V1__Role role, const char *text)
{
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock cb = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &cb };
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;

	memset(m, 0, sizeof(*m));
	tb.text = (char *)text;
	cb.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	cb.text = &tb;
	msg.role = role;
	msg.author = "conformance";
	msg.n_content = 1;
	msg.content = blocks;
	tmsg_pack(m, &msg, 3 + (uint32_t)strlen(text) / 4);
}

/* An assistant message: a text block, then a tool_call block per id. */
static void tmsg_calls(tmsg *m, const char *text, const char *const *ids,
		       size_t n)
{
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ToolCallBlock calls[TMSG_MAX_REFS];
	Histd__V1__ContentBlock blocks[1 + TMSG_MAX_REFS];
	Histd__V1__ContentBlock *bp[1 + TMSG_MAX_REFS];
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	const Histd__V1__ToolCallBlock call_init = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	const Histd__V1__ContentBlock block_init = HISTD__V1__CONTENT_BLOCK__INIT;
	size_t i;

	if (n > TMSG_MAX_REFS)
		abort();
	memset(m, 0, sizeof(*m));
	tb.text = (char *)text;
	blocks[0] = block_init;
	blocks[0].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	blocks[0].text = &tb;
	bp[0] = &blocks[0];
	for (i = 0; i < n; i++) {
		calls[i] = call_init;
		calls[i].id = (char *)ids[i];
		calls[i].name = "lookup";
		calls[i].arguments = "{\"q\":1}";
		blocks[1 + i] = block_init;
		blocks[1 + i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
		blocks[1 + i].tool_call = &calls[i];
		bp[1 + i] = &blocks[1 + i];
		m->calls[i].id = xstrdup(ids[i]);
		m->calls[i].block = (uint32_t)(1 + i);
	}
	m->n_calls = n;
	msg.role = ASSISTANT;
	msg.author = "conformance";
	msg.n_content = 1 + n;
	msg.content = bp;
	tmsg_pack(m, &msg, 20 + 9 * (uint32_t)n);
}

/* A tool message with a tool_result block per id. */
static void tmsg_results(tmsg *m, const char *const *ids, size_t n)
{
	Histd__V1__TextBlock tb[TMSG_MAX_REFS];
	Histd__V1__ContentBlock inner[TMSG_MAX_REFS];
	Histd__V1__ContentBlock *innerp[TMSG_MAX_REFS];
	Histd__V1__ToolResultBlock res[TMSG_MAX_REFS];
	Histd__V1__ContentBlock blocks[TMSG_MAX_REFS];
	Histd__V1__ContentBlock *bp[TMSG_MAX_REFS];
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	const Histd__V1__TextBlock text_init = HISTD__V1__TEXT_BLOCK__INIT;
	const Histd__V1__ToolResultBlock res_init = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	const Histd__V1__ContentBlock block_init = HISTD__V1__CONTENT_BLOCK__INIT;
	size_t i;

	if (n > TMSG_MAX_REFS)
		abort();
	memset(m, 0, sizeof(*m));
	for (i = 0; i < n; i++) {
		tb[i] = text_init;
		tb[i].text = "the tool's output";
		inner[i] = block_init;
		inner[i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		inner[i].text = &tb[i];
		innerp[i] = &inner[i];
		res[i] = res_init;
		res[i].tool_call_id = (char *)ids[i];
		res[i].tool_name = "lookup";
		res[i].n_content = 1;
		res[i].content = &innerp[i];
		blocks[i] = block_init;
		blocks[i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		blocks[i].tool_result = &res[i];
		bp[i] = &blocks[i];
		m->results[i].id = xstrdup(ids[i]);
		m->results[i].block = (uint32_t)i;
	}
	m->n_results = n;
	msg.role = HISTD__V1__ROLE__ROLE_TOOL;
	msg.author = "conformance";
	msg.n_content = n;
	msg.content = bp;
	tmsg_pack(m, &msg, 40 + 11 * (uint32_t)n);
}

static void tmsg_free(tmsg *m)
{
	size_t i;

	free(m->data);
	for (i = 0; i < m->n_calls; i++)
		free((char *)m->calls[i].id);
	for (i = 0; i < m->n_results; i++)
		free((char *)m->results[i].id);
	memset(m, 0, sizeof(*m));
}

static void tmsgs_free(tmsg *m, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		tmsg_free(&m[i]);
}

/* n text messages "<prefix> <i>", users and assistants in turn. */
static void tmsg_texts(tmsg *m, size_t n, const char *prefix)
{
	char text[96];
	size_t i;

	for (i = 0; i < n; i++) {
		snprintf(text, sizeof(text), "%s %zu%s", prefix, i,
			 i % 3 ? "" : " with a longer tail of words");
		tmsg_text(&m[i], i % 2 ? ASSISTANT : USER, text);
	}
}

static histd_msg_in tmsg_in(const tmsg *m)
{
	histd_msg_in in;

	in.data = m->data;
	in.len = m->len;
	in.token_estimate = m->tokens;
	in.calls = m->calls;
	in.n_calls = m->n_calls;
	in.results = m->results;
	in.n_results = m->n_results;
	return in;
}

/* The length of the record stored for m at seq: the seq field in front. */
static uint64_t stored_len(const tmsg *m, uint64_t seq)
{
	return m->len + 1 + histd_wire_varint_size(seq);
}

static uint64_t tokens_of(const tmsg *m, size_t n)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++)
		sum += m[i].tokens;
	return sum;
}

/* Stored bytes of m[0..n) at seqs first_seq.. */
static uint64_t bytes_of(const tmsg *m, size_t n, uint64_t first_seq)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++)
		sum += stored_len(&m[i], first_seq + i);
	return sum;
}

/* Whether r is m stored at seq. Returns 0 or fills why. Safe off the test's
 * thread. */
static int record_is(const histd_record *r, uint64_t seq, const tmsg *m,
		     char *why, size_t why_len)
{
	Histd__V1__Message *msg;
	uint8_t *repacked;
	size_t n;
	int same;

	if (r->seq != seq) {
		snprintf(why, why_len, "record seq %llu, want %llu",
			 (unsigned long long)r->seq, (unsigned long long)seq);
		return -1;
	}
	if (r->token_estimate != m->tokens) {
		snprintf(why, why_len, "seq %llu: token_estimate %u, want %u",
			 (unsigned long long)seq, r->token_estimate, m->tokens);
		return -1;
	}
	if (!r->data || r->len != stored_len(m, seq)) {
		snprintf(why, why_len, "seq %llu: %u bytes, want %llu (the "
			 "message with its seq in front)",
			 (unsigned long long)seq, r->len,
			 (unsigned long long)stored_len(m, seq));
		return -1;
	}
	msg = histd__v1__message__unpack(NULL, r->len, r->data);
	if (!msg) {
		snprintf(why, why_len, "seq %llu: does not unpack as a Message",
			 (unsigned long long)seq);
		return -1;
	}
	if (msg->seq != seq) {
		snprintf(why, why_len, "seq %llu: the bytes say seq %llu",
			 (unsigned long long)seq, (unsigned long long)msg->seq);
		histd__v1__message__free_unpacked(msg, NULL);
		return -1;
	}
	/* protobuf-c packs canonically: the stored message with its seq
	 * zeroed packs back to exactly the bytes that were appended. */
	msg->seq = 0;
	n = histd__v1__message__get_packed_size(msg);
	repacked = xmalloc(n);
	histd__v1__message__pack(msg, repacked);
	same = n == m->len && memcmp(repacked, m->data, n) == 0;
	free(repacked);
	histd__v1__message__free_unpacked(msg, NULL);
	if (!same) {
		snprintf(why, why_len, "seq %llu: content differs from what "
			 "was appended", (unsigned long long)seq);
		return -1;
	}
	return 0;
}

static void expect_record(const histd_record *r, uint64_t seq, const tmsg *m)
{
	char why[160];

	if (record_is(r, seq, m, why, sizeof(why)))
		fail_msg("%s", why);
}

/* rs holds exactly m[0..n) at seqs first_seq... */
static void expect_records(const histd_records *rs, uint64_t first_seq,
			   const tmsg *m, size_t n)
{
	size_t i;

	expect_eq(rs->n, n, "number of records");
	for (i = 0; i < n; i++)
		expect_record(&rs->v[i], first_seq + i, &m[i]);
}

/* ---------------------------------------------------------------------- */
/* Calls, with the arguments tests do not vary filled in                   */

static histd_session sess_in(const char *tenant, const char *id)
{
	histd_session s;

	memset(&s, 0, sizeof(s));
	s.tenant = (char *)tenant;
	s.id = (char *)id;
	s.created_at_us = T0;
	s.updated_at_us = T0;
	return s;
}

static void create_ok(ctest *t, const char *tenant, const char *id)
{
	histd_session in = sess_in(tenant, id), *out = NULL;

	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
}

static void create_with_keys(ctest *t, const char *tenant, const char *id,
			     histd_kv *keys, size_t n)
{
	histd_session in = sess_in(tenant, id), *out = NULL;

	in.context_keys = keys;
	in.n_context_keys = n;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
}

static histd_session *get_ok(ctest *t, const char *tenant, const char *id)
{
	histd_session *s = NULL;

	expect_ok(histd_driver_session_get(t->d, tenant, id, &s));
	assert_non_null(s);
	return s;
}

#define MAX_BATCH 16

/* Safe off the test's thread. */
static int append_full(ctest *t, const char *tenant, const char *id,
		       uint64_t expected_revision, const char *idem_key,
		       uint8_t hash_byte, int64_t now_us, int64_t expires_us,
		       const tmsg *m, size_t n, histd_append_result *res)
{
	histd_msg_in in[MAX_BATCH];
	uint8_t hash[HISTD_HASH_LEN];
	histd_append a;
	size_t i;

	if (n > MAX_BATCH)
		abort();
	for (i = 0; i < n; i++)
		in[i] = tmsg_in(&m[i]);
	memset(hash, hash_byte, sizeof(hash));
	memset(&a, 0, sizeof(a));
	a.tenant = tenant;
	a.session_id = id;
	a.expected_revision = expected_revision;
	a.idempotency_key = idem_key;
	a.request_hash = idem_key ? hash : NULL;
	a.now_us = now_us;
	a.idem_expires_us = expires_us;
	a.msgs = in;
	a.n_msgs = n;
	return histd_driver_append(t->d, &a, res);
}

static int append_msgs(ctest *t, const char *tenant, const char *id,
		       uint64_t expected_revision, const tmsg *m, size_t n,
		       histd_append_result *res)
{
	return append_full(t, tenant, id, expected_revision, NULL, 0, T0, 0,
			   m, n, res);
}

/* Appends m[0..n) as one batch and checks the seqs it got. */
static histd_append_result append_ok(ctest *t, const char *tenant,
				     const char *id, const tmsg *m, size_t n,
				     uint64_t want_first_seq)
{
	histd_append_result res;

	memset(&res, 0, sizeof(res));
	expect_ok(append_msgs(t, tenant, id, 0, m, n, &res));
	expect_eq(res.first_seq, want_first_seq, "append first_seq");
	expect_eq(res.last_seq, want_first_seq + n - 1, "append last_seq");
	expect_eq(res.replayed, 0, "append replayed");
	return res;
}

/* Appends each of m[0..n) as its own batch, from seq want_first_seq. */
static void append_each(ctest *t, const char *tenant, const char *id,
			const tmsg *m, size_t n, uint64_t want_first_seq)
{
	size_t i;

	for (i = 0; i < n; i++)
		append_ok(t, tenant, id, &m[i], 1, want_first_seq + i);
}

static int append_replace(ctest *t, const char *tenant, const char *id,
			  uint64_t expected_revision, const tmsg *m, size_t n,
			  histd_append_result *res, uint64_t *cleared_to_seq)
{
	histd_msg_in in[MAX_BATCH];
	histd_append a;
	size_t i;

	if (n > MAX_BATCH)
		abort();
	for (i = 0; i < n; i++)
		in[i] = tmsg_in(&m[i]);
	memset(&a, 0, sizeof(a));
	a.tenant = tenant;
	a.session_id = id;
	a.expected_revision = expected_revision;
	a.now_us = T0;
	a.msgs = n ? in : NULL;
	a.n_msgs = n;
	return histd_driver_replace(t->d, &a, res, cleared_to_seq);
}

static void read_all(ctest *t, const char *tenant, const char *id,
		     histd_read_result *rr)
{
	histd_read q;

	memset(&q, 0, sizeof(q));
	q.tenant = tenant;
	q.session_id = id;
	memset(rr, 0, sizeof(*rr));
	expect_ok(histd_driver_read(t->d, &q, rr));
}

/* The session's messages are exactly m[0..n) at seqs first_seq... */
static void expect_messages(ctest *t, const char *tenant, const char *id,
			    uint64_t first_seq, const tmsg *m, size_t n)
{
	histd_read_result rr;

	read_all(t, tenant, id, &rr);
	expect_records(&rr.records, first_seq, m, n);
	histd_read_result_clear(&rr);
}

static void clear_ok(ctest *t, const char *tenant, const char *id,
		     uint64_t want_revision, uint64_t want_cleared_to_seq)
{
	uint64_t rev = 0, cleared = 0, cur = 0;

	expect_ok(histd_driver_clear(t->d, tenant, id, 0, &rev, &cleared,
				     &cur));
	expect_eq(rev, want_revision, "clear revision");
	expect_eq(cleared, want_cleared_to_seq, "clear cleared_to_seq");
}

/* A packed Summary record covering from..to. */
static histd_record *summary_new(uint64_t from, uint64_t to, const char *text)
{
	Histd__V1__Summary s = HISTD__V1__SUMMARY__INIT;
	histd_record *r;
	uint8_t *buf;
	size_t len;

	s.covers_from_seq = from;
	s.covers_to_seq = to;
	s.text = (char *)text;
	s.model = "conformance";
	s.token_estimate = 5 + (uint32_t)strlen(text) / 4;
	len = histd__v1__summary__get_packed_size(&s);
	buf = xmalloc(len);
	histd__v1__summary__pack(&s, buf);
	r = histd_record_new(to, s.token_estimate, buf, len);
	free(buf);
	assert_non_null(r);
	return r;
}

static uint64_t summary_put_ok(ctest *t, const char *tenant, const char *id,
			       const histd_record *s)
{
	uint64_t rev = 0, cur = 0;

	expect_ok(histd_driver_summary_put(t->d, tenant, id, 0, s, &rev, &cur));
	return rev;
}

static void expect_same_record(const histd_record *got,
			       const histd_record *want, const char *what)
{
	if (!got)
		fail_msg("%s: no record", what);
	expect_eq(got->seq, want->seq, what);
	expect_eq(got->token_estimate, want->token_estimate, what);
	expect_eq(got->len, want->len, what);
	if (memcmp(got->data, want->data, want->len) != 0)
		fail_msg("%s: bytes differ", what);
}

/* The session's newest summary is `want` (NULL: none). */
static void expect_summary(ctest *t, const char *tenant, const char *id,
			   const histd_record *want)
{
	histd_record *got = SENTINEL_RECORD;

	expect_ok(histd_driver_summary_get(t->d, tenant, id, &got));
	if (!want) {
		if (got != NULL)
			fail_msg("summary_get: a summary where none is stored");
		return;
	}
	if (got == SENTINEL_RECORD || got == NULL)
		fail_msg("summary_get: none, want covers_to_seq %llu",
			 (unsigned long long)want->seq);
	expect_same_record(got, want, "summary");
	histd_record_free(got);
}

static uint8_t *config_new(const char *plugin, size_t *len)
{
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT;
	Histd__V1__PluginConfig *pcs[1] = { &pc };
	Histd__V1__Pipeline p = HISTD__V1__PIPELINE__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	uint8_t *buf;

	pc.name = (char *)plugin;
	p.n_plugins = 1;
	p.plugins = pcs;
	c.pipeline = &p;
	*len = histd__v1__session_config__get_packed_size(&c);
	buf = xmalloc(*len);
	histd__v1__session_config__pack(&c, buf);
	return buf;
}

static void expect_kv(const histd_kv *got, size_t ngot, const histd_kv *want,
		      size_t nwant, const char *what)
{
	size_t i;

	expect_eq(ngot, nwant, what);
	for (i = 0; i < nwant; i++)
		if (strcmp(got[i].key, want[i].key) != 0 ||
		    strcmp(got[i].value, want[i].value) != 0)
			fail_msg("%s[%zu]: got %s=%s, want %s=%s", what, i,
				 got[i].key, got[i].value, want[i].key,
				 want[i].value);
}

static void expect_config(const histd_session *s, const uint8_t *want,
			  size_t len)
{
	expect_eq(s->config_len, len, "config_len");
	if (len && (!s->config || memcmp(s->config, want, len) != 0))
		fail_msg("config bytes differ");
}

/* Every counter of a session record. */
typedef struct want_state {
	uint64_t revision;
	uint64_t last_seq;
	uint64_t cleared_to_seq;
	uint64_t message_count;
	uint64_t token_total;
	uint64_t bytes_total;
	uint64_t first_seq;
	uint64_t summary_count;
} want_state;

static void expect_counters(const histd_session *s, want_state w)
{
	expect_eq(s->revision, w.revision, "revision");
	expect_eq(s->last_seq, w.last_seq, "last_seq");
	expect_eq(s->cleared_to_seq, w.cleared_to_seq, "cleared_to_seq");
	expect_eq(s->message_count, w.message_count, "message_count");
	expect_eq(s->token_total, w.token_total, "token_total");
	expect_eq(s->bytes_total, w.bytes_total, "bytes_total");
	expect_eq(s->first_seq, w.first_seq, "first_seq");
	expect_eq(s->summary_count, w.summary_count, "summary_count");
}

static void expect_state(ctest *t, const char *tenant, const char *id,
			 want_state w)
{
	histd_session *s = get_ok(t, tenant, id);

	expect_counters(s, w);
	histd_session_free(s);
}

static uint64_t revision_of(ctest *t, const char *tenant, const char *id)
{
	histd_session *s = get_ok(t, tenant, id);
	uint64_t rev = s->revision;

	histd_session_free(s);
	return rev;
}

/*
 * Runs fn on n threads at once. Each worker calls race_gate before every
 * round of its racing calls: the gate opens when all n have arrived, and
 * they spin rather than sleep at it, so that the threads running leave it
 * within nanoseconds of each other (a pthread barrier wakes them one after
 * the other, and on a small machine each would finish its call before the
 * next wakes up).
 */
typedef struct race {
	pthread_t th[16];
	size_t n;
	atomic_size_t arrived;
	atomic_bool abandoned;	/* a thread did not start: gates stay open */
} race;

static void race_gate(race *r, size_t round)
{
	size_t open_at = (round + 1) * r->n, spins = 0;

	atomic_fetch_add(&r->arrived, 1);
	while (atomic_load(&r->arrived) < open_at &&
	       !atomic_load(&r->abandoned))
		if (++spins % 1024 == 0)
			sched_yield();
}

static void race_run(race *r, size_t n, void *(*fn)(void *), void *args,
		     size_t arg_size)
{
	size_t i, started;
	int rc = 0;

	assert_true(n <= N_OF(r->th));
	r->n = n;
	atomic_init(&r->arrived, 0);
	atomic_init(&r->abandoned, false);
	for (started = 0; started < n; started++) {
		rc = pthread_create(&r->th[started], NULL, fn,
				    (char *)args + started * arg_size);
		if (rc != 0)
			break;
	}
	/* If one did not start, the others would wait at the gate for ever
	 * (and outlive args): open it, let them finish, then fail. */
	if (started < n)
		atomic_store(&r->abandoned, true);
	for (i = 0; i < started; i++)
		pthread_join(r->th[i], NULL);
	if (started < n)
		fail_msg("pthread_create of racer %zu of %zu: %s", started, n,
			 strerror(rc));
}

/* ---------------------------------------------------------------------- */
/* Opening                                                                 */

static void driver_is_registered_valid_and_answers_ping(void **state)
{
	ctest *t = *state;
	const char *const *names = histd_driver_names();
	int found = 0;

	assert_non_null(names);
	for (; *names; names++)
		if (strcmp(*names, t->fx->driver) == 0)
			found = 1;
	if (!found)
		fail_msg("%s is not among histd_driver_names()", t->fx->driver);
	expect_ok(histd_driver_validate(t->d));
	assert_string_equal(t->d->name, t->fx->driver);
	/* Version 3 promises are tested (or skipped) by their own tests;
	 * every driver can search (2). */
	if (t->d->version < 2 || t->d->version > HISTD_DRIVER_VERSION)
		fail_msg("version %u, want 2..%u", t->d->version,
			 HISTD_DRIVER_VERSION);
	expect_ok(histd_driver_ping(t->d));
}

/* ---------------------------------------------------------------------- */
/* Create and get                                                          */

static void session_create_returns_the_record_at_revision_1(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "42" }, { "user", "u-7" } };
	histd_kv labels[] = { { "env", "prod" }, { "team", "search" } };
	histd_session in = sess_in(TA, "s1"), *out = SENTINEL_SESSION, *got;
	uint8_t *cfg;
	size_t cfg_len;
	const want_state fresh = { .revision = 1 };

	cfg = config_new("window", &cfg_len);
	in.context_keys = keys;
	in.n_context_keys = N_OF(keys);
	in.labels = labels;
	in.n_labels = N_OF(labels);
	in.config = cfg;
	in.config_len = cfg_len;
	in.created_at_us = T0 + 11;
	in.updated_at_us = T0 + 11;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	assert_true(out != NULL && out != SENTINEL_SESSION);

	got = get_ok(t, TA, "s1");
	for (int i = 0; i < 2; i++) {
		histd_session *s = i ? got : out;

		assert_string_equal(s->tenant, TA);
		assert_string_equal(s->id, "s1");
		expect_kv(s->context_keys, s->n_context_keys, keys,
			  N_OF(keys), "context_keys");
		expect_kv(s->labels, s->n_labels, labels, N_OF(labels),
			  "labels");
		expect_config(s, cfg, cfg_len);
		expect_eq(s->created_at_us, T0 + 11, "created_at_us");
		expect_eq(s->updated_at_us, T0 + 11, "updated_at_us");
		expect_counters(s, fresh);
	}
	histd_session_free(out);
	histd_session_free(got);
	free(cfg);
}

static void session_create_without_keys_labels_or_config_has_none(void **state)
{
	ctest *t = *state;
	histd_session *s;

	create_ok(t, TA, "bare");
	s = get_ok(t, TA, "bare");
	expect_eq(s->n_context_keys, 0, "n_context_keys");
	expect_eq(s->n_labels, 0, "n_labels");
	expect_eq(s->config_len, 0, "config_len");
	expect_eq(s->revision, 1, "revision");
	histd_session_free(s);
}

static void session_get_of_unknown_id_is_not_found(void **state)
{
	ctest *t = *state;
	histd_session *out = SENTINEL_SESSION;

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_get(t->d, TA, "nobody", &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	create_ok(t, TA, "somebody");
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_get(t->d, TA, "nobody", &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
}

static void session_create_with_taken_id_is_exists(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_session in = sess_in(TA, "s1"), *out = SENTINEL_SESSION, *s;

	create_ok(t, TA, "s1");
	in.context_keys = keys;
	in.n_context_keys = 1;
	expect_err(HISTD_EEXISTS, histd_driver_session_create(t->d, &in, &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	s = get_ok(t, TA, "s1");
	expect_eq(s->n_context_keys, 0, "the first session's context keys");
	expect_eq(s->revision, 1, "revision");
	histd_session_free(s);
	/* The failed create did not take the keys either. */
	create_with_keys(t, TA, "s2", keys, 1);
}

static void session_create_with_taken_context_keys_is_exists(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "42" }, { "user", "u-7" } };
	histd_kv subset[] = { { "chat", "42" } };
	histd_kv superset[] = { { "chat", "42" }, { "thread", "x" },
				{ "user", "u-7" } };
	histd_kv other_value[] = { { "chat", "42" }, { "user", "u-8" } };
	histd_session in = sess_in(TA, "s2"), *out = SENTINEL_SESSION;

	create_with_keys(t, TA, "s1", keys, N_OF(keys));
	in.context_keys = keys;
	in.n_context_keys = N_OF(keys);
	expect_err(HISTD_EEXISTS, histd_driver_session_create(t->d, &in, &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_get(t->d, TA, "s2", &out));
	/* Only the same set is taken. */
	create_with_keys(t, TA, "s3", subset, N_OF(subset));
	create_with_keys(t, TA, "s4", superset, N_OF(superset));
	create_with_keys(t, TA, "s5", other_value, N_OF(other_value));
	/* Sessions without keys never collide on them. */
	create_ok(t, TA, "s6");
	create_ok(t, TA, "s7");
}

static void session_create_with_id_or_keys_of_another_tenant_is_allowed(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "42" } };
	histd_session *a, *b;
	tmsg m;

	create_with_keys(t, TA, "s1", keys, 1);
	create_with_keys(t, TB, "s1", keys, 1);
	create_with_keys(t, TB, "s2", (histd_kv[]){ { "chat", "43" } }, 1);
	create_with_keys(t, TA, "s2", (histd_kv[]){ { "chat", "43" } }, 1);
	/* Two sessions: a write to one leaves the other alone. */
	tmsg_text(&m, USER, "hello");
	append_ok(t, TA, "s1", &m, 1, 1);
	a = get_ok(t, TA, "s1");
	b = get_ok(t, TB, "s1");
	assert_string_equal(a->tenant, TA);
	assert_string_equal(b->tenant, TB);
	expect_eq(a->revision, 2, "tenant-a s1 revision");
	expect_eq(b->revision, 1, "tenant-b s1 revision");
	expect_eq(b->message_count, 0, "tenant-b s1 message_count");
	histd_session_free(a);
	histd_session_free(b);
	tmsg_free(&m);
}

/* ---------------------------------------------------------------------- */
/* Resolve                                                                 */

static void session_resolve_creates_once_then_returns_the_same_session(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "42" }, { "user", "u-7" } };
	histd_kv labels[] = { { "env", "prod" } };
	histd_kv labels2[] = { { "env", "dev" } };
	histd_session in = sess_in(TA, "r1"), *out = NULL, *s;
	uint8_t *cfg, *cfg2;
	size_t cfg_len, cfg2_len;
	int created = 42;

	cfg = config_new("window", &cfg_len);
	cfg2 = config_new("masking", &cfg2_len);
	in.context_keys = keys;
	in.n_context_keys = N_OF(keys);
	in.labels = labels;
	in.n_labels = 1;
	in.config = cfg;
	in.config_len = cfg_len;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 1, "created by the first resolve");
	assert_string_equal(out->id, "r1");
	expect_eq(out->revision, 1, "revision");
	histd_session_free(out);

	/* Same keys, another id, labels and config: the same session, as it
	 * was created. */
	in.id = "r2";
	in.labels = labels2;
	in.config = cfg2;
	in.config_len = cfg2_len;
	created = 42;
	out = NULL;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 0, "created by the second resolve");
	assert_string_equal(out->id, "r1");
	assert_string_equal(out->tenant, TA);
	expect_kv(out->labels, out->n_labels, labels, 1, "labels");
	expect_kv(out->context_keys, out->n_context_keys, keys, N_OF(keys),
		  "context_keys");
	expect_config(out, cfg, cfg_len);
	histd_session_free(out);
	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "r2", &s));
	free(cfg);
	free(cfg2);
}

static void session_resolve_finds_a_session_made_by_create(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "9" } };
	histd_session in = sess_in(TA, "other"), *out = NULL;
	int created = 42;
	tmsg m;

	create_with_keys(t, TA, "made", keys, 1);
	tmsg_text(&m, USER, "hi");
	append_ok(t, TA, "made", &m, 1, 1);
	in.context_keys = keys;
	in.n_context_keys = 1;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 0, "created");
	assert_string_equal(out->id, "made");
	/* The full current record, with its stats. */
	expect_eq(out->revision, 2, "revision");
	expect_eq(out->message_count, 1, "message_count");
	expect_eq(out->last_seq, 1, "last_seq");
	histd_session_free(out);
	tmsg_free(&m);
}

static void session_resolve_matches_the_exact_key_set(void **state)
{
	ctest *t = *state;
	histd_kv ab[] = { { "a", "1" }, { "b", "2" } };
	histd_kv a[] = { { "a", "1" } };
	histd_kv ab3[] = { { "a", "1" }, { "b", "3" } };
	histd_session in = sess_in(TA, "x"), *out = NULL;
	int created;

	struct {
		const char *id;
		histd_kv *keys;
		size_t n;
		const char *want_id;
		int want_created;
	} steps[] = {
		{ "x", ab, 2, "x", 1 },
		{ "y", a, 1, "y", 1 },
		{ "z", ab3, 2, "z", 1 },
		{ "w", ab, 2, "x", 0 },
		{ "w", a, 1, "y", 0 },
		{ "w", ab3, 2, "z", 0 },
	};
	for (size_t i = 0; i < N_OF(steps); i++) {
		in.id = (char *)steps[i].id;
		in.context_keys = steps[i].keys;
		in.n_context_keys = steps[i].n;
		created = 42;
		out = NULL;
		expect_ok(histd_driver_session_resolve(t->d, &in, &out,
						       &created));
		assert_string_equal(out->id, steps[i].want_id);
		expect_eq(created, steps[i].want_created, "created");
		histd_session_free(out);
	}
}

/* The largest context_keys README allows: 64 pairs, keys of 63 characters,
 * values of 256 bytes (about 20 KB, and not compressible). */
#define BIG_KEYS 64

static void big_keys_fill(histd_kv *kv, char (*k)[64], char (*v)[257],
			  uint32_t seed)
{
	static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	uint32_t x = seed;

	for (size_t i = 0; i < BIG_KEYS; i++) {
		snprintf(k[i], 64, "k%02zu", i);
		memset(k[i] + 3, 'k', 60);
		k[i][63] = '\0';
		for (size_t j = 0; j < 256; j++) {
			x = x * 1103515245u + 12345u;
			v[i][j] = abc[(x >> 16) % (sizeof(abc) - 1)];
		}
		v[i][256] = '\0';
		kv[i] = (histd_kv){ k[i], v[i] };
	}
}

static void session_resolve_and_create_take_the_largest_context_keys(void **state)
{
	ctest *t = *state;
	static char k[BIG_KEYS][64], v[BIG_KEYS][257];
	histd_kv kv[BIG_KEYS];
	histd_session in = sess_in(TA, "big"), *out = NULL;
	int created = 42;

	big_keys_fill(kv, k, v, 1);
	in.context_keys = kv;
	in.n_context_keys = BIG_KEYS;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
	out = NULL;
	in.id = "other";
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 0, "created by a resolve of the same keys");
	assert_string_equal(out->id, "big");
	expect_kv(out->context_keys, out->n_context_keys, kv, BIG_KEYS,
		  "context_keys");
	histd_session_free(out);
	out = NULL;
	expect_err(HISTD_EEXISTS, histd_driver_session_create(t->d, &in, &out));

	/* One byte of one value differs: other keys, another session. */
	v[BIG_KEYS - 1][255] = v[BIG_KEYS - 1][255] == 'A' ? 'B' : 'A';
	created = 42;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 1, "created by a resolve of other keys");
	assert_string_equal(out->id, "other");
	histd_session_free(out);
}

static void session_resolve_with_taken_id_and_new_keys_is_exists(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_session in = sess_in(TA, "s1"), *out = SENTINEL_SESSION;
	int created = 42;

	create_ok(t, TA, "s1");
	in.context_keys = keys;
	in.n_context_keys = 1;
	expect_err(HISTD_EEXISTS,
		   histd_driver_session_resolve(t->d, &in, &out, &created));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_eq(created, 42, "created after an error");
}

static void session_resolve_is_per_tenant(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_session in = sess_in(TA, "ra"), *out = NULL;
	int created = 42;

	in.context_keys = keys;
	in.n_context_keys = 1;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 1, "created in tenant-a");
	histd_session_free(out);

	in.tenant = TB;
	in.id = "rb";
	created = 42;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 1, "created in tenant-b");
	assert_string_equal(out->id, "rb");
	assert_string_equal(out->tenant, TB);
	histd_session_free(out);
}

#define RACE_THREADS 4
#define RACE_ROUNDS 1000

typedef struct resolve_racer {
	ctest *t;
	race *r;
	int index;
	int rc[RACE_ROUNDS];
	int created[RACE_ROUNDS];
	char id[RACE_ROUNDS][32];
} resolve_racer;

static void *resolve_racer_run(void *arg)
{
	resolve_racer *w = arg;
	char key[32], id[32];
	histd_kv keys[1];
	histd_session in, *out;
	int round;

	for (round = 0; round < RACE_ROUNDS; round++) {
		snprintf(key, sizeof(key), "race-%d", round);
		snprintf(id, sizeof(id), "r%d-t%d", round, w->index);
		keys[0].key = "chat";
		keys[0].value = key;
		in = sess_in(TA, id);
		in.context_keys = keys;
		in.n_context_keys = 1;
		out = NULL;
		w->created[round] = -1;
		race_gate(w->r, (size_t)round);
		w->rc[round] = histd_driver_session_resolve(w->t->d, &in, &out,
							    &w->created[round]);
		if (w->rc[round] == 0) {
			snprintf(w->id[round], sizeof(w->id[round]), "%s",
				 out->id);
			histd_session_free(out);
		}
	}
	return NULL;
}

static void session_resolve_is_atomic_under_racing_threads(void **state)
{
	ctest *t = *state;
	resolve_racer w[RACE_THREADS];
	race r;
	int round, i;

	memset(w, 0, sizeof(w));
	for (i = 0; i < RACE_THREADS; i++) {
		w[i].t = t;
		w[i].r = &r;
		w[i].index = i;
	}
	race_run(&r, RACE_THREADS, resolve_racer_run, w, sizeof(w[0]));
	for (round = 0; round < RACE_ROUNDS; round++) {
		int creators = 0;
		const char *winner = NULL;

		for (i = 0; i < RACE_THREADS; i++) {
			if (w[i].rc[round] != 0)
				fail_msg("round %d thread %d: %s", round, i,
					 histd_error_name(w[i].rc[round]));
			if (w[i].created[round] == 1) {
				creators++;
				winner = w[i].id[round];
			} else if (w[i].created[round] != 0) {
				fail_msg("round %d thread %d: created %d",
					 round, i, w[i].created[round]);
			}
		}
		if (creators != 1)
			fail_msg("round %d: %d resolves created the session, "
				 "want exactly 1", round, creators);
		for (i = 0; i < RACE_THREADS; i++)
			if (strcmp(w[i].id[round], winner) != 0)
				fail_msg("round %d: thread %d got %s, the "
					 "creator got %s", round, i,
					 w[i].id[round], winner);
	}
}

/* ---------------------------------------------------------------------- */
/* List                                                                    */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void session_list_pages_by_after_id_in_byte_order(void **state)
{
	ctest *t = *state;
	/* Mixed case and punctuation: byte order, not a locale's collation. */
	const char *ids[] = {
		"s-07", "a1", "Z9", "s-00", "a.1", "s-12", "0z", "a-1",
		"s-03", "A1", "s-15", "a:1", "s-01", "s-09", "s-14", "s-02",
		"s-11", "s-05", "s-13", "s-04", "s-10", "s-06", "s-08",
	};
	const char *sorted[N_OF(ids)];
	histd_session_list l;
	histd_list q;
	size_t i, seen = 0, pages = 0;
	char after[64] = "";
	int more;

	for (i = 0; i < N_OF(ids); i++)
		create_ok(t, TA, ids[i]);
	create_ok(t, TB, "b-only");
	memcpy(sorted, ids, sizeof(ids));
	qsort(sorted, N_OF(sorted), sizeof(sorted[0]), cmp_str);

	/* 23 sessions, pages of 5: 5 5 5 5 3. */
	do {
		memset(&q, 0, sizeof(q));
		q.tenant = TA;
		q.after_id = after;
		q.limit = 5;
		memset(&l, 0, sizeof(l));
		expect_ok(histd_driver_session_list(t->d, &q, &l));
		pages++;
		expect_eq(l.n, pages < 5 ? 5 : 3, "page size");
		expect_eq(l.has_more, pages < 5, "has_more");
		for (i = 0; i < l.n; i++, seen++) {
			assert_string_equal(l.v[i]->tenant, TA);
			if (strcmp(l.v[i]->id, sorted[seen]) != 0)
				fail_msg("listed #%zu: %s, want %s", seen,
					 l.v[i]->id, sorted[seen]);
		}
		snprintf(after, sizeof(after), "%s", l.v[l.n - 1]->id);
		more = l.has_more;
		histd_session_list_free(&l);
	} while (more && pages < 10);
	expect_eq(seen, N_OF(ids), "sessions listed");

	/* A page that ends exactly at the last session has no more. */
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.limit = (uint32_t)N_OF(ids);
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, N_OF(ids), "one page of all");
	expect_eq(l.has_more, 0, "has_more of an exact page");
	histd_session_list_free(&l);
	q.limit = (uint32_t)N_OF(ids) - 1;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, N_OF(ids) - 1, "one page short of all");
	expect_eq(l.has_more, 1, "has_more with one left");
	histd_session_list_free(&l);

	/* after_id need not exist: the page starts at the next id. */
	q.after_id = "a0";
	q.limit = 2;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 2, "page after a0");
	assert_string_equal(l.v[0]->id, "a1");
	assert_string_equal(l.v[1]->id, "a:1");
	histd_session_list_free(&l);
	q.after_id = "zzz";
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 0, "page after the last id");
	expect_eq(l.has_more, 0, "has_more after the last id");
	histd_session_list_free(&l);
}

static void session_list_filters_by_every_label_pair(void **state)
{
	ctest *t = *state;
	histd_kv prod_a[] = { { "env", "prod" }, { "team", "a" } };
	histd_kv prod[] = { { "env", "prod" } };
	histd_kv dev_a[] = { { "env", "dev" }, { "team", "a" } };
	histd_kv dev[] = { { "env", "dev" } };
	histd_kv team_a[] = { { "team", "a" } };
	histd_kv qa[] = { { "env", "qa" } };
	histd_session_list l;
	histd_list q;
	char id[16];
	int i;

	/* s-i: env=prod for even i, env=dev for odd; team=a when i % 3 == 0. */
	for (i = 0; i < 10; i++) {
		histd_session in, *out = NULL;

		snprintf(id, sizeof(id), "s-%d", i);
		in = sess_in(TA, id);
		in.labels = i % 2 ? (i % 3 ? dev : dev_a)
				  : (i % 3 ? prod : prod_a);
		in.n_labels = i % 3 ? 1 : 2;
		expect_ok(histd_driver_session_create(t->d, &in, &out));
		histd_session_free(out);
	}

	struct {
		histd_kv *labels;
		size_t n;
		uint32_t limit;
		const char *pages[4][3];   /* each page's ids; "" ends it */
	} cases[] = {
		{ prod, 1, 2, { { "s-0", "s-2" }, { "s-4", "s-6" }, { "s-8" } } },
		{ team_a, 1, 3, { { "s-0", "s-3", "s-6" }, { "s-9" } } },
		/* Only non-matching sessions follow s-6: no more. */
		{ prod_a, 2, 2, { { "s-0", "s-6" } } },
		{ qa, 1, 5, { { NULL } } },
	};
	for (size_t c = 0; c < N_OF(cases); c++) {
		char after[16] = "";

		for (int p = 0; p < 4; p++) {
			size_t want_n = 0;
			int want_more;

			while (want_n < 3 && cases[c].pages[p][want_n])
				want_n++;
			want_more = p + 1 < 4 && cases[c].pages[p + 1][0];
			memset(&q, 0, sizeof(q));
			q.tenant = TA;
			q.after_id = after;
			q.limit = cases[c].limit;
			q.labels = cases[c].labels;
			q.n_labels = cases[c].n;
			memset(&l, 0, sizeof(l));
			expect_ok(histd_driver_session_list(t->d, &q, &l));
			expect_eq(l.n, want_n, "filtered page size");
			expect_eq(l.has_more, want_more, "filtered has_more");
			for (size_t k = 0; k < want_n; k++) {
				assert_string_equal(l.v[k]->id,
						    cases[c].pages[p][k]);
				/* Every label, not just the filtered ones. */
				if (!histd_kv_contains(l.v[k]->labels,
						       l.v[k]->n_labels,
						       cases[c].labels,
						       cases[c].n))
					fail_msg("%s lacks the filter labels",
						 l.v[k]->id);
			}
			if (want_n)
				snprintf(after, sizeof(after), "%s",
					 l.v[want_n - 1]->id);
			histd_session_list_free(&l);
			if (!want_more)
				break;
		}
	}
}

static void session_list_is_per_tenant(void **state)
{
	ctest *t = *state;
	histd_session_list l;
	histd_list q;

	create_ok(t, TA, "a");
	create_ok(t, TA, "b");
	create_ok(t, TB, "b");
	create_ok(t, TB, "c");
	memset(&q, 0, sizeof(q));
	q.limit = 10;

	q.tenant = TA;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 2, "tenant-a sessions");
	assert_string_equal(l.v[0]->id, "a");
	assert_string_equal(l.v[1]->id, "b");
	assert_string_equal(l.v[1]->tenant, TA);
	histd_session_list_free(&l);

	q.tenant = TB;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 2, "tenant-b sessions");
	assert_string_equal(l.v[0]->id, "b");
	assert_string_equal(l.v[0]->tenant, TB);
	assert_string_equal(l.v[1]->id, "c");
	histd_session_list_free(&l);

	q.tenant = "tenant-c";
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 0, "tenant-c sessions");
	expect_eq(l.has_more, 0, "tenant-c has_more");
	histd_session_list_free(&l);
}

static void session_list_returns_full_records(void **state)
{
	ctest *t = *state;
	histd_session_list l;
	histd_list q;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "listed");
	append_ok(t, TA, "s1", m, 2, 1);
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.limit = 1;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 1, "sessions");
	expect_counters(l.v[0], (want_state){
		.revision = 2, .last_seq = 2, .message_count = 2,
		.token_total = tokens_of(m, 2), .bytes_total = bytes_of(m, 2, 1),
		.first_seq = 1 });
	expect_eq(l.v[0]->created_at_us, T0, "created_at_us");
	histd_session_list_free(&l);
	tmsgs_free(m, 2);
}

/* ---------------------------------------------------------------------- */
/* Update                                                                  */

static void session_update_replaces_labels_and_config_and_adds_a_revision(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_kv l1[] = { { "env", "prod" } };
	histd_kv l2[] = { { "env", "dev" }, { "owner", "kim" } };
	histd_kv l3[] = { { "stage", "3" } };
	histd_kv none[1] = { { "unused", "unused" } };
	histd_session in = sess_in(TA, "s1"), *out = NULL, *s;
	uint8_t *c1, *c2, *c3;
	size_t c1_len, c2_len, c3_len;
	uint64_t cur = SENTINEL_U64;

	c1 = config_new("window", &c1_len);
	c2 = config_new("masking", &c2_len);
	c3 = config_new("compaction", &c3_len);
	in.context_keys = keys;
	in.n_context_keys = 1;
	in.labels = l1;
	in.n_labels = 1;
	in.config = c1;
	in.config_len = c1_len;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);

	/* Both. */
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, l2, 2, c2,
					      c2_len, T0 + 5, &out, &cur));
	expect_kv(out->labels, out->n_labels, l2, 2, "labels");
	expect_config(out, c2, c2_len);
	expect_eq(out->revision, 2, "revision");
	expect_eq(out->updated_at_us, T0 + 5, "updated_at_us");
	expect_eq(out->created_at_us, T0, "created_at_us");
	expect_kv(out->context_keys, out->n_context_keys, keys, 1,
		  "context_keys");
	histd_session_free(out);
	s = get_ok(t, TA, "s1");
	expect_kv(s->labels, s->n_labels, l2, 2, "stored labels");
	expect_config(s, c2, c2_len);
	expect_eq(s->revision, 2, "stored revision");
	expect_eq(s->updated_at_us, T0 + 5, "stored updated_at_us");
	histd_session_free(s);

	/* Config only: labels NULL keeps them. */
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, NULL, 0, c3,
					      c3_len, T0 + 6, &out, &cur));
	expect_kv(out->labels, out->n_labels, l2, 2, "kept labels");
	expect_config(out, c3, c3_len);
	expect_eq(out->revision, 3, "revision");
	histd_session_free(out);

	/* Labels only: config NULL keeps it. */
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, l3, 1, NULL,
					      0, T0 + 7, &out, &cur));
	expect_kv(out->labels, out->n_labels, l3, 1, "labels");
	expect_config(out, c3, c3_len);
	expect_eq(out->revision, 4, "revision");
	histd_session_free(out);

	/* Labels given as zero pairs: none left. */
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, none, 0, NULL,
					      0, T0 + 8, &out, &cur));
	expect_eq(out->n_labels, 0, "labels after clearing them");
	expect_eq(out->revision, 5, "revision");
	histd_session_free(out);

	/* Neither: still a write. */
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, NULL, 0, NULL,
					      0, T0 + 9, &out, &cur));
	expect_eq(out->revision, 6, "revision");
	expect_eq(out->updated_at_us, T0 + 9, "updated_at_us");
	expect_config(out, c3, c3_len);
	histd_session_free(out);
	free(c1);
	free(c2);
	free(c3);
}

static void session_update_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	histd_kv l1[] = { { "env", "prod" } };
	histd_kv l2[] = { { "env", "dev" } };
	histd_session *out = NULL, *s;
	uint64_t cur = SENTINEL_U64;

	create_ok(t, TA, "s1");
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 1, l1, 1, NULL,
					      0, T0 + 1, &out, &cur));
	expect_eq(out->revision, 2, "revision");
	histd_session_free(out);

	out = SENTINEL_SESSION;
	expect_err(HISTD_ECONFLICT,
		   histd_driver_session_update(t->d, TA, "s1", 1, l2, 1, NULL,
					       0, T0 + 2, &out, &cur));
	expect_eq(cur, 2, "current_revision");
	assert_ptr_equal(out, SENTINEL_SESSION);
	s = get_ok(t, TA, "s1");
	expect_kv(s->labels, s->n_labels, l1, 1, "labels after a conflict");
	expect_eq(s->revision, 2, "revision after a conflict");
	expect_eq(s->updated_at_us, T0 + 1, "updated_at_us after a conflict");
	histd_session_free(s);

	out = NULL;
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 2, l2, 1, NULL,
					      0, T0 + 3, &out, &cur));
	expect_eq(out->revision, 3, "revision");
	histd_session_free(out);
}

static void session_update_of_unknown_session_is_not_found(void **state)
{
	ctest *t = *state;
	histd_kv l1[] = { { "env", "prod" } };
	histd_session *out = SENTINEL_SESSION;
	uint64_t cur = SENTINEL_U64;

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_update(t->d, TA, "nobody", 0, l1, 1,
					       NULL, 0, T0, &out, &cur));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_eq(cur, SENTINEL_U64, "current_revision");
}

/* ---------------------------------------------------------------------- */
/* Delete                                                                  */

static void session_delete_removes_the_session_and_everything_in_it(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_session *s = SENTINEL_SESSION;
	histd_record *rec = SENTINEL_RECORD, *sum;
	histd_read_result rr;
	histd_append_result res;
	histd_session_list l;
	histd_list lq;
	histd_read q;
	uint64_t rev = SENTINEL_U64, cleared = SENTINEL_U64, cur = SENTINEL_U64;
	tmsg m[3];

	create_with_keys(t, TA, "s1", keys, 1);
	tmsg_calls(&m[0], "looking", IDS("c1"));
	tmsg_results(&m[1], IDS("c1"));
	tmsg_text(&m[2], USER, "thanks");
	append_ok(t, TA, "s1", m, 2, 1);
	sum = summary_new(1, 2, "a call and its result");
	summary_put_ok(t, TA, "s1", sum);
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));

	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "s1", &s));
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	memset(&rr, 0, sizeof(rr));
	expect_err(HISTD_ENOTFOUND, histd_driver_read(t->d, &q, &rr));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_get(t->d, TA, "s1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	expect_err(HISTD_ENOTFOUND,
		   append_msgs(t, TA, "s1", 0, &m[2], 1, &res));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_clear(t->d, TA, "s1", 0, &rev, &cleared, &cur));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_delete(t->d, TA, "s1", 0, &cur));
	memset(&lq, 0, sizeof(lq));
	lq.tenant = TA;
	lq.limit = 10;
	expect_ok(histd_driver_session_list(t->d, &lq, &l));
	expect_eq(l.n, 0, "sessions listed after delete");
	histd_session_list_free(&l);
	/* Its context keys are free again. */
	create_with_keys(t, TA, "s2", keys, 1);

	histd_record_free(sum);
	tmsgs_free(m, 3);
}

/* A delete of one life (what the TTL sweeper does) leaves a session
 * created again under the id alone, even at the same revision: ENOTFOUND
 * and nothing changed; the life that is there is deleted. */
static void delete_of_an_earlier_life_leaves_the_new_one(void **state)
{
	ctest *t = *state;
	histd_session *s;
	uint64_t first, second, cur = 0;

	if (t->d->version < 5 || !t->d->session_delete_life)
		skip();
	create_ok(t, TA, "s1");
	s = get_ok(t, TA, "s1");
	first = s->incarnation;
	histd_session_free(s);
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));
	create_ok(t, TA, "s1");
	s = get_ok(t, TA, "s1");
	second = s->incarnation;
	expect_eq(s->revision, 1, "revision of the session created again");
	histd_session_free(s);

	/* The first life was at revision 1 too. */
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_delete_life(t->d, TA, "s1", 1, first,
						    &cur));
	s = get_ok(t, TA, "s1");
	expect_eq(s->incarnation, second, "incarnation after the refused delete");
	expect_eq(s->revision, 1, "revision after the refused delete");
	histd_session_free(s);
	expect_ok(histd_driver_session_delete_life(t->d, TA, "s1", 1, second,
						   &cur));
	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "s1", &s));
}

/* s1 deleted and created again, each life holding the n messages m at
 * revision 2: *first and *second are the two lives. */
static void two_lives_at_revision_2(ctest *t, tmsg *m, size_t n,
				    uint64_t *first, uint64_t *second)
{
	histd_session *s;
	uint64_t cur = 0;

	create_ok(t, TA, "s1");
	append_ok(t, TA, "s1", m, n, 1);
	s = get_ok(t, TA, "s1");
	*first = s->incarnation;
	histd_session_free(s);
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));
	create_ok(t, TA, "s1");
	append_ok(t, TA, "s1", m, n, 1);
	s = get_ok(t, TA, "s1");
	*second = s->incarnation;
	expect_eq(s->revision, 2, "revision of the session created again");
	histd_session_free(s);
}

/* s1 as two_lives_at_revision_2 left it: the second life, holding the n
 * messages m at revision 2. */
static void expect_second_life_untouched(ctest *t, const tmsg *m, size_t n)
{
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = n, .message_count = n,
		.token_total = tokens_of(m, n), .bytes_total = bytes_of(m, n, 1),
		.first_seq = 1 });
}

/* A truncate of one life (what retention does, from what it read of that
 * life) leaves a session created again under the id alone, even at the
 * same revision: ENOTFOUND and nothing changed; the life that is there is
 * truncated. */
static void truncate_of_an_earlier_life_leaves_the_new_one(void **state)
{
	ctest *t = *state;
	uint64_t first, second, rev = SENTINEL_U64, cur = SENTINEL_U64;
	tmsg m[3];

	if (t->d->version < 6 || !t->d->truncate_life)
		skip();
	tmsg_texts(m, 3, "a life");
	two_lives_at_revision_2(t, m, 3, &first, &second);

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_truncate_life(t->d, TA, "s1", 2, 2, first,
					      &rev, &cur));
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_eq(cur, SENTINEL_U64, "current_revision out-parameter");
	expect_second_life_untouched(t, m, 3);
	expect_messages(t, TA, "s1", 1, m, 3);

	expect_ok(histd_driver_truncate_life(t->d, TA, "s1", 2, 2, second,
					     &rev, &cur));
	expect_eq(rev, 3, "revision after truncating the life that is there");
	expect_messages(t, TA, "s1", 3, &m[2], 1);
	tmsgs_free(m, 3);
}

/* A summary put for one life (what compaction does, from what it read of
 * that life) is not stored in a session created again under the id, even
 * at the same revision: ENOTFOUND and nothing changed; the life that is
 * there takes it. */
static void summary_put_of_an_earlier_life_leaves_the_new_one(void **state)
{
	ctest *t = *state;
	uint64_t first, second, rev = SENTINEL_U64, cur = SENTINEL_U64;
	histd_record *sum;
	tmsg m[2];

	if (t->d->version < 6 || !t->d->summary_put_life)
		skip();
	tmsg_texts(m, 2, "a life");
	two_lives_at_revision_2(t, m, 2, &first, &second);
	sum = summary_new(1, 2, "what the first life said");

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_put_life(t->d, TA, "s1", 2, first, sum,
						 &rev, &cur));
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_eq(cur, SENTINEL_U64, "current_revision out-parameter");
	expect_summary(t, TA, "s1", NULL);
	expect_second_life_untouched(t, m, 2);

	expect_ok(histd_driver_summary_put_life(t->d, TA, "s1", 2, second, sum,
						&rev, &cur));
	expect_eq(rev, 3, "revision after a put to the life that is there");
	expect_summary(t, TA, "s1", sum);
	histd_record_free(sum);
	tmsgs_free(m, 2);
}

static int durable(const ctest *t);
static void reopen(ctest *t);

/* How many of s1's messages a semantic search of model m1 for qv (2
 * dimensions) matches; *seq: the best one's. */
static size_t semantic_hits(ctest *t, const float *qv, uint64_t *seq)
{
	const char *const ids[] = { "s1" };
	histd_search_query q = {
		.tenant = TA, .session_ids = ids, .n_session_ids = 1,
		.mode = HISTD_SEARCH_SEMANTIC, .vector = qv, .dim = 2,
		.model = "m1", .k = 10,
	};
	histd_search_result r;
	size_t n;

	memset(&r, 0, sizeof(r));
	expect_ok(histd_driver_search(t->d, &q, &r));
	n = r.n;
	if (n)
		*seq = r.records.v[0].seq;
	histd_search_result_clear(&r);
	return n;
}

/* An embedding put for one life (what the embedder does, with a vector
 * computed from that life's message text) is not stored in a session
 * created again under the id, whose messages have the same seqs:
 * ENOTFOUND and no vector, not even over one the new life holds at that
 * seq; the life that is there takes it, and a restart replays just that. */
static void embedding_put_of_an_earlier_life_leaves_the_new_one(void **state)
{
	ctest *t = *state;
	/* Orthogonal: a search for one never matches the other. */
	static const float old_v[2] = { 1, 0 }, new_v[2] = { 0, 1 };
	uint64_t first, second, seq = 0;
	tmsg m[2];

	if (t->d->version < 7 || !t->d->embedding_put_life)
		skip();
	tmsg_texts(m, 2, "a life");
	two_lives_at_revision_2(t, m, 2, &first, &second);

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_embedding_put_life(t->d, TA, "s1", first, 1,
						   "m1", old_v, 2));
	expect_eq(semantic_hits(t, old_v, &seq), 0,
		  "hits of the earlier life's vector");

	expect_ok(histd_driver_embedding_put_life(t->d, TA, "s1", second, 2,
						  "m1", new_v, 2));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_embedding_put_life(t->d, TA, "s1", first, 2,
						   "m1", old_v, 2));
	for (int restarted = 0; restarted < 2; restarted++) {
		if (restarted) {
			if (!durable(t))
				break;
			reopen(t);
		}
		expect_eq(semantic_hits(t, old_v, &seq), 0,
			  "hits of the earlier life's vector");
		expect_eq(semantic_hits(t, new_v, &seq), 1,
			  "hits of the new life's vector");
		expect_eq(seq, 2, "seq of the new life's hit");
	}
	expect_second_life_untouched(t, m, 2);
	tmsgs_free(m, 2);
}

/* A fork from one life of its source (what ForkSession does, with the
 * labels it read of that life) is refused once the source was created
 * again under its id, even at the same revision: ENOTFOUND and no fork;
 * a fork from the life that is there is made. */
static void fork_of_an_earlier_life_creates_nothing(void **state)
{
	ctest *t = *state;
	histd_session in = sess_in(TA, "f1"), *out = SENTINEL_SESSION, *s;
	uint64_t first, second;
	tmsg m[2];

	if (t->d->version < 6 || !t->d->session_fork_life)
		skip();
	tmsg_texts(m, 2, "a life");
	two_lives_at_revision_2(t, m, 2, &first, &second);

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_fork_life(t->d, TA, "s1", first, 0, &in,
						  &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "f1", &s));
	expect_second_life_untouched(t, m, 2);

	expect_ok(histd_driver_session_fork_life(t->d, TA, "s1", second, 0, &in,
						 &out));
	expect_eq(out->last_seq, 2, "last_seq of the fork of the life there");
	histd_session_free(out);
	expect_messages(t, TA, "f1", 1, m, 2);
	tmsgs_free(m, 2);
}

/* A session deleted and created again under its id is another life: its
 * incarnation is greater, stays the same through every change of one life,
 * and every change notice names the life it was made to (Subscribe drops
 * an earlier life's late notices by it). */
static void session_created_again_is_another_life(void **state)
{
	ctest *t = *state;
	const enum histd_change_kind kinds[] = {
		HISTD_CHANGE_APPENDED, HISTD_CHANGE_CLEARED,
		HISTD_CHANGE_DELETED, HISTD_CHANGE_APPENDED,
	};
	histd_read q = { .tenant = TA, .session_id = "s1", .want_session = 1 };
	histd_read_result rr;
	histd_session *s;
	const change_copy **c;
	uint64_t first, second, cur = 0;
	size_t n;
	tmsg m, more;

	tmsg_text(&m, USER, "the first life");
	tmsg_text(&more, USER, "the second life");
	create_ok(t, TA, "s1");
	s = get_ok(t, TA, "s1");
	first = s->incarnation;
	histd_session_free(s);
	if (first == 0)
		fail_msg("a session's incarnation is 0");
	append_ok(t, TA, "s1", &m, 1, 1);
	clear_ok(t, TA, "s1", 3, 1);
	s = get_ok(t, TA, "s1");
	expect_eq(s->incarnation, first, "incarnation after append and clear");
	histd_session_free(s);
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	assert_non_null(rr.session);
	expect_eq(rr.session->incarnation, first, "incarnation of a read");
	histd_read_result_clear(&rr);

	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));
	create_ok(t, TA, "s1");
	s = get_ok(t, TA, "s1");
	second = s->incarnation;
	histd_session_free(s);
	if (second <= first)
		fail_msg("the session created again has incarnation %llu, "
			 "not above the first life's %llu",
			 (unsigned long long)second, (unsigned long long)first);
	append_ok(t, TA, "s1", &more, 1, 1);

	n = changes_wait(t, TA, "s1", N_OF(kinds), 0, &c);
	expect_eq(n, N_OF(kinds), "changes of s1");
	for (size_t i = 0; i < n; i++) {
		expect_eq(c[i]->kind, kinds[i], "change kind");
		expect_eq(c[i]->incarnation, i < 3 ? first : second,
			  "incarnation of the change");
	}
	free(c);
	tmsg_free(&m);
	tmsg_free(&more);
}

static void session_recreated_after_delete_starts_again_at_seq_1(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_read_result rr;
	histd_record *sum;
	uint64_t cur = 0;
	tmsg m[3], again[2];

	create_ok(t, TA, "s1");
	tmsg_calls(&m[0], "looking", IDS("c1"));
	tmsg_results(&m[1], IDS("c1"));
	tmsg_text(&m[2], USER, "thanks");
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000000,
			      m, 3, &res));
	sum = summary_new(1, 3, "the old conversation");
	summary_put_ok(t, TA, "s1", sum);
	histd_record_free(sum);
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));

	create_ok(t, TA, "s1");
	expect_state(t, TA, "s1", (want_state){ .revision = 1 });
	read_all(t, TA, "s1", &rr);
	expect_eq(rr.records.n, 0, "messages of the new session");
	expect_eq(rr.last_seq, 0, "last_seq");
	expect_eq(rr.cleared_to_seq, 0, "cleared_to_seq");
	histd_read_result_clear(&rr);
	expect_summary(t, TA, "s1", NULL);

	/* The same request under the same key: the old key is gone, and so
	 * is the old tool call index (c1 may be issued again). */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 10,
			      T0 + 1000000, m, 3, &res));
	expect_eq(res.replayed, 0, "replayed");
	expect_eq(res.first_seq, 1, "first_seq");
	expect_eq(res.last_seq, 3, "last_seq");
	expect_eq(res.revision, 2, "revision");
	tmsg_text(&again[0], USER, "again");
	tmsg_results(&again[1], IDS("c1"));
	expect_err(HISTD_EINVALID,
		   append_msgs(t, TA, "s1", 0, &again[1], 1, &res));
	append_ok(t, TA, "s1", again, 1, 4);
	tmsgs_free(m, 3);
	tmsgs_free(again, 2);
}

static void session_delete_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	uint64_t cur = SENTINEL_U64;
	histd_session *s;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "hi");
	append_ok(t, TA, "s1", &m, 1, 1);
	expect_err(HISTD_ECONFLICT,
		   histd_driver_session_delete(t->d, TA, "s1", 1, &cur));
	expect_eq(cur, 2, "current_revision");
	s = get_ok(t, TA, "s1");
	expect_eq(s->message_count, 1, "message_count after a conflict");
	histd_session_free(s);
	expect_messages(t, TA, "s1", 1, &m, 1);
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 2, &cur));
	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "s1", &s));
	tmsg_free(&m);
}

/* ---------------------------------------------------------------------- */
/* Fork                                                                    */

/* The source of fork tests: "src" with config, labels and keys, and six
 * messages appended as batches of 2, 1 and 3 (seqs 1..6, revision 4). */
typedef struct fork_src {
	tmsg m[6];
	uint8_t *cfg;
	size_t cfg_len;
} fork_src;

static void fork_src_make(ctest *t, fork_src *f)
{
	histd_kv keys[] = { { "chat", "src" } };
	histd_kv labels[] = { { "env", "prod" } };
	histd_session in = sess_in(TA, "src"), *out = NULL;

	f->cfg = config_new("window", &f->cfg_len);
	in.context_keys = keys;
	in.n_context_keys = 1;
	in.labels = labels;
	in.n_labels = 1;
	in.config = f->cfg;
	in.config_len = f->cfg_len;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
	tmsg_texts(f->m, 6, "source");
	append_ok(t, TA, "src", &f->m[0], 2, 1);
	append_ok(t, TA, "src", &f->m[2], 1, 3);
	append_ok(t, TA, "src", &f->m[3], 3, 4);
}

static void fork_src_free(fork_src *f)
{
	tmsgs_free(f->m, 6);
	free(f->cfg);
}

static histd_session *fork_ok(ctest *t, const char *src, uint64_t up_to_seq,
			      const char *id)
{
	histd_session in = sess_in(TA, id), *out = NULL;

	expect_ok(histd_driver_session_fork(t->d, TA, src, up_to_seq, &in,
					    &out));
	assert_non_null(out);
	return out;
}

static void session_fork_copies_messages_up_to_seq_with_their_seqs(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "fork" } };
	histd_kv labels[] = { { "branch", "b1" }, { "env", "test" } };
	histd_session in = sess_in(TA, "f4"), *out = NULL, *s;
	histd_session *r = NULL;
	int created = 42;
	fork_src f;

	fork_src_make(t, &f);
	in.context_keys = keys;
	in.n_context_keys = 1;
	in.labels = labels;
	in.n_labels = 2;
	in.created_at_us = T0 + 99;
	expect_ok(histd_driver_session_fork(t->d, TA, "src", 4, &in, &out));
	s = get_ok(t, TA, "f4");
	for (int i = 0; i < 2; i++) {
		histd_session *x = i ? s : out;

		assert_string_equal(x->tenant, TA);
		assert_string_equal(x->id, "f4");
		expect_kv(x->labels, x->n_labels, labels, 2, "fork labels");
		expect_kv(x->context_keys, x->n_context_keys, keys, 1,
			  "fork context_keys");
		/* The config is the source's. */
		expect_config(x, f.cfg, f.cfg_len);
		expect_eq(x->created_at_us, T0 + 99, "fork created_at_us");
		expect_counters(x, (want_state){
			.revision = 1, .last_seq = 4, .message_count = 4,
			.token_total = tokens_of(f.m, 4),
			.bytes_total = bytes_of(f.m, 4, 1), .first_seq = 1 });
	}
	histd_session_free(out);
	histd_session_free(s);
	expect_messages(t, TA, "f4", 1, f.m, 4);

	/* Its context keys are the fork's. */
	in = sess_in(TA, "unused");
	in.context_keys = keys;
	in.n_context_keys = 1;
	expect_ok(histd_driver_session_resolve(t->d, &in, &r, &created));
	expect_eq(created, 0, "created");
	assert_string_equal(r->id, "f4");
	histd_session_free(r);
	fork_src_free(&f);
}

static void session_fork_with_up_to_seq_0_copies_everything(void **state)
{
	ctest *t = *state;
	histd_session *out;
	fork_src f;
	tmsg m;

	fork_src_make(t, &f);
	out = fork_ok(t, "src", 0, "all");
	expect_counters(out, (want_state){
		.revision = 1, .last_seq = 6, .message_count = 6,
		.token_total = tokens_of(f.m, 6),
		.bytes_total = bytes_of(f.m, 6, 1), .first_seq = 1 });
	histd_session_free(out);
	expect_messages(t, TA, "all", 1, f.m, 6);
	tmsg_text(&m, USER, "more");
	append_ok(t, TA, "all", &m, 1, 7);
	tmsg_free(&m);
	fork_src_free(&f);
}

static void session_fork_beyond_last_seq_continues_after_last_seq(void **state)
{
	ctest *t = *state;
	histd_session *out;
	fork_src f;
	tmsg m;

	fork_src_make(t, &f);
	out = fork_ok(t, "src", 100, "far");
	expect_eq(out->last_seq, 6, "last_seq of a fork beyond the end");
	expect_eq(out->message_count, 6, "message_count");
	histd_session_free(out);
	tmsg_text(&m, USER, "more");
	append_ok(t, TA, "far", &m, 1, 7);
	tmsg_free(&m);
	fork_src_free(&f);
}

static void session_fork_appends_continue_after_up_to_seq(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_read_result rr;
	histd_session *out;
	fork_src f;
	tmsg m[2];

	fork_src_make(t, &f);
	out = fork_ok(t, "src", 4, "f4");
	histd_session_free(out);
	tmsg_text(&m[0], USER, "in the fork");
	tmsg_text(&m[1], USER, "in the source");
	res = append_ok(t, TA, "f4", &m[0], 1, 5);
	expect_eq(res.revision, 2, "fork revision after an append");
	res = append_ok(t, TA, "src", &m[1], 1, 7);
	expect_eq(res.revision, 5, "source revision after an append");

	/* Each has the common part and its own continuation. */
	read_all(t, TA, "f4", &rr);
	expect_eq(rr.records.n, 5, "messages of the fork");
	rr.records.n = 4;
	expect_records(&rr.records, 1, f.m, 4);
	expect_record(&rr.records.v[4], 5, &m[0]);
	rr.records.n = 5;
	histd_read_result_clear(&rr);
	read_all(t, TA, "src", &rr);
	expect_eq(rr.records.n, 7, "messages of the source");
	rr.records.n = 6;
	expect_records(&rr.records, 1, f.m, 6);
	expect_record(&rr.records.v[6], 7, &m[1]);
	rr.records.n = 7;
	histd_read_result_clear(&rr);
	tmsgs_free(m, 2);
	fork_src_free(&f);
}

static void session_fork_copies_summaries_up_to_seq(void **state)
{
	ctest *t = *state;
	histd_record *s2, *s5;
	histd_session *out;
	fork_src f;

	fork_src_make(t, &f);
	s2 = summary_new(1, 2, "the first two");
	s5 = summary_new(1, 5, "the first five");
	summary_put_ok(t, TA, "src", s2);
	summary_put_ok(t, TA, "src", s5);

	out = fork_ok(t, "src", 4, "f4");
	expect_eq(out->summary_count, 1, "summaries of a fork at 4");
	histd_session_free(out);
	expect_summary(t, TA, "f4", s2);

	out = fork_ok(t, "src", 5, "f5");
	expect_eq(out->summary_count, 2, "summaries of a fork at 5");
	histd_session_free(out);
	expect_summary(t, TA, "f5", s5);

	out = fork_ok(t, "src", 1, "f1");
	expect_eq(out->summary_count, 0, "summaries of a fork at 1");
	histd_session_free(out);
	expect_summary(t, TA, "f1", NULL);

	out = fork_ok(t, "src", 0, "f0");
	expect_eq(out->summary_count, 2, "summaries of a whole fork");
	histd_session_free(out);
	expect_summary(t, TA, "f0", s5);

	histd_record_free(s2);
	histd_record_free(s5);
	fork_src_free(&f);
}

static void session_fork_copies_tool_call_state(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_record *rec = NULL;
	histd_session *out;
	tmsg src[4], r1, r2, c1;

	/* seq 1 user, 2 calls c1 c2, 3 answers c1, 4 user. */
	create_ok(t, TA, "src");
	tmsg_text(&src[0], USER, "look both up");
	tmsg_calls(&src[1], "looking", IDS("c1", "c2"));
	tmsg_results(&src[2], IDS("c1"));
	tmsg_text(&src[3], USER, "and?");
	append_ok(t, TA, "src", src, 4, 1);
	tmsg_results(&r1, IDS("c1"));
	tmsg_results(&r2, IDS("c2"));
	tmsg_calls(&c1, "again", IDS("c1"));

	/* At 3: c1 answered, c2 open, both issued. */
	out = fork_ok(t, "src", 3, "f3");
	histd_session_free(out);
	expect_ok(histd_driver_tool_result(t->d, TA, "f3", "c1", &rec));
	expect_record(rec, 3, &src[2]);
	histd_record_free(rec);
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "f3", 0, &r1, 1, &res));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "f3", 0, &c1, 1, &res));
	append_ok(t, TA, "f3", &r2, 1, 4);

	/* At 2: both open. */
	out = fork_ok(t, "src", 2, "f2");
	histd_session_free(out);
	rec = SENTINEL_RECORD;
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "f2", "c1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	append_ok(t, TA, "f2", &r1, 1, 3);

	/* At 1: neither issued. */
	out = fork_ok(t, "src", 1, "f1");
	histd_session_free(out);
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "f1", 0, &r1, 1, &res));
	append_ok(t, TA, "f1", &c1, 1, 2);

	/* The source's own state is its own: c2 is still open there. */
	append_ok(t, TA, "src", &r2, 1, 5);
	expect_ok(histd_driver_tool_result(t->d, TA, "src", "c2", &rec));
	expect_record(rec, 5, &r2);
	histd_record_free(rec);

	tmsgs_free(src, 4);
	tmsg_free(&r1);
	tmsg_free(&r2);
	tmsg_free(&c1);
}

static void session_fork_leaves_the_source_untouched(void **state)
{
	ctest *t = *state;
	histd_session *before, *after, *out;
	uint64_t rev, cleared, cur;
	fork_src f;
	tmsg m;

	fork_src_make(t, &f);
	before = get_ok(t, TA, "src");
	out = fork_ok(t, "src", 3, "f3");
	histd_session_free(out);
	tmsg_text(&m, USER, "only in the fork");
	append_ok(t, TA, "f3", &m, 1, 4);
	expect_ok(histd_driver_clear(t->d, TA, "f3", 0, &rev, &cleared, &cur));
	expect_ok(histd_driver_session_delete(t->d, TA, "f3", 0, &cur));

	after = get_ok(t, TA, "src");
	expect_counters(after, (want_state){
		.revision = before->revision, .last_seq = before->last_seq,
		.cleared_to_seq = before->cleared_to_seq,
		.message_count = before->message_count,
		.token_total = before->token_total,
		.bytes_total = before->bytes_total,
		.first_seq = before->first_seq,
		.summary_count = before->summary_count });
	expect_eq(after->updated_at_us, before->updated_at_us,
		  "source updated_at_us");
	expect_messages(t, TA, "src", 1, f.m, 6);
	histd_session_free(before);
	histd_session_free(after);
	tmsg_free(&m);
	fork_src_free(&f);
}

static void session_fork_of_a_cleared_source_keeps_cleared_to_seq(void **state)
{
	ctest *t = *state;
	histd_session *out;
	fork_src f;
	tmsg m[2], more;

	fork_src_make(t, &f);
	clear_ok(t, TA, "src", 5, 6);
	tmsg_texts(m, 2, "after the clear");
	append_ok(t, TA, "src", m, 2, 7);

	/* Everything: 7 and 8, cleared to 6. */
	out = fork_ok(t, "src", 0, "f0");
	expect_counters(out, (want_state){
		.revision = 1, .last_seq = 8, .cleared_to_seq = 6,
		.message_count = 2, .token_total = tokens_of(m, 2),
		.bytes_total = bytes_of(m, 2, 7), .first_seq = 7 });
	histd_session_free(out);
	expect_messages(t, TA, "f0", 7, m, 2);

	/* Inside the cleared part: nothing, and last_seq there. */
	out = fork_ok(t, "src", 3, "f3");
	expect_counters(out, (want_state){
		.revision = 1, .last_seq = 3, .cleared_to_seq = 3 });
	histd_session_free(out);
	expect_messages(t, TA, "f3", 1, NULL, 0);
	tmsg_text(&more, USER, "more");
	append_ok(t, TA, "f3", &more, 1, 4);

	tmsg_free(&more);
	tmsgs_free(m, 2);
	fork_src_free(&f);
}

static void session_fork_of_unknown_source_is_not_found(void **state)
{
	ctest *t = *state;
	histd_session in = sess_in(TA, "f"), *out = SENTINEL_SESSION;

	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_fork(t->d, TA, "nobody", 0, &in, &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TA, "f", &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
}

static void session_fork_onto_a_taken_id_is_exists(void **state)
{
	ctest *t = *state;
	histd_session in = sess_in(TA, "taken"), *out = SENTINEL_SESSION;
	fork_src f;

	fork_src_make(t, &f);
	create_ok(t, TA, "taken");
	expect_err(HISTD_EEXISTS,
		   histd_driver_session_fork(t->d, TA, "src", 0, &in, &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_state(t, TA, "taken", (want_state){ .revision = 1 });
	expect_err(HISTD_EEXISTS,
		   histd_driver_session_fork(t->d, TA, "src", 0,
					     (histd_session[]){ sess_in(TA, "src") },
					     &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	fork_src_free(&f);
}

/* ---------------------------------------------------------------------- */
/* Tenants                                                                 */

static void other_tenants_session_is_not_found_for_every_operation(void **state)
{
	ctest *t = *state;
	histd_kv keys[] = { { "chat", "1" } };
	histd_kv labels[] = { { "env", "x" } };
	histd_session *s = SENTINEL_SESSION, *before, *after;
	histd_session in = sess_in(TB, "fork");
	histd_record *rec = SENTINEL_RECORD, *sum;
	histd_append_result res;
	histd_read_result rr;
	histd_session_list l;
	histd_list lq;
	histd_read q;
	uint64_t rev = SENTINEL_U64, cleared = SENTINEL_U64, cur = SENTINEL_U64;
	tmsg m[2];

	create_with_keys(t, TA, "s1", keys, 1);
	tmsg_calls(&m[0], "looking", IDS("c1"));
	tmsg_results(&m[1], IDS("c1"));
	append_ok(t, TA, "s1", m, 2, 1);
	sum = summary_new(1, 2, "summary");
	summary_put_ok(t, TA, "s1", sum);
	before = get_ok(t, TA, "s1");

	expect_err(HISTD_ENOTFOUND, histd_driver_session_get(t->d, TB, "s1", &s));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_update(t->d, TB, "s1", 0, labels, 1,
					       NULL, 0, T0, &s, &cur));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_fork(t->d, TB, "s1", 0, &in, &s));
	assert_ptr_equal(s, SENTINEL_SESSION);
	expect_err(HISTD_ENOTFOUND, append_msgs(t, TB, "s1", 0, m, 1, &res));
	memset(&q, 0, sizeof(q));
	q.tenant = TB;
	q.session_id = "s1";
	memset(&rr, 0, sizeof(rr));
	expect_err(HISTD_ENOTFOUND, histd_driver_read(t->d, &q, &rr));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TB, "s1", "c1", &rec));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_get(t->d, TB, "s1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_put(t->d, TB, "s1", 0, sum, &rev, &cur));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_clear(t->d, TB, "s1", 0, &rev, &cleared, &cur));
	expect_err(HISTD_ENOTFOUND,
		   append_replace(t, TB, "s1", 0, m, 1, &res, &cleared));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_session_delete(t->d, TB, "s1", 0, &cur));
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_eq(cleared, SENTINEL_U64, "cleared_to_seq out-parameter");
	expect_eq(cur, SENTINEL_U64, "current_revision out-parameter");

	memset(&lq, 0, sizeof(lq));
	lq.tenant = TB;
	lq.limit = 10;
	expect_ok(histd_driver_session_list(t->d, &lq, &l));
	expect_eq(l.n, 0, "tenant-b sessions");
	histd_session_list_free(&l);

	/* Nothing of tenant-a's changed. */
	after = get_ok(t, TA, "s1");
	expect_counters(after, (want_state){
		.revision = before->revision, .last_seq = 2,
		.message_count = 2, .token_total = before->token_total,
		.bytes_total = before->bytes_total, .first_seq = 1,
		.summary_count = 1 });
	histd_session_free(before);
	histd_session_free(after);
	expect_messages(t, TA, "s1", 1, m, 2);
	histd_record_free(sum);
	tmsgs_free(m, 2);
}

/* ---------------------------------------------------------------------- */
/* Append                                                                  */

static void append_assigns_consecutive_seqs_from_1(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m[6];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 6, "message");
	res = append_ok(t, TA, "s1", &m[0], 1, 1);
	expect_eq(res.revision, 2, "revision");
	res = append_ok(t, TA, "s1", &m[1], 3, 2);
	expect_eq(res.revision, 3, "revision");
	res = append_ok(t, TA, "s1", &m[4], 2, 5);
	expect_eq(res.revision, 4, "revision");
	expect_messages(t, TA, "s1", 1, m, 6);
	tmsgs_free(m, 6);
}

static void append_adds_exactly_one_revision_per_batch(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m[MAX_BATCH];
	size_t i;

	create_ok(t, TA, "s1");
	tmsg_texts(m, MAX_BATCH, "batch");
	res = append_ok(t, TA, "s1", m, MAX_BATCH, 1);
	expect_eq(res.revision, 2, "revision after a batch of 16");
	for (i = 0; i < 5; i++) {
		res = append_ok(t, TA, "s1", &m[i], 1, MAX_BATCH + 1 + i);
		expect_eq(res.revision, 3 + i, "revision");
	}
	expect_eq(revision_of(t, TA, "s1"), 7, "stored revision");
	tmsgs_free(m, MAX_BATCH);
}

static void append_keeps_exact_stats(void **state)
{
	ctest *t = *state;
	tmsg m[8];
	size_t i;

	create_ok(t, TA, "s1");
	tmsg_text(&m[0], HISTD__V1__ROLE__ROLE_SYSTEM, "you are terse");
	tmsg_calls(&m[1], "checking", IDS("c1", "c2"));
	tmsg_results(&m[2], IDS("c1", "c2"));
	tmsg_texts(&m[3], 5, "talk");
	append_ok(t, TA, "s1", m, 3, 1);
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 3, .message_count = 3,
		.token_total = tokens_of(m, 3), .bytes_total = bytes_of(m, 3, 1),
		.first_seq = 1 });
	for (i = 3; i < 8; i++)
		append_ok(t, TA, "s1", &m[i], 1, i + 1);
	expect_state(t, TA, "s1", (want_state){
		.revision = 7, .last_seq = 8, .message_count = 8,
		.token_total = tokens_of(m, 8), .bytes_total = bytes_of(m, 8, 1),
		.first_seq = 1 });
	tmsgs_free(m, 8);
}

static void append_batch_with_one_invalid_tool_ref_appends_nothing(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_read_result rr;
	tmsg first, batch[4];

	create_ok(t, TA, "s1");
	tmsg_text(&first, USER, "start");
	append_ok(t, TA, "s1", &first, 1, 1);

	/* Message 3 answers a call nobody issued. */
	tmsg_calls(&batch[0], "looking", IDS("c1"));
	tmsg_results(&batch[1], IDS("c1"));
	tmsg_results(&batch[2], IDS("c-unknown"));
	tmsg_text(&batch[3], USER, "after");
	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, batch, 4, &res));
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(res.last_seq, SENTINEL_U64, "last_seq out-parameter");
	expect_eq(res.revision, SENTINEL_U64, "revision out-parameter");

	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 1, .message_count = 1,
		.token_total = first.tokens, .bytes_total = bytes_of(&first, 1, 1),
		.first_seq = 1 });
	read_all(t, TA, "s1", &rr);
	expect_records(&rr.records, 1, &first, 1);
	expect_eq(rr.revision, 2, "read revision");
	histd_read_result_clear(&rr);

	/* c1 was not issued by the failed batch: it is free, and unanswerable. */
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &batch[1], 1, &res));
	append_ok(t, TA, "s1", batch, 2, 2);
	/* Reported: the two appends that were made, and nothing between. */
	expect_change_revisions(t, TA, "s1", 2, 3);

	tmsg_free(&first);
	tmsgs_free(batch, 4);
}

static void append_to_unknown_session_is_not_found(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m;

	tmsg_text(&m, USER, "anyone?");
	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_ENOTFOUND, append_msgs(t, TA, "nobody", 0, &m, 1, &res));
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(res.revision, SENTINEL_U64, "revision out-parameter");
	expect_err(HISTD_ENOTFOUND,
		   append_full(t, TA, "nobody", 0, "k", 1, T0, T0 + 100, &m, 1,
			       &res));
	tmsg_free(&m);
}

static void append_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m[3];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 3, "cas");
	expect_ok(append_msgs(t, TA, "s1", 1, &m[0], 1, &res));
	expect_eq(res.revision, 2, "revision");

	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_ECONFLICT, append_msgs(t, TA, "s1", 1, &m[1], 2, &res));
	expect_eq(res.current_revision, 2, "current_revision");
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(res.last_seq, SENTINEL_U64, "last_seq out-parameter");
	expect_eq(res.revision, SENTINEL_U64, "revision out-parameter");
	expect_err(HISTD_ECONFLICT, append_msgs(t, TA, "s1", 3, &m[1], 2, &res));
	expect_eq(res.current_revision, 2, "current_revision (ahead)");
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 1, .message_count = 1,
		.token_total = m[0].tokens, .bytes_total = bytes_of(m, 1, 1),
		.first_seq = 1 });

	memset(&res, 0, sizeof(res));
	expect_ok(append_msgs(t, TA, "s1", 2, &m[1], 2, &res));
	expect_eq(res.first_seq, 2, "first_seq");
	expect_eq(res.last_seq, 3, "last_seq");
	expect_eq(res.revision, 3, "revision");
	expect_messages(t, TA, "s1", 1, m, 3);
	expect_change_revisions(t, TA, "s1", 2, 3);
	tmsgs_free(m, 3);
}

static void append_retry_with_same_idempotency_key_is_replayed(void **state)
{
	ctest *t = *state;
	histd_append_result first, res;
	tmsg m[2], other;

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "once");
	tmsg_text(&other, USER, "in between");
	memset(&first, 0, sizeof(first));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000, m, 2,
			      &first));
	expect_eq(first.first_seq, 1, "first_seq");
	expect_eq(first.last_seq, 2, "last_seq");
	expect_eq(first.revision, 2, "revision");
	expect_eq(first.replayed, 0, "replayed");
	append_ok(t, TA, "s1", &other, 1, 3);

	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 500, T0 + 1500,
			      m, 2, &res));
	expect_eq(res.replayed, 1, "replayed");
	expect_eq(res.first_seq, 1, "replayed first_seq");
	expect_eq(res.last_seq, 2, "replayed last_seq");
	expect_eq(res.revision, 2, "replayed revision");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 3, .message_count = 3,
		.token_total = tokens_of(m, 2) + other.tokens,
		.bytes_total = bytes_of(m, 2, 1) + stored_len(&other, 3),
		.first_seq = 1 });
	/* The replay reported nothing. */
	append_ok(t, TA, "s1", &other, 1, 4);
	expect_change_revisions(t, TA, "s1", 2, 4);
	tmsgs_free(m, 2);
	tmsg_free(&other);
}

static void append_same_idempotency_key_with_other_request_is_precondition(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "keyed");
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000,
			      &m[0], 1, &res));
	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_EPRECONDITION,
		   append_full(t, TA, "s1", 0, "key-1", 8, T0 + 1, T0 + 1001,
			       &m[1], 1, &res));
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(res.revision, SENTINEL_U64, "revision out-parameter");
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 1, .message_count = 1,
		.token_total = m[0].tokens, .bytes_total = bytes_of(m, 1, 1),
		.first_seq = 1 });
	/* The key still means the first request. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 2, T0 + 1002,
			      &m[0], 1, &res));
	expect_eq(res.replayed, 1, "replayed");
	tmsgs_free(m, 2);
}

static void append_idempotency_key_is_checked_before_revision(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "keyed");
	expect_ok(append_full(t, TA, "s1", 1, "key-1", 7, T0, T0 + 1000,
			      &m[0], 1, &res));
	append_ok(t, TA, "s1", &m[1], 1, 2);

	/* Expected revision 1 is stale now; the retry is still a replay. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 1, "key-1", 7, T0 + 1, T0 + 1001,
			      &m[0], 1, &res));
	expect_eq(res.replayed, 1, "replayed");
	expect_eq(res.first_seq, 1, "replayed first_seq");
	expect_eq(res.revision, 2, "replayed revision");
	/* And another request under the key is a precondition failure. */
	expect_err(HISTD_EPRECONDITION,
		   append_full(t, TA, "s1", 1, "key-1", 9, T0 + 2, T0 + 1002,
			       &m[1], 1, &res));
	expect_eq(revision_of(t, TA, "s1"), 3, "revision");
	tmsgs_free(m, 2);
}

static void append_expired_idempotency_key_is_forgotten(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "keyed");
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000, &m, 1,
			      &res));
	expect_ok(append_full(t, TA, "s1", 0, "key-2", 7, T0, T0 + 1000, &m, 1,
			      &res));

	/* Before expiry: a replay. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 500, T0 + 1500,
			      &m, 1, &res));
	expect_eq(res.replayed, 1, "replayed before expiry");
	expect_eq(res.first_seq, 1, "replayed first_seq");

	/* After: a new append, remembered anew. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 2000, T0 + 3000,
			      &m, 1, &res));
	expect_eq(res.replayed, 0, "replayed after expiry");
	expect_eq(res.first_seq, 3, "first_seq after expiry");
	expect_eq(res.revision, 4, "revision after expiry");
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 2500, T0 + 3500,
			      &m, 1, &res));
	expect_eq(res.replayed, 1, "replayed after the new append");
	expect_eq(res.first_seq, 3, "replayed first_seq");
	expect_eq(res.revision, 4, "replayed revision");

	/* An expired key with another request is no precondition failure. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-2", 8, T0 + 2000, T0 + 3000,
			      &m, 1, &res));
	expect_eq(res.replayed, 0, "replayed");
	expect_eq(res.first_seq, 4, "first_seq");
	tmsg_free(&m);
}

static void append_idempotency_key_of_a_failed_append_is_not_remembered(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "keyed");
	expect_err(HISTD_ECONFLICT,
		   append_full(t, TA, "s1", 5, "key-1", 7, T0, T0 + 1000, &m, 1,
			       &res));
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 1, "key-1", 7, T0 + 1, T0 + 1001,
			      &m, 1, &res));
	expect_eq(res.replayed, 0, "replayed");
	expect_eq(res.first_seq, 1, "first_seq");
	tmsg_free(&m);
}

static void append_idempotency_keys_are_per_session(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m;

	create_ok(t, TA, "s1");
	create_ok(t, TA, "s2");
	create_ok(t, TB, "s1");
	tmsg_text(&m, USER, "keyed");
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000, &m, 1,
			      &res));
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s2", 0, "key-1", 8, T0, T0 + 1000, &m, 1,
			      &res));
	expect_eq(res.replayed, 0, "replayed in another session");
	expect_eq(res.first_seq, 1, "first_seq in another session");
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TB, "s1", 0, "key-1", 7, T0, T0 + 1000, &m, 1,
			      &res));
	expect_eq(res.replayed, 0, "replayed in another tenant");
	tmsg_free(&m);
}

static void append_without_idempotency_key_always_appends(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "same");
	expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0, 0, &m, 1, &res));
	expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0, 0, &m, 1, &res));
	expect_eq(res.first_seq, 2, "second append, key NULL");
	expect_ok(append_full(t, TA, "s1", 0, "", 7, T0, T0 + 1000, &m, 1, &res));
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "", 7, T0, T0 + 1000, &m, 1, &res));
	expect_eq(res.replayed, 0, "replayed with key \"\"");
	expect_eq(res.first_seq, 4, "fourth append, key \"\"");
	tmsg_free(&m);
}

/* ---------------------------------------------------------------------- */
/* Tool call references                                                    */

static void tool_result_for_unknown_call_is_invalid(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg r, c;
	tmsg later[2];

	create_ok(t, TA, "s1");
	tmsg_results(&r, IDS("c-unknown"));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &r, 1, &res));
	/* A result before its call in the batch answers nothing. */
	tmsg_results(&later[0], IDS("c9"));
	tmsg_calls(&later[1], "calling late", IDS("c9"));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, later, 2, &res));
	expect_state(t, TA, "s1", (want_state){ .revision = 1 });
	/* A call issued in another session does not count either. */
	create_ok(t, TA, "s2");
	tmsg_calls(&c, "calling", IDS("c-unknown"));
	append_ok(t, TA, "s2", &c, 1, 1);
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &r, 1, &res));
	tmsg_free(&r);
	tmsg_free(&c);
	tmsgs_free(later, 2);
}

static void tool_call_answered_twice_is_invalid(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg c1, r1, twice[3], c2;

	create_ok(t, TA, "s1");
	tmsg_calls(&c1, "calling", IDS("c1"));
	tmsg_results(&r1, IDS("c1"));
	append_ok(t, TA, "s1", &c1, 1, 1);
	append_ok(t, TA, "s1", &r1, 1, 2);
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &r1, 1, &res));

	/* Twice within one batch: nothing appended, c2 not issued. */
	tmsg_calls(&twice[0], "calling", IDS("c2"));
	tmsg_results(&twice[1], IDS("c2"));
	tmsg_results(&twice[2], IDS("c2"));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, twice, 3, &res));
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 2, .message_count = 2,
		.token_total = c1.tokens + r1.tokens,
		.bytes_total = stored_len(&c1, 1) + stored_len(&r1, 2),
		.first_seq = 1 });
	tmsg_calls(&c2, "calling", IDS("c2"));
	append_ok(t, TA, "s1", &c2, 1, 3);
	tmsg_free(&c1);
	tmsg_free(&r1);
	tmsg_free(&c2);
	tmsgs_free(twice, 3);
}

static void tool_call_id_reused_is_invalid(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	tmsg c1, r1, pair[2], dup;

	create_ok(t, TA, "s1");
	tmsg_calls(&c1, "calling", IDS("c1"));
	tmsg_results(&r1, IDS("c1"));
	append_ok(t, TA, "s1", &c1, 1, 1);
	/* While open. */
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &c1, 1, &res));
	append_ok(t, TA, "s1", &r1, 1, 2);
	/* And once answered. */
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &c1, 1, &res));

	/* Twice in one batch, and twice in one message. */
	tmsg_calls(&pair[0], "calling", IDS("c2"));
	tmsg_calls(&pair[1], "calling", IDS("c2"));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, pair, 2, &res));
	tmsg_calls(&dup, "calling", IDS("c3", "c3"));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &dup, 1, &res));
	expect_eq(revision_of(t, TA, "s1"), 3, "revision");
	append_ok(t, TA, "s1", pair, 1, 3);
	tmsg_free(&c1);
	tmsg_free(&r1);
	tmsg_free(&dup);
	tmsgs_free(pair, 2);
}

static void tool_call_and_result_in_one_batch_are_accepted(void **state)
{
	ctest *t = *state;
	histd_record *rec = NULL;
	tmsg m[5];

	create_ok(t, TA, "s1");
	tmsg_text(&m[0], USER, "look these up");
	tmsg_calls(&m[1], "looking", IDS("c1", "c2"));
	tmsg_results(&m[2], IDS("c2"));
	tmsg_results(&m[3], IDS("c1"));
	tmsg_text(&m[4], ASSISTANT, "found both");
	append_ok(t, TA, "s1", m, 5, 1);
	expect_messages(t, TA, "s1", 1, m, 5);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	expect_record(rec, 4, &m[3]);
	histd_record_free(rec);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c2", &rec));
	expect_record(rec, 3, &m[2]);
	histd_record_free(rec);
	tmsgs_free(m, 5);
}

static void tool_result_returns_the_message_holding_the_result(void **state)
{
	ctest *t = *state;
	histd_record *rec = NULL;
	tmsg m[4];

	create_ok(t, TA, "s1");
	tmsg_calls(&m[0], "looking", IDS("a", "b", "c"));
	tmsg_text(&m[1], USER, "meanwhile");
	tmsg_results(&m[2], IDS("b", "a"));
	tmsg_results(&m[3], IDS("c"));
	append_ok(t, TA, "s1", &m[0], 1, 1);
	append_ok(t, TA, "s1", &m[1], 1, 2);
	append_ok(t, TA, "s1", &m[2], 1, 3);
	append_ok(t, TA, "s1", &m[3], 1, 4);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "a", &rec));
	expect_record(rec, 3, &m[2]);
	histd_record_free(rec);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "b", &rec));
	expect_record(rec, 3, &m[2]);
	histd_record_free(rec);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c", &rec));
	expect_record(rec, 4, &m[3]);
	histd_record_free(rec);
	tmsgs_free(m, 4);
}

static void tool_result_of_unknown_or_unanswered_call_is_not_found(void **state)
{
	ctest *t = *state;
	histd_record *rec = SENTINEL_RECORD;
	tmsg c;

	create_ok(t, TA, "s1");
	tmsg_calls(&c, "looking", IDS("open"));
	append_ok(t, TA, "s1", &c, 1, 1);
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "open", &rec));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "never", &rec));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "nobody", "open", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	tmsg_free(&c);
}

/* ---------------------------------------------------------------------- */
/* Read                                                                    */

typedef struct read_case {
	uint64_t after_seq;
	uint32_t limit;
	uint32_t last_n;
	uint64_t want_first;     /* 0: no records */
	size_t want_n;
	int want_more;
} read_case;

static void expect_read(ctest *t, const char *id, const tmsg *m,
			uint64_t m_first_seq, const read_case *c)
{
	histd_read_result rr;
	histd_read q;

	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = id;
	q.after_seq = c->after_seq;
	q.limit = c->limit;
	q.last_n = c->last_n;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	if (rr.records.n != c->want_n || rr.has_more != c->want_more)
		fail_msg("read after_seq %llu limit %u last_n %u: %zu records "
			 "has_more %d, want %zu has_more %d",
			 (unsigned long long)c->after_seq, c->limit, c->last_n,
			 rr.records.n, rr.has_more, c->want_n, c->want_more);
	if (c->want_n)
		expect_records(&rr.records, c->want_first,
			       &m[c->want_first - m_first_seq], c->want_n);
	assert_null(rr.session);
	histd_read_result_clear(&rr);
}

static void read_pages_by_after_seq_and_limit(void **state)
{
	ctest *t = *state;
	const read_case cases[] = {
		{ .after_seq = 0, .limit = 3, .want_first = 1, .want_n = 3,
		  .want_more = 1 },
		{ .after_seq = 3, .limit = 3, .want_first = 4, .want_n = 3,
		  .want_more = 1 },
		{ .after_seq = 6, .limit = 3, .want_first = 7, .want_n = 3,
		  .want_more = 1 },
		{ .after_seq = 9, .limit = 3, .want_first = 10, .want_n = 1 },
		/* A page ending exactly at the last message. */
		{ .after_seq = 7, .limit = 3, .want_first = 8, .want_n = 3 },
		{ .after_seq = 0, .limit = 10, .want_first = 1, .want_n = 10 },
		{ .after_seq = 0, .limit = 9, .want_first = 1, .want_n = 9,
		  .want_more = 1 },
		/* limit 0: no limit. */
		{ .after_seq = 0, .limit = 0, .want_first = 1, .want_n = 10 },
		{ .after_seq = 4, .limit = 0, .want_first = 5, .want_n = 6 },
		{ .after_seq = 10, .limit = 5 },
		{ .after_seq = 50, .limit = 0 },
		/* Past what a signed 64-bit seq holds: still nothing. */
		{ .after_seq = (uint64_t)INT64_MAX + 1, .limit = 0 },
		{ .after_seq = UINT64_MAX, .limit = 3 },
	};
	histd_read_result rr;
	tmsg m[10];
	size_t i;

	create_ok(t, TA, "s1");
	tmsg_texts(m, 10, "paged");
	append_each(t, TA, "s1", m, 10, 1);
	for (i = 0; i < N_OF(cases); i++)
		expect_read(t, "s1", m, 1, &cases[i]);
	read_all(t, TA, "s1", &rr);
	expect_eq(rr.revision, 11, "read revision");
	expect_eq(rr.last_seq, 10, "read last_seq");
	expect_eq(rr.cleared_to_seq, 0, "read cleared_to_seq");
	histd_read_result_clear(&rr);
	tmsgs_free(m, 10);
}

static void read_last_n_returns_the_newest(void **state)
{
	ctest *t = *state;
	/* after_seq and limit are ignored with last_n. */
	const read_case cases[] = {
		{ .last_n = 3, .after_seq = 1, .limit = 1, .want_first = 8,
		  .want_n = 3 },
		{ .last_n = 1, .want_first = 10, .want_n = 1 },
		{ .last_n = 10, .want_first = 1, .want_n = 10 },
		{ .last_n = 50, .after_seq = 9, .want_first = 1, .want_n = 10 },
	};
	const read_case after_clear[] = {
		{ .last_n = 5, .want_first = 11, .want_n = 2 },
		{ .last_n = 1, .want_first = 12, .want_n = 1 },
	};
	tmsg m[12];
	size_t i;

	create_ok(t, TA, "s1");
	tmsg_texts(m, 12, "newest");
	append_ok(t, TA, "s1", m, 4, 1);
	append_ok(t, TA, "s1", &m[4], 6, 5);
	for (i = 0; i < N_OF(cases); i++)
		expect_read(t, "s1", m, 1, &cases[i]);
	clear_ok(t, TA, "s1", 4, 10);
	append_ok(t, TA, "s1", &m[10], 2, 11);
	for (i = 0; i < N_OF(after_clear); i++)
		expect_read(t, "s1", m, 1, &after_clear[i]);
	tmsgs_free(m, 12);
}

/* The framed size of a record, as histd_read.max_bytes counts it. */
static uint64_t framed(const histd_record *r)
{
	return 1 + histd_wire_varint_size(r->len) + r->len;
}

/* One read of session s1 with a byte budget: what `all` (the whole
 * session) says it keeps, the first (or with last_n the newest) `keep`,
 * and has_more; or, from a driver that does not honour the budget, the
 * read without it. */
static void expect_budgeted(ctest *t, const histd_read_result *all,
			    uint32_t last_n, uint64_t max_bytes, size_t keep)
{
	size_t n = last_n && last_n < all->records.n ? last_n : all->records.n;
	size_t first = last_n ? all->records.n - keep : 0;
	histd_read_result rr;
	histd_read q;

	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.last_n = last_n;
	q.max_bytes = max_bytes;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	if (rr.records.n == n && !rr.has_more && !t->fx->read_budget)
		keep = n, first = last_n ? all->records.n - n : 0;
	if (rr.records.n != keep || rr.has_more != (keep < n))
		fail_msg("read last_n %u max_bytes %llu: %zu records has_more "
			 "%d, want %zu has_more %d", last_n,
			 (unsigned long long)max_bytes, rr.records.n,
			 rr.has_more, keep, keep < n);
	for (size_t i = 0; i < keep; i++) {
		const histd_record *a = &all->records.v[first + i];
		const histd_record *b = &rr.records.v[i];

		if (a->seq != b->seq || a->len != b->len ||
		    memcmp(a->data, b->data, a->len) != 0)
			fail_msg("read max_bytes %llu: record %zu differs",
				 (unsigned long long)max_bytes, i);
	}
	histd_read_result_clear(&rr);
}

/* max_bytes keeps the first records (the newest with last_n) whose
 * framed sizes fit, at least one, and says with has_more that it left
 * some out; a page walk with it reads every message once. */
static void read_with_a_byte_budget_keeps_what_fits(void **state)
{
	ctest *t = *state;
	histd_read_result all, rr;
	uint64_t b3 = 0, b3_new = 0, after = 0, want = 1;
	histd_read q;
	tmsg m[10];
	size_t i;

	create_ok(t, TA, "s1");
	tmsg_texts(m, 10, "budgeted message, of some length");
	append_each(t, TA, "s1", m, 10, 1);
	read_all(t, TA, "s1", &all);
	assert_int_equal(all.records.n, 10);
	for (i = 0; i < 3; i++) {
		b3 += framed(&all.records.v[i]);
		b3_new += framed(&all.records.v[9 - i]);
	}
	/* Three fit, and most of a fourth. */
	expect_budgeted(t, &all, 0, b3 + framed(&all.records.v[3]) - 1, 3);
	expect_budgeted(t, &all, 0, b3, 3);
	expect_budgeted(t, &all, 10, b3_new + framed(&all.records.v[6]) - 1, 3);
	expect_budgeted(t, &all, 3, b3_new, 3);
	/* Less than one: one, all the same. */
	expect_budgeted(t, &all, 0, 1, 1);
	expect_budgeted(t, &all, 10, 1, 1);
	/* Enough for all. */
	expect_budgeted(t, &all, 0, UINT64_MAX, 10);
	expect_budgeted(t, &all, 10, b3 * 10, 10);

	/* Pages of at most b3 bytes: every seq once, in order. */
	do {
		memset(&q, 0, sizeof(q));
		q.tenant = TA;
		q.session_id = "s1";
		q.after_seq = after;
		q.limit = 4;
		q.max_bytes = b3;
		memset(&rr, 0, sizeof(rr));
		expect_ok(histd_driver_read(t->d, &q, &rr));
		assert_true(rr.records.n > 0);
		for (i = 0; i < rr.records.n; i++)
			expect_eq(rr.records.v[i].seq, want++, "paged seq");
		after = rr.records.v[rr.records.n - 1].seq;
		i = rr.has_more;
		histd_read_result_clear(&rr);
	} while (i);
	expect_eq(want, 11, "seqs read");
	histd_read_result_clear(&all);
	tmsgs_free(m, 10);
}

static void read_reports_revision_last_seq_and_cleared_to_seq(void **state)
{
	ctest *t = *state;
	histd_read_result rr;
	histd_read q;
	tmsg m[5];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 5, "reported");
	append_each(t, TA, "s1", m, 3, 1);
	clear_ok(t, TA, "s1", 5, 3);
	append_ok(t, TA, "s1", &m[3], 2, 4);

	read_all(t, TA, "s1", &rr);
	expect_records(&rr.records, 4, &m[3], 2);
	expect_eq(rr.revision, 6, "revision");
	expect_eq(rr.last_seq, 5, "last_seq");
	expect_eq(rr.cleared_to_seq, 3, "cleared_to_seq");
	expect_eq(rr.has_more, 0, "has_more");
	histd_read_result_clear(&rr);

	/* Reading from inside the cleared part starts at what is stored. */
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.after_seq = 1;
	q.limit = 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_records(&rr.records, 4, &m[3], 1);
	expect_eq(rr.has_more, 1, "has_more");
	expect_eq(rr.revision, 6, "revision");
	expect_eq(rr.cleared_to_seq, 3, "cleared_to_seq");
	histd_read_result_clear(&rr);
	tmsgs_free(m, 5);
}

static void read_with_want_session_returns_the_session(void **state)
{
	ctest *t = *state;
	histd_kv labels[] = { { "env", "prod" } };
	histd_session in = sess_in(TA, "s1"), *out = NULL;
	histd_read_result rr;
	histd_read q;
	tmsg m[2];

	in.labels = labels;
	in.n_labels = 1;
	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
	tmsg_texts(m, 2, "with session");
	append_ok(t, TA, "s1", m, 2, 1);
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.limit = 1;
	q.want_session = 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	assert_non_null(rr.session);
	assert_string_equal(rr.session->id, "s1");
	assert_string_equal(rr.session->tenant, TA);
	expect_kv(rr.session->labels, rr.session->n_labels, labels, 1,
		  "labels");
	/* At the same instant as the records. */
	expect_counters(rr.session, (want_state){
		.revision = rr.revision, .last_seq = 2, .message_count = 2,
		.token_total = tokens_of(m, 2), .bytes_total = bytes_of(m, 2, 1),
		.first_seq = 1 });
	expect_records(&rr.records, 1, m, 1);
	histd_read_result_clear(&rr);
	assert_null(rr.session);
	expect_eq(rr.records.n, 0, "records after clearing the result");
	tmsgs_free(m, 2);
}

/* want_summary: the newest summary with the messages, as summary_get
 * gives it; none when none is stored. */
static void read_with_want_summary_returns_the_newest_summary(void **state)
{
	ctest *t = *state;
	histd_record *s1, *s2;
	histd_read_result rr;
	histd_read q;
	tmsg m[4];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 4, "summed");
	append_ok(t, TA, "s1", m, 4, 1);
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.last_n = 2;
	q.want_summary = 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	assert_null(rr.summary);
	expect_records(&rr.records, 3, &m[2], 2);
	histd_read_result_clear(&rr);

	s1 = summary_new(1, 3, "the first three");
	s2 = summary_new(1, 2, "the first two");
	summary_put_ok(t, TA, "s1", s1);
	summary_put_ok(t, TA, "s1", s2);   /* covers less: not the newest */
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_same_record(rr.summary, s1, "read's summary");
	expect_summary(t, TA, "s1", s1);
	expect_eq(rr.revision, 4, "revision");
	expect_records(&rr.records, 3, &m[2], 2);
	histd_read_result_clear(&rr);
	assert_null(rr.summary);

	/* Without want_summary, none. */
	q.want_summary = 0;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	assert_null(rr.summary);
	histd_read_result_clear(&rr);
	histd_record_free(s1);
	histd_record_free(s2);
	tmsgs_free(m, 4);
}

/* frame_field: the records are the same whether or not a driver frames
 * them; a framed list holds them, each behind the field's key and length,
 * in one buffer with the slack asked for. */
static void read_with_frame_field_gives_the_same_records(void **state)
{
	ctest *t = *state;
	histd_read_result rr;
	histd_read q;
	uint8_t *wire, *want;
	size_t len = 0, o = 0;
	tmsg m[5];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 5, "framed");
	append_ok(t, TA, "s1", m, 5, 1);
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.after_seq = 1;
	q.limit = 3;
	q.frame_field = 1;
	q.frame_slack = 40;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_records(&rr.records, 2, &m[1], 3);
	for (size_t i = 0; i < rr.records.n; i++)
		o += 1 + 2 * HISTD_WIRE_VARINT_MAX + rr.records.v[i].len;
	want = malloc(o);
	assert_non_null(want);
	o = 0;
	for (size_t i = 0; i < rr.records.n; i++) {
		o += histd_wire_put_len_key(want + o, 1, rr.records.v[i].len);
		memcpy(want + o, rr.records.v[i].data, rr.records.v[i].len);
		o += rr.records.v[i].len;
	}
	/* More room than was asked for is not promised. */
	assert_null(histd_records_take_wire(&rr.records, 1 << 20, &len));
	wire = histd_records_take_wire(&rr.records, 40, &len);
	if (wire) {
		expect_eq(len, o, "framed bytes");
		assert_memory_equal(wire, want, o);
		/* Taken: the list no longer holds it. */
		assert_null(histd_records_take_wire(&rr.records, 0, &len));
	}
	free(wire);
	free(want);
	histd_read_result_clear(&rr);

	/* last_n, and a read of nothing, framed too. */
	q.after_seq = 0;
	q.limit = 0;
	q.last_n = 2;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_records(&rr.records, 4, &m[3], 2);
	histd_read_result_clear(&rr);
	q.last_n = 0;
	q.after_seq = 5;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_eq(rr.records.n, 0, "records after the last");
	histd_read_result_clear(&rr);
	tmsgs_free(m, 5);
}

/* A list framed from empty is taken whole; a record added past the
 * buffer's room, or a list that was not empty, is not. */
static void records_framed_whole_or_not_at_all(void **state)
{
	histd_records l = { 0 };
	uint8_t a[300], *w;
	size_t len;

	(void)state;
	memset(a, 'a', sizeof(a));
	expect_ok(histd_records_frame(&l, 1, 2, 200, 0));
	expect_ok(histd_records_add(&l, 1, 1, a, 100));
	expect_ok(histd_records_add(&l, 2, 1, a, 100));
	/* Beyond what was reserved: copied apart, so no longer whole. */
	expect_ok(histd_records_add(&l, 3, 1, a, 300));
	expect_eq(l.n, 3, "records");
	assert_memory_equal(l.v[2].data, a, 300);
	assert_null(histd_records_take_wire(&l, 0, &len));
	histd_records_clear(&l);

	expect_ok(histd_records_add(&l, 1, 1, a, 10));
	expect_ok(histd_records_frame(&l, 1, 1, 10, 0));
	expect_ok(histd_records_add(&l, 2, 1, a, 10));
	assert_null(histd_records_take_wire(&l, 0, &len));
	histd_records_clear(&l);

	expect_ok(histd_records_frame(&l, 1, 1, 3, 5));
	expect_ok(histd_records_add(&l, 7, 1, a, 3));
	w = histd_records_take_wire(&l, 5, &len);
	assert_non_null(w);
	expect_eq(len, 5, "key, length and 3 bytes");
	assert_int_equal(w[0], 1 << 3 | 2);
	assert_int_equal(w[1], 3);
	assert_ptr_equal(l.v[0].data, w + 2);
	free(w);
	histd_records_clear(&l);
}

/* known_revision: at the caller's revision a driver may leave out the
 * session and summary (known set); at any other revision, or for the
 * session made again under the same id, it must fill them. */
static void read_at_a_known_revision_may_leave_out_what_the_caller_holds(
	void **state)
{
	ctest *t = *state;
	histd_session *out = NULL;
	histd_record *sum;
	histd_read_result rr;
	histd_read q;
	uint64_t rev, cur = 0;
	int64_t created;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "known");
	append_ok(t, TA, "s1", m, 2, 1);
	sum = summary_new(1, 1, "the first");
	summary_put_ok(t, TA, "s1", sum);
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "s1";
	q.last_n = 5;
	q.want_session = 1;
	q.want_summary = 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_eq(rr.known, 0, "known without known_revision");
	assert_non_null(rr.session);
	rev = rr.revision;
	created = rr.session->created_at_us;
	histd_read_result_clear(&rr);

	q.known_revision = rev;
	q.known_created_us = created;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	if (rr.known) {
		assert_null(rr.session);
		assert_null(rr.summary);
	} else {
		assert_non_null(rr.session);
		expect_same_record(rr.summary, sum, "summary");
	}
	expect_eq(rr.revision, rev, "revision");
	expect_records(&rr.records, 1, m, 2);
	histd_read_result_clear(&rr);

	/* Another revision, or another session of the same id: filled. */
	q.known_revision = rev - 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_eq(rr.known, 0, "known at an older revision");
	assert_non_null(rr.session);
	expect_same_record(rr.summary, sum, "summary");
	histd_read_result_clear(&rr);
	q.known_revision = rev;
	q.known_created_us = created + 1;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_eq(rr.known, 0, "known for another created_at");
	assert_non_null(rr.session);
	histd_read_result_clear(&rr);

	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));
	create_ok(t, TA, "s1");
	append_ok(t, TA, "s1", m, 2, 1);
	summary_put_ok(t, TA, "s1", sum);
	expect_ok(histd_driver_session_get(t->d, TA, "s1", &out));
	q.known_created_us = created;
	q.known_revision = out->revision;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	if (out->created_at_us != created)
		expect_eq(rr.known, 0, "known for the session made again");
	if (!rr.known)
		assert_non_null(rr.session);
	histd_read_result_clear(&rr);
	histd_session_free(out);
	histd_record_free(sum);
	tmsgs_free(m, 2);
}

static void read_of_an_empty_session_returns_nothing(void **state)
{
	ctest *t = *state;
	const read_case cases[] = {
		{ .limit = 0 }, { .limit = 5 }, { .last_n = 3 },
		{ .after_seq = 7, .limit = 1 },
	};
	histd_read_result rr;
	size_t i;

	create_ok(t, TA, "s1");
	for (i = 0; i < N_OF(cases); i++)
		expect_read(t, "s1", NULL, 1, &cases[i]);
	read_all(t, TA, "s1", &rr);
	expect_eq(rr.revision, 1, "revision");
	expect_eq(rr.last_seq, 0, "last_seq");
	expect_eq(rr.cleared_to_seq, 0, "cleared_to_seq");
	histd_read_result_clear(&rr);
}

static void read_of_unknown_session_is_not_found(void **state)
{
	ctest *t = *state;
	histd_read_result rr;
	histd_read q;

	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = "nobody";
	q.want_session = 1;
	memset(&rr, 0, sizeof(rr));
	rr.revision = SENTINEL_U64;
	rr.last_seq = SENTINEL_U64;
	rr.cleared_to_seq = SENTINEL_U64;
	rr.has_more = 77;
	expect_err(HISTD_ENOTFOUND, histd_driver_read(t->d, &q, &rr));
	expect_eq(rr.revision, SENTINEL_U64, "revision out-parameter");
	expect_eq(rr.last_seq, SENTINEL_U64, "last_seq out-parameter");
	expect_eq(rr.cleared_to_seq, SENTINEL_U64, "cleared_to_seq out-parameter");
	expect_eq(rr.has_more, 77, "has_more out-parameter");
	expect_eq(rr.records.n, 0, "records");
	assert_null(rr.session);
}

/* ---------------------------------------------------------------------- */
/* Clear                                                                   */

static void clear_removes_messages_and_summaries_and_keeps_last_seq(void **state)
{
	ctest *t = *state;
	histd_record *sum;
	histd_read_result rr;
	tmsg m[4];

	create_ok(t, TA, "s1");
	tmsg_text(&m[0], USER, "go");
	tmsg_calls(&m[1], "looking", IDS("c1"));
	tmsg_results(&m[2], IDS("c1"));
	tmsg_text(&m[3], ASSISTANT, "done");
	append_ok(t, TA, "s1", m, 4, 1);
	sum = summary_new(1, 2, "went looking");
	summary_put_ok(t, TA, "s1", sum);

	clear_ok(t, TA, "s1", 4, 4);
	expect_state(t, TA, "s1", (want_state){
		.revision = 4, .last_seq = 4, .cleared_to_seq = 4 });
	read_all(t, TA, "s1", &rr);
	expect_eq(rr.records.n, 0, "messages after clear");
	expect_eq(rr.revision, 4, "read revision");
	expect_eq(rr.last_seq, 4, "read last_seq");
	expect_eq(rr.cleared_to_seq, 4, "read cleared_to_seq");
	histd_read_result_clear(&rr);
	expect_summary(t, TA, "s1", NULL);
	histd_record_free(sum);
	tmsgs_free(m, 4);
}

static void seq_never_reused_after_clear(void **state)
{
	ctest *t = *state;
	tmsg m[5];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 5, "never reused");
	append_ok(t, TA, "s1", m, 3, 1);
	clear_ok(t, TA, "s1", 3, 3);
	append_ok(t, TA, "s1", &m[3], 1, 4);
	expect_state(t, TA, "s1", (want_state){
		.revision = 4, .last_seq = 4, .cleared_to_seq = 3,
		.message_count = 1, .token_total = m[3].tokens,
		.bytes_total = stored_len(&m[3], 4), .first_seq = 4 });
	clear_ok(t, TA, "s1", 5, 4);
	/* Clearing an empty session still is a write. */
	clear_ok(t, TA, "s1", 6, 4);
	append_ok(t, TA, "s1", &m[4], 1, 5);
	expect_messages(t, TA, "s1", 5, &m[4], 1);
	tmsgs_free(m, 5);
}

static void clear_resets_the_tool_call_index(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_record *rec = SENTINEL_RECORD;
	tmsg c, r1, r2;

	create_ok(t, TA, "s1");
	tmsg_calls(&c, "looking", IDS("c1", "c2"));
	tmsg_results(&r1, IDS("c1"));
	tmsg_results(&r2, IDS("c2"));
	append_ok(t, TA, "s1", &c, 1, 1);
	append_ok(t, TA, "s1", &r1, 1, 2);
	clear_ok(t, TA, "s1", 4, 2);

	/* The open call is forgotten, so is the answered one's result... */
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &r2, 1, &res));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	/* ...and both ids may be issued again. */
	append_ok(t, TA, "s1", &c, 1, 3);
	append_ok(t, TA, "s1", &r2, 1, 4);
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c2", &rec));
	expect_record(rec, 4, &r2);
	histd_record_free(rec);
	tmsg_free(&c);
	tmsg_free(&r1);
	tmsg_free(&r2);
}

static void clear_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	uint64_t rev = SENTINEL_U64, cleared = SENTINEL_U64, cur = SENTINEL_U64;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "kept");
	append_ok(t, TA, "s1", m, 2, 1);
	expect_err(HISTD_ECONFLICT,
		   histd_driver_clear(t->d, TA, "s1", 1, &rev, &cleared, &cur));
	expect_eq(cur, 2, "current_revision");
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_eq(cleared, SENTINEL_U64, "cleared_to_seq out-parameter");
	expect_messages(t, TA, "s1", 1, m, 2);
	expect_ok(histd_driver_clear(t->d, TA, "s1", 2, &rev, &cleared, &cur));
	expect_eq(rev, 3, "revision");
	expect_eq(cleared, 2, "cleared_to_seq");
	expect_change_revisions(t, TA, "s1", 2, 3);
	tmsgs_free(m, 2);
}

static void clear_of_an_empty_session_clears_to_0(void **state)
{
	ctest *t = *state;

	create_ok(t, TA, "s1");
	clear_ok(t, TA, "s1", 2, 0);
	expect_state(t, TA, "s1", (want_state){ .revision = 2 });
}

/* ---------------------------------------------------------------------- */
/* Replace                                                                 */

static void replace_swaps_every_message_for_new_seqs(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_record *sum;
	histd_read_result rr;
	uint64_t cleared = SENTINEL_U64;
	tmsg old[3], m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(old, 3, "old");
	tmsg_texts(m, 2, "restored");
	append_ok(t, TA, "s1", old, 3, 1);
	sum = summary_new(1, 3, "the old ones");
	summary_put_ok(t, TA, "s1", sum);

	memset(&res, 0, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 3, m, 2, &res, &cleared));
	expect_eq(res.first_seq, 4, "first_seq");
	expect_eq(res.last_seq, 5, "last_seq");
	expect_eq(res.revision, 4, "revision");
	expect_eq(res.replayed, 0, "replayed");
	expect_eq(cleared, 3, "cleared_to_seq");
	read_all(t, TA, "s1", &rr);
	expect_records(&rr.records, 4, m, 2);
	expect_eq(rr.cleared_to_seq, 3, "read cleared_to_seq");
	expect_eq(rr.revision, 4, "read revision");
	histd_read_result_clear(&rr);
	expect_state(t, TA, "s1", (want_state){
		.revision = 4, .last_seq = 5, .cleared_to_seq = 3,
		.message_count = 2, .token_total = tokens_of(m, 2),
		.bytes_total = bytes_of(m, 2, 4), .first_seq = 4 });
	expect_summary(t, TA, "s1", NULL);
	histd_record_free(sum);
	tmsgs_free(old, 3);
	tmsgs_free(m, 2);
}

static void replace_checks_tool_refs_against_an_empty_index(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	histd_record *rec = NULL;
	uint64_t cleared = SENTINEL_U64;
	tmsg old[3], answer_old, restore[2];

	create_ok(t, TA, "s1");
	tmsg_calls(&old[0], "looking", IDS("c1"));
	tmsg_calls(&old[1], "looking", IDS("c2"));
	tmsg_results(&old[2], IDS("c2"));
	append_ok(t, TA, "s1", old, 3, 1);

	/* c1 is open before the replace, not after its clear. */
	tmsg_results(&answer_old, IDS("c1"));
	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_EINVALID,
		   append_replace(t, TA, "s1", 0, &answer_old, 1, &res, &cleared));
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(cleared, SENTINEL_U64, "cleared_to_seq out-parameter");
	expect_messages(t, TA, "s1", 1, old, 3);
	expect_eq(revision_of(t, TA, "s1"), 2, "revision");
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c2", &rec));
	expect_record(rec, 3, &old[2]);
	histd_record_free(rec);

	/* Old ids may be issued again, and answered in the batch. */
	tmsg_calls(&restore[0], "looking again", IDS("c1"));
	tmsg_results(&restore[1], IDS("c1"));
	memset(&res, 0, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 0, restore, 2, &res, &cleared));
	expect_eq(res.first_seq, 4, "first_seq");
	expect_eq(cleared, 3, "cleared_to_seq");
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	expect_record(rec, 5, &restore[1]);
	histd_record_free(rec);
	rec = SENTINEL_RECORD;
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "c2", &rec));
	expect_change_revisions(t, TA, "s1", 2, 3);
	tmsgs_free(old, 3);
	tmsg_free(&answer_old);
	tmsgs_free(restore, 2);
}

static void replace_with_no_messages_clears(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	uint64_t cleared = SENTINEL_U64;
	tmsg m[3];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 3, "emptied");
	append_ok(t, TA, "s1", m, 2, 1);
	memset(&res, 0x5e, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 0, NULL, 0, &res, &cleared));
	expect_eq(res.first_seq, 0, "first_seq");
	expect_eq(res.last_seq, 0, "last_seq");
	expect_eq(res.revision, 3, "revision");
	expect_eq(cleared, 2, "cleared_to_seq");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 2, .cleared_to_seq = 2 });
	append_ok(t, TA, "s1", &m[2], 1, 3);
	tmsgs_free(m, 3);
}

static void seq_never_reused_after_replace(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	uint64_t cleared = 0;
	tmsg m[4];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 4, "replaced");
	memset(&res, 0, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 0, m, 2, &res, &cleared));
	expect_eq(res.first_seq, 1, "first_seq of a replace on a new session");
	expect_eq(res.last_seq, 2, "last_seq");
	expect_eq(cleared, 0, "cleared_to_seq");
	expect_ok(append_replace(t, TA, "s1", 0, &m[2], 1, &res, &cleared));
	expect_eq(res.first_seq, 3, "first_seq of the second replace");
	expect_eq(cleared, 2, "cleared_to_seq");
	append_ok(t, TA, "s1", &m[3], 1, 4);
	expect_messages(t, TA, "s1", 3, &m[2], 2);
	tmsgs_free(m, 4);
}

static void replace_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	uint64_t cleared = SENTINEL_U64;
	tmsg m[2];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 2, "kept");
	append_ok(t, TA, "s1", m, 1, 1);
	memset(&res, 0x5e, sizeof(res));
	expect_err(HISTD_ECONFLICT,
		   append_replace(t, TA, "s1", 1, &m[1], 1, &res, &cleared));
	expect_eq(res.current_revision, 2, "current_revision");
	expect_eq(res.first_seq, SENTINEL_U64, "first_seq out-parameter");
	expect_eq(res.revision, SENTINEL_U64, "revision out-parameter");
	expect_eq(cleared, SENTINEL_U64, "cleared_to_seq out-parameter");
	expect_messages(t, TA, "s1", 1, m, 1);
	expect_ok(append_replace(t, TA, "s1", 2, &m[1], 1, &res, &cleared));
	expect_eq(res.revision, 3, "revision");
	tmsgs_free(m, 2);
}

static void replace_ignores_the_idempotency_key(void **state)
{
	ctest *t = *state;
	histd_msg_in in;
	histd_append_result res;
	uint64_t cleared = 0;
	uint8_t hash[HISTD_HASH_LEN];
	histd_append a;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "restored");
	in = tmsg_in(&m);
	memset(hash, 7, sizeof(hash));
	memset(&a, 0, sizeof(a));
	a.tenant = TA;
	a.session_id = "s1";
	a.idempotency_key = "key-1";
	a.request_hash = hash;
	a.now_us = T0;
	a.idem_expires_us = T0 + 1000;
	a.msgs = &in;
	a.n_msgs = 1;
	expect_ok(histd_driver_replace(t->d, &a, &res, &cleared));
	memset(&res, 0, sizeof(res));
	expect_ok(histd_driver_replace(t->d, &a, &res, &cleared));
	expect_eq(res.replayed, 0, "replayed");
	expect_eq(res.first_seq, 2, "first_seq of the second replace");
	/* Nor did replace remember the key for appends. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 1, T0 + 1000,
			      &m, 1, &res));
	expect_eq(res.replayed, 0, "replayed by append");
	expect_eq(res.first_seq, 3, "first_seq of the append");
	tmsg_free(&m);
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                               */

static void summary_get_without_a_summary_returns_null(void **state)
{
	ctest *t = *state;

	create_ok(t, TA, "s1");
	expect_summary(t, TA, "s1", NULL);
}

static void summary_put_adds_a_revision_and_get_returns_the_newest(void **state)
{
	ctest *t = *state;
	histd_record *s4, *s6, *s2, *s6b;
	tmsg m[6];

	create_ok(t, TA, "s1");
	tmsg_texts(m, 6, "summarized");
	append_ok(t, TA, "s1", m, 6, 1);
	s4 = summary_new(1, 4, "up to four");
	s6 = summary_new(1, 6, "up to six");
	s2 = summary_new(1, 2, "up to two");
	s6b = summary_new(3, 6, "up to six, again and longer");

	expect_eq(summary_put_ok(t, TA, "s1", s4), 3, "revision");
	expect_summary(t, TA, "s1", s4);
	expect_eq(summary_put_ok(t, TA, "s1", s6), 4, "revision");
	expect_summary(t, TA, "s1", s6);
	/* Put later but covering less: not the newest. */
	expect_eq(summary_put_ok(t, TA, "s1", s2), 5, "revision");
	expect_summary(t, TA, "s1", s6);
	/* A tie: the newest put. */
	expect_eq(summary_put_ok(t, TA, "s1", s6b), 6, "revision");
	expect_summary(t, TA, "s1", s6b);

	/* Messages are untouched. */
	expect_state(t, TA, "s1", (want_state){
		.revision = 6, .last_seq = 6, .message_count = 6,
		.token_total = tokens_of(m, 6), .bytes_total = bytes_of(m, 6, 1),
		.first_seq = 1, .summary_count = 4 });
	expect_messages(t, TA, "s1", 1, m, 6);
	histd_record_free(s4);
	histd_record_free(s6);
	histd_record_free(s2);
	histd_record_free(s6b);
	tmsgs_free(m, 6);
}

static void summary_put_with_stale_expected_revision_is_conflict(void **state)
{
	ctest *t = *state;
	uint64_t rev = SENTINEL_U64, cur = SENTINEL_U64;
	histd_record *sum;
	tmsg m;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "one");
	append_ok(t, TA, "s1", &m, 1, 1);
	sum = summary_new(1, 1, "one");
	expect_err(HISTD_ECONFLICT,
		   histd_driver_summary_put(t->d, TA, "s1", 1, sum, &rev, &cur));
	expect_eq(cur, 2, "current_revision");
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_summary(t, TA, "s1", NULL);
	expect_ok(histd_driver_summary_put(t->d, TA, "s1", 2, sum, &rev, &cur));
	expect_eq(rev, 3, "revision");
	expect_summary(t, TA, "s1", sum);
	histd_record_free(sum);
	tmsg_free(&m);
}

static void summary_of_unknown_session_is_not_found(void **state)
{
	ctest *t = *state;
	uint64_t rev = SENTINEL_U64, cur = SENTINEL_U64;
	histd_record *sum, *out = SENTINEL_RECORD;

	sum = summary_new(1, 1, "one");
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_put(t->d, TA, "nobody", 0, sum, &rev,
					    &cur));
	expect_eq(rev, SENTINEL_U64, "revision out-parameter");
	expect_eq(cur, SENTINEL_U64, "current_revision out-parameter");
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_summary_get(t->d, TA, "nobody", &out));
	assert_ptr_equal(out, SENTINEL_RECORD);
	histd_record_free(sum);
}

/* ---------------------------------------------------------------------- */
/* Notify                                                                  */

static void notify_reports_every_change_in_revision_order(void **state)
{
	ctest *t = *state;
	histd_kv labels[] = { { "env", "dev" } };
	const enum histd_change_kind kinds[] = {
		HISTD_CHANGE_APPENDED, HISTD_CHANGE_UPDATED,
		HISTD_CHANGE_SUMMARY, HISTD_CHANGE_CLEARED,
		HISTD_CHANGE_REPLACED, HISTD_CHANGE_APPENDED,
		HISTD_CHANGE_DELETED,
	};
	const change_copy **c;
	histd_append_result res;
	histd_session *out = NULL;
	histd_record *sum;
	uint64_t cleared = 0, cur = 0;
	size_t n, i;
	tmsg m[2], r, more, other;

	create_ok(t, TA, "s1");
	create_ok(t, TA, "s2");
	tmsg_texts(m, 2, "notified");
	tmsg_text(&r, USER, "replacement");
	tmsg_text(&more, USER, "more");
	tmsg_text(&other, USER, "elsewhere");
	sum = summary_new(1, 2, "both");

	append_ok(t, TA, "s1", m, 2, 1);                                /* 2 */
	append_ok(t, TA, "s2", &other, 1, 1);
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, labels, 1,
					      NULL, 0, T0 + 1, &out, &cur)); /* 3 */
	histd_session_free(out);
	summary_put_ok(t, TA, "s1", sum);                               /* 4 */
	clear_ok(t, TA, "s1", 5, 2);                                    /* 5 */
	memset(&res, 0, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 0, &r, 1, &res, &cleared)); /* 6 */
	append_ok(t, TA, "s1", &more, 1, 4);                            /* 7 */
	expect_ok(histd_driver_session_delete(t->d, TA, "s1", 0, &cur));

	n = changes_wait(t, TA, "s1", N_OF(kinds), 0, &c);
	expect_eq(n, N_OF(kinds), "changes of s1");
	for (i = 0; i < n; i++) {
		expect_eq(c[i]->kind, kinds[i], "change kind");
		if (kinds[i] != HISTD_CHANGE_DELETED)
			expect_eq(c[i]->revision, 2 + i, "change revision");
	}
	/* APPENDED: the stored records, seq in the bytes. */
	assert_true(c[0]->has_records);
	expect_records(&c[0]->records, 1, m, 2);
	/* UPDATED: the record after the update. */
	assert_non_null(c[1]->session);
	expect_eq(c[1]->session->revision, 3, "updated session revision");
	expect_kv(c[1]->session->labels, c[1]->session->n_labels, labels, 1,
		  "updated session labels");
	/* SUMMARY: the summary. */
	assert_true(c[2]->has_records);
	expect_eq(c[2]->records.n, 1, "summary records");
	expect_same_record(&c[2]->records.v[0], sum, "notified summary");
	/* CLEARED, REPLACED: where the clear reached. */
	expect_eq(c[3]->cleared_to_seq, 2, "cleared change cleared_to_seq");
	expect_eq(c[4]->cleared_to_seq, 2, "replaced change cleared_to_seq");
	assert_true(c[4]->has_records);
	expect_records(&c[4]->records, 3, &r, 1);
	assert_true(c[5]->has_records);
	expect_records(&c[5]->records, 4, &more, 1);
	free(c);

	n = changes_wait(t, TA, "s2", 1, 2, &c);
	expect_eq(n, 1, "changes of s2");
	expect_eq(c[0]->revision, 2, "s2 change revision");
	free(c);

	histd_record_free(sum);
	tmsgs_free(m, 2);
	tmsg_free(&r);
	tmsg_free(&more);
	tmsg_free(&other);
}

static void notify_is_silent_for_failed_and_replayed_writes(void **state)
{
	ctest *t = *state;
	histd_kv labels[] = { { "env", "dev" } };
	histd_append_result res;
	histd_session *out = NULL;
	histd_record *sum;
	uint64_t rev, cleared, cur;
	tmsg m, bad;

	create_ok(t, TA, "s1");
	tmsg_text(&m, USER, "once");
	tmsg_results(&bad, IDS("nope"));
	sum = summary_new(1, 1, "one");
	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0, T0 + 1000, &m, 1,
			      &res));

	expect_ok(append_full(t, TA, "s1", 0, "key-1", 7, T0 + 1, T0 + 1000,
			      &m, 1, &res));
	expect_eq(res.replayed, 1, "replayed");
	expect_err(HISTD_EPRECONDITION,
		   append_full(t, TA, "s1", 0, "key-1", 8, T0 + 1, T0 + 1000,
			       &m, 1, &res));
	expect_err(HISTD_ECONFLICT, append_msgs(t, TA, "s1", 1, &m, 1, &res));
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &bad, 1, &res));
	expect_err(HISTD_ENOTFOUND, append_msgs(t, TA, "s9", 0, &m, 1, &res));
	expect_err(HISTD_ECONFLICT,
		   histd_driver_session_update(t->d, TA, "s1", 1, labels, 1,
					       NULL, 0, T0, &out, &cur));
	expect_err(HISTD_ECONFLICT,
		   histd_driver_summary_put(t->d, TA, "s1", 1, sum, &rev, &cur));
	expect_err(HISTD_ECONFLICT,
		   histd_driver_clear(t->d, TA, "s1", 1, &rev, &cleared, &cur));
	expect_err(HISTD_EINVALID,
		   append_replace(t, TA, "s1", 0, &bad, 1, &res, &cleared));
	expect_err(HISTD_ECONFLICT,
		   histd_driver_session_delete(t->d, TA, "s1", 1, &cur));
	/* Revision 3 is the next write's, with nothing reported between. */
	append_ok(t, TA, "s1", &m, 1, 2);
	expect_change_revisions(t, TA, "s1", 2, 3);
	histd_record_free(sum);
	tmsg_free(&m);
	tmsg_free(&bad);
}

/* ---------------------------------------------------------------------- */
/* Concurrency                                                             */

#define APPEND_THREADS 8
#define APPENDS_PER_THREAD 500
#define APPENDS_TOTAL (APPEND_THREADS * APPENDS_PER_THREAD)

typedef struct append_racer {
	ctest *t;
	race *r;
	int index;
	uint64_t seq[APPENDS_PER_THREAD];
	uint64_t revision[APPENDS_PER_THREAD];
	int rc;
	size_t failed_at;
	char why[160];
} append_racer;

static void append_racer_text(char *buf, size_t len, int thread, size_t i)
{
	snprintf(buf, len, "thread %d message %zu", thread, i);
}

static void *append_racer_run(void *arg)
{
	append_racer *w = arg;
	histd_append_result res;
	char text[64];
	size_t i;
	tmsg m;

	race_gate(w->r, 0);
	for (i = 0; i < APPENDS_PER_THREAD; i++) {
		append_racer_text(text, sizeof(text), w->index, i);
		tmsg_text(&m, i % 2 ? ASSISTANT : USER, text);
		memset(&res, 0, sizeof(res));
		w->rc = append_msgs(w->t, TA, "hot", 0, &m, 1, &res);
		tmsg_free(&m);
		if (w->rc) {
			w->failed_at = i;
			snprintf(w->why, sizeof(w->why), "%s",
				 histd_error_message());
			return NULL;
		}
		if (res.first_seq != res.last_seq || res.replayed) {
			w->rc = HISTD_EINTERNAL;
			w->failed_at = i;
			snprintf(w->why, sizeof(w->why), "first_seq %llu "
				 "last_seq %llu replayed %d for one message",
				 (unsigned long long)res.first_seq,
				 (unsigned long long)res.last_seq, res.replayed);
			return NULL;
		}
		w->seq[i] = res.first_seq;
		w->revision[i] = res.revision;
	}
	return NULL;
}

static void concurrent_appends_to_one_session_assign_every_seq_once(void **state)
{
	ctest *t = *state;
	append_racer *w = calloc(APPEND_THREADS, sizeof(*w));
	/* owner[seq]: thread * APPENDS_PER_THREAD + i, + 1 (0: unseen). */
	size_t *owner = calloc(APPENDS_TOTAL + 1, sizeof(*owner));
	const change_copy **c;
	histd_read_result rr;
	char text[64], why[160];
	uint64_t tokens = 0, bytes = 0;
	race r;
	size_t i, n;
	int k;
	tmsg m;

	assert_non_null(w);
	assert_non_null(owner);
	create_ok(t, TA, "hot");
	for (k = 0; k < APPEND_THREADS; k++) {
		w[k].t = t;
		w[k].r = &r;
		w[k].index = k;
	}
	race_run(&r, APPEND_THREADS, append_racer_run, w, sizeof(w[0]));

	for (k = 0; k < APPEND_THREADS; k++) {
		if (w[k].rc)
			fail_msg("thread %d append %zu: %s: %s", k,
				 w[k].failed_at, histd_error_name(w[k].rc),
				 w[k].why);
		for (i = 0; i < APPENDS_PER_THREAD; i++) {
			uint64_t seq = w[k].seq[i];

			if (seq < 1 || seq > APPENDS_TOTAL)
				fail_msg("thread %d got seq %llu", k,
					 (unsigned long long)seq);
			if (owner[seq])
				fail_msg("seq %llu assigned twice",
					 (unsigned long long)seq);
			owner[seq] = (size_t)k * APPENDS_PER_THREAD + i + 1;
			/* Only appends of one message write the session:
			 * each adds one seq and one revision. */
			if (w[k].revision[i] != seq + 1)
				fail_msg("thread %d: seq %llu came with "
					 "revision %llu", k,
					 (unsigned long long)seq,
					 (unsigned long long)w[k].revision[i]);
			if (i && w[k].revision[i] <= w[k].revision[i - 1])
				fail_msg("thread %d saw revision %llu after "
					 "%llu", k,
					 (unsigned long long)w[k].revision[i],
					 (unsigned long long)w[k].revision[i - 1]);
		}
	}
	/* APPENDS_TOTAL distinct seqs in 1..APPENDS_TOTAL: every one, no gap. */

	read_all(t, TA, "hot", &rr);
	expect_eq(rr.records.n, APPENDS_TOTAL, "messages stored");
	expect_eq(rr.revision, APPENDS_TOTAL + 1, "revision");
	for (i = 0; i < rr.records.n; i++) {
		size_t o = owner[i + 1] - 1;
		int thread = (int)(o / APPENDS_PER_THREAD);
		size_t j = o % APPENDS_PER_THREAD;

		append_racer_text(text, sizeof(text), thread, j);
		tmsg_text(&m, j % 2 ? ASSISTANT : USER, text);
		if (record_is(&rr.records.v[i], i + 1, &m, why, sizeof(why))) {
			tmsg_free(&m);
			fail_msg("%s", why);
		}
		tokens += m.tokens;
		bytes += stored_len(&m, i + 1);
		tmsg_free(&m);
	}
	histd_read_result_clear(&rr);
	expect_state(t, TA, "hot", (want_state){
		.revision = APPENDS_TOTAL + 1, .last_seq = APPENDS_TOTAL,
		.message_count = APPENDS_TOTAL, .token_total = tokens,
		.bytes_total = bytes, .first_seq = 1 });

	n = changes_wait(t, TA, "hot", APPENDS_TOTAL, 0, &c);
	expect_eq(n, APPENDS_TOTAL, "changes notified");
	for (i = 0; i < n; i++) {
		if (c[i]->kind != HISTD_CHANGE_APPENDED ||
		    c[i]->revision != i + 2)
			fail_msg("change #%zu: kind %d revision %llu, want "
				 "APPENDED at %zu", i, (int)c[i]->kind,
				 (unsigned long long)c[i]->revision, i + 2);
		if (!c[i]->has_records || c[i]->records.n != 1 ||
		    c[i]->records.v[0].seq != i + 1)
			fail_msg("change #%zu: not the record of seq %zu", i,
				 i + 1);
	}
	free(c);
	free(owner);
	free(w);
}

#define CAS_THREADS 4
#define CAS_ATTEMPTS 60

typedef struct cas_racer {
	ctest *t;
	race *r;
	int index;
	size_t wins;
	size_t conflicts;
	int rc;
	char why[160];
} cas_racer;

static void *cas_racer_run(void *arg)
{
	cas_racer *w = arg;
	histd_append_result res;
	histd_session *s;
	char text[64];
	uint64_t rev;
	size_t i;
	tmsg m;

	race_gate(w->r, 0);
	for (i = 0; i < CAS_ATTEMPTS; i++) {
		s = NULL;
		w->rc = histd_driver_session_get(w->t->d, TA, "cas", &s);
		if (w->rc) {
			snprintf(w->why, sizeof(w->why), "get: %s",
				 histd_error_message());
			return NULL;
		}
		rev = s->revision;
		histd_session_free(s);
		snprintf(text, sizeof(text), "cas %d %zu", w->index, i);
		tmsg_text(&m, USER, text);
		memset(&res, 0, sizeof(res));
		w->rc = append_msgs(w->t, TA, "cas", rev, &m, 1, &res);
		tmsg_free(&m);
		if (w->rc == 0) {
			if (res.revision != rev + 1) {
				w->rc = HISTD_EINTERNAL;
				snprintf(w->why, sizeof(w->why), "append at "
					 "revision %llu gave revision %llu",
					 (unsigned long long)rev,
					 (unsigned long long)res.revision);
				return NULL;
			}
			w->wins++;
		} else if (w->rc == HISTD_ECONFLICT) {
			if (res.current_revision <= rev) {
				snprintf(w->why, sizeof(w->why), "conflict at "
					 "revision %llu said current %llu",
					 (unsigned long long)rev,
					 (unsigned long long)res.current_revision);
				return NULL;
			}
			w->rc = 0;
			w->conflicts++;
		} else {
			snprintf(w->why, sizeof(w->why), "append: %s",
				 histd_error_message());
			return NULL;
		}
	}
	return NULL;
}

static void concurrent_expected_revision_appends_let_one_writer_win(void **state)
{
	ctest *t = *state;
	cas_racer w[CAS_THREADS];
	size_t wins = 0;
	histd_session *s;
	race r;
	int k;

	create_ok(t, TA, "cas");
	memset(w, 0, sizeof(w));
	for (k = 0; k < CAS_THREADS; k++) {
		w[k].t = t;
		w[k].r = &r;
		w[k].index = k;
	}
	race_run(&r, CAS_THREADS, cas_racer_run, w, sizeof(w[0]));
	for (k = 0; k < CAS_THREADS; k++) {
		if (w[k].rc || w[k].why[0])
			fail_msg("thread %d: %s: %s", k,
				 histd_error_name(w[k].rc), w[k].why);
		wins += w[k].wins;
	}
	/* Every success moved the revision by one and nothing else did. */
	s = get_ok(t, TA, "cas");
	expect_eq(s->message_count, wins, "messages = successful appends");
	expect_eq(s->last_seq, wins, "last_seq");
	expect_eq(s->revision, wins + 1, "revision");
	histd_session_free(s);
	assert_true(wins >= CAS_ATTEMPTS);
}

#define CREATE_ROUNDS 200

typedef struct create_racer {
	ctest *t;
	race *r;
	int index;
	int same_id_rc[CREATE_ROUNDS];
	int same_keys_rc[CREATE_ROUNDS];
} create_racer;

static void *create_racer_run(void *arg)
{
	create_racer *w = arg;
	histd_session in, *out;
	histd_kv keys[1];
	char id[32], key[32];
	int round;

	for (round = 0; round < CREATE_ROUNDS; round++) {
		/* One id, no keys. */
		snprintf(id, sizeof(id), "dup-%d", round);
		in = sess_in(TA, id);
		out = NULL;
		race_gate(w->r, 2 * (size_t)round);
		w->same_id_rc[round] =
			histd_driver_session_create(w->t->d, &in, &out);
		histd_session_free(out);

		/* Own ids, one key set. */
		snprintf(id, sizeof(id), "keyed-%d-%d", round, w->index);
		snprintf(key, sizeof(key), "k-%d", round);
		keys[0].key = "chat";
		keys[0].value = key;
		in = sess_in(TA, id);
		in.context_keys = keys;
		in.n_context_keys = 1;
		out = NULL;
		race_gate(w->r, 2 * (size_t)round + 1);
		w->same_keys_rc[round] =
			histd_driver_session_create(w->t->d, &in, &out);
		histd_session_free(out);
	}
	return NULL;
}

static void concurrent_creates_of_one_id_or_key_set_let_one_win(void **state)
{
	ctest *t = *state;
	create_racer w[RACE_THREADS];
	histd_session_list l;
	histd_list q;
	race r;
	int round, k;

	memset(w, 0, sizeof(w));
	for (k = 0; k < RACE_THREADS; k++) {
		w[k].t = t;
		w[k].r = &r;
		w[k].index = k;
	}
	race_run(&r, RACE_THREADS, create_racer_run, w, sizeof(w[0]));
	for (round = 0; round < CREATE_ROUNDS; round++) {
		int id_wins = 0, key_wins = 0;

		for (k = 0; k < RACE_THREADS; k++) {
			if (w[k].same_id_rc[round] == 0)
				id_wins++;
			else if (w[k].same_id_rc[round] != HISTD_EEXISTS)
				fail_msg("round %d: create of one id: %s",
					 round,
					 histd_error_name(w[k].same_id_rc[round]));
			if (w[k].same_keys_rc[round] == 0)
				key_wins++;
			else if (w[k].same_keys_rc[round] != HISTD_EEXISTS)
				fail_msg("round %d: create with one key set: "
					 "%s", round,
					 histd_error_name(w[k].same_keys_rc[round]));
		}
		expect_eq(id_wins, 1, "creates of one id that succeeded");
		expect_eq(key_wins, 1, "creates with one key set that succeeded");
	}
	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.limit = 1000;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	expect_eq(l.n, 2 * CREATE_ROUNDS, "sessions");
	histd_session_list_free(&l);
}

/* ---------------------------------------------------------------------- */
/* Limits and truncate (version 3)                                         */

/* Version 3 promises only: an older driver is reported as skipped. */
static void need_v3(ctest *t)
{
	if (t->d->version < 3)
		skip();
}

/* Opens the test's driver again on its (still empty) store with limits. */
static void reopen_with_limits(ctest *t, uint64_t sessions, uint64_t msgs,
			       uint64_t bytes)
{
	histd_driver_close(t->d);
	t->d = NULL;
	t->cfg.max_sessions_per_tenant = sessions;
	t->cfg.max_session_messages = msgs;
	t->cfg.max_session_bytes = bytes;
	expect_ok(histd_driver_open(t->fx->driver, &t->cfg, &t->d));
	histd_driver_set_notify(t->d, change_log_hook, &t->log);
}

/* ELIMIT, with a message that names the limit. */
#define expect_limit(text, call) do { \
	expect_err(HISTD_ELIMIT, call); \
	if (!strstr(histd_error_message(), (text))) \
		fail_msg("%s: message \"%s\" does not say \"%s\"", #call, \
			 histd_error_message(), (text)); \
} while (0)

static size_t sessions_of(ctest *t, const char *tenant)
{
	histd_session_list l;
	histd_list q;
	size_t n;

	memset(&q, 0, sizeof(q));
	memset(&l, 0, sizeof(l));
	q.tenant = tenant;
	q.limit = 100;
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	n = l.n;
	histd_session_list_free(&l);
	return n;
}

static void limit_on_sessions_per_tenant_stops_create_resolve_and_fork(void **state)
{
	ctest *t = *state;
	histd_kv k1[] = { { "agent", "one" } }, k9[] = { { "agent", "nine" } };
	histd_session in, *out = SENTINEL_SESSION;
	int created = -1;

	need_v3(t);
	reopen_with_limits(t, 2, 0, 0);
	create_with_keys(t, TA, "s1", k1, 1);
	create_ok(t, TA, "s2");

	in = sess_in(TA, "s3");
	expect_limit("the tenant has 2 sessions; the limit is 2",
		     histd_driver_session_create(t->d, &in, &out));
	in.context_keys = k9;
	in.n_context_keys = 1;
	expect_limit("the limit is 2",
		     histd_driver_session_resolve(t->d, &in, &out, &created));
	in = sess_in(TA, "s4");
	expect_limit("the limit is 2",
		     histd_driver_session_fork(t->d, TA, "s1", 0, &in, &out));
	assert_ptr_equal(out, SENTINEL_SESSION);
	expect_eq(created, (uint64_t)-1, "created after ELIMIT");
	expect_eq(sessions_of(t, TA), 2, "sessions after ELIMIT");

	/* Resolving an existing session creates nothing and passes. */
	in = sess_in(TA, "s5");
	in.context_keys = k1;
	in.n_context_keys = 1;
	out = NULL;
	expect_ok(histd_driver_session_resolve(t->d, &in, &out, &created));
	expect_eq(created, 0, "resolve of existing keys created");
	assert_string_equal(out->id, "s1");
	histd_session_free(out);

	/* The limit is per tenant, and freed by a delete. */
	create_ok(t, TB, "s3");
	expect_ok(histd_driver_session_delete(t->d, TA, "s2", 0, NULL));
	create_ok(t, TA, "s3");
	expect_eq(sessions_of(t, TA), 2, "sessions at the end");
}

static void limit_on_session_messages_stops_append_and_replace(void **state)
{
	ctest *t = *state;
	histd_append_result res;
	uint64_t cleared = SENTINEL_U64;
	tmsg m[5];

	need_v3(t);
	reopen_with_limits(t, 0, 3, 0);
	create_ok(t, TA, "s1");
	tmsg_texts(m, 5, "limited");
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "k1", 7, T0, T0 + 1000000000,
			      m, 2, &res));
	expect_limit("the session would hold 4 messages; the limit is 3",
		     append_msgs(t, TA, "s1", 0, &m[2], 2, &res));
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 2, .message_count = 2,
		.token_total = tokens_of(m, 2), .bytes_total = bytes_of(m, 2, 1),
		.first_seq = 1 });
	append_ok(t, TA, "s1", &m[2], 1, 3);
	expect_limit("the limit is 3", append_msgs(t, TA, "s1", 0, &m[3], 1, &res));

	/* A replay is not a write: it passes at the limit. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, "k1", 7, T0, T0 + 1000000000,
			      m, 2, &res));
	expect_eq(res.replayed, 1, "replayed at the limit");
	expect_eq(res.first_seq, 1, "replayed first_seq");

	expect_limit("the session would hold 4 messages; the limit is 3",
		     append_replace(t, TA, "s1", 0, m, 4, &res, &cleared));
	expect_eq(cleared, SENTINEL_U64, "cleared_to_seq after ELIMIT");
	expect_messages(t, TA, "s1", 1, m, 3);
	expect_ok(append_replace(t, TA, "s1", 0, &m[2], 3, &res, &cleared));
	expect_eq(res.first_seq, 4, "replace first_seq");
	expect_messages(t, TA, "s1", 4, &m[2], 3);
	tmsgs_free(m, 5);
}

static void limit_on_session_bytes_stops_append_and_fork_copies_within(void **state)
{
	ctest *t = *state;
	histd_session in, *out = NULL;
	histd_append_result res;
	char want[96];
	uint64_t max;
	tmsg m[3];

	need_v3(t);
	tmsg_texts(m, 3, "bytes");
	max = bytes_of(m, 2, 1);
	reopen_with_limits(t, 0, 0, max);
	create_ok(t, TA, "s1");
	append_ok(t, TA, "s1", m, 2, 1);
	snprintf(want, sizeof(want), "the session would hold %llu bytes; the limit is %llu",
		 (unsigned long long)(max + stored_len(&m[2], 3)),
		 (unsigned long long)max);
	expect_limit(want, append_msgs(t, TA, "s1", 0, &m[2], 1, &res));
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 2, .message_count = 2,
		.token_total = tokens_of(m, 2), .bytes_total = max,
		.first_seq = 1 });
	/* A fork holding what the source holds is within the limit. */
	in = sess_in(TA, "f1");
	expect_ok(histd_driver_session_fork(t->d, TA, "s1", 0, &in, &out));
	expect_eq(out->bytes_total, max, "fork bytes_total");
	histd_session_free(out);
	tmsgs_free(m, 3);
}

static uint64_t truncate_ok(ctest *t, const char *tenant, const char *id,
			    uint64_t up_to_seq)
{
	uint64_t rev = 0, cur = 0;

	expect_ok(histd_driver_truncate(t->d, tenant, id, up_to_seq, 0, &rev,
					&cur));
	return rev;
}

static void truncate_deletes_messages_up_to_seq_and_keeps_seqs(void **state)
{
	ctest *t = *state;
	const change_copy **c;
	histd_read_result rr;
	size_t n;
	tmsg m[6];

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_texts(m, 6, "truncated");
	append_ok(t, TA, "s1", m, 5, 1);
	expect_eq(truncate_ok(t, TA, "s1", 2), 3, "truncate revision");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 5, .cleared_to_seq = 2,
		.message_count = 3, .token_total = tokens_of(&m[2], 3),
		.bytes_total = bytes_of(&m[2], 3, 3), .first_seq = 3 });
	read_all(t, TA, "s1", &rr);
	expect_records(&rr.records, 3, &m[2], 3);
	expect_eq(rr.cleared_to_seq, 2, "read cleared_to_seq");
	histd_read_result_clear(&rr);

	/* Create reports nothing: the append, then the truncate. */
	n = changes_wait(t, TA, "s1", 2, 3, &c);
	expect_eq(n, 2, "changes");
	expect_eq(c[1]->kind, HISTD_CHANGE_CLEARED, "truncate notifies");
	expect_eq(c[1]->revision, 3, "notified revision");
	expect_eq(c[1]->cleared_to_seq, 2, "notified cleared_to_seq");
	free(c);

	/* Appends continue after last_seq. */
	append_ok(t, TA, "s1", &m[5], 1, 6);
	expect_messages(t, TA, "s1", 3, &m[2], 4);
	/* Up to every seq: the session is empty, last_seq kept. */
	expect_eq(truncate_ok(t, TA, "s1", 6), 5, "truncate all revision");
	expect_state(t, TA, "s1", (want_state){
		.revision = 5, .last_seq = 6, .cleared_to_seq = 6 });
	tmsgs_free(m, 6);
}

static void truncate_with_nothing_to_delete_changes_nothing(void **state)
{
	ctest *t = *state;
	uint64_t rev = 0, cur = SENTINEL_U64;
	tmsg m[3];

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_texts(m, 3, "kept");
	append_ok(t, TA, "s1", m, 3, 1);
	expect_eq(truncate_ok(t, TA, "s1", 1), 3, "first truncate");
	expect_eq(truncate_ok(t, TA, "s1", 1), 3, "same truncate again");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 3, .cleared_to_seq = 1,
		.message_count = 2, .token_total = tokens_of(&m[1], 2),
		.bytes_total = bytes_of(&m[1], 2, 2), .first_seq = 2 });
	expect_err(HISTD_ECONFLICT,
		   histd_driver_truncate(t->d, TA, "s1", 2, 2, &rev, &cur));
	expect_eq(cur, 3, "current_revision");
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_truncate(t->d, TA, "nope", 2, 0, &rev, &cur));
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_truncate(t->d, TB, "s1", 2, 0, &rev, &cur));
	expect_messages(t, TA, "s1", 2, &m[1], 2);
	tmsgs_free(m, 3);
}

static void truncate_drops_tool_state_and_summaries_of_deleted_messages(void **state)
{
	ctest *t = *state;
	histd_record *rec = SENTINEL_RECORD, *s2, *s4;
	histd_append_result res;
	tmsg m[5], r1, r2;

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_text(&m[0], USER, "go");
	tmsg_calls(&m[1], "looking", IDS("c1"));
	tmsg_results(&m[2], IDS("c1"));
	tmsg_calls(&m[3], "looking again", IDS("c2"));
	tmsg_text(&m[4], USER, "meanwhile");
	tmsg_results(&r1, IDS("c1"));
	tmsg_results(&r2, IDS("c2"));
	append_ok(t, TA, "s1", m, 5, 1);
	s2 = summary_new(1, 2, "went looking");
	s4 = summary_new(1, 4, "went looking twice");
	summary_put_ok(t, TA, "s1", s4);
	summary_put_ok(t, TA, "s1", s2);

	expect_eq(truncate_ok(t, TA, "s1", 3), 5, "truncate revision");
	expect_state(t, TA, "s1", (want_state){
		.revision = 5, .last_seq = 5, .cleared_to_seq = 3,
		.message_count = 2, .token_total = tokens_of(&m[3], 2),
		.bytes_total = bytes_of(&m[3], 2, 4), .first_seq = 4,
		.summary_count = 1 });
	expect_summary(t, TA, "s1", s4);
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	/* The truncated call is gone: nothing can answer it now. */
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &r1, 1, &res));
	/* The kept call is still open. */
	append_ok(t, TA, "s1", &r2, 1, 6);
	rec = NULL;
	expect_ok(histd_driver_tool_result(t->d, TA, "s1", "c2", &rec));
	expect_eq(rec->seq, 6, "tool result seq");
	histd_record_free(rec);
	histd_record_free(s2);
	histd_record_free(s4);
	tmsg_free(&r1);
	tmsg_free(&r2);
	tmsgs_free(m, 5);
}

static size_t hits_for(ctest *t, const char *word)
{
	histd_search_query q;
	histd_search_result r;
	size_t n;

	memset(&q, 0, sizeof(q));
	memset(&r, 0, sizeof(r));
	q.tenant = TA;
	q.mode = HISTD_SEARCH_LEXICAL;
	q.text = word;
	q.k = 10;
	expect_ok(histd_driver_search(t->d, &q, &r));
	n = r.n;
	histd_search_result_clear(&r);
	return n;
}

static void truncate_removes_messages_from_search(void **state)
{
	ctest *t = *state;
	tmsg m[4];

	need_v3(t);
	if (!histd_driver_can_search(t->d))
		skip();
	create_ok(t, TA, "s1");
	tmsg_text(&m[0], USER, "the zebra crossed");
	tmsg_text(&m[1], ASSISTANT, "a zebra and an okapi");
	tmsg_text(&m[2], USER, "the okapi stayed");
	tmsg_text(&m[3], ASSISTANT, "a zebra came back");
	append_ok(t, TA, "s1", m, 3, 1);
	/* Searched once before, so an index that exists must follow. */
	expect_eq(hits_for(t, "zebra"), 2, "zebra hits before");
	truncate_ok(t, TA, "s1", 2);
	expect_eq(hits_for(t, "zebra"), 0, "zebra hits after");
	expect_eq(hits_for(t, "okapi"), 1, "okapi hits after");
	append_ok(t, TA, "s1", &m[3], 1, 4);
	expect_eq(hits_for(t, "zebra"), 1, "zebra hits after an append");
	tmsgs_free(m, 4);
}


/* ---- truncate keeps system messages ---- */

/* Whether the driver keeps its data across a close and an open on the same
 * store. The memory driver, by design, does not. */
static int durable(const ctest *t)
{
	return strcmp(t->fx->driver, "memory") != 0;
}

/* Closes the test's driver and opens it again on the same store, as a
 * restart of histd would. */
static void reopen(ctest *t)
{
	histd_driver_close(t->d);
	t->d = NULL;
	expect_ok(histd_driver_open(t->fx->driver, &t->cfg, &t->d));
	histd_driver_set_notify(t->d, change_log_hook, &t->log);
}

/* rs holds exactly the messages at `seqs` (n of them, ascending), where
 * m[i] was appended at seq i + 1. */
static void expect_seqs(const histd_records *rs, const tmsg *m,
			const uint64_t *seqs, size_t n)
{
	size_t i;

	expect_eq(rs->n, n, "number of records");
	for (i = 0; i < n; i++)
		expect_record(&rs->v[i], seqs[i], &m[seqs[i] - 1]);
}

/* One read; the records must be exactly `seqs` (m as in expect_seqs). */
static void expect_read_seqs(ctest *t, const char *id, uint64_t after_seq,
			     uint32_t limit, uint32_t last_n, int want_more,
			     const tmsg *m, const uint64_t *seqs, size_t n)
{
	histd_read_result rr;
	histd_read q;

	memset(&q, 0, sizeof(q));
	q.tenant = TA;
	q.session_id = id;
	q.after_seq = after_seq;
	q.limit = limit;
	q.last_n = last_n;
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &q, &rr));
	expect_seqs(&rr.records, m, seqs, n);
	expect_eq(rr.has_more, want_more, "has_more");
	histd_read_result_clear(&rr);
}

/* Tokens and stored bytes of the messages at `seqs` (m as in expect_seqs). */
static uint64_t tokens_at(const tmsg *m, const uint64_t *seqs, size_t n)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++)
		sum += m[seqs[i] - 1].tokens;
	return sum;
}

static uint64_t bytes_at(const tmsg *m, const uint64_t *seqs, size_t n)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++)
		sum += stored_len(&m[seqs[i] - 1], seqs[i]);
	return sum;
}

static void truncate_keeps_system_messages_and_reads_return_them(void **state)
{
	ctest *t = *state;
	static const uint64_t kept[] = { 1, 4, 6, 7 };
	const change_copy **c;
	histd_read_result rr;
	size_t n;
	tmsg m[8];

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_text(&m[0], SYSTEM, "you are terse");
	tmsg_text(&m[1], USER, "first question");
	tmsg_text(&m[2], ASSISTANT, "first answer");
	tmsg_text(&m[3], SYSTEM, "be brief from now on");
	tmsg_text(&m[4], USER, "second question");
	tmsg_text(&m[5], ASSISTANT, "second answer");
	tmsg_text(&m[6], USER, "third question");
	tmsg_text(&m[7], ASSISTANT, "third answer");
	append_ok(t, TA, "s1", m, 7, 1);

	/* Seqs 2, 3 and 5 go; the system messages at 1 and 4 stay. */
	expect_eq(truncate_ok(t, TA, "s1", 5), 3, "truncate revision");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 7, .cleared_to_seq = 5,
		.message_count = 4, .token_total = tokens_at(m, kept, 4),
		.bytes_total = bytes_at(m, kept, 4), .first_seq = 1 });

	/* Reads count them as usual. */
	expect_read_seqs(t, "s1", 0, 0, 0, 0, m, kept, 4);
	expect_read_seqs(t, "s1", 1, 0, 0, 0, m, &kept[1], 3);
	expect_read_seqs(t, "s1", 4, 0, 0, 0, m, &kept[2], 2);
	expect_read_seqs(t, "s1", 0, 2, 0, 1, m, kept, 2);
	expect_read_seqs(t, "s1", 0, 0, 3, 0, m, &kept[1], 3);
	expect_read_seqs(t, "s1", 0, 0, 10, 0, m, kept, 4);
	read_all(t, TA, "s1", &rr);
	expect_eq(rr.cleared_to_seq, 5, "read cleared_to_seq");
	expect_eq(rr.last_seq, 7, "read last_seq");
	histd_read_result_clear(&rr);

	n = changes_wait(t, TA, "s1", 2, 3, &c);
	expect_eq(n, 2, "changes");
	expect_eq(c[1]->kind, HISTD_CHANGE_CLEARED, "truncate notifies");
	expect_eq(c[1]->revision, 3, "notified revision");
	expect_eq(c[1]->cleared_to_seq, 5, "notified cleared_to_seq");
	expect_eq(c[1]->system_kept, 1, "notified system_kept");
	free(c);

	/* Appends continue after last_seq. */
	append_ok(t, TA, "s1", &m[7], 1, 8);
	expect_eq(revision_of(t, TA, "s1"), 4, "revision after append");

	/* Clear removes the system messages too, and says so. */
	clear_ok(t, TA, "s1", 5, 8);
	expect_state(t, TA, "s1", (want_state){
		.revision = 5, .last_seq = 8, .cleared_to_seq = 8 });
	n = changes_wait(t, TA, "s1", 4, 5, &c);
	expect_eq(n, 4, "changes after clear");
	expect_eq(c[3]->kind, HISTD_CHANGE_CLEARED, "clear notifies");
	expect_eq(c[3]->system_kept, 0, "clear system_kept");
	free(c);
	tmsgs_free(m, 8);
}

static void truncate_with_only_system_messages_to_delete_changes_nothing(void **state)
{
	ctest *t = *state;
	static const uint64_t all[] = { 1, 2, 3, 4 }, kept[] = { 1, 2, 4 };
	tmsg m[5];

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_text(&m[0], SYSTEM, "you are terse");
	tmsg_text(&m[1], SYSTEM, "answer in French");
	tmsg_text(&m[2], USER, "bonjour");
	tmsg_text(&m[3], ASSISTANT, "salut");
	tmsg_text(&m[4], USER, "merci");
	append_ok(t, TA, "s1", m, 4, 1);

	/* Only system messages at or below 2: nothing changes. */
	expect_eq(truncate_ok(t, TA, "s1", 2), 2, "system-only truncate");
	expect_state(t, TA, "s1", (want_state){
		.revision = 2, .last_seq = 4, .cleared_to_seq = 0,
		.message_count = 4, .token_total = tokens_at(m, all, 4),
		.bytes_total = bytes_at(m, all, 4), .first_seq = 1 });

	expect_eq(truncate_ok(t, TA, "s1", 3), 3, "truncate revision");
	/* Again, and lower: only system messages are left at or below. */
	expect_eq(truncate_ok(t, TA, "s1", 3), 3, "same truncate again");
	expect_eq(truncate_ok(t, TA, "s1", 1), 3, "lower truncate");
	expect_state(t, TA, "s1", (want_state){
		.revision = 3, .last_seq = 4, .cleared_to_seq = 3,
		.message_count = 3, .token_total = tokens_at(m, kept, 3),
		.bytes_total = bytes_at(m, kept, 3), .first_seq = 1 });
	expect_read_seqs(t, "s1", 0, 0, 0, 0, m, kept, 3);

	/* Past last_seq counts as last_seq: only the system messages stay;
	 * then nothing is left to delete, whatever up_to_seq. */
	expect_eq(truncate_ok(t, TA, "s1", 100), 4, "truncate past last_seq");
	expect_state(t, TA, "s1", (want_state){
		.revision = 4, .last_seq = 4, .cleared_to_seq = 4,
		.message_count = 2, .token_total = tokens_at(m, all, 2),
		.bytes_total = bytes_at(m, all, 2), .first_seq = 1 });
	expect_eq(truncate_ok(t, TA, "s1", 100), 4, "nothing left to delete");
	append_ok(t, TA, "s1", &m[4], 1, 5);
	/* The no-op truncates notified nothing. */
	expect_change_revisions(t, TA, "s1", 2, 5);
	tmsgs_free(m, 5);
}

static void truncate_keeps_system_messages_across_a_restart(void **state)
{
	ctest *t = *state;
	static const uint64_t kept[] = { 1, 5, 6, 7, 8 },
			      kept2[] = { 1, 7 };
	histd_record *rec = SENTINEL_RECORD, *s3, *s6;
	histd_append_result res;
	tmsg m[9], late;

	need_v3(t);
	create_ok(t, TA, "s1");
	tmsg_text(&m[0], SYSTEM, "you are a careful agent");
	tmsg_text(&m[1], USER, "look it up");
	tmsg_calls(&m[2], "looking", IDS("c1"));
	tmsg_results(&m[3], IDS("c1"));
	tmsg_calls(&m[4], "looking again", IDS("c2"));
	tmsg_text(&m[5], USER, "meanwhile");
	tmsg_text(&m[6], SYSTEM, "use the metric system");
	tmsg_text(&m[7], ASSISTANT, "noted");
	tmsg_results(&m[8], IDS("c2"));
	tmsg_results(&late, IDS("c1"));
	append_ok(t, TA, "s1", m, 8, 1);
	s3 = summary_new(1, 3, "asked and looked");
	s6 = summary_new(1, 6, "asked, looked twice");
	summary_put_ok(t, TA, "s1", s3);
	summary_put_ok(t, TA, "s1", s6);

	/* Deletes seqs 2..4 (and the c1 call with them, and the summary
	 * covering up to 3); keeps the system message at 1. */
	expect_eq(truncate_ok(t, TA, "s1", 4), 5, "truncate revision");
	if (durable(t))
		reopen(t);
	expect_state(t, TA, "s1", (want_state){
		.revision = 5, .last_seq = 8, .cleared_to_seq = 4,
		.message_count = 5, .token_total = tokens_at(m, kept, 5),
		.bytes_total = bytes_at(m, kept, 5), .first_seq = 1,
		.summary_count = 1 });
	expect_read_seqs(t, "s1", 0, 0, 0, 0, m, kept, 5);
	expect_read_seqs(t, "s1", 1, 0, 0, 0, m, &kept[1], 4);
	expect_read_seqs(t, "s1", 0, 0, 2, 0, m, &kept[3], 2);
	expect_summary(t, TA, "s1", s6);
	expect_err(HISTD_ENOTFOUND,
		   histd_driver_tool_result(t->d, TA, "s1", "c1", &rec));
	assert_ptr_equal(rec, SENTINEL_RECORD);
	expect_err(HISTD_EINVALID, append_msgs(t, TA, "s1", 0, &late, 1, &res));
	append_ok(t, TA, "s1", &m[8], 1, 9);

	/* A second truncate, after the restart: the replay of the first one
	 * and the state it left must agree with the live driver's. */
	expect_eq(truncate_ok(t, TA, "s1", 9), 7, "second truncate");
	if (durable(t))
		reopen(t);
	expect_state(t, TA, "s1", (want_state){
		.revision = 7, .last_seq = 9, .cleared_to_seq = 9,
		.message_count = 2, .token_total = tokens_at(m, kept2, 2),
		.bytes_total = bytes_at(m, kept2, 2), .first_seq = 1 });
	expect_read_seqs(t, "s1", 0, 0, 0, 0, m, kept2, 2);
	expect_read_seqs(t, "s1", 0, 0, 1, 0, m, &kept2[1], 1);
	expect_summary(t, TA, "s1", NULL);
	expect_eq(truncate_ok(t, TA, "s1", 9), 7, "nothing left to delete");
	histd_record_free(s3);
	histd_record_free(s6);
	tmsg_free(&late);
	tmsgs_free(m, 9);
}

/* ---------------------------------------------------------------------- */
/* Listing tenants (version 4)                                             */

/* One tenant_list call answers exactly want[0..n) and has_more. */
static void expect_tenants(ctest *t, const char *after, uint32_t limit,
			   const char *const *want, size_t n, int want_more)
{
	histd_tenant_list l = { 0 };
	char got[128] = "";
	size_t i, bad = n, got_n;
	int more;

	expect_ok(histd_driver_tenant_list(t->d, after, limit, &l));
	for (i = 0; i < l.n && i < n && bad == n; i++)
		if (strcmp(l.v[i], want[i]) != 0) {
			snprintf(got, sizeof(got), "%s", l.v[i]);
			bad = i;
		}
	got_n = l.n;
	more = l.has_more;
	histd_tenant_list_free(&l);
	if (bad < n)
		fail_msg("tenants after '%s': #%zu is '%s', want '%s'",
			 after ? after : "", bad, got, want[bad]);
	expect_eq(got_n, n, "tenants listed");
	expect_eq(more, want_more, "has_more");
}

static void tenant_list_pages_in_byte_order_without_emptied_tenants(void **state)
{
	static const char *const all[] = { "B", "a", "a-2", "b", "half" };
	ctest *t = *state;
	histd_tenant_list l = { 0 };
	uint64_t cur;

	expect_tenants(t, NULL, 10, NULL, 0, 0);
	/* Byte order: upper case before lower, a prefix before its
	 * extensions. */
	create_ok(t, "b", "s1");
	create_ok(t, "a-2", "s1");
	create_ok(t, "a", "s1");
	create_ok(t, "a", "s2");
	create_ok(t, "B", "s1");
	/* A tenant whose every session is deleted holds nothing; one that
	 * keeps a session is still listed. */
	create_ok(t, "gone", "s1");
	create_ok(t, "gone", "s2");
	create_ok(t, "half", "s1");
	create_ok(t, "half", "s2");
	expect_ok(histd_driver_session_delete(t->d, "gone", "s1", 0, &cur));
	expect_ok(histd_driver_session_delete(t->d, "gone", "s2", 0, &cur));
	expect_ok(histd_driver_session_delete(t->d, "half", "s1", 0, &cur));

	for (int pass = 0; pass < 2; pass++) {
		expect_tenants(t, NULL, 10, all, 5, 0);
		expect_tenants(t, "", 5, all, 5, 0);
		expect_tenants(t, NULL, 2, all, 2, 1);
		expect_tenants(t, "a", 2, &all[2], 2, 1);
		expect_tenants(t, "b", 2, &all[4], 1, 0);
		/* after need not be a tenant. */
		expect_tenants(t, "a-1", 10, &all[2], 3, 0);
		expect_tenants(t, "half", 10, NULL, 0, 0);
		/* As a restart finds them. */
		if (!durable(t))
			break;
		reopen(t);
	}
	/* A tenant comes back with its first session. */
	create_ok(t, "gone", "s3");
	expect_tenants(t, "b", 10,
		       (const char *const[]){ "gone", "half" }, 2, 0);
	l.n = 7;
	expect_err(HISTD_EINVALID, histd_driver_tenant_list(t->d, NULL, 0, &l));
	expect_eq(l.n, 7, "list untouched on error");
}

#define MANY_TENANTS 300

static void tenant_list_pages_through_every_tenant_without_a_cap(void **state)
{
	ctest *t = *state;
	char names[MANY_TENANTS][16];
	const char *want[MANY_TENANTS];
	char *after = NULL;
	size_t seen = 0, pages = 0;
	int more;

	for (size_t i = 0; i < MANY_TENANTS; i++) {
		snprintf(names[i], sizeof(names[i]), "t-%03zu", i);
		want[i] = names[i];
	}
	/* Created in an order unlike the names'. */
	for (size_t i = 0; i < MANY_TENANTS; i++)
		create_ok(t, names[(i * 7) % MANY_TENANTS], "s");
	expect_tenants(t, NULL, 1000, want, MANY_TENANTS, 0);
	expect_tenants(t, NULL, 256, want, 256, 1);
	expect_tenants(t, names[255], 256, &want[256], MANY_TENANTS - 256, 0);
	/* Page by page, as the sweeper walks them. */
	do {
		histd_tenant_list l = { 0 };

		expect_ok(histd_driver_tenant_list(t->d, after, 7, &l));
		for (size_t i = 0; i < l.n; i++) {
			if (seen >= MANY_TENANTS ||
			    strcmp(l.v[i], want[seen]) != 0)
				fail_msg("tenant #%zu is '%s'", seen, l.v[i]);
			seen++;
		}
		more = l.has_more;
		free(after);
		after = l.n ? xstrdup(l.v[l.n - 1]) : NULL;
		histd_tenant_list_free(&l);
		pages++;
	} while (more);
	free(after);
	expect_eq(seen, MANY_TENANTS, "tenants seen page by page");
	expect_eq(pages, (MANY_TENANTS + 6) / 7, "pages");
}

/* ---- active_at_us: the server time of the last change ---- */

/* A user message whose created_at is the caller's (an imported one). */
static void tmsg_dated(tmsg *m, const char *text, int64_t created_us)
{
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock cb = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &cb };
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;

	memset(m, 0, sizeof(*m));
	tb.text = (char *)text;
	cb.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	cb.text = &tb;
	ts.seconds = created_us / 1000000;
	msg.role = USER;
	msg.author = "conformance";
	msg.created_at = &ts;
	msg.n_content = 1;
	msg.content = blocks;
	tmsg_pack(m, &msg, 3);
}

/* The session's active_at_us, the same from get, list and read. */
static int64_t active_at(ctest *t, const char *id)
{
	histd_list q = { .tenant = TA, .limit = 100 };
	histd_session_list l = { 0 };
	histd_read rq = { .tenant = TA, .session_id = id, .want_session = 1 };
	histd_read_result rr;
	histd_session *s = get_ok(t, TA, id);
	int64_t at = s->active_at_us;
	size_t i;

	histd_session_free(s);
	expect_ok(histd_driver_session_list(t->d, &q, &l));
	for (i = 0; i < l.n && strcmp(l.v[i]->id, id) != 0; i++)
		;
	assert_true(i < l.n);
	expect_eq(l.v[i]->active_at_us, at, "active_at_us in the list");
	histd_session_list_free(&l);
	memset(&rr, 0, sizeof(rr));
	expect_ok(histd_driver_read(t->d, &rq, &rr));
	assert_non_null(rr.session);
	expect_eq(rr.session->active_at_us, at, "active_at_us of a read");
	histd_read_result_clear(&rr);
	return at;
}

/* A change the driver dates with its own clock happened between the
 * times taken before and after the call. */
static void expect_active_between(ctest *t, const char *id, int64_t before,
				  const char *what)
{
	int64_t at = active_at(t, id), after = histd_now_us();

	if (at < before || at > after)
		fail_msg("%s: active_at_us %lld not in [%lld, %lld]", what,
			 (long long)at, (long long)before, (long long)after);
}

static void active_at_follows_every_change_and_no_read(void **state)
{
	ctest *t = *state;
	const int64_t day = INT64_C(86400000000);
	static const float v[3] = { 1, 0, 0 };
	histd_session in = sess_in(TA, "f"), *out = NULL;
	histd_append_result res;
	uint64_t cleared = 0, rev, cur;
	histd_record *sum;
	tmsg m[3];
	int64_t before;

	create_ok(t, TA, "s1");
	expect_eq(active_at(t, "s1"), T0, "after create");
	expect_ok(histd_driver_session_update(t->d, TA, "s1", 0, NULL, 0, NULL,
					      0, T0 + 10, &out, &cur));
	expect_eq(out->active_at_us, T0 + 10, "update's record");
	histd_session_free(out);
	out = NULL;
	expect_eq(active_at(t, "s1"), T0 + 10, "after update");

	/* An imported message dated ten days back: the append's time
	 * counts, not the message's. */
	tmsg_dated(&m[0], "from an old transcript", T0 - 10 * day);
	tmsg_text(&m[1], ASSISTANT, "and its answer");
	tmsg_text(&m[2], USER, "a new start");
	memset(&res, 0, sizeof(res));
	expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0 + 20, 0, m, 1, &res));
	expect_eq(active_at(t, "s1"), T0 + 20, "after an old-dated append");
	if (durable(t)) {
		reopen(t);
		expect_eq(active_at(t, "s1"), T0 + 20, "after a restart");
	}
	/* Reads (all of the above) and failed writes move nothing. */
	expect_err(HISTD_ECONFLICT, append_full(t, TA, "s1", 1, NULL, 0,
						T0 + 25, 0, &m[1], 1, &res));
	expect_eq(active_at(t, "s1"), T0 + 20, "after a conflict");

	/* Replace: its now_us. */
	memset(&res, 0, sizeof(res));
	expect_ok(append_replace(t, TA, "s1", 0, &m[1], 1, &res, &cleared));
	expect_eq(active_at(t, "s1"), T0, "after replace (now_us T0)");
	expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0 + 30, 0, &m[2], 1,
			      &res));
	expect_eq(active_at(t, "s1"), T0 + 30, "after an append");

	/* An embedding is derived data, not a change. */
	if (t->d->version >= 2 && t->d->embedding_put) {
		expect_ok(histd_driver_embedding_put(t->d, TA, "s1", res.last_seq,
						     "m1", v, 3));
		expect_eq(active_at(t, "s1"), T0 + 30, "after embedding_put");
	}

	/* Clear, summary put and truncate carry no time: the driver's
	 * clock dates them. */
	before = histd_now_us();
	sum = summary_new(1, res.last_seq, "what was said");
	summary_put_ok(t, TA, "s1", sum);
	histd_record_free(sum);
	expect_active_between(t, "s1", before, "after summary_put");
	if (t->d->version >= 3) {
		expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0 + 40, 0, &m[1],
				      1, &res));
		expect_eq(active_at(t, "s1"), T0 + 40, "after an append");
		before = histd_now_us();
		truncate_ok(t, TA, "s1", res.last_seq);
		expect_active_between(t, "s1", before, "after truncate");
		if (durable(t)) {
			int64_t at = active_at(t, "s1");

			reopen(t);
			expect_eq(active_at(t, "s1"), at, "truncate's, restarted");
		}
	}
	expect_ok(append_full(t, TA, "s1", 0, NULL, 0, T0 + 50, 0, &m[2], 1,
			      &res));
	before = histd_now_us();
	expect_ok(histd_driver_clear(t->d, TA, "s1", 0, &rev, &cleared, &cur));
	expect_active_between(t, "s1", before, "after clear");
	if (durable(t)) {
		int64_t at = active_at(t, "s1");

		reopen(t);
		expect_eq(active_at(t, "s1"), at, "clear's, restarted");
	}

	/* A fork is created: its created_at; its source is only read. */
	before = active_at(t, "s1");
	in.created_at_us = T0 + 60;
	expect_ok(histd_driver_session_fork(t->d, TA, "s1", 0, &in, &out));
	expect_eq(out->active_at_us, T0 + 60, "fork's record");
	histd_session_free(out);
	expect_eq(active_at(t, "f"), T0 + 60, "fork");
	expect_eq(active_at(t, "s1"), before, "fork's source");
	tmsgs_free(m, 3);
}

/* ---------------------------------------------------------------------- */

#define T(f) cmocka_unit_test_prestate_setup_teardown(f, conf_setup, \
	conf_teardown, (void *)fx)

int histd_conformance_run(const histd_conformance_fixture *fx)
{
	const struct CMUnitTest tests[] = {
		T(driver_is_registered_valid_and_answers_ping),

		T(session_create_returns_the_record_at_revision_1),
		T(session_create_without_keys_labels_or_config_has_none),
		T(session_get_of_unknown_id_is_not_found),
		T(session_create_with_taken_id_is_exists),
		T(session_create_with_taken_context_keys_is_exists),
		T(session_create_with_id_or_keys_of_another_tenant_is_allowed),

		T(session_resolve_creates_once_then_returns_the_same_session),
		T(session_resolve_finds_a_session_made_by_create),
		T(session_resolve_matches_the_exact_key_set),
		T(session_resolve_and_create_take_the_largest_context_keys),
		T(session_resolve_with_taken_id_and_new_keys_is_exists),
		T(session_resolve_is_per_tenant),
		T(session_resolve_is_atomic_under_racing_threads),

		T(session_list_pages_by_after_id_in_byte_order),
		T(session_list_filters_by_every_label_pair),
		T(session_list_is_per_tenant),
		T(session_list_returns_full_records),

		T(session_update_replaces_labels_and_config_and_adds_a_revision),
		T(session_update_with_stale_expected_revision_is_conflict),
		T(session_update_of_unknown_session_is_not_found),

		T(session_delete_removes_the_session_and_everything_in_it),
		T(session_recreated_after_delete_starts_again_at_seq_1),
		T(session_created_again_is_another_life),
		T(delete_of_an_earlier_life_leaves_the_new_one),
		T(truncate_of_an_earlier_life_leaves_the_new_one),
		T(summary_put_of_an_earlier_life_leaves_the_new_one),
		T(embedding_put_of_an_earlier_life_leaves_the_new_one),
		T(fork_of_an_earlier_life_creates_nothing),
		T(session_delete_with_stale_expected_revision_is_conflict),

		T(session_fork_copies_messages_up_to_seq_with_their_seqs),
		T(session_fork_with_up_to_seq_0_copies_everything),
		T(session_fork_beyond_last_seq_continues_after_last_seq),
		T(session_fork_appends_continue_after_up_to_seq),
		T(session_fork_copies_summaries_up_to_seq),
		T(session_fork_copies_tool_call_state),
		T(session_fork_leaves_the_source_untouched),
		T(session_fork_of_a_cleared_source_keeps_cleared_to_seq),
		T(session_fork_of_unknown_source_is_not_found),
		T(session_fork_onto_a_taken_id_is_exists),

		T(other_tenants_session_is_not_found_for_every_operation),

		T(append_assigns_consecutive_seqs_from_1),
		T(append_adds_exactly_one_revision_per_batch),
		T(append_keeps_exact_stats),
		T(append_batch_with_one_invalid_tool_ref_appends_nothing),
		T(append_to_unknown_session_is_not_found),
		T(append_with_stale_expected_revision_is_conflict),
		T(append_retry_with_same_idempotency_key_is_replayed),
		T(append_same_idempotency_key_with_other_request_is_precondition),
		T(append_idempotency_key_is_checked_before_revision),
		T(append_expired_idempotency_key_is_forgotten),
		T(append_idempotency_key_of_a_failed_append_is_not_remembered),
		T(append_idempotency_keys_are_per_session),
		T(append_without_idempotency_key_always_appends),

		T(tool_result_for_unknown_call_is_invalid),
		T(tool_call_answered_twice_is_invalid),
		T(tool_call_id_reused_is_invalid),
		T(tool_call_and_result_in_one_batch_are_accepted),
		T(tool_result_returns_the_message_holding_the_result),
		T(tool_result_of_unknown_or_unanswered_call_is_not_found),

		T(read_pages_by_after_seq_and_limit),
		T(read_last_n_returns_the_newest),
		T(read_with_a_byte_budget_keeps_what_fits),
		T(read_reports_revision_last_seq_and_cleared_to_seq),
		T(read_with_want_session_returns_the_session),
		T(read_with_want_summary_returns_the_newest_summary),
		T(read_at_a_known_revision_may_leave_out_what_the_caller_holds),
		T(read_with_frame_field_gives_the_same_records),
		T(records_framed_whole_or_not_at_all),
		T(read_of_an_empty_session_returns_nothing),
		T(read_of_unknown_session_is_not_found),

		T(clear_removes_messages_and_summaries_and_keeps_last_seq),
		T(seq_never_reused_after_clear),
		T(clear_resets_the_tool_call_index),
		T(clear_with_stale_expected_revision_is_conflict),
		T(clear_of_an_empty_session_clears_to_0),

		T(replace_swaps_every_message_for_new_seqs),
		T(replace_checks_tool_refs_against_an_empty_index),
		T(replace_with_no_messages_clears),
		T(seq_never_reused_after_replace),
		T(replace_with_stale_expected_revision_is_conflict),
		T(replace_ignores_the_idempotency_key),

		T(summary_get_without_a_summary_returns_null),
		T(summary_put_adds_a_revision_and_get_returns_the_newest),
		T(summary_put_with_stale_expected_revision_is_conflict),
		T(summary_of_unknown_session_is_not_found),

		T(notify_reports_every_change_in_revision_order),
		T(notify_is_silent_for_failed_and_replayed_writes),

		T(concurrent_appends_to_one_session_assign_every_seq_once),
		T(concurrent_expected_revision_appends_let_one_writer_win),
		T(concurrent_creates_of_one_id_or_key_set_let_one_win),

		T(limit_on_sessions_per_tenant_stops_create_resolve_and_fork),
		T(limit_on_session_messages_stops_append_and_replace),
		T(limit_on_session_bytes_stops_append_and_fork_copies_within),
		T(truncate_deletes_messages_up_to_seq_and_keeps_seqs),
		T(truncate_with_nothing_to_delete_changes_nothing),
		T(truncate_drops_tool_state_and_summaries_of_deleted_messages),
		T(truncate_removes_messages_from_search),
		T(truncate_keeps_system_messages_and_reads_return_them),
		T(truncate_with_only_system_messages_to_delete_changes_nothing),
		T(truncate_keeps_system_messages_across_a_restart),

		T(tenant_list_pages_in_byte_order_without_emptied_tenants),
		T(tenant_list_pages_through_every_tenant_without_a_cap),

		T(active_at_follows_every_change_and_no_read),
	};
	const char *filter = getenv("HISTD_TEST_FILTER");
	char group[96];

	if (filter && *filter)
		cmocka_set_test_filter(filter);
	snprintf(group, sizeof(group), "driver conformance: %s", fx->driver);
	return _cmocka_run_group_tests(group, tests, N_OF(tests), NULL, NULL) +
	       histd_conformance_search_run(fx);
}
