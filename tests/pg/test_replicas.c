/*
 * Two real histd processes (replicas A and B) on one PostgreSQL database:
 * what one replica writes, the other serves and streams.
 *
 * Usage: pg_replicas <histd binary>; the cluster comes from the ctest
 * fixture "pg" ($HISTD_PG_STATE). Each run uses a database of its own.
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
#include <unistd.h>
#include <cmocka.h>

#include "harness.h"
#include "pgharness.h"
#include "start_gate.h"

static char *db;
static histd_proc *A, *B;
static histd_client *cA, *cB;

static int
start_replica(histd_proc **out)
{
	const char *extra[] = {
		"--driver", "postgres", "--dsn", db, "--pool-size", "8",
		"--threads", "16", NULL,
	};

	return harness_start(out, extra);
}

static int
group_setup(void **state)
{
	const char *cluster;

	(void)state;
	if (pgh_cluster_dsn(&cluster) != 0)
		return -1;
	db = pgh_new_database(cluster, "replicas");
	if (!db || start_replica(&A) != 0 || start_replica(&B) != 0)
		return -1;
	cA = harness_client(A);
	cB = harness_client(B);
	return 0;
}

static int
group_teardown(void **state)
{
	int rc = 0;

	(void)state;
	histd_client_close(cA);
	histd_client_close(cB);
	rc |= harness_stop(A);
	rc |= harness_stop(B);
	pgh_drop_database(db);
	free(db);
	return rc ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * Writers and a reader of events */

typedef struct writer {
	histd_client *c;
	const char *session;
	int id;
	int appends;
	int ok;
	int other;
} writer;

/* Appends of 1..3 messages, "w<id>-<i>" each. */
static void *
write_loop(void *arg)
{
	writer *w = arg;

	for (int i = 0; i < w->appends; i++) {
		char prefix[32];

		snprintf(prefix, sizeof(prefix), "w%d-%d", w->id, i);
		if (t_append_texts(w->c, w->session, 1 + (size_t)(i % 3), prefix, 0,
				   NULL) == GRPC_STATUS_OK)
			w->ok++;
		else
			w->other++;
	}
	return NULL;
}

/* What a subscriber saw: text by seq, and the checks of order. */
typedef struct seen {
	uint64_t next_seq;      /* the seq the next message must have */
	uint64_t last_rev;
	char **text;            /* by seq */
	size_t cap;
	int events;
} seen;

static void
seen_put(seen *s, uint64_t seq, const char *text)
{
	if (seq >= s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 256;

		while (cap <= seq)
			cap *= 2;
		s->text = realloc(s->text, cap * sizeof(*s->text));
		assert_non_null(s->text);
		memset(s->text + s->cap, 0, (cap - s->cap) * sizeof(*s->text));
		s->cap = cap;
	}
	s->text[seq] = strdup(text);
}

static void
seen_free(seen *s)
{
	for (size_t i = 0; i < s->cap; i++)
		free(s->text[i]);
	free(s->text);
}

/* Reads events until a message with seq >= until arrived; every message
 * must carry the next seq (no gap, no repeat), events increasing
 * revisions. Fails after timeout_ms without progress. */
static void
read_until(histd_client_stream *st, seen *s, uint64_t until, int timeout_ms)
{
	while (s->next_seq <= until) {
		int result;
		Histd__V1__HistoryEvent *ev = t_next_event(st, timeout_ms, &result);

		if (!ev)
			fail_msg("no event within %d ms (waiting for seq %" PRIu64
				 ", have up to %" PRIu64 ", stream result %d)",
				 timeout_ms, until, s->next_seq - 1, result);
		assert_true(ev->revision > s->last_rev);
		s->last_rev = ev->revision;
		s->events++;
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_APPENDED) {
			for (size_t i = 0; i < ev->appended->n_messages; i++) {
				const Histd__V1__Message *m = ev->appended->messages[i];

				if (m->seq != s->next_seq)
					fail_msg("seq %" PRIu64 " arrived, %" PRIu64
						 " expected", m->seq, s->next_seq);
				seen_put(s, m->seq, tm_first_text(m));
				s->next_seq++;
			}
		} else {
			fail_msg("unexpected event %d", ev->event_case);
		}
		histd_client_message_free(&ev->base);
	}
}

/* Every stored message is what the subscriber saw under its seq. */
static void
expect_same_as_stored(histd_client *c, const char *session, const seen *s)
{
	uint64_t after = 0, count = 0;

	for (;;) {
		Histd__V1__GetMessagesResponse *r = t_get_raw(c, session, after, 1000);

		for (size_t i = 0; i < r->n_messages; i++) {
			const Histd__V1__Message *m = r->messages[i];

			assert_true(m->seq < s->cap && s->text[m->seq]);
			assert_string_equal(s->text[m->seq], tm_first_text(m));
			count++;
		}
		after = r->next_after_seq;
		histd_client_message_free(&r->base);
		if (!after)
			break;
	}
	assert_int_equal(count, s->next_seq - 1);
}

