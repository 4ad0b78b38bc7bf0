/*
 * Graceful shutdown: SIGTERM while several threads append and a subscriber
 * listens. Every append either succeeded or was refused (UNAVAILABLE; or
 * CANCELLED for the one call per writer that can race with the start of the
 * shutdown: gRPC core cancels a call that reached the server but was not
 * yet handed to histd); the acknowledged ones hold distinct seqs with no
 * hole and nothing beyond them was applied (no answer of a committed append
 * was lost); the subscriber got a gap-free prefix and then UNAVAILABLE;
 * histd exits 0 within its grace. SIGHUP is logged and changes nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "harness.h"

#define N_WRITERS 4
#define GRACE_S 5
#define MAX_RANGES 200000

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Acknowledged [first, last] ranges of every writer. */
static struct range { uint64_t first, last; } ranges[MAX_RANGES];
static _Atomic size_t n_ranges;

typedef struct writer {
	pthread_t thread;
	histd_client *client;
	const char *session_id;
	_Atomic int *stop;
	int ok, unavailable, cancelled, other;
	grpc_status_code other_code;
	char other_details[160];
} writer;

static void *writer_main(void *arg)
{
	writer *w = arg;
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = (char *)w->session_id;
	req.n_messages = 2;
	req.messages = tm_texts(a, 2, "under load");
	histd_status st;
	histd_status_init(&st);
	while (!*w->stop) {
		Histd__V1__AppendResponse *resp = NULL;
		histd_client_unary(w->client, HISTD_PATH("Append"), &req.base,
				   &histd__v1__append_response__descriptor,
				   10000, NULL, (ProtobufCMessage **)&resp, &st);
		if (st.code == GRPC_STATUS_OK) {
			size_t i = n_ranges++;
			if (i < MAX_RANGES) {
				ranges[i].first = resp->first_seq;
				ranges[i].last = resp->last_seq;
			}
			w->ok++;
			histd_client_message_free(&resp->base);
		} else if (st.code == GRPC_STATUS_UNAVAILABLE) {
			/* The main thread polls it. */
			__atomic_fetch_add(&w->unavailable, 1, __ATOMIC_RELAXED);
			sleep_ms(5);
		} else if (st.code == GRPC_STATUS_CANCELLED) {
			w->cancelled++;
			sleep_ms(5);
		} else {
			if (!w->other++) {
				w->other_code = st.code;
				snprintf(w->other_details,
					 sizeof(w->other_details), "%s",
					 st.details ? st.details : "");
			}
			sleep_ms(5);
		}
		histd_status_reset(&st);
	}
	ta_free(a);
	return NULL;
}

typedef struct listener {
	pthread_t thread;
	histd_client_stream *s;
	uint64_t next;
	int gap;
	int ended, timed_out;
} listener;

static void *listener_main(void *arg)
{
	listener *l = arg;
	for (;;) {
		ProtobufCMessage *m = NULL;
		int res = histd_client_stream_next(
			l->s, &histd__v1__history_event__descriptor, 60000, &m);
		if (res == HISTD_STREAM_TIMEOUT) {
			l->timed_out = 1;
			return NULL;
		}
		if (res != HISTD_STREAM_MESSAGE) {
			l->ended = 1;
			return NULL;
		}
		Histd__V1__HistoryEvent *ev = (Histd__V1__HistoryEvent *)m;
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_APPENDED)
			for (size_t i = 0; i < ev->appended->n_messages; i++) {
				if (ev->appended->messages[i]->seq != l->next)
					l->gap = 1;
				l->next = ev->appended->messages[i]->seq + 1;
			}
		histd_client_message_free(m);
	}
}

static int by_first(const void *a, const void *b)
{
	const struct range *x = a, *y = b;
	return x->first < y->first ? -1 : x->first > y->first;
}

