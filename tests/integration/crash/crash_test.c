/*
 * kill -9 crash test of the file driver, on the real histd binary.
 *
 *   histd-crash-test <histd> [kills] [seed]
 *
 * Writer threads append to two shared sessions (batches of 1 to 3
 * messages, each with an idempotency key) and record every acknowledged
 * answer. histd (--driver file --fsync batch) is killed with SIGKILL at a
 * random moment, `kills` times (default 50), and restarted on the same
 * data directory. A writer whose call got no answer retries the same
 * request, with the same key, against the next server: it was either
 * durable (the retry is replayed) or not (it is applied now), and is
 * acknowledged exactly once either way.
 *
 * After every restart: each session's last seq is at least the largest
 * acknowledged one. At the end (server stopped cleanly and started once
 * more): each session holds seqs 1..last with no gap, every acknowledged
 * message is at the seq it was acknowledged with, intact, each writer's
 * messages in the order it wrote them, and nothing else (no duplicate).
 *
 * Exit status 0 when all holds; 1 with a line on stderr otherwise. The
 * server's log is kept in the work directory on failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "histd/v1/histd.pb-c.h"

#define N_WRITERS 8
#define N_SESSIONS 2
#define CALL_MS 10000
#define START_MS 30000

/* One acknowledged append of a writer: its i-th request. */
typedef struct ack {
	uint32_t i;
	uint64_t first, last;
} ack;

typedef struct writer {
	int w;
	pthread_t th;
	ack *v;
	size_t n, cap;
	uint64_t retries, replayed;
} writer;

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	histd_client *client;   /* NULL while no server runs */
	uint64_t gen;           /* bumped at every start */
	int in_flight;          /* calls using client */
	int stop;               /* writers finish their request and exit */
	int failed;
	char why[512];
} g = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static const char *histd_bin;
static char work[256], data_dir[300], port_file[300], log_file[300];

static void
failf(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&g.mu);
	if (!g.failed) {
		va_start(ap, fmt);
		vsnprintf(g.why, sizeof(g.why), fmt, ap);
		va_end(ap);
		g.failed = 1;
		g.stop = 1;
		pthread_cond_broadcast(&g.cv);
	}
	pthread_mutex_unlock(&g.mu);
}

static int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *
session_of(int w)
{
	static const char *const ids[N_SESSIONS] = { "crash-0", "crash-1" };

	return ids[w % N_SESSIONS];
}

/* ---------------------------------------------------------------------- */
/* The server                                                              */

