/*
 * PostgreSQL stopped under load, then started again, with a real histd:
 * - every call fails UNAVAILABLE while it is down (none hangs, none says OK
 *   for a write that is then lost), health says NOT_SERVING;
 * - histd recovers by itself within seconds once PostgreSQL is back,
 *   health says SERVING;
 * - every append acknowledged OK is stored, before and after;
 * - a Subscribe stream opened before the outage lives through it and
 *   delivers every stored message of its session in order, without a gap.
 *
 * Once with a fast shutdown (backends terminated), once with an immediate
 * one (a crash: PostgreSQL recovers from its WAL at the next start), and
 * once stuck: every process of the cluster stopped with SIGSTOP, its
 * sockets open, so that connections neither fail nor answer (a hung host).
 * There histd gives up on a statement --pg-timeout-ms and 2 s after
 * sending it: calls end UNAVAILABLE before the caller's deadline, never
 * hang. And frozen while histd must connect: a connect that gives up
 * takes PostgreSQL as down, so the next call fails at once. The cluster
 * is this test's own (it is stopped), made with pgtest.sh.
 *
 * Usage: pg_outage <histd binary>, with $HISTD_PGTEST.
 */
#include <inttypes.h>
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

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"
#include "pgharness.h"

#define LOADERS 4
#define CALL_MS 5000

static char dir[128], state[192];
static char *cluster;

static int
group_setup(void **st)
{
	(void)st;
	snprintf(dir, sizeof(dir), "/tmp/histd-outage-XXXXXX");
	if (!mkdtemp(dir))
		return -1;
	snprintf(state, sizeof(state), "%s/cluster.state", dir);
	return pgh_cluster_start(state, &cluster);
}

static int
group_teardown(void **st)
{
	(void)st;
	pgh_cluster("stop", state, NULL);
	rmdir(dir);
	free(cluster);
	return 0;
}

/* ------------------------------------------------------------------------
 * Load */

typedef struct acked {
	uint64_t seq;
	char text[48];
	int session;            /* LOADERS: the watched one */
} acked;

typedef struct loader {
	histd_client *c;
	int id;
	char **sessions;        /* LOADERS + 1 */
	atomic_int *stop;
	acked *ok;
	size_t n_ok, cap;
	int n_unavailable;
	int n_other;
	grpc_status_code other_code;
	atomic_llong last_ok_ms;
} loader;

/* One Append; its code, and its status message in `details` if given. */
static grpc_status_code
append_one(histd_client *c, const char *session, const char *text, uint64_t *seq,
	   char *details, size_t details_size)
{
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER, text);
	Histd__V1__AppendResponse *resp = NULL;
	histd_status st;
	grpc_status_code code;

	req.session_id = (char *)session;
	req.n_messages = 1;
	req.messages = &m;
	histd_status_init(&st);
	histd_client_unary(c, HISTD_PATH("Append"), &req.base,
			   &histd__v1__append_response__descriptor, CALL_MS, NULL,
			   (ProtobufCMessage **)&resp, &st);
	code = st.code;
	if (details)
		snprintf(details, details_size, "%s", st.details ? st.details : "");
	if (resp) {
		*seq = resp->first_seq;
		histd_client_message_free(&resp->base);
	}
	histd_status_reset(&st);
	ta_free(a);
	return code;
}

static void *
load(void *arg)
{
	loader *l = arg;

	for (int n = 0; !atomic_load(l->stop); n++) {
		/* Every other append goes to the watched session. */
		int s = n % 2 ? LOADERS : l->id;
		char text[48];
		uint64_t seq = 0;
		grpc_status_code code;

		snprintf(text, sizeof(text), "l%d-%d", l->id, n);
		code = append_one(l->c, l->sessions[s], text, &seq, NULL, 0);
		if (code == GRPC_STATUS_OK) {
			if (l->n_ok == l->cap) {
				l->cap = l->cap ? l->cap * 2 : 1024;
				l->ok = realloc(l->ok, l->cap * sizeof(*l->ok));
				if (!l->ok)
					abort();
			}
			l->ok[l->n_ok].seq = seq;
			l->ok[l->n_ok].session = s;
			snprintf(l->ok[l->n_ok].text, sizeof(l->ok[0].text), "%s", text);
			/* The main thread reads n_ok while this runs. */
			__atomic_store_n(&l->n_ok, l->n_ok + 1, __ATOMIC_RELAXED);
			atomic_store(&l->last_ok_ms, t_now_ms());
		} else if (code == GRPC_STATUS_UNAVAILABLE) {
			l->n_unavailable++;
			usleep(20000);
		} else {
			l->n_other++;
			l->other_code = code;
			usleep(20000);
		}
	}
	return NULL;
}

