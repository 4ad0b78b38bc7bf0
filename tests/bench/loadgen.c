/*
 * The load generator: worker threads each polling one completion queue,
 * channels with registered methods, asynchronous unary calls and the
 * closed-loop run. See loadgen.h for the contracts.
 */
#include "loadgen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

const char *const bench_method_paths[BENCH_M_COUNT] = {
	[BENCH_M_HEALTH_CHECK] = "/grpc.health.v1.Health/Check",
	[BENCH_M_CREATE_SESSION] = "/histd.v1.HistoryService/CreateSession",
	[BENCH_M_GET_SESSION] = "/histd.v1.HistoryService/GetSession",
	[BENCH_M_APPEND] = "/histd.v1.HistoryService/Append",
	[BENCH_M_GET_MESSAGES] = "/histd.v1.HistoryService/GetMessages",
	[BENCH_M_SUBSCRIBE] = "/histd.v1.HistoryService/Subscribe",
	[BENCH_M_REDUCE] = "/histd.v1.HistoryService/Reduce",
	[BENCH_M_SEARCH] = "/histd.v1.HistoryService/Search",
};

struct bench_worker {
	grpc_completion_queue *cq;
	pthread_t thread;
	int started;
};

struct bench_conn {
	grpc_channel *channel;
	void *methods[BENCH_M_COUNT];   /* registered call handles */
};

struct bench_client {
	struct bench_worker *workers;
	size_t n_workers;
	struct bench_conn *conns;
	size_t n_conns;
	/* Only the controlling thread uses it, one call at a time, so
	 * grpc_completion_queue_next returns that call's tag. */
	grpc_completion_queue *sync_cq;
};

uint64_t bench_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------------
 * Latency samples */

int bench_lat_add(bench_lat *l, uint64_t ns)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 4096;
		uint64_t *p = realloc(l->ns, cap * sizeof(*p));

		if (!p)
			return -1;
		l->ns = p;
		l->cap = cap;
	}
	l->ns[l->n++] = ns;
	return 0;
}

int bench_lat_merge(bench_lat *into, bench_lat *from)
{
	if (from->n == 0)
		return 0;
	if (into->n + from->n > into->cap) {
		size_t cap = into->n + from->n;
		uint64_t *p = realloc(into->ns, cap * sizeof(*p));

		if (!p)
			return -1;
		into->ns = p;
		into->cap = cap;
	}
	memcpy(into->ns + into->n, from->ns, from->n * sizeof(*from->ns));
	into->n += from->n;
	from->n = 0;
	return 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

void bench_lat_sort(bench_lat *l)
{
	if (l->n > 1)
		qsort(l->ns, l->n, sizeof(*l->ns), cmp_u64);
}

double bench_lat_quantile_us(const bench_lat *l, double p)
{
	size_t rank;

	if (l->n == 0)
		return 0;
	/* Nearest rank: ceil(p * n), 1-based. */
	rank = (size_t)(p * (double)l->n);
	if ((double)rank < p * (double)l->n)
		rank++;
	if (rank < 1)
		rank = 1;
	if (rank > l->n)
		rank = l->n;
	return (double)l->ns[rank - 1] / 1000.0;
}

void bench_lat_free(bench_lat *l)
{
	free(l->ns);
	memset(l, 0, sizeof(*l));
}

/* ---------------------------------------------------------------------
 * Client */

static void *worker_main(void *arg)
{
	struct bench_worker *w = arg;

	for (;;) {
		grpc_event ev = grpc_completion_queue_next(
			w->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);

		if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
		if (ev.type == GRPC_OP_COMPLETE) {
			bench_tag *t = ev.tag;

			t->done(t, ev.success);
		}
	}
	return NULL;
}

static void drain_and_destroy(grpc_completion_queue *cq)
{
	grpc_completion_queue_shutdown(cq);
	while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_MONOTONIC),
					  NULL).type != GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(cq);
}

