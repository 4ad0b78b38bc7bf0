/*
 * histd-pg-bench: histd on PostgreSQL against PostgreSQL alone, in one run.
 *
 * It starts a PostgreSQL 15 cluster of its own (tests/pg/pgtest.sh: initdb
 * as an unprivileged user, durable settings) and histd on it, then, each
 * phase chosen by --phases:
 *
 *   append   Append of one message per call by --callers callers, each on
 *            its own session, against pgbench with the same number of
 *            clients running the equivalent single-row INSERT of the same
 *            bytes into the same messages table (and, for reference, the
 *            whole transaction an application would run for an append
 *            without histd: lock the session row, insert, update it).
 *            Measured in --rounds interleaved slices, so that background
 *            load weighs on both alike.
 *   get      GetMessages last_n=20 on a 100-message and on a
 *            100,000-message session (filled first), interleaved.
 *   commit   Append throughput under the group commit choices: batching
 *            in the driver (the default), no batching, no batching with
 *            PostgreSQL's commit_delay, and synchronous_commit=off (not
 *            durable; for reference only).
 *
 * Timings are reported; --strict makes the exit status 2 when a target is
 * missed (Append >= 1.0x pgbench; last-20 @100,000 within 20% of @100).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "grpc/health/v1/health.pb-c.h"
#include "histd/v1/histd.pb-c.h"
#include "loadgen.h"
#include "proc.h"

#ifndef HISTD_PGTEST_SCRIPT
#define HISTD_PGTEST_SCRIPT "tests/pg/pgtest.sh"
#endif

struct options {
	const char *histd;
	const char *pgtest;
	double duration_s;
	double warmup_s;
	size_t rounds;
	size_t callers;
	size_t message_size;
	size_t session_length;
	size_t short_length;
	size_t pool_size;
	unsigned server_threads;
	const char *phases;
	int strict;
};

struct bench {
	struct options o;
	char dir[64];
	char state[128];
	char dsn[1024];
	char pgbin[256];
	bench_server srv;
	bench_client *c;
	char *text;
	int failed;
	/* Results. */
	double histd_append, pgbench_insert, pgbench_txn;
	double get_short, get_long, get_short_p50, get_long_p50;
	double commit[4];
	int ran_append, ran_get, ran_commit;
};

static int
phase_on(const struct options *o, const char *name)
{
	const char *p = o->phases;
	size_t n = strlen(name);

	while (p && *p) {
		if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0'))
			return 1;
		p = strchr(p, ',');
		if (p)
			p++;
	}
	return 0;
}

/* ---------------------------------------------------------------------
 * Running programs */

/* Runs argv, its stdout into out (NUL-terminated, truncated); returns the
 * exit status or -1. */
