/*
 * gRPC transport on gRPC C core 1.51.
 *
 * One completion queue, served by cfg->threads threads calling
 * grpc_completion_queue_next. Every method is registered; for each, a few
 * requests are kept posted (re-posted before a new call is handled), plus
 * one unregistered request so that unknown methods get UNIMPLEMENTED at
 * once instead of hanging until the client's deadline.
 *
 * Unary calls are answered inline on the queue thread that received them:
 * the service does its work synchronously and the answer goes out in one
 * batch (RECV_CLOSE_ON_SERVER + initial metadata + message + status).
 * Subscribe streams live in subscribe.c.
 */
#include "transport.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "call.h"
#include "grpc/health/v1/health.pb-c.h"
#include "histd_wire.h"
#include "log.h"
#include "metrics.h"
#include "status.h"
#include "auth.h"
#include "tls.h"

#define HEALTH_CHECK_PATH "/grpc.health.v1.Health/Check"
#define REFLECTION_V1_PATH \
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
#define REFLECTION_V1ALPHA_PATH \
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"

struct route_entry {
	const char *path;
	enum histd_route route;
	int method;             /* enum histd_method for HistoryService */
	void *handle;           /* from grpc_server_register_method */
	int metric;             /* histd_metrics_method index */
	const char *name;       /* for metrics and logs */
};

/* Built at start from histd_method_paths plus health and reflection. */
#define MAX_ROUTES (HISTD_M_COUNT + 4)
static struct route_entry routes[MAX_ROUTES];
static int n_routes;

/* Calls in progress of one tenant. */
struct tenant_calls {
	struct tenant_calls *next;
	long calls;
	long streams;
	char name[];
};

static void post_registered(struct histd_server *s, int r);
static void post_unknown(struct histd_server *s);
static void reflection_unlist(struct histd_call *c);

/* ---------------------------------------------------------------------- */
/* Call contexts                                                           */

static struct histd_call *
call_new(struct histd_server *s, enum histd_route route, int method)
{
	struct histd_call *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->srv = s;
	c->route = route;
	c->method = method;
	atomic_init(&c->refs, 1);
	grpc_metadata_array_init(&c->md);
	grpc_call_details_init(&c->details);
	pthread_mutex_init(&c->mu, NULL);
	c->t_new = (struct histd_tag){ TAG_NEW, c };
	c->t_done = (struct histd_tag){ TAG_DONE, c };
	c->t_close = (struct histd_tag){ TAG_CLOSE, c };
	c->t_send = (struct histd_tag){ TAG_SEND, c };
	c->t_status = (struct histd_tag){ TAG_STATUS, c };
	c->t_recv = (struct histd_tag){ TAG_RECV, c };
	c->t_more = (struct histd_tag){ TAG_MORE, c };
	pthread_mutex_lock(&s->live_mu);
	s->live++;
	pthread_mutex_unlock(&s->live_mu);
	return c;
}

void
histd_call_ref(struct histd_call *c)
{
	atomic_fetch_add(&c->refs, 1);
}

void
histd_call_unref(struct histd_call *c)
{
	struct histd_server *s = c->srv;
	int active;

	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	if (c->refl_listed)
		reflection_unlist(c);
	active = c->active;
	if (active && c->route != ROUTE_UNKNOWN)
		histd_metrics_rpc(routes[c->method].metric, c->st_code,
				  histd_mono_us() - c->start_us);
	if (c->tenant) {
		pthread_mutex_lock(&s->tenants_mu);
		if (c->tenant_stream)
			c->tenant->streams--;
		else
			c->tenant->calls--;
		pthread_mutex_unlock(&s->tenants_mu);
	}
	if (c->call)
		grpc_call_unref(c->call);
	if (c->payload)
		grpc_byte_buffer_destroy(c->payload);
	if (c->resp)
		grpc_byte_buffer_destroy(c->resp);
	if (c->send_buf)
		grpc_byte_buffer_destroy(c->send_buf);
	if (c->recv_buf)
		grpc_byte_buffer_destroy(c->recv_buf);
	if (c->has_details)
		grpc_slice_unref(c->status_details);
	grpc_metadata_array_destroy(&c->md);
	grpc_call_details_destroy(&c->details);
	pthread_mutex_destroy(&c->mu);
	free(c);
	pthread_mutex_lock(&s->live_mu);
	if (active)
		s->active--;
	if (--s->live == 0 || s->active == 0)
		pthread_cond_broadcast(&s->live_cv);
	pthread_mutex_unlock(&s->live_mu);
}

