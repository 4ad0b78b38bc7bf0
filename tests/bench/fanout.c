/*
 * The Subscribe fan-out phase. See fanout.h.
 *
 * A stream has at most three batches outstanding: the start (send the
 * request, receive initial metadata), one RECV_MESSAGE at a time, and
 * RECV_STATUS_ON_CLIENT. `outstanding` counts every batch of every stream
 * and append, so that close frees nothing a worker may still touch.
 */
#include "fanout.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/support/time.h>

#include "histd/v1/histd.pb-c.h"

#define KEY_SENT "bench-sent-ns"
#define KEY_PUMP "bench-pump"

struct sub;

struct sub_tag {
	bench_tag tag;               /* first */
	struct sub *s;
};

struct sub {
	bench_fanout *f;
	size_t idx;
	struct sub_tag t_start, t_recv, t_status;
	grpc_call *call;
	grpc_byte_buffer *request;
	grpc_byte_buffer *recv;
	grpc_metadata_array initial_md, trailing_md;
	grpc_status_code status;
	grpc_slice details;
	atomic_uint_fast64_t last_seq;   /* highest seq received */
	atomic_int ended;                /* its status arrived */
	pthread_mutex_t mu;              /* guards the three below */
	bench_lat lat;
	uint64_t deliveries;
	uint64_t last_recv_ns;
};

struct app {
	bench_unary u;               /* first: u.tag is the batch tag */
	bench_fanout *f;
	uint64_t sent_ns;
};

struct bench_fanout {
	bench_client *c;
	bench_fanout_spec spec;
	char *text;
	struct sub *subs;
	size_t n_subs;
	atomic_size_t outstanding;   /* batches not yet completed */
	atomic_int pump;             /* the pump whose deliveries count */
	atomic_int closing;

	pthread_mutex_t mu;          /* guards everything below */
	struct app *apps;
	struct app **free_apps;
	size_t n_free;
	size_t in_flight;
	uint64_t app_ok, app_errors;
	grpc_status_code first_app_error;
	char first_app_details[160];
	bench_lat app_lat;
	uint64_t pump_max_seq;       /* last seq appended in this pump */
	uint64_t last_app_done_ns;
	size_t ended;
	grpc_status_code first_end_status;
	char first_end_details[160];
};

static void sleep_until_ns(uint64_t t)
{
	struct timespec ts = { .tv_sec = (time_t)(t / 1000000000u),
			       .tv_nsec = (long)(t % 1000000000u) };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static void sleep_ms(long ms)
{
	sleep_until_ns(bench_now_ns() + (uint64_t)ms * 1000000u);
}

static void copy_details(grpc_slice s, char *buf, size_t size)
{
	size_t n = GRPC_SLICE_LENGTH(s);

	if (n >= size)
		n = size - 1;
	memcpy(buf, GRPC_SLICE_START_PTR(s), n);
	buf[n] = '\0';
}

/* ---------------------------------------------------------------------
 * Streams */

static void sub_start_recv(struct sub *s);

/* Records one received message of an event. */
static void sub_note(struct sub *s, const Histd__V1__Message *m, int pump,
		     uint64_t now)
{
	uint64_t sent = 0;
	int from = -1;

	for (size_t i = 0; i < m->n_metadata; i++) {
		const Histd__V1__Message__MetadataEntry *e = m->metadata[i];

		if (strcmp(e->key, KEY_SENT) == 0)
			sent = strtoull(e->value, NULL, 10);
		else if (strcmp(e->key, KEY_PUMP) == 0)
			from = atoi(e->value);
	}
	if (from == pump && sent && now >= sent) {
		pthread_mutex_lock(&s->mu);
		bench_lat_add(&s->lat, now - sent);
		s->deliveries++;
		s->last_recv_ns = now;
		pthread_mutex_unlock(&s->mu);
	}
	/* After the sample: whoever sees the seq also sees the sample. */
	if (m->seq > atomic_load(&s->last_seq))
		atomic_store(&s->last_seq, m->seq);
}

static void sub_event(struct sub *s, const uint8_t *data, size_t len,
		      uint64_t now)
{
	Histd__V1__HistoryEvent *ev =
		histd__v1__history_event__unpack(NULL, len, data);
	int pump = atomic_load(&s->f->pump);

	if (!ev)
		return;
	if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_APPENDED) {
		for (size_t i = 0; i < ev->appended->n_messages; i++)
			sub_note(s, ev->appended->messages[i], pump, now);
	} else if (ev->event_case == HISTD__V1__HISTORY_EVENT__EVENT_REPLACED) {
		for (size_t i = 0; i < ev->replaced->n_messages; i++)
			sub_note(s, ev->replaced->messages[i], pump, now);
	}
	histd__v1__history_event__free_unpacked(ev, NULL);
}