static int
run(char *const argv[], char *out, size_t size)
{
	int fd[2], status;
	size_t used = 0;
	pid_t pid;

	if (pipe(fd) != 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		dup2(fd[1], 1);
		close(fd[0]);
		close(fd[1]);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(fd[1]);
	for (;;) {
		ssize_t n;

		if (used + 1 >= size) {
			char sink[256];

			n = read(fd[0], sink, sizeof(sink));
		} else {
			n = read(fd[0], out + used, size - used - 1);
			if (n > 0)
				used += (size_t)n;
		}
		if (n == 0 || (n < 0 && errno != EINTR))
			break;
	}
	out[used] = '\0';
	close(fd[0]);
	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int
pgtest(struct bench *b, const char *cmd, char *out, size_t size)
{
	char *argv[] = { "sh", (char *)b->o.pgtest, (char *)cmd, b->state, NULL };
	char sink[256];

	return run(argv, out ? out : sink, out ? size : sizeof(sink));
}

static int
psql(struct bench *b, const char *dsn, const char *sql)
{
	char path[300], out[256];

	snprintf(path, sizeof(path), "%s/psql", b->pgbin);
	char *argv[] = { path, "-X", "-q", "-v", "ON_ERROR_STOP=1", (char *)dsn,
			 "-c", (char *)sql, NULL };
	return run(argv, out, sizeof(out));
}

/* ---------------------------------------------------------------------
 * histd */

static int
wait_serving(struct bench *b, double timeout_s)
{
	Grpc__Health__V1__HealthCheckRequest req =
		GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	uint64_t until = bench_now_ns() + (uint64_t)(timeout_s * 1e9);

	while (bench_now_ns() < until) {
		grpc_status_code st;
		uint8_t *resp = NULL;
		size_t len = 0;
		int serving = 0;

		if (bench_unary_sync(b->c, BENCH_M_HEALTH_CHECK, &req.base, 2.0, &st,
				     NULL, 0, &resp, &len) != 0)
			return -1;
		if (st == GRPC_STATUS_OK && resp) {
			Grpc__Health__V1__HealthCheckResponse *r =
				grpc__health__v1__health_check_response__unpack(NULL, len,
										 resp);

			serving = r && r->status ==
				GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
			if (r)
				grpc__health__v1__health_check_response__free_unpacked(r, NULL);
		}
		free(resp);
		if (serving)
			return 0;
		usleep(100000);
	}
	fprintf(stderr, "histd-pg-bench: histd not SERVING within %.0f s\n", timeout_s);
	return -1;
}

/* Starts histd on the database dsn (env: extra environment, NULL-terminated
 * name, value pairs, set for the child only). */
static int
start_histd(struct bench *b, const char *dsn, const char *const *env)
{
	char pool[16];
	const char *extra[] = { "--dsn", dsn, "--pool-size", pool };

	snprintf(pool, sizeof(pool), "%zu", b->o.pool_size);
	for (size_t i = 0; env && env[i]; i += 2)
		setenv(env[i], env[i + 1], 1);
	int rc = bench_server_start(&b->srv, b->o.histd, "postgres",
				    b->o.server_threads, extra, 4, NULL, 20.0);

	for (size_t i = 0; env && env[i]; i += 2)
		unsetenv(env[i]);
	if (rc != 0)
		return -1;
	if (bench_client_new(&b->c, b->srv.addr, 2, 2) != 0 ||
	    wait_serving(b, 15.0) != 0) {
		bench_server_log_tail(&b->srv, 20);
		return -1;
	}
	return 0;
}

static void
stop_histd(struct bench *b)
{
	bench_client_free(b->c);
	b->c = NULL;
	if (b->srv.pid) {
		int st = bench_server_stop(&b->srv, 15.0);

		if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			fprintf(stderr, "histd-pg-bench: histd did not exit cleanly "
				"(wait status %d)\n", st);
			b->failed = 1;
		}
	}
}

static int
create_session(struct bench *b, const char *id)
{
	Histd__V1__CreateSessionRequest req = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	grpc_status_code st;
	char details[200];

	req.session_id = (char *)id;
	if (bench_unary_sync(b->c, BENCH_M_CREATE_SESSION, &req.base, 10.0, &st,
			     details, sizeof(details), NULL, NULL) != 0 ||
	    st != GRPC_STATUS_OK) {
		fprintf(stderr, "histd-pg-bench: CreateSession %s: %s\n", id, details);
		return -1;
	}
	return 0;
}

/* A packed AppendRequest of n text messages. */
static grpc_slice
append_request(struct bench *b, const char *session, size_t n)
{
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *msgs = calloc(n, sizeof(*msgs));
	Histd__V1__Message **pm = calloc(n, sizeof(*pm));
	Histd__V1__ContentBlock block = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &block };
	Histd__V1__TextBlock text = HISTD__V1__TEXT_BLOCK__INIT;
	grpc_slice s;

	text.text = b->text;
	block.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	block.text = &text;
	for (size_t i = 0; i < n; i++) {
		histd__v1__message__init(&msgs[i]);
		msgs[i].role = HISTD__V1__ROLE__ROLE_USER;
		msgs[i].author = "bench";
		msgs[i].n_content = 1;
		msgs[i].content = blocks;
		pm[i] = &msgs[i];
	}
	req.session_id = (char *)session;
	req.n_messages = n;
	req.messages = pm;
	s = bench_pack(&req.base);
	free(pm);
	free(msgs);
	return s;
}

/* Bytes of one packed message as histd stores it (no seq), for pgbench's
 * rows. */
static size_t
stored_size(struct bench *b)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock block = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &block };
	Histd__V1__TextBlock text = HISTD__V1__TEXT_BLOCK__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;

	text.text = b->text;
	block.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	block.text = &text;
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.author = "bench";
	m.n_content = 1;
	m.content = blocks;
	ts.seconds = 1700000000;
	ts.nanos = 123456000;
	m.created_at = &ts;    /* the server sets it */
	return histd__v1__message__get_packed_size(&m);
}