static void sigterm_under_load_drains_and_exits_zero(void **state)
{
	(void)state;
	/* The subscriber's queue holds every append of the run: on a loaded
	 * machine (the sanitizer suite beside other tests) the listener can
	 * fall 1,024 changes behind, and its stream would end as too slow
	 * (RESOURCE_EXHAUSTED), which is not what this test is about. */
	static const char *const flags[] = {
		"--shutdown-grace", "5", "--threads", "4",
		"--subscriber-queue", "1000000", NULL };
	histd_proc *p;
	assert_int_equal(harness_start(&p, flags), 0);
	histd_client *c = harness_client(p);
	char *id = t_create_session(c, "shutdown-1");

	listener l = { .s = t_subscribe(c, id, 0), .next = 1 };
	assert_int_equal(pthread_create(&l.thread, NULL, listener_main, &l), 0);

	_Atomic int stop = 0;
	writer w[N_WRITERS];
	histd_client *wc[N_WRITERS];
	n_ranges = 0;
	for (int i = 0; i < N_WRITERS; i++) {
		wc[i] = harness_client(p);
		w[i] = (writer){ .client = wc[i], .session_id = id,
				 .stop = &stop };
		int err = pthread_create(&w[i].thread, NULL, writer_main, &w[i]);
		if (err != 0) {
			/* The started threads use this frame: stop them and
			 * the server (which ends the subscriber's stream)
			 * before failing. */
			stop = 1;
			for (int j = 0; j < i; j++)
				pthread_join(w[j].thread, NULL);
			harness_signal_wait(p, SIGTERM, (GRACE_S + 10) * 1000);
			pthread_join(l.thread, NULL);
			fail_msg("pthread_create of writer %d: %s", i,
				 strerror(err));
		}
	}
	sleep_ms(1500);

	int64_t t0 = t_now_ms();
	int rc = harness_signal_wait(p, SIGTERM, (GRACE_S + 10) * 1000);
	int64_t took = t_now_ms() - t0;
	fprintf(stderr, "histd exited %d %lld ms after SIGTERM\n", rc,
		(long long)took);
	if (rc != 0)
		harness_dump_log(p);

	/* Calls against the stopped server until every writer has seen it
	 * gone (bounded: a loaded machine may not schedule them at once). */
	for (int waited = 0; waited < 10000; waited += 20) {
		int all = 1;

		for (int i = 0; i < N_WRITERS; i++)
			all &= __atomic_load_n(&w[i].unavailable, __ATOMIC_RELAXED) > 0;
		if (all)
			break;
		sleep_ms(20);
	}
	stop = 1;
	/* Every thread is joined before anything is asserted: a failed
	 * assertion leaves this frame, which they use. histd is gone by now
	 * (harness_signal_wait kills it if it did not exit), so the
	 * subscriber's stream ends too. */
	for (int i = 0; i < N_WRITERS; i++)
		pthread_join(w[i].thread, NULL);
	pthread_join(l.thread, NULL);
	assert_int_equal(rc, 0);
	assert_true(took < (GRACE_S + 5) * 1000);
	int ok = 0;
	for (int i = 0; i < N_WRITERS; i++) {
		ok += w[i].ok;
		fprintf(stderr, "writer %d: %d ok, %d unavailable, "
			"%d cancelled, %d other\n", i, w[i].ok,
			w[i].unavailable, w[i].cancelled, w[i].other);
		if (w[i].other)
			fprintf(stderr, "  first other: %s \"%s\"\n",
				histd_status_code_name(w[i].other_code),
				w[i].other_details);
		assert_int_equal(w[i].other, 0);
		assert_true(w[i].cancelled <= 1);
		/* Each writer saw the server go away. */
		assert_true(w[i].unavailable > 0);
	}
	assert_true(ok > 0);

	/* Acknowledged appends hold 1..N without overlap or hole. */
	size_t n = n_ranges;
	assert_true(n <= MAX_RANGES);
	qsort(ranges, n, sizeof(ranges[0]), by_first);
	uint64_t expect = 1;
	for (size_t i = 0; i < n; i++) {
		if (ranges[i].first != expect)
			fprintf(stderr, "acknowledged seqs jump from %llu to %llu\n",
				(unsigned long long)expect - 1,
				(unsigned long long)ranges[i].first);
		assert_int_equal(ranges[i].first, expect);
		assert_int_equal(ranges[i].last, ranges[i].first + 1);
		expect = ranges[i].last + 1;
	}

	/* The subscriber saw a gap-free prefix, then UNAVAILABLE. */
	assert_false(l.timed_out);
	assert_true(l.ended);
	assert_false(l.gap);
	assert_true(l.next > 1);
	assert_true(l.next <= expect);
	assert_status(histd_client_stream_status(l.s), GRPC_STATUS_UNAVAILABLE);
	fprintf(stderr, "%llu messages acknowledged, subscriber saw %llu\n",
		(unsigned long long)expect - 1,
		(unsigned long long)l.next - 1);

	histd_client_stream_close(l.s);
	for (int i = 0; i < N_WRITERS; i++)
		histd_client_close(wc[i]);
	histd_client_close(c);
	harness_free(p);
	free(id);
}

