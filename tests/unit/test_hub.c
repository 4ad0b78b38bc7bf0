/*
 * Tests of the Subscribe hub (server/hub.c).
 *
 * The transport is replaced by fake streams that record every event they
 * are asked to send and complete sends on demand: by the test (manual), at
 * once from a completer thread (auto), never (a stalled client), or not at
 * all (send fails). The fakes check the stream contract themselves (one
 * send in flight, nothing after finish, finish at most once) and count
 * violations, since cmocka's asserts only work on the test's thread.
 *
 * The hub delivers events from a dispatcher thread in notify order, so a
 * test that needs "everything notified so far has been delivered" notifies
 * a sentinel session and waits for its event (hub_sync).
 *
 * Outside sanitizer builds malloc is wrapped to count (and fail) the
 * allocations of the test's thread (alloc_hook.h).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"
#include "histd_wire.h"
#include "alloc_hook.h"
#include "hub.h"

#define TENANT "t1"

/* ---------------------------------------------------------------------- */
/* Records and changes                                                     */

/* A stored message record: a packed Message "message <seq>" with its seq
 * in front, as drivers keep them. */
static histd_record
make_msg(uint64_t seq)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *bs[1] = { &b };
	char text[40];
	histd_record r = { 0 };
	uint8_t *buf;
	size_t len, out_len = 0;

	snprintf(text, sizeof(text), "message %llu", (unsigned long long)seq);
	t.text = text;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &t;
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.n_content = 1;
	m.content = bs;
	m.author = "planner";
	len = histd__v1__message__get_packed_size(&m);
	buf = malloc(len);
	assert_non_null(buf);
	histd__v1__message__pack(&m, buf);
	r.data = histd_wire_with_seq(seq, buf, len, &out_len);
	assert_non_null(r.data);
	free(buf);
	r.seq = seq;
	r.token_estimate = 3;
	r.len = (uint32_t)out_len;
	return r;
}

static histd_record *
make_msgs(uint64_t first_seq, size_t n)
{
	histd_record *v = calloc(n ? n : 1, sizeof(*v));
	size_t i;

	assert_non_null(v);
	for (i = 0; i < n; i++)
		v[i] = make_msg(first_seq + i);
	return v;
}

static void
free_msgs(histd_record *v, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		free(v[i].data);
	free(v);
}

static histd_records
records_of(histd_record *v, size_t n)
{
	histd_records r = { .v = v, .n = n, .cap = n };

	return r;
}

/* Notifies an append of n messages first_seq.. at revision rev, made to
 * the session's life `life` (histd_change.incarnation; 0: unknown). */
static void
notify_append_life(histd_hub *h, const char *sid, uint64_t rev,
		   uint64_t first_seq, size_t n, uint64_t life)
{
	histd_record *v = make_msgs(first_seq, n);
	histd_change c = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = sid, .revision = rev, .records = v,
		.n_records = n, .incarnation = life,
	};

	histd_hub_notify(h, &c);
	free_msgs(v, n);
}

static void
notify_append(histd_hub *h, const char *sid, uint64_t rev, uint64_t first_seq,
	      size_t n)
{
	notify_append_life(h, sid, rev, first_seq, n, 0);
}

static void
notify_kind_life(histd_hub *h, const char *sid, enum histd_change_kind kind,
		 uint64_t rev, uint64_t cleared_to_seq, uint64_t life)
{
	histd_change c = {
		.kind = kind, .tenant = TENANT, .session_id = sid,
		.revision = rev, .cleared_to_seq = cleared_to_seq,
		.incarnation = life,
	};

	histd_hub_notify(h, &c);
}

static void
notify_kind(histd_hub *h, const char *sid, enum histd_change_kind kind,
	    uint64_t rev, uint64_t cleared_to_seq)
{
	notify_kind_life(h, sid, kind, rev, cleared_to_seq, 0);
}

static Histd__V1__HistoryEvent *
decode(const histd_event *ev)
{
	Histd__V1__HistoryEvent *e =
		histd__v1__history_event__unpack(NULL, ev->len, ev->data);

	assert_non_null(e);
	return e;
}

/* The text of a decoded message ("message <seq>"). */
static void
assert_msg(const Histd__V1__Message *m, uint64_t seq)
{
	char want[40];

	snprintf(want, sizeof(want), "message %llu", (unsigned long long)seq);
	assert_int_equal(m->seq, seq);
	assert_int_equal(m->role, HISTD__V1__ROLE__ROLE_USER);
	assert_string_equal(m->author, "planner");
	assert_int_equal(m->n_content, 1);
	assert_int_equal(m->content[0]->block_case,
			 HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT);
	assert_string_equal(m->content[0]->text->text, want);
}

/* ---------------------------------------------------------------------- */
/* Fake streams                                                            */

enum fake_mode {
	FAKE_MANUAL,    /* the test completes sends with fake_complete */
	FAKE_AUTO,      /* the completer thread completes every send at once */
	FAKE_FAIL,      /* send refuses to start */
	FAKE_BLOCK,     /* send waits while f->block is set, then as MANUAL */
};

struct fake {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	enum fake_mode mode;
	histd_sub *sub;
	histd_event **evs;      /* every event sent, with a reference */
	size_t n, cap;
	int in_flight;
	int hub_calling;        /* the completer is inside histd_hub_sent */
	int closing;            /* the call is over: sends fail */
	int block;
	int waiting;            /* a send waits for block to clear */
	int violations;
	int fin_calls;
	int fin_err;
	int more_calls;         /* ops.more asked for the next replay part */
	int abort_calls;
	char abort_msg[256];
	uint64_t resume;
	char msg[256];
	struct fake *next_done; /* completer queue */
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct fake *head, *tail;
	int stop;
	pthread_t thread;
} completer;

static void *
completer_main(void *arg)
{
	struct fake *f;

	(void)arg;
	pthread_mutex_lock(&completer.mu);
	for (;;) {
		while (!completer.head && !completer.stop)
			pthread_cond_wait(&completer.cv, &completer.mu);
		if (!completer.head)
			break;
		f = completer.head;
		completer.head = f->next_done;
		if (!completer.head)
			completer.tail = NULL;
		pthread_mutex_unlock(&completer.mu);

		pthread_mutex_lock(&f->mu);
		f->in_flight = 0;
		f->hub_calling++;
		pthread_mutex_unlock(&f->mu);
		histd_hub_sent(f->sub, 1);
		pthread_mutex_lock(&f->mu);
		f->hub_calling--;
		pthread_cond_broadcast(&f->cv);
		pthread_mutex_unlock(&f->mu);

		pthread_mutex_lock(&completer.mu);
	}
	pthread_mutex_unlock(&completer.mu);
	return NULL;
}

static void
completer_push(struct fake *f)
{
	pthread_mutex_lock(&completer.mu);
	f->next_done = NULL;
	if (completer.tail)
		completer.tail->next_done = f;
	else
		completer.head = f;
	completer.tail = f;
	pthread_cond_signal(&completer.cv);
	pthread_mutex_unlock(&completer.mu);
}

static int
fake_send(void *stream, histd_event *ev)
{
	struct fake *f = stream;

	pthread_mutex_lock(&f->mu);
	if (f->in_flight || f->fin_calls)
		f->violations++;
	if (f->mode == FAKE_FAIL || f->closing) {
		pthread_mutex_unlock(&f->mu);
		return -1;
	}
	while (f->block) {
		f->waiting = 1;
		pthread_cond_broadcast(&f->cv);
		pthread_cond_wait(&f->cv, &f->mu);
	}
	f->waiting = 0;
	if (f->n == f->cap) {
		f->cap = f->cap ? f->cap * 2 : 16;
		f->evs = realloc(f->evs, f->cap * sizeof(*f->evs));
	}
	histd_event_ref(ev);
	f->evs[f->n++] = ev;
	f->in_flight = 1;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	if (f->mode == FAKE_AUTO)
		completer_push(f);
	return 0;
}

