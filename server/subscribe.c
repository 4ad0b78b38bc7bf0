/*
 * Subscribe: a server-streaming call glued to the hub.
 *
 * Order at the start, so that the switch from replay to live has no gap
 * and no duplicate: register with the hub first (live events queue up),
 * then read the snapshot from the driver (which reports the revision it
 * read at), then hand the replay to the hub, which drops the queued live
 * events the snapshot already holds.
 *
 * One SEND_MESSAGE at a time (gRPC core refuses a second and leaves the
 * slot busy for good): the hub calls stream_send only when no send is in
 * flight, and we track it under the call's mutex anyway. The status goes
 * out after the send in flight, if any, completes.
 *
 * The replay is read in parts of REPLAY_PAGE messages, each once the one
 * before is sent (the hub asks through stream_more, which posts t_more;
 * the read runs on a queue thread in histd_subscribe_on_more): a
 * subscriber holds one part, not a whole session, however slowly it
 * reads. A part is the messages stored then with seqs up to the
 * snapshot's last, at the snapshot's revision: messages a later change
 * removed meanwhile are left out, and that change's event follows the
 * replay (revision order holds).
 *
 * Lock order: hub locks, then the call's mutex (the hub calls stream_send,
 * stream_finish and stream_more with its locks held). So nothing here
 * calls into the hub while holding the call's mutex.
 */
#include <grpc/support/alloc.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "call.h"
#include "histd/v1/histd.pb-c.h"
#include "log.h"
#include "status.h"

#define REPLAY_CHUNK 64
/* Messages read for the replay at a time. */
#define REPLAY_PAGE 64

/* The replay still to read. */
struct histd_replay {
	char *tenant;
	char *session_id;
	uint64_t after_seq;     /* the last seq handed to the hub */
	uint64_t to_seq;        /* the snapshot's last seq: later ones are live */
	uint64_t revision;      /* the snapshot's */
	int64_t created_us;     /* of the session the snapshot read */
	uint64_t incarnation;   /* its life (histd_session.incarnation) */
	int have_created;       /* the driver gave the session record */
};

static void
replay_free(struct histd_replay *r)
{
	if (!r)
		return;
	free(r->tenant);
	free(r->session_id);
	free(r);
}

static void
event_slice_unref(void *ev)
{
	histd_tsan_acquire(ev);
	histd_event_unref(ev);
}

/* With c->mu held and no send in flight. */
static void
start_status(struct histd_call *c)
{
	grpc_op ops[2];
	size_t n = 0;
	grpc_call_error err;

	memset(ops, 0, sizeof(ops));
	c->status_started = 1;
	if (!c->md_sent) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->md_sent = 1;
	}
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = c->st_code;
	if (c->has_details)
		ops[n].data.send_status_from_server.status_details =
			&c->status_details;
	if (c->trailer_val[0]) {
		ops[n].data.send_status_from_server.trailing_metadata_count = 1;
		ops[n].data.send_status_from_server.trailing_metadata = c->trailer;
	}
	n++;
	histd_call_ref(c);
	err = histd_call_start_batch(c, ops, n, &c->t_status);
	if (err != GRPC_CALL_OK) {
		histd_log(HISTD_LOG_ERROR, "start_batch (status) failed",
			  "error", grpc_call_error_to_string(err), NULL);
		histd_call_unref(c);
	}
}

/* Records the final status and sends it now or after the send in flight.
 * With c->mu held. */
static void
set_status(struct histd_call *c, grpc_status_code code, const char *msg,
	   const char *trailer_key, uint64_t trailer_num)
{
	if (c->status_started || c->finish_pending)
		return;
	c->st_code = code;
	if (msg && *msg) {
		c->status_details = grpc_slice_from_copied_string(msg);
		c->has_details = 1;
	}
	if (trailer_key) {
		snprintf(c->trailer_val, sizeof(c->trailer_val), "%" PRIu64,
			 trailer_num);
		c->trailer[0].key = grpc_slice_from_static_string(trailer_key);
		c->trailer[0].value = grpc_slice_from_static_string(c->trailer_val);
	}
	if (c->in_flight)
		c->finish_pending = 1;
	else
		start_status(c);
}

