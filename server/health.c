/*
 * grpc.health.v1.Health: Check answers from the serving state; Watch
 * streams it. The state is SERVING while the storage answers (the driver's
 * ping, checked every second by a small thread) and until shutdown starts.
 *
 * A Watch stream has at most one message in flight; it always sends the
 * latest state, skipping states that came and went while a send was in
 * flight. On shutdown every stream gets NOT_SERVING and then ends with
 * UNAVAILABLE.
 */
#include <grpc/support/time.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "grpc/health/v1/health.pb-c.h"
#include "log.h"

#define SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING \
	GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define UNKNOWN \
	GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

static int
wanted(struct histd_call *c)
{
	if (!c->watch_known)
		return UNKNOWN;
	return c->srv->serving ? SERVING : NOT_SERVING;
}

/* With health_mu held and nothing in flight. */
static void
send_status(struct histd_call *c, grpc_status_code code, const char *msg)
{
	grpc_op ops[2];
	size_t n = 0;

	memset(ops, 0, sizeof(ops));
	c->status_started = 1;
	if (!c->md_sent) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
		c->md_sent = 1;
	}
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = code;
	c->st_code = code;
	if (msg) {
		c->status_details = grpc_slice_from_copied_string(msg);
		c->has_details = 1;
		ops[n].data.send_status_from_server.status_details =
			&c->status_details;
	}
	n++;
	histd_call_ref(c);
	if (histd_call_start_batch(c, ops, n, &c->t_status) != GRPC_CALL_OK)
		histd_call_unref(c);
}

/* Sends the latest state if it differs from the last sent. With
 * health_mu held. */
static void
kick(struct histd_call *c)
{
	Grpc__Health__V1__HealthCheckResponse resp =
		GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	grpc_op ops[2];
	size_t n = 0, len;
	grpc_slice sl;
	int want;

	if (c->in_flight || c->closed || c->status_started)
		return;
	want = wanted(c);
	if (want == c->watch_sent) {
		/* Shutting down: the last state went out, now the end. */
		if (c->finish_pending)
			send_status(c, GRPC_STATUS_UNAVAILABLE,
				    "server is shutting down");
		return;
	}
	resp.status = want;
	len = grpc__health__v1__health_check_response__get_packed_size(&resp);
	sl = grpc_slice_malloc(len);
	grpc__health__v1__health_check_response__pack(&resp,
						      GRPC_SLICE_START_PTR(sl));
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
	c->watch_sent = want;
	if (histd_call_start_batch(c, ops, n, &c->t_send) != GRPC_CALL_OK) {
		c->in_flight = 0;
		grpc_byte_buffer_destroy(c->send_buf);
		c->send_buf = NULL;
		histd_call_unref(c);
	}
}

static void
kick_all(struct histd_server *s)
{
	for (struct histd_call *c = s->watchers; c; c = c->watch_next)
		kick(c);
}

static int
probe(struct histd_server *s)
{
	return !atomic_load(&s->shutting_down) &&
	       histd_driver_ping(histd_service_driver(s->svc)) == 0;
}

static void *
health_thread(void *arg)
{
	struct histd_server *s = arg;

	pthread_mutex_lock(&s->health_mu);
	while (!s->health_stop) {
		struct timespec until;
		int now;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 1;
		pthread_cond_timedwait(&s->health_cv, &s->health_mu, &until);
		if (s->health_stop)
			break;
		/* The ping may block (a database): not under the lock. */
		pthread_mutex_unlock(&s->health_mu);
		now = probe(s);
		pthread_mutex_lock(&s->health_mu);
		if (now != s->serving && !s->health_stop) {
			s->serving = now;
			histd_log(now ? HISTD_LOG_INFO : HISTD_LOG_WARN,
				  now ? "storage answers: serving" :
					"storage does not answer: not serving",
				  NULL);
			kick_all(s);
		}
	}
	pthread_mutex_unlock(&s->health_mu);
	return NULL;
}

