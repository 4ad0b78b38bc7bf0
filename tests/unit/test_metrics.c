/*
 * Gauge collectors (server/metrics.h): one removed is never called again,
 * also not by a scrape that was running when it was removed.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "metrics.h"

struct gauge {
	atomic_int entered;   /* calls started */
	atomic_int done;      /* calls finished */
	int slow_ms;          /* each call takes this long */
};

static void
collect(void *ctx, FILE *out)
{
	struct gauge *g = ctx;

	atomic_fetch_add(&g->entered, 1);
	if (g->slow_ms) {
		struct timespec ts = { 0, (long)g->slow_ms * 1000000 };

		nanosleep(&ts, NULL);
	}
	fprintf(out, "test_gauge 1\n");
	atomic_fetch_add(&g->done, 1);
}

static int
renders_gauge(void)
{
	char *body = histd_metrics_render();
	int has;

	assert_non_null(body);
	has = strstr(body, "test_gauge 1\n") != NULL;
	free(body);
	return has;
}

static void
removed_collector_is_not_called(void **state)
{
	struct gauge g = { 0 };

	(void)state;
	histd_metrics_add_collector(collect, &g);
	assert_true(renders_gauge());
	histd_metrics_remove_collector(collect, &g);
	assert_false(renders_gauge());
	assert_int_equal(atomic_load(&g.entered), 1);
}

static void *
scrape(void *arg)
{
	(void)arg;
	free(histd_metrics_render());
	return NULL;
}

/* The transport frees its server right after removing its collector:
 * a scrape in progress must be over by then. */
static void
remove_waits_for_a_running_scrape(void **state)
{
	struct gauge g = { .slow_ms = 200 };
	pthread_t t;
	int done;

	(void)state;
	histd_metrics_add_collector(collect, &g);
	assert_int_equal(pthread_create(&t, NULL, scrape, NULL), 0);
	while (!atomic_load(&g.entered)) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
	histd_metrics_remove_collector(collect, &g);
	done = atomic_load(&g.done);
	pthread_join(t, NULL);      /* before asserting: it uses g */
	assert_int_equal(done, 1);
	assert_false(renders_gauge());
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(removed_collector_is_not_called),
		cmocka_unit_test(remove_waits_for_a_running_scrape),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