int bench_client_new(bench_client **out, const char *target, size_t threads,
		     size_t connections)
{
	bench_client *c;
	grpc_channel_credentials *creds;
	grpc_arg args[3];
	grpc_channel_args chargs = { .num_args = 3, .args = args };

	*out = NULL;
	if (threads == 0 || connections == 0)
		return -1;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -1;
	c->workers = calloc(threads, sizeof(*c->workers));
	c->conns = calloc(connections, sizeof(*c->conns));
	if (!c->workers || !c->conns)
		goto fail;

	/* Each channel its own connection: with the global subchannel pool,
	 * channels to one target with equal arguments share one. */
	args[0] = (grpc_arg){ .type = GRPC_ARG_INTEGER,
			      .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
			      .value.integer = 1 };
	/* Fill batches and big reads must not be cut at the default 4 MiB. */
	args[1] = (grpc_arg){ .type = GRPC_ARG_INTEGER,
			      .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
			      .value.integer = -1 };
	/* No retry buffering on the client: the bench measures the server. */
	args[2] = (grpc_arg){ .type = GRPC_ARG_INTEGER,
			      .key = GRPC_ARG_ENABLE_RETRIES,
			      .value.integer = 0 };
	creds = grpc_insecure_credentials_create();
	for (size_t i = 0; i < connections; i++) {
		struct bench_conn *cn = &c->conns[i];

		cn->channel = grpc_channel_create(target, creds, &chargs);
		if (!cn->channel)
			break;
		c->n_conns++;
		for (int m = 0; m < BENCH_M_COUNT; m++)
			cn->methods[m] = grpc_channel_register_call(
				cn->channel, bench_method_paths[m], NULL, NULL);
	}
	grpc_channel_credentials_release(creds);
	if (c->n_conns != connections) {
		fprintf(stderr, "histd-bench: cannot create a channel to %s\n",
			target);
		goto fail;
	}

	c->sync_cq = grpc_completion_queue_create_for_next(NULL);
	for (size_t i = 0; i < threads; i++) {
		struct bench_worker *w = &c->workers[i];

		w->cq = grpc_completion_queue_create_for_next(NULL);
		c->n_workers++;
		if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
			fprintf(stderr, "histd-bench: cannot start a worker thread\n");
			goto fail;
		}
		w->started = 1;
	}
	*out = c;
	return 0;
fail:
	bench_client_free(c);
	return -1;
}

void bench_client_free(bench_client *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->n_conns; i++)
		grpc_channel_destroy(c->conns[i].channel);
	for (size_t i = 0; i < c->n_workers; i++) {
		struct bench_worker *w = &c->workers[i];

		grpc_completion_queue_shutdown(w->cq);
		if (w->started)
			pthread_join(w->thread, NULL);
		else
			while (grpc_completion_queue_next(w->cq,
				gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type
			       != GRPC_QUEUE_SHUTDOWN)
				;
		grpc_completion_queue_destroy(w->cq);
	}
	if (c->sync_cq)
		drain_and_destroy(c->sync_cq);
	free(c->workers);
	free(c->conns);
	free(c);
}

size_t bench_client_threads(const bench_client *c)
{
	return c->n_workers;
}

size_t bench_client_connections(const bench_client *c)
{
	return c->n_conns;
}

gpr_timespec bench_deadline(double seconds)
{
	return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME),
			    gpr_time_from_millis((int64_t)(seconds * 1000.0),
						 GPR_TIMESPAN));
}

grpc_call *bench_client_call(bench_client *c, enum bench_method m,
			     size_t slot, gpr_timespec deadline)
{
	struct bench_conn *cn = &c->conns[slot % c->n_conns];

	return grpc_channel_create_registered_call(
		cn->channel, NULL, GRPC_PROPAGATE_DEFAULTS,
		c->workers[slot % c->n_workers].cq, cn->methods[m], deadline,
		NULL);
}

grpc_slice bench_pack(const ProtobufCMessage *m)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	grpc_slice s = grpc_slice_malloc(len);

	protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
	return s;
}

uint8_t *bench_flatten(grpc_byte_buffer *bb, size_t *len)
{
	grpc_byte_buffer_reader rd;
	grpc_slice all;
	uint8_t *out;

	*len = 0;
	if (!bb || !grpc_byte_buffer_reader_init(&rd, bb))
		return NULL;
	all = grpc_byte_buffer_reader_readall(&rd);
	grpc_byte_buffer_reader_destroy(&rd);
	/* malloc(0) may be NULL: ask for one byte so an empty message still
	 * reads as "a message arrived". */
	out = malloc(GRPC_SLICE_LENGTH(all) + 1);
	if (out) {
		memcpy(out, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all));
		*len = GRPC_SLICE_LENGTH(all);
	}
	grpc_slice_unref(all);
	return out;
}

/* ---------------------------------------------------------------------
 * Asynchronous unary calls */

