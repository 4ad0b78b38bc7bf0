/*
 * The Subscribe fan-out phase: many subscribers on one session, one
 * appender appending at a steady rate on the same client.
 *
 * Each appended message carries, in its metadata, the monotonic time the
 * append was sent ("bench-sent-ns") and the pump it belongs to
 * ("bench-pump"). A subscriber's delivery latency for an event is the time
 * its RECV_MESSAGE completed minus that send time; both clocks are this
 * process's, so no clock skew enters. The appender's own Append latencies
 * are measured over the same window.
 *
 * Threads: everything here is called from the controlling thread; the
 * streams and appends complete on the client's workers.
 */
#ifndef HISTD_BENCH_FANOUT_H
#define HISTD_BENCH_FANOUT_H

#include <stddef.h>
#include <stdint.h>

#include "loadgen.h"

typedef struct bench_fanout_spec {
	const char *session_id;   /* an existing, empty session */
	size_t subscribers;
	double rate;              /* appends per second */
	size_t message_size;      /* bytes of the text block */
	size_t max_in_flight;     /* appends outstanding at most (> 0) */
} bench_fanout_spec;

typedef struct bench_fanout_result {
	uint64_t appends_ok, append_errors;
	uint64_t appends_skipped;    /* due at a tick while max_in_flight */
	grpc_status_code first_append_error;
	char first_append_details[160];
	bench_lat append_lat;        /* sorted */
	double elapsed_s;            /* first append sent to last delivery */
	uint64_t deliveries;         /* events of this pump received */
	uint64_t expected;           /* appends_ok x streams still open */
	bench_lat delivery_lat;      /* sorted */
	int drained;                 /* every open stream got the last seq */
	size_t streams_ended;        /* streams the server ended so far */
	grpc_status_code first_end_status;
	char first_end_details[160];
} bench_fanout_result;

typedef struct bench_fanout bench_fanout;

/*
 * Opens spec->subscribers Subscribe streams (after_seq 0) spread over the
 * client's connections, appends one message and waits up to timeout_s
 * until every stream received it, so that all are live before measuring.
 * Returns 0, or -1 with a line on stderr (everything opened is closed).
 * spec is copied; session_id must outlive the fan-out.
 */
int bench_fanout_open(bench_fanout **out, bench_client *c,
		      const bench_fanout_spec *spec, double timeout_s);

/*
 * Appends at spec->rate: `count` appends, or (count 0) for duration_s
 * seconds; then waits up to drain_s for every open stream to receive the
 * last appended message. *out (freed with bench_fanout_result_free) holds
 * only this pump's appends and deliveries. Returns 0 or -1.
 */
int bench_fanout_pump(bench_fanout *f, uint64_t count, double duration_s,
		      double drain_s, bench_fanout_result *out);
void bench_fanout_result_free(bench_fanout_result *r);

/* Cancels every stream, waits for their ends and frees the fan-out. */
void bench_fanout_close(bench_fanout *f);

#endif