/* ------------------------------------------------------------------------
 * A subscriber reading in its own thread (no cmocka asserts off the main
 * thread: it records what went wrong). */

typedef struct watcher {
	histd_client_stream *st;
	atomic_int stop;
	atomic_ullong next_seq;  /* the next seq it must see */
	char **text;             /* by seq */
	size_t cap;
	char error[160];
	int ended;
} watcher;

static void *
watch(void *arg)
{
	watcher *w = arg;
	uint64_t last_rev = 0;

	while (!atomic_load(&w->stop)) {
		ProtobufCMessage *m = NULL;
		int r = histd_client_stream_next(w->st, &histd__v1__history_event__descriptor,
						 200, &m);
		Histd__V1__HistoryEvent *ev = (Histd__V1__HistoryEvent *)m;

		if (r == HISTD_STREAM_TIMEOUT)
			continue;
		if (r != HISTD_STREAM_MESSAGE) {
			const histd_status *st = histd_client_stream_status(w->st);

			snprintf(w->error, sizeof(w->error), "stream ended: %s %s",
				 st ? histd_status_code_name(st->code) : "?",
				 st && st->details ? st->details : "");
			w->ended = 1;
			return NULL;
		}
		if (ev->revision <= last_rev && !w->error[0])
			snprintf(w->error, sizeof(w->error), "revision %" PRIu64
				 " after %" PRIu64, ev->revision, last_rev);
		last_rev = ev->revision;
		if (ev->event_case != HISTD__V1__HISTORY_EVENT__EVENT_APPENDED) {
			if (!w->error[0])
				snprintf(w->error, sizeof(w->error), "event %d",
					 ev->event_case);
		} else {
			for (size_t i = 0; i < ev->appended->n_messages; i++) {
				const Histd__V1__Message *msg = ev->appended->messages[i];
				uint64_t want = atomic_load(&w->next_seq);

				if (msg->seq != want && !w->error[0])
					snprintf(w->error, sizeof(w->error), "seq %" PRIu64
						 " arrived, %" PRIu64 " expected", msg->seq, want);
				if (msg->seq >= w->cap) {
					size_t cap = w->cap ? w->cap * 2 : 1024;

					while (cap <= msg->seq)
						cap *= 2;
					w->text = realloc(w->text, cap * sizeof(*w->text));
					if (!w->text)
						abort();
					memset(w->text + w->cap, 0, (cap - w->cap) * sizeof(char *));
					w->cap = cap;
				}
				free(w->text[msg->seq]);
				w->text[msg->seq] = strdup(tm_first_text(msg));
				atomic_store(&w->next_seq, msg->seq + 1);
			}
		}
		histd_client_message_free(&ev->base);
	}
	return NULL;
}

/* ------------------------------------------------------------------------
 * Checks */

static int
health(histd_client *c)
{
	Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	Grpc__Health__V1__HealthCheckResponse *resp = NULL;
	histd_status st;
	int status = -1;

	histd_status_init(&st);
	if (histd_client_unary(c, HISTD_PATH_HEALTH_CHECK, &req.base,
			       &grpc__health__v1__health_check_response__descriptor,
			       2000, NULL, (ProtobufCMessage **)&resp, &st) == 0) {
		status = resp->status;
		histd_client_message_free(&resp->base);
	}
	histd_status_reset(&st);
	return status;
}

