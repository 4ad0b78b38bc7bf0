/*
 * The search part of the driver conformance suite (driver.h, version 2:
 * search and embedding_put), run by histd_conformance_run on every driver.
 *
 * A small corpus with known answers: each query has a set of relevant
 * messages, and precision at k is asserted, so a driver may rank by its own
 * text search (PostgreSQL's) and still pass as long as it finds the right
 * messages first.
 */
#include "conformance.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "histd/v1/histd.pb-c.h"

#define TA "tenant-a"
#define TB "tenant-b"
#define T0 INT64_C(1700000000000000)
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

#define SYSTEM HISTD__V1__ROLE__ROLE_SYSTEM
#define USER HISTD__V1__ROLE__ROLE_USER
#define ASSISTANT HISTD__V1__ROLE__ROLE_ASSISTANT
#define TOOL HISTD__V1__ROLE__ROLE_TOOL

#define expect_ok(call) do { \
	int rc_ = (call); \
	if (rc_ != 0) \
		fail_msg("%s: %s: %s", #call, histd_error_name(rc_), \
			 histd_error_message()); \
} while (0)

#define expect_eq(got, want, what) do { \
	unsigned long long g_ = (got), w_ = (want); \
	if (g_ != w_) \
		fail_msg("%s: got %llu, want %llu", (what), g_, w_); \
} while (0)

typedef struct stest {
	const histd_conformance_fixture *fx;
	histd_driver_config cfg;
	void *store;
	histd_driver *d;
} stest;

static int s_setup(void **state)
{
	const histd_conformance_fixture *fx = *state;
	stest *t = calloc(1, sizeof(*t));
	int rc;

	if (!t)
		return -1;
	t->fx = fx;
	if ((rc = fx->store_new(fx->ctx, &t->cfg, &t->store))) {
		print_error("fresh %s store: %s\n", fx->driver, histd_error_message());
		free(t);
		return -1;
	}
	if ((rc = histd_driver_open(fx->driver, &t->cfg, &t->d))) {
		print_error("opening driver %s: %s\n", fx->driver,
			    histd_error_message());
		if (fx->store_free)
			fx->store_free(fx->ctx, t->store);
		free(t);
		return -1;
	}
	*state = t;
	return 0;
}