static void sub_start_done(bench_tag *t, int ok)
{
	struct sub *s = ((struct sub_tag *)t)->s;

	/* Not ok: the call failed; its status batch says why. */
	if (ok)
		sub_start_recv(s);
	atomic_fetch_sub(&s->f->outstanding, 1);
}

static void sub_recv_done(bench_tag *t, int ok)
{
	struct sub *s = ((struct sub_tag *)t)->s;
	uint64_t now = bench_now_ns();

	if (ok && s->recv) {
		size_t len;
		uint8_t *data = bench_flatten(s->recv, &len);

		grpc_byte_buffer_destroy(s->recv);
		s->recv = NULL;
		if (data)
			sub_event(s, data, len, now);
		free(data);
		sub_start_recv(s);
	}
	/* Else the stream is over: the status batch completes it. */
	atomic_fetch_sub(&s->f->outstanding, 1);
}

static void sub_status_done(bench_tag *t, int ok)
{
	struct sub *s = ((struct sub_tag *)t)->s;
	bench_fanout *f = s->f;

	(void)ok;
	atomic_store(&s->ended, 1);
	if (!atomic_load(&f->closing)) {
		pthread_mutex_lock(&f->mu);
		if (f->ended++ == 0) {
			f->first_end_status = s->status;
			copy_details(s->details, f->first_end_details,
				     sizeof(f->first_end_details));
		}
		pthread_mutex_unlock(&f->mu);
	}
	atomic_fetch_sub(&f->outstanding, 1);
}

static void sub_start_recv(struct sub *s)
{
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &s->recv;
	atomic_fetch_add(&s->f->outstanding, 1);
	if (grpc_call_start_batch(s->call, &op, 1, &s->t_recv.tag, NULL) !=
	    GRPC_CALL_OK)
		atomic_fetch_sub(&s->f->outstanding, 1);
}

