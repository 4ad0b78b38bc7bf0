/*
 * Limits and truncate across two real histd processes (replicas A and B)
 * on one PostgreSQL database, both started with --max-sessions-per-tenant 3:
 *
 * - creates, resolves and forks racing through both replicas never make
 *   more than 3 sessions of the tenant; the others get RESOURCE_EXHAUSTED
 *   naming the limit;
 * - a truncate made through A (the window's retention = delete dropping
 *   what the window leaves out) reaches a Subscribe on B as a cleared
 *   event that keeps system messages, and B serves what A kept.
 *
 * Usage: pg_limits <histd binary>; the cluster comes from the ctest
 * fixture "pg" ($HISTD_PG_STATE). Each test runs on a database and a pair
 * of replicas of its own (the tenant is the same for every call).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "pgharness.h"
#include "start_gate.h"

#define LIMIT 3

typedef struct pair {
	char *db;
	histd_proc *a, *b;
	histd_client *ca, *cb;
} pair;

static int
start_replica(const char *db, histd_proc **out)
{
	const char *extra[] = {
		"--driver", "postgres", "--dsn", db, "--pool-size", "4",
		"--threads", "8", "--max-sessions-per-tenant", "3", NULL,
	};

	return harness_start(out, extra);
}

static int
setup(void **state)
{
	const char *cluster;
	pair *p = calloc(1, sizeof(*p));

	if (!p || pgh_cluster_dsn(&cluster) != 0)
		return -1;
	*state = p;
	p->db = pgh_new_database(cluster, "limits");
	if (!p->db || start_replica(p->db, &p->a) != 0 ||
	    start_replica(p->db, &p->b) != 0)
		return -1;
	p->ca = harness_client(p->a);
	p->cb = harness_client(p->b);
	return 0;
}

static int
teardown(void **state)
{
	pair *p = *state;
	int rc = 0;

	if (p->ca)
		histd_client_close(p->ca);
	if (p->cb)
		histd_client_close(p->cb);
	rc |= harness_stop(p->a);
	rc |= harness_stop(p->b);
	if (p->db)
		pgh_drop_database(p->db);
	free(p->db);
	free(p);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * Sessions per tenant */

typedef struct creator {
	histd_client *c;
	int id;
	start_gate *go;
	grpc_status_code code[3];
	char details[3][160];
} creator;

static void
keep(creator *k, int i, histd_status *st)
{
	k->code[i] = st->code;
	snprintf(k->details[i], sizeof(k->details[i]), "%s",
		 st->details ? st->details : "");
	histd_status_reset(st);
}

/* CreateSession, ResolveSession with keys of its own, ForkSession of
 * "base": each would make a new session. */
static void *
create_three(void *arg)
{
	creator *k = arg;
	tarena *a = ta_new();
	Histd__V1__CreateSessionRequest cr = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__ResolveSessionRequest rr = HISTD__V1__RESOLVE_SESSION_REQUEST__INIT;
	Histd__V1__ForkSessionRequest fr = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	Histd__V1__ResolveSessionResponse *rs = NULL;
	void *keys[1];
	histd_status st;

	histd_status_init(&st);
	cr.session_id = ta_printf(a, "c%d", k->id);
	keys[0] = tm_entry(a,
		&histd__v1__resolve_session_request__context_keys_entry__descriptor,
		"who", ta_printf(a, "k%d", k->id));
	rr.context_keys = (Histd__V1__ResolveSessionRequest__ContextKeysEntry **)keys;
	rr.n_context_keys = 1;
	fr.session_id = "base";
	fr.new_session_id = ta_printf(a, "f%d", k->id);
	start_gate_wait(k->go);

	t_call(k->c, "CreateSession", &cr, &histd__v1__session__descriptor, &s, &st);
	keep(k, 0, &st);
	histd_client_message_free((ProtobufCMessage *)s);
	s = NULL;
	histd_status_init(&st);
	t_call(k->c, "ResolveSession", &rr,
	       &histd__v1__resolve_session_response__descriptor, &rs, &st);
	keep(k, 1, &st);
	histd_client_message_free((ProtobufCMessage *)rs);
	histd_status_init(&st);
	t_call(k->c, "ForkSession", &fr, &histd__v1__session__descriptor, &s, &st);
	keep(k, 2, &st);
	histd_client_message_free((ProtobufCMessage *)s);
	ta_free(a);
	return NULL;
}

