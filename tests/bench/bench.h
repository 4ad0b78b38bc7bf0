/*
 * histd-bench internals shared by bench.c (options, report, main) and
 * phases.c (what each phase sends and measures).
 */
#ifndef HISTD_BENCH_BENCH_H
#define HISTD_BENCH_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "loadgen.h"
#include "proc.h"

/* The conditions the targets are defined for. */
#define TARGET_DRIVER "memory"
#define TARGET_CALLERS 16
#define TARGET_MSG_SIZE 1024
#define TARGET_SUBSCRIBERS 100

struct options {
	const char *histd;
	const char *target;
	long server_pid;
	const char *driver;
	unsigned server_threads;
	const char *server_log;
	const char **histd_args;
	size_t n_histd_args;
	size_t client_threads;
	size_t connections;
	size_t concurrency;
	size_t message_size;
	uint64_t count;          /* per measured phase; 0: by duration */
	double duration_s;       /* per measured phase, over all rounds */
	double warmup_s;
	size_t rounds;           /* interleaved slices of the closed phases */
	size_t session_length;
	size_t short_length;
	size_t fill_batch;
	size_t append_sessions;  /* 0: one per caller */
	size_t subscribers;
	double rate;             /* fan-out appends per second */
	double timeout_s;        /* per call */
	int strict;
	char phases[128];
};

/* One line of the results table. */
struct row {
	char name[48];
	int ran;
	uint64_t calls, errors;
	double tput, p50, p99;   /* calls/s, µs */
	double srv_cpu;          /* µs per call; < 0 unknown */
	double cli_cpu;          /* µs per call; < 0 unknown */
	double other;            /* other processes' CPU, % of a core; < 0 unknown */
	int paced;               /* calls at our rate: no throughput ratio */
	char note[256];
};

enum row_id {
	R_NULL, R_APPEND, R_GET_SHORT, R_GET_LONG, R_SUB_APPEND, R_SUB_DELIVERY,
	R_CTX_RAW, R_CTX_VIEW,      /* context: RAW last-20 vs CONTEXT */
	R_CMP_BASE, R_CMP_APPEND,   /* compaction: Append without / with */
	R_SEARCH_GET, R_SEARCH,     /* search: last-20 vs lexical Search */
	R_COUNT
};

struct memory {
	int ran;
	uint64_t rss_before, rss_after, messages;
	double per_message;      /* bytes of VmRSS per stored message */
	size_t packed;           /* one stored Message, packed */
	double stats_bytes;      /* SessionStats.bytes / message_count; 0 n/a */
};

struct bench {
	struct options o;
	bench_client *c;
	bench_server srv;
	pid_t pid;               /* the server's, for /proc; 0 unknown */
	char tag[32];            /* session id prefix of this run */
	char *text;              /* message_size characters */
	struct row rows[R_COUNT];
	struct memory mem;
	int failed;              /* a call failed or a phase could not run */
	struct stub *stub;       /* the provider stub (compaction phase) */
	unsigned stub_calls;     /* provider calls during compaction slices */
	int server_died;         /* our server exited during the run */
};

/* 1 if `name` is in the --phases list. */
int bench_phase_on(const struct options *o, const char *name);

/* 1 while the server runs (or is not ours); else logs why, marks the run
 * failed and returns 0. */
int bench_server_alive(struct bench *b);

/* Waits until Health/Check "" answers SERVING; 0 or -1 (said on stderr). */
int bench_wait_serving(struct bench *b, double timeout_s);

/*
 * The closed-loop phases (null, append, get), each selected by --phases:
 * prepares their sessions and requests (the get fill also measures memory
 * into b->mem), then measures them in b->o.rounds interleaved slices so
 * that a change of background load hits every phase alike, and fills
 * their rows. Failures are noted in the rows and set b->failed.
 */
void bench_closed_phases(struct bench *b);

/* The Subscribe fan-out phase; fills R_SUB_APPEND and R_SUB_DELIVERY. */
void bench_subscribe_phase(struct bench *b);

/*
 * The context phase: a 10,000-message session (tool calls and results
 * among them) with the pipeline compaction, masking:keep_recent_results=3,
 * window:max_messages=20 and a summary made by Reduce half-way through the
 * fill; GetMessages view CONTEXT against RAW last_n=20 on the same
 * session, in interleaved slices. Fills R_CTX_RAW and R_CTX_VIEW.
 */
void bench_context_phase(struct bench *b);

/*
 * The compaction phase: Append of one message per call on sessions whose
 * compaction (summarizer=anthropic, auto_reduce_when=messages>=200) calls
 * the provider stub, which takes 2 s per call, against Append on plain
 * sessions, in interleaved slices with the compactions drained between.
 * Needs b->stub (the server configured with its URL). Fills R_CMP_BASE
 * and R_CMP_APPEND.
 */
void bench_compaction_phase(struct bench *b);

/*
 * The search phase: 100,000 messages of 25 words (from a vocabulary of
 * 5,000 with a Zipf-like spread, so that words are common or rare as in
 * prose) in 10 sessions of one tenant; lexical Search over the whole
 * tenant (k 10, two-word queries, one per caller) against GetMessages
 * last_n=20 on one of those sessions, in interleaved slices. Fills
 * R_SEARCH_GET and R_SEARCH.
 */
void bench_search_phase(struct bench *b);

/* Seconds one stub provider call takes in the compaction phase. */
#define BENCH_STUB_DELAY_MS 2000
/* Server flags the compaction phase needs (after the stub started). */
#define BENCH_COMPACTION_WORKERS "4"

#endif
