/*
 * Subscribe over a real channel: replay then live without gap or duplicate
 * under concurrent appends, the Replaced replay after a Clear, every kind
 * of live event, cancellation by the client, many subscribers, deadlines.
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

static histd_proc *server;
static histd_client *client;

static int setup(void **state)
{
	(void)state;
	if (harness_start(&server, NULL))
		return -1;
	client = harness_client(server);
	return 0;
}

/* Normally the last test has stopped the server already. */
static int teardown(void **state)
{
	(void)state;
	histd_client_close(client);
	client = NULL;
	int rc = harness_stop(server);
	server = NULL;
	return rc;
}

static void sigterm_stops_the_server_with_exit_status_0(void **state)
{
	(void)state;
	histd_client_close(client);
	client = NULL;
	histd_proc *p = server;
	server = NULL;
	assert_int_equal(harness_stop(p), 0);
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Reads events until the appended seqs reach last_seq, checking that they
 * continue *next without gap or duplicate and that revisions never go back
 * (the events of one replay share the snapshot's revision; live events
 * grow it). Fails on any other event or on 20 s of silence. */
static void read_appended_until(histd_client_stream *s, uint64_t *next,
				uint64_t last_seq, uint64_t *revision)
{
	while (*next <= last_seq) {
		int res;
		Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
		if (res != HISTD_STREAM_MESSAGE) {
			fprintf(stderr, "stream %s waiting for seq %llu\n",
				res == HISTD_STREAM_TIMEOUT ? "timed out" : "ended",
				(unsigned long long)*next);
			if (res == HISTD_STREAM_END)
				t_print_status("stream status",
					       histd_client_stream_status(s));
		}
		assert_int_equal(res, HISTD_STREAM_MESSAGE);
		assert_int_equal(ev->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		assert_true(ev->revision >= *revision);
		*revision = ev->revision;
		assert_true(ev->appended->n_messages > 0);
		for (size_t i = 0; i < ev->appended->n_messages; i++) {
			if (ev->appended->messages[i]->seq != *next)
				fprintf(stderr, "expected seq %llu, got %llu\n",
					(unsigned long long)*next,
					(unsigned long long)ev->appended->messages[i]->seq);
			assert_int_equal(ev->appended->messages[i]->seq, *next);
			(*next)++;
		}
		histd_client_message_free(&ev->base);
	}
}

/* Asserts that nothing arrives within ms. */
static void expect_silence(histd_client_stream *s, int ms)
{
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, ms, &res);
	if (ev) {
		fprintf(stderr, "unexpected event, revision %llu\n",
			(unsigned long long)ev->revision);
		histd_client_message_free(&ev->base);
	}
	assert_int_equal(res, HISTD_STREAM_TIMEOUT);
}

/* ------------------------------------------------------------------------
 * An appender thread: batches of 1..3 messages, no cmocka asserts (they
 * must run on the test's thread); failures are counted. */

typedef struct appender {
	pthread_t thread;
	histd_client *client;
	const char *session_id;
	int batches;
	int delay_every;          /* sleep 1 ms every this many batches */
	_Atomic uint64_t appended;  /* messages acknowledged */
	_Atomic int failures;
} appender;

static void *appender_main(void *arg)
{
	appender *ap = arg;
	for (int i = 0; i < ap->batches; i++) {
		size_t n = 1 + (size_t)(i % 3);
		char prefix[32];
		snprintf(prefix, sizeof(prefix), "batch %d", i);
		if (t_append_texts(ap->client, ap->session_id, n, prefix, 0,
				   NULL) == GRPC_STATUS_OK)
			ap->appended += n;
		else
			ap->failures++;
		if (ap->delay_every && i % ap->delay_every == 0)
			sleep_ms(1);
	}
	return NULL;
}

/* ------------------------------------------------------------------------ */

static void replay_then_live_has_no_gap_or_duplicate_under_concurrent_appends(void **state)
{
	(void)state;
	char *id = t_create_session(client, "replay-live");
	for (int i = 0; i < 10; i++)
		assert_int_equal(t_append_texts(client, id, 10, "before", 0,
						NULL),
				 GRPC_STATUS_OK);

	/* Appends race with the subscribe: some land in the replay, some
	 * arrive live, some while the server is switching between them. */
	/* Static: a failed assertion leaves this frame while the thread
	 * still runs. */
	static appender ap;
	ap = (appender){ .client = client, .session_id = id, .batches = 300,
			 .delay_every = 10 };
	assert_int_equal(pthread_create(&ap.thread, NULL, appender_main, &ap),
			 0);
	sleep_ms(5);
	histd_client_stream *s = t_subscribe(client, id, 50);
	uint64_t next = 51, revision = 0;
	/* Read while the appender runs, then the rest. */
	read_appended_until(s, &next, 150, &revision);
	pthread_join(ap.thread, NULL);
	assert_int_equal(ap.failures, 0);
	uint64_t last = 100 + ap.appended;
	read_appended_until(s, &next, last, &revision);
	assert_int_equal(next, last + 1);
	expect_silence(s, 300);

	/* A second subscriber from the middle sees the same history. */
	histd_client_stream *s2 = t_subscribe(client, id, 120);
	uint64_t next2 = 121, rev2 = 0;
	read_appended_until(s2, &next2, last, &rev2);
	assert_int_equal(rev2, revision);
	expect_silence(s2, 200);
	histd_client_stream_close(s2);
	histd_client_stream_close(s);
	free(id);
}

static void replay_after_clear_is_one_replaced_event(void **state)
{
	(void)state;
	char *id = t_create_session(client, "replay-clear");
	assert_int_equal(t_append_texts(client, id, 5, "old", 0, NULL),
			 GRPC_STATUS_OK);
	Histd__V1__ClearRequest cl = HISTD__V1__CLEAR_REQUEST__INIT;
	cl.session_id = id;
	Histd__V1__ClearResponse *cr = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(client, "Clear", &cl, &histd__v1__clear_response__descriptor,
	       &cr, &st);
	assert_status(&st, GRPC_STATUS_OK);
	assert_int_equal(cr->cleared_to_seq, 5);
	histd_client_message_free(&cr->base);
	Histd__V1__AppendResponse *ar = NULL;
	assert_int_equal(t_append_texts(client, id, 2, "new", 0, &ar),
			 GRPC_STATUS_OK);
	uint64_t rev = ar->revision;
	histd_client_message_free(&ar->base);

	/* The subscriber last saw seq 3, which the Clear removed; or seq 5,
	 * the last one it removed: both learn that they are gone. */
	histd_client_stream *s = NULL;
	int res;
	for (uint64_t after = 3; after <= 5; after += 2) {
		if (s)
			histd_client_stream_close(s);
		s = t_subscribe(client, id, after);
		Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
		assert_int_equal(res, HISTD_STREAM_MESSAGE);
		assert_int_equal(ev->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
		assert_int_equal(ev->revision, rev);
		assert_int_equal(ev->replaced->cleared_to_seq, 5);
		assert_int_equal(ev->replaced->n_messages, 2);
		assert_int_equal(ev->replaced->messages[0]->seq, 6);
		assert_int_equal(ev->replaced->messages[1]->seq, 7);
		assert_string_equal(tm_first_text(ev->replaced->messages[0]),
				    "new 0");
		histd_client_message_free(&ev->base);
	}

	/* Then live, from seq 8. */
	assert_int_equal(t_append_texts(client, id, 1, "live", 0, NULL),
			 GRPC_STATUS_OK);
	uint64_t next = 8;
	read_appended_until(s, &next, 8, &rev);
	expect_silence(s, 200);
	histd_client_stream_close(s);
	histd_status_reset(&st);
	free(id);
}

/* Appends n user messages of `bytes` characters each, `per` in each
 * Append. */
static void append_big(const char *id, size_t n, size_t per, size_t bytes)
{
	char *text = malloc(bytes + 1);
	assert_non_null(text);
	memset(text, 'x', bytes);
	text[bytes] = '\0';
	for (size_t i = 0; i < n; i += per) {
		tarena *a = ta_new();
		Histd__V1__AppendRequest rq = HISTD__V1__APPEND_REQUEST__INIT;
		Histd__V1__AppendResponse *ar = NULL;
		Histd__V1__Message **ms = ta_alloc(a, per * sizeof(*ms));
		for (size_t k = 0; k < per; k++)
			ms[k] = tm_text(a, HISTD__V1__ROLE__ROLE_USER, text);
		histd_status st;
		histd_status_init(&st);
		rq.session_id = (char *)id;
		rq.n_messages = per;
		rq.messages = ms;
		t_call(client, "Append", &rq,
		       &histd__v1__append_response__descriptor, &ar, &st);
		assert_status(&st, GRPC_STATUS_OK);
		histd_client_message_free(&ar->base);
		histd_status_reset(&st);
		ta_free(a);
	}
	free(text);
}

/* A client with gRPC's default receive limit (4 MiB) reads a replay of
 * 64 messages of 100 KB (6.4 MB, which GetMessages pages), after a Clear
 * too: no replay event is larger than a GetMessages page. The Replaced
 * event comes first; the messages that do not fit it follow as appended
 * events at the same revision. */
static void replay_of_big_messages_fits_a_default_client(void **state)
{
	(void)state;
	histd_client *plain = NULL;
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	assert_int_equal(histd_client_open_ex(server->target, &opt,
					      &plain), 0);
	char *id = t_create_session(client, "replay-big");
	append_big(id, 64, 1, 100000);

	for (int cleared = 0; cleared <= 1; cleared++) {
		uint64_t first = cleared ? 65 : 1, next = first, revision = 0;
		if (cleared) {
			Histd__V1__ClearRequest cl = HISTD__V1__CLEAR_REQUEST__INIT;
			Histd__V1__ClearResponse *cr = NULL;
			histd_status st;
			histd_status_init(&st);
			cl.session_id = id;
			t_call(client, "Clear", &cl,
			       &histd__v1__clear_response__descriptor, &cr, &st);
			assert_status(&st, GRPC_STATUS_OK);
			histd_client_message_free(&cr->base);
			histd_status_reset(&st);
			append_big(id, 64, 1, 100000);
		}
		histd_client_stream *s = t_subscribe(plain, id, 0);
		int res, events = 0;
		while (next < first + 64) {
			Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
			if (!ev && res == HISTD_STREAM_END)
				t_print_status("stream status",
					       histd_client_stream_status(s));
			assert_int_equal(res, HISTD_STREAM_MESSAGE);
			Histd__V1__Message **ms;
			size_t n;
			if (cleared && events == 0) {
				assert_int_equal(ev->event_case,
						 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
				assert_int_equal(ev->replaced->cleared_to_seq, 64);
				ms = ev->replaced->messages;
				n = ev->replaced->n_messages;
			} else {
				assert_int_equal(ev->event_case,
						 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
				ms = ev->appended->messages;
				n = ev->appended->n_messages;
			}
			assert_true(n > 0);
			assert_true(revision == 0 || ev->revision == revision);
			revision = ev->revision;
			for (size_t i = 0; i < n; i++)
				assert_int_equal(ms[i]->seq, next++);
			histd_client_message_free(&ev->base);
			events++;
		}
		assert_true(events > 1);
		expect_silence(s, 200);
		histd_client_stream_close(s);
	}
	histd_client_close(plain);
	free(id);
}

/* One Append just under the request limit (1,000 messages of 4,170
 * bytes) makes an event a little larger, with each message's seq, time and
 * estimate: a live subscriber with gRPC's default 4 MiB receive limit gets
 * it as several appended events at its revision. */
static void big_append_reaches_a_default_client_live(void **state)
{
	(void)state;
	histd_client *plain = NULL;
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	assert_int_equal(histd_client_open_ex(server->target, &opt, &plain), 0);
	char *id = t_create_session(client, "live-big");
	histd_client_stream *s = t_subscribe(plain, id, 0);
	expect_silence(s, 200);
	append_big(id, 1000, 1000, 4170);
	uint64_t next = 1, revision = 0;
	read_appended_until(s, &next, 1000, &revision);
	assert_int_equal(revision, 2);
	expect_silence(s, 200);
	histd_client_stream_close(s);
	histd_client_close(plain);
	free(id);
}

/* The server's resident memory in KiB (VmRSS), 0 if unknown. */
static long server_rss_kib(void)
{
	char path[64], line[256];
	long kib = 0;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)server->pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmRSS: %ld", &kib) == 1)
			break;
	fclose(f);
	return kib;
}

/* Subscribers that replay a 20 MB session and do not read hold a part of
 * the replay each, not a copy of the session: 8 of them cost the server
 * far less than 8 copies (160 MB). Then each reads the whole replay. */
static void stalled_replays_do_not_copy_the_session(void **state)
{
	(void)state;
	enum { N_SUBS = 8, N_MSGS = 2000, MSG_BYTES = 10000 };
	char *id = t_create_session(client, "replay-memory");
	append_big(id, N_MSGS, 100, MSG_BYTES);
	sleep_ms(200);
	long before = server_rss_kib();
	assert_true(before > 0);

	histd_client *subs[N_SUBS];
	histd_client_stream *s[N_SUBS];
	for (int i = 0; i < N_SUBS; i++) {
		subs[i] = harness_client(server);
		s[i] = t_subscribe(subs[i], id, 0);
	}
	sleep_ms(1000);
	long grew = server_rss_kib() - before;
	fprintf(stderr, "%d stalled replays of %d MB: +%ld KiB\n", N_SUBS,
		N_MSGS * MSG_BYTES / 1000000, grew);
	assert_true(grew < (long)N_SUBS * N_MSGS * MSG_BYTES / 1024 / 4);

	for (int i = 0; i < N_SUBS; i++) {
		uint64_t next = 1, revision = 0;
		read_appended_until(s[i], &next, N_MSGS, &revision);
		expect_silence(s[i], 100);
		histd_client_stream_close(s[i]);
		histd_client_close(subs[i]);
	}
	free(id);
}

/* A Replace leaves the subscriber that saw every old message (after_seq
 * equal to cleared_to_seq) one Replaced event, not the new messages as
 * appended to the old. */
static void resume_at_the_last_replaced_seq_gets_the_replaced_event(void **state)
{
	(void)state;
	char *id = t_create_session(client, "resume-replace");
	assert_int_equal(t_append_texts(client, id, 3, "old", 0, NULL),
			 GRPC_STATUS_OK);
	tarena *a = ta_new();
	Histd__V1__ReplaceRequest rq = HISTD__V1__REPLACE_REQUEST__INIT;
	Histd__V1__ReplaceResponse *rr = NULL;
	histd_status st;
	histd_status_init(&st);
	rq.session_id = id;
	rq.n_messages = 1;
	rq.messages = tm_texts(a, 1, "x");
	t_call(client, "Replace", &rq, &histd__v1__replace_response__descriptor,
	       &rr, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(&rr->base);

	histd_client_stream *s = t_subscribe(client, id, 3);
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
	assert_int_equal(res, HISTD_STREAM_MESSAGE);
	assert_int_equal(ev->event_case,
			 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
	assert_int_equal(ev->replaced->cleared_to_seq, 3);
	assert_int_equal(ev->replaced->n_messages, 1);
	assert_int_equal(ev->replaced->messages[0]->seq, 4);
	histd_client_message_free(&ev->base);
	histd_client_stream_close(s);

	/* Having seen seq 4, the new message: nothing to replay. */
	s = t_subscribe(client, id, 4);
	expect_silence(s, 200);
	histd_client_stream_close(s);
	histd_status_reset(&st);
	ta_free(a);
	free(id);
}

/* Seqs are never reused, so an after_seq past the last one belongs to
 * another session (one deleted and created again under the id): the
 * stream ends at once, rather than deliver seqs the caller thinks it has. */
static void subscribe_past_the_last_seq_is_invalid(void **state)
{
	(void)state;
	char *id = t_create_session(client, "past-the-end");
	assert_int_equal(t_append_texts(client, id, 1, "one", 0, NULL),
			 GRPC_STATUS_OK);
	histd_client_stream *s = t_subscribe(client, id, 100);
	int res;
	assert_null(t_next_event(s, 20000, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	assert_status(histd_client_stream_status(s),
		      GRPC_STATUS_INVALID_ARGUMENT);
	assert_non_null(strstr(histd_client_stream_status(s)->details,
			       "after_seq 100 is past the session's last seq 1"));
	histd_client_stream_close(s);
	free(id);
}

static void every_kind_of_change_arrives_live_in_revision_order(void **state)
{
	(void)state;
	tarena *a = ta_new();
	histd_status st;
	histd_status_init(&st);
	char *id = t_create_session(client, "live-kinds");
	histd_client_stream *s = t_subscribe(client, id, 0);
	/* Nothing yet: no replay for an empty session. */
	expect_silence(s, 200);

	assert_int_equal(t_append_texts(client, id, 2, "a", 0, NULL),
			 GRPC_STATUS_OK);                        /* rev 2 */
	Histd__V1__ClearRequest cl = HISTD__V1__CLEAR_REQUEST__INIT;
	cl.session_id = id;
	ProtobufCMessage *resp = NULL;
	t_call(client, "Clear", &cl, &histd__v1__clear_response__descriptor,
	       &resp, &st);                                      /* rev 3 */
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);
	Histd__V1__ReplaceRequest rp = HISTD__V1__REPLACE_REQUEST__INIT;
	rp.session_id = id;
	rp.n_messages = 1;
	rp.messages = tm_texts(a, 1, "restored");
	t_call(client, "Replace", &rp, &histd__v1__replace_response__descriptor,
	       &resp, &st);                                      /* rev 4 */
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);
	Histd__V1__UpdateSessionRequest u =
		HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	u.session_id = id;
	Histd__V1__UpdateSessionRequest__LabelsEntry *lb[1] = {
		tm_entry(a, &histd__v1__update_session_request__labels_entry__descriptor,
			 "phase", "done") };
	u.n_labels = 1;
	u.labels = lb;
	char *paths[1] = { "labels" };
	Google__Protobuf__FieldMask mask = GOOGLE__PROTOBUF__FIELD_MASK__INIT;
	mask.n_paths = 1;
	mask.paths = paths;
	u.update_mask = &mask;
	t_call(client, "UpdateSession", &u, &histd__v1__session__descriptor,
	       &resp, &st);                                      /* rev 5 */
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);
	Histd__V1__DeleteSessionRequest d =
		HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	d.session_id = id;
	t_call(client, "DeleteSession", &d,
	       &histd__v1__delete_session_response__descriptor, &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free(resp);

	static const Histd__V1__HistoryEvent__EventCase want[] = {
		HISTD__V1__HISTORY_EVENT__EVENT_APPENDED,
		HISTD__V1__HISTORY_EVENT__EVENT_CLEARED,
		HISTD__V1__HISTORY_EVENT__EVENT_REPLACED,
		HISTD__V1__HISTORY_EVENT__EVENT_UPDATED,
		HISTD__V1__HISTORY_EVENT__EVENT_DELETED,
	};
	uint64_t last_rev = 1;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		int res;
		Histd__V1__HistoryEvent *ev = t_next_event(s, 20000, &res);
		assert_int_equal(res, HISTD_STREAM_MESSAGE);
		assert_int_equal(ev->event_case, want[i]);
		assert_string_equal(ev->session_id, id);
		assert_true(ev->revision > last_rev);
		last_rev = ev->revision;
		switch (ev->event_case) {
		case HISTD__V1__HISTORY_EVENT__EVENT_APPENDED:
			assert_int_equal(ev->appended->n_messages, 2);
			break;
		case HISTD__V1__HISTORY_EVENT__EVENT_CLEARED:
			assert_int_equal(ev->cleared->cleared_to_seq, 2);
			break;
		case HISTD__V1__HISTORY_EVENT__EVENT_REPLACED:
			assert_int_equal(ev->replaced->n_messages, 1);
			assert_int_equal(ev->replaced->messages[0]->seq, 3);
			assert_string_equal(
				tm_first_text(ev->replaced->messages[0]),
				"restored 0");
			break;
		case HISTD__V1__HISTORY_EVENT__EVENT_UPDATED:
			assert_non_null(ev->updated->session);
			assert_int_equal(ev->updated->session->n_labels, 1);
			assert_string_equal(
				ev->updated->session->labels[0]->value, "done");
			break;
		default:
			break;
		}
		histd_client_message_free(&ev->base);
	}
	/* After the Deleted event the stream ends with OK. */
	int res;
	assert_null(t_next_event(s, 20000, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	assert_status(histd_client_stream_status(s), GRPC_STATUS_OK);
	histd_client_stream_close(s);
	histd_status_reset(&st);
	free(id);
	ta_free(a);
}

static void events_of_other_sessions_do_not_arrive(void **state)
{
	(void)state;
	char *mine = t_create_session(client, "iso-mine");
	char *other = t_create_session(client, "iso-other");
	histd_client_stream *s = t_subscribe(client, mine, 0);
	assert_int_equal(t_append_texts(client, other, 3, "other", 0, NULL),
			 GRPC_STATUS_OK);
	expect_silence(s, 300);
	assert_int_equal(t_append_texts(client, mine, 1, "mine", 0, NULL),
			 GRPC_STATUS_OK);
	uint64_t next = 1, rev = 0;
	read_appended_until(s, &next, 1, &rev);
	histd_client_stream_close(s);
	free(mine);
	free(other);
}

static void timeout_then_the_stream_goes_on(void **state)
{
	(void)state;
	char *id = t_create_session(client, "quiet");
	histd_client_stream *s = t_subscribe(client, id, 0);
	int64_t t0 = t_now_ms();
	expect_silence(s, 300);
	int64_t waited = t_now_ms() - t0;
	assert_true(waited >= 290);
	assert_true(waited < 5000);
	/* The read that timed out is still posted: nothing is lost. */
	assert_int_equal(t_append_texts(client, id, 1, "after", 0, NULL),
			 GRPC_STATUS_OK);
	uint64_t next = 1, rev = 0;
	read_appended_until(s, &next, 1, &rev);
	histd_client_stream_close(s);
	free(id);
}

typedef struct canceller {
	histd_client_stream *s;
	int after_ms;
} canceller;

static void *canceller_main(void *arg)
{
	canceller *c = arg;
	sleep_ms(c->after_ms);
	histd_client_stream_cancel(c->s);
	return NULL;
}

static void client_cancel_ends_the_stream_and_the_server_keeps_serving(void **state)
{
	(void)state;
	char *id = t_create_session(client, "cancel-1");
	assert_int_equal(t_append_texts(client, id, 3, "x", 0, NULL),
			 GRPC_STATUS_OK);
	histd_client_stream *s = t_subscribe(client, id, 0);
	uint64_t next = 1, rev = 0;
	read_appended_until(s, &next, 3, &rev);

	/* Cancel from another thread while this one waits for an event. */
	canceller c = { .s = s, .after_ms = 200 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, canceller_main, &c), 0);
	int64_t t0 = t_now_ms();
	int res;
	Histd__V1__HistoryEvent *ev = t_next_event(s, 30000, &res);
	int64_t waited = t_now_ms() - t0;
	/* Joined before any check: the thread uses this frame. */
	pthread_join(th, NULL);
	assert_null(ev);
	assert_int_equal(res, HISTD_STREAM_END);
	assert_true(waited < 10000);
	assert_status(histd_client_stream_status(s), GRPC_STATUS_CANCELLED);
	histd_client_stream_close(s);

	/* Several more, cancelled at once, and closed without reading. */
	for (int i = 0; i < 20; i++) {
		histd_client_stream *t = t_subscribe(client, id, 0);
		if (i % 2)
			histd_client_stream_cancel(t);
		histd_client_stream_close(t);
	}

	/* The server goes on: unary calls and a new subscriber work. */
	assert_int_equal(t_append_texts(client, id, 1, "y", 0, NULL),
			 GRPC_STATUS_OK);
	s = t_subscribe(client, id, 2);
	next = 3;
	rev = 0;
	read_appended_until(s, &next, 4, &rev);
	histd_client_stream_close(s);
	free(id);
}

#define N_SUBSCRIBERS 50
#define N_BATCHES 20

static void fifty_subscribers_all_receive_the_same_events(void **state)
{
	(void)state;
	char *id = t_create_session(client, "many-subs");
	histd_client_stream *s[N_SUBSCRIBERS];
	/* Two channels, to have more than one connection in play. */
	histd_client *other = harness_client(server);
	for (int i = 0; i < N_SUBSCRIBERS; i++)
		s[i] = t_subscribe(i % 2 ? other : client, id, 0);
	/* Make sure every subscriber is registered before the appends: the
	 * first event each one sees must be seq 1 either way (replay or
	 * live), so this only spreads the two paths. */
	assert_int_equal(t_append_texts(client, id, 1, "first", 0, NULL),
			 GRPC_STATUS_OK);
	for (int b = 1; b < N_BATCHES; b++)
		assert_int_equal(t_append_texts(client, id, 2, "more", 0, NULL),
				 GRPC_STATUS_OK);
	uint64_t last = 1 + 2 * (N_BATCHES - 1);
	uint64_t final_rev = 0;
	for (int i = 0; i < N_SUBSCRIBERS; i++) {
		uint64_t next = 1, rev = 0;
		read_appended_until(s[i], &next, last, &rev);
		if (i == 0)
			final_rev = rev;
		assert_int_equal(rev, final_rev);
		assert_int_equal(next, last + 1);
	}
	for (int i = 0; i < N_SUBSCRIBERS; i++)
		expect_silence(s[i], 20);
	for (int i = 0; i < N_SUBSCRIBERS; i++)
		histd_client_stream_close(s[i]);
	histd_client_close(other);
	free(id);
}

static void subscribe_with_a_deadline_ends_deadline_exceeded(void **state)
{
	(void)state;
	char *id = t_create_session(client, "deadline-1");
	Histd__V1__SubscribeRequest req = HISTD__V1__SUBSCRIBE_REQUEST__INIT;
	req.session_id = id;
	histd_client_stream *s = NULL;
	assert_int_equal(histd_client_stream_open(client, HISTD_PATH("Subscribe"),
						  &req.base, 300, &s),
			 0);
	int res;
	assert_null(t_next_event(s, 20000, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	assert_status(histd_client_stream_status(s),
		      GRPC_STATUS_DEADLINE_EXCEEDED);
	/* Reading past the end keeps answering END. */
	assert_null(t_next_event(s, 100, &res));
	assert_int_equal(res, HISTD_STREAM_END);
	histd_client_stream_close(s);
	/* And the server serves on. */
	assert_int_equal(t_append_texts(client, id, 1, "z", 0, NULL),
			 GRPC_STATUS_OK);
	free(id);
}

int main(int argc, char **argv)
{
	if (harness_init(argc, argv))
		return 2;
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(replay_then_live_has_no_gap_or_duplicate_under_concurrent_appends),
		cmocka_unit_test(replay_after_clear_is_one_replaced_event),
		cmocka_unit_test(resume_at_the_last_replaced_seq_gets_the_replaced_event),
		cmocka_unit_test(replay_of_big_messages_fits_a_default_client),
		cmocka_unit_test(big_append_reaches_a_default_client_live),
		cmocka_unit_test(stalled_replays_do_not_copy_the_session),
		cmocka_unit_test(subscribe_past_the_last_seq_is_invalid),
		cmocka_unit_test(every_kind_of_change_arrives_live_in_revision_order),
		cmocka_unit_test(events_of_other_sessions_do_not_arrive),
		cmocka_unit_test(timeout_then_the_stream_goes_on),
		cmocka_unit_test(client_cancel_ends_the_stream_and_the_server_keeps_serving),
		cmocka_unit_test(fifty_subscribers_all_receive_the_same_events),
		cmocka_unit_test(subscribe_with_a_deadline_ends_deadline_exceeded),
		cmocka_unit_test(sigterm_stops_the_server_with_exit_status_0),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
