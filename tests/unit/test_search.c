/*
 * Search (server/search.c) when memory runs out.
 *
 * One tenant of three sessions on the memory driver: two with embeddings
 * of two models (two groups, one query vector each) and one without,
 * searched by its words instead. Semantic and hybrid searches of the whole
 * tenant are made with each allocation of the call, in turn, failing (the
 * test's thread only, alloc_hook.h); lexical searches too. Each such call
 * must answer ENOMEM, never another error, and free everything it
 * allocated; the call without a failure answers as before the failures.
 * And histd_unpack_stored itself, which tells the two apart for every
 * unpack of stored bytes in the server.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc_hook.h"
#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"
#include "histd_wire.h"
#include "index/index.h"
#include "search.h"
#include "service.h"
#include "svc_calls.h"

#define TENANT "t1"
#define DIM 4

static const histd_caller who = { TENANT, 0 };
static histd_driver *drv;
static histd_service *svc;

/* ---------------------------------------------------------------------- */
/* The query's embedding, and the call's arena                             */

static int
fake_embed(void *ctx, const char *provider, const char *model,
	   const char *text, int64_t deadline_us, float **v, uint32_t *dim,
	   const char **model_out)
{
	float *x = malloc(DIM * sizeof(*x));

	(void)ctx;
	(void)provider;
	(void)text;
	(void)deadline_us;
	if (!x)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (int i = 0; i < DIM; i++)
		x[i] = i == 0 ? 1.0f : 0.25f;
	*v = x;
	*dim = DIM;
	*model_out = model;
	return 0;
}

static const histd_search_embedder embedder = {
	.embed = fake_embed, .default_provider = "", .default_model = "",
};

/* The call's arena, as the transport gives one: freed after the call. */
struct arena {
	void *v[4096];
	size_t n;
};

static void *
arena_alloc(void *data, size_t size)
{
	struct arena *a = data;
	void *p;

	if (a->n == sizeof(a->v) / sizeof(a->v[0]) || !(p = malloc(size)))
		return NULL;
	a->v[a->n++] = p;
	return p;
}

static void
arena_free(void *data, void *p)
{
	(void)data;
	(void)p;                /* all at once, after the call */
}

static void
arena_clear(struct arena *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	a->n = 0;
}

/* ---------------------------------------------------------------------- */
/* The sessions                                                            */

/* Creates id, with embeddings of provider/model unless provider is NULL. */
static void
create(const char *id, const char *provider, const char *model)
{
	Histd__V1__CreateSessionRequest r =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__EmbeddingConfig e = HISTD__V1__EMBEDDING_CONFIG__INIT;

	r.session_id = (char *)id;
	if (provider) {
		e.provider = (char *)provider;
		e.model = (char *)model;
		c.embeddings = &e;
		r.config = &c;
	}
	assert_int_equal(ut_call(HISTD_M_CREATE_SESSION, &r.base, NULL, NULL),
			 0);
}

/* Appends user messages texts[0..n) to id, and (with model) gives each the
 * vector (1, w, w, w), w its index / n: all near the query's. */
