/*
 * A subscriber that stops reading must not slow anyone else: with
 * --subscriber-queue 8, a subscriber that never reads while ~2000 appends
 * of 4 KiB go in is ended with RESOURCE_EXHAUSTED and the trailer
 * "histd-resume-after-seq", appends keep succeeding, and a subscriber that
 * reads receives everything. Resuming from the trailer's seq gives the
 * rest without gap.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "harness.h"

#define N_APPENDS 2000
#define MESSAGE_BYTES 4096
/* How far the writer lets the reading subscriber lag: half its queue of 8,
 * so that it keeps up however the two threads are scheduled. */
#define READER_LAG 4

static histd_proc *server;

static int setup(void **state)
{
	(void)state;
	/* The stalled subscriber reads its status only after the appends:
	 * a grace long enough for any machine. */
	static const char *const flags[] = { "--subscriber-queue", "8",
		"--subscriber-end-grace", "600", NULL };
	return harness_start(&server, flags);
}

/* Normally the last test has stopped the server already. */
static int teardown(void **state)
{
	(void)state;
	int rc = harness_stop(server);
	server = NULL;
	return rc;
}

static void sigterm_stops_the_server_with_exit_status_0(void **state)
{
	(void)state;
	histd_proc *p = server;
	server = NULL;
	assert_int_equal(harness_stop(p), 0);
}

/* A subscriber that reads everything on its own thread; no cmocka asserts
 * there: it records what it saw. */
typedef struct reader {
	pthread_t thread;
	histd_client_stream *s;
	uint64_t want_last;
	_Atomic uint64_t next;       /* the next seq expected */
	_Atomic int gap;             /* a seq arrived out of order */
	_Atomic int ended;           /* the stream ended early */
	_Atomic int timed_out;       /* 30 s of silence */
} reader;

static void *reader_main(void *arg)
{
	reader *r = arg;
	while (r->next <= r->want_last) {
		ProtobufCMessage *m = NULL;
		int res = histd_client_stream_next(
			r->s, &histd__v1__history_event__descriptor, 30000, &m);
		if (res == HISTD_STREAM_TIMEOUT) {
			r->timed_out = 1;
			return NULL;
		}
		if (res != HISTD_STREAM_MESSAGE) {
			r->ended = 1;
			return NULL;
		}
		Histd__V1__HistoryEvent *ev = (Histd__V1__HistoryEvent *)m;
		if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_APPENDED) {
			for (size_t i = 0; i < ev->appended->n_messages; i++) {
				if (ev->appended->messages[i]->seq != r->next)
					r->gap = 1;
				r->next = ev->appended->messages[i]->seq + 1;
			}
		} else {
			r->gap = 1;
		}
		histd_client_message_free(m);
	}
	return NULL;
}

/* Reads Appended events from s through seq `last` (0: until the stream
 * ends), their seqs following on from *next without gap; the result of
 * the last read. */
