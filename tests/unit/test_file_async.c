/*
 * The file driver's asynchronous appends (histd_append.on_durable): the
 * driver answers HISTD_PENDING instead of blocking, and reports each such
 * append exactly once, after it is durable; what was reported survives a
 * reopen; closing the driver reports every append still waiting.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "driver.h"

#define THREADS 8
#define PER_THREAD 300

/* One append's report. */
typedef struct report {
	atomic_int calls;
	atomic_int rc;
} report;

static void
on_durable(void *ctx, int rc, const char *msg)
{
	report *r = ctx;

	(void)msg;
	atomic_store(&r->rc, rc);
	atomic_fetch_add(&r->calls, 1);
}

static char *
tmpdir_new(void)
{
	const char *base = getenv("TMPDIR");
	char *dir = malloc(256);

	assert_non_null(dir);
	snprintf(dir, 256, "%s/histd-async-XXXXXX", base && *base ? base : "/tmp");
	assert_non_null(mkdtemp(dir));
	return dir;
}

static void
tmpdir_free(char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (d) {
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				unlinkat(dirfd(d), e->d_name, 0);
		closedir(d);
	}
	rmdir(dir);
	free(dir);
}

static histd_driver *
must_open(const char *dir, const char *mode)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = mode };
	histd_driver *d = NULL;

	if (histd_driver_open("file", &cfg, &d))
		fail_msg("open %s: %s", dir, histd_error_message());
	return d;
}

static void
create(histd_driver *d, const char *id)
{
	histd_session in = { .tenant = "t", .id = (char *)id,
			     .created_at_us = 1700000000000000LL };
	histd_session *out = NULL;

	assert_int_equal(histd_driver_session_create(d, &in, &out), 0);
	histd_session_free(out);
}

/* Appends one message "<id> <n>" asking for a report in r; returns the
 * driver's answer. A key makes it idempotent (hash byte 1). */
static int
append_async(histd_driver *d, const char *id, int n, const char *key,
	     report *r, histd_append_result *res)
{
	uint8_t hash[HISTD_HASH_LEN];
	char body[64];
	histd_msg_in in;
	histd_append a = {
		.tenant = "t", .session_id = id, .idempotency_key = key,
		.request_hash = hash, .now_us = 1700000000000000LL,
		.idem_expires_us = 4000000000000000LL, .msgs = &in,
		.n_msgs = 1, .on_durable = on_durable, .durable_ctx = r,
	};
	int len = snprintf(body + 2, sizeof(body) - 2, "%s %d", id, n);

	body[0] = 0x1a;
	body[1] = (char)len;
	memset(hash, 1, sizeof(hash));
	in = (histd_msg_in){ .data = (const uint8_t *)body,
			     .len = (size_t)len + 2, .token_estimate = 1 };
	return histd_driver_append(d, &a, res);
}

/* Waits (bounded) until r has been reported. */
static void
wait_report(report *r)
{
	for (int i = 0; i < 10000 && !atomic_load(&r->calls); i++)
		usleep(1000);
	assert_int_equal(atomic_load(&r->calls), 1);
}

struct worker {
	histd_driver *d;
	char id[16];
	report reports[PER_THREAD];
	int answers[PER_THREAD];
	uint64_t seqs[PER_THREAD];
};

static void *
worker_main(void *arg)
{
	struct worker *w = arg;

	for (int i = 0; i < PER_THREAD; i++) {
		histd_append_result res = { 0 };

		w->answers[i] = append_async(w->d, w->id, i, NULL,
					     &w->reports[i], &res);
		w->seqs[i] = res.first_seq;
	}
	return NULL;
}

/* Concurrent appends in one mode: every one is answered 0 or PENDING with
 * its seq, every PENDING one is reported exactly once with 0, none other
 * is reported, and all of them are there after a reopen. */
