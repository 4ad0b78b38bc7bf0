/*
 * Search through the histd binary, on the memory and the file driver:
 * known answers over the wire, scopes, role filter, exclude_newest,
 * removal after Clear, request checks, and semantic search falling back to
 * lexical for sessions without embeddings.
 */
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
#include "pgharness.h"

static histd_proc *server;
static histd_client *client;
static char data_dir[128];

static int
start(const char *const *extra)
{
	if (harness_start(&server, extra))
		return -1;
	client = harness_client(server);
	return 0;
}

static int
setup_memory(void **state)
{
	(void)state;
	return start(NULL);
}

static int
setup_file(void **state)
{
	const char *extra[] = { "--driver", "file", "--data-dir", data_dir, NULL };

	(void)state;
	snprintf(data_dir, sizeof(data_dir), "/tmp/histd-search-XXXXXX");
	if (!mkdtemp(data_dir))
		return -1;
	return start(extra);
}

/* PostgreSQL: a fresh database on the test cluster (the ctest fixture
 * "pg", named by $HISTD_PG_STATE). */
static char *pg_db;

static int
setup_postgres(void **state)
{
	const char *dsn;

	(void)state;
	if (pgh_cluster_dsn(&dsn) != 0 ||
	    !(pg_db = pgh_new_database(dsn, "search")))
		return -1;
	{
		const char *extra[] = { "--driver", "postgres", "--dsn", pg_db,
					NULL };

		return start(extra);
	}
}

static int
teardown(void **state)
{
	int rc;

	(void)state;
	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	if (data_dir[0]) {
		char cmd[200];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", data_dir);
		if (system(cmd) != 0)
			rc = -1;
		data_dir[0] = '\0';
	}
	if (pg_db) {
		pgh_drop_database(pg_db);
		free(pg_db);
		pg_db = NULL;
	}
	return rc;
}