static void
fill(const char *id, const char *const *texts, size_t n, const char *model)
{
	Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message m[8], *mp[8];
	Histd__V1__ContentBlock b[8], *bp[8];
	Histd__V1__TextBlock t[8];
	Histd__V1__AppendResponse *resp = NULL;

	assert_true(n <= 8);
	for (size_t i = 0; i < n; i++) {
		histd__v1__message__init(&m[i]);
		histd__v1__content_block__init(&b[i]);
		histd__v1__text_block__init(&t[i]);
		t[i].text = (char *)texts[i];
		b[i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		b[i].text = &t[i];
		bp[i] = &b[i];
		m[i].role = HISTD__V1__ROLE__ROLE_USER;
		m[i].n_content = 1;
		m[i].content = &bp[i];
		mp[i] = &m[i];
	}
	r.session_id = (char *)id;
	r.n_messages = n;
	r.messages = mp;
	assert_int_equal(ut_call(HISTD_M_APPEND, &r.base,
				 &histd__v1__append_response__descriptor,
				 (void **)&resp), 0);
	for (size_t i = 0; model && i < n; i++) {
		float v[DIM] = { 1.0f };

		for (int k = 1; k < DIM; k++)
			v[k] = (float)i / (float)n;
		assert_int_equal(histd_driver_embedding_put(drv, TENANT, id,
							    resp->first_seq + i,
							    model, v, DIM), 0);
	}
	ut_free_msg(resp);
}

static int
setup(void **state)
{
	static const char *const a[] = { "the deploy failed on friday",
					 "roll back the deploy",
					 "the cache is warm again" };
	static const char *const b[] = { "a deploy of the search index",
					 "the index is rebuilt" };
	static const char *const c[] = { "no embeddings here: deploy words",
					 "only lexical search" };
	histd_driver_config dc = { 0 };
	histd_service_config cfg;

	(void)state;
	assert_int_equal(histd_driver_open("memory", &dc, &drv), 0);
	histd_service_config_default(&cfg);
	assert_int_equal(histd_service_new(&svc, drv, &cfg), 0);
	ut_use(svc, &who);
	histd_search_set_embedder(&embedder);
	create("a", "openai", "m1");
	create("b", "gemini", "m2");
	create("c", NULL, NULL);
	fill("a", a, 3, "m1");
	fill("b", b, 2, "m2");
	fill("c", c, 2, NULL);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	histd_search_set_embedder(NULL);
	histd_service_free(svc);
	histd_driver_close(drv);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

/* One search of the tenant in mode; rc, and the answer in *out. */
static int
search(Histd__V1__SearchMode mode, struct arena *a, uint8_t **out,
       size_t *out_len)
{
	Histd__V1__SearchRequest r = HISTD__V1__SEARCH_REQUEST__INIT;
	ProtobufCAllocator alloc = { arena_alloc, arena_free, a };

	r.query = "deploy";
	r.k = 5;
	r.mode = mode;
	*out = NULL;
	*out_len = 0;
	histd_error_clear();
	return histd_search_rpc(drv, TENANT, &r, 0, &alloc, out, out_len);
}

static void
fails_cleanly_at_every_allocation(Histd__V1__SearchMode mode)
{
	struct arena a = { .n = 0 };
	uint8_t *want, *got;
	size_t want_len, got_len;
	Histd__V1__SearchResponse *resp;
	long k;
	int rc;

	/* The answer, and the semantic and fallback rankings in it. */
	assert_int_equal(search(mode, &a, &want, &want_len), 0);
	arena_clear(&a);
	resp = histd__v1__search_response__unpack(NULL, want_len, want);
	assert_non_null(resp);
	if (mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL) {
		assert_int_equal(resp->n_lexical_fallback_sessions, 0);
	} else {
		assert_int_equal(resp->n_lexical_fallback_sessions, 1);
		assert_string_equal(resp->lexical_fallback_sessions[0], "c");
	}
	assert_true(resp->n_hits >= 4);     /* "deploy" is in 4 messages */
	histd__v1__search_response__free_unpacked(resp, NULL);

	for (k = 0;; k++) {
		alloc_hook_start(k);
		rc = search(mode, &a, &got, &got_len);
		arena_clear(&a);
		free(got);
		if (!alloc_hook_failed()) {
			alloc_hook_stop();
			break;
		}
		if (rc != HISTD_ENOMEM)
			fail_msg("allocation %ld failed: %s (%s), not ENOMEM",
				 k, histd_error_name(rc), histd_error_message());
		if (alloc_hook_live() != 0)
			fail_msg("allocation %ld failed: %ld blocks left "
				 "allocated", k, alloc_hook_live());
		alloc_hook_stop();
	}
	/* It did allocate, so the loop tried something. */
	assert_true(k > 10);

	assert_int_equal(search(mode, &a, &got, &got_len), 0);
	arena_clear(&a);
	assert_int_equal(got_len, want_len);
	/* Equal but for the hits' scores and messages, which do not move:
	 * the same bytes. */
	assert_memory_equal(got, want, want_len);
	free(got);
	free(want);
}

static void
semantic_search_fails_cleanly_out_of_memory(void **state)
{
	(void)state;
	if (!ALLOC_HOOK)
		skip();
	fails_cleanly_at_every_allocation(HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
}

static void
lexical_search_fails_cleanly_out_of_memory(void **state)
{
	(void)state;
	if (!ALLOC_HOOK)
		skip();
	fails_cleanly_at_every_allocation(HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL);
}

static void
hybrid_search_fails_cleanly_out_of_memory(void **state)
{
	(void)state;
	if (!ALLOC_HOOK)
		skip();
	fails_cleanly_at_every_allocation(HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID);
}

/* The first search of a tenant builds its word index. One that runs out
 * of memory while doing so answers ENOMEM and leaves no index that lacks
 * sessions: the next search finds every message, at each allocation of
 * the first in turn. */
static void
a_first_search_out_of_memory_leaves_no_index_half_built(void **state)
{
	static const char *const x[] = { "deploy the index", "deploy again" };
	long k;

	(void)state;
	if (!ALLOC_HOOK)
		skip();
	for (k = 0;; k++) {
		struct arena a = { .n = 0 };
		Histd__V1__SearchResponse *resp;
		uint8_t *got;
		size_t got_len;
		int rc, failed;

		/* A tenant that never searched: a driver of its own. */
		assert_int_equal(setup(NULL), 0);
		create("x", NULL, NULL);
		fill("x", x, 2, NULL);
		alloc_hook_start(k);
		rc = search(HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL, &a,
			    &got, &got_len);
		failed = alloc_hook_failed();
		alloc_hook_stop();
		arena_clear(&a);
		free(got);
		if (failed && rc != HISTD_ENOMEM)
			fail_msg("allocation %ld failed: %s (%s), not ENOMEM",
				 k, histd_error_name(rc), histd_error_message());
		assert_int_equal(search(HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL,
					&a, &got, &got_len), 0);
		arena_clear(&a);
		resp = histd__v1__search_response__unpack(NULL, got_len, got);
		assert_non_null(resp);
		/* "deploy": 4 messages in setup's sessions, 2 in x */
		if (resp->n_hits != 5)
			fail_msg("after allocation %ld failed: %zu hits, not 5",
				 k, resp->n_hits);
		histd__v1__search_response__free_unpacked(resp, NULL);
		free(got);
		teardown(NULL);
		if (!failed)
			break;
	}
	assert_true(k > 10);
}

/* Adds a user message of text at seq to l. */
static void
add_text(histd_records *l, uint64_t seq, const char *text)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	uint8_t buf[256];
	size_t len;

	t.text = (char *)text;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &t;
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.n_content = 1;
	m.content = &bp;
	assert_true(histd__v1__message__get_packed_size(&m) <= sizeof(buf));
	len = histd__v1__message__pack(&m, buf);
	assert_int_equal(histd_records_add(l, seq, 4, buf, len), 0);
}

/* Forgetting a session of many messages compacts the word index (the
 * sessions are renumbered). Out of memory at any allocation of that, the
 * index stays whole: a session synced later gets its own documents, and
 * the one kept gets its new message under its own id. */
static void
index_compaction_out_of_memory_keeps_the_index_whole(void **state)
{
	histd_records big = { 0 }, kept = { 0 }, fresh = { 0 };
	histd_search_query q = { .text = "unique", .k = 10 };
	long k;

	(void)state;
	if (!ALLOC_HOOK)
		skip();
	for (uint64_t i = 1; i <= 1100; i++)
		add_text(&big, i, "filler words");
	add_text(&kept, 1, "needle one");
	add_text(&fresh, 1, "needle three");
	for (k = 0;; k++) {
		histd_index *ix;
		histd_index_hit *hits = NULL;
		size_t n = 0;
		int failed;

		assert_int_equal(histd_index_new(&ix), 0);
		assert_int_equal(histd_index_sync(ix, 1, "big", big.v, big.n), 0);
		assert_int_equal(histd_index_sync(ix, 2, "kept", kept.v,
						  kept.n), 0);
		alloc_hook_start(k);
		histd_index_forget(ix, 1);
		failed = alloc_hook_failed();
		alloc_hook_stop();
		assert_int_equal(histd_index_sync(ix, 3, "fresh", fresh.v,
						  fresh.n), 0);
		/* kept's second message, with a word only it holds */
		{
			histd_records more = { 0 };

			add_text(&more, 1, "needle one");
			add_text(&more, 2, "needle unique");
			assert_int_equal(histd_index_sync(ix, 2, "kept", more.v,
							  more.n), 0);
			histd_records_clear(&more);
		}
		assert_int_equal(histd_index_search(ix, &q, NULL, NULL, &hits,
						    &n), 0);
		if (n != 1 || hits[0].key != 2 || strcmp(hits[0].id, "kept") ||
		    hits[0].seq != 2)
			fail_msg("allocation %ld failed: %zu hits, the first "
				 "key %llu id %s seq %llu; want key 2 kept seq 2",
				 k, n,
				 n ? (unsigned long long)hits[0].key : 0ULL,
				 n ? hits[0].id : "-",
				 n ? (unsigned long long)hits[0].seq : 0ULL);
		histd_index_hits_free(hits, n);
		histd_index_free(ix);
		if (!failed)
			break;
	}
	assert_true(k > 2);
	histd_records_clear(&big);
	histd_records_clear(&kept);
	histd_records_clear(&fresh);
}

/* histd_unpack_stored, which the search and the rest of the server use on
 * stored bytes: bytes that do not decode are ECORRUPT naming them, memory
 * running out is ENOMEM. */
static void
unpack_tells_bad_bytes_from_lack_of_memory(void **state)
{
	static const uint8_t bad[] = { 0x1a, 0x40, 'x' };  /* field 3, short */
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *got = NULL;
	uint8_t buf[64];
	size_t len;

	(void)state;
	assert_int_equal(histd_unpack_stored(&histd__v1__message__descriptor,
					     NULL, bad, sizeof(bad), &got,
					     "the stored message at seq %d", 7),
			 HISTD_ECORRUPT);
	assert_null(got);
	assert_string_equal(histd_error_message(),
			    "the stored message at seq 7 does not decode");

	m.author = "planner";
	len = histd__v1__message__pack(&m, buf);
	if (ALLOC_HOOK) {
		alloc_hook_start(0);
		assert_int_equal(histd_unpack_stored(
				&histd__v1__message__descriptor, NULL, buf,
				len, &got, "a message"), HISTD_ENOMEM);
		alloc_hook_stop();
		assert_null(got);
	}
	assert_int_equal(histd_unpack_stored(&histd__v1__message__descriptor,
					     NULL, buf, len, &got, "a message"),
			 0);
	assert_string_equal(got->author, "planner");
	histd__v1__message__free_unpacked(got, NULL);
}

static void
collect(void *ctx, const char *tok, size_t len)
{
	char *out = ctx;

	(void)len;
	strcat(out, "[");
	strcat(out, tok);
	strcat(out, "]");
}

/* Words are runs of Unicode letters and digits with their combining
 * accents: currency signs, arrows, mathematical signs, emoji and
 * full-width punctuation separate them (README, "Lexical"). */
static void
words_are_letters_and_digits_of_any_script(void **state)
{
	static const struct {
		const char *text, *tokens;
	} cases[] = {
		{ "the price is 5\u20ac and done\u2705 a\u2192b",
		  "[the][price][is][5][and][done][a][b]" },
		{ "x\u2265y 3\u2212z \U0001F600smile 1\ufe0f\u20e3",
		  "[x][y][3][z][smile][1]" },
		{ "\u4e2d\u6587\uff1f\uff21\uff22 \u0928\u092e\u0938\u094d\u0924\u0947",
		  "[\u4e2d\u6587][\uff21\uff22][\u0928\u092e\u0938\u094d\u0924\u0947]" },
		{ "nai\u0308ve Stra\u00dfe \u0417\u0414\u0420\u0410\u0412\u0421\u0422\u0412\u0423\u0419",
		  "[nai\u0308ve][stra\u00dfe][\u0437\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439]" },
		{ "\u20ac\u2192\u2705", "" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char got[512] = "";

		histd_index_tokens(cases[i].text, strlen(cases[i].text), collect,
				   got);
		assert_string_equal(got, cases[i].tokens);
	}
}

/* A session whose embeddings name no model uses the provider's default:
 * the same model as one that names it, so a search over both ranks one
 * model by the cosine, not two rankings fused. */
static void
no_model_is_the_provider_default_model(void **state)
{
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__EmbeddingConfig e = HISTD__V1__EMBEDDING_CONFIG__INIT;
	Histd__V1__SessionConfig *got = NULL;
	const char *prov = NULL, *model = NULL;
	uint8_t buf[128];
	size_t len;

	(void)state;
	e.provider = "openai";
	e.model = "";
	c.embeddings = &e;
	len = histd__v1__session_config__pack(&c, buf);
	assert_int_equal(histd_search_session_embedding(buf, len, &got, &prov,
							&model), 1);
	assert_string_equal(prov, "openai");
	assert_string_equal(model, "text-embedding-3-small");
	histd__v1__session_config__free_unpacked(got, NULL);
	e.model = "text-embedding-3-large";
	len = histd__v1__session_config__pack(&c, buf);
	assert_int_equal(histd_search_session_embedding(buf, len, &got, &prov,
							&model), 1);
	assert_string_equal(model, "text-embedding-3-large");
	histd__v1__session_config__free_unpacked(got, NULL);
	e.provider = "";
	len = histd__v1__session_config__pack(&c, buf);
	assert_int_equal(histd_search_session_embedding(buf, len, &got, &prov,
							&model), 0);
	histd__v1__session_config__free_unpacked(got, NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(unpack_tells_bad_bytes_from_lack_of_memory),
		cmocka_unit_test(words_are_letters_and_digits_of_any_script),
		cmocka_unit_test(no_model_is_the_provider_default_model),
		cmocka_unit_test_setup_teardown(semantic_search_fails_cleanly_out_of_memory,
						setup, teardown),
		cmocka_unit_test_setup_teardown(lexical_search_fails_cleanly_out_of_memory,
						setup, teardown),
		cmocka_unit_test_setup_teardown(hybrid_search_fails_cleanly_out_of_memory,
						setup, teardown),
		cmocka_unit_test(a_first_search_out_of_memory_leaves_no_index_half_built),
		cmocka_unit_test(index_compaction_out_of_memory_keeps_the_index_whole),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