static void
run_mode(const char *mode)
{
	char *dir = tmpdir_new();
	histd_driver *d = must_open(dir, mode);
	struct worker *w = calloc(THREADS, sizeof(*w));
	pthread_t th[THREADS];
	int pending = 0, started = 0;

	assert_non_null(w);
	for (int t = 0; t < THREADS; t++) {
		w[t].d = d;
		snprintf(w[t].id, sizeof(w[t].id), "s%d", t);
		create(d, w[t].id);
	}
	while (started < THREADS && pthread_create(&th[started], NULL,
						   worker_main, &w[started]) == 0)
		started++;
	for (int t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(started, THREADS);
	for (int t = 0; t < THREADS; t++)
		for (int i = 0; i < PER_THREAD; i++) {
			report *r = &w[t].reports[i];

			assert_int_equal(w[t].seqs[i], (uint64_t)i + 1);
			if (w[t].answers[i] == HISTD_PENDING) {
				pending++;
				wait_report(r);
				assert_int_equal(atomic_load(&r->rc), 0);
			} else {
				assert_int_equal(w[t].answers[i], 0);
			}
		}
	/* Nothing is reported twice, nor anything answered at once. */
	usleep(20000);
	for (int t = 0; t < THREADS; t++)
		for (int i = 0; i < PER_THREAD; i++)
			assert_int_equal(atomic_load(&w[t].reports[i].calls),
					 w[t].answers[i] == HISTD_PENDING);
	/* Group commit makes most of them wait for a sync. */
	if (strcmp(mode, "never") != 0)
		assert_true(pending > THREADS * PER_THREAD / 2);
	histd_driver_close(d);

	d = must_open(dir, mode);
	for (int t = 0; t < THREADS; t++) {
		histd_read q = { .tenant = "t", .session_id = w[t].id };
		histd_read_result rr = { 0 };

		assert_int_equal(histd_driver_read(d, &q, &rr), 0);
		assert_int_equal(rr.records.n, PER_THREAD);
		for (size_t i = 0; i < rr.records.n; i++)
			assert_int_equal(rr.records.v[i].seq, i + 1);
		histd_read_result_clear(&rr);
	}
	histd_driver_close(d);
	free(w);
	tmpdir_free(dir);
}

static void
batch_mode_reports_every_pending_append_once_and_keeps_it(void **state)
{
	(void)state;
	run_mode("batch");
}

static void
always_mode_reports_every_pending_append_once_and_keeps_it(void **state)
{
	(void)state;
	run_mode("always");
}

static void
never_mode_reports_every_pending_append_once_and_keeps_it(void **state)
{
	(void)state;
	run_mode("never");
}

/* A replay of a durable idempotent append is answered at once: no report. */
static void
idempotent_replay_is_answered_without_a_report(void **state)
{
	char *dir = tmpdir_new();
	histd_driver *d = must_open(dir, "batch");
	report first = { 0 }, again = { 0 };
	histd_append_result r1 = { 0 }, r2 = { 0 };
	int rc;

	(void)state;
	create(d, "s");
	rc = append_async(d, "s", 1, "key-1", &first, &r1);
	assert_true(rc == 0 || rc == HISTD_PENDING);
	if (rc == HISTD_PENDING)
		wait_report(&first);
	assert_int_equal(append_async(d, "s", 1, "key-1", &again, &r2), 0);
	assert_int_equal(r2.replayed, 1);
	assert_int_equal(r2.first_seq, r1.first_seq);
	usleep(20000);
	assert_int_equal(atomic_load(&again.calls), 0);
	histd_driver_close(d);
	tmpdir_free(dir);
}

/* Closing the driver reports every append still waiting, before it
 * returns: an accepted append is never left unanswered. */
static void
close_reports_every_waiting_append(void **state)
{
	char *dir = tmpdir_new();
	histd_driver *d = must_open(dir, "always");
	report r[200];
	int answers[200];

	(void)state;
	memset(r, 0, sizeof(r));
	create(d, "s");
	for (int i = 0; i < 200; i++) {
		histd_append_result res = { 0 };

		answers[i] = append_async(d, "s", i, NULL, &r[i], &res);
		assert_true(answers[i] == 0 || answers[i] == HISTD_PENDING);
	}
	histd_driver_close(d);
	for (int i = 0; i < 200; i++) {
		assert_int_equal(atomic_load(&r[i].calls),
				 answers[i] == HISTD_PENDING);
		assert_int_equal(atomic_load(&r[i].rc), 0);
	}
	d = must_open(dir, "always");
	{
		histd_read q = { .tenant = "t", .session_id = "s" };
		histd_read_result rr = { 0 };

		assert_int_equal(histd_driver_read(d, &q, &rr), 0);
		assert_int_equal(rr.records.n, 200);
		histd_read_result_clear(&rr);
	}
	histd_driver_close(d);
	tmpdir_free(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(batch_mode_reports_every_pending_append_once_and_keeps_it),
		cmocka_unit_test(always_mode_reports_every_pending_append_once_and_keeps_it),
		cmocka_unit_test(never_mode_reports_every_pending_append_once_and_keeps_it),
		cmocka_unit_test(idempotent_replay_is_answered_without_a_report),
		cmocka_unit_test(close_reports_every_waiting_append),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