static int read_appended(histd_client_stream *s, uint64_t *next,
			 uint64_t last)
{
	int res = HISTD_STREAM_MESSAGE;
	while (last == 0 || *next <= last) {
		Histd__V1__HistoryEvent *ev = t_next_event(s, 30000, &res);
		if (!ev)
			break;
		assert_int_equal(ev->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		for (size_t i = 0; i < ev->appended->n_messages; i++)
			assert_int_equal(ev->appended->messages[i]->seq,
					 (*next)++);
		histd_client_message_free(&ev->base);
	}
	return res;
}

static void stalled_subscriber_is_ended_and_nobody_else_waits(void **state)
{
	(void)state;
	histd_client *writer = harness_client(server);
	/* The stalled subscriber has its own channel, as a separate process
	 * would. */
	histd_client *stalled_client = harness_client(server);
	histd_client *reading_client = harness_client(server);
	char *id = t_create_session(writer, "slow-1");

	histd_client_stream *stalled = t_subscribe(stalled_client, id, 0);
	reader r = { .s = t_subscribe(reading_client, id, 0),
		     .want_last = N_APPENDS, .next = 1 };
	assert_int_equal(pthread_create(&r.thread, NULL, reader_main, &r), 0);

	/* One 4 KiB message per append. */
	tarena *a = ta_new();
	char *text = ta_alloc(a, MESSAGE_BYTES + 1);
	memset(text, 'm', MESSAGE_BYTES);
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER, text);
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 1;
	req.messages = &m;
	int64_t worst = 0, t_start = t_now_ms();
	histd_status st;
	histd_status_init(&st);
	/* No assertion while the reader runs: it would leave r behind. */
	int failed_at = -1;
	for (int i = 0; i < N_APPENDS; i++) {
		Histd__V1__AppendResponse *resp = NULL;
		int64_t t0 = t_now_ms();
		t_call(writer, "Append", &req,
		       &histd__v1__append_response__descriptor, &resp, &st);
		int64_t took = t_now_ms() - t0;
		worst = took > worst ? took : worst;
		if (st.code != GRPC_STATUS_OK || resp->last_seq != (uint64_t)i + 1) {
			t_print_status("append failed", &st);
			failed_at = i;
		}
		if (resp)
			histd_client_message_free(&resp->base);
		histd_status_reset(&st);
		if (failed_at >= 0)
			break;
		/* Pace on the reader, never on the stalled subscriber. */
		int64_t give_up = t_now_ms() + 30000;
		while (r.next + READER_LAG <= (uint64_t)i + 1 && !r.ended &&
		       !r.timed_out && t_now_ms() < give_up) {
			struct timespec ts = { 0, 50 * 1000 };
			nanosleep(&ts, NULL);
		}
	}
	fprintf(stderr, "%d appends in %lld ms, slowest %lld ms\n", N_APPENDS,
		(long long)(t_now_ms() - t_start), (long long)worst);
	pthread_join(r.thread, NULL);
	assert_int_equal(failed_at, -1);
	/* No append waited on the stalled subscriber (the time includes the
	 * pacing on the reader). */
	assert_true(worst < 5000);

	/* The reading subscriber got every message, in order. */
	if (r.ended)
		t_print_status("reading subscriber ended",
			       histd_client_stream_status(r.s));
	assert_false(r.ended);
	assert_false(r.timed_out);
	assert_false(r.gap);
	assert_int_equal(r.next, N_APPENDS + 1);

	/* The stalled one: whatever the transport had buffered, in order from
	 * seq 1, then RESOURCE_EXHAUSTED saying where to resume. */
	uint64_t next = 1;
	assert_int_equal(read_appended(stalled, &next, 0), HISTD_STREAM_END);
	const histd_status *fin = histd_client_stream_status(stalled);
	assert_status(fin, GRPC_STATUS_RESOURCE_EXHAUSTED);
	const char *resume = histd_status_trailer(fin, "histd-resume-after-seq");
	if (!resume)
		t_print_status("no histd-resume-after-seq", fin);
	assert_non_null(resume);
	uint64_t resume_after = strtoull(resume, NULL, 10);
	fprintf(stderr, "stalled subscriber got %llu messages, resume after %llu\n",
		(unsigned long long)(next - 1), (unsigned long long)resume_after);
	/* It really fell behind, and the trailer names what it got. */
	assert_true(resume_after < N_APPENDS);
	assert_int_equal(resume_after, next - 1);

	/* Resuming there gives the rest, without gap. */
	histd_client_stream *again = t_subscribe(stalled_client, id, resume_after);
	assert_int_equal(read_appended(again, &next, N_APPENDS),
			 HISTD_STREAM_MESSAGE);

	histd_client_stream_close(again);
	histd_client_stream_close(stalled);
	histd_client_stream_close(r.s);
	histd_client_close(reading_client);
	histd_client_close(stalled_client);
	histd_client_close(writer);
	free(id);
	ta_free(a);
}

/* What a client that mirrors a session holds, built from its events. */
#define MIRROR_SEQS 256
typedef struct mirror {
	uint8_t have[MIRROR_SEQS];
} mirror;

static void mirror_apply(mirror *m, const Histd__V1__HistoryEvent *ev)
{
	Histd__V1__Message **ms = NULL;
	size_t n = 0;

	switch (ev->event_case) {
	case HISTD__V1__HISTORY_EVENT__EVENT_APPENDED:
		ms = ev->appended->messages;
		n = ev->appended->n_messages;
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_REPLACED:
		memset(m->have, 0, sizeof(m->have));
		ms = ev->replaced->messages;
		n = ev->replaced->n_messages;
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_CLEARED:
		/* No system messages here: everything up to it went. */
		for (uint64_t q = 0; q <= ev->cleared->cleared_to_seq &&
				     q < MIRROR_SEQS; q++)
			m->have[q] = 0;
		break;
	default:
		break;
	}
	for (size_t i = 0; i < n; i++) {
		assert_true(ms[i]->seq < MIRROR_SEQS);
		m->have[ms[i]->seq] = 1;
	}
}