static uint64_t
last_seq_of(histd_client *c, const char *session)
{
	Histd__V1__Session *s = t_get_session(c, session);
	uint64_t v = s->stats ? s->stats->last_seq : 0;

	histd_client_message_free(&s->base);
	return v;
}

/* ------------------------------------------------------------------------
 * Tests */

static void
subscribe_on_b_receives_every_message_appended_through_a(void **state)
{
	enum { WRITERS = 4, APPENDS = 60 };
	char *sid = t_create_session(cA, "sub-b");
	histd_client_stream *st;
	pthread_t th[WRITERS];
	writer w[WRITERS];
	seen s = { .next_seq = 1 };
	uint64_t last;
	int rc;

	(void)state;
	st = t_subscribe(cB, sid, 0);
	for (int i = 0; i < WRITERS; i++)
		w[i] = (writer){ .c = cA, .session = sid, .id = i, .appends = APPENDS };
	rc = start_threads(th, WRITERS, write_loop, w, sizeof(w[0]), NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	/* All joined before any assertion, which would leave w behind. */
	for (int i = 0; i < WRITERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < WRITERS; i++)
		assert_int_equal(w[i].other, 0);
	/* B serves at once what A acknowledged. */
	last = last_seq_of(cB, sid);
	assert_int_equal(last, WRITERS * (APPENDS / 3) * 6);
	read_until(st, &s, last, 10000);
	expect_same_as_stored(cB, sid, &s);
	histd_client_stream_close(st);
	seen_free(&s);
	free(sid);
}

static void
subscriber_sees_appends_of_both_replicas_in_order(void **state)
{
	enum { WRITERS = 4, APPENDS = 45 };
	char *sid = t_create_session(cB, "both");
	histd_client_stream *st;
	pthread_t th[WRITERS];
	writer w[WRITERS];
	seen s = { .next_seq = 1 };
	uint64_t last;
	int rc;

	(void)state;
	st = t_subscribe(cA, sid, 0);
	for (int i = 0; i < WRITERS; i++) {
		/* Half through the subscriber's replica, half through the
		 * other: local and remote changes interleave. */
		w[i] = (writer){ .c = i % 2 ? cB : cA, .session = sid, .id = i,
				 .appends = APPENDS };
	}
	rc = start_threads(th, WRITERS, write_loop, w, sizeof(w[0]), NULL);
	if (rc != 0)
		fail_msg("pthread_create: %s", strerror(rc));
	/* All joined before any assertion, which would leave w behind. */
	for (int i = 0; i < WRITERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < WRITERS; i++)
		assert_int_equal(w[i].other, 0);
	last = last_seq_of(cA, sid);
	assert_int_equal(last, WRITERS * (APPENDS / 3) * 6);
	read_until(st, &s, last, 10000);
	expect_same_as_stored(cA, sid, &s);
	histd_client_stream_close(st);
	seen_free(&s);
	free(sid);
}

typedef struct racer {
	histd_client *c;
	const char *session;
	uint64_t expected;
	start_gate *go;
	grpc_status_code code;
	char revision_trailer[32];
} racer;

static void *
race(void *arg)
{
	racer *r = arg;
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__AppendResponse *resp = NULL;
	histd_status st;
	const char *tr;

	req.session_id = (char *)r->session;
	req.n_messages = 1;
	req.messages = tm_texts(a, 1, "race");
	req.expected_revision = r->expected;
	histd_status_init(&st);
	start_gate_wait(r->go);
	t_call(r->c, "Append", &req, &histd__v1__append_response__descriptor,
	       &resp, &st);
	r->code = st.code;
	tr = histd_status_trailer(&st, "histd-revision");
	snprintf(r->revision_trailer, sizeof(r->revision_trailer), "%s",
		 tr ? tr : "");
	if (resp)
		histd_client_message_free(&resp->base);
	histd_status_reset(&st);
	ta_free(a);
	return NULL;
}

static void
racing_expected_revision_lets_exactly_one_replica_win(void **state)
{
	char *sid = t_create_session(cA, "race");
	start_gate go;

	(void)state;
	for (int round = 0; round < 30; round++) {
		Histd__V1__Session *s = t_get_session(round % 2 ? cB : cA, sid);
		racer r[2] = {
			{ .c = cA, .session = sid, .expected = s->revision, .go = &go },
			{ .c = cB, .session = sid, .expected = s->revision, .go = &go },
		};
		pthread_t th[2];
		uint64_t rev = s->revision;
		int winner, rc;

		histd_client_message_free(&s->base);
		start_gate_init(&go, 2);
		rc = start_threads(th, 2, race, r, sizeof(r[0]), &go);
		if (rc != 0)
			fail_msg("pthread_create: %s", strerror(rc));
		for (int i = 0; i < 2; i++)
			pthread_join(th[i], NULL);
		start_gate_destroy(&go);
		if (!((r[0].code == GRPC_STATUS_OK && r[1].code == GRPC_STATUS_ABORTED) ||
		      (r[1].code == GRPC_STATUS_OK && r[0].code == GRPC_STATUS_ABORTED)))
			fail_msg("round %d: A %s, B %s", round,
				 histd_status_code_name(r[0].code),
				 histd_status_code_name(r[1].code));
		winner = r[0].code == GRPC_STATUS_OK ? 0 : 1;
		/* The loser learns the winner's revision. */
		assert_int_equal(strtoull(r[1 - winner].revision_trailer, NULL, 10),
				 rev + 1);
	}
	assert_int_equal(last_seq_of(cB, sid), 30);
	free(sid);
}

static void
clear_and_delete_through_a_reach_a_subscriber_on_b(void **state)
{
	char *sid = t_create_session(cA, "lifecycle");
	histd_client_stream *st;
	Histd__V1__HistoryEvent *ev;
	Histd__V1__ClearRequest creq = HISTD__V1__CLEAR_REQUEST__INIT;
	Histd__V1__ClearResponse *cresp = NULL;
	Histd__V1__DeleteSessionRequest dreq = HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__DeleteSessionResponse *dresp = NULL;
	histd_status hs;
	seen s = { .next_seq = 1 };
	int result;

	(void)state;
	histd_status_init(&hs);
	st = t_subscribe(cB, sid, 0);
	assert_int_equal(t_append_texts(cA, sid, 3, "before", 0, NULL), GRPC_STATUS_OK);
	read_until(st, &s, 3, 10000);

	creq.session_id = sid;
	t_call(cA, "Clear", &creq, &histd__v1__clear_response__descriptor, &cresp, &hs);
	assert_status(&hs, GRPC_STATUS_OK);
	ev = t_next_event(st, 10000, &result);
	assert_non_null(ev);
	assert_int_equal(ev->event_case, HISTD__V1__HISTORY_EVENT__EVENT_CLEARED);
	assert_int_equal(ev->cleared->cleared_to_seq, 3);
	assert_int_equal(ev->revision, cresp->revision);
	histd_client_message_free(&ev->base);
	histd_client_message_free(&cresp->base);

	assert_int_equal(t_append_texts(cA, sid, 2, "after", 0, NULL), GRPC_STATUS_OK);
	s.next_seq = 4;
	read_until(st, &s, 5, 10000);

	dreq.session_id = sid;
	t_call(cA, "DeleteSession", &dreq, &histd__v1__delete_session_response__descriptor,
	       &dresp, &hs);
	assert_status(&hs, GRPC_STATUS_OK);
	histd_client_message_free(&dresp->base);
	ev = t_next_event(st, 10000, &result);
	assert_non_null(ev);
	assert_int_equal(ev->event_case, HISTD__V1__HISTORY_EVENT__EVENT_DELETED);
	histd_client_message_free(&ev->base);
	/* And the stream ends. */
	ev = t_next_event(st, 10000, &result);
	assert_null(ev);
	assert_int_equal(result, HISTD_STREAM_END);
	histd_status_reset(&hs);
	histd_client_stream_close(st);
	seen_free(&s);
	free(sid);
}

/* A replica stopped while another writes to a session it follows: its
 * listener may be catching up on those changes as it stops, and their
 * events go to the hub until the driver is closed. It exits 0 (in the
 * sanitizer build: without touching anything it freed). */
static void
a_replica_stopped_while_another_writes_exits_cleanly(void **state)
{
	enum { WRITERS = 2, ROUNDS = 3 };
	char *sid = t_create_session(cA, "stop-c");

	(void)state;
	for (int r = 0; r < ROUNDS; r++) {
		histd_proc *C = NULL;
		histd_client *cC;
		histd_client_stream *st;
		pthread_t th[WRITERS];
		writer w[WRITERS];
		int rc;

		assert_int_equal(start_replica(&C), 0);
		cC = harness_client(C);
		st = t_subscribe(cC, sid, last_seq_of(cA, sid));
		for (int i = 0; i < WRITERS; i++)
			w[i] = (writer){ .c = cA, .session = sid, .id = i,
					 .appends = 150 };
		rc = start_threads(th, WRITERS, write_loop, w, sizeof(w[0]), NULL);
		if (rc != 0)
			fail_msg("pthread_create: %s", strerror(rc));
		usleep(100000);
		histd_client_stream_close(st);
		histd_client_close(cC);
		rc = harness_stop(C);
		for (int i = 0; i < WRITERS; i++)
			pthread_join(th[i], NULL);
		assert_int_equal(rc, 0);
		for (int i = 0; i < WRITERS; i++)
			assert_int_equal(w[i].other, 0);
	}
	free(sid);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(subscribe_on_b_receives_every_message_appended_through_a),
		cmocka_unit_test(subscriber_sees_appends_of_both_replicas_in_order),
		cmocka_unit_test(racing_expected_revision_lets_exactly_one_replica_win),
		cmocka_unit_test(clear_and_delete_through_a_reach_a_subscriber_on_b),
		cmocka_unit_test(a_replica_stopped_while_another_writes_exits_cleanly),
	};

	if (harness_init(argc, argv) != 0)
		return 1;
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