int
histd_call_request_bytes(struct histd_call *c, grpc_slice *out)
{
	grpc_byte_buffer *bb = c->payload;
	grpc_byte_buffer_reader reader;

	if (!bb)
		return -1;
	/* One uncompressed slice: use it as it is, no copy. */
	if (bb->type == GRPC_BB_RAW &&
	    bb->data.raw.compression == GRPC_COMPRESS_NONE &&
	    bb->data.raw.slice_buffer.count == 1) {
		*out = grpc_slice_ref(bb->data.raw.slice_buffer.slices[0]);
		return 0;
	}
	if (!grpc_byte_buffer_reader_init(&reader, bb))
		return -1;
	*out = grpc_byte_buffer_reader_readall(&reader);
	grpc_byte_buffer_reader_destroy(&reader);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Answers                                                                 */

/*
 * Sends the whole answer of a unary call in one batch. data (malloc'ed, or
 * NULL) becomes the response message and is freed by gRPC. A trailer
 * "histd-revision" goes with ABORTED.
 */
static void
answer(struct histd_call *c, uint8_t *data, size_t len, grpc_status_code code,
       const char *details, const char *trailer_key, uint64_t trailer_num)
{
	grpc_op ops[4];
	size_t n = 0;
	grpc_call_error err;

	memset(ops, 0, sizeof(ops));
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n].data.recv_close_on_server.cancelled = &c->cancelled;
	n++;
	ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
	n++;
	if (data) {
		grpc_slice sl = grpc_slice_new(data, len, free);

		c->resp = grpc_raw_byte_buffer_create(&sl, 1);
		grpc_slice_unref(sl);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n].data.send_message.send_message = c->resp;
		n++;
	}
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = code;
	c->st_code = code;
	if (details && *details) {
		c->status_details = grpc_slice_from_copied_string(details);
		c->has_details = 1;
		ops[n].data.send_status_from_server.status_details =
			&c->status_details;
	}
	if (trailer_key) {
		snprintf(c->trailer_val, sizeof(c->trailer_val), "%" PRIu64,
			 trailer_num);
		c->trailer[0].key = grpc_slice_from_static_string(trailer_key);
		c->trailer[0].value = grpc_slice_from_static_string(c->trailer_val);
		ops[n].data.send_status_from_server.trailing_metadata_count = 1;
		ops[n].data.send_status_from_server.trailing_metadata = c->trailer;
	}
	n++;
	histd_call_ref(c);
	err = histd_call_start_batch(c, ops, n, &c->t_done);
	if (err != GRPC_CALL_OK) {
		histd_log(HISTD_LOG_ERROR, "start_batch failed", "error",
			  grpc_call_error_to_string(err), NULL);
		histd_call_unref(c);
	}
}

static int
deadline_passed(struct histd_call *c)
{
	gpr_timespec now = gpr_now(c->deadline.clock_type);

	return gpr_time_cmp(c->deadline, now) < 0;
}

/* The call's deadline on histd_mono_us's clock; 0 if it has none. */
static int64_t
deadline_mono_us(struct histd_call *c)
{
	gpr_timespec now = gpr_now(c->deadline.clock_type);
	gpr_timespec left;

	if (gpr_time_cmp(c->deadline,
			 gpr_inf_future(c->deadline.clock_type)) == 0)
		return 0;
	left = gpr_time_sub(c->deadline, now);
	/* A deadline a year or more away is as good as none. */
	if (left.tv_sec >= 365 * 86400)
		return 0;
	if (left.tv_sec < 0)
		return histd_mono_us() - 1;
	return histd_mono_us() + (int64_t)left.tv_sec * 1000000 +
	       left.tv_nsec / 1000;
}

/* The request id for logs: the client's x-request-id (printable, at most
 * 64 characters) or one made here. */
static void
request_id(struct histd_call *c, char *out, size_t cap)
{
	static atomic_uint_fast64_t next;

	for (size_t i = 0; i < c->md.count; i++) {
		const grpc_metadata *m = &c->md.metadata[i];
		size_t len = GRPC_SLICE_LENGTH(m->value), n = 0;
		const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);

		if (grpc_slice_str_cmp(m->key, "x-request-id") != 0)
			continue;
		for (size_t k = 0; k < len && n + 1 < cap && n < 64; k++)
			if (v[k] > 0x20 && v[k] < 0x7f && v[k] != '"' &&
			    v[k] != '\\')
				out[n++] = v[k];
		out[n] = '\0';
		if (n)
			return;
	}
	snprintf(out, cap, "h%llx-%llx", (unsigned long long)c->start_us,
		 (unsigned long long)atomic_fetch_add(&next, 1));
}

static struct tenant_calls *
tenant_entry(struct histd_server *s, const char *tenant)
{
	struct tenant_calls *t;

	for (t = s->tenants; t; t = t->next)
		if (strcmp(t->name, tenant) == 0)
			return t;
	if (!(t = calloc(1, sizeof(*t) + strlen(tenant) + 1)))
		return NULL;
	strcpy(t->name, tenant);
	t->next = s->tenants;
	s->tenants = t;
	return t;
}

