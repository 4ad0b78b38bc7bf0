/*
 * An Append waiting on PostgreSQL holds no server thread: a real histd with
 * --threads 2, eight Appends to a session whose row an outside transaction
 * holds FOR UPDATE wait in the driver, and meanwhile Health, GetSession and
 * GetMessages of another session are answered. Appends to that other
 * session are not queued behind the stalled batch, whether sent as soon
 * as it waits or later: they are committed and answered while it waits. Once the lock goes, every waiting Append is
 * answered OK and stored, in the order of its answers.
 *
 * On a driver that blocks a server thread per Append, the two threads wait
 * with the appends and Health is not answered while the lock is held; on
 * one that runs a single batch at a time, the other session's Append waits
 * for the lock too (and ends DEADLINE_EXCEEDED).
 *
 * Usage: pg_threads <histd binary>; the cluster comes from the ctest
 * fixture "pg" ($HISTD_PG_STATE).
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"
#include "pgharness.h"

#define WAITERS 8

static char *db;
static histd_proc *P;

static int
group_setup(void **state)
{
	const char *cluster;
	const char *extra[] = {
		"--driver", "postgres", "--dsn", NULL, "--pool-size", "4",
		"--threads", "2", "--pg-timeout-ms", "60000", NULL,
	};

	(void)state;
	if (pgh_cluster_dsn(&cluster) != 0 ||
	    !(db = pgh_new_database(cluster, "threads")))
		return -1;
	extra[3] = db;
	return harness_start(&P, extra);
}

static int
group_teardown(void **state)
{
	int rc;

	(void)state;
	rc = harness_stop(P);
	pgh_drop_database(db);
	free(db);
	return rc ? -1 : 0;
}

typedef struct waiter {
	int id;
	grpc_status_code code;
	uint64_t seq;
	atomic_int *answered;
} waiter;

static void *
append_waiting(void *arg)
{
	waiter *w = arg;
	histd_client *c = harness_client(P);
	Histd__V1__AppendResponse *resp = NULL;
	char prefix[32];

	snprintf(prefix, sizeof(prefix), "waiter-%d", w->id);
	w->code = t_append_texts(c, "locked", 1, prefix, 0, &resp);
	if (resp) {
		w->seq = resp->first_seq;
		histd_client_message_free(&resp->base);
	}
	atomic_fetch_add(w->answered, 1);
	histd_client_close(c);
	return NULL;
}

/* Backends of the test database waiting for a lock. */
static long
lock_waits(void)
{
	PGresult *r = pgh_sql(db, "SELECT count(*) FROM pg_stat_activity"
			      " WHERE wait_event_type = 'Lock'"
			      " AND datname = current_database()");
	long n;

	assert_non_null(r);
	n = strtol(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return n;
}

static void
health_and_reads_are_answered_while_appends_wait_on_a_lock(void **state)
{
	histd_client *c = harness_client(P);
	Grpc__Health__V1__HealthCheckRequest hreq =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	Grpc__Health__V1__HealthCheckResponse *hresp = NULL;
	Histd__V1__GetMessagesResponse *got;
	Histd__V1__Session *s;
	waiter w[WAITERS];
	pthread_t th[WAITERS];
	atomic_int answered;
	histd_status st;
	PGconn *lk;
	PGresult *r;
	int64_t give_up;
	int seen[WAITERS + 1] = { 0 };

	(void)state;
	free(t_create_session(c, "locked"));
	free(t_create_session(c, "free"));
	assert_int_equal(t_append_texts(c, "free", 3, "free", 0, NULL),
			 GRPC_STATUS_OK);

	lk = PQconnectdb(db);
	assert_int_equal(PQstatus(lk), CONNECTION_OK);
	r = PQexec(lk, "BEGIN; SELECT 1 FROM sessions WHERE id = 'locked'"
		   " FOR UPDATE");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	PQclear(r);

	atomic_init(&answered, 0);
	for (int i = 0; i < WAITERS; i++) {
		w[i] = (waiter){ .id = i, .answered = &answered };
		assert_int_equal(pthread_create(&th[i], NULL, append_waiting,
						&w[i]), 0);
	}
	/* The first batch is stuck on the row lock. */
	give_up = t_now_ms() + 10000;
	while (lock_waits() < 1 && t_now_ms() < give_up)
		usleep(20000);
	assert_true(lock_waits() >= 1);
	/* An append to another session at once, while the stuck batch is
	 * young: a committer must still notice the stall later. */
	{
		Histd__V1__AppendResponse *ar = NULL;

		assert_int_equal(t_append_texts(c, "free", 1, "early", 0, &ar),
				 GRPC_STATUS_OK);
		assert_int_equal(ar->first_seq, 4);
		histd_client_message_free(&ar->base);
	}
	usleep(200000);         /* the other appends reach histd */

	/* Both server threads are free: these are answered. */
	histd_status_init(&st);
	assert_int_equal(histd_client_unary(c, HISTD_PATH_HEALTH_CHECK,
					    &hreq.base,
					    &grpc__health__v1__health_check_response__descriptor,
					    10000, NULL,
					    (ProtobufCMessage **)&hresp, &st), 0);
	assert_status(&st, GRPC_STATUS_OK);
	assert_int_equal(hresp->status,
			 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
	histd_client_message_free(&hresp->base);
	histd_status_reset(&st);
	s = t_get_session(c, "free");
	assert_int_equal(s->stats->message_count, 4);
	histd_client_message_free(&s->base);
	got = t_get_raw(c, "free", 0, 0);
	assert_int_equal(got->n_messages, 4);
	histd_client_message_free(&got->base);

	/* Appends to another session are not held back by the stalled
	 * batch: each is committed and answered beside it, and none of the
	 * locked session's queued appends goes with them (one backend
	 * still waits on the lock, not two). */
	for (int i = 0; i < 3; i++) {
		Histd__V1__AppendResponse *ar = NULL;

		assert_int_equal(t_append_texts(c, "free", 1, "beside", 0, &ar),
				 GRPC_STATUS_OK);
		assert_int_equal(ar->first_seq, 5 + i);
		histd_client_message_free(&ar->base);
	}
	got = t_get_raw(c, "free", 3, 0);
	assert_int_equal(got->n_messages, 4);
	histd_client_message_free(&got->base);

	/* ... while every append to the locked session still waits. */
	assert_int_equal(atomic_load(&answered), 0);
	assert_int_equal(lock_waits(), 1);

	r = PQexec(lk, "ROLLBACK");
	PQclear(r);
	PQfinish(lk);
	for (int i = 0; i < WAITERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < WAITERS; i++) {
		assert_int_equal(w[i].code, GRPC_STATUS_OK);
		assert_true(w[i].seq >= 1 && w[i].seq <= WAITERS);
		seen[w[i].seq]++;
	}
	for (int i = 1; i <= WAITERS; i++)
		assert_int_equal(seen[i], 1);
	s = t_get_session(c, "locked");
	assert_int_equal(s->stats->message_count, WAITERS);
	histd_client_message_free(&s->base);
	histd_client_close(c);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(health_and_reads_are_answered_while_appends_wait_on_a_lock),
	};

	if (harness_init(argc, argv) != 0)
		return 1;
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
