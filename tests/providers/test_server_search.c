/*
 * Semantic and hybrid search through the real histd binary, with every
 * provider's embedding endpoint on the stub provider (stub_provider.h),
 * on the memory and the file driver.
 *
 * The stub's vectors are known (stub_embed_text), so the nearest
 * neighbours of a query are computed here and the server's answer must
 * hold exactly them (precision at k = 1). Also: sessions without
 * embeddings are searched by words and listed in
 * lexical_fallback_sessions; embeddings are computed off the request
 * path (an Append returns at once while the provider takes 2 s); a
 * session that asks for embeddings late is backfilled by a semantic
 * search, and a backfill sends no message the appends' job embedded; a
 * vector computed for a session deleted meanwhile is not stored on the
 * one created again under its id; the file driver keeps vectors across
 * a restart.
 *
 * argv[1] is the histd binary (the integration harness, harness.h).
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "stub_provider.h"

static stub *provider;
static histd_proc *server;
static histd_client *client;
static char data_dir[128];
static int use_file;
static int one_call_thread;

static int
start_server(void)
{
	const char *url = stub_url(provider);
	const char *extra[] = {
		"--openai-base-url", url,
		"--gemini-base-url", url,
		"--mistral-base-url", url,
		"--embedding-retry-base", "1",
		"--embedding-timeout-ms", "30000",
		"--provider-call-threads", one_call_thread ? "1" : "16",
		use_file ? "--driver" : NULL, "file",
		"--data-dir", data_dir,
		NULL };

	if (harness_start(&server, extra))
		return -1;
	client = harness_client(server);
	return 0;
}

static int
setup(void **state, int file)
{
	(void)state;
	if (!(provider = stub_start()))
		return -1;
	/* The keys only have to exist; the stub never checks them. */
	setenv("OPENAI_API_KEY", "test-openai-key", 1);
	setenv("GEMINI_API_KEY", "test-gemini-key", 1);
	setenv("MISTRAL_API_KEY", "test-mistral-key", 1);
	use_file = file;
	data_dir[0] = '\0';
	if (file) {
		snprintf(data_dir, sizeof(data_dir), "/tmp/histd-semantic-XXXXXX");
		if (!mkdtemp(data_dir))
			return -1;
	}
	return start_server();
}

static int
setup_memory(void **state)
{
	return setup(state, 0);
}

/* One provider-call thread: a call that holds it holds every other. */
static int
setup_one_call_thread(void **state)
{
	one_call_thread = 1;
	return setup(state, 0);
}

static int
setup_file(void **state)
{
	return setup(state, 1);
}