static void
create_labelled(tarena *a, const char *id, const char *team)
{
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	void **labels = ta_alloc(a, sizeof(void *));
	Histd__V1__Session *out = NULL;
	histd_status st = { 0 };

	histd__v1__create_session_request__init(r);
	r->session_id = ta_strdup(a, id);
	labels[0] = tm_entry(a, &histd__v1__create_session_request__labels_entry__descriptor,
			     "team", team);
	r->n_labels = 1;
	r->labels = (Histd__V1__CreateSessionRequest__LabelsEntry **)labels;
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor, &out,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

static void
append(tarena *a, const char *id, Histd__V1__Message **m, size_t n)
{
	Histd__V1__AppendRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__AppendResponse *out = NULL;
	histd_status st = { 0 };

	histd__v1__append_request__init(r);
	r->session_id = ta_strdup(a, id);
	r->n_messages = n;
	r->messages = m;
	t_call(client, "Append", r, &histd__v1__append_response__descriptor, &out,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

static void
corpus(tarena *a)
{
	Histd__V1__Message *cooking[] = {
		tm_text(a, HISTD__V1__ROLE__ROLE_USER, "How long to bake sourdough bread?"),
		tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT,
			"Bake the sourdough loaf for 45 minutes."),
		tm_text(a, HISTD__V1__ROLE__ROLE_USER, "What about rye flour?"),
	};
	Histd__V1__Message *travel[] = {
		tm_text(a, HISTD__V1__ROLE__ROLE_USER, "A night train from Paris to Vienna?"),
		tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT,
			"The night train to Vienna leaves at 19:58."),
		tm_tool_call(a, "c1", "timetable", "{\"city\":\"Vienna\"}"),
		tm_tool_result(a, "c1", "timetable", "Platform 7, sleeper car"),
	};

	create_labelled(a, "cooking", "red");
	create_labelled(a, "travel", "blue");
	append(a, "cooking", cooking, 3);
	append(a, "travel", travel, 4);
}

/* Sets r's label selector to the one pair key=value. */
static void
select_one(tarena *a, Histd__V1__SearchRequest *r, const char *key,
	   const char *value)
{
	r->label_selector = ta_alloc(a, sizeof(void *));
	r->label_selector[0] = tm_entry(a,
		&histd__v1__search_request__label_selector_entry__descriptor,
		key, value);
	r->n_label_selector = 1;
}

/* Calls Search; *out is the caller's (histd_client_message_free). */
static grpc_status_code
search(tarena *a, Histd__V1__SearchRequest *r, Histd__V1__SearchResponse **out)
{
	histd_status st = { 0 };
	grpc_status_code code;

	(void)a;
	*out = NULL;
	t_call(client, "Search", r, &histd__v1__search_response__descriptor, out,
	       &st);
	code = st.code;
	histd_status_reset(&st);
	return code;
}

static Histd__V1__SearchRequest *
req(tarena *a, const char *query, uint32_t k)
{
	Histd__V1__SearchRequest *r = ta_alloc(a, sizeof(*r));

	histd__v1__search_request__init(r);
	r->query = ta_strdup(a, query);
	r->k = k;
	return r;
}

static void
expect_hit(const Histd__V1__SearchResponse *s, size_t i, const char *session,
	   uint64_t seq)
{
	if (i >= s->n_hits)
		fail_msg("hit %zu missing (%zu hits)", i, s->n_hits);
	assert_string_equal(s->hits[i]->session_id, session);
	assert_int_equal(s->hits[i]->seq, seq);
	assert_non_null(s->hits[i]->message);
	assert_int_equal(s->hits[i]->message->seq, seq);
}

static void
search_finds_known_answers_over_the_wire(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	Histd__V1__SearchRequest *r;

	(void)state;
	corpus(a);
	r = req(a, "sourdough", 2);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 2);
	/* Precision at 2: both sourdough messages, nothing else. */
	for (size_t i = 0; i < 2; i++) {
		assert_string_equal(s->hits[i]->session_id, "cooking");
		assert_true(s->hits[i]->seq == 1 || s->hits[i]->seq == 2);
		assert_true(s->hits[i]->score > 0);
	}
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL);
	histd_client_message_free(&s->base);

	r = req(a, "night train vienna", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 3);     /* 1, 2 and the call's arguments */
	/* The shorter of the two messages with every word ranks first. */
	assert_string_equal(s->hits[0]->message->content[0]->text->text,
			    "A night train from Paris to Vienna?");
	histd_client_message_free(&s->base);

	/* Tool results only on request. */
	r = req(a, "sleeper", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 0);
	histd_client_message_free(&s->base);
	r->include_tool_results = 1;
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	expect_hit(s, 0, "travel", 4);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
search_scopes_roles_and_exclude_newest(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	Histd__V1__SearchRequest *r;
	Histd__V1__Role *roles;

	(void)state;
	corpus(a);
	/* One session. */
	r = req(a, "sourdough vienna rye", 10);
	r->session_id = ta_strdup(a, "travel");
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 3);
	for (size_t i = 0; i < s->n_hits; i++)
		assert_string_equal(s->hits[i]->session_id, "travel");
	histd_client_message_free(&s->base);
	/* Labels. */
	r = req(a, "sourdough vienna rye", 10);
	select_one(a, r, "team", "red");
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 3);
	for (size_t i = 0; i < s->n_hits; i++)
		assert_string_equal(s->hits[i]->session_id, "cooking");
	histd_client_message_free(&s->base);
	/* Roles: the assistant's answers only. */
	r = req(a, "sourdough vienna", 10);
	roles = ta_alloc(a, sizeof(*roles));
	roles[0] = HISTD__V1__ROLE__ROLE_ASSISTANT;
	r->n_roles = 1;
	r->roles = roles;
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 3);     /* cooking 2, travel 2 and 3 */
	for (size_t i = 0; i < s->n_hits; i++)
		assert_int_equal(s->hits[i]->message->role,
				 HISTD__V1__ROLE__ROLE_ASSISTANT);
	histd_client_message_free(&s->base);
	/* exclude_newest: "rye" is only in cooking's newest message. */
	r = req(a, "rye", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	expect_hit(s, 0, "cooking", 3);
	histd_client_message_free(&s->base);
	r->exclude_newest = 1;
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 0);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
search_forgets_cleared_messages_at_once(void **state)
{
	tarena *a = ta_new();
	Histd__V1__ClearRequest *cr = ta_alloc(a, sizeof(*cr));
	Histd__V1__ClearResponse *cout = NULL;
	Histd__V1__SearchResponse *s;
	Histd__V1__SearchRequest *r;
	histd_status st = { 0 };

	(void)state;
	corpus(a);
	r = req(a, "sourdough", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 2);
	histd_client_message_free(&s->base);
	histd__v1__clear_request__init(cr);
	cr->session_id = ta_strdup(a, "cooking");
	t_call(client, "Clear", cr, &histd__v1__clear_response__descriptor, &cout,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)cout);
	histd_status_reset(&st);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 0);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