static void
fake_finish(void *stream, int err, const char *msg, uint64_t resume)
{
	struct fake *f = stream;

	pthread_mutex_lock(&f->mu);
	f->fin_calls++;
	f->fin_err = err;
	f->resume = resume;
	snprintf(f->msg, sizeof(f->msg), "%s", msg ? msg : "");
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static int
fake_more(void *stream)
{
	struct fake *f = stream;

	pthread_mutex_lock(&f->mu);
	f->more_calls++;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return 0;
}

static void
fake_abort(void *stream, const char *msg)
{
	struct fake *f = stream;

	pthread_mutex_lock(&f->mu);
	f->abort_calls++;
	snprintf(f->abort_msg, sizeof(f->abort_msg), "%s", msg);
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static const histd_sub_ops fake_ops = {
	.send = fake_send,
	.finish = fake_finish,
	.more = fake_more,
	.abort = fake_abort,
};

static struct fake *
fake_new(enum fake_mode mode)
{
	struct fake *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	f->mode = mode;
	return f;
}

static void
fake_free(struct fake *f)
{
	size_t i;

	for (i = 0; i < f->n; i++)
		histd_event_unref(f->evs[i]);
	free(f->evs);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

static int
subscribe(histd_hub *h, const char *sid, struct fake *f)
{
	return histd_hub_subscribe(h, TENANT, sid, 0, &fake_ops, f, &f->sub);
}

/* Deadline for waits: generous, the tests are not about speed. */
static void
deadline_in(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

/* Waits until f has been asked to send at least n events; the count. */
static size_t
fake_wait_sent(struct fake *f, size_t n)
{
	struct timespec ts;
	size_t got;

	deadline_in(&ts, 5000);
	pthread_mutex_lock(&f->mu);
	while (f->n < n &&
	       pthread_cond_timedwait(&f->cv, &f->mu, &ts) != ETIMEDOUT)
		;
	got = f->n;
	pthread_mutex_unlock(&f->mu);
	return got;
}

static int
fake_wait_finished(struct fake *f)
{
	struct timespec ts;
	int got;

	deadline_in(&ts, 5000);
	pthread_mutex_lock(&f->mu);
	while (!f->fin_calls &&
	       pthread_cond_timedwait(&f->cv, &f->mu, &ts) != ETIMEDOUT)
		;
	got = f->fin_calls;
	pthread_mutex_unlock(&f->mu);
	return got;
}

/* Waits until a send of f waits on f->block; 1, or 0 on timeout. */
static int
fake_wait_blocked(struct fake *f)
{
	struct timespec ts;
	int got;

	deadline_in(&ts, 5000);
	pthread_mutex_lock(&f->mu);
	while (!f->waiting &&
	       pthread_cond_timedwait(&f->cv, &f->mu, &ts) != ETIMEDOUT)
		;
	got = f->waiting;
	pthread_mutex_unlock(&f->mu);
	return got;
}

/* Lets a blocked send of f go on. */
static void
fake_unblock(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	f->block = 0;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* The transport's histd_hub_sent for a manual fake; 0, or -1 if no send
 * was in flight. */
static int
fake_complete(struct fake *f, int ok)
{
	pthread_mutex_lock(&f->mu);
	if (!f->in_flight) {
		pthread_mutex_unlock(&f->mu);
		return -1;
	}
	f->in_flight = 0;
	pthread_mutex_unlock(&f->mu);
	histd_hub_sent(f->sub, ok);
	return 0;
}

static size_t
fake_count(struct fake *f)
{
	size_t n;

	pthread_mutex_lock(&f->mu);
	n = f->n;
	pthread_mutex_unlock(&f->mu);
	return n;
}

/* Ends the call as the transport does: sends fail from now on; the send in
 * flight completes (failed, for a stalled client); then unsubscribe. */
static void
fake_close(struct fake *f)
{
	pthread_mutex_lock(&f->mu);
	f->closing = 1;
	if (f->mode != FAKE_AUTO && f->in_flight) {
		f->in_flight = 0;
		pthread_mutex_unlock(&f->mu);
		histd_hub_sent(f->sub, 0);
		pthread_mutex_lock(&f->mu);
	}
	while (f->in_flight || f->hub_calling)
		pthread_cond_wait(&f->cv, &f->mu);
	pthread_mutex_unlock(&f->mu);
	histd_hub_unsubscribe(f->sub);
	f->sub = NULL;
}

/* Everything notified before it has been fanned out when it returns: the
 * dispatcher works in notify order and this is the last notify. (A full
 * dispatch queue turns the sentinel away: then it tries again.) */
static void
hub_sync(histd_hub *h)
{
	static int nth;
	struct fake *f;
	char sid[32];
	int tries;

	for (tries = 0; tries < 100; tries++) {
		f = fake_new(FAKE_MANUAL);
		snprintf(sid, sizeof(sid), "sync-%d", ++nth);
		assert_int_equal(subscribe(h, sid, f), 0);
		histd_hub_start(f->sub, NULL, 0, 0);
		notify_kind(h, sid, HISTD_CHANGE_CLEARED, 1, 0);
		if (f->fin_calls) {
			histd_hub_unsubscribe(f->sub);
			fake_free(f);
			usleep(10000);
			continue;
		}
		assert_int_equal(fake_wait_sent(f, 1), 1);
		assert_int_equal(fake_complete(f, 1), 0);
		histd_hub_unsubscribe(f->sub);
		fake_free(f);
		return;
	}
	fail_msg("the hub's dispatch queue never drained");
}

static histd_hub *
hub_new(size_t queue_max, size_t max_subs, size_t max_per_session)
{
	histd_hub_config cfg = {
		.queue_max = queue_max, .max_subscribers = max_subs,
		.max_per_session = max_per_session,
	};
	histd_hub *h = NULL;

	assert_int_equal(histd_hub_new(&h, &cfg), 0);
	return h;
}

static void
assert_contract_kept(struct fake *f)
{
	assert_int_equal(f->violations, 0);
	assert_true(f->fin_calls <= 1);
}

/* ---------------------------------------------------------------------- */
/* Events                                                                  */

static void
event_appended_splices_messages_that_unpack(void **state)
{
	histd_record *v = make_msgs(7, 3);
	histd_change c = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "s1", .revision = 9, .records = v, .n_records = 3,
	};
	int64_t before = histd_now_us() / 1000000;
	histd_event *ev = histd_event_from_change(&c);
	Histd__V1__HistoryEvent *e;
	size_t i;

	(void)state;
	assert_non_null(ev);
	assert_int_equal(ev->refs, 1);
	assert_int_equal(ev->kind, HISTD_CHANGE_APPENDED);
	assert_int_equal(ev->revision, 9);
	assert_int_equal(ev->last_seq, 9);
	e = decode(ev);
	assert_string_equal(e->session_id, "s1");
	assert_int_equal(e->revision, 9);
	assert_non_null(e->time);
	assert_true(e->time->seconds >= before &&
		    e->time->seconds <= before + 5);
	assert_true(e->time->nanos >= 0 && e->time->nanos < 1000000000);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
	assert_int_equal(e->appended->n_messages, 3);
	for (i = 0; i < 3; i++)
		assert_msg(e->appended->messages[i], 7 + i);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
	free_msgs(v, 3);
}

static void
event_cleared_carries_cleared_to_seq(void **state)
{
	histd_change c = {
		.kind = HISTD_CHANGE_CLEARED, .session_id = "s1",
		.revision = 4, .cleared_to_seq = 300,
	};
	histd_event *ev = histd_event_from_change(&c);
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_non_null(ev);
	assert_int_equal(ev->last_seq, 300);
	e = decode(ev);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_CLEARED);
	assert_int_equal(e->cleared->cleared_to_seq, 300);
	assert_int_equal(e->revision, 4);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
}

static void
event_replaced_carries_messages_and_cleared_to_seq(void **state)
{
	histd_record *v = make_msgs(11, 2);
	histd_change c = {
		.kind = HISTD_CHANGE_REPLACED, .session_id = "s1",
		.revision = 5, .cleared_to_seq = 10, .records = v,
		.n_records = 2,
	};
	histd_event *ev = histd_event_from_change(&c);
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_non_null(ev);
	assert_int_equal(ev->last_seq, 12);
	e = decode(ev);
	assert_int_equal(e->event_case,
			 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
	assert_int_equal(e->replaced->cleared_to_seq, 10);
	assert_int_equal(e->replaced->n_messages, 2);
	assert_msg(e->replaced->messages[0], 11);
	assert_msg(e->replaced->messages[1], 12);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
	free_msgs(v, 2);

	/* Replaced by nothing: accounts for every seq up to cleared_to_seq. */
	c.records = NULL;
	c.n_records = 0;
	ev = histd_event_from_change(&c);
	assert_non_null(ev);
	assert_int_equal(ev->last_seq, 10);
	e = decode(ev);
	assert_int_equal(e->event_case,
			 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
	assert_int_equal(e->replaced->n_messages, 0);
	assert_int_equal(e->replaced->cleared_to_seq, 10);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
}

static void
event_reduced_carries_the_summary(void **state)
{
	Histd__V1__Summary s = HISTD__V1__SUMMARY__INIT;
	histd_record r = { 0 };
	histd_change c = {
		.kind = HISTD_CHANGE_SUMMARY, .session_id = "s1",
		.revision = 6, .records = &r, .n_records = 1,
	};
	histd_event *ev;
	Histd__V1__HistoryEvent *e;

	(void)state;
	s.covers_from_seq = 1;
	s.covers_to_seq = 40;
	s.text = "the summary";
	s.model = "m";
	r.len = (uint32_t)histd__v1__summary__get_packed_size(&s);
	r.data = malloc(r.len);
	histd__v1__summary__pack(&s, r.data);
	r.seq = 40;

	ev = histd_event_from_change(&c);
	assert_non_null(ev);
	assert_int_equal(ev->last_seq, 0);
	e = decode(ev);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_REDUCED);
	assert_non_null(e->reduced->summary);
	assert_int_equal(e->reduced->summary->covers_from_seq, 1);
	assert_int_equal(e->reduced->summary->covers_to_seq, 40);
	assert_string_equal(e->reduced->summary->text, "the summary");
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
	free(r.data);
}

static void
event_deleted_is_an_empty_deleted(void **state)
{
	histd_change c = {
		.kind = HISTD_CHANGE_DELETED, .session_id = "s1",
		.revision = 8,
	};
	histd_event *ev = histd_event_from_change(&c);
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_non_null(ev);
	assert_int_equal(ev->kind, HISTD_CHANGE_DELETED);
	e = decode(ev);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_DELETED);
	assert_non_null(e->deleted);
	assert_int_equal(e->revision, 8);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
}

static void
event_updated_carries_the_whole_session(void **state)
{
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT;
	Histd__V1__PluginConfig *pcs[1] = { &pc };
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__SessionConfig cfg = HISTD__V1__SESSION_CONFIG__INIT;
	histd_kv keys[1] = { { "chat", "42" } };
	histd_kv labels[2] = { { "env", "prod" }, { "team", "a" } };
	uint8_t cfg_bytes[64];
	histd_session s = {
		.tenant = TENANT, .id = "s1", .context_keys = keys,
		.n_context_keys = 1, .labels = labels, .n_labels = 2,
		.config = cfg_bytes, .created_at_us = 1700000000123456LL,
		.updated_at_us = -1500000, .revision = 12, .last_seq = 30,
		.cleared_to_seq = 5, .message_count = 25, .token_total = 900,
		.bytes_total = 4000, .first_seq = 6, .summary_count = 2,
	};
	histd_change c = {
		.kind = HISTD_CHANGE_UPDATED, .tenant = TENANT,
		.session_id = "s1", .revision = 12, .session = &s,
	};
	histd_event *ev;
	Histd__V1__HistoryEvent *e;
	Histd__V1__Session *ps;

	(void)state;
	pc.name = "window";
	pl.n_plugins = 1;
	pl.plugins = pcs;
	cfg.pipeline = &pl;
	s.config_len = histd__v1__session_config__get_packed_size(&cfg);
	assert_true(s.config_len <= sizeof(cfg_bytes));
	histd__v1__session_config__pack(&cfg, cfg_bytes);

	ev = histd_event_from_change(&c);
	assert_non_null(ev);
	e = decode(ev);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_UPDATED);
	ps = e->updated->session;
	assert_non_null(ps);
	assert_string_equal(ps->id, "s1");
	assert_int_equal(ps->n_context_keys, 1);
	assert_string_equal(ps->context_keys[0]->key, "chat");
	assert_string_equal(ps->context_keys[0]->value, "42");
	assert_int_equal(ps->n_labels, 2);
	assert_string_equal(ps->labels[1]->key, "team");
	assert_string_equal(ps->labels[1]->value, "a");
	assert_non_null(ps->config);
	assert_non_null(ps->config->pipeline);
	assert_int_equal(ps->config->pipeline->n_plugins, 1);
	assert_string_equal(ps->config->pipeline->plugins[0]->name, "window");
	assert_int_equal(ps->created_at->seconds, 1700000000);
	assert_int_equal(ps->created_at->nanos, 123456000);
	/* Before the epoch: seconds round down, nanos stay positive. */
	assert_int_equal(ps->updated_at->seconds, -2);
	assert_int_equal(ps->updated_at->nanos, 500000000);
	assert_int_equal(ps->revision, 12);
	assert_int_equal(ps->stats->message_count, 25);
	assert_int_equal(ps->stats->token_estimate, 900);
	assert_int_equal(ps->stats->bytes, 4000);
	assert_int_equal(ps->stats->last_seq, 30);
	assert_int_equal(ps->stats->first_seq, 6);
	assert_int_equal(ps->stats->summary_count, 2);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(ev);
}

static void
event_from_change_refuses_a_change_without_its_records(void **state)
{
	histd_change c = { .kind = HISTD_CHANGE_APPENDED, .session_id = "s1",
			   .revision = 2 };

	(void)state;
	assert_null(histd_event_from_change(&c));
	c.kind = HISTD_CHANGE_SUMMARY;
	assert_null(histd_event_from_change(&c));
	c.kind = HISTD_CHANGE_UPDATED;
	assert_null(histd_event_from_change(&c));
	c.kind = HISTD_CHANGE_REPLACED;
	c.n_records = 3;
	assert_null(histd_event_from_change(&c));
}

static void
replay_chunks_messages_in_order(void **state)
{
	histd_record *v = make_msgs(21, 5);
	histd_records r = records_of(v, 5);
	histd_event **evs = NULL;
	size_t n = 0, i, seq = 21;

	(void)state;
	assert_int_equal(histd_event_replay("s1", 30, &r, 0, 0, 2, 0, &evs, &n), 0);
	assert_int_equal(n, 3);
	for (i = 0; i < n; i++) {
		Histd__V1__HistoryEvent *e = decode(evs[i]);
		size_t k;

		assert_int_equal(evs[i]->kind, HISTD_CHANGE_APPENDED);
		assert_int_equal(evs[i]->revision, 30);
		assert_int_equal(e->revision, 30);
		assert_string_equal(e->session_id, "s1");
		assert_int_equal(e->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		assert_int_equal(e->appended->n_messages, i < 2 ? 2 : 1);
		for (k = 0; k < e->appended->n_messages; k++)
			assert_msg(e->appended->messages[k], seq++);
		assert_int_equal(evs[i]->last_seq, seq - 1);
		histd__v1__history_event__free_unpacked(e, NULL);
		histd_event_unref(evs[i]);
	}
	free(evs);
	free_msgs(v, 5);
}

static void
replay_of_nothing_is_no_event_unless_replaced(void **state)
{
	histd_records empty = { 0 };
	histd_event *sentinel = NULL;
	histd_event **evs = &sentinel;
	size_t n = 7;
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_int_equal(histd_event_replay("s1", 3, &empty, 0, 0, 64, 0, &evs,
					    &n), 0);
	assert_int_equal(n, 0);
	assert_null(evs);

	assert_int_equal(histd_event_replay("s1", 3, &empty, 1, 17, 64, 0, &evs,
					    &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(evs[0]->kind, HISTD_CHANGE_REPLACED);
	assert_int_equal(evs[0]->last_seq, 17);
	e = decode(evs[0]);
	assert_int_equal(e->event_case,
			 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
	assert_int_equal(e->replaced->cleared_to_seq, 17);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(evs[0]);
	free(evs);
}

static void
replay_replaced_is_one_event_with_every_message(void **state)
{
	histd_record *v = make_msgs(51, 130);
	histd_records r = records_of(v, 130);
	histd_event **evs = NULL;
	size_t n = 0, i;
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_int_equal(histd_event_replay("s1", 9, &r, 1, 50, 64, 0, &evs, &n),
			 0);
	assert_int_equal(n, 1);
	assert_int_equal(evs[0]->last_seq, 180);
	e = decode(evs[0]);
	assert_int_equal(e->replaced->n_messages, 130);
	assert_int_equal(e->replaced->cleared_to_seq, 50);
	for (i = 0; i < 130; i++)
		assert_msg(e->replaced->messages[i], 51 + i);
	histd__v1__history_event__free_unpacked(e, NULL);
	histd_event_unref(evs[0]);
	free(evs);
	free_msgs(v, 130);
}

/* Events of at most max_bytes (each holds at least one message), in seq
 * order; a replaced replay is the Replaced event, then appended ones, all
 * at the snapshot's revision. */
static void
replay_events_stay_within_max_bytes(void **state)
{
	histd_record *v = make_msgs(51, 130);
	histd_records r = records_of(v, 130);
	histd_event **evs = NULL;
	size_t n = 0, i, k, max_bytes = 1200;
	uint64_t seq;
	int replaced;

	(void)state;
	for (replaced = 0; replaced <= 1; replaced++) {
		assert_int_equal(histd_event_replay("s1", 9, &r, replaced, 50, 64,
						    max_bytes, &evs, &n), 0);
		assert_true(n > 130 * v[0].len / max_bytes);
		for (i = 0, seq = 51; i < n; i++) {
			Histd__V1__HistoryEvent *e = decode(evs[i]);
			Histd__V1__Message **ms;
			size_t nm;

			assert_true(evs[i]->len <= max_bytes);
			assert_int_equal(e->revision, 9);
			if (replaced && i == 0) {
				assert_int_equal(e->event_case,
						 HISTD__V1__HISTORY_EVENT__EVENT_REPLACED);
				assert_int_equal(e->replaced->cleared_to_seq, 50);
				ms = e->replaced->messages;
				nm = e->replaced->n_messages;
			} else {
				assert_int_equal(e->event_case,
						 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
				ms = e->appended->messages;
				nm = e->appended->n_messages;
			}
			assert_true(nm > 0);
			for (k = 0; k < nm; k++)
				assert_msg(ms[k], seq++);
			assert_int_equal(evs[i]->last_seq, seq - 1);
			histd__v1__history_event__free_unpacked(e, NULL);
			histd_event_unref(evs[i]);
		}
		assert_int_equal(seq, 181);
		free(evs);
	}

	/* A bound below one message still sends each message, one per event. */
	assert_int_equal(histd_event_replay("s1", 9, &r, 1, 50, 64, 10, &evs,
					    &n), 0);
	assert_int_equal(n, 130);
	for (i = 0; i < n; i++) {
		assert_int_equal(evs[i]->last_seq, 51 + i);
		histd_event_unref(evs[i]);
	}
	free(evs);
	free_msgs(v, 130);
}

/* ---------------------------------------------------------------------- */
/* The hub                                                                 */

static void
replay_then_live_without_gap_or_duplicate(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 4);
	histd_records r = records_of(v, 4);
	histd_event **replay;
	size_t n_replay, i;
	uint64_t seq = 1;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	/* Live changes land while the transport reads the snapshot. */
	notify_append(h, "s1", 4, 3, 1);
	notify_append(h, "s1", 5, 4, 1);
	notify_append(h, "s1", 6, 5, 1);
	hub_sync(h);
	assert_int_equal(fake_count(f), 0);    /* nothing before start */

	/* The snapshot was read at revision 5: seqs 1..4. */
	assert_int_equal(histd_event_replay("s1", 5, &r, 0, 0, 3, 0, &replay,
					    &n_replay), 0);
	assert_int_equal(n_replay, 2);
	histd_hub_start(f->sub, replay, n_replay, 5);
	free(replay);
	notify_append(h, "s1", 7, 6, 2);

	/* 2 replay events, then revision 6 (seq 5), then 7 (seqs 6, 7). */
	for (i = 0; i < 4; i++) {
		Histd__V1__HistoryEvent *e;
		size_t k;

		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		e = decode(f->evs[i]);
		assert_int_equal(e->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		assert_int_equal(e->revision, i < 2 ? 5 : 4 + i);
		for (k = 0; k < e->appended->n_messages; k++)
			assert_msg(e->appended->messages[k], seq++);
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	assert_int_equal(seq, 8);
	hub_sync(h);
	assert_int_equal(fake_count(f), 4);
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);

	fake_close(f);
	fake_free(f);
	free_msgs(v, 4);
	histd_hub_free(h);
}

/* Subscribed while the session's first life was deleted and a second
 * created under its id: the first life's notices, late (an append, its
 * deletion, one more after the start, a plugin error before and after
 * the start), must not reach a stream whose snapshot read the second
 * life; the second life's changes past the snapshot all do, and so do
 * its plugin errors and those of no known life; the stream stays open. */
static void
changes_to_an_earlier_life_of_the_session_are_not_sent(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 1);
	histd_records r = records_of(v, 1);
	histd_event **replay;
	size_t n_replay, i;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	notify_append_life(h, "s1", 8, 5, 1, 1);
	notify_append_life(h, "s1", 2, 1, 1, 2);
	notify_kind_life(h, "s1", HISTD_CHANGE_DELETED, 9, 0, 1);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 9, 1, "compaction",
				       "life 1 before", 1);
	notify_append_life(h, "s1", 3, 2, 1, 2);
	hub_sync(h);

	/* The snapshot read life 2 at revision 2: seq 1. */
	assert_int_equal(histd_event_replay("s1", 2, &r, 0, 0, 10, 0, &replay,
					    &n_replay), 0);
	assert_int_equal(n_replay, 1);
	histd_hub_start_replay(f->sub, replay, n_replay, 2, 2, 0);
	free(replay);
	notify_append_life(h, "s1", 10, 6, 1, 1);
	notify_append_life(h, "s1", 4, 3, 1, 2);

	/* Seq 1 (the replay), 2 and 3 of life 2, nothing else. */
	for (i = 0; i < 3; i++) {
		Histd__V1__HistoryEvent *e;

		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		e = decode(f->evs[i]);
		assert_int_equal(e->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
		assert_int_equal(e->revision, 2 + i);
		assert_int_equal(e->appended->n_messages, 1);
		assert_msg(e->appended->messages[0], 1 + i);
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	/* Plugin errors: life 1's is not sent, life 2's and one of no
	 * known life (0) are. */
	histd_hub_publish_plugin_error(h, TENANT, "s1", 4, 1, "compaction",
				       "life 1 after", 1);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 4, 2, "compaction",
				       "life 2", 1);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 4, 0, "compaction",
				       "no life", 1);
	for (i = 3; i < 5; i++) {
		Histd__V1__HistoryEvent *e;

		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		e = decode(f->evs[i]);
		assert_int_equal(e->event_case,
				 HISTD__V1__HISTORY_EVENT__EVENT_PLUGIN_ERROR);
		assert_string_equal(e->plugin_error->message,
				    i == 3 ? "life 2" : "no life");
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	hub_sync(h);
	assert_int_equal(fake_count(f), 5);
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);

	fake_close(f);
	fake_free(f);
	free_msgs(v, 1);
	histd_hub_free(h);
}

static void
live_events_arrive_in_revision_order(void **state)
{
	histd_hub *h = hub_new(1000, 0, 0);
	struct fake *a = fake_new(FAKE_AUTO), *b = fake_new(FAKE_MANUAL);
	uint64_t rev;
	size_t i;

	(void)state;
	assert_int_equal(subscribe(h, "s1", a), 0);
	assert_int_equal(subscribe(h, "s1", b), 0);
	histd_hub_start(a->sub, NULL, 0, 0);
	histd_hub_start(b->sub, NULL, 0, 0);
	for (rev = 1; rev <= 300; rev++) {
		if (rev % 7 == 0)
			notify_kind(h, "s1", HISTD_CHANGE_CLEARED, rev, rev);
		else
			notify_append(h, "s1", rev, rev, 1);
	}
	assert_int_equal(fake_wait_sent(a, 300), 300);
	for (i = 0; i < 300; i++) {
		assert_int_equal(fake_wait_sent(b, i + 1), i + 1);
		assert_int_equal(fake_complete(b, 1), 0);
	}
	for (i = 0; i < 300; i++) {
		assert_int_equal(a->evs[i]->revision, i + 1);
		assert_int_equal(b->evs[i]->revision, i + 1);
	}
	assert_contract_kept(a);
	assert_contract_kept(b);
	fake_close(a);
	fake_close(b);
	fake_free(a);
	fake_free(b);
	histd_hub_free(h);
}

static void
slow_subscriber_ends_with_limit_and_resume_seq_while_fast_gets_all(void **state)
{
	histd_hub *h = hub_new(4, 0, 0);
	struct fake *slow = fake_new(FAKE_MANUAL), *fast = fake_new(FAKE_AUTO);
	uint64_t rev;
	size_t i;

	(void)state;
	assert_int_equal(subscribe(h, "s1", slow), 0);
	assert_int_equal(subscribe(h, "s1", fast), 0);
	histd_hub_start(slow->sub, NULL, 0, 0);
	histd_hub_start(fast->sub, NULL, 0, 0);

	/* The slow one takes two events (seqs 1-2, then 3-4), then stalls. */
	notify_append(h, "s1", 1, 1, 2);
	assert_int_equal(fake_wait_sent(slow, 1), 1);
	assert_int_equal(fake_complete(slow, 1), 0);
	assert_int_equal(fake_wait_sent(fast, 1), 1);
	notify_append(h, "s1", 2, 3, 2);
	assert_int_equal(fake_wait_sent(slow, 2), 2);
	assert_int_equal(fake_wait_sent(fast, 2), 2);
	assert_int_equal(fake_complete(slow, 1), 0);
	/* Revision 3 goes in flight and is never completed: 4 more fill its
	 * queue and the fifth overflows it. */
	for (rev = 3; rev <= 40; rev++) {
		notify_append(h, "s1", rev, 2 * rev - 1, 2);
		/* Paced by the fast one, whose queue must never fill. */
		assert_int_equal(fake_wait_sent(fast, rev), rev);
	}

	assert_int_equal(fake_wait_finished(slow), 1);
	assert_int_equal(slow->fin_err, HISTD_ELIMIT);
	/* Seqs 1-4 were delivered; 5-6 (revision 3) are in flight, and the
	 * status goes out after them. */
	assert_int_equal(slow->resume, 6);
	assert_non_null(strstr(slow->msg, "fell behind"));
	assert_int_equal(fake_count(slow), 3);

	assert_int_equal(fake_wait_sent(fast, 40), 40);
	for (i = 0; i < 40; i++)
		assert_int_equal(fast->evs[i]->last_seq, 2 * (i + 1));
	assert_int_equal(fast->fin_calls, 0);

	/* The stalled send finally completes: nothing more is sent. */
	assert_int_equal(fake_complete(slow, 1), 0);
	hub_sync(h);
	assert_int_equal(fake_count(slow), 3);
	assert_contract_kept(slow);
	assert_contract_kept(fast);
	fake_close(slow);
	fake_close(fast);
	fake_free(slow);
	fake_free(fast);
	histd_hub_free(h);
}

/* The resume seq starts at the subscriber's after_seq, and goes down to
 * the cleared_to_seq of a clear or truncate it drops unsent (queued, or
 * the one that overflowed the queue): the replay from there is a replaced
 * event, so the client learns those seqs are gone. */
static void
resume_seq_goes_below_a_dropped_truncate(void **state)
{
	histd_hub *h = hub_new(2, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL), *g = fake_new(FAKE_MANUAL);

	(void)state;
	assert_int_equal(histd_hub_subscribe(h, TENANT, "s1", 10, &fake_ops, f,
					     &f->sub), 0);
	assert_int_equal(histd_hub_subscribe(h, TENANT, "s2", 10, &fake_ops, g,
					     &g->sub), 0);
	histd_hub_start(f->sub, NULL, 0, 0);

	notify_append(h, "s1", 1, 11, 2);
	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(fake_complete(f, 1), 0);
	notify_append(h, "s1", 2, 13, 1);          /* in flight, stalled */
	assert_int_equal(fake_wait_sent(f, 2), 2);
	notify_kind(h, "s1", HISTD_CHANGE_CLEARED, 3, 9);
	notify_append(h, "s1", 4, 14, 1);
	notify_kind(h, "s1", HISTD_CHANGE_CLEARED, 5, 8);  /* overflows */
	assert_int_equal(fake_wait_finished(f), 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_int_equal(f->resume, 8);

	/* Ended before it started, with nothing removed: its after_seq. */
	notify_append(h, "s2", 1, 11, 1);
	notify_append(h, "s2", 2, 12, 1);
	notify_append(h, "s2", 3, 13, 1);
	assert_int_equal(fake_wait_finished(g), 1);
	assert_int_equal(g->fin_err, HISTD_ELIMIT);
	assert_int_equal(g->resume, 10);
	histd_hub_start(g->sub, NULL, 0, 0);

	assert_int_equal(fake_complete(f, 1), 0);
	assert_contract_kept(f);
	assert_contract_kept(g);
	fake_close(f);
	fake_close(g);
	fake_free(f);
	fake_free(g);
	histd_hub_free(h);
}

/* A replay handed over in parts: ops.more once per part, when the part
 * before is sent; live events wait for the last part. */
static void
replay_in_parts_holds_live_events_until_the_last_part(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 4);
	histd_records p1 = records_of(v, 2), p2 = records_of(v + 2, 2);
	histd_event **replay;
	size_t n_replay, i;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	assert_int_equal(histd_event_replay("s1", 5, &p1, 0, 0, 64, 0, &replay,
					    &n_replay), 0);
	histd_hub_start_replay(f->sub, replay, n_replay, 5, 0, 1);
	free(replay);
	notify_append(h, "s1", 6, 5, 1);

	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(f->more_calls, 0);
	assert_int_equal(fake_complete(f, 1), 0);
	hub_sync(h);
	assert_int_equal(f->more_calls, 1);
	assert_int_equal(fake_count(f), 1);     /* the live event waits */

	assert_int_equal(histd_event_replay("s1", 5, &p2, 0, 0, 64, 0, &replay,
					    &n_replay), 0);
	histd_hub_replay_more(f->sub, replay, n_replay, 0);
	free(replay);
	for (i = 1; i < 3; i++) {
		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	for (i = 0; i < 3; i++)
		assert_int_equal(f->evs[i]->last_seq, i < 2 ? 2 * (i + 1) : 5);
	assert_int_equal(f->evs[2]->revision, 6);
	assert_int_equal(f->more_calls, 1);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 4);
	histd_hub_free(h);
}

static void
replay_events_do_not_count_against_the_queue(void **state)
{
	histd_hub *h = hub_new(2, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 10);
	histd_records r = records_of(v, 10);
	histd_event **replay;
	size_t n_replay, i;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	assert_int_equal(histd_event_replay("s1", 3, &r, 0, 0, 1, 0, &replay,
					    &n_replay), 0);
	assert_int_equal(n_replay, 10);
	histd_hub_start(f->sub, replay, n_replay, 3);
	free(replay);
	notify_append(h, "s1", 4, 11, 1);
	notify_append(h, "s1", 5, 12, 1);
	for (i = 0; i < 12; i++) {
		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		assert_int_equal(f->evs[i]->last_seq, i + 1);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 10);
	histd_hub_free(h);
}

static void
queue_overflow_before_start_ends_the_subscriber(void **state)
{
	histd_hub *h = hub_new(2, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 2);
	histd_records r = records_of(v, 2);
	histd_event **replay;
	size_t n_replay;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	notify_append(h, "s1", 2, 1, 1);
	notify_append(h, "s1", 3, 2, 1);
	notify_append(h, "s1", 4, 3, 1);
	assert_int_equal(fake_wait_finished(f), 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_int_equal(f->resume, 0);

	/* Starting it afterwards sends nothing and frees the replay. */
	assert_int_equal(histd_event_replay("s1", 3, &r, 0, 0, 1, 0, &replay,
					    &n_replay), 0);
	histd_hub_start(f->sub, replay, n_replay, 3);
	free(replay);
	hub_sync(h);
	assert_int_equal(fake_count(f), 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 2);
	histd_hub_free(h);
}

static void
one_send_in_flight_with_completions_from_another_thread(void **state)
{
	histd_hub *h = hub_new(100000, 0, 0);
	struct fake *f[3];
	histd_record *v = make_msgs(1, 200);
	histd_records r = records_of(v, 200);
	histd_event **replay;
	size_t n_replay, i, k;

	(void)state;
	for (k = 0; k < 3; k++) {
		f[k] = fake_new(FAKE_AUTO);
		assert_int_equal(subscribe(h, "s1", f[k]), 0);
	}
	for (k = 0; k < 3; k++) {
		assert_int_equal(histd_event_replay("s1", 1, &r, 0, 0, 1, 0,
						    &replay, &n_replay), 0);
		histd_hub_start(f[k]->sub, replay, n_replay, 1);
		free(replay);
	}
	for (i = 0; i < 2000; i++)
		notify_append(h, "s1", 2 + i, 201 + i, 1);
	for (k = 0; k < 3; k++) {
		assert_int_equal(fake_wait_sent(f[k], 2200), 2200);
		for (i = 0; i < 2200; i++)
			assert_int_equal(f[k]->evs[i]->last_seq, i + 1);
		assert_contract_kept(f[k]);
		assert_int_equal(f[k]->fin_calls, 0);
	}
	for (k = 0; k < 3; k++) {
		fake_close(f[k]);
		fake_free(f[k]);
	}
	free_msgs(v, 200);
	histd_hub_free(h);
}

static void
deleted_ends_streams_with_ok_after_the_event_is_sent(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	notify_append(h, "s1", 1, 1, 1);
	notify_kind(h, "s1", HISTD_CHANGE_DELETED, 2, 0);
	/* Recreated under the same id: not this stream's business. */
	notify_append(h, "s1", 1, 1, 1);

	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(fake_complete(f, 1), 0);
	assert_int_equal(fake_wait_sent(f, 2), 2);
	assert_int_equal(f->evs[1]->kind, HISTD_CHANGE_DELETED);
	e = decode(f->evs[1]);
	assert_int_equal(e->event_case, HISTD__V1__HISTORY_EVENT__EVENT_DELETED);
	histd__v1__history_event__free_unpacked(e, NULL);
	hub_sync(h);
	assert_int_equal(f->fin_calls, 0);      /* not before it is sent */
	assert_int_equal(fake_complete(f, 1), 0);
	assert_int_equal(fake_wait_finished(f), 1);
	assert_int_equal(f->fin_err, 0);
	assert_int_equal(f->resume, 1);
	hub_sync(h);
	assert_int_equal(fake_count(f), 2);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	histd_hub_free(h);
}

/* A change larger than max_event_bytes goes out as several events at its
 * revision, in seq order: appended as appended events, replaced as one
 * Replaced event and then appended ones. Each part counts in the queue. */
static void
big_live_change_is_split_at_its_revision(void **state)
{
	histd_hub_config cfg = { .queue_max = 64, .max_event_bytes = 1200 };
	histd_hub *h = NULL;
	struct fake *f = fake_new(FAKE_AUTO);
	histd_record *v = make_msgs(11, 40);
	histd_change rc = {
		.kind = HISTD_CHANGE_REPLACED, .tenant = TENANT,
		.session_id = "s1", .revision = 3, .records = v,
		.n_records = 40, .cleared_to_seq = 10,
	};
	size_t i, k;
	uint64_t seq = 1;

	(void)state;
	assert_int_equal(histd_hub_new(&h, &cfg), 0);
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 1);
	notify_append(h, "s1", 2, 1, 10);
	histd_hub_notify(h, &rc);
	notify_append(h, "s1", 4, 51, 1);
	for (i = 0; seq < 52; i++) {
		Histd__V1__HistoryEvent *e;
		Histd__V1__Message **ms;
		size_t nm;

		assert_true(fake_wait_sent(f, i + 1) >= i + 1);
		e = decode(f->evs[i]);

		assert_true(f->evs[i]->len <= 1200);
		if (e->event_case == HISTD__V1__HISTORY_EVENT__EVENT_REPLACED) {
			assert_int_equal(seq, 11);
			assert_int_equal(e->replaced->cleared_to_seq, 10);
			ms = e->replaced->messages;
			nm = e->replaced->n_messages;
		} else {
			assert_int_equal(e->event_case,
					 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
			assert_true(seq != 11);
			ms = e->appended->messages;
			nm = e->appended->n_messages;
		}
		assert_int_equal(e->revision, seq <= 10 ? 2 : seq <= 50 ? 3 : 4);
		for (k = 0; k < nm; k++)
			assert_msg(ms[k], seq++);
		histd__v1__history_event__free_unpacked(e, NULL);
	}
	assert_true(i > 2 + 50 * v[0].len / 1200);
	hub_sync(h);
	assert_int_equal(fake_count(f), i);
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 40);
	histd_hub_free(h);
}

/* A change split in more parts than a subscriber's queue holds takes one
 * place in it, and its parts go out one after another: a plugin error
 * reported meanwhile, and the next change, come after the last part. */
static void
split_change_takes_one_queue_place_and_stays_whole(void **state)
{
	histd_hub_config cfg = { .queue_max = 3, .max_event_bytes = 1200 };
	histd_hub *h = NULL;
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(2, 80);
	histd_change ac = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "s1", .revision = 3, .records = v,
		.n_records = 80,
	};
	Histd__V1__HistoryEvent *e;
	size_t i, k, parts = 0;
	uint64_t seq = 1;
	int plugin_error = 0;

	(void)state;
	assert_int_equal(histd_hub_new(&h, &cfg), 0);
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 1);
	/* Seq 1 stays in flight while three changes queue. */
	notify_append(h, "s1", 2, 1, 1);
	histd_hub_notify(h, &ac);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 3, 0, "compaction",
				       "provider down", 1);
	notify_append(h, "s1", 4, 82, 1);
	hub_sync(h);
	for (i = 0; seq <= 82 || !plugin_error; i++) {
		assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
		e = decode(f->evs[i]);
		if (e->event_case ==
		    HISTD__V1__HISTORY_EVENT__EVENT_PLUGIN_ERROR) {
			/* After the whole change, before the next. */
			assert_int_equal(seq, 82);
			assert_int_equal(e->revision, 3);
			plugin_error = 1;
		} else {
			assert_int_equal(e->event_case,
					 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
			assert_int_equal(e->revision,
					 seq == 1 ? 2 : seq <= 81 ? 3 : 4);
			if (e->revision == 3)
				parts++;
			for (k = 0; k < e->appended->n_messages; k++)
				assert_msg(e->appended->messages[k], seq++);
		}
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	assert_true(parts > cfg.queue_max);
	assert_int_equal(fake_count(f), i);
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 80);
	histd_hub_free(h);
}

/* A plugin error reported at a revision that a racing change (or the
 * snapshot) already passed goes out at the later revision, its text
 * unchanged: events stay in revision order. */
/* f's send i (waited for), decoded: a plugin error (pe) or an appended
 * event, at revision rev. */
static Histd__V1__HistoryEvent *
sent_as(struct fake *f, size_t i, int pe, uint64_t rev)
{
	Histd__V1__HistoryEvent *e;

	assert_int_equal(fake_wait_sent(f, i + 1), i + 1);
	e = decode(f->evs[i]);
	assert_int_equal(e->event_case, pe ?
			 HISTD__V1__HISTORY_EVENT__EVENT_PLUGIN_ERROR :
			 HISTD__V1__HISTORY_EVENT__EVENT_APPENDED);
	assert_int_equal(e->revision, rev);
	assert_int_equal(f->evs[i]->revision, rev);
	return e;
}

static void
plugin_error_older_than_what_was_sent_keeps_revision_order(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 2);
	histd_records r = records_of(v, 2);
	histd_event **replay;
	size_t n_replay, i;
	Histd__V1__HistoryEvent *e;
	/* kind (0: appended, 1: plugin error) and revision, in send order */
	static const struct { int pe; uint64_t rev; } want[] = {
		{ 0, 5 }, { 1, 5 }, { 0, 6 }, { 1, 6 }, { 1, 6 }, { 0, 8 },
	};

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	/* Reported at revision 2 while the snapshot (revision 5) is read. */
	histd_hub_publish_plugin_error(h, TENANT, "s1", 2, 0, "compaction",
				       "first", 1);
	hub_sync(h);
	assert_int_equal(histd_event_replay("s1", 5, &r, 0, 0, 64, 0, &replay,
					    &n_replay), 0);
	histd_hub_start(f->sub, replay, n_replay, 5);
	free(replay);
	/* The reporter read revision 5, an append committed revision 6
	 * before its report reached the hub. */
	notify_append(h, "s1", 6, 3, 1);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 5, 0, "compaction",
				       "second", 0);
	/* Reported at 7, a revision no change given to the stream has
	 * reached: it goes out at 6, the last one. */
	histd_hub_publish_plugin_error(h, TENANT, "s1", 7, 0, "window", "third",
				       1);
	notify_append(h, "s1", 8, 4, 1);

	for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		e = sent_as(f, i, want[i].pe, want[i].rev);
		assert_string_equal(e->session_id, "s1");
		if (want[i].pe) {
			assert_string_equal(e->plugin_error->message,
					    i == 1 ? "first" :
					    i == 3 ? "second" : "third");
			assert_int_equal(e->plugin_error->will_retry, i != 3);
		}
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 2);
	histd_hub_free(h);
}