static pid_t
start_server(char *target, size_t size)
{
	const char *argv[] = {
		histd_bin, "--driver", "file", "--data-dir", data_dir,
		"--fsync", "batch", "--listen", "127.0.0.1:0",
		"--port-file", port_file, "--threads", "32", "--auth-disabled",
		NULL,
	};
	int64_t t0 = now_ms();
	pid_t pid;

	unlink(port_file);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int fd = open(log_file, O_WRONLY | O_CREAT | O_APPEND, 0644);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execv(histd_bin, (char *const *)argv);
		_exit(127);
	}
	while (now_ms() - t0 < START_MS) {
		FILE *f = fopen(port_file, "r");
		int port = 0, status;

		if (f) {
			if (fscanf(f, "%d", &port) == 1 && port > 0) {
				fclose(f);
				snprintf(target, size, "127.0.0.1:%d", port);
				return pid;
			}
			fclose(f);
		}
		if (waitpid(pid, &status, WNOHANG) == pid) {
			fprintf(stderr, "histd exited at start (status %d); log: %s\n",
				status, log_file);
			return -1;
		}
		usleep(5000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	fprintf(stderr, "histd did not start within %d ms; log: %s\n", START_MS,
		log_file);
	return -1;
}

/* Makes c the writers' client and wakes them. */
static void
publish(histd_client *c)
{
	pthread_mutex_lock(&g.mu);
	g.client = c;
	g.gen++;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
}

/* Takes the client away once no call uses it; returns it. */
static histd_client *
retract(void)
{
	histd_client *c;

	pthread_mutex_lock(&g.mu);
	c = g.client;
	g.client = NULL;
	while (g.in_flight)
		pthread_cond_wait(&g.cv, &g.mu);
	pthread_mutex_unlock(&g.mu);
	return c;
}

/* ---------------------------------------------------------------------- */
/* Writers                                                                 */

static void
text_of(char *buf, size_t size, int w, uint32_t i, unsigned j)
{
	snprintf(buf, size, "w%d-i%" PRIu32 "-m%u", w, i, j);
}

static unsigned
batch_of(uint32_t i)
{
	return 1 + i % 3;
}

/* Is this status what a killed server looks like? */
static int
transient(grpc_status_code code)
{
	return code == GRPC_STATUS_UNAVAILABLE ||
	       code == GRPC_STATUS_DEADLINE_EXCEEDED ||
	       code == GRPC_STATUS_CANCELLED || code == GRPC_STATUS_UNKNOWN ||
	       code == GRPC_STATUS_INTERNAL;
}

static int
record(writer *wr, uint32_t i, const Histd__V1__AppendResponse *r)
{
	if (r->last_seq - r->first_seq + 1 != batch_of(i)) {
		failf("writer %d request %u: acknowledged seqs %llu..%llu for %u messages",
		      wr->w, i, (unsigned long long)r->first_seq,
		      (unsigned long long)r->last_seq, batch_of(i));
		return -1;
	}
	if (wr->n == wr->cap) {
		size_t cap = wr->cap ? wr->cap * 2 : 1024;
		ack *v = realloc(wr->v, cap * sizeof(*v));

		if (!v) {
			failf("out of memory");
			return -1;
		}
		wr->v = v;
		wr->cap = cap;
	}
	pthread_mutex_lock(&g.mu);
	wr->v[wr->n++] = (ack){ i, r->first_seq, r->last_seq };
	pthread_mutex_unlock(&g.mu);
	wr->replayed += r->replayed;
	return 0;
}

static void *
writer_main(void *arg)
{
	writer *wr = arg;

	for (uint32_t i = 0;; i++) {
		Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
		Histd__V1__Message msgs[3], *mp[3];
		Histd__V1__ContentBlock blocks[3], *bp[3];
		Histd__V1__TextBlock texts[3];
		char tbuf[3][48], key[48];
		unsigned k = batch_of(i);

		pthread_mutex_lock(&g.mu);
		if (g.stop) {
			pthread_mutex_unlock(&g.mu);
			break;
		}
		pthread_mutex_unlock(&g.mu);
		for (unsigned j = 0; j < k; j++) {
			text_of(tbuf[j], sizeof(tbuf[j]), wr->w, i, j);
			histd__v1__text_block__init(&texts[j]);
			texts[j].text = tbuf[j];
			histd__v1__content_block__init(&blocks[j]);
			blocks[j].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
			blocks[j].text = &texts[j];
			bp[j] = &blocks[j];
			histd__v1__message__init(&msgs[j]);
			msgs[j].role = HISTD__V1__ROLE__ROLE_USER;
			msgs[j].n_content = 1;
			msgs[j].content = &bp[j];
			mp[j] = &msgs[j];
		}
		snprintf(key, sizeof(key), "w%d-i%" PRIu32, wr->w, i);
		req.session_id = (char *)session_of(wr->w);
		req.n_messages = k;
		req.messages = mp;
		req.idempotency_key = key;

		/* Until acknowledged, against whichever server runs. */
		for (;;) {
			ProtobufCMessage *resp = NULL;
			histd_status st;
			histd_client *c;
			uint64_t gen;
			int rc;

			pthread_mutex_lock(&g.mu);
			while (!g.client && !g.failed)
				pthread_cond_wait(&g.cv, &g.mu);
			if (g.failed) {
				pthread_mutex_unlock(&g.mu);
				return NULL;
			}
			c = g.client;
			gen = g.gen;
			g.in_flight++;
			pthread_mutex_unlock(&g.mu);

			histd_status_init(&st);
			rc = histd_client_unary(c, HISTD_PATH("Append"), &req.base,
						&histd__v1__append_response__descriptor,
						CALL_MS, NULL, &resp, &st);
			pthread_mutex_lock(&g.mu);
			g.in_flight--;
			pthread_cond_broadcast(&g.cv);
			pthread_mutex_unlock(&g.mu);

			if (rc == 0) {
				rc = record(wr, i, (Histd__V1__AppendResponse *)resp);
				histd_client_message_free(resp);
				histd_status_reset(&st);
				if (rc)
					return NULL;
				break;
			}
			if (!transient(st.code)) {
				failf("writer %d request %u: %s %s", wr->w, i,
				      histd_status_code_name(st.code),
				      st.details ? st.details : "");
				histd_status_reset(&st);
				return NULL;
			}
			histd_status_reset(&st);
			/* The server died: wait for the next one. */
			wr->retries++;
			pthread_mutex_lock(&g.mu);
			while (g.gen == gen && !g.failed)
				pthread_cond_wait(&g.cv, &g.mu);
			pthread_mutex_unlock(&g.mu);
		}
	}
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Checks                                                                  */

static int
create_sessions(histd_client *c)
{
	for (int s = 0; s < N_SESSIONS; s++) {
		Histd__V1__CreateSessionRequest req = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
		ProtobufCMessage *resp = NULL;
		histd_status st;
		int rc;

		req.session_id = (char *)session_of(s);
		histd_status_init(&st);
		rc = histd_client_unary(c, HISTD_PATH("CreateSession"), &req.base,
					&histd__v1__session__descriptor, CALL_MS,
					NULL, &resp, &st);
		if (rc) {
			fprintf(stderr, "CreateSession: %s %s\n",
				histd_status_code_name(st.code), st.details);
			histd_status_reset(&st);
			return -1;
		}
		histd_client_message_free(resp);
		histd_status_reset(&st);
	}
	return 0;
}

static uint64_t
last_seq_of(histd_client *c, const char *id)
{
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	histd_status st;
	uint64_t last = 0;

	req.session_id = (char *)id;
	histd_status_init(&st);
	if (histd_client_unary(c, HISTD_PATH("GetSession"), &req.base,
			       &histd__v1__session__descriptor, CALL_MS, NULL,
			       (ProtobufCMessage **)&s, &st) == 0) {
		last = s->stats ? s->stats->last_seq : 0;
		histd_client_message_free(&s->base);
	} else {
		failf("GetSession %s after restart: %s %s", id,
		      histd_status_code_name(st.code), st.details);
	}
	histd_status_reset(&st);
	return last;
}

/* Every acknowledged seq is within the session's last seq. */
static int
check_after_restart(histd_client *c, writer *ws, int kill_no)
{
	uint64_t want[N_SESSIONS] = { 0 };

	pthread_mutex_lock(&g.mu);
	for (int w = 0; w < N_WRITERS; w++)
		for (size_t k = 0; k < ws[w].n; k++)
			if (ws[w].v[k].last > want[w % N_SESSIONS])
				want[w % N_SESSIONS] = ws[w].v[k].last;
	pthread_mutex_unlock(&g.mu);
	for (int s = 0; s < N_SESSIONS; s++) {
		uint64_t have = last_seq_of(c, session_of(s));

		if (g.failed)
			return -1;
		if (have < want[s]) {
			failf("after kill %d: %s has last seq %llu, but %llu was acknowledged",
			      kill_no, session_of(s), (unsigned long long)have,
			      (unsigned long long)want[s]);
			return -1;
		}
	}
	return 0;
}

/* Reads every message of a session: texts[seq - 1]. */
static char **
read_all(histd_client *c, const char *id, uint64_t *n_out)
{
	char **texts = NULL;
	uint64_t n = 0, cap = 0, after = 0;

	for (;;) {
		Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
		Histd__V1__GetMessagesResponse *r = NULL;
		histd_status st;

		req.session_id = (char *)id;
		req.view = HISTD__V1__VIEW__VIEW_RAW;
		req.after_seq = after;
		req.limit = 1000;
		histd_status_init(&st);
		if (histd_client_unary(c, HISTD_PATH("GetMessages"), &req.base,
				       &histd__v1__get_messages_response__descriptor,
				       CALL_MS, NULL, (ProtobufCMessage **)&r, &st)) {
			failf("GetMessages %s: %s %s", id,
			      histd_status_code_name(st.code), st.details);
			histd_status_reset(&st);
			break;
		}
		histd_status_reset(&st);
		for (size_t i = 0; i < r->n_messages; i++) {
			const Histd__V1__Message *m = r->messages[i];
			const char *t = m->n_content == 1 &&
					m->content[0]->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT
					? m->content[0]->text->text : "(not one text block)";

			if (m->seq != n + 1) {
				failf("%s: seq %llu follows %llu: a gap or a reorder",
				      id, (unsigned long long)m->seq,
				      (unsigned long long)n);
				break;
			}
			if (n == cap) {
				cap = cap ? cap * 2 : 4096;
				texts = realloc(texts, cap * sizeof(*texts));
				if (!texts) {
					failf("out of memory");
					break;
				}
			}
			texts[n++] = strdup(t);
		}
		after = r->next_after_seq;
		histd_client_message_free(&r->base);
		if (!after || g.failed)
			break;
	}
	*n_out = n;
	return texts;
}

static int
check_final(histd_client *c, writer *ws)
{
	for (int s = 0; s < N_SESSIONS && !g.failed; s++) {
		uint64_t n = 0, expected = 0, last = last_seq_of(c, session_of(s));
		char **texts = read_all(c, session_of(s), &n);
		uint8_t *seen = calloc(n ? n : 1, 1);

		if (!g.failed && n != last)
			failf("%s: %llu messages but last seq %llu", session_of(s),
			      (unsigned long long)n, (unsigned long long)last);
		for (int w = s; w < N_WRITERS && !g.failed; w += N_SESSIONS) {
			uint64_t prev = 0;

			for (size_t k = 0; k < ws[w].n && !g.failed; k++) {
				const ack *a = &ws[w].v[k];

				if (a->i != k)
					failf("writer %d: request %zu acknowledged as %u", w, k, a->i);
				if (a->first <= prev)
					failf("writer %d: request %u at seq %llu, not after %llu",
					      w, a->i, (unsigned long long)a->first,
					      (unsigned long long)prev);
				for (uint64_t q = a->first; q <= a->last && !g.failed; q++) {
					char want[48];

					text_of(want, sizeof(want), w, a->i,
						(unsigned)(q - a->first));
					if (q > n) {
						failf("%s: acknowledged seq %llu is missing",
						      session_of(s), (unsigned long long)q);
						break;
					}
					if (strcmp(texts[q - 1], want) != 0)
						failf("%s seq %llu: '%s', acknowledged as '%s'",
						      session_of(s), (unsigned long long)q,
						      texts[q - 1], want);
					if (seen[q - 1]++)
						failf("%s seq %llu acknowledged twice",
						      session_of(s), (unsigned long long)q);
					expected++;
				}
				prev = a->last;
			}
		}
		/* Every stored message was acknowledged: no duplicate, no
		 * stray retry. */
		if (!g.failed && expected != n)
			failf("%s: %llu messages stored, %llu acknowledged",
			      session_of(s), (unsigned long long)n,
			      (unsigned long long)expected);
		for (uint64_t q = 0; q < n; q++)
			free(texts[q]);
		free(texts);
		free(seen);
	}
	return g.failed ? -1 : 0;
}

static void
rm_work(void)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", work);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", work);
}