static void unary_done(bench_tag *t, int ok)
{
	bench_unary *u = (bench_unary *)t;

	/* A client batch with RECV_STATUS_ON_CLIENT always completes with a
	 * status; ok 0 would mean core refused an op, which we report as
	 * INTERNAL rather than trust a half-filled status. */
	if (!ok && u->status == GRPC_STATUS_OK)
		u->status = GRPC_STATUS_INTERNAL;
	u->on_done(u);
}

static int unary_begin(bench_unary *u, grpc_call *call, grpc_slice req)
{
	grpc_op ops[6];

	u->tag.done = unary_done;
	u->call = call;
	u->request = grpc_raw_byte_buffer_create(&req, 1);
	u->response = NULL;
	grpc_metadata_array_init(&u->initial_md);
	grpc_metadata_array_init(&u->trailing_md);
	u->status = GRPC_STATUS_OK;
	u->details = grpc_empty_slice();

	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = u->request;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->initial_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &u->response;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &u->trailing_md;
	ops[5].data.recv_status_on_client.status = &u->status;
	ops[5].data.recv_status_on_client.status_details = &u->details;

	u->start_ns = bench_now_ns();
	if (grpc_call_start_batch(call, ops, 6, &u->tag, NULL) != GRPC_CALL_OK) {
		bench_unary_release(u);
		return -1;
	}
	return 0;
}

int bench_unary_start(bench_client *c, bench_unary *u, enum bench_method m,
		      size_t slot, grpc_slice req, double timeout_s)
{
	grpc_call *call = bench_client_call(c, m, slot, bench_deadline(timeout_s));

	if (!call)
		return -1;
	return unary_begin(u, call, req);
}

void bench_unary_release(bench_unary *u)
{
	if (u->request)
		grpc_byte_buffer_destroy(u->request);
	if (u->response)
		grpc_byte_buffer_destroy(u->response);
	u->request = u->response = NULL;
	grpc_metadata_array_destroy(&u->initial_md);
	grpc_metadata_array_destroy(&u->trailing_md);
	grpc_slice_unref(u->details);
	u->details = grpc_empty_slice();
	if (u->call)
		grpc_call_unref(u->call);
	u->call = NULL;
}

void bench_unary_details(const bench_unary *u, char *buf, size_t size)
{
	size_t n = GRPC_SLICE_LENGTH(u->details);

	if (size == 0)
		return;
	if (n >= size)
		n = size - 1;
	memcpy(buf, GRPC_SLICE_START_PTR(u->details), n);
	buf[n] = '\0';
}

static void sync_done(bench_unary *u)
{
	(void)u;   /* the controlling thread reads u after dequeuing */
}