/* The postgres driver hands a change on after others can read it: a
 * reporter may read revision 12 and publish its error before changes 11
 * and 12 reach the hub. The error goes out at the last change the stream
 * was given (10), before them, never after them out of order. */
static void
plugin_error_ahead_of_changes_not_yet_notified_goes_out_before_them(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	Histd__V1__HistoryEvent *e;
	/* kind (0: appended, 1: plugin error) and revision, in send order */
	static const struct { int pe; uint64_t rev; } want[] = {
		{ 0, 10 }, { 1, 10 }, { 0, 11 }, { 0, 12 },
	};

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 9);
	notify_append(h, "s1", 10, 1, 1);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 12, 0, "compaction",
				       "ahead", 1);
	notify_append(h, "s1", 11, 2, 1);
	notify_append(h, "s1", 12, 3, 1);
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		e = sent_as(f, i, want[i].pe, want[i].rev);
		histd__v1__history_event__free_unpacked(e, NULL);
		assert_int_equal(fake_complete(f, 1), 0);
	}
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	histd_hub_free(h);
}

/* Up to date (nothing to replay), the stream still stands at the
 * snapshot: an error reported below it goes out at the snapshot. */
static void
plugin_error_below_an_empty_replay_goes_out_at_the_snapshot(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	Histd__V1__HistoryEvent *e;

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_publish_plugin_error(h, TENANT, "s1", 2, 0, "compaction",
				       "late", 1);
	hub_sync(h);
	histd_hub_start(f->sub, NULL, 0, 5);
	e = sent_as(f, 0, 1, 5);
	histd__v1__history_event__free_unpacked(e, NULL);
	assert_int_equal(fake_complete(f, 1), 0);
	assert_int_equal(f->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	histd_hub_free(h);
}

static void
shutdown_finishes_every_stream_unavailable(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *idle = fake_new(FAKE_MANUAL);
	struct fake *busy = fake_new(FAKE_MANUAL);
	struct fake *unstarted = fake_new(FAKE_MANUAL);
	struct fake *late = fake_new(FAKE_MANUAL);
	struct fake *all[3] = { idle, busy, unstarted };
	size_t k;

	(void)state;
	assert_int_equal(subscribe(h, "s1", idle), 0);
	assert_int_equal(subscribe(h, "s1", busy), 0);
	assert_int_equal(subscribe(h, "s2", unstarted), 0);
	histd_hub_start(idle->sub, NULL, 0, 0);
	histd_hub_start(busy->sub, NULL, 0, 0);
	notify_append(h, "s1", 1, 1, 1);
	assert_int_equal(fake_wait_sent(busy, 1), 1);
	assert_int_equal(fake_wait_sent(idle, 1), 1);
	assert_int_equal(fake_complete(idle, 1), 0);
	notify_append(h, "s1", 2, 2, 1);
	assert_int_equal(fake_wait_sent(idle, 2), 2);
	assert_int_equal(fake_complete(idle, 1), 0);

	histd_hub_shutdown(h);
	for (k = 0; k < 3; k++) {
		assert_int_equal(all[k]->fin_calls, 1);
		assert_int_equal(all[k]->fin_err, HISTD_EUNAVAILABLE);
		assert_string_equal(all[k]->msg, "server is shutting down");
	}
	assert_int_equal(idle->resume, 2);
	/* Its seq 1 is in flight: the status follows it. */
	assert_int_equal(busy->resume, 1);

	assert_int_equal(subscribe(h, "s1", late), HISTD_EUNAVAILABLE);
	notify_append(h, "s1", 3, 3, 1);
	assert_int_equal(fake_complete(busy, 1), 0);
	histd_hub_start(unstarted->sub, NULL, 0, 0);
	histd_hub_shutdown(h);              /* twice is harmless */
	assert_int_equal(fake_count(idle), 2);
	assert_int_equal(fake_count(busy), 1);
	for (k = 0; k < 3; k++) {
		assert_contract_kept(all[k]);
		fake_close(all[k]);
		fake_free(all[k]);
	}
	fake_free(late);
	assert_int_equal(histd_hub_count(h), 0);
	histd_hub_free(h);
}

static void
subscriber_limits_answer_elimit(void **state)
{
	histd_hub *h = hub_new(16, 3, 2);
	struct fake *f[5];
	size_t k;

	(void)state;
	for (k = 0; k < 5; k++)
		f[k] = fake_new(FAKE_MANUAL);
	assert_int_equal(subscribe(h, "s1", f[0]), 0);
	assert_int_equal(subscribe(h, "s1", f[1]), 0);
	assert_int_equal(subscribe(h, "s1", f[2]), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "this session"));
	assert_int_equal(subscribe(h, "s2", f[2]), 0);
	assert_int_equal(subscribe(h, "s3", f[3]), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "allows 3"));
	assert_int_equal(histd_hub_count(h), 3);

	histd_hub_unsubscribe(f[0]->sub);
	assert_int_equal(subscribe(h, "s3", f[3]), 0);
	assert_int_equal(subscribe(h, "s1", f[4]), HISTD_ELIMIT);
	histd_hub_unsubscribe(f[1]->sub);
	histd_hub_unsubscribe(f[2]->sub);
	histd_hub_unsubscribe(f[3]->sub);
	assert_int_equal(histd_hub_count(h), 0);
	for (k = 0; k < 5; k++)
		fake_free(f[k]);
	histd_hub_free(h);
}