static int
wait_health(histd_client *c, int want, int timeout_ms)
{
	int64_t give_up = t_now_ms() + timeout_ms, start = t_now_ms();

	while (t_now_ms() < give_up) {
		if (health(c) == want)
			return (int)(t_now_ms() - start);
		usleep(50000);
	}
	return -1;
}

/* Every stored message of a session, text by seq (NULL where none), in
 * *out. Asserts nothing (the watcher may still run): 0, or -1 with why. */
static int
stored(histd_client *c, const char *session, char ***out, uint64_t *last,
       char *why, size_t why_size)
{
	char **text = NULL;
	size_t cap = 0;
	uint64_t after = 0;

	*last = 0;
	for (;;) {
		Histd__V1__GetMessagesResponse *r;
		histd_status st;

		histd_status_init(&st);
		t_try_get_raw(c, session, after, 1000, &r, &st);
		if (!r) {
			snprintf(why, why_size, "GetMessages %s after %" PRIu64
				 ": status %d: %s", session, after,
				 (int)st.code, st.details ? st.details : "");
			histd_status_reset(&st);
			goto fail;
		}
		histd_status_reset(&st);
		for (size_t i = 0; i < r->n_messages; i++) {
			const Histd__V1__Message *m = r->messages[i];

			if (m->seq >= cap) {
				size_t nc = cap ? cap * 2 : 1024;
				char **grown;

				while (nc <= m->seq)
					nc *= 2;
				grown = realloc(text, nc * sizeof(*text));
				if (!grown) {
					snprintf(why, why_size, "out of memory");
					histd_client_message_free(&r->base);
					goto fail;
				}
				text = grown;
				memset(text + cap, 0, (nc - cap) * sizeof(*text));
				cap = nc;
			}
			free(text[m->seq]);
			text[m->seq] = strdup(tm_first_text(m));
			*last = m->seq;
		}
		after = r->next_after_seq;
		histd_client_message_free(&r->base);
		if (!after)
			break;
	}
	*out = text;
	return 0;
fail:
	for (size_t i = 0; i < cap; i++)
		free(text[i]);
	free(text);
	*last = 0;
	*out = NULL;
	return -1;
}

static void
free_texts(char **t, uint64_t last)
{
	for (uint64_t i = 0; t && i <= last; i++)
		free(t[i]);
	free(t);
}

/* ------------------------------------------------------------------------
 * The test */

/* In outage(), once threads run: a failed check stops and joins them before
 * the test fails, so that none outlives the frame its state lives in. */
#define CHECK(cond, ...)                                                \
	do {                                                            \
		if (!(cond)) {                                          \
			snprintf(why, sizeof(why), __VA_ARGS__);        \
			goto stop;                                      \
		}                                                       \
	} while (0)