/* A closed-loop run; returns calls/s (0 on failure) and the latency
 * quantiles in us. */
static double
closed(struct bench *b, enum bench_method m, const grpc_slice *reqs, size_t n_reqs,
       double seconds, double *p50, double *p99)
{
	bench_run_spec spec = {
		.method = m, .callers = b->o.callers, .requests = reqs,
		.n_requests = n_reqs, .duration_s = seconds, .timeout_s = 30,
	};
	bench_run_result r = { 0 };
	double rate = 0;

	if (bench_client_run(b->c, &spec, &r) != 0) {
		b->failed = 1;
		return 0;
	}
	if (r.errors) {
		fprintf(stderr, "histd-pg-bench: %" PRIu64 " calls failed (status %d: %s)\n",
			r.errors, (int)r.first_error, r.first_error_details);
		b->failed = 1;
	}
	if (r.elapsed_s > 0)
		rate = (double)r.ok / r.elapsed_s;
	if (p50)
		*p50 = bench_lat_quantile_us(&r.lat, 0.5);
	if (p99)
		*p99 = bench_lat_quantile_us(&r.lat, 0.99);
	bench_run_result_free(&r);
	return rate;
}

/* ---------------------------------------------------------------------
 * pgbench */

/* pgbench with `clients` clients running the script for seconds; tps or
 * 0. */
static double
pgbench(struct bench *b, const char *script, double seconds)
{
	char path[300], clients[16], time_s[16], out[8192];
	char *argv[] = { path, "-n", "-M", "prepared", "-c", clients, "-j", "2",
			 "-T", time_s, "-f", (char *)script, b->dsn, NULL };
	const char *p;

	snprintf(path, sizeof(path), "%s/pgbench", b->pgbin);
	snprintf(clients, sizeof(clients), "%zu", b->o.callers);
	snprintf(time_s, sizeof(time_s), "%.0f", seconds < 1 ? 1 : seconds);
	if (run(argv, out, sizeof(out)) != 0) {
		fprintf(stderr, "histd-pg-bench: pgbench failed:\n%s\n", out);
		b->failed = 1;
		return 0;
	}
	p = strstr(out, "tps = ");
	return p ? strtod(p + 6, NULL) : 0;
}

/* The two pgbench scripts: the single-row INSERT, and the whole append
 * transaction. Rows go to sessions of their own (negative sids). */
static int
write_scripts(struct bench *b, char *insert, char *txn, size_t size)
{
	size_t len = stored_size(b);
	FILE *f;
	char *hex = malloc(len * 2 + 1);

	if (!hex)
		return -1;
	for (size_t i = 0; i < len; i++)
		sprintf(hex + 2 * i, "%02x", (unsigned)(i * 7 + 11) & 0xff);
	snprintf(insert, size, "%s/insert.sql", b->dir);
	snprintf(txn, size, "%s/txn.sql", b->dir);
	f = fopen(insert, "w");
	if (!f) {
		free(hex);
		return -1;
	}
	fprintf(f, "\\set seq random(1, 9000000000000000)\n"
		"INSERT INTO messages (sid, seq, revision, role, author, created_at,"
		" token_estimate, data) VALUES (-1 - :client_id, :seq, 1, 2, 'bench',"
		" now(), 256, '\\x%s'::bytea);\n", hex);
	fclose(f);
	f = fopen(txn, "w");
	if (!f) {
		free(hex);
		return -1;
	}
	fprintf(f, "BEGIN;\n"
		"SELECT sid, revision, last_seq FROM sessions WHERE tenant = 'pgbench'"
		" AND id = 'c' || :client_id FOR UPDATE;\n"
		"INSERT INTO messages (sid, seq, revision, role, author, created_at,"
		" token_estimate, data) SELECT sid, last_seq + 1, revision + 1, 2,"
		" 'bench', now(), 256, '\\x%s'::bytea FROM sessions WHERE tenant ="
		" 'pgbench' AND id = 'c' || :client_id;\n"
		"UPDATE sessions SET revision = revision + 1, last_seq = last_seq + 1,"
		" message_count = message_count + 1, token_total = token_total + 256,"
		" bytes_total = bytes_total + %zu WHERE tenant = 'pgbench' AND id ="
		" 'c' || :client_id;\n"
		"COMMIT;\n", hex, len + 4);
	fclose(f);
	free(hex);
	return 0;
}