/* Retention (the window's retention=delete) truncates after each append; a
 * subscriber ended as too slow with some of those `cleared` events still
 * queued must learn, when it resumes from histd-resume-after-seq, that
 * the messages are gone (the replay is then a `replaced` event): resuming
 * after the last seq it received, it would keep them for good once
 * retention stops below that seq. */
static void resume_after_missed_truncates_drops_what_they_removed(void **state)
{
	(void)state;
	static const char *const flags[] = {
		"--subscriber-queue", "4", "--subscriber-end-grace", "600",
		"--default-pipeline", "window:max_messages=60,retention=delete",
		NULL };
	histd_proc *p = NULL;
	assert_int_equal(harness_start(&p, flags), 0);
	histd_client *writer = harness_client(p);
	histd_client *stalled_client = harness_client(p);
	char *id = t_create_session(writer, "slow-truncate");
	assert_int_equal(t_append_texts(writer, id, 100, "small", 0, NULL),
			 GRPC_STATUS_OK);

	/* Replays seqs 41-100 (retention removed 1-40), then stalls. */
	histd_client_stream *stalled = t_subscribe(stalled_client, id, 0);
	tarena *a = ta_new();
	char *text = ta_alloc(a, 400000 + 1);
	memset(text, 'm', 400000);
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER, text);
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 1;
	req.messages = &m;
	histd_status st;
	histd_status_init(&st);
	for (int i = 0; i < 40; i++) {
		Histd__V1__AppendResponse *resp = NULL;
		t_call(writer, "Append", &req,
		       &histd__v1__append_response__descriptor, &resp, &st);
		assert_status(&st, GRPC_STATUS_OK);
		histd_client_message_free(&resp->base);
		histd_status_reset(&st);
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	/* Retention settles at 81-140. */
	int64_t give_up = t_now_ms() + 20000;
	uint64_t first = 0;
	while (first != 81 && t_now_ms() < give_up) {
		Histd__V1__Session *s = t_get_session(writer, id);
		first = s->stats->first_seq;
		histd_client_message_free(&s->base);
	}
	assert_int_equal(first, 81);

	mirror mr = { { 0 } };
	int res;
	Histd__V1__HistoryEvent *ev;
	while ((ev = t_next_event(stalled, 30000, &res))) {
		mirror_apply(&mr, ev);
		histd_client_message_free(&ev->base);
	}
	assert_int_equal(res, HISTD_STREAM_END);
	const histd_status *fin = histd_client_stream_status(stalled);
	assert_status(fin, GRPC_STATUS_RESOURCE_EXHAUSTED);
	const char *resume = histd_status_trailer(fin, "histd-resume-after-seq");
	assert_non_null(resume);
	uint64_t resume_after = strtoull(resume, NULL, 10);
	fprintf(stderr, "stalled subscriber ended, resume after %llu\n",
		(unsigned long long)resume_after);

	/* Resumed, the mirror holds exactly what the server stores. */
	histd_client_stream *again = t_subscribe(stalled_client, id,
						 resume_after);
	while (!mr.have[140]) {
		ev = t_next_event(again, 30000, &res);
		assert_int_equal(res, HISTD_STREAM_MESSAGE);
		mirror_apply(&mr, ev);
		histd_client_message_free(&ev->base);
	}
	for (uint64_t q = 1; q < MIRROR_SEQS; q++)
		if (mr.have[q] != (q >= 81 && q <= 140))
			fail_msg("the mirror %s seq %llu", mr.have[q] ?
				 "still holds" : "lacks", (unsigned long long)q);

	histd_client_stream_close(again);
	histd_client_stream_close(stalled);
	histd_client_close(stalled_client);
	histd_client_close(writer);
	free(id);
	ta_free(a);
	assert_int_equal(harness_stop(p), 0);
}

/* Whether a new stream of session id gets in: it must see the append
 * made after it subscribed. */
static int admitted(histd_client *writer, histd_client *c, const char *id,
		    uint64_t after_seq, histd_client_stream **out)
{
	histd_client_stream *s = t_subscribe(c, id, after_seq);
	assert_int_equal(t_append_texts(writer, id, 1, "probe", 0, NULL),
			 GRPC_STATUS_OK);
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, 30000, &res);
	if (ev) {
		histd_client_message_free(&ev->base);
		*out = s;
		return 1;
	}
	assert_int_equal(res, HISTD_STREAM_END);
	const histd_status *st = histd_client_stream_status(s);
	assert_status(st, GRPC_STATUS_RESOURCE_EXHAUSTED);
	assert_non_null(strstr(st->details, "this session"));
	histd_client_stream_close(s);
	return 0;
}