int
histd_call_caller(struct histd_call *c, histd_caller *who, int count)
{
	struct histd_server *s = c->srv;
	const char *header = NULL;
	size_t len = 0;
	struct tenant_calls *t;
	int rc;

	who->tenant = "default";
	who->read_only = 0;
	if (s->auth) {
		for (size_t i = 0; i < c->md.count; i++)
			if (grpc_slice_str_cmp(c->md.metadata[i].key,
					       "authorization") == 0) {
				header = (const char *)GRPC_SLICE_START_PTR(
					c->md.metadata[i].value);
				len = GRPC_SLICE_LENGTH(c->md.metadata[i].value);
				break;
			}
		if ((rc = histd_auth_check(s->auth, header, len, &who->tenant,
					   &who->read_only))) {
			/* No tenant: logs must not say "default". */
			who->tenant = "";
			return rc;
		}
	}
	if (!count)
		return 0;
	/* One tenant cannot take every thread and connection slot. */
	pthread_mutex_lock(&s->tenants_mu);
	t = tenant_entry(s, who->tenant);
	if (!t) {
		pthread_mutex_unlock(&s->tenants_mu);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	if (count == HISTD_COUNT_STREAM) {
		/* One tenant cannot take every Subscribe stream the server
		 * allows (--max-subscribers). */
		if (s->cfg->max_subscribers_per_tenant &&
		    t->streams >= (long)s->cfg->max_subscribers_per_tenant) {
			pthread_mutex_unlock(&s->tenants_mu);
			return histd_error_set(HISTD_ELIMIT, "the tenant has %ld "
					       "Subscribe streams open; the "
					       "limit is %u", t->streams,
					       s->cfg->max_subscribers_per_tenant);
		}
		t->streams++;
		c->tenant_stream = 1;
	} else {
		if (s->cfg->max_calls_per_tenant &&
		    t->calls >= (long)s->cfg->max_calls_per_tenant) {
			pthread_mutex_unlock(&s->tenants_mu);
			return histd_error_set(HISTD_ELIMIT, "the tenant has %ld "
					       "calls in progress; the limit is "
					       "%u", t->calls,
					       s->cfg->max_calls_per_tenant);
		}
		t->calls++;
	}
	c->tenant = t;
	pthread_mutex_unlock(&s->tenants_mu);
	return 0;
}

/* Logs a unary call's outcome and answers it: data (malloc'ed, taken) on
 * success, else rc's status with msg. */
static void
conclude(struct histd_call *c, const char *tenant, int rc, uint8_t *data,
	 size_t len, const char *msg, uint64_t current_revision)
{
	enum histd_log_level level;

	/* Client mistakes are logged at debug; server-side failures at warn.
	 * Messages name fields, never conversation text. */
	level = rc == HISTD_EINTERNAL || rc == HISTD_EUNAVAILABLE ||
			rc == HISTD_ECORRUPT || rc == HISTD_ENOMEM ?
		HISTD_LOG_WARN : HISTD_LOG_DEBUG;
	if (histd_log_enabled(level)) {
		char rid[80], us[24];

		request_id(c, rid, sizeof(rid));
		snprintf(us, sizeof(us), "%lld",
			 (long long)(histd_mono_us() - c->start_us));
		histd_log(level, "rpc", "request_id", rid,
			  "method", histd_method_names[c->method],
			  "tenant", tenant,
			  "code", histd_status_name(histd_status_from_error(rc)),
			  "duration_us", us,
			  "error", rc ? msg : "", NULL);
	}
	if (rc == 0) {
		answer(c, data, len, GRPC_STATUS_OK, NULL, NULL, 0);
		return;
	}
	free(data);
	answer(c, NULL, 0, histd_status_from_error(rc), msg,
	       rc == HISTD_ECONFLICT ? "histd-revision" : NULL,
	       current_revision);
}

/* histd_reply.finish: a deferred Append answer, from whichever thread the
 * driver reported durability on. */
static void
finish_deferred(void *ctx, int rc, uint8_t *data, size_t len,
		const char *msg, uint64_t current_revision)
{
	struct histd_call *c = ctx;

	conclude(c, c->tenant ? c->tenant->name : "", rc, data, len, msg,
		 current_revision);
	histd_call_unref(c);
}

static void
handle_unary(struct histd_call *c)
{
	histd_reply reply = { 0 };
	histd_caller who;
	grpc_slice req;
	int rc;

	if (deadline_passed(c)) {
		answer(c, NULL, 0, GRPC_STATUS_DEADLINE_EXCEEDED,
		       "deadline passed before the call was handled", NULL, 0);
		return;
	}
	if (histd_call_request_bytes(c, &req) != 0) {
		answer(c, NULL, 0, GRPC_STATUS_INVALID_ARGUMENT,
		       "request has no message", NULL, 0);
		return;
	}
	histd_error_clear();
	rc = histd_call_caller(c, &who, HISTD_COUNT_CALL);
	if (rc == 0) {
		/* The reference a deferred answer holds until it is given. */
		histd_call_ref(c);
		reply.finish = finish_deferred;
		reply.finish_ctx = c;
		reply.deadline_us = deadline_mono_us(c);
		rc = histd_service_unary(c->srv->svc,
					 (enum histd_method)c->method, &who,
					 GRPC_SLICE_START_PTR(req),
					 GRPC_SLICE_LENGTH(req), &reply);
		if (rc == 0 && reply.deferred) {
			grpc_slice_unref(req);
			return;
		}
		histd_call_unref(c);
	}
	grpc_slice_unref(req);
	conclude(c, who.tenant, rc, reply.data, reply.len,
		 histd_error_message(), reply.current_revision);
}

static void
handle_health_check(struct histd_call *c)
{
	Grpc__Health__V1__HealthCheckRequest *req;
	Grpc__Health__V1__HealthCheckResponse resp =
		GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
	grpc_slice bytes;
	uint8_t *out;
	size_t len;
	int known;

	if (histd_call_request_bytes(c, &bytes) != 0) {
		answer(c, NULL, 0, GRPC_STATUS_INVALID_ARGUMENT,
		       "request has no message", NULL, 0);
		return;
	}
	req = grpc__health__v1__health_check_request__unpack(
		NULL, GRPC_SLICE_LENGTH(bytes), GRPC_SLICE_START_PTR(bytes));
	grpc_slice_unref(bytes);
	if (!req) {
		answer(c, NULL, 0, GRPC_STATUS_INVALID_ARGUMENT,
		       "request does not decode as grpc.health.v1.HealthCheckRequest",
		       NULL, 0);
		return;
	}
	known = req->service[0] == '\0' ||
		strcmp(req->service, "histd.v1.HistoryService") == 0;
	grpc__health__v1__health_check_request__free_unpacked(req, NULL);
	if (!known) {
		answer(c, NULL, 0, GRPC_STATUS_NOT_FOUND, "unknown service",
		       NULL, 0);
		return;
	}
	/* The state the health thread keeps (storage pinged every second). */
	resp.status = atomic_load(&c->srv->serving) ?
		GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING :
		GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
	len = grpc__health__v1__health_check_response__get_packed_size(&resp);
	out = malloc(len ? len : 1);
	if (!out) {
		answer(c, NULL, 0, GRPC_STATUS_RESOURCE_EXHAUSTED,
		       "out of memory", NULL, 0);
		return;
	}
	grpc__health__v1__health_check_response__pack(&resp, out);
	answer(c, out, len, GRPC_STATUS_OK, NULL, NULL, 0);
}

static void
handle_unknown(struct histd_call *c)
{
	char msg[160];
	size_t len = GRPC_SLICE_LENGTH(c->details.method);

	if (len > 100)
		len = 100;
	snprintf(msg, sizeof(msg), "unknown method %.*s", (int)len,
		 (const char *)GRPC_SLICE_START_PTR(c->details.method));
	answer(c, NULL, 0, GRPC_STATUS_UNIMPLEMENTED, msg, NULL, 0);
}

/* ---------------------------------------------------------------------- */
/* Reflection: a bidi stream, one answer per request, in order             */

/* Ends a bidi call with a status (and learns of its close). */
static void
bidi_finish(struct histd_call *c, grpc_status_code code, const char *details)
{
	grpc_op ops[2];
	grpc_call_error err;

	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[0].data.recv_close_on_server.cancelled = &c->cancelled;
	ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[1].data.send_status_from_server.status = code;
	c->st_code = code;
	if (details && *details) {
		c->status_details = grpc_slice_from_copied_string(details);
		c->has_details = 1;
		ops[1].data.send_status_from_server.status_details =
			&c->status_details;
	}
	histd_call_ref(c);
	err = histd_call_start_batch(c, ops, 2, &c->t_done);
	if (err != GRPC_CALL_OK)
		histd_call_unref(c);
}

/* Sends resp (if any) and posts the receive of the next request; under
 * c->mu. */
static void
bidi_next(struct histd_call *c, uint8_t *resp, size_t len, int first)
{
	grpc_op ops[2];
	size_t n = 0;
	grpc_call_error err;

	memset(ops, 0, sizeof(ops));
	if (first) {
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
	} else if (resp) {
		grpc_slice sl = grpc_slice_new(resp, len, free);

		if (c->resp)
			grpc_byte_buffer_destroy(c->resp);
		c->resp = grpc_raw_byte_buffer_create(&sl, 1);
		grpc_slice_unref(sl);
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n].data.send_message.send_message = c->resp;
		n++;
	}
	ops[n].op = GRPC_OP_RECV_MESSAGE;
	ops[n].data.recv_message.recv_message = &c->recv_buf;
	n++;
	histd_call_ref(c);
	err = histd_call_start_batch(c, ops, n, &c->t_recv);
	if (err != GRPC_CALL_OK) {
		/* Nothing outstanding holds the call now: the shutdown must
		 * not start a batch on it (its last reference may be going). */
		c->refl_finished = 1;
		histd_call_unref(c);
	}
}

