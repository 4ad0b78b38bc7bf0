/*
 * Internal to the transport (transport.c, subscribe.c): the per-call
 * context and its completion-queue tags.
 *
 * A call context is reference-counted: one reference while its handler
 * runs and one per batch started on it; the last unref releases the
 * grpc_call and frees the context. Tags are small structs inside the
 * context, one per kind of batch that can be outstanding.
 */
#ifndef HISTD_CALL_H
#define HISTD_CALL_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "config.h"
#include "hub.h"
#include "reflection.h"
#include "service.h"

enum histd_tag_kind {
	TAG_NEW,        /* a posted request matched a call (or failed) */
	TAG_DONE,       /* the unary answer batch completed */
	TAG_CLOSE,      /* RECV_CLOSE_ON_SERVER of a stream completed */
	TAG_SEND,       /* one streamed message was sent */
	TAG_STATUS,     /* a stream's status was sent */
	TAG_RECV,       /* bidi: a message was sent and the next received */
	TAG_MORE,       /* Subscribe: read the next part of the replay */
};

struct histd_call;

struct histd_tag {
	enum histd_tag_kind kind;
	struct histd_call *call;
};

/* What a call is: a method of the table in transport.c, or unknown. */
enum histd_route {
	ROUTE_UNARY,        /* HistoryService unary methods */
	ROUTE_SUBSCRIBE,
	ROUTE_HEALTH_CHECK,
	ROUTE_HEALTH_WATCH,
	ROUTE_REFLECTION,   /* bidi; v1 and v1alpha share the handler */
	ROUTE_UNKNOWN,
};

struct histd_server {
	const histd_config *cfg;
	histd_service *svc;
	histd_hub *hub;
	histd_reflection *refl;
	struct histd_tls *tls;        /* NULL: plaintext */
	struct histd_auth *auth;      /* NULL: authentication disabled */
	/* Called once the shutdown stops waiting for calls (they finished,
	 * or the grace ran out): work that outlives them, such as provider
	 * calls, is abandoned there. */
	void (*grace_over)(void *arg);
	void *grace_arg;
	/* Calls in progress per tenant, for max_calls_per_tenant. */
	pthread_mutex_t tenants_mu;
	struct tenant_calls *tenants;
	grpc_server *server;
	grpc_completion_queue *cq;
	pthread_t *threads;
	int n_threads;
	atomic_int shutting_down;
	/* Live call contexts (posted or running); shutdown waits for 0. */
	pthread_mutex_t live_mu;
	pthread_cond_t live_cv;
	long live;
	/* Health: serving or not, and the Watch streams that follow it. */
	pthread_mutex_t health_mu;
	pthread_cond_t health_cv;
	atomic_int serving;
	struct histd_call *watchers;  /* linked by watch_next */
	pthread_t health_thread;
	int health_stop;
	/* Of those, calls a client made that are not finished yet. */
	long active;
	/* Reflection streams, from their start until their context is
	 * freed: idle ones wait for the client's next request, so shutdown
	 * ends them rather than wait out the grace. */
	pthread_mutex_t refl_mu;
	struct histd_call *reflectors;   /* linked by refl_next */
	int refl_closing;
};

struct histd_call {
	struct histd_server *srv;
	enum histd_route route;
	int method;                   /* route table index (= enum histd_method
	                                 * for HistoryService methods) */
	grpc_call *call;
	gpr_timespec deadline;
	grpc_metadata_array md;
	grpc_byte_buffer *payload;
	grpc_call_details details;    /* unknown methods only */
	atomic_int refs;
	int active;                   /* counted in histd_server.active */
	int64_t start_us;             /* arrival (monotonic), for metrics */
	struct tenant_calls *tenant;  /* counted against, until freed */
	int tenant_stream;            /* ...as a stream, not a call */
	struct histd_tag t_new, t_done, t_close, t_send, t_status, t_recv,
			 t_more;
	int cancelled;                /* out of RECV_CLOSE_ON_SERVER */
	grpc_byte_buffer *recv_buf;   /* bidi: the message received */

	/* The answer: alive until the batch that sends it completes. */
	grpc_byte_buffer *resp;
	grpc_slice status_details;
	int has_details;
	grpc_metadata trailer[1];
	char trailer_val[24];

