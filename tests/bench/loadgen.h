/*
 * The load generator of histd-bench, on gRPC C core.
 *
 * A client is a set of worker threads, each polling its own completion
 * queue, and a set of channels (connections) to one target. Every
 * asynchronous batch started through this client carries a bench_tag; the
 * worker that dequeues it calls tag->done. Nothing blocks per call: a
 * closed-loop run keeps `callers` unary calls in flight, each caller
 * starting its next call from the completion of the previous one.
 *
 * Threads: bench_client_new/free, bench_unary_sync and bench_client_run are
 * called from one controlling thread (main). bench_unary_start may be called
 * from any thread, including from a tag's done callback on a worker.
 */
#ifndef HISTD_BENCH_LOADGEN_H
#define HISTD_BENCH_LOADGEN_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

/* CLOCK_MONOTONIC in nanoseconds; comparable across processes of the host. */
uint64_t bench_now_ns(void);

/* ---------------------------------------------------------------------
 * Latency samples: an unsorted array of nanoseconds, sorted once at the end
 * of a phase. One owner per array at a time (callers record into their own
 * and are merged after the run), so no locks. */
typedef struct bench_lat {
	uint64_t *ns;
	size_t n, cap;
} bench_lat;

/* Appends a sample; 0 or -1 if out of memory (the sample is then lost). */
int bench_lat_add(bench_lat *l, uint64_t ns);
/* Moves every sample of *from into *into; *from is left empty. */
int bench_lat_merge(bench_lat *into, bench_lat *from);
void bench_lat_sort(bench_lat *l);
/* The p-quantile (0 < p <= 1) of a sorted array in microseconds; 0 if
 * empty. Nearest rank: the smallest sample with at least p*n at or below. */
double bench_lat_quantile_us(const bench_lat *l, double p);
void bench_lat_free(bench_lat *l);

/* ---------------------------------------------------------------------
 * Methods the bench calls, registered once per channel. */
enum bench_method {
	BENCH_M_HEALTH_CHECK,
	BENCH_M_CREATE_SESSION,
	BENCH_M_GET_SESSION,
	BENCH_M_APPEND,
	BENCH_M_GET_MESSAGES,
	BENCH_M_SUBSCRIBE,
	BENCH_M_REDUCE,
	BENCH_M_SEARCH,
	BENCH_M_COUNT
};
extern const char *const bench_method_paths[BENCH_M_COUNT];

/* What a worker calls when it dequeues a batch's tag; ok is the event's
 * success flag. Embed it first in a per-batch struct and cast back. */
typedef struct bench_tag bench_tag;
struct bench_tag {
	void (*done)(bench_tag *t, int ok);
};

typedef struct bench_client bench_client;

/* Connects to target ("host:port"): `threads` workers (each its own queue)
 * and `connections` channels (each its own HTTP/2 connection: the local
 * subchannel pool keeps channels from sharing one). Returns 0, or -1 with a
 * line on stderr. grpc_init must have been called. */
int bench_client_new(bench_client **out, const char *target, size_t threads,
		     size_t connections);
/* Every call started through the client must have completed and been
 * released. */
void bench_client_free(bench_client *c);

size_t bench_client_threads(const bench_client *c);
size_t bench_client_connections(const bench_client *c);

/* A new call of method m on connection (slot % connections) whose
 * completions go to worker (slot % threads). The caller owns the call and
 * unrefs it with grpc_call_unref. NULL if core refuses. */
grpc_call *bench_client_call(bench_client *c, enum bench_method m,
			     size_t slot, gpr_timespec deadline);

/* Seconds from now on the realtime clock, for call deadlines. */
gpr_timespec bench_deadline(double seconds);

/* Packs a protobuf-c message into a new slice (the caller unrefs it). */
grpc_slice bench_pack(const ProtobufCMessage *m);

/* Copies a whole byte buffer into a malloc'ed flat array (the caller frees
 * it); NULL with *len 0 for an empty buffer or out of memory. */
uint8_t *bench_flatten(grpc_byte_buffer *bb, size_t *len);

/* ---------------------------------------------------------------------
 * One asynchronous unary call: all six operations in one batch. */
typedef struct bench_unary bench_unary;
struct bench_unary {
	bench_tag tag;               /* first: the batch's tag */
	/* Called on a worker once the call completed (status in `status`).
	 * The callback may read `response` and must call bench_unary_release
	 * (directly or later) before starting the same struct again. */
	void (*on_done)(bench_unary *u);
	void *arg;                   /* the owner's */
	grpc_call *call;
	grpc_byte_buffer *request;
	grpc_byte_buffer *response;  /* NULL unless a message arrived */
	grpc_metadata_array initial_md, trailing_md;
	grpc_status_code status;
	grpc_slice details;
	uint64_t start_ns;           /* set by bench_unary_start */
};

/* Starts u on (method m, slot) with the request bytes in req (the slice is
 * referenced, not taken). Returns 0, or -1 (nothing started, on_done will
 * not be called, u holds nothing). */
int bench_unary_start(bench_client *c, bench_unary *u, enum bench_method m,
		      size_t slot, grpc_slice req, double timeout_s);
/* Frees what a completed call holds; u can be started again. */
void bench_unary_release(bench_unary *u);
/* The status details as a NUL-terminated string into buf (truncated). */
void bench_unary_details(const bench_unary *u, char *buf, size_t size);

/* One call, waited for on the controlling thread. On return *status and
 * details are set (details may be NULL); *response (may be NULL) is the
 * flattened response the caller frees. Returns 0 if the call ran (whatever
 * its status), -1 if it could not be started. */
int bench_unary_sync(bench_client *c, enum bench_method m,
		     const ProtobufCMessage *req, double timeout_s,
		     grpc_status_code *status, char *details, size_t dsize,
		     uint8_t **response, size_t *response_len);

/* ---------------------------------------------------------------------
 * A closed-loop run: `callers` callers, each keeping one call in flight. */
typedef struct bench_run_spec {
	enum bench_method method;
	size_t callers;
	/* Caller i sends requests[i % n_requests] on every call. Borrowed. */
	const grpc_slice *requests;
	size_t n_requests;
	/* Stop after `count` calls started in total, or (count 0) once
	 * `duration_s` seconds have passed; in-flight calls then complete. */
	uint64_t count;
	double duration_s;
	double timeout_s;            /* per call */
} bench_run_spec;

typedef struct bench_run_result {
	uint64_t ok;                 /* calls that ended with status OK */
	uint64_t errors;             /* the others (and failed starts) */
	grpc_status_code first_error;
	char first_error_details[160];
	double elapsed_s;            /* first start to last completion */
	bench_lat lat;               /* one sample per OK call; sorted */
} bench_run_result;

/* Runs and waits. Returns 0 (errors are counted in *out, which the caller
 * frees with bench_run_result_free), or -1 if the run could not start. */
int bench_client_run(bench_client *c, const bench_run_spec *spec,
		     bench_run_result *out);
void bench_run_result_free(bench_run_result *r);

#endif