static void
outage(const char *mode)
{
	char *db = pgh_new_database(cluster, mode);
	int stuck = !strcmp(mode, "stuck");
	const char *extra[] = {
		"--driver", "postgres", "--dsn", db, "--pool-size", "8",
		"--threads", "16", "--pg-timeout-ms", stuck ? "1000" : "30000",
		NULL,
	};
	histd_proc *p = NULL;
	histd_client *c;
	char *sessions[LOADERS + 1];
	pthread_t th[LOADERS], wth;
	loader l[LOADERS];
	watcher w = { .next_seq = 1 };
	atomic_int stop = 0;
	int ms, n_unavailable = 0, n_loaders = 0;
	int loaders_joined = 0, watcher_joined = 0, frozen = 0;
	int64_t up_at;
	size_t before_ok[LOADERS];
	char why[256];

	assert_non_null(db);
	assert_int_equal(harness_start(&p, extra), 0);
	c = harness_client(p);
	for (int i = 0; i <= LOADERS; i++) {
		char id[64];

		snprintf(id, sizeof(id), "%s-%d", mode, i);
		sessions[i] = t_create_session(c, id);
	}
	w.st = t_subscribe(c, sessions[LOADERS], 0);
	assert_int_equal(pthread_create(&wth, NULL, watch, &w), 0);
	for (int i = 0; i < LOADERS; i++) {
		l[i] = (loader){ .c = c, .id = i, .sessions = sessions, .stop = &stop };
		CHECK(pthread_create(&th[i], NULL, load, &l[i]) == 0,
		      "%s: cannot start loader %d", mode, i);
		n_loaders++;
	}
	usleep(1000000);
	CHECK(health(c) == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
	      "%s: health is not SERVING under load", mode);

	/* Down. */
	if (stuck)
		CHECK(pgh_cluster("freeze", state, NULL) == 0,
		      "%s: cannot freeze PostgreSQL", mode);
	else
		CHECK(pgh_cluster("halt", state, mode) == 0,
		      "%s: cannot stop PostgreSQL", mode);
	frozen = stuck;
	/* Stuck, the listener's probe waits its 3 s, then a connect its 3. */
	ms = wait_health(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING,
			 15000);
	print_message("%s: health NOT_SERVING %d ms after the stop\n", mode, ms);
	CHECK(ms >= 0, "%s: health not NOT_SERVING within 15 s of the stop", mode);
	usleep(1500000);
	for (int i = 0; i < LOADERS; i++)
		before_ok[i] = __atomic_load_n(&l[i].n_ok, __ATOMIC_RELAXED);
	usleep(1000000);
	/* Nothing succeeds while it is down. */
	for (int i = 0; i < LOADERS; i++) {
		size_t n_ok = __atomic_load_n(&l[i].n_ok, __ATOMIC_RELAXED);

		CHECK(n_ok == before_ok[i],
		      "%s: loader %d had %zu appends acknowledged while PostgreSQL was down",
		      mode, i, n_ok - before_ok[i]);
	}

	/* Up again: recovery without help. */
	CHECK(pgh_cluster(stuck ? "thaw" : "resume", state, NULL) == 0,
	      "%s: cannot start PostgreSQL", mode);
	frozen = 0;
	up_at = t_now_ms();
	for (;;) {
		int recovered = 1;

		for (int i = 0; i < LOADERS; i++)
			if (atomic_load(&l[i].last_ok_ms) < up_at)
				recovered = 0;
		if (recovered)
			break;
		CHECK(t_now_ms() - up_at <= 15000,
		      "%s: appends did not recover within 15 s", mode);
		usleep(20000);
	}
	print_message("%s: every loader appends again %" PRId64 " ms after the start\n",
		      mode, t_now_ms() - up_at);
	CHECK(t_now_ms() - up_at < 10000, "%s: appends recovered after 10 s", mode);
	ms = wait_health(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
			 10000);
	print_message("%s: health SERVING %d ms after that\n", mode, ms);
	CHECK(ms >= 0, "%s: health not SERVING within 10 s of recovery", mode);
	usleep(1000000);
	atomic_store(&stop, 1);
	for (int i = 0; i < n_loaders; i++)
		pthread_join(th[i], NULL);
	loaders_joined = 1;

	/* Only OK or UNAVAILABLE, ever. */
	for (int i = 0; i < LOADERS; i++) {
		CHECK(!l[i].n_other, "loader %d: %d calls ended %s", i, l[i].n_other,
		      histd_status_code_name(l[i].other_code));
		n_unavailable += l[i].n_unavailable;
	}
	CHECK(n_unavailable > 0, "%s: no call failed UNAVAILABLE during the outage", mode);

	/* Every acknowledged append is stored, as acknowledged. */
	{
		char **text[LOADERS + 1];
		uint64_t last[LOADERS + 1];
		size_t n_ok = 0;
		char err[200] = "";
		int s;

		for (s = 0; s <= LOADERS; s++)
			text[s] = NULL, last[s] = 0;
		for (s = 0; s <= LOADERS; s++)
			if (stored(c, sessions[s], &text[s], &last[s], err,
				   sizeof(err)) != 0)
				break;
		CHECK(s > LOADERS, "%s: reading back: %s", mode, err);
		for (int i = 0; i < LOADERS; i++)
			for (size_t k = 0; k < l[i].n_ok; k++) {
				const acked *a = &l[i].ok[k];

				CHECK(a->seq <= last[a->session] && text[a->session][a->seq] &&
				      strcmp(text[a->session][a->seq], a->text) == 0,
				      "%s: acknowledged %s at seq %" PRIu64
				      " of %s is not stored", mode, a->text,
				      a->seq, sessions[a->session]);
				n_ok++;
			}
		print_message("%s: %zu appends acknowledged and stored, %d UNAVAILABLE\n",
			      mode, n_ok, n_unavailable);

		/* The stream delivered every stored message of its session. */
		int64_t give_up = t_now_ms() + 15000;

		while (atomic_load(&w.next_seq) <= last[LOADERS] && !w.ended &&
		       t_now_ms() < give_up)
			usleep(20000);
		atomic_store(&w.stop, 1);
		pthread_join(wth, NULL);
		watcher_joined = 1;
		if (w.error[0])
			fail_msg("%s: subscriber: %s", mode, w.error);
		assert_int_equal(atomic_load(&w.next_seq), last[LOADERS] + 1);
		for (uint64_t q = 1; q <= last[LOADERS]; q++)
			if (text[LOADERS][q])
				assert_string_equal(w.text[q], text[LOADERS][q]);
		for (s = 0; s <= LOADERS; s++)
			free_texts(text[s], last[s]);
	}

	histd_client_stream_close(w.st);
	for (size_t q = 0; q < w.cap; q++)
		free(w.text[q]);
	free(w.text);
	for (int i = 0; i < LOADERS; i++)
		free(l[i].ok);
	for (int i = 0; i <= LOADERS; i++)
		free(sessions[i]);
	histd_client_close(c);
	assert_int_equal(harness_stop(p), 0);
	pgh_drop_database(db);
	free(db);
	return;
stop:
	if (frozen)
		pgh_cluster("thaw", state, NULL);
	atomic_store(&stop, 1);
	for (int i = 0; !loaders_joined && i < n_loaders; i++)
		pthread_join(th[i], NULL);
	atomic_store(&w.stop, 1);
	if (!watcher_joined)
		pthread_join(wth, NULL);
	/* Nothing of this test outlives it: the server stops too. */
	histd_client_stream_close(w.st);
	histd_client_close(c);
	harness_dump_log(p);    /* what histd saw, for the failure's cause */
	harness_stop(p);
	fail_msg("%s", why);
}