/* Waits until f was aborted; the number of aborts, 0 on timeout. */
static int
fake_wait_aborted(struct fake *f)
{
	struct timespec ts;
	int got;

	deadline_in(&ts, 5000);
	pthread_mutex_lock(&f->mu);
	while (!f->abort_calls &&
	       pthread_cond_timedwait(&f->cv, &f->mu, &ts) != ETIMEDOUT)
		;
	got = f->abort_calls;
	pthread_mutex_unlock(&f->mu);
	return got;
}

/* A stream ended as too slow leaves its place in the session at once; if
 * its send in flight is still stuck after the grace, it is aborted, naming
 * the last seq its client got, not the one in flight. A stream whose send
 * completes in time is not. */
static void
slow_subscriber_leaves_its_place_and_is_aborted_after_the_grace(void **state)
{
	histd_hub_config cfg = {
		.queue_max = 2, .max_per_session = 2,
		.end_grace_us = 200000,
	};
	histd_hub *h = NULL;
	struct fake *stuck = fake_new(FAKE_MANUAL);
	struct fake *slow = fake_new(FAKE_MANUAL);
	struct fake *next = fake_new(FAKE_AUTO);
	uint64_t seq;

	(void)state;
	assert_int_equal(histd_hub_new(&h, &cfg), 0);
	assert_int_equal(subscribe(h, "s1", stuck), 0);
	assert_int_equal(subscribe(h, "s1", slow), 0);
	histd_hub_start(stuck->sub, NULL, 0, 0);
	histd_hub_start(slow->sub, NULL, 0, 0);
	notify_append(h, "s1", 1, 1, 1);
	assert_int_equal(fake_wait_sent(stuck, 1), 1);
	assert_int_equal(fake_complete(stuck, 1), 0);
	/* Seq 2 in flight for both, 3 and 4 queued, 5 is one too many. */
	for (seq = 2; seq <= 5; seq++)
		notify_append(h, "s1", seq, seq, 1);
	hub_sync(h);
	assert_int_equal(stuck->fin_calls, 1);
	assert_int_equal(stuck->fin_err, HISTD_ELIMIT);
	assert_int_equal(stuck->resume, 2);
	assert_int_equal(slow->fin_calls, 1);

	/* Both ended: a new stream gets in although two are still open. */
	assert_int_equal(subscribe(h, "s1", next), 0);
	histd_hub_start(next->sub, NULL, 0, 5);

	/* slow's send completes within the grace: its status goes out. */
	assert_int_equal(fake_complete(slow, 1), 0);
	assert_int_equal(fake_wait_aborted(stuck), 1);
	assert_non_null(strstr(stuck->abort_msg, "after_seq 1"));
	usleep(400000);
	assert_int_equal(slow->abort_calls, 0);
	assert_int_equal(stuck->abort_calls, 1);

	assert_contract_kept(stuck);
	assert_contract_kept(slow);
	fake_close(stuck);
	fake_close(slow);
	fake_close(next);
	assert_int_equal(histd_hub_count(h), 0);
	fake_free(stuck);
	fake_free(slow);
	fake_free(next);
	histd_hub_free(h);
}