/* The tenant's sessions, as a replica lists them. */
static size_t
sessions_listed(histd_client *c)
{
	Histd__V1__ListSessionsRequest req = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__ListSessionsResponse *resp = NULL;
	histd_status st;
	size_t n;

	histd_status_init(&st);
	req.page_size = 100;
	t_call(c, "ListSessions", &req, &histd__v1__list_sessions_response__descriptor,
	       &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	n = resp->n_sessions;
	histd_client_message_free(&resp->base);
	histd_status_reset(&st);
	return n;
}

static grpc_status_code
create_one(histd_client *c, const char *id, char *details, size_t cap)
{
	Histd__V1__CreateSessionRequest req = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	histd_status st;
	grpc_status_code code;

	histd_status_init(&st);
	req.session_id = (char *)id;
	t_call(c, "CreateSession", &req, &histd__v1__session__descriptor, &s, &st);
	code = st.code;
	if (details)
		snprintf(details, cap, "%s", st.details ? st.details : "");
	histd_client_message_free((ProtobufCMessage *)s);
	histd_status_reset(&st);
	return code;
}

static void
creates_racing_through_both_replicas_never_pass_the_limit(void **state)
{
	enum { THREADS = 8 };
	pair *p = *state;
	pthread_t th[THREADS];
	creator k[THREADS];
	start_gate go;
	Histd__V1__DeleteSessionRequest dr = HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__DeleteSessionResponse *dresp = NULL;
	histd_status st;
	char details[160];
	int ok = 0, exhausted = 0, rc;

	/* One session to fork; two places left. */
	free(t_create_session(p->ca, "base"));
	assert_int_equal(t_append_texts(p->ca, "base", 2, "forked", 0, NULL),
			 GRPC_STATUS_OK);
	start_gate_init(&go, THREADS);
	for (int i = 0; i < THREADS; i++)
		k[i] = (creator){ .c = i % 2 ? p->cb : p->ca, .id = i, .go = &go };
	rc = start_threads(th, THREADS, create_three, k, sizeof(k[0]), &go);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	start_gate_destroy(&go);
	for (int i = 0; i < THREADS; i++)
		for (int j = 0; j < 3; j++) {
			if (k[i].code[j] == GRPC_STATUS_OK) {
				ok++;
				continue;
			}
			if (k[i].code[j] != GRPC_STATUS_RESOURCE_EXHAUSTED)
				fail_msg("call %d of creator %d: %s %s", j, i,
					 histd_status_code_name(k[i].code[j]),
					 k[i].details[j]);
			if (!strstr(k[i].details[j], "the limit is 3"))
				fail_msg("call %d of creator %d: \"%s\" does not "
					 "name the limit", j, i, k[i].details[j]);
			exhausted++;
		}
	assert_int_equal(ok, LIMIT - 1);
	assert_int_equal(exhausted, 3 * THREADS - (LIMIT - 1));
	assert_int_equal(sessions_listed(p->ca), LIMIT);
	assert_int_equal(sessions_listed(p->cb), LIMIT);

	/* A delete through one replica makes room for a create through the
	 * other, once. */
	{
		Histd__V1__ListSessionsRequest lr = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
		Histd__V1__ListSessionsResponse *lresp = NULL;

		histd_status_init(&st);
		t_call(p->cb, "ListSessions", &lr,
		       &histd__v1__list_sessions_response__descriptor, &lresp, &st);
		assert_status(&st, GRPC_STATUS_OK);
		histd_status_reset(&st);
		/* Any session but "base". */
		for (size_t i = 0; i < lresp->n_sessions; i++)
			if (strcmp(lresp->sessions[i]->id, "base")) {
				dr.session_id = strdup(lresp->sessions[i]->id);
				break;
			}
		histd_client_message_free(&lresp->base);
	}
	assert_non_null(dr.session_id);
	histd_status_init(&st);
	t_call(p->cb, "DeleteSession", &dr,
	       &histd__v1__delete_session_response__descriptor, &dresp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)dresp);
	histd_status_reset(&st);
	free(dr.session_id);
	assert_int_equal(create_one(p->ca, "after-delete", NULL, 0), GRPC_STATUS_OK);
	assert_int_equal(create_one(p->cb, "one-too-many", details, sizeof(details)),
			 GRPC_STATUS_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(details, "the tenant has 3 sessions; the limit is 3"));
}

/* ------------------------------------------------------------------------
 * Truncate */

/* A session with the window plugin: the last 3 messages, deleting the
 * older ones. Returns the status code. */