/* ---------------------------------------------------------------------
 * Phases */

static void
phase_append(struct bench *b)
{
	grpc_slice *reqs = calloc(b->o.callers, sizeof(*reqs));
	char insert[128], txn[128], sql[256];
	double h = 0, pi = 0, pt = 0, w = b->o.warmup_s;

	printf("histd-pg-bench: append: %zu callers, %zu B messages, %zu rounds of "
	       "%.0f s each\n", b->o.callers, b->o.message_size, b->o.rounds,
	       b->o.duration_s);
	for (size_t i = 0; i < b->o.callers; i++) {
		char id[32];

		snprintf(id, sizeof(id), "append-%zu", i);
		if (create_session(b, id) != 0) {
			b->failed = 1;
			goto out;
		}
		reqs[i] = append_request(b, id, 1);
	}
	/* pgbench's sessions for the transaction script. */
	snprintf(sql, sizeof(sql),
		 "INSERT INTO sessions (tenant, id, created_at, updated_at, revision)"
		 " SELECT 'pgbench', 'c' || g, now(), now(), 1"
		 " FROM generate_series(0, %zu) g", b->o.callers);
	if (write_scripts(b, insert, txn, sizeof(insert)) != 0 ||
	    psql(b, b->dsn, sql) != 0) {
		fprintf(stderr, "histd-pg-bench: cannot prepare pgbench\n");
		b->failed = 1;
		goto out;
	}
	if (w > 0) {
		closed(b, BENCH_M_APPEND, reqs, b->o.callers, w, NULL, NULL);
		pgbench(b, insert, w);
	}
	for (size_t r = 0; r < b->o.rounds; r++) {
		double x = closed(b, BENCH_M_APPEND, reqs, b->o.callers,
				  b->o.duration_s, NULL, NULL);
		double y = pgbench(b, insert, b->o.duration_s);

		printf("  round %zu: histd Append %.0f/s, pgbench INSERT %.0f tps\n",
		       r + 1, x, y);
		h += x;
		pi += y;
	}
	/* The reference transaction last: it updates a few session rows
	 * thousands of times, and their dead versions are not what the
	 * rounds above should meet. */
	for (size_t r = 0; r < b->o.rounds; r++)
		pt += pgbench(b, txn, b->o.duration_s);
	printf("  pgbench append transaction (lock, insert, update): %.0f tps\n",
	       pt / (double)b->o.rounds);
	psql(b, b->dsn, "VACUUM ANALYZE sessions");
	b->histd_append = h / (double)b->o.rounds;
	b->pgbench_insert = pi / (double)b->o.rounds;
	b->pgbench_txn = pt / (double)b->o.rounds;
	b->ran_append = 1;
out:
	for (size_t i = 0; i < b->o.callers; i++)
		grpc_slice_unref(reqs[i]);
	free(reqs);
}

static int
fill(struct bench *b, const char *id, size_t n)
{
	size_t batch = 500, calls = n / batch, rest = n % batch;
	grpc_slice req;
	bench_run_spec spec = { .method = BENCH_M_APPEND, .callers = 4,
				.timeout_s = 60 };
	bench_run_result r = { 0 };
	int rc = 0;

	if (create_session(b, id) != 0)
		return -1;
	if (calls) {
		req = append_request(b, id, batch);
		spec.requests = &req;
		spec.n_requests = 1;
		spec.count = calls;
		if (bench_client_run(b->c, &spec, &r) != 0 || r.errors)
			rc = -1;
		bench_run_result_free(&r);
		grpc_slice_unref(req);
	}
	if (rc == 0 && rest) {
		req = append_request(b, id, rest);
		spec.requests = &req;
		spec.n_requests = 1;
		spec.count = 1;
		spec.callers = 1;
		memset(&r, 0, sizeof(r));
		if (bench_client_run(b->c, &spec, &r) != 0 || r.errors)
			rc = -1;
		bench_run_result_free(&r);
		grpc_slice_unref(req);
	}
	return rc;
}