static void
unsubscribe_mid_flight_frees_its_queue_and_spares_the_others(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *gone = fake_new(FAKE_MANUAL), *stays = fake_new(FAKE_AUTO);
	histd_sub *sub;

	(void)state;
	assert_int_equal(subscribe(h, "s1", gone), 0);
	assert_int_equal(subscribe(h, "s1", stays), 0);
	histd_hub_start(gone->sub, NULL, 0, 0);
	histd_hub_start(stays->sub, NULL, 0, 0);
	notify_append(h, "s1", 1, 1, 1);
	notify_append(h, "s1", 2, 2, 1);
	notify_append(h, "s1", 3, 3, 1);
	hub_sync(h);
	/* One in flight, two queued: the hub drops all three references. */
	assert_int_equal(fake_count(gone), 1);
	sub = gone->sub;
	gone->sub = NULL;
	histd_hub_unsubscribe(sub);

	notify_append(h, "s1", 4, 4, 1);
	assert_int_equal(fake_wait_sent(stays, 4), 4);
	hub_sync(h);
	assert_int_equal(fake_count(gone), 1);
	assert_int_equal(gone->fin_calls, 0);
	assert_int_equal(histd_hub_count(h), 1);
	assert_contract_kept(gone);
	assert_contract_kept(stays);
	fake_close(stays);
	fake_free(gone);
	fake_free(stays);
	histd_hub_free(h);
}