void
histd_health_start(struct histd_server *s)
{
	pthread_mutex_init(&s->health_mu, NULL);
	pthread_cond_init(&s->health_cv, NULL);
	s->serving = probe(s);
	s->health_stop = 0;
	pthread_create(&s->health_thread, NULL, health_thread, s);
}

void
histd_health_stop(struct histd_server *s)
{
	pthread_mutex_lock(&s->health_mu);
	s->health_stop = 1;
	s->serving = 0;
	/* Each stream says NOT_SERVING, then ends. */
	for (struct histd_call *c = s->watchers; c; c = c->watch_next) {
		c->finish_pending = 1;
		kick(c);
	}
	pthread_cond_broadcast(&s->health_cv);
	pthread_mutex_unlock(&s->health_mu);
	pthread_join(s->health_thread, NULL);
}

void
histd_health_watch_begin(struct histd_call *c)
{
	struct histd_server *s = c->srv;
	Grpc__Health__V1__HealthCheckRequest *req;
	grpc_slice bytes;
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->cancelled;
	histd_call_ref(c);
	if (histd_call_start_batch(c, &op, 1, &c->t_close) != GRPC_CALL_OK) {
		histd_call_unref(c);
		return;
	}
	c->watch_sent = -1;
	if (histd_call_request_bytes(c, &bytes) != 0) {
		pthread_mutex_lock(&s->health_mu);
		send_status(c, GRPC_STATUS_INVALID_ARGUMENT,
			    "request has no message");
		pthread_mutex_unlock(&s->health_mu);
		return;
	}
	req = grpc__health__v1__health_check_request__unpack(
		NULL, GRPC_SLICE_LENGTH(bytes), GRPC_SLICE_START_PTR(bytes));
	grpc_slice_unref(bytes);
	pthread_mutex_lock(&s->health_mu);
	if (!req) {
		send_status(c, GRPC_STATUS_INVALID_ARGUMENT,
			    "request does not decode as "
			    "grpc.health.v1.HealthCheckRequest");
		pthread_mutex_unlock(&s->health_mu);
		return;
	}
	c->watch_known = req->service[0] == '\0' ||
			 strcmp(req->service, "histd.v1.HistoryService") == 0;
	grpc__health__v1__health_check_request__free_unpacked(req, NULL);
	if (s->health_stop) {
		c->finish_pending = 1;
		c->watch_listed = 0;
	} else {
		c->watch_next = s->watchers;
		c->watch_prev = NULL;
		if (s->watchers)
			s->watchers->watch_prev = c;
		s->watchers = c;
		c->watch_listed = 1;
		histd_call_ref(c);      /* the list's */
	}
	kick(c);
	pthread_mutex_unlock(&s->health_mu);
}

static void
unlist(struct histd_call *c)
{
	struct histd_server *s = c->srv;

	if (!c->watch_listed)
		return;
	if (c->watch_prev)
		c->watch_prev->watch_next = c->watch_next;
	else
		s->watchers = c->watch_next;
	if (c->watch_next)
		c->watch_next->watch_prev = c->watch_prev;
	c->watch_listed = 0;
}

void
histd_health_on_send(struct histd_call *c, int ok)
{
	struct histd_server *s = c->srv;

	pthread_mutex_lock(&s->health_mu);
	(void)ok;  /* a failed send: the status batch fails too, harmlessly */
	c->in_flight = 0;
	grpc_byte_buffer_destroy(c->send_buf);
	c->send_buf = NULL;
	kick(c);
	pthread_mutex_unlock(&s->health_mu);
	histd_call_unref(c);
}

void
histd_health_on_close(struct histd_call *c)
{
	struct histd_server *s = c->srv;
	int listed;

	pthread_mutex_lock(&s->health_mu);
	c->closed = 1;
	listed = c->watch_listed;
	unlist(c);
	pthread_mutex_unlock(&s->health_mu);
	if (listed)
		histd_call_unref(c);
	histd_call_unref(c);
}