static grpc_slice
last20(const char *id)
{
	Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;

	req.session_id = (char *)id;
	req.view = HISTD__V1__VIEW__VIEW_RAW;
	req.last_n = 20;
	return bench_pack(&req.base);
}

static void
phase_get(struct bench *b)
{
	uint64_t t0 = bench_now_ns();
	grpc_slice s_req, l_req;
	double s = 0, l = 0, s50 = 0, l50 = 0;

	printf("histd-pg-bench: get: filling sessions of %zu and %zu messages\n",
	       b->o.short_length, b->o.session_length);
	if (fill(b, "get-short", b->o.short_length) != 0 ||
	    fill(b, "get-long", b->o.session_length) != 0) {
		fprintf(stderr, "histd-pg-bench: filling failed\n");
		b->failed = 1;
		return;
	}
	printf("  filled in %.1f s\n", (double)(bench_now_ns() - t0) / 1e9);
	/* Fresh statistics, as autovacuum would have after such a load. */
	psql(b, b->dsn, "ANALYZE");
	s_req = last20("get-short");
	l_req = last20("get-long");
	if (b->o.warmup_s > 0) {
		closed(b, BENCH_M_GET_MESSAGES, &s_req, 1, b->o.warmup_s, NULL, NULL);
		closed(b, BENCH_M_GET_MESSAGES, &l_req, 1, b->o.warmup_s, NULL, NULL);
	}
	for (size_t r = 0; r < b->o.rounds; r++) {
		double p50s, p50l;
		double x = closed(b, BENCH_M_GET_MESSAGES, &s_req, 1, b->o.duration_s,
				  &p50s, NULL);
		double y = closed(b, BENCH_M_GET_MESSAGES, &l_req, 1, b->o.duration_s,
				  &p50l, NULL);

		printf("  round %zu: last-20 @%zu %.0f/s (p50 %.0f us), @%zu %.0f/s "
		       "(p50 %.0f us)\n", r + 1, b->o.short_length, x, p50s,
		       b->o.session_length, y, p50l);
		s += x;
		l += y;
		s50 += p50s;
		l50 += p50l;
	}
	b->get_short = s / (double)b->o.rounds;
	b->get_long = l / (double)b->o.rounds;
	b->get_short_p50 = s50 / (double)b->o.rounds;
	b->get_long_p50 = l50 / (double)b->o.rounds;
	b->ran_get = 1;
	grpc_slice_unref(s_req);
	grpc_slice_unref(l_req);
}

static const char *const commit_names[4] = {
	"batching in the driver, synchronous_commit=on (default)",
	"no batching, synchronous_commit=on",
	"no batching, commit_delay=200us commit_siblings=4",
	"batching, synchronous_commit=off (NOT durable)",
};

/* Append throughput of a fresh histd on a fresh database per choice. */
static void
phase_commit(struct bench *b)
{
	char pool[16];
	const char *env_batch[] = { NULL };
	const char *env_nobatch[] = { "HISTD_PG_BATCH_MAX", "1",
				      "HISTD_PG_BATCH_INFLIGHT", pool, NULL };
	const char *const *envs[4] = { env_batch, env_nobatch, env_nobatch, env_batch };
	const char *dsn_extra[4] = {
		"", "", " options='-c commit_delay=200 -c commit_siblings=4'",
		" options='-c synchronous_commit=off'",
	};

	snprintf(pool, sizeof(pool), "%zu", b->o.pool_size);
	printf("histd-pg-bench: commit: Append throughput, %zu callers, %.0f s each\n",
	       b->o.callers, b->o.duration_s);
	for (int k = 0; k < 4; k++) {
		char db[32], sql[64], dsn[1200];
		grpc_slice *reqs = calloc(b->o.callers, sizeof(*reqs));
		double rate = 0;

		snprintf(db, sizeof(db), "commit%d", k);
		snprintf(sql, sizeof(sql), "CREATE DATABASE %s", db);
		if (psql(b, b->dsn, sql) != 0) {
			b->failed = 1;
			free(reqs);
			return;
		}
		snprintf(dsn, sizeof(dsn), "%s dbname=%s%s", b->dsn, db, dsn_extra[k]);
		if (start_histd(b, dsn, envs[k]) != 0) {
			b->failed = 1;
			free(reqs);
			return;
		}
		for (size_t i = 0; i < b->o.callers; i++) {
			char id[32];

			snprintf(id, sizeof(id), "c-%zu", i);
			create_session(b, id);
			reqs[i] = append_request(b, id, 1);
		}
		if (b->o.warmup_s > 0)
			closed(b, BENCH_M_APPEND, reqs, b->o.callers, b->o.warmup_s,
			       NULL, NULL);
		for (size_t r = 0; r < b->o.rounds; r++)
			rate += closed(b, BENCH_M_APPEND, reqs, b->o.callers,
				       b->o.duration_s, NULL, NULL);
		b->commit[k] = rate / (double)b->o.rounds;
		printf("  %-58s %8.0f appends/s\n", commit_names[k], b->commit[k]);
		for (size_t i = 0; i < b->o.callers; i++)
			grpc_slice_unref(reqs[i]);
		free(reqs);
		stop_histd(b);
	}
	b->ran_commit = 1;
}