static int
stream_send(void *stream, histd_event *ev)
{
	struct histd_call *c = stream;
	grpc_op ops[2];
	size_t n = 0;
	grpc_slice sl;
	grpc_call_error err;

	pthread_mutex_lock(&c->mu);
	if (c->closed || c->status_started || c->finish_pending ||
	    c->in_flight) {
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	/* A key removed from the file (or moved to another tenant) while
	 * its stream was open reads nothing more. */
	if (c->auth_tenant && !histd_auth_still_valid(c->srv->auth,
						     c->auth_tenant)) {
		set_status(c, GRPC_STATUS_UNAUTHENTICATED, "the API key is no "
			   "longer valid (removed from the keys file, or moved "
			   "to another tenant)", NULL, 0);
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	histd_event_ref(ev);
	histd_tsan_release(ev);
	sl = grpc_slice_new_with_user_data(ev->data, ev->len,
					   event_slice_unref, ev);
	c->send_buf = grpc_raw_byte_buffer_create(&sl, 1);
	grpc_slice_unref(sl);
	memset(ops, 0, sizeof(ops));
	if (!c->md_sent) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->md_sent = 1;
	}
	ops[n].op = GRPC_OP_SEND_MESSAGE;
	ops[n].data.send_message.send_message = c->send_buf;
	n++;
	histd_call_ref(c);
	c->in_flight = 1;
	err = histd_call_start_batch(c, ops, n, &c->t_send);
	if (err != GRPC_CALL_OK) {
		c->in_flight = 0;
		grpc_byte_buffer_destroy(c->send_buf);
		c->send_buf = NULL;
		pthread_mutex_unlock(&c->mu);
		histd_call_unref(c);
		return -1;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

static void
stream_finish(void *stream, int err, const char *msg, uint64_t resume_after_seq)
{
	struct histd_call *c = stream;

	pthread_mutex_lock(&c->mu);
	set_status(c, histd_status_from_error(err), msg,
		   err == HISTD_ELIMIT ? "histd-resume-after-seq" : NULL,
		   resume_after_seq);
	pthread_mutex_unlock(&c->mu);
}

/* The hub wants the next part of the replay: read it on a queue thread. */
static int
stream_more(void *stream)
{
	struct histd_call *c = stream;
	grpc_call_error err;

	pthread_mutex_lock(&c->mu);
	if (c->closed || c->status_started || c->finish_pending ||
	    !c->replay) {
		pthread_mutex_unlock(&c->mu);
		return -1;
	}
	c->more_pending++;
	histd_call_ref(c);
	err = histd_call_start_batch(c, NULL, 0, &c->t_more);
	if (err != GRPC_CALL_OK) {
		c->more_pending--;
		pthread_mutex_unlock(&c->mu);
		histd_call_unref(c);
		return -1;
	}
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* The client read nothing for --subscriber-end-grace after its stream was
 * ended as too slow: its status cannot pass the send in flight, so cancel
 * the call, which frees it (and its place) on our side. */
static void
stream_abort(void *stream, const char *msg)
{
	struct histd_call *c = stream;

	pthread_mutex_lock(&c->mu);
	if (!c->closed) {
		histd_log(HISTD_LOG_INFO, "subscriber cancelled", "reason", msg,
			  NULL);
		grpc_call_cancel_with_status(c->call,
					     GRPC_STATUS_RESOURCE_EXHAUSTED,
					     msg, NULL);
	}
	pthread_mutex_unlock(&c->mu);
}

static const histd_sub_ops sub_ops = {
	.send = stream_send,
	.finish = stream_finish,
	.more = stream_more,
	.abort = stream_abort,
};

/* Unsubscribes once the call is over and no send, hub call or replay read
 * is pending: after it the hub forgets the stream and never calls it
 * again, and the replay's state goes. */
static void
maybe_unsubscribe(struct histd_call *c)
{
	histd_sub *sub = NULL;
	struct histd_replay *r = NULL;

	pthread_mutex_lock(&c->mu);
	if (c->closed && !c->in_flight && !c->hub_calling &&
	    !c->more_pending && c->sub && !c->unsubscribed) {
		c->unsubscribed = 1;
		sub = c->sub;
		r = c->replay;
		c->replay = NULL;
	}
	pthread_mutex_unlock(&c->mu);
	if (sub)
		histd_hub_unsubscribe(sub);
	replay_free(r);
}

/* Ends a call that never reached the hub. */
static void
fail(struct histd_call *c, int err)
{
	pthread_mutex_lock(&c->mu);
	set_status(c, histd_status_from_error(err), histd_error_message(),
		   NULL, 0);
	pthread_mutex_unlock(&c->mu);
}

/*
 * How many messages a replay holds, from its first part's read (with the
 * session record): all stored ones when it is a Replaced event; else those
 * after after_seq, where seqs have no gap (a removal leaves one only at or
 * below cleared_to_seq, which is below after_seq here), so at most the
 * stored count.
 */
static uint64_t
replay_count(const histd_read_result *res, int replaced, uint64_t after_seq)
{
	uint64_t n = res->last_seq - after_seq;

	if (!res->session)
		return replaced ? res->records.n : n;
	if (replaced || res->session->message_count < n)
		return res->session->message_count;
	return n;
}

/* Records in c->replay where the rest of the replay is, after the part
 * read by q into res. 0 or ENOMEM. */
static int
replay_new(struct histd_call *c, const histd_read *q,
	   const histd_read_result *res)
{
	struct histd_replay *r = calloc(1, sizeof(*r));

	if (!r || !(r->tenant = strdup(q->tenant)) ||
	    !(r->session_id = strdup(q->session_id))) {
		replay_free(r);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	r->after_seq = res->records.v[res->records.n - 1].seq;
	r->to_seq = res->last_seq;
	r->revision = res->revision;
	r->have_created = res->session != NULL;
	r->created_us = res->session ? res->session->created_at_us : 0;
	r->incarnation = res->session ? res->session->incarnation : 0;
	pthread_mutex_lock(&c->mu);
	c->replay = r;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/*
 * Reads the next part of the replay into events at the snapshot's
 * revision; *more says whether another part follows. A session deleted
 * (or deleted and created again) meanwhile ends the replay: its `deleted`
 * event follows. 0, or an error to end the stream with.
 */
static int
replay_next(struct histd_call *c, struct histd_replay *r,
	    histd_event ***evs, size_t *n_evs, int *more)
{
	histd_read q = { 0 };
	histd_read_result res = { 0 };
	histd_records part;
	size_t n;
	int rc;

	*more = 0;
	q.tenant = r->tenant;
	q.session_id = r->session_id;
	q.after_seq = r->after_seq;
	q.limit = REPLAY_PAGE;
	q.want_session = 1;
	rc = histd_driver_read(histd_service_driver(c->srv->svc), &q, &res);
	if (rc == HISTD_ENOTFOUND ||
	    (rc == 0 && r->have_created &&
	     (!res.session || res.session->created_at_us != r->created_us ||
	      res.session->incarnation != r->incarnation))) {
		histd_read_result_clear(&res);
		return 0;
	}
	for (n = 0; rc == 0 && n < res.records.n &&
		    res.records.v[n].seq <= r->to_seq; n++)
		;
	if (rc == 0 && n) {
		part = res.records;
		part.n = n;
		r->after_seq = res.records.v[n - 1].seq;
		*more = res.has_more && n == res.records.n &&
			r->after_seq < r->to_seq;
		rc = histd_event_replay(r->session_id, r->revision, &part, 0,
					0, REPLAY_CHUNK,
					c->srv->cfg->service.max_response_bytes,
					evs, n_evs);
	}
	histd_read_result_clear(&res);
	return rc;
}

void
histd_subscribe_on_more(struct histd_call *c)
{
	histd_sub *sub = NULL;
	struct histd_replay *r;
	histd_event **evs = NULL;
	size_t n = 0;
	int more = 0, rc;

	/* more_pending, counted until the end, keeps the subscriber from
	 * being unsubscribed meanwhile. It is a count: once this part's
	 * events are handed over, their send may complete and post the next
	 * part's read before this one has finished here. */
	pthread_mutex_lock(&c->mu);
	r = c->replay;
	if (!c->closed && c->sub && !c->unsubscribed)
		sub = c->sub;
	pthread_mutex_unlock(&c->mu);
	if (sub) {
		rc = replay_next(c, r, &evs, &n, &more);
		if (rc != 0) {
			/* The stream ends with the error; the hub's next send
			 * finds it ending and stops. */
			pthread_mutex_lock(&c->mu);
			set_status(c, histd_status_from_error(rc),
				   histd_error_message(), NULL, 0);
			pthread_mutex_unlock(&c->mu);
		}
		histd_hub_replay_more(sub, evs, n, more);
		free(evs);
	}
	pthread_mutex_lock(&c->mu);
	c->more_pending--;
	pthread_mutex_unlock(&c->mu);
	maybe_unsubscribe(c);
	histd_call_unref(c);
}

void
histd_subscribe_begin(struct histd_call *c)
{
	struct histd_server *s = c->srv;
	Histd__V1__SubscribeRequest *req = NULL;
	histd_read q = { 0 };
	histd_read_result res = { 0 };
	histd_event **replay = NULL;
	size_t n_replay = 0;
	uint64_t snapshot_revision = 0, incarnation = 0;
	histd_caller who;
	grpc_op op;
	grpc_slice bytes;
	histd_sub *sub = NULL;
	int replaced, more = 0, rc;

	/* Learn of cancellation, deadline and the end of the call. */
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->cancelled;
	histd_call_ref(c);
	if (histd_call_start_batch(c, &op, 1, &c->t_close) != GRPC_CALL_OK) {
		histd_call_unref(c);
		return;
	}

	/* Who calls, first: an unauthenticated caller learns nothing, not
	 * even what is wrong with its request (as for unary calls). */
	if ((rc = histd_call_caller(c, &who, HISTD_COUNT_STREAM)) != 0) {
		fail(c, rc);
		return;
	}
	if (s->auth)
		c->auth_tenant = who.tenant;
	if (histd_call_request_bytes(c, &bytes) != 0) {
		fail(c, histd_error_set(HISTD_EINVALID, "request has no message"));
		return;
	}
	if ((rc = histd_check_request_bytes(&histd__v1__subscribe_request__descriptor,
					    GRPC_SLICE_START_PTR(bytes),
					    GRPC_SLICE_LENGTH(bytes))) != 0) {
		grpc_slice_unref(bytes);
		fail(c, rc);
		return;
	}
	req = histd__v1__subscribe_request__unpack(NULL, GRPC_SLICE_LENGTH(bytes),
						   GRPC_SLICE_START_PTR(bytes));
	grpc_slice_unref(bytes);
	if (!req) {
		fail(c, histd_error_set(HISTD_EINVALID, "request does not decode "
					"as histd.v1.SubscribeRequest"));
		return;
	}
	rc = histd_check_session_id(req->session_id, "session_id");
	if (rc != 0)
		goto out_fail;

	rc = histd_hub_subscribe(s->hub, who.tenant, req->session_id,
				 req->after_seq, &sub_ops, c, &sub);
	if (rc != 0)
		goto out_fail;

	q.tenant = who.tenant;
	q.session_id = req->session_id;
	q.after_seq = req->after_seq;
	q.limit = REPLAY_PAGE;
	q.want_session = 1;
	rc = histd_driver_read(histd_service_driver(s->svc), &q, &res);
	/* Seqs are never reused: a subscriber past the last one holds another
	 * session's seqs (one deleted and created again under the id). */
	if (rc == 0 && req->after_seq > res.last_seq)
		rc = histd_error_set(HISTD_EINVALID, "after_seq %" PRIu64
				     " is past the session's last seq %" PRIu64,
				     req->after_seq, res.last_seq);
	/* Cleared at or after after_seq: the replay is one Replaced event
	 * holding every stored message (those past the size of one event in
	 * Appended events after it), also the system messages at or below
	 * after_seq that a truncate (retention) kept. At after_seq equal to
	 * cleared_to_seq the subscriber may have seen those seqs stored, so it
	 * must learn they are gone. */
	replaced = res.cleared_to_seq > 0 && res.cleared_to_seq >= q.after_seq;
	if (rc == 0 && replaced && q.after_seq > 0) {
		histd_read_result_clear(&res);
		q.after_seq = 0;
		rc = histd_driver_read(histd_service_driver(s->svc), &q, &res);
	}
	if (rc == 0 && replay_count(&res, replaced, req->after_seq) >
		       s->cfg->replay_max)
		rc = histd_error_set(HISTD_ELIMIT, "replay of more than %" PRIu32
				     " messages; read them with GetMessages and "
				     "subscribe from a later after_seq",
				     s->cfg->replay_max);
	if (rc == 0 && res.has_more && res.records.n) {
		rc = replay_new(c, &q, &res);
		more = rc == 0;
	}
	snapshot_revision = res.revision;
	incarnation = res.session ? res.session->incarnation : 0;
	if (rc == 0)
		rc = histd_event_replay(req->session_id, res.revision,
					&res.records,
					replaced,
					res.cleared_to_seq, REPLAY_CHUNK,
					s->cfg->service.max_response_bytes,
					&replay, &n_replay);
	histd_read_result_clear(&res);
	if (rc != 0) {
		/* Never started: nothing was sent, so unsubscribe now. */
		histd_hub_unsubscribe(sub);
		pthread_mutex_lock(&c->mu);
		replay_free(c->replay);
		c->replay = NULL;
		pthread_mutex_unlock(&c->mu);
		goto out_fail;
	}

	/* Counted as a hub call: a close meanwhile must not unsubscribe
	 * (and free) sub under histd_hub_start_replay. */
	pthread_mutex_lock(&c->mu);
	c->sub = sub;
	c->hub_calling++;
	pthread_mutex_unlock(&c->mu);
	histd__v1__subscribe_request__free_unpacked(req, NULL);
	histd_hub_start_replay(sub, replay, n_replay, snapshot_revision,
			       incarnation, more);
	free(replay);
	pthread_mutex_lock(&c->mu);
	c->hub_calling--;
	pthread_mutex_unlock(&c->mu);
	/* The client may have gone while we read the snapshot. */
	maybe_unsubscribe(c);
	return;

out_fail:
	histd__v1__subscribe_request__free_unpacked(req, NULL);
	fail(c, rc);
}

void
histd_subscribe_on_send(struct histd_call *c, int ok)
{
	histd_sub *sub = NULL;

	pthread_mutex_lock(&c->mu);
	c->in_flight = 0;
	grpc_byte_buffer_destroy(c->send_buf);
	c->send_buf = NULL;
	if (c->finish_pending) {
		c->finish_pending = 0;
		start_status(c);
	}
	if (c->sub && !c->unsubscribed) {
		sub = c->sub;
		c->hub_calling++;
	}
	pthread_mutex_unlock(&c->mu);
	if (sub) {
		histd_hub_sent(sub, ok);
		pthread_mutex_lock(&c->mu);
		c->hub_calling--;
		pthread_mutex_unlock(&c->mu);
	}
	maybe_unsubscribe(c);
	histd_call_unref(c);
}

void
histd_subscribe_on_close(struct histd_call *c)
{
	pthread_mutex_lock(&c->mu);
	c->closed = 1;
	pthread_mutex_unlock(&c->mu);
	maybe_unsubscribe(c);
	histd_call_unref(c);
}

void
histd_subscribe_on_status(struct histd_call *c, int ok)
{
	(void)ok;
	histd_call_unref(c);
}