/* Sends the stream's status once, holding c->mu: the shutdown may end
 * a stream while its next request is being answered. Until it is sent,
 * a batch of the stream is outstanding or its handler runs, so the call
 * holds a reference that reflection_end_all can count on. */
static void
reflection_finish(struct histd_call *c, grpc_status_code code,
		  const char *details)
{
	if (!c->refl_finished) {
		c->refl_finished = 1;
		bidi_finish(c, code, details);
	}
}

static void
on_reflection_recv(struct histd_call *c, int ok)
{
	grpc_byte_buffer_reader reader;
	grpc_slice req;
	uint8_t *resp = NULL;
	size_t len = 0;

	pthread_mutex_lock(&c->mu);
	if (c->refl_finished) {
		/* Ended by the shutdown: its receive comes back empty. */
	} else if (!ok || !c->recv_buf) {
		/* The client closed its side (ok), or the call is gone:
		 * cancelled by the client or by the shutdown. */
		reflection_finish(c, ok ? GRPC_STATUS_OK :
				  atomic_load(&c->srv->shutting_down) ?
				  GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_CANCELLED,
				  NULL);
	} else if (!grpc_byte_buffer_reader_init(&reader, c->recv_buf)) {
		reflection_finish(c, GRPC_STATUS_INVALID_ARGUMENT,
				  "request does not decode");
	} else {
		req = grpc_byte_buffer_reader_readall(&reader);
		grpc_byte_buffer_reader_destroy(&reader);
		grpc_byte_buffer_destroy(c->recv_buf);
		c->recv_buf = NULL;
		if (histd_reflection_answer(c->srv->refl,
					    GRPC_SLICE_START_PTR(req),
					    GRPC_SLICE_LENGTH(req), &resp,
					    &len) != 0)
			reflection_finish(c, histd_status_from_error(
						  HISTD_EINVALID),
					  histd_error_message());
		else
			bidi_next(c, resp, len, 0);
		grpc_slice_unref(req);
	}
	pthread_mutex_unlock(&c->mu);
	histd_call_unref(c);
}