search_checks_the_request(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	Histd__V1__SearchRequest *r;

	(void)state;
	corpus(a);
	r = req(a, "", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_INVALID_ARGUMENT);
	r = req(a, "--- ...", 10);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_INVALID_ARGUMENT);
	/* Also when no session is in scope. */
	select_one(a, r, "team", "nobody");
	assert_int_equal(search(a, r, &s), GRPC_STATUS_INVALID_ARGUMENT);
	r = req(a, "bread", 101);
	assert_int_equal(search(a, r, &s), GRPC_STATUS_INVALID_ARGUMENT);
	/* The selector's keys follow the labels' rules, as in ListSessions. */
	r = req(a, "bread", 10);
	select_one(a, r, "bad key", "v");
	assert_int_equal(search(a, r, &s), GRPC_STATUS_INVALID_ARGUMENT);
	r = req(a, "bread", 10);
	r->session_id = ta_strdup(a, "nope");
	assert_int_equal(search(a, r, &s), GRPC_STATUS_NOT_FOUND);
	r = req(a, "bread", 0);         /* k 0 means 10 */
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_hits, 1);
	histd_client_message_free(&s->base);
	ta_free(a);
}

static void
semantic_without_embeddings_falls_back_to_lexical(void **state)
{
	tarena *a = ta_new();
	Histd__V1__SearchResponse *s;
	Histd__V1__SearchRequest *r;

	(void)state;
	corpus(a);
	r = req(a, "sourdough", 10);
	r->mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC;
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->mode, HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL);
	assert_int_equal(s->n_lexical_fallback_sessions, 2);
	assert_int_equal(s->n_hits, 2);
	expect_hit(s, 0, "cooking", 1);
	histd_client_message_free(&s->base);
	r->mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID;
	assert_int_equal(search(a, r, &s), GRPC_STATUS_OK);
	assert_int_equal(s->n_lexical_fallback_sessions, 2);
	assert_int_equal(s->n_hits, 2);
	histd_client_message_free(&s->base);
	ta_free(a);
}

#define M(f) cmocka_unit_test_setup_teardown(f, setup_memory, teardown)
#define F(f) cmocka_unit_test_setup_teardown(f, setup_file, teardown)
#define P(f) cmocka_unit_test_setup_teardown(f, setup_postgres, teardown)

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		M(search_finds_known_answers_over_the_wire),
		M(search_scopes_roles_and_exclude_newest),
		M(search_forgets_cleared_messages_at_once),
		M(search_checks_the_request),
		M(semantic_without_embeddings_falls_back_to_lexical),
		F(search_finds_known_answers_over_the_wire),
		F(search_scopes_roles_and_exclude_newest),
		F(search_forgets_cleared_messages_at_once),
	};

	const struct CMUnitTest pg_tests[] = {
		P(search_finds_known_answers_over_the_wire),
		P(search_scopes_roles_and_exclude_newest),
		P(search_forgets_cleared_messages_at_once),
	};

	if (harness_init(argc, argv))
		return 1;
	/* Run by ctest twice: on memory and file, and (with the cluster of
	 * the pg fixture) on PostgreSQL. */
	if (getenv("HISTD_PG_STATE"))
		return cmocka_run_group_tests(pg_tests, NULL, NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