	/* Subscribe state, under mu. */
	pthread_mutex_t mu;
	histd_sub *sub;
	int md_sent;           /* initial metadata went out */
	int in_flight;         /* a SEND_MESSAGE batch is outstanding */
	int hub_calling;       /* hub calls running (sent, start_replay) */
	int finish_pending;    /* status to send once the send completes */
	int status_started;
	int closed;            /* RECV_CLOSE_ON_SERVER completed */
	int unsubscribed;
	int more_pending;      /* t_more posted or its part being read */
	struct histd_replay *replay;   /* the replay's parts (subscribe.c) */
	grpc_byte_buffer *send_buf;
	grpc_status_code st_code;      /* the status sent (metrics) */
	/* The caller's tenant as histd_auth_check gave it (NULL without
	 * authentication): checked again before each event is sent. */
	const char *auth_tenant;

	/* Health Watch, under srv->health_mu. */
	struct histd_call *watch_next, *watch_prev;
	int watch_sent;        /* the status last sent (-1: none yet) */
	int watch_listed;
	int watch_known;       /* the service asked about exists */

	/* Reflection, under srv->refl_mu. */
	struct histd_call *refl_next, *refl_prev;
	int refl_listed;
	/* Under mu: the stream's status was sent; nothing more is started. */
	int refl_finished;
};

/* ThreadSanitizer (HISTD_TSAN) cannot see the order gRPC gives a batch:
 * started on one thread, its tag comes out of grpc_completion_queue_next
 * on another, through locks inside gRPC that are not instrumented. So a
 * batch's start is marked as a release on its tag, and dispatch acquires
 * the tag it is handed: what was written before the start is ordered
 * before what its completion reads, and nothing else is. One batch of a
 * kind is outstanding at a time, so a tag stands for one batch. Likewise
 * an event sent as a slice is released when handed to gRPC and acquired
 * by its unref, which gRPC calls on a thread of its own. */
#ifdef HISTD_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define histd_tsan_release(t) __tsan_release(t)
#define histd_tsan_acquire(t) __tsan_acquire(t)
#else
#define histd_tsan_release(t) ((void)(t))
#define histd_tsan_acquire(t) ((void)(t))
#endif

/* grpc_call_start_batch on the call of c, with tag (one of c's). */
static inline grpc_call_error
histd_call_start_batch(struct histd_call *c, const grpc_op *ops, size_t n,
		       struct histd_tag *tag)
{
	histd_tsan_release(tag);
	return grpc_call_start_batch(c->call, ops, n, tag, NULL);
}

void histd_call_ref(struct histd_call *c);
void histd_call_unref(struct histd_call *c);

/* The request bytes of a call (payload), as a slice the caller unrefs;
 * 0, or -1 if there is no payload. */
int histd_call_request_bytes(struct histd_call *c, grpc_slice *out);

/* Who is calling (authorization metadata). With `count` HISTD_COUNT_CALL,
 * the call counts against the tenant's calls in progress until it is
 * freed; with HISTD_COUNT_STREAM against its Subscribe streams (which hold
 * no thread). 0, or EUNAUTH / ELIMIT with the thread's message set. */
enum { HISTD_COUNT_NONE, HISTD_COUNT_CALL, HISTD_COUNT_STREAM };
int histd_call_caller(struct histd_call *c, histd_caller *who, int count);

/* health.c: Check answers from srv->serving; Watch streams it. */
#define HEALTH_WATCH_PATH "/grpc.health.v1.Health/Watch"
void histd_health_start(struct histd_server *s);
void histd_health_stop(struct histd_server *s);   /* sends NOT_SERVING */
void histd_health_watch_begin(struct histd_call *c);
void histd_health_on_send(struct histd_call *c, int ok);
void histd_health_on_close(struct histd_call *c);

/* subscribe.c */
void histd_subscribe_begin(struct histd_call *c);
void histd_subscribe_on_send(struct histd_call *c, int ok);
void histd_subscribe_on_close(struct histd_call *c);
void histd_subscribe_on_status(struct histd_call *c, int ok);
void histd_subscribe_on_more(struct histd_call *c);

#endif