/* Lists a new reflection stream and starts it; one that starts as
 * shutdown ends them is ended at once. */
static void
reflection_list(struct histd_call *c)
{
	struct histd_server *s = c->srv;

	pthread_mutex_lock(&s->refl_mu);
	c->refl_next = s->reflectors;
	c->refl_prev = NULL;
	if (s->reflectors)
		s->reflectors->refl_prev = c;
	s->reflectors = c;
	c->refl_listed = 1;
	pthread_mutex_lock(&c->mu);
	if (s->refl_closing)
		reflection_finish(c, GRPC_STATUS_UNAVAILABLE,
				  "server is shutting down");
	else
		bidi_next(c, NULL, 0, 1);
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&s->refl_mu);
}

/* As the context is freed, before its grpc_call goes. */
static void
reflection_unlist(struct histd_call *c)
{
	struct histd_server *s = c->srv;

	pthread_mutex_lock(&s->refl_mu);
	if (c->refl_prev)
		c->refl_prev->refl_next = c->refl_next;
	else
		s->reflectors = c->refl_next;
	if (c->refl_next)
		c->refl_next->refl_prev = c->refl_prev;
	c->refl_listed = 0;
	pthread_mutex_unlock(&s->refl_mu);
}

/* Shutdown: a reflection stream only waits for its client's next request
 * (grpcui, Postman and REPLs keep one open), so it would hold the exit
 * for the whole grace; it ends with UNAVAILABLE, as Subscribe does. The
 * status is sent as a batch, not by cancelling the call: a cancel ends the
 * call at once, so the exit could close the connection before the
 * cancel's status was written, and the client saw "Socket closed". */
static void
reflection_end_all(struct histd_server *s)
{
	pthread_mutex_lock(&s->refl_mu);
	s->refl_closing = 1;
	for (struct histd_call *c = s->reflectors; c; c = c->refl_next) {
		pthread_mutex_lock(&c->mu);
		reflection_finish(c, GRPC_STATUS_UNAVAILABLE,
				  "server is shutting down");
		pthread_mutex_unlock(&c->mu);
	}
	pthread_mutex_unlock(&s->refl_mu);
}

/* ---------------------------------------------------------------------- */
/* The completion queue                                                    */

static void
on_new_call(struct histd_call *c, int ok)
{
	struct histd_server *s = c->srv;

	if (!ok) {
		/* The server is shutting down: the posted request failed. */
		histd_call_unref(c);
		return;
	}
	c->start_us = histd_mono_us();
	pthread_mutex_lock(&s->live_mu);
	c->active = 1;
	s->active++;
	pthread_mutex_unlock(&s->live_mu);
	/* Keep the same number of requests posted for this method. */
	if (!atomic_load(&s->shutting_down)) {
		if (c->route == ROUTE_UNKNOWN)
			post_unknown(s);
		else
			post_registered(s, c->method);
	}
	switch (c->route) {
	case ROUTE_UNARY:
		handle_unary(c);
		break;
	case ROUTE_SUBSCRIBE:
		histd_subscribe_begin(c);
		break;
	case ROUTE_HEALTH_CHECK:
		handle_health_check(c);
		break;
	case ROUTE_HEALTH_WATCH:
		histd_health_watch_begin(c);
		break;
	case ROUTE_REFLECTION:
		reflection_list(c);
		break;
	case ROUTE_UNKNOWN:
		handle_unknown(c);
		break;
	}
	histd_call_unref(c);
}