static int sub_open(bench_fanout *f, struct sub *s, grpc_slice req)
{
	grpc_op ops[4], st;

	s->call = bench_client_call(f->c, BENCH_M_SUBSCRIBE, s->idx,
				    gpr_inf_future(GPR_CLOCK_REALTIME));
	if (!s->call)
		return -1;
	s->request = grpc_raw_byte_buffer_create(&req, 1);

	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = s->request;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata =
		&s->initial_md;
	memset(&st, 0, sizeof(st));
	st.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	st.data.recv_status_on_client.trailing_metadata = &s->trailing_md;
	st.data.recv_status_on_client.status = &s->status;
	st.data.recv_status_on_client.status_details = &s->details;

	atomic_fetch_add(&f->outstanding, 1);
	if (grpc_call_start_batch(s->call, &st, 1, &s->t_status.tag, NULL) !=
	    GRPC_CALL_OK) {
		atomic_fetch_sub(&f->outstanding, 1);
		return -1;
	}
	atomic_fetch_add(&f->outstanding, 1);
	if (grpc_call_start_batch(s->call, ops, 4, &s->t_start.tag, NULL) !=
	    GRPC_CALL_OK) {
		atomic_fetch_sub(&f->outstanding, 1);
		grpc_call_cancel(s->call, NULL);   /* ends the status batch */
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------------
 * Appends */

static void append_done(bench_unary *u)
{
	struct app *a = u->arg;
	bench_fanout *f = a->f;
	uint64_t now = bench_now_ns();
	uint64_t last_seq = 0;

	if (u->status == GRPC_STATUS_OK) {
		size_t len;
		uint8_t *data = bench_flatten(u->response, &len);
		Histd__V1__AppendResponse *r =
			data ? histd__v1__append_response__unpack(NULL, len, data)
			     : NULL;

		if (r) {
			last_seq = r->last_seq;
			histd__v1__append_response__free_unpacked(r, NULL);
		}
		free(data);
	}
	pthread_mutex_lock(&f->mu);
	if (u->status == GRPC_STATUS_OK) {
		f->app_ok++;
		bench_lat_add(&f->app_lat, now - a->sent_ns);
		if (last_seq > f->pump_max_seq)
			f->pump_max_seq = last_seq;
	} else if (f->app_errors++ == 0) {
		f->first_app_error = u->status;
		bench_unary_details(u, f->first_app_details,
				    sizeof(f->first_app_details));
	}
	if (now > f->last_app_done_ns)
		f->last_app_done_ns = now;
	bench_unary_release(u);
	f->free_apps[f->n_free++] = a;
	f->in_flight--;
	pthread_mutex_unlock(&f->mu);
	atomic_fetch_sub(&f->outstanding, 1);
}

/* The packed AppendRequest of one message stamped with the send time. */
static grpc_slice append_request(bench_fanout *f, uint64_t sent, int pump)
{
	char sent_s[24], pump_s[16];
	Histd__V1__TextBlock text = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock block = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &block };
	Histd__V1__Message__MetadataEntry md[2] = {
		HISTD__V1__MESSAGE__METADATA_ENTRY__INIT,
		HISTD__V1__MESSAGE__METADATA_ENTRY__INIT
	};
	Histd__V1__Message__MetadataEntry *mds[2] = { &md[0], &md[1] };
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	Histd__V1__Message *msgs[1] = { &msg };
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;

	snprintf(sent_s, sizeof(sent_s), "%" PRIu64, sent);
	snprintf(pump_s, sizeof(pump_s), "%d", pump);
	text.text = f->text;
	block.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	block.text = &text;
	md[0].key = KEY_SENT;
	md[0].value = sent_s;
	md[1].key = KEY_PUMP;
	md[1].value = pump_s;
	msg.role = HISTD__V1__ROLE__ROLE_USER;
	msg.author = "histd-bench";
	msg.n_content = 1;
	msg.content = blocks;
	msg.n_metadata = 2;
	msg.metadata = mds;
	req.session_id = (char *)f->spec.session_id;
	req.n_messages = 1;
	req.messages = msgs;
	return bench_pack(&req.base);
}

/* Starts one append now; 1 if started, 0 if skipped (max in flight). */
static int append_one(bench_fanout *f, size_t i, int pump)
{
	struct app *a;
	grpc_slice req;
	int rc;

	pthread_mutex_lock(&f->mu);
	if (f->n_free == 0) {
		pthread_mutex_unlock(&f->mu);
		return 0;
	}
	a = f->free_apps[--f->n_free];
	f->in_flight++;
	pthread_mutex_unlock(&f->mu);

	a->sent_ns = bench_now_ns();
	req = append_request(f, a->sent_ns, pump);
	atomic_fetch_add(&f->outstanding, 1);
	rc = bench_unary_start(f->c, &a->u, BENCH_M_APPEND, i, req, 30.0);
	grpc_slice_unref(req);
	if (rc != 0) {
		atomic_fetch_sub(&f->outstanding, 1);
		pthread_mutex_lock(&f->mu);
		if (f->app_errors++ == 0) {
			f->first_app_error = GRPC_STATUS_INTERNAL;
			snprintf(f->first_app_details,
				 sizeof(f->first_app_details),
				 "the client could not start an Append");
		}
		f->free_apps[f->n_free++] = a;
		f->in_flight--;
		pthread_mutex_unlock(&f->mu);
	}
	return 1;
}

/* ---------------------------------------------------------------------
 * Phase */

int bench_fanout_open(bench_fanout **out, bench_client *c,
		      const bench_fanout_spec *spec, double timeout_s)
{
	bench_fanout *f;
	Histd__V1__SubscribeRequest sreq = HISTD__V1__SUBSCRIBE_REQUEST__INIT;
	grpc_slice req;
	bench_fanout_result r;
	size_t opened = 0;

	*out = NULL;
	if (spec->subscribers == 0 || spec->rate <= 0 || spec->max_in_flight == 0)
		return -1;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -1;
	f->c = c;
	f->spec = *spec;
	atomic_init(&f->outstanding, 0);
	atomic_init(&f->pump, 0);
	atomic_init(&f->closing, 0);
	pthread_mutex_init(&f->mu, NULL);
	f->text = malloc(spec->message_size + 1);
	f->subs = calloc(spec->subscribers, sizeof(*f->subs));
	f->apps = calloc(spec->max_in_flight, sizeof(*f->apps));
	f->free_apps = calloc(spec->max_in_flight, sizeof(*f->free_apps));
	if (!f->text || !f->subs || !f->apps || !f->free_apps) {
		bench_fanout_close(f);
		return -1;
	}
	for (size_t i = 0; i < spec->message_size; i++)
		f->text[i] = (char)('a' + (i * 7 + i / 26) % 26);
	f->text[spec->message_size] = '\0';
	for (size_t i = 0; i < spec->max_in_flight; i++) {
		f->apps[i].f = f;
		f->apps[i].u.arg = &f->apps[i];
		f->apps[i].u.on_done = append_done;
		f->free_apps[f->n_free++] = &f->apps[i];
	}

	sreq.session_id = (char *)spec->session_id;
	sreq.after_seq = 0;
	req = bench_pack(&sreq.base);
	for (size_t i = 0; i < spec->subscribers; i++) {
		struct sub *s = &f->subs[i];

		s->f = f;
		s->idx = i;
		s->t_start = (struct sub_tag){ { sub_start_done }, s };
		s->t_recv = (struct sub_tag){ { sub_recv_done }, s };
		s->t_status = (struct sub_tag){ { sub_status_done }, s };
		grpc_metadata_array_init(&s->initial_md);
		grpc_metadata_array_init(&s->trailing_md);
		s->details = grpc_empty_slice();
		atomic_init(&s->last_seq, 0);
		atomic_init(&s->ended, 0);
		pthread_mutex_init(&s->mu, NULL);
		f->n_subs++;
		if (sub_open(f, s, req) != 0)
			break;
		opened++;
	}
	grpc_slice_unref(req);
	if (opened != spec->subscribers) {
		fprintf(stderr, "histd-bench: could not start Subscribe call "
			"%zu\n", opened + 1);
		bench_fanout_close(f);
		return -1;
	}

	/* One message every stream must see (after_seq 0 replays it to a
	 * stream the server registered late) before anything is measured. */
	if (bench_fanout_pump(f, 1, 0, timeout_s, &r) != 0 || !r.drained ||
	    r.appends_ok != 1 || r.streams_ended) {
		if (r.appends_ok != 1)
			fprintf(stderr, "histd-bench: fan-out: the first Append "
				"failed: status %d: %s\n", r.first_append_error,
				r.first_append_details);
		else if (r.streams_ended)
			fprintf(stderr, "histd-bench: fan-out: %zu of %zu "
				"Subscribe streams ended at start; first: "
				"status %d: %s\n", r.streams_ended,
				spec->subscribers, r.first_end_status,
				r.first_end_details);
		else
			fprintf(stderr, "histd-bench: fan-out: not every "
				"Subscribe stream received the first message "
				"within %.0f s\n", timeout_s);
		bench_fanout_result_free(&r);
		bench_fanout_close(f);
		return -1;
	}
	bench_fanout_result_free(&r);
	*out = f;
	return 0;
}

/* 1 once every open stream received seq `last`. */
static int all_delivered(bench_fanout *f, uint64_t last)
{
	for (size_t i = 0; i < f->n_subs; i++) {
		struct sub *s = &f->subs[i];

		if (!atomic_load(&s->ended) && atomic_load(&s->last_seq) < last)
			return 0;
	}
	return 1;
}

int bench_fanout_pump(bench_fanout *f, uint64_t count, double duration_s,
		      double drain_s, bench_fanout_result *out)
{
	int pump = atomic_load(&f->pump) + 1;
	uint64_t period = (uint64_t)(1e9 / f->spec.rate);
	uint64_t t0, end, until, last_seq, last_event = 0;
	size_t open_streams = 0;

	memset(out, 0, sizeof(*out));
	/* Samples from here on belong to this pump only. */
	atomic_store(&f->pump, pump);
	for (size_t i = 0; i < f->n_subs; i++) {
		struct sub *s = &f->subs[i];

		pthread_mutex_lock(&s->mu);
		s->lat.n = 0;
		s->deliveries = 0;
		pthread_mutex_unlock(&s->mu);
	}
	pthread_mutex_lock(&f->mu);
	f->app_ok = f->app_errors = 0;
	f->first_app_error = GRPC_STATUS_OK;
	f->first_app_details[0] = '\0';
	f->app_lat.n = 0;
	f->pump_max_seq = 0;
	pthread_mutex_unlock(&f->mu);

	t0 = bench_now_ns();
	end = t0 + (uint64_t)(duration_s * 1e9);
	for (uint64_t i = 0;; i++) {
		uint64_t due = t0 + i * period;

		if (count ? i >= count : due >= end)
			break;
		sleep_until_ns(due);
		if (!append_one(f, (size_t)i, pump))
			out->appends_skipped++;
	}

	/* Every append answered, then every open stream has the last one. */
	until = bench_now_ns() + (uint64_t)(drain_s * 1e9);
	for (;;) {
		size_t in_flight;

		pthread_mutex_lock(&f->mu);
		in_flight = f->in_flight;
		last_seq = f->pump_max_seq;
		pthread_mutex_unlock(&f->mu);
		if (in_flight == 0 && all_delivered(f, last_seq)) {
			out->drained = 1;
			break;
		}
		if (bench_now_ns() >= until)
			break;
		sleep_ms(1);
	}

	pthread_mutex_lock(&f->mu);
	out->appends_ok = f->app_ok;
	out->append_errors = f->app_errors;
	out->first_append_error = f->first_app_error;
	memcpy(out->first_append_details, f->first_app_details,
	       sizeof(out->first_append_details));
	bench_lat_merge(&out->append_lat, &f->app_lat);
	if (f->last_app_done_ns > last_event)
		last_event = f->last_app_done_ns;
	out->streams_ended = f->ended;
	out->first_end_status = f->first_end_status;
	memcpy(out->first_end_details, f->first_end_details,
	       sizeof(out->first_end_details));
	pthread_mutex_unlock(&f->mu);

	for (size_t i = 0; i < f->n_subs; i++) {
		struct sub *s = &f->subs[i];

		if (!atomic_load(&s->ended))
			open_streams++;
		pthread_mutex_lock(&s->mu);
		out->deliveries += s->deliveries;
		bench_lat_merge(&out->delivery_lat, &s->lat);
		if (s->last_recv_ns > last_event)
			last_event = s->last_recv_ns;
		pthread_mutex_unlock(&s->mu);
	}
	out->expected = out->appends_ok * open_streams;
	out->elapsed_s = last_event > t0 ? (double)(last_event - t0) / 1e9 : 0;
	bench_lat_sort(&out->append_lat);
	bench_lat_sort(&out->delivery_lat);
	return 0;
}

void bench_fanout_result_free(bench_fanout_result *r)
{
	bench_lat_free(&r->append_lat);
	bench_lat_free(&r->delivery_lat);
}

void bench_fanout_close(bench_fanout *f)
{
	if (!f)
		return;
	atomic_store(&f->closing, 1);
	for (size_t i = 0; i < f->n_subs; i++)
		if (f->subs[i].call)
			grpc_call_cancel(f->subs[i].call, NULL);
	/* Cancelling completes every pending batch; appends end by their
	 * deadline at the latest. */
	while (atomic_load(&f->outstanding) > 0)
		sleep_ms(1);
	for (size_t i = 0; i < f->n_subs; i++) {
		struct sub *s = &f->subs[i];

		if (s->call)
			grpc_call_unref(s->call);
		if (s->request)
			grpc_byte_buffer_destroy(s->request);
		if (s->recv)
			grpc_byte_buffer_destroy(s->recv);
		grpc_metadata_array_destroy(&s->initial_md);
		grpc_metadata_array_destroy(&s->trailing_md);
		grpc_slice_unref(s->details);
		bench_lat_free(&s->lat);
		pthread_mutex_destroy(&s->mu);
	}
	bench_lat_free(&f->app_lat);
	pthread_mutex_destroy(&f->mu);
	free(f->subs);
	free(f->apps);
	free(f->free_apps);
	free(f->text);
	free(f);
}