static grpc_status_code
create_with_retention(histd_client *c, const char *id)
{
	tarena *a = ta_new();
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig cfg = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT;
	Histd__V1__PluginConfig *pcs[1] = { &pc };
	void *opts[2];
	Histd__V1__Session *out = NULL;
	histd_status st;
	grpc_status_code code;

	opts[0] = tm_entry(a, &histd__v1__plugin_config__options_entry__descriptor,
			   "max_messages", "3");
	opts[1] = tm_entry(a, &histd__v1__plugin_config__options_entry__descriptor,
			   "retention", "delete");
	pc.name = "window";
	pc.options = (Histd__V1__PluginConfig__OptionsEntry **)opts;
	pc.n_options = 2;
	pl.plugins = pcs;
	pl.n_plugins = 1;
	cfg.pipeline = &pl;
	r.session_id = (char *)id;
	r.config = &cfg;
	histd_status_init(&st);
	t_call(c, "CreateSession", &r, &histd__v1__session__descriptor, &out, &st);
	code = st.code;
	if (code != GRPC_STATUS_OK)
		t_print_status("CreateSession with retention", &st);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
	ta_free(a);
	return code;
}

static void
append_one(histd_client *c, const char *id, Histd__V1__Role role,
	   const char *text)
{
	tarena *a = ta_new();
	Histd__V1__AppendRequest r = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *m[1] = { tm_text(a, role, text) };
	Histd__V1__AppendResponse *out = NULL;
	histd_status st;

	r.session_id = (char *)id;
	r.messages = m;
	r.n_messages = 1;
	histd_status_init(&st);
	t_call(c, "Append", &r, &histd__v1__append_response__descriptor, &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(&out->base);
	histd_status_reset(&st);
	ta_free(a);
}

static void
truncate_through_a_reaches_a_subscribe_on_b_as_cleared(void **state)
{
	enum { USERS = 10 };
	pair *p = *state;
	histd_client_stream *st;
	Histd__V1__HistoryEvent *ev;
	Histd__V1__GetMessagesResponse *raw;
	uint64_t last_rev = 0, cleared_to = 0, last_seq = USERS + 1;
	int64_t give_up;
	int result, cleared_events = 0;
	grpc_status_code code;

	/* Retention is what truncates through the API: a server without it
	 * refuses the option, and there is nothing to test. */
	code = create_with_retention(p->ca, "kept");
	if (code == GRPC_STATUS_INVALID_ARGUMENT)
		skip();
	assert_int_equal(code, GRPC_STATUS_OK);
	st = t_subscribe(p->cb, "kept", 0);
	append_one(p->ca, "kept", HISTD__V1__ROLE__ROLE_SYSTEM, "Answer briefly.");
	for (int i = 0; i < USERS; i++) {
		char text[32];

		snprintf(text, sizeof(text), "question %d", i);
		append_one(p->ca, "kept", HISTD__V1__ROLE__ROLE_USER, text);
	}
	/* A deletes off the request path: wait until B streamed a cleared
	 * event up to what the window keeps (the last 3 of seqs 2..11). */
	give_up = t_now_ms() + 20000;
	while (cleared_to < last_seq - 3) {
		int left = (int)(give_up - t_now_ms());

		ev = left > 0 ? t_next_event(st, left, &result) : NULL;
		if (!ev)
			fail_msg("no cleared event up to seq %" PRIu64 " on B "
				 "(have %" PRIu64 ", %d cleared events)",
				 last_seq - 3, cleared_to, cleared_events);
		assert_true(ev->revision > last_rev);
		last_rev = ev->revision;
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_CLEARED) {
			/* Retention: system messages stay. */
			assert_true(ev->cleared->system_kept);
			assert_true(ev->cleared->cleared_to_seq > cleared_to);
			cleared_to = ev->cleared->cleared_to_seq;
			cleared_events++;
		} else if (ev->event_case != HISTD__V1__HISTORY_EVENT__EVENT_APPENDED) {
			fail_msg("unexpected event %d", ev->event_case);
		}
		histd_client_message_free(&ev->base);
	}
	/* B serves what A kept: the system message and the window. */
	raw = t_get_raw(p->cb, "kept", 0, 100);
	assert_true(raw->n_messages >= 2);
	assert_int_equal(raw->messages[0]->seq, 1);
	assert_int_equal(raw->messages[0]->role, HISTD__V1__ROLE__ROLE_SYSTEM);
	for (size_t i = 1; i < raw->n_messages; i++)
		assert_true(raw->messages[i]->seq > cleared_to);
	assert_int_equal(raw->messages[raw->n_messages - 1]->seq, last_seq);
	histd_client_message_free(&raw->base);
	histd_client_stream_close(st);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			creates_racing_through_both_replicas_never_pass_the_limit,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			truncate_through_a_reaches_a_subscribe_on_b_as_cleared,
			setup, teardown),
	};

	if (harness_init(argc, argv) != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