/* ---------------------------------------------------------------------
 * main */

static void
usage(FILE *f)
{
	fputs(
"usage: histd-pg-bench --histd PATH [options]\n"
"  --pgtest PATH         tests/pg/pgtest.sh (default: the source tree's)\n"
"  --callers N           Append callers and pgbench clients (16)\n"
"  --pool-size N         histd --pool-size (16)\n"
"  --server-threads N    histd --threads (32)\n"
"  --message-size BYTES  text of each message (1024)\n"
"  --duration SECONDS    each measured slice (5)\n"
"  --warmup SECONDS      before the slices (1)\n"
"  --rounds N            interleaved slices (3)\n"
"  --session-length N    messages of the long session (100000)\n"
"  --short-length N      messages of the short one (100)\n"
"  --phases LIST         append,get,commit (all)\n"
"  --strict              exit 2 if a target is missed\n", f);
}

static int
parse(struct options *o, int argc, char **argv)
{
	static const struct option opts[] = {
		{ "histd", required_argument, NULL, 'H' },
		{ "pgtest", required_argument, NULL, 'P' },
		{ "callers", required_argument, NULL, 'c' },
		{ "pool-size", required_argument, NULL, 'p' },
		{ "server-threads", required_argument, NULL, 't' },
		{ "message-size", required_argument, NULL, 'm' },
		{ "duration", required_argument, NULL, 'd' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "session-length", required_argument, NULL, 'L' },
		{ "short-length", required_argument, NULL, 'S' },
		{ "phases", required_argument, NULL, 'f' },
		{ "strict", no_argument, NULL, 's' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;

	*o = (struct options){
		.pgtest = HISTD_PGTEST_SCRIPT, .duration_s = 5, .warmup_s = 1,
		.rounds = 3, .callers = 16, .message_size = 1024,
		.session_length = 100000, .short_length = 100, .pool_size = 16,
		.server_threads = 32, .phases = "append,get,commit",
	};
	while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (ch) {
		case 'H': o->histd = optarg; break;
		case 'P': o->pgtest = optarg; break;
		case 'c': o->callers = strtoul(optarg, NULL, 10); break;
		case 'p': o->pool_size = strtoul(optarg, NULL, 10); break;
		case 't': o->server_threads = (unsigned)strtoul(optarg, NULL, 10); break;
		case 'm': o->message_size = strtoul(optarg, NULL, 10); break;
		case 'd': o->duration_s = strtod(optarg, NULL); break;
		case 'w': o->warmup_s = strtod(optarg, NULL); break;
		case 'r': o->rounds = strtoul(optarg, NULL, 10); break;
		case 'L': o->session_length = strtoul(optarg, NULL, 10); break;
		case 'S': o->short_length = strtoul(optarg, NULL, 10); break;
		case 'f': o->phases = optarg; break;
		case 's': o->strict = 1; break;
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); return -1;
		}
	}
	if (!o->histd || o->callers < 1 || o->callers > 1024 || o->rounds < 1 ||
	    o->duration_s <= 0 || o->pool_size < 1 || o->message_size < 1) {
		usage(stderr);
		return -1;
	}
	return 0;
}

static int
verdict(const char *what, int known, int ok, const char *detail)
{
	printf("  %-52s %-5s %s\n", what, !known ? "n/a" : ok ? "PASS" : "MISS",
	       detail);
	return known && !ok;
}