/*
 * With one stream per session allowed: a client that subscribes and then
 * reads nothing is ended as too slow once appends overflow its queue, and
 * from then on another stream of the session gets in. After
 * --subscriber-end-grace its stream is cancelled: reading at last, the
 * client gets what its transport had taken, in order, then
 * RESOURCE_EXHAUSTED naming the after_seq to resume from, which gives the
 * rest without gap.
 */
static void stalled_subscriber_gives_its_place_and_is_cancelled_after_the_grace(void **state)
{
	(void)state;
	static const char *const flags[] = {
		"--subscriber-queue", "8", "--max-subscribers-per-session", "1",
		"--subscriber-end-grace", "1", NULL };
	histd_proc *p = NULL;
	assert_int_equal(harness_start(&p, flags), 0);
	histd_client *writer = harness_client(p);
	histd_client *stalled_client = harness_client(p);
	histd_client *other_client = harness_client(p);
	char *id = t_create_session(writer, "slow-grace");
	histd_client_stream *stalled = t_subscribe(stalled_client, id, 0);

	/* 10 messages of 4 KiB per Append; after each 20, try another
	 * stream. */
	tarena *a = ta_new();
	char *text = ta_alloc(a, MESSAGE_BYTES + 1);
	memset(text, 'm', MESSAGE_BYTES);
	Histd__V1__Message *m[10];
	for (size_t i = 0; i < 10; i++)
		m[i] = tm_text(a, HISTD__V1__ROLE__ROLE_USER, text);
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = id;
	req.n_messages = 10;
	req.messages = m;
	histd_status st;
	histd_status_init(&st);
	histd_client_stream *other = NULL;
	uint64_t last = 0;
	for (int round = 0; round < 50 && !other; round++) {
		for (int i = 0; i < 20; i++) {
			Histd__V1__AppendResponse *resp = NULL;
			t_call(writer, "Append", &req,
			       &histd__v1__append_response__descriptor, &resp,
			       &st);
			assert_status(&st, GRPC_STATUS_OK);
			last = resp->last_seq;
			histd_client_message_free(&resp->base);
			histd_status_reset(&st);
		}
		/* The probe appends one message either way. */
		admitted(writer, other_client, id, last, &other);
		last++;
	}
	fprintf(stderr, "another stream got in after %llu messages\n",
		(unsigned long long)last);
	assert_non_null(other);
	histd_client_stream_close(other);

	/* The grace (1 s) and the hub's next look (1 s more at most). */
	struct timespec ts = { 3, 0 };
	nanosleep(&ts, NULL);
	uint64_t next = 1;
	assert_int_equal(read_appended(stalled, &next, 0), HISTD_STREAM_END);
	const histd_status *fin = histd_client_stream_status(stalled);
	t_print_status("stalled subscriber", fin);
	assert_status(fin, GRPC_STATUS_RESOURCE_EXHAUSTED);
	assert_null(histd_status_trailer(fin, "histd-resume-after-seq"));
	const char *at = strstr(fin->details, "subscribe again with after_seq ");
	assert_non_null(at);
	uint64_t resume_after = strtoull(at + strlen("subscribe again with "
						     "after_seq "), NULL, 10);
	fprintf(stderr, "it got %llu messages\n", (unsigned long long)(next - 1));
	/* What it got is what it may skip: no gap, no repeat. */
	assert_true(resume_after < last);
	assert_int_equal(resume_after, next - 1);

	/* Resuming there gives the rest, without gap. */
	next = resume_after + 1;
	histd_client_stream *again = t_subscribe(stalled_client, id,
						 resume_after);
	assert_int_equal(read_appended(again, &next, last),
			 HISTD_STREAM_MESSAGE);

	histd_client_stream_close(again);
	histd_client_stream_close(stalled);
	histd_client_close(other_client);
	histd_client_close(stalled_client);
	histd_client_close(writer);
	free(id);
	ta_free(a);
	assert_int_equal(harness_stop(p), 0);
}

int main(int argc, char **argv)
{
	if (harness_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(stalled_subscriber_is_ended_and_nobody_else_waits),
		cmocka_unit_test(resume_after_missed_truncates_drops_what_they_removed),
		cmocka_unit_test(stalled_subscriber_gives_its_place_and_is_cancelled_after_the_grace),
		cmocka_unit_test(sigterm_stops_the_server_with_exit_status_0),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