static void
failed_send_stops_sending_without_a_status(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *refuses = fake_new(FAKE_FAIL), *breaks = fake_new(FAKE_MANUAL);

	(void)state;
	assert_int_equal(subscribe(h, "s1", refuses), 0);
	assert_int_equal(subscribe(h, "s1", breaks), 0);
	histd_hub_start(refuses->sub, NULL, 0, 0);
	histd_hub_start(breaks->sub, NULL, 0, 0);
	notify_append(h, "s1", 1, 1, 1);
	notify_append(h, "s1", 2, 2, 1);
	assert_int_equal(fake_wait_sent(breaks, 1), 1);
	assert_int_equal(fake_complete(breaks, 0), 0);
	notify_append(h, "s1", 3, 3, 1);
	hub_sync(h);
	assert_int_equal(fake_count(refuses), 0);
	assert_int_equal(fake_count(breaks), 1);
	histd_hub_shutdown(h);
	assert_int_equal(refuses->fin_calls, 0);
	assert_int_equal(breaks->fin_calls, 0);
	/* FAKE_FAIL counts one violation-free refusal per attempt. */
	assert_int_equal(refuses->violations, 0);
	assert_contract_kept(breaks);
	fake_close(refuses);
	fake_close(breaks);
	fake_free(refuses);
	fake_free(breaks);
	histd_hub_free(h);
}