static int
count_lines(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	int n = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

int
main(int argc, char **argv)
{
	int kills = argc > 2 ? atoi(argv[2]) : 50;
	unsigned seed = argc > 3 ? (unsigned)atoi(argv[3]) : (unsigned)time(NULL);
	const char *tmp = getenv("TMPDIR");
	writer ws[N_WRITERS];
	char target[64];
	histd_client *c = NULL;
	uint64_t total = 0, retries = 0, replayed = 0;
	int64_t t0 = now_ms();
	pid_t pid;
	int status, ok, n_writers = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s <histd> [kills] [seed]\n", argv[0]);
		return 2;
	}
	histd_bin = argv[1];
	srand(seed);
	signal(SIGPIPE, SIG_IGN);
	snprintf(work, sizeof(work), "%s/histd-crash-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(work)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(data_dir, sizeof(data_dir), "%s/data", work);
	snprintf(port_file, sizeof(port_file), "%s/port", work);
	snprintf(log_file, sizeof(log_file), "%s/histd.log", work);
	printf("crash test: %d kills, seed %u, work dir %s\n", kills, seed, work);

	if ((pid = start_server(target, sizeof(target))) < 0 ||
	    histd_client_open(target, &c) || create_sessions(c)) {
		fprintf(stderr, "cannot start the first server\n");
		return 1;
	}
	memset(ws, 0, sizeof(ws));
	for (int w = 0; w < N_WRITERS; w++) {
		ws[w].w = w;
		if (pthread_create(&ws[w].th, NULL, writer_main, &ws[w]) != 0) {
			failf("cannot start writer thread %d", w);
			break;
		}
		n_writers++;
	}

	for (int k = 1; k <= kills && !g.failed; k++) {
		publish(c);
		usleep(30000 + (useconds_t)(rand() % 220000));
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		histd_client_close(retract());
		c = NULL;
		if ((pid = start_server(target, sizeof(target))) < 0 ||
		    histd_client_open(target, &c)) {
			failf("restart after kill %d failed (log: %s)", k, log_file);
			break;
		}
		check_after_restart(c, ws, k);
	}

	/* Let the writers finish their requests, then stop cleanly and
	 * check everything on a fresh start. */
	pthread_mutex_lock(&g.mu);
	g.stop = 1;
	pthread_mutex_unlock(&g.mu);
	if (c)
		publish(c);
	for (int w = 0; w < n_writers; w++)
		pthread_join(ws[w].th, NULL);
	if (c)
		histd_client_close(retract());
	c = NULL;
	if (pid > 0) {
		kill(pid, SIGTERM);
		waitpid(pid, &status, 0);
		if (!g.failed && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
			failf("histd did not stop cleanly (status %d)", status);
	}
	if (!g.failed) {
		if ((pid = start_server(target, sizeof(target))) < 0 ||
		    histd_client_open(target, &c)) {
			failf("the final start failed (log: %s)", log_file);
		} else {
			check_final(c, ws);
			histd_client_close(c);
			kill(pid, SIGTERM);
			waitpid(pid, &status, 0);
		}
	}

	for (int w = 0; w < N_WRITERS; w++) {
		for (size_t k = 0; k < ws[w].n; k++)
			total += ws[w].v[k].last - ws[w].v[k].first + 1;
		retries += ws[w].retries;
		replayed += ws[w].replayed;
		free(ws[w].v);
	}
	ok = !g.failed;
	printf("crash test: %s: %d kills, %llu acknowledged messages, %llu retries after a kill (%llu of them replayed: durable before the kill), %d torn tails truncated, %.1f s\n",
	       ok ? "PASSED" : "FAILED", kills, (unsigned long long)total,
	       (unsigned long long)retries, (unsigned long long)replayed,
	       count_lines(log_file, "truncated a torn record"),
	       (double)(now_ms() - t0) / 1000.0);
	if (!ok) {
		fprintf(stderr, "crash test FAILED: %s\n(server log kept in %s)\n",
			g.why, log_file);
		return 1;
	}
	rm_work();
	return 0;
}
