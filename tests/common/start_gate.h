/*
 * start_gate.h - start test threads, together if they race, and never
 * leave one behind when another cannot start.
 *
 * A test that asserts on pthread_create inside its loop leaves the
 * threads already started running on the test frame's variables after
 * the failed assertion returns from it, and a pthread barrier would keep
 * them waiting for ever. start_threads opens the gate instead, joins the
 * threads that did start, and returns the error for the test to fail on.
 */
#ifndef HISTD_TEST_START_GATE_H
#define HISTD_TEST_START_GATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct start_gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n, waiting;
	bool open;
} start_gate;

void start_gate_init(start_gate *g, int n);
void start_gate_destroy(start_gate *g);

/* Returns once n threads wait here, or at once if the gate is open. */
void start_gate_wait(start_gate *g);

/*
 * Runs fn on n threads, thread i with (char *)args + i * arg_size (the
 * same args for all when arg_size is 0); g is the gate they wait at, or
 * NULL. 0 when all started (the caller joins them); otherwise
 * pthread_create's error, after opening g and joining the threads that
 * did start, so that none outlives the caller's variables.
 */
int start_threads(pthread_t *th, int n, void *(*fn)(void *), void *args,
		  size_t arg_size, start_gate *g);

#endif