static void
dispatch(struct histd_tag *t, int ok)
{
	struct histd_call *c;

	histd_tsan_acquire(t);
	c = t->call;
	switch (t->kind) {
	case TAG_NEW:
		on_new_call(c, ok);
		break;
	case TAG_DONE:
		histd_call_unref(c);
		break;
	case TAG_CLOSE:
		if (c->route == ROUTE_HEALTH_WATCH)
			histd_health_on_close(c);
		else
			histd_subscribe_on_close(c);
		break;
	case TAG_SEND:
		if (c->route == ROUTE_HEALTH_WATCH)
			histd_health_on_send(c, ok);
		else
			histd_subscribe_on_send(c, ok);
		break;
	case TAG_STATUS:
		histd_subscribe_on_status(c, ok);
		break;
	case TAG_RECV:
		on_reflection_recv(c, ok);
		break;
	case TAG_MORE:
		histd_subscribe_on_more(c);
		break;
	}
}

static void *
cq_thread(void *arg)
{
	struct histd_server *s = arg;

	for (;;) {
		grpc_event ev = grpc_completion_queue_next(
			s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type == GRPC_OP_COMPLETE)
			dispatch(ev.tag, ev.success);
	}
	return NULL;
}

/* Route table index r (HistoryService methods first, then health). */
static void
post_registered(struct histd_server *s, int r)
{
	struct histd_call *c = call_new(s, routes[r].route, r);
	grpc_call_error err;

	if (!c)
		return;
	histd_tsan_release(&c->t_new);
	/* A bidi method is registered without a payload and must be
	 * requested without one. */
	err = grpc_server_request_registered_call(
		s->server, routes[r].handle, &c->call, &c->deadline, &c->md,
		routes[r].route == ROUTE_REFLECTION ? NULL : &c->payload,
		s->cq, s->cq, &c->t_new);
	if (err != GRPC_CALL_OK) {
		if (!atomic_load(&s->shutting_down))
			histd_log(HISTD_LOG_ERROR, "request_registered_call failed",
				  "error", grpc_call_error_to_string(err), NULL);
		histd_call_unref(c);
	}
}

static void
post_unknown(struct histd_server *s)
{
	struct histd_call *c = call_new(s, ROUTE_UNKNOWN, -1);
	grpc_call_error err;

	if (!c)
		return;
	histd_tsan_release(&c->t_new);
	err = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
				       s->cq, s->cq, &c->t_new);
	if (err != GRPC_CALL_OK)
		histd_call_unref(c);
}

static void
build_routes(void)
{
	n_routes = 0;
	for (int m = 0; m < HISTD_M_COUNT; m++) {
		routes[n_routes].name = histd_method_names[m];
		routes[n_routes].path = histd_method_paths[m];
		routes[n_routes].route = m == HISTD_M_SUBSCRIBE ?
			ROUTE_SUBSCRIBE : ROUTE_UNARY;
		routes[n_routes].method = m;
		n_routes++;
	}
	routes[n_routes].path = HEALTH_CHECK_PATH;
	routes[n_routes].name = "Health.Check";
	routes[n_routes].route = ROUTE_HEALTH_CHECK;
	n_routes++;
	routes[n_routes].path = HEALTH_WATCH_PATH;
	routes[n_routes].name = "Health.Watch";
	routes[n_routes].route = ROUTE_HEALTH_WATCH;
	n_routes++;
	routes[n_routes].path = REFLECTION_V1_PATH;
	routes[n_routes].name = "ServerReflectionInfo.v1";
	routes[n_routes].route = ROUTE_REFLECTION;
	n_routes++;
	routes[n_routes].path = REFLECTION_V1ALPHA_PATH;
	routes[n_routes].name = "ServerReflectionInfo.v1alpha";
	routes[n_routes].route = ROUTE_REFLECTION;
	n_routes++;
	for (int r = 0; r < n_routes; r++)
		routes[r].metric = histd_metrics_method(routes[r].name);
}

/* Gauges read when /metrics is scraped. */
static void
collect_gauges(void *ctx, FILE *out)
{
	struct histd_server *s = ctx;
	long active;

	pthread_mutex_lock(&s->live_mu);
	active = s->active;
	pthread_mutex_unlock(&s->live_mu);
	fprintf(out, "# HELP histd_calls_active Calls in progress.\n"
		"# TYPE histd_calls_active gauge\nhistd_calls_active %ld\n",
		active);
	fprintf(out, "# HELP histd_subscribers Open Subscribe streams.\n"
		"# TYPE histd_subscribers gauge\nhistd_subscribers %zu\n",
		histd_hub_count(s->hub));
	fprintf(out, "# HELP histd_serving 1 while health is SERVING.\n"
		"# TYPE histd_serving gauge\nhistd_serving %d\n",
		atomic_load(&s->serving));
}