static void
postgres_fast_shutdown_under_load_loses_no_acknowledged_append(void **st)
{
	(void)st;
	outage("fast");
}

static void
postgres_crash_under_load_loses_no_acknowledged_append(void **st)
{
	(void)st;
	outage("immediate");
}

static void
postgres_stuck_under_load_fails_calls_in_time_and_loses_no_acknowledged_append(void **st)
{
	(void)st;
	outage("stuck");
}

/*
 * A server that hangs while histd connects to it. The connect gives up at
 * connect_timeout (3 s), and that says PostgreSQL does not answer, as a
 * statement's timeout does: the next call fails at once ("PostgreSQL is
 * unreachable", no detail) instead of waiting out a connect of its own,
 * which, one call after another, would keep appends waiting far past
 * their deadlines.
 */
static void
postgres_hung_at_connect_fails_the_next_call_at_once(void **st)
{
	char *db = pgh_new_database(cluster, "hungconnect");
	const char *extra[] = {
		"--driver", "postgres", "--dsn", db, "--pool-size", "2",
		"--pg-timeout-ms", "1000", NULL,
	};
	histd_proc *p = NULL;
	histd_client *c;
	char *session, one[256], first[256], second[256], err[200];
	char **text = NULL;
	grpc_status_code code;
	uint64_t seq = 0, last = 0;
	int frozen = 0, n_one;
	char why[1024];

	(void)st;
	assert_non_null(db);
	assert_int_equal(harness_start(&p, extra), 0);
	c = harness_client(p);
	session = t_create_session(c, "hung");

	/* Frozen under a pooled connection: the statement's timeout. It
	 * leaves every pooled connection to be made anew at next use. */
	CHECK(pgh_cluster("freeze", state, NULL) == 0, "cannot freeze PostgreSQL");
	frozen = 1;
	code = append_one(c, session, "one", &seq, one, sizeof(one));
	CHECK(code == GRPC_STATUS_UNAVAILABLE && strstr(one, "did not answer"),
	      "frozen, an append on a pooled connection ended %s \"%s\"",
	      histd_status_code_name(code), one);
	CHECK(pgh_cluster("thaw", state, NULL) == 0, "cannot thaw PostgreSQL");
	frozen = 0;
	CHECK(wait_health(c, GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING,
			  15000) >= 0, "health not SERVING within 15 s of the thaw");

	/* Frozen again: the next append must connect, and gives up. */
	CHECK(pgh_cluster("freeze", state, NULL) == 0, "cannot freeze PostgreSQL");
	frozen = 1;
	code = append_one(c, session, "two", &seq, first, sizeof(first));
	CHECK(code == GRPC_STATUS_UNAVAILABLE &&
	      !strncmp(first, "PostgreSQL is unreachable: ", 27),
	      "frozen, an append that connects ended %s \"%s\"",
	      histd_status_code_name(code), first);
	code = append_one(c, session, "three", &seq, second, sizeof(second));
	CHECK(code == GRPC_STATUS_UNAVAILABLE &&
	      !strcmp(second, "PostgreSQL is unreachable"),
	      "after a connect that gave up (\"%s\"), the next append ended"
	      " %s \"%s\", not at once", first, histd_status_code_name(code),
	      second);
	CHECK(pgh_cluster("thaw", state, NULL) == 0, "cannot thaw PostgreSQL");
	frozen = 0;

	/* And back by itself. */
	for (int64_t give_up = t_now_ms() + 15000;;) {
		code = append_one(c, session, "four", &seq, NULL, 0);
		if (code == GRPC_STATUS_OK || t_now_ms() > give_up)
			break;
		usleep(100000);
	}
	CHECK(code == GRPC_STATUS_OK, "appends did not recover within 15 s: %s",
	      histd_status_code_name(code));

	/* "one" went out before its timeout, and PostgreSQL may run it once
	 * thawed: stored or not, as its error said. The others never left. */
	CHECK(stored(c, session, &text, &last, err, sizeof(err)) == 0,
	      "reading back: %s", err);
	n_one = 0;
	for (uint64_t q = 1; q <= last; q++) {
		CHECK(!text[q] || (strcmp(text[q], "two") && strcmp(text[q], "three")),
		      "\"%s\", refused UNAVAILABLE, is stored at seq %" PRIu64,
		      text[q], q);
		n_one += text[q] && !strcmp(text[q], "one");
	}
	CHECK(last >= 1 && text[last] && !strcmp(text[last], "four") && last == seq,
	      "the recovered append is not the last stored");
	CHECK(n_one == 0 || strstr(one, "may not be applied"),
	      "\"one\" is stored, but its error said \"%s\"", one);
	print_message("hung: \"one\" %s; \"%s\"; then \"%s\"\n",
		      n_one ? "applied after the thaw" : "not applied", first, second);
	free_texts(text, last);
	text = NULL;

	free(session);
	histd_client_close(c);
	assert_int_equal(harness_stop(p), 0);
	pgh_drop_database(db);
	free(db);
	return;
stop:
	if (frozen)
		pgh_cluster("thaw", state, NULL);
	free_texts(text, last);
	free(session);
	histd_client_close(c);
	harness_dump_log(p);
	harness_stop(p);
	pgh_drop_database(db);
	free(db);
	fail_msg("%s", why);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(postgres_fast_shutdown_under_load_loses_no_acknowledged_append),
		cmocka_unit_test(postgres_crash_under_load_loses_no_acknowledged_append),
		cmocka_unit_test(postgres_stuck_under_load_fails_calls_in_time_and_loses_no_acknowledged_append),
		cmocka_unit_test(postgres_hung_at_connect_fails_the_next_call_at_once),
	};

	if (harness_init(argc, argv) != 0)
		return 1;
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