static int s_teardown(void **state)
{
	stest *t = *state;

	histd_driver_close(t->d);
	if (t->fx->store_free)
		t->fx->store_free(t->fx->ctx, t->store);
	free(t);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Messages                                                                */

typedef struct smsg {
	uint8_t *data;
	size_t len;
	histd_tool_ref call, result;
	int has_call, has_result;
} smsg;

static void pack(smsg *m, const Histd__V1__Message *msg)
{
	m->len = histd__v1__message__get_packed_size(msg);
	m->data = malloc(m->len ? m->len : 1);
	if (!m->data)
		abort();
	histd__v1__message__pack(msg, m->data);
}

static smsg text_msg(Histd__V1__Role role, const char *text)
{
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b;
	smsg m = { 0 };

	tb.text = (char *)text;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &tb;
	msg.role = role;
	msg.n_content = 1;
	msg.content = &bp;
	pack(&m, &msg);
	return m;
}

/* An assistant tool call with `args`, then the tool's result `result`. */
static smsg call_msg(const char *id, const char *name, const char *args)
{
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ToolCallBlock tc = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b;
	smsg m = { 0 };

	tc.id = (char *)id;
	tc.name = (char *)name;
	tc.arguments = (char *)args;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b.tool_call = &tc;
	msg.role = ASSISTANT;
	msg.n_content = 1;
	msg.content = &bp;
	pack(&m, &msg);
	m.call = (histd_tool_ref){ .id = id, .block = 0 };
	m.has_call = 1;
	return m;
}

static smsg result_msg(const char *id, const char *text)
{
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ToolResultBlock tr = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	Histd__V1__ContentBlock inner = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *bp = &b, *ip = &inner;
	smsg m = { 0 };

	tb.text = (char *)text;
	inner.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	inner.text = &tb;
	tr.tool_call_id = (char *)id;
	tr.n_content = 1;
	tr.content = &ip;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b.tool_result = &tr;
	msg.role = TOOL;
	msg.n_content = 1;
	msg.content = &bp;
	pack(&m, &msg);
	m.result = (histd_tool_ref){ .id = id, .block = 0 };
	m.has_result = 1;
	return m;
}

static void create(stest *t, const char *tenant, const char *id,
		   const histd_kv *labels, size_t n_labels)
{
	histd_session in = {
		.tenant = (char *)tenant, .id = (char *)id,
		.labels = (histd_kv *)labels, .n_labels = n_labels,
		.created_at_us = T0,
	};
	histd_session *out = NULL;

	expect_ok(histd_driver_session_create(t->d, &in, &out));
	histd_session_free(out);
}

/* Appends the messages (and frees them), one batch. */
static void append(stest *t, const char *tenant, const char *id, smsg *m,
		   size_t n)
{
	histd_msg_in in[32];
	histd_append a = {
		.tenant = tenant, .session_id = id, .msgs = in, .n_msgs = n,
		.now_us = T0,
	};
	histd_append_result r;

	assert_true(n <= N_OF(in));
	for (size_t i = 0; i < n; i++)
		in[i] = (histd_msg_in){
			.data = m[i].data, .len = m[i].len, .token_estimate = 1,
			.calls = m[i].has_call ? &m[i].call : NULL,
			.n_calls = (size_t)m[i].has_call,
			.results = m[i].has_result ? &m[i].result : NULL,
			.n_results = (size_t)m[i].has_result,
		};
	expect_ok(histd_driver_append(t->d, &a, &r));
	for (size_t i = 0; i < n; i++)
		free(m[i].data);
}

static void append1(stest *t, const char *tenant, const char *id, smsg m)
{
	append(t, tenant, id, &m, 1);
}

/* ---------------------------------------------------------------------- */
/* Searching                                                               */

typedef struct want_hit {
	const char *session;
	uint64_t seq;
} want_hit;

static histd_search_query lex(const char *tenant, const char *text, uint32_t k)
{
	return (histd_search_query){
		.tenant = tenant, .mode = HISTD_SEARCH_LEXICAL, .text = text,
		.k = k,
	};
}

static void run(stest *t, const histd_search_query *q, histd_search_result *r)
{
	memset(r, 0, sizeof(*r));
	expect_ok(histd_driver_search(t->d, q, r));
	/* Every hit carries its stored message, seq in front, best first. */
	for (size_t i = 0; i < r->n; i++) {
		Histd__V1__Message *m = histd__v1__message__unpack(
			NULL, r->records.v[i].len, r->records.v[i].data);

		if (!m)
			fail_msg("hit %zu does not unpack as a Message", i);
		expect_eq(m->seq, r->records.v[i].seq, "seq in the hit's bytes");
		histd__v1__message__free_unpacked(m, NULL);
		if (i && r->hits[i].score > r->hits[i - 1].score)
			fail_msg("hit %zu scores above hit %zu", i, i - 1);
	}
}

static int is_hit(const histd_search_result *r, size_t i, const want_hit *w,
		  size_t nw)
{
	for (size_t j = 0; j < nw; j++)
		if (strcmp(r->hits[i].session_id, w[j].session) == 0 &&
		    r->records.v[i].seq == w[j].seq)
			return 1;
	return 0;
}

/* Precision at k: at least min_relevant of the first k hits are in w. */
static void expect_precision(stest *t, const histd_search_query *q,
			     const want_hit *w, size_t nw, size_t min_relevant)
{
	histd_search_result r;
	size_t good = 0;

	run(t, q, &r);
	for (size_t i = 0; i < r.n && i < q->k; i++)
		good += (size_t)is_hit(&r, i, w, nw);
	if (good < min_relevant) {
		char got[512] = "";
		size_t off = 0;

		for (size_t i = 0; i < r.n && off < sizeof(got) - 40; i++)
			off += (size_t)snprintf(got + off, sizeof(got) - off, " %s/%llu",
						r.hits[i].session_id,
						(unsigned long long)r.records.v[i].seq);
		histd_search_result_clear(&r);
		fail_msg("query '%s': %zu relevant in the first %u, want %zu; got%s",
			 q->text, good, q->k, min_relevant, got);
	}
	histd_search_result_clear(&r);
}

/* Exactly these hits, in this order. */
static void expect_hits(stest *t, const histd_search_query *q,
			const want_hit *w, size_t nw)
{
	histd_search_result r;

	run(t, q, &r);
	if (r.n != nw) {
		size_t n = r.n;

		histd_search_result_clear(&r);
		fail_msg("query '%s': %zu hits, want %zu", q->text ? q->text : "",
			 n, nw);
	}
	for (size_t i = 0; i < nw; i++)
		if (strcmp(r.hits[i].session_id, w[i].session) != 0 ||
		    r.records.v[i].seq != w[i].seq) {
			char msg[256];

			snprintf(msg, sizeof(msg), "hit %zu is %s/%llu, want %s/%llu", i,
				 r.hits[i].session_id,
				 (unsigned long long)r.records.v[i].seq, w[i].session,
				 (unsigned long long)w[i].seq);
			histd_search_result_clear(&r);
			fail_msg("query '%s': %s", q->text ? q->text : "", msg);
		}
	histd_search_result_clear(&r);
}

static size_t count_hits(stest *t, const histd_search_query *q)
{
	histd_search_result r;
	size_t n;

	run(t, q, &r);
	n = r.n;
	histd_search_result_clear(&r);
	return n;
}

/* The corpus: three sessions of tenant A on distinct topics, labelled by
 * team; one of tenant B that shares words with them. */
static void corpus(stest *t)
{
	const histd_kv red[] = { { "team", "red" } };
	const histd_kv blue[] = { { "team", "blue" } };
	smsg cooking[] = {
		text_msg(SYSTEM, "You are a helpful kitchen assistant."),
		text_msg(USER, "How long should I bake sourdough bread?"),
		text_msg(ASSISTANT, "Bake the sourdough loaf for 45 minutes at 230 C, "
				    "covered for the first 20 minutes."),
		text_msg(USER, "Can I use rye flour in the sourdough starter?"),
		text_msg(ASSISTANT, "Yes: rye flour makes the starter more active."),
	};
	smsg travel[] = {
		text_msg(USER, "Plan a train trip from Paris to Vienna."),
		text_msg(ASSISTANT, "Take the night train from Paris to Vienna; "
				    "it leaves at 19:58 and arrives at 09:25."),
		text_msg(USER, "Which Vienna museums open on Mondays?"),
		text_msg(ASSISTANT, "The Albertina museum opens every day, Mondays "
				    "included."),
	};
	smsg code[] = {
		text_msg(USER, "Why does my Rust borrow checker complain about a "
			       "mutable borrow?"),
		text_msg(ASSISTANT, "Two mutable borrows of one value cannot "
				    "overlap; end the first borrow before the second."),
		text_msg(USER, "And what is a lifetime annotation in Rust?"),
	};
	smsg other[] = {
		text_msg(USER, "Sourdough bread and Vienna trains and Rust borrows."),
	};

	create(t, TA, "cooking", red, 1);
	create(t, TA, "travel", blue, 1);
	create(t, TA, "code", red, 1);
	create(t, TB, "other", NULL, 0);
	append(t, TA, "cooking", cooking, N_OF(cooking));
	append(t, TA, "travel", travel, N_OF(travel));
	append(t, TA, "code", code, N_OF(code));
	append(t, TB, "other", other, N_OF(other));
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void search_finds_known_answers_with_precision_at_k(void **state)
{
	stest *t = *state;
	histd_search_query q;

	corpus(t);
	{
		const want_hit w[] = { { "cooking", 2 }, { "cooking", 3 },
				       { "cooking", 4 } };

		q = lex(TA, "sourdough", 3);
		expect_precision(t, &q, w, N_OF(w), 3);
	}
	{
		const want_hit w[] = { { "travel", 1 }, { "travel", 2 } };

		q = lex(TA, "night train to Vienna", 2);
		expect_precision(t, &q, w, N_OF(w), 2);
	}
	{
		const want_hit w[] = { { "code", 1 }, { "code", 2 } };

		q = lex(TA, "mutable borrow", 2);
		expect_precision(t, &q, w, N_OF(w), 2);
	}
	{
		/* Rare words outrank common ones: "rye" is in two messages,
		 * "the" in many. */
		const want_hit w[] = { { "cooking", 4 }, { "cooking", 5 } };

		q = lex(TA, "the rye", 1);
		expect_precision(t, &q, w, N_OF(w), 1);
	}
}

static void search_is_case_insensitive_and_unicode_aware(void **state)
{
	stest *t = *state;
	histd_search_query q;

	create(t, TA, "s", NULL, 0);
	append1(t, TA, "s", text_msg(USER, "Ünïcode CAFÉ in Zürich, ΑΘΗΝΑ"));
	append1(t, TA, "s", text_msg(USER, "plain ascii words"));
	q = lex(TA, "café", 5);
	expect_eq(count_hits(t, &q), 1, "hits for café");
	q = lex(TA, "zürich", 5);
	expect_eq(count_hits(t, &q), 1, "hits for zürich");
	q = lex(TA, "αθηνα", 5);
	expect_eq(count_hits(t, &q), 1, "hits for αθηνα");
	q = lex(TA, "WORDS", 5);
	expect_eq(count_hits(t, &q), 1, "hits for WORDS");
	q = lex(TA, "zurich", 5);
	expect_eq(count_hits(t, &q), 0, "hits for zurich");
}

/* Greek capitals with tonos (Ά Έ Ή Ί Ό Ύ Ώ) and with dialytika (Ϊ Ϋ) fold
 * to their small letters, and final sigma to sigma: a word in capitals
 * is found by the word as it is written in small letters, and back. */
static void search_folds_every_greek_capital_and_final_sigma(void **state)
{
	static const char *const q_small[] = {
		"σίσυφος", "άνθρωπος", "έλα", "ήλιος", "όχι", "ύπνος", "ώρα",
		"ϊλιον", "ϋδωρ",
	};
	stest *t = *state;
	histd_search_query q;

	create(t, TA, "g", NULL, 0);
	append1(t, TA, "g", text_msg(USER, "ΣΊΣΥΦΟΣ ΆΝΘΡΩΠΟΣ ΈΛΑ ΉΛΙΟΣ ΌΧΙ "
					   "ΎΠΝΟΣ ΏΡΑ ΪΛΙΟΝ ΫΔΩΡ"));
	append1(t, TA, "g", text_msg(USER, "ο Σίσυφος"));
	for (size_t i = 0; i < N_OF(q_small); i++) {
		char what[64];

		q = lex(TA, q_small[i], 5);
		snprintf(what, sizeof(what), "hits for %s", q_small[i]);
		expect_eq(count_hits(t, &q), i == 0 ? 2 : 1, what);
	}
	q = lex(TA, "ΣΊΣΥΦΟΣ", 5);
	expect_eq(count_hits(t, &q), 2, "hits for ΣΊΣΥΦΟΣ");
}

static void search_without_a_word_is_invalid(void **state)
{
	stest *t = *state;
	histd_search_result r = { 0 };
	histd_search_query q;

	create(t, TA, "s", NULL, 0);
	q = lex(TA, " ,;- ", 5);
	assert_int_equal(histd_driver_search(t->d, &q, &r), HISTD_EINVALID);
	q = lex(TA, "x", 0);
	assert_int_equal(histd_driver_search(t->d, &q, &r), HISTD_EINVALID);
	q = lex(TA, "x", HISTD_SEARCH_K_MAX + 1);
	assert_int_equal(histd_driver_search(t->d, &q, &r), HISTD_EINVALID);
}

static void search_of_an_unknown_tenant_or_session_finds_nothing(void **state)
{
	stest *t = *state;
	const char *ids[] = { "nope" };
	histd_search_query q;

	q = lex("nobody", "anything", 5);
	expect_eq(count_hits(t, &q), 0, "hits in an empty tenant");
	corpus(t);
	q = lex(TA, "sourdough", 5);
	q.session_ids = ids;
	q.n_session_ids = 1;
	expect_eq(count_hits(t, &q), 0, "hits in an unknown session");
}

static void search_returns_at_most_k_best_first(void **state)
{
	stest *t = *state;
	histd_search_query q;

	corpus(t);
	q = lex(TA, "sourdough vienna rust", 2);
	expect_eq(count_hits(t, &q), 2, "hits with k 2");
	q.k = 100;
	expect_eq(count_hits(t, &q), 8, "hits with k 100");
}

static void search_filters_by_role(void **state)
{
	stest *t = *state;
	const want_hit user_only[] = { { "cooking", 2 }, { "cooking", 4 } };
	histd_search_query q;

	corpus(t);
	q = lex(TA, "sourdough", 10);
	q.roles = 1u << USER;
	expect_precision(t, &q, user_only, N_OF(user_only), 2);
	expect_eq(count_hits(t, &q), 2, "user hits");
	q.roles = (1u << USER) | (1u << ASSISTANT);
	expect_eq(count_hits(t, &q), 3, "user and assistant hits");
	q = lex(TA, "kitchen", 10);
	q.roles = 1u << USER;
	expect_eq(count_hits(t, &q), 0, "user hits for a system word");
}

static void search_exclude_newest_leaves_out_each_sessions_newest(void **state)
{
	stest *t = *state;
	histd_search_query q;

	corpus(t);
	/* "lifetime" is only in the newest message of "code". */
	q = lex(TA, "lifetime rust", 10);
	expect_eq(count_hits(t, &q), 2, "hits");
	q.exclude_newest = 1;
	{
		const want_hit w[] = { { "code", 1 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	/* Newest per session: "museum" is in travel's newest (4) and in 3. */
	q = lex(TA, "museums museum", 10);
	q.exclude_newest = 1;
	{
		const want_hit w[] = { { "travel", 3 } };

		expect_hits(t, &q, w, N_OF(w));
	}
}

static void search_scopes_to_a_session_labels_or_the_tenant(void **state)
{
	stest *t = *state;
	const char *ids[] = { "travel", "code" };
	const histd_kv red[] = { { "team", "red" } };
	histd_search_query q;

	corpus(t);
	q = lex(TA, "sourdough vienna rust borrow", 100);
	expect_eq(count_hits(t, &q), 9, "tenant-wide hits");
	q.session_ids = ids;
	q.n_session_ids = 1;
	expect_eq(count_hits(t, &q), 3, "hits in travel");
	q.n_session_ids = 2;
	expect_eq(count_hits(t, &q), 6, "hits in travel and code");
	q.session_ids = NULL;
	q.n_session_ids = 0;
	q.labels = red;
	q.n_labels = 1;
	expect_eq(count_hits(t, &q), 6, "hits in team red");
}

static void search_never_crosses_tenants(void **state)
{
	stest *t = *state;
	const want_hit w[] = { { "other", 1 } };
	histd_search_query q;

	corpus(t);
	q = lex(TB, "sourdough vienna rust", 10);
	expect_hits(t, &q, w, N_OF(w));
	q = lex(TA, "sourdough vienna rust", 100);
	{
		histd_search_result r;

		run(t, &q, &r);
		for (size_t i = 0; i < r.n; i++)
			assert_string_not_equal(r.hits[i].session_id, "other");
		histd_search_result_clear(&r);
	}
}

static void search_includes_tool_results_only_when_asked(void **state)
{
	stest *t = *state;
	smsg m[] = {
		call_msg("c1", "weather", "{\"city\": \"Lisbon\"}"),
		result_msg("c1", "Sunny and warm, 27 degrees"),
	};
	histd_search_query q;

	create(t, TA, "s", NULL, 0);
	append(t, TA, "s", m, N_OF(m));
	/* The call's name and arguments are searchable... */
	q = lex(TA, "lisbon weather", 10);
	{
		const want_hit w[] = { { "s", 1 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	/* ...the result's text only on request. */
	q = lex(TA, "sunny", 10);
	expect_eq(count_hits(t, &q), 0, "hits in a tool result by default");
	q.include_tool_results = 1;
	{
		const want_hit w[] = { { "s", 2 } };

		expect_hits(t, &q, w, N_OF(w));
	}
}

static void search_forgets_cleared_replaced_and_deleted_messages_at_once(void **state)
{
	stest *t = *state;
	histd_search_query q;
	histd_append_result ar;
	uint64_t rev, cleared;

	corpus(t);
	q = lex(TA, "sourdough", 10);
	expect_eq(count_hits(t, &q), 3, "hits before");      /* builds the index */
	expect_ok(histd_driver_clear(t->d, TA, "cooking", 0, &rev, &cleared, NULL));
	expect_eq(count_hits(t, &q), 0, "hits after clear");
	append1(t, TA, "cooking", text_msg(USER, "A new sourdough question."));
	{
		const want_hit w[] = { { "cooking", 6 } };

		expect_hits(t, &q, w, N_OF(w));
	}

	/* Replace: the old messages go, the new ones are found. */
	{
		smsg m = text_msg(USER, "Vienna is replaced by Budapest.");
		histd_msg_in in = { .data = m.data, .len = m.len, .token_estimate = 1 };
		histd_append a = {
			.tenant = TA, .session_id = "travel", .msgs = &in, .n_msgs = 1,
		};

		expect_ok(histd_driver_replace(t->d, &a, &ar, &cleared));
		free(m.data);
	}
	q = lex(TA, "vienna", 10);
	{
		const want_hit w[] = { { "travel", 5 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	q = lex(TA, "museum", 10);
	expect_eq(count_hits(t, &q), 0, "hits of replaced messages");

	/* Delete, and a new session under the same id. */
	expect_ok(histd_driver_session_delete(t->d, TA, "code", 0, NULL));
	q = lex(TA, "rust borrow", 10);
	expect_eq(count_hits(t, &q), 0, "hits after delete");
	create(t, TA, "code", NULL, 0);
	append1(t, TA, "code", text_msg(USER, "Rust again"));
	{
		const want_hit w[] = { { "code", 1 } };

		expect_hits(t, &q, w, N_OF(w));
	}
}

static void search_finds_forked_sessions_messages(void **state)
{
	stest *t = *state;
	histd_session in = { .tenant = TA, .id = "fork", .created_at_us = T0 };
	histd_session *out = NULL;
	histd_search_query q;

	corpus(t);
	q = lex(TA, "sourdough", 10);
	expect_eq(count_hits(t, &q), 3, "hits before the fork");
	expect_ok(histd_driver_session_fork(t->d, TA, "cooking", 3, &in, &out));
	histd_session_free(out);
	/* The fork holds 2 and 3 of the three. */
	expect_eq(count_hits(t, &q), 5, "hits after the fork");
}

static void search_index_stays_right_through_many_removals(void **state)
{
	stest *t = *state;
	histd_search_query q;
	uint64_t rev, cleared;
	char text[64];

	create(t, TA, "big", NULL, 0);
	create(t, TA, "keep", NULL, 0);
	append1(t, TA, "keep", text_msg(USER, "needle in the kept session"));
	q = lex(TA, "needle", 100);
	expect_eq(count_hits(t, &q), 1, "hits at first");
	/* Enough dead documents to make an in-process index rewrite its
	 * postings. */
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 800; i += 20) {
			smsg m[20];

			for (int j = 0; j < 20; j++) {
				snprintf(text, sizeof(text), "needle haystack %d round %d",
					 i + j, round);
				m[j] = text_msg(USER, text);
			}
			append(t, TA, "big", m, 20);
		}
		expect_eq(count_hits(t, &q), 100, "hits with the haystack");
		expect_ok(histd_driver_clear(t->d, TA, "big", 0, &rev, &cleared,
					     NULL));
		expect_eq(count_hits(t, &q), 1, "hits after clear");
	}
	append1(t, TA, "big", text_msg(USER, "one last needle"));
	expect_eq(count_hits(t, &q), 2, "hits at the end");
}

/* A SEMANTIC query of tenant A by model m1, in 3 dimensions. */
static histd_search_query sem3(const float *qv)
{
	return (histd_search_query){
		.tenant = TA, .mode = HISTD_SEARCH_SEMANTIC, .vector = qv,
		.dim = 3, .model = "m1", .k = 10,
	};
}

/* Stores v as the m1 vector of tenant A's message id/seq. */
static void put3(stest *t, const char *id, uint64_t seq, const float *v)
{
	expect_ok(histd_driver_embedding_put(t->d, TA, id, seq, "m1", v, 3));
}

static void search_semantic_ranks_by_cosine_and_forgets_removed(void **state)
{
	stest *t = *state;
	const float v1[] = { 1, 0, 0 }, v2[] = { 0.8f, 0.6f, 0 },
		    v3[] = { 0.1f, 0, 1 }, qv[] = { 2, 0.1f, 0 };
	histd_search_query q = sem3(qv);
	uint64_t rev, cleared;

	if (!t->d->embedding_put)
		skip();
	corpus(t);
	put3(t, "cooking", 2, v2);
	put3(t, "cooking", 3, v3);
	put3(t, "travel", 1, v1);
	/* Another model's vector never matches. */
	expect_ok(histd_driver_embedding_put(t->d, TA, "code", 1, "m2", v1, 3));
	assert_int_equal(histd_driver_embedding_put(t->d, TA, "cooking", 99, "m1",
						    v1, 3), HISTD_ENOTFOUND);
	{
		/* No direction: the caller's mistake, not a lack of memory. */
		const float zero[3] = { 0 }, inf[3] = { INFINITY, 1, 1 };

		assert_int_equal(histd_driver_embedding_put(t->d, TA, "cooking",
							    2, "m1", zero, 3),
				 HISTD_EINVALID);
		assert_int_equal(histd_driver_embedding_put(t->d, TA, "cooking",
							    2, "m1", inf, 3),
				 HISTD_EINVALID);
	}
	{
		const want_hit w[] = { { "travel", 1 }, { "cooking", 2 },
				       { "cooking", 3 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	q.roles = 1u << ASSISTANT;
	{
		const want_hit w[] = { { "cooking", 3 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	q.roles = 0;
	expect_ok(histd_driver_clear(t->d, TA, "cooking", 0, &rev, &cleared, NULL));
	{
		const want_hit w[] = { { "travel", 1 } };

		expect_hits(t, &q, w, N_OF(w));
	}
}

/* A vector orthogonal to the query's, or turned away from it, has nothing
 * in common with it: not a hit, even with room left in k. */
static void search_semantic_leaves_out_orthogonal_and_opposite_vectors(void **state)
{
	stest *t = *state;
	const float near[] = { 1, 0.5f, 0 }, across[] = { 0, 0, 1 },
		    away[] = { -1, 0, 0.2f }, qv[] = { 1, 0, 0 };
	const char *travel[] = { "travel" };
	histd_search_query q = sem3(qv);

	if (!t->d->embedding_put)
		skip();
	corpus(t);
	put3(t, "cooking", 2, near);
	put3(t, "cooking", 3, across);
	put3(t, "cooking", 4, away);
	put3(t, "travel", 1, across);
	{
		const want_hit w[] = { { "cooking", 2 } };

		expect_hits(t, &q, w, N_OF(w));
	}
	q.session_ids = travel;
	q.n_session_ids = 1;
	expect_eq(count_hits(t, &q), 0, "hits in a session of orthogonal vectors");
}

#define S(f) cmocka_unit_test_prestate_setup_teardown(f, s_setup, s_teardown, \
	(void *)fx)

int histd_conformance_search_run(const histd_conformance_fixture *fx)
{
	const struct CMUnitTest tests[] = {
		S(search_finds_known_answers_with_precision_at_k),
		S(search_is_case_insensitive_and_unicode_aware),
		S(search_folds_every_greek_capital_and_final_sigma),
		S(search_without_a_word_is_invalid),
		S(search_of_an_unknown_tenant_or_session_finds_nothing),
		S(search_returns_at_most_k_best_first),
		S(search_filters_by_role),
		S(search_exclude_newest_leaves_out_each_sessions_newest),
		S(search_scopes_to_a_session_labels_or_the_tenant),
		S(search_never_crosses_tenants),
		S(search_includes_tool_results_only_when_asked),
		S(search_forgets_cleared_replaced_and_deleted_messages_at_once),
		S(search_finds_forked_sessions_messages),
		S(search_index_stays_right_through_many_removals),
		S(search_semantic_ranks_by_cosine_and_forgets_removed),
		S(search_semantic_leaves_out_orthogonal_and_opposite_vectors),
	};
	char group[96];
	histd_driver *d = NULL;
	histd_driver_config cfg = { 0 };
	void *store = NULL;
	int can;

	/* A driver written against version 1 has no search: reported, not
	 * failed, so that a driver can be brought to version 2 on its own. */
	if (fx->store_new(fx->ctx, &cfg, &store) ||
	    histd_driver_open(fx->driver, &cfg, &d))
		return 1;
	can = histd_driver_can_search(d);
	histd_driver_close(d);
	if (fx->store_free)
		fx->store_free(fx->ctx, store);
	if (!can) {
		printf("[  SKIPPED ] search conformance: driver %s (version 1) "
		       "cannot search\n", fx->driver);
		return 0;
	}
	snprintf(group, sizeof(group), "driver search conformance: %s",
		 fx->driver);
	return _cmocka_run_group_tests(group, tests, N_OF(tests), NULL, NULL);
}