/* ---------------------------------------------------------------------- */
/* Start and stop                                                          */

int
histd_server_start(histd_server **out, const histd_config *cfg,
		   histd_service *svc, histd_hub *hub, int *bound_port)
{
	struct histd_server *s = calloc(1, sizeof(*s));
	grpc_server_credentials *creds;
	grpc_arg args[3];
	grpc_channel_args chargs;
	int port, rc;

	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	s->cfg = cfg;
	s->svc = svc;
	s->hub = hub;
	if (histd_reflection_new(&s->refl) != 0) {
		free(s);
		return HISTD_EINTERNAL;
	}
	pthread_mutex_init(&s->tenants_mu, NULL);
	if (*cfg->api_keys_file &&
	    histd_auth_new(&s->auth, cfg->api_keys_file) != 0) {
		histd_reflection_free(s->refl);
		free(s);
		return HISTD_EINVALID;
	}
	if (s->auth) {
		char n[24];

		snprintf(n, sizeof(n), "%zu", histd_auth_count(s->auth));
		histd_log(HISTD_LOG_INFO, "API keys loaded", "keys", n,
			  "file", cfg->api_keys_file, NULL);
	} else {
		histd_log(HISTD_LOG_WARN, "authentication is disabled: every "
			  "caller is tenant 'default' (--auth-disabled)", NULL);
	}
	/* Certificates are checked before anything starts. */
	if (*cfg->tls_cert &&
	    histd_tls_new(&s->tls, cfg->tls_cert, cfg->tls_key,
			  cfg->tls_client_ca) != 0) {
		histd_reflection_free(s->refl);
		histd_auth_free(s->auth);
		free(s);
		return HISTD_EINVALID;
	}
	atomic_init(&s->shutting_down, 0);
	pthread_mutex_init(&s->live_mu, NULL);
	pthread_cond_init(&s->live_cv, NULL);
	pthread_mutex_init(&s->refl_mu, NULL);

	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[0].value.integer = (int)(cfg->max_receive_bytes > INT32_MAX ?
				      INT32_MAX : cfg->max_receive_bytes);
	args[1].type = GRPC_ARG_INTEGER;
	args[1].key = GRPC_ARG_MAX_CONCURRENT_STREAMS;
	args[1].value.integer = (int)(cfg->max_concurrent_streams > INT32_MAX ?
				      INT32_MAX : cfg->max_concurrent_streams);
	/* gRPC binds with SO_REUSEPORT by default: a second histd given the
	 * port of a running one would start and take half its connections,
	 * serving them from another store. The port must be free. */
	args[2].type = GRPC_ARG_INTEGER;
	args[2].key = GRPC_ARG_ALLOW_REUSEPORT;
	args[2].value.integer = 0;
	chargs.num_args = 3;
	chargs.args = args;

	s->cq = grpc_completion_queue_create_for_next(NULL);
	s->server = grpc_server_create(&chargs, NULL);
	grpc_server_register_completion_queue(s->server, s->cq, NULL);
	build_routes();
	for (int r = 0; r < n_routes; r++)
		routes[r].handle = grpc_server_register_method(
			s->server, routes[r].path, NULL,
			routes[r].route == ROUTE_REFLECTION ?
				GRPC_SRM_PAYLOAD_NONE :
				GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);

	creds = s->tls ? histd_tls_credentials(s->tls) :
			 grpc_insecure_server_credentials_create();
	port = grpc_server_add_http2_port(s->server, cfg->listen, creds);
	grpc_server_credentials_release(creds);
	if (port == 0) {
		rc = histd_error_set(HISTD_EUNAVAILABLE, "cannot listen on %s",
				     cfg->listen);
		goto fail;
	}
	/* The queue's threads start before the server: nothing reaches the
	 * queue until calls are posted below. One is enough to serve; fewer
	 * than asked for is said. */
	if (!(s->threads = calloc((size_t)cfg->threads, sizeof(pthread_t)))) {
		rc = histd_error_set(HISTD_ENOMEM, "out of memory");
		goto fail;
	}
	for (int i = 0; i < cfg->threads; i++) {
		int err = pthread_create(&s->threads[i], NULL, cq_thread, s);

		if (err) {
			char a[16], b[16];

			if (i == 0) {
				rc = histd_error_set(HISTD_EINTERNAL, "cannot start "
						     "a queue thread: %s",
						     strerror(err));
				goto fail;
			}
			snprintf(a, sizeof(a), "%d", i);
			snprintf(b, sizeof(b), "%d", cfg->threads);
			histd_log(HISTD_LOG_WARN, "fewer queue threads than "
				  "--threads asked for", "started", a, "asked", b,
				  "error", strerror(err), NULL);
			break;
		}
		s->n_threads = i + 1;
	}
	histd_metrics_add_collector(collect_gauges, s);
	grpc_server_start(s->server);
	histd_health_start(s);

	for (int r = 0; r < n_routes; r++)
		for (int i = 0; i < cfg->posted_calls; i++)
			post_registered(s, r);
	for (int i = 0; i < cfg->posted_calls; i++)
		post_unknown(s);

	/* gRPC answers 1 for a unix socket: not a port anyone could use. */
	if (!strncmp(cfg->listen, "unix:", 5) ||
	    !strncmp(cfg->listen, "unix-abstract:", 14))
		port = 0;
	*bound_port = port;
	*out = s;
	return 0;

fail:
	/* Nothing was started: no thread, no call. */
	grpc_server_destroy(s->server);
	grpc_completion_queue_shutdown(s->cq);
	while (grpc_completion_queue_next(s->cq,
		gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
	       GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(s->cq);
	pthread_mutex_destroy(&s->live_mu);
	pthread_cond_destroy(&s->live_cv);
	pthread_mutex_destroy(&s->refl_mu);
	histd_reflection_free(s->refl);
	histd_auth_free(s->auth);
	histd_tls_free(s->tls);
	free(s->threads);
	free(s);
	return rc;
}

void
histd_server_shutdown(histd_server *s)
{
	grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
	int tag;
	grpc_event ev;
	gpr_timespec grace = gpr_time_add(
		gpr_now(GPR_CLOCK_MONOTONIC),
		gpr_time_from_micros(s->cfg->shutdown_grace_us, GPR_TIMESPAN));

	atomic_store(&s->shutting_down, 1);
	histd_health_stop(s);
	grpc_server_shutdown_and_notify(s->server, scq, &tag);
	/* Our own long-lived streams would hold the shutdown forever. */
	histd_hub_shutdown(s->hub);
	reflection_end_all(s);
	/* Calls in flight finish (up to the grace). Then whatever is left,
	 * such as idle client connections that would only notice GOAWAY at
	 * their next poll, is cancelled rather than waited for. */
	pthread_mutex_lock(&s->live_mu);
	while (s->active > 0) {
		gpr_timespec now = gpr_now(GPR_CLOCK_MONOTONIC);
		struct timespec until;

		if (gpr_time_cmp(now, grace) >= 0)
			break;
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += 50 * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&s->live_cv, &s->live_mu, &until);
	}
	if (s->active > 0)
		histd_log(HISTD_LOG_WARN, "grace period over; cancelling calls",
			  NULL);
	pthread_mutex_unlock(&s->live_mu);
	/* A call blocked in a provider call would hold the threads (and the
	 * exit) until the provider answered. */
	if (s->grace_over)
		s->grace_over(s->grace_arg);
	ev = grpc_completion_queue_pluck(scq, &tag,
					 gpr_time_0(GPR_CLOCK_MONOTONIC), NULL);
	if (ev.type == GRPC_QUEUE_TIMEOUT) {
		grpc_server_cancel_all_calls(s->server);
		grpc_completion_queue_pluck(scq, &tag,
					    gpr_inf_future(GPR_CLOCK_REALTIME),
					    NULL);
	}
	/* Queue threads keep draining until every call context is freed: a
	 * batch completing after the queue shut down would abort. */
	pthread_mutex_lock(&s->live_mu);
	while (s->live > 0)
		pthread_cond_wait(&s->live_cv, &s->live_mu);
	pthread_mutex_unlock(&s->live_mu);

	grpc_server_destroy(s->server);
	s->server = NULL;
	grpc_completion_queue_shutdown(s->cq);
	for (int i = 0; i < s->n_threads; i++)
		pthread_join(s->threads[i], NULL);
	grpc_completion_queue_destroy(s->cq);
	s->cq = NULL;
	grpc_completion_queue_shutdown(scq);
	grpc_completion_queue_destroy(scq);
}

void
histd_server_on_grace_over(histd_server *s, void (*fn)(void *arg), void *arg)
{
	s->grace_over = fn;
	s->grace_arg = arg;
}

void
histd_server_free(histd_server *s)
{
	if (!s)
		return;
	/* /metrics may still be served: no scrape reads s from here on. */
	histd_metrics_remove_collector(collect_gauges, s);
	free(s->threads);
	histd_reflection_free(s->refl);
	histd_tls_free(s->tls);
	histd_auth_free(s->auth);
	while (s->tenants) {
		struct tenant_calls *t = s->tenants;

		s->tenants = t->next;
		free(t);
	}
	pthread_mutex_destroy(&s->tenants_mu);
	pthread_mutex_destroy(&s->health_mu);
	pthread_cond_destroy(&s->health_cv);
	pthread_mutex_destroy(&s->live_mu);
	pthread_cond_destroy(&s->live_cv);
	pthread_mutex_destroy(&s->refl_mu);
	free(s);
}
