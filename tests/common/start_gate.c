/*
 * start_gate.c - see start_gate.h.
 */
#include "start_gate.h"

void start_gate_init(start_gate *g, int n)
{
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	g->n = n;
	g->waiting = 0;
	g->open = false;
}

void start_gate_destroy(start_gate *g)
{
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
}

static void start_gate_open(start_gate *g)
{
	pthread_mutex_lock(&g->mu);
	g->open = true;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

void start_gate_wait(start_gate *g)
{
	pthread_mutex_lock(&g->mu);
	if (++g->waiting >= g->n) {
		g->open = true;
		pthread_cond_broadcast(&g->cv);
	}
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

int start_threads(pthread_t *th, int n, void *(*fn)(void *), void *args,
		  size_t arg_size, start_gate *g)
{
	int started, rc = 0;

	for (started = 0; started < n; started++) {
		rc = pthread_create(&th[started], NULL, fn,
				    (char *)args + (size_t)started * arg_size);
		if (rc != 0)
			break;
	}
	if (rc == 0)
		return 0;
	if (g)
		start_gate_open(g);
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	return rc;
}