static int
teardown(void **state)
{
	int rc;

	(void)state;
	one_call_thread = 0;
	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	stub_stop(provider);
	provider = NULL;
	if (data_dir[0]) {
		char cmd[200];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", data_dir);
		if (system(cmd) != 0)
			rc = -1;
		data_dir[0] = '\0';
	}
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Requests                                                                */

static Histd__V1__SessionConfig *
emb_config(tarena *a, const char *prov, const char *model)
{
	Histd__V1__SessionConfig *c = ta_alloc(a, sizeof(*c));
	Histd__V1__EmbeddingConfig *e = ta_alloc(a, sizeof(*e));

	histd__v1__session_config__init(c);
	histd__v1__embedding_config__init(e);
	e->provider = ta_strdup(a, prov);
	e->model = ta_strdup(a, model);
	c->embeddings = e;
	return c;
}

/* A session; prov NULL: no embeddings in its config. */
static void
create(tarena *a, const char *id, const char *prov, const char *model)
{
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__Session *out = NULL;
	histd_status st = { 0 };

	histd__v1__create_session_request__init(r);
	r->session_id = ta_strdup(a, id);
	if (prov)
		r->config = emb_config(a, prov, model);
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor, &out,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

static void
set_embeddings(tarena *a, const char *id, const char *prov, const char *model)
{
	Histd__V1__UpdateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Google__Protobuf__FieldMask *mask = ta_alloc(a, sizeof(*mask));
	char **paths = ta_alloc(a, sizeof(char *));
	Histd__V1__Session *out = NULL;
	histd_status st = { 0 };

	histd__v1__update_session_request__init(r);
	google__protobuf__field_mask__init(mask);
	paths[0] = ta_strdup(a, "config");
	mask->n_paths = 1;
	mask->paths = paths;
	r->session_id = ta_strdup(a, id);
	r->config = emb_config(a, prov, model);
	r->update_mask = mask;
	t_call(client, "UpdateSession", r, &histd__v1__session__descriptor, &out,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

/* Appends texts one message per call; returns the slowest call in ms. */
static int64_t
append_each(tarena *a, const char *id, const char *const *texts, size_t n)
{
	int64_t worst = 0;

	for (size_t i = 0; i < n; i++) {
		Histd__V1__AppendRequest *r = ta_alloc(a, sizeof(*r));
		Histd__V1__Message **m = ta_alloc(a, sizeof(*m));
		Histd__V1__AppendResponse *out = NULL;
		histd_status st = { 0 };
		int64_t t0 = t_now_ms(), dt;

		histd__v1__append_request__init(r);
		m[0] = tm_text(a, i % 2 ? HISTD__V1__ROLE__ROLE_ASSISTANT
					: HISTD__V1__ROLE__ROLE_USER, texts[i]);
		r->session_id = ta_strdup(a, id);
		r->n_messages = 1;
		r->messages = m;
		t_call(client, "Append", r, &histd__v1__append_response__descriptor,
		       &out, &st);
		dt = t_now_ms() - t0;
		assert_status(&st, GRPC_STATUS_OK);
		histd_client_message_free((ProtobufCMessage *)out);
		histd_status_reset(&st);
		if (dt > worst)
			worst = dt;
	}
	return worst;
}

/* A search with a deadline timeout_ms away: the response, or NULL with
 * *st saying why (the caller resets it). */
static Histd__V1__SearchResponse *
search_within(tarena *a, const char *session, const char *query, uint32_t k,
	      Histd__V1__SearchMode mode, int timeout_ms, histd_status *st)
{
	Histd__V1__SearchRequest *r = ta_alloc(a, sizeof(*r));
	ProtobufCMessage *out = NULL;

	histd__v1__search_request__init(r);
	r->query = ta_strdup(a, query);
	r->session_id = ta_strdup(a, session ? session : "");
	r->k = k;
	r->mode = mode;
	histd_client_unary(client, "/histd.v1.HistoryService/Search", &r->base,
			   &histd__v1__search_response__descriptor, timeout_ms,
			   NULL, &out, st);
	return (Histd__V1__SearchResponse *)out;
}

static Histd__V1__SearchResponse *
search(tarena *a, const char *session, const char *query, uint32_t k,
       Histd__V1__SearchMode mode)
{
	histd_status st = { 0 };
	Histd__V1__SearchResponse *out =
		search_within(a, session, query, k, mode, T_TIMEOUT_MS, &st);

	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	return out;
}

/* Waits until a semantic search of the session finds its n texts (the
 * worker stored n vectors): at most 30 s. The query holds every word of
 * them, so that no text's vector is orthogonal to it. The number of
 * searches made: each sent its query to the provider once. */
static unsigned
wait_vectors(tarena *a, const char *session, const char *const *texts,
	     size_t n)
{
	int64_t end = t_now_ms() + 30000;
	size_t len = 1;
	unsigned searches = 0;
	char *all;

	for (size_t i = 0; i < n; i++)
		len += strlen(texts[i]) + 1;
	all = ta_alloc(a, len);
	for (size_t i = 0; i < n; i++) {
		strcat(all, texts[i]);
		strcat(all, " ");
	}
	for (;;) {
		Histd__V1__SearchResponse *s =
			search(a, session, all, 100,
			       HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
		searches++;
		/* Hits by meaning only: a search that fell back to words
		 * finds every text by its words, vectors or not. */
		size_t got = s->mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC &&
			     !s->n_lexical_fallback_sessions ? s->n_hits : 0;

		histd_client_message_free(&s->base);
		if (got >= n)
			return searches;
		if (t_now_ms() > end)
			fail_msg("session %s has %zu of %zu vectors after 30 s",
				 session, got, n);
		usleep(50 * 1000);
	}
}

/* ---------------------------------------------------------------------- */
/* The corpus and its known answers                                       */

static const char *const cooking_texts[] = {
	"How long should sourdough bread bake in the oven?",
	"Bake the sourdough loaf for forty minutes at high heat.",
	"Can rye flour replace wheat flour in bread?",
	"Rye flour makes a denser loaf with a sour taste.",
	"What temperature should the oven have for pizza?",
	"A very hot oven makes the pizza crust crisp.",
};
static const char *const travel[] = {
	"Is there a night train from Paris to Vienna?",
	"The night train to Vienna leaves Paris in the evening.",
	"Which museums in Vienna open on Monday?",
	"Most Vienna museums close on Monday except a few.",
};
static const char *const code[] = {
	"Why does my C program crash with a segmentation fault?",
	"A segmentation fault means the program read memory it does not own.",
	"How do I free memory allocated with malloc in C?",
	"Call free on the pointer that malloc returned, once.",
};

#define N(a) (sizeof(a) / sizeof((a)[0]))

static double
cosine(const float *x, const float *y)
{
	double s = 0;

	for (int i = 0; i < STUB_EMBED_DIM; i++)
		s += (double)x[i] * y[i];
	return s;
}

/* The seqs (1-based) of texts, best first by the stub's cosine with query
 * (ties: lower seq first, as the server orders them). */
static void
expected_order(const char *const *texts, size_t n, const char *query,
	       uint64_t *seqs, double *scores)
{
	float q[STUB_EMBED_DIM], v[STUB_EMBED_DIM];

	stub_embed_text(query, q);
	for (size_t i = 0; i < n; i++) {
		stub_embed_text(texts[i], v);
		seqs[i] = i + 1;
		scores[i] = cosine(q, v);
	}
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0 && scores[j] > scores[j - 1] + 1e-9; j--) {
			double ts = scores[j];
			uint64_t tq = seqs[j];

			scores[j] = scores[j - 1];
			seqs[j] = seqs[j - 1];
			scores[j - 1] = ts;
			seqs[j - 1] = tq;
		}
}

/* The server's top k of the session equal the known top k (precision at
 * k = 1), with the stub's cosines as scores. */
static void
expect_top_k(tarena *a, const char *session, const char *const *texts,
	     size_t n, const char *query, uint32_t k)
{
	uint64_t seqs[16];
	double scores[16];
	Histd__V1__SearchResponse *s;

	expected_order(texts, n, query, seqs, scores);
	/* The corpus is made so that the top k are clear of the rest. */
	assert_true(scores[k - 1] > scores[k] + 1e-6);
	s = search(a, session, query, k, HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->n_lexical_fallback_sessions, 0);
	assert_int_equal(s->n_hits, k);
	for (size_t i = 0; i < k; i++) {
		int found = 0;

		assert_string_equal(s->hits[i]->session_id, session);
		for (size_t j = 0; j < k; j++)
			found |= s->hits[i]->seq == seqs[j];
		if (!found)
			fail_msg("%s: hit %zu is seq %llu, not among the known top %u",
				 session, i, (unsigned long long)s->hits[i]->seq, k);
		assert_true(fabs(s->hits[i]->score - scores[i]) < 1e-4);
	}
	histd_client_message_free(&s->base);
}

static void
corpus(tarena *a)
{
	create(a, "cooking", "openai", "stub-embed-small");
	create(a, "travel", "gemini", "");
	create(a, "code", "mistral", "");
	create(a, "notes", NULL, NULL);
	append_each(a, "cooking", cooking_texts, N(cooking_texts));
	append_each(a, "travel", travel, N(travel));
	append_each(a, "code", code, N(code));
	append_each(a, "notes", (const char *const[]){
		"Remember to buy sourdough bread and rye flour." }, 1);
	wait_vectors(a, "cooking", cooking_texts, N(cooking_texts));
	wait_vectors(a, "travel", travel, N(travel));
	wait_vectors(a, "code", code, N(code));
}

/* ---------------------------------------------------------------------- */
/* Tests                                                                   */

static void
semantic_finds_known_nearest_neighbours_per_provider(void **state)
{
	tarena *a = ta_new();
	char *path;

	(void)state;
	corpus(a);
	expect_top_k(a, "cooking", cooking_texts, N(cooking_texts), "sourdough bread oven", 2);
	expect_top_k(a, "cooking", cooking_texts, N(cooking_texts), "rye flour loaf", 2);
	expect_top_k(a, "travel", travel, N(travel), "night train to Vienna", 2);
	expect_top_k(a, "code", code, N(code), "segmentation fault program", 2);
	expect_top_k(a, "code", code, N(code), "free malloc pointer memory", 2);
	/* Each provider's wire format was used: the last call was one of
	 * them; the default models are named in the URL or body. */
	assert_true(stub_embed_requests(provider) >= 3);
	path = stub_last_path(provider);
	assert_non_null(path);
	free(path);
	ta_free(a);
}

static void
semantic_lists_sessions_without_embeddings_as_fallback(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	int notes_hit = 0;
	uint64_t cooking[2] = { 0, 0 };
	size_t n_cooking = 0;

	(void)state;
	corpus(a);
	s = search(a, NULL, "sourdough bread", 10,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->n_lexical_fallback_sessions, 1);
	assert_string_equal(s->lexical_fallback_sessions[0], "notes");
	for (size_t i = 0; i < s->n_hits; i++) {
		if (!strcmp(s->hits[i]->session_id, "notes"))
			notes_hit = 1;
		if (!strcmp(s->hits[i]->session_id, "cooking") && n_cooking < 2)
			cooking[n_cooking++] = s->hits[i]->seq;
	}
	/* The note matched by its words; cooking's first two hits are its
	 * two known nearest by meaning (rankings are fused by rank). */
	assert_true(notes_hit);
	assert_int_equal(n_cooking, 2);
	{
		uint64_t seqs[N(cooking_texts)];
		double scores[N(cooking_texts)];

		expected_order(cooking_texts, N(cooking_texts), "sourdough bread",
			       seqs, scores);
		assert_true(scores[1] > scores[2] + 1e-6);
		assert_true((cooking[0] == seqs[0] && cooking[1] == seqs[1]) ||
			    (cooking[0] == seqs[1] && cooking[1] == seqs[0]));
	}
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
hybrid_fuses_words_and_meaning(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;

	(void)state;
	corpus(a);
	uint64_t seqs[N(cooking_texts)];
	double scores[N(cooking_texts)];

	/* Message 6 holds every word of the query (first by words) and is
	 * the nearest by meaning: first in both rankings. */
	expected_order(cooking_texts, N(cooking_texts), "pizza crust crisp", seqs,
		       scores);
	assert_int_equal(seqs[0], 6);
	s = search(a, "cooking", "pizza crust crisp", 3,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID);
	assert_int_equal(s->n_hits, 3);
	assert_int_equal(s->hits[0]->seq, 6);
	/* Reciprocal rank fusion: rank 1 twice is 2 / 61. */
	assert_true(fabs(s->hits[0]->score - 2.0 / 61) < 1e-9);
	assert_true(s->hits[1]->score < s->hits[0]->score);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
appends_do_not_wait_for_the_provider(void **state)
{
	tarena *a = ta_new();
	int64_t worst;

	(void)state;
	create(a, "slow", "openai", "");
	stub_set_delay(provider, 2000);
	worst = append_each(a, "slow", cooking_texts, 4);
	/* Four appends while the provider takes 2 s a call: none waited. */
	if (worst >= 1000)
		fail_msg("an Append took %lld ms with a 2 s provider",
			 (long long)worst);
	wait_vectors(a, "slow", cooking_texts, 4);
	stub_set_delay(provider, 0);
	expect_top_k(a, "slow", cooking_texts, 4, "rye flour loaf", 2);
	ta_free(a);
}

static void
late_embeddings_are_backfilled_by_a_semantic_search(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;

	(void)state;
	create(a, "late", NULL, NULL);
	append_each(a, "late", code, N(code));
	s = search(a, "late", "malloc", 10,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL);
	assert_int_equal(s->n_lexical_fallback_sessions, 1);
	histd_client_message_free(&s->base);
	/* Now the session asks for embeddings: the next semantic search
	 * finds no vector yet, and queues them. */
	set_embeddings(a, "late", "mistral", "");
	s = search(a, "late", "malloc", 10,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->n_lexical_fallback_sessions, 0);
	histd_client_message_free(&s->base);
	wait_vectors(a, "late", code, N(code));
	expect_top_k(a, "late", code, N(code), "free malloc pointer memory", 2);
	ta_free(a);
}

/* A semantic search made while the appends' job is at the provider
 * queues a backfill from the mark, still 0 then. When the backfill runs,
 * that job has embedded every message: none goes to the provider again. */
static void
a_backfill_embeds_nothing_the_appends_did(void **state)
{
	static const char *const marker[] = {
		"Zebras graze on the savanna at dawn.",
	};
	tarena *a = ta_new();
	unsigned queries;

	(void)state;
	create(a, "twice", "openai", "");
	create(a, "marker", "openai", "");
	stub_set_delay(provider, 1000);
	append_each(a, "twice", code, N(code));
	queries = wait_vectors(a, "twice", code, N(code));
	stub_set_delay(provider, 0);
	/* One embedding worker, first in first out: once the marker's
	 * vector is stored, the backfill queued before its job has run. */
	append_each(a, "marker", marker, N(marker));
	queries += wait_vectors(a, "marker", marker, N(marker));
	assert_int_equal(stub_embed_texts(provider),
			 N(code) + N(marker) + queries);
	ta_free(a);
}

/* The session is deleted and created again under its id, with other
 * messages at the same seqs, while the provider embeds the first one's
 * first message: that vector is not stored on the second session, and
 * the second session's messages all get their own. */
static void
vectors_of_a_deleted_session_do_not_land_on_the_one_made_again(void **state)
{
	Histd__V1__DeleteSessionRequest *d;
	ProtobufCMessage *out = NULL;
	tarena *a = ta_new();
	histd_status st = { 0 };
	unsigned before = stub_requests(provider);

	(void)state;
	create(a, "again", "openai", "");
	/* The first embedding call: 2 s, long enough for what follows. */
	stub_push(provider, (stub_reply){ .retry_after = -1, .delay_ms = 2000 });
	append_each(a, "again", code, N(code));
	for (int i = 0; i < 400 && stub_requests(provider) < before + 1; i++)
		usleep(10 * 1000);
	assert_true(stub_requests(provider) >= before + 1);
	d = ta_alloc(a, sizeof(*d));
	histd__v1__delete_session_request__init(d);
	d->session_id = ta_strdup(a, "again");
	t_call(client, "DeleteSession", d,
	       &histd__v1__delete_session_response__descriptor, &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free(out);
	create(a, "again", "openai", "");
	append_each(a, "again", cooking_texts, N(code));
	wait_vectors(a, "again", cooking_texts, N(code));
	/* Seq 1's vector is the bread question's, not the crash's. */
	expect_top_k(a, "again", cooking_texts, N(code),
		     "sourdough bread oven", 2);
	ta_free(a);
}

/* A semantic search of the session that the provider's next answer
 * sends back to words: LEXICAL, the session its one fallback, hits. */
static void
expect_words_instead(tarena *a, const char *session)
{
	Histd__V1__SearchResponse *s;

	s = search(a, session, "malloc", 10,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL);
	assert_int_equal(s->n_lexical_fallback_sessions, 1);
	assert_string_equal(s->lexical_fallback_sessions[0], session);
	assert_true(s->n_hits > 0);
	histd_client_message_free(&s->base);
}

/* A provider that refuses histd's key for the query's embedding: the
 * session is searched by its words and listed as a fallback, not an
 * error for the caller. */
static void
a_refused_query_embedding_falls_back_to_words(void **state)
{
	tarena *a = ta_new();

	(void)state;
	create(a, "refused", "openai", "");
	append_each(a, "refused", code, N(code));
	wait_vectors(a, "refused", code, N(code));
	stub_push(provider, (stub_reply){ .status = 401, .retry_after = -1 });
	expect_words_instead(a, "refused");
	ta_free(a);
}

/* A message whose vector is orthogonal to the query's (the stub's words
 * of the two fall in different dimensions) shares no meaning with it: not
 * a hit, though k leaves room for it. */
static void
an_orthogonal_message_is_not_a_semantic_hit(void **state)
{
	static const char *const texts[] = {
		"Sourdough bread needs a long slow rise.",
		"Which museums open on Mondays?",
	};
	const char *query = "sourdough bread";
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	uint64_t seqs[N(texts)];
	double scores[N(texts)];

	(void)state;
	expected_order(texts, N(texts), query, seqs, scores);
	/* The corpus is made so: one near, one orthogonal. */
	assert_int_equal(seqs[0], 1);
	assert_true(scores[0] > 0.1);
	assert_true(scores[1] == 0);
	create(a, "orthogonal", "openai", "");
	append_each(a, "orthogonal", texts, N(texts));
	wait_vectors(a, "orthogonal", texts, N(texts));
	s = search(a, "orthogonal", query, 10,
		   HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->n_hits, 1);
	assert_int_equal(s->hits[0]->seq, 1);
	assert_true(s->hits[0]->score > 0);
	histd_client_message_free(&s->base);
	ta_free(a);
}

/* A provider that hangs holds a search's query embedding until the
 * caller's deadline, not for --embedding-timeout-ms (30 s): with one
 * provider-call thread, the next semantic search is answered, with the
 * embedding, long before the first call's 30 s would have passed. */
static void
a_hanging_provider_is_left_at_the_callers_deadline(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	histd_status st = { 0 };

	(void)state;
	create(a, "hanging", "openai", "");
	append_each(a, "hanging", code, N(code));
	wait_vectors(a, "hanging", code, N(code));
	/* Longer than the embedding timeout; stub_stop ends it. */
	stub_set_delay(provider, 120000);
	s = search_within(a, "hanging", "malloc", 10,
			  HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC, 1000, &st);
	assert_null(s);
	assert_status(&st, GRPC_STATUS_DEADLINE_EXCEEDED);
	histd_status_reset(&st);
	stub_set_delay(provider, 0);
	/* Queued behind the first call on the one thread: it ran once that
	 * call's deadline had passed. Before, the first call held the
	 * thread for 30 s, past this one's 15 s. */
	s = search_within(a, "hanging", "free malloc pointer memory", 2,
			  HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC, 15000,
			  &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC);
	assert_int_equal(s->n_lexical_fallback_sessions, 0);
	assert_true(s->n_hits > 0);
	histd_client_message_free(&s->base);
	ta_free(a);
}

/* A session whose config holds embeddings without a provider opts out of
 * them (even with a server default): searched by its words, listed as a
 * fallback, not an error. */
static void
a_session_that_opts_out_of_embeddings_falls_back_to_words(void **state)
{
	tarena *a = ta_new();

	(void)state;
	create(a, "opted-out", "", "");
	append_each(a, "opted-out", code, N(code));
	expect_words_instead(a, "opted-out");
	ta_free(a);
}

static void
vectors_survive_a_restart_of_the_file_driver(void **state)
{
	tarena *a = ta_new();
	int rc;

	(void)state;
	corpus(a);
	/* Both NULL before asserting: teardown closes what is left. */
	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	assert_int_equal(rc, 0);
	assert_int_equal(start_server(), 0);
	/* Right after the restart, before any worker ran again. */
	expect_top_k(a, "cooking", cooking_texts, N(cooking_texts), "sourdough bread oven", 2);
	expect_top_k(a, "travel", travel, N(travel), "night train to Vienna", 2);
	ta_free(a);
}

/* A provider that answers the query with a vector of zeros, or of numbers
 * no float holds: nothing can be compared with it, and that is the
 * provider's fault, so the session is searched by its words and listed
 * as a fallback, not INVALID_ARGUMENT for the caller's query. */
static void
a_degenerate_query_vector_falls_back_to_words(void **state)
{
	static const char *const bodies[] = {
		"{\"data\":[{\"index\":0,\"embedding\":[0,0,0,0]}]}",
		"{\"data\":[{\"index\":0,\"embedding\":[1e39,1e39]}]}",
	};
	tarena *a = ta_new();

	(void)state;
	create(a, "degenerate", "openai", "");
	append_each(a, "degenerate", code, N(code));
	wait_vectors(a, "degenerate", code, N(code));
	for (size_t i = 0; i < N(bodies); i++) {
		stub_push(provider, (stub_reply){ .retry_after = -1,
						  .body = bodies[i] });
		expect_words_instead(a, "degenerate");
	}
	ta_free(a);
}

#define M(f) cmocka_unit_test_setup_teardown(f, setup_memory, teardown)
#define F(f) cmocka_unit_test_setup_teardown(f, setup_file, teardown)

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		M(semantic_finds_known_nearest_neighbours_per_provider),
		M(semantic_lists_sessions_without_embeddings_as_fallback),
		M(hybrid_fuses_words_and_meaning),
		M(appends_do_not_wait_for_the_provider),
		M(late_embeddings_are_backfilled_by_a_semantic_search),
		M(a_backfill_embeds_nothing_the_appends_did),
		M(vectors_of_a_deleted_session_do_not_land_on_the_one_made_again),
		M(a_refused_query_embedding_falls_back_to_words),
		M(a_degenerate_query_vector_falls_back_to_words),
		M(a_session_that_opts_out_of_embeddings_falls_back_to_words),
		M(an_orthogonal_message_is_not_a_semantic_hit),
		cmocka_unit_test_setup_teardown(
			a_hanging_provider_is_left_at_the_callers_deadline,
			setup_one_call_thread, teardown),
		F(semantic_finds_known_nearest_neighbours_per_provider),
		F(semantic_lists_sessions_without_embeddings_as_fallback),
		F(appends_do_not_wait_for_the_provider),
		F(vectors_of_a_deleted_session_do_not_land_on_the_one_made_again),
		F(vectors_survive_a_restart_of_the_file_driver),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