int bench_unary_sync(bench_client *c, enum bench_method m,
		     const ProtobufCMessage *req, double timeout_s,
		     grpc_status_code *status, char *details, size_t dsize,
		     uint8_t **response, size_t *response_len)
{
	bench_unary u = { .on_done = sync_done };
	grpc_slice s = bench_pack(req);
	grpc_call *call;
	grpc_event ev;
	int rc;

	*status = GRPC_STATUS_UNKNOWN;
	if (details && dsize)
		details[0] = '\0';
	if (response)
		*response = NULL;
	if (response_len)
		*response_len = 0;
	call = grpc_channel_create_registered_call(
		c->conns[0].channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->sync_cq,
		c->conns[0].methods[m], bench_deadline(timeout_s), NULL);
	if (!call) {
		grpc_slice_unref(s);
		return -1;
	}
	rc = unary_begin(&u, call, s);
	grpc_slice_unref(s);
	if (rc != 0)
		return -1;
	ev = grpc_completion_queue_next(c->sync_cq,
					gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
	if (ev.type != GRPC_OP_COMPLETE || ev.tag != &u.tag)
		abort();   /* one call at a time on this queue: cannot happen */
	unary_done(&u.tag, ev.success);
	*status = u.status;
	if (details && dsize)
		bench_unary_details(&u, details, dsize);
	if (response && u.response)
		*response = bench_flatten(u.response, response_len);
	bench_unary_release(&u);
	return 0;
}

/* ---------------------------------------------------------------------
 * Closed-loop run */

struct run;

struct run_caller {
	bench_unary u;               /* first: u.tag is the batch tag */
	struct run *run;
	size_t idx;
	bench_lat lat;
};

struct run {
	bench_client *c;
	const bench_run_spec *spec;
	struct run_caller *callers;
	atomic_uint_fast64_t started;
	atomic_uint_fast64_t ok;
	atomic_uint_fast64_t errors;
	atomic_int stop;
	uint64_t end_ns;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	size_t active;               /* callers still running; under mu */
	uint64_t last_done_ns;       /* under mu */
	grpc_status_code first_error;          /* under mu */
	char first_error_details[160];         /* under mu */
};

static void caller_finish(struct run_caller *rc)
{
	struct run *r = rc->run;
	uint64_t now = bench_now_ns();

	pthread_mutex_lock(&r->mu);
	if (now > r->last_done_ns)
		r->last_done_ns = now;
	if (--r->active == 0)
		pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void caller_next(struct run_caller *rc)
{
	struct run *r = rc->run;
	const bench_run_spec *sp = r->spec;

	if (atomic_load(&r->stop))
		goto finish;
	if (sp->count) {
		if (atomic_fetch_add(&r->started, 1) >= sp->count)
			goto finish;
	} else if (bench_now_ns() >= r->end_ns) {
		goto finish;
	}
	if (bench_unary_start(r->c, &rc->u, sp->method, rc->idx,
			      sp->requests[rc->idx % sp->n_requests],
			      sp->timeout_s) == 0)
		return;
	atomic_fetch_add(&r->errors, 1);
	pthread_mutex_lock(&r->mu);
	if (r->first_error == GRPC_STATUS_OK) {
		r->first_error = GRPC_STATUS_INTERNAL;
		snprintf(r->first_error_details, sizeof(r->first_error_details),
			 "the client could not start a call");
	}
	pthread_mutex_unlock(&r->mu);
finish:
	caller_finish(rc);
}

static void caller_done(bench_unary *u)
{
	struct run_caller *rc = u->arg;
	struct run *r = rc->run;
	uint64_t now = bench_now_ns();

	if (u->status == GRPC_STATUS_OK) {
		bench_lat_add(&rc->lat, now - u->start_ns);
		atomic_fetch_add(&r->ok, 1);
	} else {
		uint64_t errs = atomic_fetch_add(&r->errors, 1) + 1;

		pthread_mutex_lock(&r->mu);
		if (r->first_error == GRPC_STATUS_OK) {
			r->first_error = u->status;
			bench_unary_details(u, r->first_error_details,
					    sizeof(r->first_error_details));
		}
		pthread_mutex_unlock(&r->mu);
		/* A server that answers every call with an error would turn the
		 * phase into a busy loop measuring nothing. */
		if (errs >= 1000 || (errs >= 20 && atomic_load(&r->ok) == 0))
			atomic_store(&r->stop, 1);
	}
	bench_unary_release(u);
	caller_next(rc);
}

int bench_client_run(bench_client *c, const bench_run_spec *spec,
		     bench_run_result *out)
{
	struct run *r;
	uint64_t t0;

	memset(out, 0, sizeof(*out));
	if (spec->callers == 0 || spec->n_requests == 0)
		return -1;
	r = calloc(1, sizeof(*r));
	if (!r)
		return -1;
	r->callers = calloc(spec->callers, sizeof(*r->callers));
	if (!r->callers) {
		free(r);
		return -1;
	}
	r->c = c;
	r->spec = spec;
	atomic_init(&r->started, 0);
	atomic_init(&r->ok, 0);
	atomic_init(&r->errors, 0);
	atomic_init(&r->stop, 0);
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->active = spec->callers;

	t0 = bench_now_ns();
	r->end_ns = t0 + (uint64_t)(spec->duration_s * 1e9);
	r->last_done_ns = t0;
	for (size_t i = 0; i < spec->callers; i++) {
		struct run_caller *rc = &r->callers[i];

		rc->run = r;
		rc->idx = i;
		rc->u.arg = rc;
		rc->u.on_done = caller_done;
		rc->u.details = grpc_empty_slice();
	}
	for (size_t i = 0; i < spec->callers; i++)
		caller_next(&r->callers[i]);

	pthread_mutex_lock(&r->mu);
	while (r->active > 0)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_mutex_unlock(&r->mu);

	out->ok = atomic_load(&r->ok);
	out->errors = atomic_load(&r->errors);
	out->first_error = r->first_error;
	memcpy(out->first_error_details, r->first_error_details,
	       sizeof(out->first_error_details));
	out->elapsed_s = (double)(r->last_done_ns - t0) / 1e9;
	for (size_t i = 0; i < spec->callers; i++) {
		bench_lat_merge(&out->lat, &r->callers[i].lat);
		bench_lat_free(&r->callers[i].lat);
	}
	bench_lat_sort(&out->lat);

	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	free(r->callers);
	free(r);
	return 0;
}

void bench_run_result_free(bench_run_result *r)
{
	bench_lat_free(&r->lat);
}