static void
late_subscriber_does_not_get_events_notified_before_it_registered(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *blocker = fake_new(FAKE_BLOCK), *late = fake_new(FAKE_MANUAL);
	struct fake *early = fake_new(FAKE_MANUAL);

	(void)state;
	/* Stall the dispatcher inside the blocker's send. */
	blocker->block = 1;
	assert_int_equal(subscribe(h, "stall", blocker), 0);
	histd_hub_start(blocker->sub, NULL, 0, 0);
	assert_int_equal(subscribe(h, "s1", early), 0);
	histd_hub_start(early->sub, NULL, 0, 0);
	notify_kind(h, "stall", HISTD_CHANGE_CLEARED, 1, 0);
	notify_append(h, "s1", 5, 5, 1);      /* queued behind the stall */
	assert_int_equal(subscribe(h, "s1", late), 0);
	histd_hub_start(late->sub, NULL, 0, 0);
	notify_append(h, "s1", 6, 6, 1);

	fake_unblock(blocker);

	assert_int_equal(fake_wait_sent(early, 1), 1);
	assert_int_equal(early->evs[0]->revision, 5);
	assert_int_equal(fake_complete(early, 1), 0);
	assert_int_equal(fake_wait_sent(early, 2), 2);
	assert_int_equal(fake_wait_sent(late, 1), 1);
	assert_int_equal(late->evs[0]->revision, 6);
	hub_sync(h);
	assert_int_equal(fake_count(late), 1);

	fake_close(blocker);
	fake_close(early);
	fake_close(late);
	fake_free(blocker);
	fake_free(early);
	fake_free(late);
	histd_hub_free(h);
}

static void
full_dispatch_queue_ends_the_subscribers_it_turns_away(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *blocker = fake_new(FAKE_BLOCK), *f = fake_new(FAKE_MANUAL);
	uint64_t rev;

	(void)state;
	blocker->block = 1;
	assert_int_equal(subscribe(h, "stall", blocker), 0);
	histd_hub_start(blocker->sub, NULL, 0, 0);
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	notify_kind(h, "stall", HISTD_CHANGE_CLEARED, 1, 0);
	/* The dispatcher is stuck inside the blocker's send: the FIFO holds
	 * only what follows. */
	assert_int_equal(fake_wait_blocked(blocker), 1);
	for (rev = 1; rev <= 65536 && !f->fin_calls; rev++)
		notify_kind(h, "s1", HISTD_CHANGE_CLEARED, rev, rev);
	assert_int_equal(f->fin_calls, 0);
	notify_kind(h, "s1", HISTD_CHANGE_CLEARED, rev, rev);
	assert_int_equal(f->fin_calls, 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_non_null(strstr(f->msg, "event queue is full"));

	fake_unblock(blocker);
	hub_sync(h);
	assert_int_equal(fake_count(f), 0);
	assert_contract_kept(f);
	fake_close(blocker);
	fake_close(f);
	fake_free(blocker);
	fake_free(f);
	histd_hub_free(h);
}

static void
change_without_records_ends_subscribers_with_resume_seq(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL), *other = fake_new(FAKE_MANUAL);
	histd_change c = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "s1", .revision = 3,
	};

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	assert_int_equal(subscribe(h, "s2", other), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	histd_hub_start(other->sub, NULL, 0, 0);
	notify_append(h, "s1", 2, 1, 3);
	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(fake_complete(f, 1), 0);
	/* Another replica appended: the driver cannot give the records. */
	histd_hub_notify(h, &c);
	assert_int_equal(fake_wait_finished(f), 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_int_equal(f->resume, 3);
	assert_int_equal(other->fin_calls, 0);
	assert_contract_kept(f);
	fake_close(f);
	fake_close(other);
	fake_free(f);
	fake_free(other);
	histd_hub_free(h);
}

/* A stream ended out of turn (a change that cannot be queued) while a
 * truncate of its session still waits in the dispatcher's FIFO: that
 * truncate never reaches it, so it resumes at or below its
 * cleared_to_seq, and the replay from there says what was removed. */
static void
resume_seq_goes_below_a_truncate_still_queued(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *blocker = fake_new(FAKE_BLOCK), *f = fake_new(FAKE_MANUAL);
	histd_change truncate = {
		.kind = HISTD_CHANGE_CLEARED, .tenant = TENANT,
		.session_id = "s1", .revision = 3, .cleared_to_seq = 60,
		.system_kept = 1,
	};
	histd_change bad = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "s1", .revision = 4,
	};

	(void)state;
	blocker->block = 1;
	assert_int_equal(subscribe(h, "stall", blocker), 0);
	histd_hub_start(blocker->sub, NULL, 0, 0);
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	notify_append(h, "s1", 2, 1, 100);
	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(fake_complete(f, 1), 0);
	notify_kind(h, "stall", HISTD_CHANGE_CLEARED, 1, 0);
	/* The dispatcher is stuck in the blocker's send: the truncate waits
	 * in the FIFO when the change without records ends the stream. */
	assert_int_equal(fake_wait_blocked(blocker), 1);
	histd_hub_notify(h, &truncate);
	histd_hub_notify(h, &bad);
	assert_int_equal(fake_wait_finished(f), 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_int_equal(f->resume, 60);

	fake_unblock(blocker);
	hub_sync(h);
	assert_int_equal(fake_count(f), 1);
	assert_contract_kept(f);
	fake_close(blocker);
	fake_close(f);
	fake_free(blocker);
	fake_free(f);
	histd_hub_free(h);
}

static void
notify_without_subscribers_allocates_nothing(void **state)
{
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL), *g = fake_new(FAKE_MANUAL);
	struct fake *p = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(1, 1);
	histd_change c = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "nobody", .revision = 2, .records = v,
		.n_records = 1,
	};
	int i;

	(void)state;
#if ALLOC_HOOK
	/* Nobody subscribes anywhere, then only to another session. */
	alloc_hook_start(-1);
	for (i = 0; i < 100; i++)
		histd_hub_notify(h, &c);
	assert_int_equal(alloc_hook_stop(), 0);
	assert_int_equal(subscribe(h, "other", g), 0);
	alloc_hook_start(-1);
	for (i = 0; i < 100; i++)
		histd_hub_notify(h, &c);
	assert_int_equal(alloc_hook_stop(), 0);

	/* The counter does see the packing for a session with subscribers. */
	assert_int_equal(subscribe(h, "probe", p), 0);
	c.session_id = "probe";
	alloc_hook_start(-1);
	histd_hub_notify(h, &c);
	assert_true(alloc_hook_stop() > 0);
	c.session_id = "nobody";
	fake_close(p);
#else
	for (i = 0; i < 100; i++)
		histd_hub_notify(h, &c);
	assert_int_equal(subscribe(h, "other", g), 0);
	for (i = 0; i < 100; i++)
		histd_hub_notify(h, &c);
#endif
	/* And nothing of it reaches a later subscriber. */
	assert_int_equal(subscribe(h, "nobody", f), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	histd_hub_start(g->sub, NULL, 0, 0);
	hub_sync(h);
	assert_int_equal(fake_count(f), 0);
	assert_int_equal(fake_count(g), 0);
	fake_close(f);
	fake_close(g);
	fake_free(f);
	fake_free(g);
	fake_free(p);
	free_msgs(v, 1);
	histd_hub_free(h);
}

static void
notify_out_of_memory_ends_subscribers_with_resume_seq(void **state)
{
#if ALLOC_HOOK
	histd_hub *h = hub_new(16, 0, 0);
	struct fake *f = fake_new(FAKE_MANUAL);
	histd_record *v = make_msgs(9, 1);
	histd_change c = {
		.kind = HISTD_CHANGE_APPENDED, .tenant = TENANT,
		.session_id = "s1", .revision = 9, .records = v, .n_records = 1,
	};

	(void)state;
	assert_int_equal(subscribe(h, "s1", f), 0);
	histd_hub_start(f->sub, NULL, 0, 0);
	notify_append(h, "s1", 2, 1, 5);
	assert_int_equal(fake_wait_sent(f, 1), 1);
	assert_int_equal(fake_complete(f, 1), 0);

	alloc_hook_start(0);
	histd_hub_notify(h, &c);
	alloc_hook_stop();
	assert_int_equal(f->fin_calls, 1);
	assert_int_equal(f->fin_err, HISTD_ELIMIT);
	assert_int_equal(f->resume, 5);
	assert_contract_kept(f);
	fake_close(f);
	fake_free(f);
	free_msgs(v, 1);
	histd_hub_free(h);
#else
	(void)state;
	skip();
#endif
}

static void
event_builders_fail_cleanly_out_of_memory(void **state)
{
#if ALLOC_HOOK
	histd_record *v = make_msgs(1, 7);
	histd_records r = records_of(v, 7);
	histd_kv labels[1] = { { "a", "b" } };
	uint8_t cfg = 0;
	histd_session s = { .id = "s1", .labels = labels, .n_labels = 1,
			    .config = &cfg, .revision = 2 };
	histd_change c = { .kind = HISTD_CHANGE_UPDATED, .session_id = "s1",
			   .revision = 2, .session = &s };
	histd_event **evs, *ev;
	size_t n, i;
	long k;
	int rc;

	(void)state;
	for (k = 0;; k++) {
		alloc_hook_start(k);
		rc = histd_event_replay("s1", 3, &r, 0, 0, 2, 0, &evs, &n);
		alloc_hook_stop();
		if (rc == 0)
			break;
		assert_int_equal(rc, HISTD_ENOMEM);
	}
	assert_int_equal(k, 5);       /* the array and 4 events */
	for (i = 0; i < n; i++)
		histd_event_unref(evs[i]);
	free(evs);

	for (k = 0;; k++) {
		alloc_hook_start(k);
		ev = histd_event_from_change(&c);
		alloc_hook_stop();
		if (ev)
			break;
	}
	assert_true(k >= 3);
	histd_event_unref(ev);
	free_msgs(v, 7);
#else
	(void)state;
	skip();
#endif
}