/* A connected client that does nothing may not notice the server's GOAWAY
 * for a while (gRPC's client polls an idle channel every 5 s); the grace
 * bounds how long it can hold the shutdown. SIGINT works like SIGTERM. */
static void sigint_with_an_idle_client_exits_zero_within_the_grace(void **state)
{
	(void)state;
	static const char *const flags[] = { "--shutdown-grace", "2", NULL };
	histd_proc *p;
	assert_int_equal(harness_start(&p, flags), 0);
	histd_client *c = harness_client(p);
	free(t_create_session(c, "idle"));
	int64_t t0 = t_now_ms();
	int rc = harness_signal_wait(p, SIGINT, 20000);
	int64_t took = t_now_ms() - t0;
	fprintf(stderr, "histd exited %d %lld ms after SIGINT\n", rc,
		(long long)took);
	if (rc != 0)
		harness_dump_log(p);
	assert_int_equal(rc, 0);
	assert_true(took < 2000 + 3000);
	histd_client_close(c);
	harness_free(p);
}

static void sigterm_ends_an_idle_subscriber_with_unavailable(void **state)
{
	(void)state;
	histd_proc *p;
	assert_int_equal(harness_start(&p, NULL), 0);
	histd_client *c = harness_client(p);
	char *id = t_create_session(c, "idle-sub");
	histd_client_stream *s = t_subscribe(c, id, 0);
	/* Wait until the subscription is live: an append arrives. */
	assert_int_equal(t_append_texts(c, id, 1, "hi", 0, NULL),
			 GRPC_STATUS_OK);
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
	assert_int_equal(res, HISTD_STREAM_MESSAGE);
	histd_client_message_free(&ev->base);

	kill(p->pid, SIGTERM);
	int64_t t0 = t_now_ms();
	assert_null(t_next_event(s, 20000, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	assert_status(histd_client_stream_status(s), GRPC_STATUS_UNAVAILABLE);
	/* Ended at once, not at the end of the grace. */
	assert_true(t_now_ms() - t0 < 5000);
	histd_client_stream_close(s);
	assert_int_equal(harness_signal_wait(p, 0, 20000), 0);
	histd_client_close(c);
	harness_free(p);
	free(id);
}

/* SIGHUP is what a reload is often sent as; histd re-reads its files by
 * itself, so it logs the signal and goes on serving. */
static void sighup_is_logged_and_serving_goes_on(void **state)
{
	(void)state;
	histd_proc *p;
	assert_int_equal(harness_start(&p, NULL), 0);
	histd_client *c = harness_client(p);
	char *id = t_create_session(c, "hup");
	assert_int_equal(kill(p->pid, SIGHUP), 0);
	int64_t t0 = t_now_ms();
	while (!harness_log_has(p, "SIGHUP ignored") && t_now_ms() - t0 < 20000)
		sleep_ms(20);
	if (!harness_log_has(p, "SIGHUP ignored"))
		harness_dump_log(p);
	assert_true(harness_log_has(p, "SIGHUP ignored"));
	assert_int_equal(t_append_texts(c, id, 1, "after hup", 0, NULL),
			 GRPC_STATUS_OK);
	histd_client_close(c);
	free(id);
	assert_int_equal(harness_stop(p), 0);
}

int main(int argc, char **argv)
{
	if (harness_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(sigterm_under_load_drains_and_exits_zero),
		cmocka_unit_test(sigint_with_an_idle_client_exits_zero_within_the_grace),
		cmocka_unit_test(sigterm_ends_an_idle_subscriber_with_unavailable),
		cmocka_unit_test(sighup_is_logged_and_serving_goes_on),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