int
main(int argc, char **argv)
{
	struct bench b;
	char out[1024], m[160];
	int misses = 0;

	memset(&b, 0, sizeof(b));
	if (parse(&b.o, argc, argv) != 0)
		return 64;
	setvbuf(stdout, NULL, _IOLBF, 0);
	b.text = malloc(b.o.message_size + 1);
	if (!b.text)
		return 1;
	for (size_t i = 0; i < b.o.message_size; i++)
		b.text[i] = "abcdefghijklmnopqrstuvwxyz "[i % 27];
	b.text[b.o.message_size] = '\0';

	snprintf(b.dir, sizeof(b.dir), "/tmp/histd-pg-bench-XXXXXX");
	if (!mkdtemp(b.dir))
		return 1;
	chmod(b.dir, 0755);
	snprintf(b.state, sizeof(b.state), "%s/cluster.state", b.dir);
	if (pgtest(&b, "start", out, sizeof(out)) != 0) {
		fprintf(stderr, "histd-pg-bench: cannot start PostgreSQL (%s)\n", out);
		rmdir(b.dir);
		return 1;
	}
	out[strcspn(out, "\n")] = '\0';
	snprintf(b.dsn, sizeof(b.dsn), "%s", out);
	{
		char *argv2[] = { "sh", (char *)b.o.pgtest, "bin", NULL };

		run(argv2, b.pgbin, sizeof(b.pgbin));
		b.pgbin[strcspn(b.pgbin, "\n")] = '\0';
	}
	printf("histd-pg-bench: PostgreSQL at %s\n", b.dsn);

	grpc_init();
	if (phase_on(&b.o, "append") || phase_on(&b.o, "get")) {
		if (start_histd(&b, b.dsn, NULL) != 0) {
			b.failed = 1;
		} else {
			printf("histd-pg-bench: histd %s --pool-size %zu --threads %u\n",
			       b.o.histd, b.o.pool_size, b.o.server_threads);
			if (phase_on(&b.o, "append"))
				phase_append(&b);
			if (phase_on(&b.o, "get") && !b.failed)
				phase_get(&b);
			stop_histd(&b);
		}
	}
	if (phase_on(&b.o, "commit") && !b.failed)
		phase_commit(&b);
	grpc_shutdown();

	printf("\nsummary (%zu callers, %zu B messages):\n", b.o.callers,
	       b.o.message_size);
	snprintf(m, sizeof(m), "%.0f/s vs %.0f tps = %.2fx (append transaction: "
		 "%.0f tps, %.2fx)", b.histd_append, b.pgbench_insert,
		 b.pgbench_insert > 0 ? b.histd_append / b.pgbench_insert : 0,
		 b.pgbench_txn, b.pgbench_txn > 0 ? b.histd_append / b.pgbench_txn : 0);
	misses += verdict("Append >= 1.0x pgbench single-row INSERT",
			  b.ran_append && b.pgbench_insert > 0,
			  b.histd_append >= b.pgbench_insert, m);
	snprintf(m, sizeof(m), "%.0f/s vs %.0f/s (%+.1f%%), p50 %.0f vs %.0f us",
		 b.get_long, b.get_short,
		 b.get_short > 0 ? 100.0 * (b.get_long / b.get_short - 1) : 0,
		 b.get_long_p50, b.get_short_p50);
	misses += verdict("last-20 @100,000 within 20% of @100",
			  b.ran_get && b.get_short > 0,
			  fabs(b.get_long / b.get_short - 1) <= 0.2, m);
	if (b.ran_commit)
		for (int k = 0; k < 4; k++)
			printf("  group commit: %-56s %.0f/s\n", commit_names[k],
			       b.commit[k]);

	pgtest(&b, "stop", NULL, 0);
	{
		char path[128];

		snprintf(path, sizeof(path), "%s/insert.sql", b.dir);
		unlink(path);
		snprintf(path, sizeof(path), "%s/txn.sql", b.dir);
		unlink(path);
	}
	rmdir(b.dir);
	free(b.text);
	printf("\n%s\n", b.failed ? "histd-pg-bench: INCOMPLETE: some calls or "
	       "steps failed" : "histd-pg-bench: completed");
	return b.failed ? 1 : (b.o.strict && misses ? 2 : 0);
}