/* ---------------------------------------------------------------------- */
/* Concurrency                                                             */

#define N_SESSIONS 4
#define N_NOTIFIES 1500
#define N_CHURN 150

static struct {
	histd_hub *h;
	int errors;                     /* atomic */
	unsigned seed;
} conc;

static void *
notifier_main(void *arg)
{
	intptr_t k = (intptr_t)arg;
	char sid[16];
	uint64_t rev;

	snprintf(sid, sizeof(sid), "c%d", (int)k);
	for (rev = 1; rev <= N_NOTIFIES; rev++)
		notify_append(conc.h, sid, rev, rev, 1);
	return NULL;
}

/* Subscribers come and go on the notified sessions; whatever each one
 * receives must be in revision order. */
static void *
churn_main(void *arg)
{
	unsigned seed = (unsigned)(intptr_t)arg;
	int i;

	for (i = 0; i < N_CHURN; i++) {
		struct fake *f = fake_new(i % 3 ? FAKE_AUTO : FAKE_MANUAL);
		char sid[16];
		size_t k;

		snprintf(sid, sizeof(sid), "c%d", rand_r(&seed) % N_SESSIONS);
		if (histd_hub_subscribe(conc.h, TENANT, sid, 0, &fake_ops, f,
					&f->sub) != 0) {
			__atomic_add_fetch(&conc.errors, 1, __ATOMIC_RELAXED);
			fake_free(f);
			continue;
		}
		histd_hub_start(f->sub, NULL, 0, 0);
		usleep(rand_r(&seed) % 500);
		fake_close(f);
		pthread_mutex_lock(&f->mu);
		for (k = 1; k < f->n; k++)
			if (f->evs[k]->revision <= f->evs[k - 1]->revision)
				__atomic_add_fetch(&conc.errors, 1,
						   __ATOMIC_RELAXED);
		if (f->violations || f->fin_calls)
			__atomic_add_fetch(&conc.errors, 1, __ATOMIC_RELAXED);
		pthread_mutex_unlock(&f->mu);
		fake_free(f);
	}
	return NULL;
}

static void
concurrent_notifies_and_churning_subscribers_keep_order(void **state)
{
	pthread_t nt[N_SESSIONS], ct[2];
	struct fake *stay[N_SESSIONS];
	intptr_t k;
	size_t i;

	(void)state;
	conc.h = hub_new(1 << 20, 0, 0);
	conc.errors = 0;
	for (k = 0; k < N_SESSIONS; k++) {
		char sid[16];

		snprintf(sid, sizeof(sid), "c%d", (int)k);
		stay[k] = fake_new(FAKE_AUTO);
		assert_int_equal(subscribe(conc.h, sid, stay[k]), 0);
		histd_hub_start(stay[k]->sub, NULL, 0, 0);
	}
	for (k = 0; k < 2; k++)
		assert_int_equal(pthread_create(&ct[k], NULL, churn_main,
						(void *)(k + 1)), 0);
	for (k = 0; k < N_SESSIONS; k++)
		assert_int_equal(pthread_create(&nt[k], NULL, notifier_main,
						(void *)k), 0);
	for (k = 0; k < N_SESSIONS; k++)
		pthread_join(nt[k], NULL);
	for (k = 0; k < 2; k++)
		pthread_join(ct[k], NULL);

	assert_int_equal(conc.errors, 0);
	for (k = 0; k < N_SESSIONS; k++) {
		assert_int_equal(fake_wait_sent(stay[k], N_NOTIFIES),
				 N_NOTIFIES);
		for (i = 0; i < N_NOTIFIES; i++) {
			assert_int_equal(stay[k]->evs[i]->revision, i + 1);
			assert_int_equal(stay[k]->evs[i]->last_seq, i + 1);
		}
		assert_contract_kept(stay[k]);
		assert_int_equal(stay[k]->fin_calls, 0);
		fake_close(stay[k]);
		fake_free(stay[k]);
	}
	assert_int_equal(histd_hub_count(conc.h), 0);
	histd_hub_free(conc.h);
}

static void
shutdown_while_notifying_ends_everyone_once(void **state)
{
	pthread_t nt[N_SESSIONS];
	struct fake *f[N_SESSIONS * 2];
	intptr_t k;

	(void)state;
	conc.h = hub_new(64, 0, 0);
	for (k = 0; k < N_SESSIONS * 2; k++) {
		char sid[16];

		snprintf(sid, sizeof(sid), "c%d", (int)(k % N_SESSIONS));
		f[k] = fake_new(k % 2 ? FAKE_AUTO : FAKE_MANUAL);
		assert_int_equal(subscribe(conc.h, sid, f[k]), 0);
		histd_hub_start(f[k]->sub, NULL, 0, 0);
	}
	for (k = 0; k < N_SESSIONS; k++)
		assert_int_equal(pthread_create(&nt[k], NULL, notifier_main,
						(void *)k), 0);
	usleep(2000);
	histd_hub_shutdown(conc.h);
	for (k = 0; k < N_SESSIONS; k++)
		pthread_join(nt[k], NULL);
	for (k = 0; k < N_SESSIONS * 2; k++) {
		/* Ended by shutdown, or by an overflow before it. */
		assert_int_equal(f[k]->fin_calls, 1);
		assert_true(f[k]->fin_err == HISTD_EUNAVAILABLE ||
			    f[k]->fin_err == HISTD_ELIMIT);
		assert_int_equal(f[k]->violations, 0);
		fake_close(f[k]);
		fake_free(f[k]);
	}
	histd_hub_free(conc.h);
}

/* ---------------------------------------------------------------------- */

static void
hub_new_refuses_a_zero_queue(void **state)
{
	histd_hub_config cfg = { .queue_max = 0 };
	histd_hub *h = NULL;

	(void)state;
	assert_int_equal(histd_hub_new(&h, &cfg), HISTD_EINVALID);
	assert_null(h);
	h = hub_new(1, 0, 0);
	histd_hub_free(h);          /* no subscriber ever: joins, frees */
	histd_hub_free(NULL);
}

static int
setup_completer(void **state)
{
	(void)state;
	pthread_mutex_init(&completer.mu, NULL);
	pthread_cond_init(&completer.cv, NULL);
	return pthread_create(&completer.thread, NULL, completer_main, NULL);
}

static int
teardown_completer(void **state)
{
	(void)state;
	pthread_mutex_lock(&completer.mu);
	completer.stop = 1;
	pthread_cond_signal(&completer.cv);
	pthread_mutex_unlock(&completer.mu);
	if (pthread_join(completer.thread, NULL) != 0)
		return -1;
	pthread_cond_destroy(&completer.cv);
	pthread_mutex_destroy(&completer.mu);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(event_appended_splices_messages_that_unpack),
		cmocka_unit_test(event_cleared_carries_cleared_to_seq),
		cmocka_unit_test(event_replaced_carries_messages_and_cleared_to_seq),
		cmocka_unit_test(event_reduced_carries_the_summary),
		cmocka_unit_test(event_deleted_is_an_empty_deleted),
		cmocka_unit_test(event_updated_carries_the_whole_session),
		cmocka_unit_test(event_from_change_refuses_a_change_without_its_records),
		cmocka_unit_test(replay_chunks_messages_in_order),
		cmocka_unit_test(replay_of_nothing_is_no_event_unless_replaced),
		cmocka_unit_test(replay_replaced_is_one_event_with_every_message),
		cmocka_unit_test(replay_events_stay_within_max_bytes),
		cmocka_unit_test(event_builders_fail_cleanly_out_of_memory),
		cmocka_unit_test(hub_new_refuses_a_zero_queue),
		cmocka_unit_test(replay_then_live_without_gap_or_duplicate),
		cmocka_unit_test(live_events_arrive_in_revision_order),
		cmocka_unit_test(slow_subscriber_ends_with_limit_and_resume_seq_while_fast_gets_all),
		cmocka_unit_test(replay_events_do_not_count_against_the_queue),
		cmocka_unit_test(replay_in_parts_holds_live_events_until_the_last_part),
		cmocka_unit_test(resume_seq_goes_below_a_dropped_truncate),
		cmocka_unit_test(queue_overflow_before_start_ends_the_subscriber),
		cmocka_unit_test(one_send_in_flight_with_completions_from_another_thread),
		cmocka_unit_test(deleted_ends_streams_with_ok_after_the_event_is_sent),
		cmocka_unit_test(changes_to_an_earlier_life_of_the_session_are_not_sent),
		cmocka_unit_test(plugin_error_older_than_what_was_sent_keeps_revision_order),
		cmocka_unit_test(plugin_error_ahead_of_changes_not_yet_notified_goes_out_before_them),
		cmocka_unit_test(plugin_error_below_an_empty_replay_goes_out_at_the_snapshot),
		cmocka_unit_test(big_live_change_is_split_at_its_revision),
		cmocka_unit_test(split_change_takes_one_queue_place_and_stays_whole),
		cmocka_unit_test(shutdown_finishes_every_stream_unavailable),
		cmocka_unit_test(subscriber_limits_answer_elimit),
		cmocka_unit_test(slow_subscriber_leaves_its_place_and_is_aborted_after_the_grace),
		cmocka_unit_test(unsubscribe_mid_flight_frees_its_queue_and_spares_the_others),
		cmocka_unit_test(failed_send_stops_sending_without_a_status),
		cmocka_unit_test(late_subscriber_does_not_get_events_notified_before_it_registered),
		cmocka_unit_test(full_dispatch_queue_ends_the_subscribers_it_turns_away),
		cmocka_unit_test(change_without_records_ends_subscribers_with_resume_seq),
		cmocka_unit_test(resume_seq_goes_below_a_truncate_still_queued),
		cmocka_unit_test(notify_without_subscribers_allocates_nothing),
		cmocka_unit_test(notify_out_of_memory_ends_subscribers_with_resume_seq),
		cmocka_unit_test(concurrent_notifies_and_churning_subscribers_keep_order),
		cmocka_unit_test(shutdown_while_notifying_ends_everyone_once),
	};

	return cmocka_run_group_tests(tests, setup_completer,
				      teardown_completer);
}
