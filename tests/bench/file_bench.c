/*
 * histd-file-bench: the file driver's figures, next to the memory driver's
 * in the same run.
 *
 *   histd-file-bench --histd PATH [--callers 16] [--size 1024]
 *                    [--duration 3] [--rounds 3] [--messages 1000000]
 *                    [--dir DIR] [--skip-throughput] [--skip-startup]
 *
 * Throughput: histd is started (--threads 2, --server-threads) with the
 * memory driver, then the file driver with --fsync batch, --fsync always
 * and --fsync never, in turn, `rounds` times (interleaved, so that
 * background load weighs on all alike). Each run: `callers` callers, each
 * on its own session, each keeping one Append of one user text message of
 * `size` bytes in flight (histd-bench's load generator), for `duration` s
 * after a 0.5 s warm-up. The file driver's appends per fsync come from the
 * statistics line it writes when histd stops (warm-up included).
 *
 * Start-up: a data directory with `messages` stored messages of `size`
 * bytes (100 sessions, one message per Append record, fsync=never) is
 * written in-process; then, best of 3 each, with the files in the page
 * cache: `cat` of its files to /dev/null, the driver's open in-process,
 * and histd from exec to its port file. Ratios to cat are printed, and
 * histd's resident memory per stored message.
 *
 * Prints a table and one JSON line ("file_bench": {...}) with every figure.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "driver.h"
#include "file/file.h"
#include "histd/v1/histd.pb-c.h"
#include "loadgen.h"
#include "proc.h"

struct opts {
	const char *histd;
	const char *dir;
	size_t callers, size;
	double duration;
	int rounds;
	uint64_t messages;
	int skip_throughput, skip_startup;
	int threads;
};

/* memory, then the file driver in batch, always and never mode. */
#define N_CONFIGS 4

/* One configuration of the throughput runs, summed over rounds. */
struct config {
	const char *name, *driver, *fsync;
	uint64_t ok, errors, appends, fsyncs, batches, sync_us, gather_us;
	uint64_t srv_cpu_us, host_busy_us;
	double elapsed;
	bench_lat lat;
};

static double
mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void
rm_rf(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	rmdir(dir);
}

/* A packed Message of one user text block of about size bytes. */
static char *
text_of(size_t size)
{
	char *t = malloc(size + 1);

	for (size_t i = 0; i < size; i++)
		t[i] = (char)('a' + i % 26);
	t[size] = '\0';
	return t;
}

/* ---------------------------------------------------------------------- */
/* Throughput                                                              */

static grpc_slice
append_request(const char *id, const char *text)
{
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock block = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &block };
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	Histd__V1__Message *msgs[1] = { &msg };
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;

	tb.text = (char *)text;
	block.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	block.text = &tb;
	msg.role = HISTD__V1__ROLE__ROLE_USER;
	msg.n_content = 1;
	msg.content = blocks;
	req.session_id = (char *)id;
	req.n_messages = 1;
	req.messages = msgs;
	return bench_pack(&req.base);
}

static uint64_t
field(const char *line, const char *key)
{
	char k[64];
	const char *p;

	snprintf(k, sizeof(k), "\"%s\":\"", key);
	p = strstr(line, k);
	return p ? strtoull(p + strlen(k), NULL, 10) : 0;
}

/* The file driver's counters from the line it logs when closed. */
static void
parse_stats(const char *log, struct config *cf)
{
	FILE *f = fopen(log, "r");
	char line[2048];

	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		if (!strstr(line, "file driver closed"))
			continue;
		cf->appends += field(line, "appends");
		cf->fsyncs += field(line, "fsyncs");
		cf->batches += field(line, "batches");
		cf->sync_us += field(line, "sync_us");
		cf->gather_us += field(line, "gather_us");
	}
	fclose(f);
}

static int
run_config(const struct opts *o, struct config *cf, const char *text)
{
	char dir[512], log[560];
	const char *extra[5];
	size_t n_extra = 0;
	bench_server srv;
	bench_client *c = NULL;
	grpc_slice *reqs;
	bench_run_spec spec = { .method = BENCH_M_APPEND, .callers = o->callers,
				.timeout_s = 30 };
	bench_run_result res;
	int rc = -1;

	snprintf(dir, sizeof(dir), "%s/tp-%s", o->dir, cf->name);
	snprintf(log, sizeof(log), "%s/tp-%s.log", o->dir, cf->name);
	rm_rf(dir);
	extra[n_extra++] = "--auth-disabled";
	if (cf->fsync) {
		extra[n_extra++] = "--data-dir";
		extra[n_extra++] = dir;
		extra[n_extra++] = "--fsync";
		extra[n_extra++] = cf->fsync;
	}
	if (bench_server_start(&srv, o->histd, cf->driver, o->threads, extra, n_extra,
			       log, 30) != 0)
		return -1;
	reqs = calloc(o->callers, sizeof(*reqs));
	if (!reqs || bench_client_new(&c, srv.addr, 2, 4) != 0)
		goto out;
	for (size_t i = 0; i < o->callers; i++) {
		Histd__V1__CreateSessionRequest cr = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
		grpc_status_code st;
		char id[64], details[200];

		snprintf(id, sizeof(id), "fb-%zu", i);
		cr.session_id = id;
		if (bench_unary_sync(c, BENCH_M_CREATE_SESSION, &cr.base, 10, &st,
				     details, sizeof(details), NULL, NULL) != 0 ||
		    st != GRPC_STATUS_OK) {
			fprintf(stderr, "histd-file-bench: CreateSession: %d %s\n",
				st, details);
			goto out;
		}
		reqs[i] = append_request(id, text);
	}
	spec.requests = reqs;
	spec.n_requests = o->callers;
	spec.duration_s = 0.5;
	if (bench_client_run(c, &spec, &res) == 0)
		bench_run_result_free(&res);
	spec.duration_s = o->duration;
	{
		uint64_t c0 = 0, c1 = 0, h0 = 0, h1 = 0;

		bench_proc_cpu_us(srv.pid, &c0);
		bench_host_busy_us(&h0);
		if (bench_client_run(c, &spec, &res) != 0)
			goto out;
		bench_proc_cpu_us(srv.pid, &c1);
		bench_host_busy_us(&h1);
		cf->srv_cpu_us += c1 - c0;
		cf->host_busy_us += h1 - h0;
	}
	cf->ok += res.ok;
	cf->errors += res.errors;
	cf->elapsed += res.elapsed_s;
	if (res.errors)
		fprintf(stderr, "histd-file-bench: %s: %llu errors, first %d %s\n",
			cf->name, (unsigned long long)res.errors, res.first_error,
			res.first_error_details);
	bench_lat_merge(&cf->lat, &res.lat);
	bench_run_result_free(&res);
	rc = 0;
out:
	for (size_t i = 0; reqs && i < o->callers; i++)
		grpc_slice_unref(reqs[i]);
	free(reqs);
	if (c)
		bench_client_free(c);
	bench_server_stop(&srv, 30);
	if (cf->fsync)
		parse_stats(log, cf);
	unlink(log);
	rm_rf(dir);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Start-up                                                                */

struct fill {
	histd_driver *d;
	const uint8_t *msg;
	size_t len;
	uint64_t from, to;
	int failed;
};

static void *
fill_main(void *arg)
{
	struct fill *f = arg;

	for (uint64_t i = f->from; i < f->to && !f->failed; i++) {
		char id[32];
		histd_msg_in m = { .data = f->msg, .len = f->len,
				   .token_estimate = (uint32_t)(f->len / 4) };
		histd_append a = { .tenant = "default", .session_id = id,
				   .msgs = &m, .n_msgs = 1 };
		histd_append_result r;

		snprintf(id, sizeof(id), "s%03llu", (unsigned long long)(i % 100));
		if (histd_driver_append(f->d, &a, &r)) {
			fprintf(stderr, "histd-file-bench: fill: %s\n",
				histd_error_message());
			f->failed = 1;
		}
	}
	return NULL;
}

/* The data directory of the start-up test: messages of size bytes, as
 * histd would store one user text message (a packed Message). */
static int
fill_dir(const char *dir, uint64_t messages, size_t size)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "never" };
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock block = HISTD__V1__CONTENT_BLOCK__INIT;
	Histd__V1__ContentBlock *blocks[1] = { &block };
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT;
	char *text = text_of(size);
	struct fill f[8];
	pthread_t th[8];
	histd_driver *d;
	uint8_t *packed;
	size_t len;
	int failed = 0;

	rm_rf(dir);
	if (histd_driver_open("file", &cfg, &d)) {
		fprintf(stderr, "histd-file-bench: %s\n", histd_error_message());
		return -1;
	}
	tb.text = text;
	block.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	block.text = &tb;
	msg.role = HISTD__V1__ROLE__ROLE_USER;
	msg.n_content = 1;
	msg.content = blocks;
	len = histd__v1__message__get_packed_size(&msg);
	packed = malloc(len);
	histd__v1__message__pack(&msg, packed);
	for (int s = 0; s < 100; s++) {
		char id[32];
		histd_session in = { .tenant = "default", .id = id,
				     .created_at_us = 1700000000000000LL };
		histd_session *out;

		snprintf(id, sizeof(id), "s%03d", s);
		if (histd_driver_session_create(d, &in, &out) == 0)
			histd_session_free(out);
	}
	/* Eight writers share the log writer's batches. */
	for (int t = 0; t < 8; t++) {
		f[t] = (struct fill){ d, packed, len, messages * (uint64_t)t / 8,
				      messages * (uint64_t)(t + 1) / 8, 0 };
		pthread_create(&th[t], NULL, fill_main, &f[t]);
	}
	for (int t = 0; t < 8; t++) {
		pthread_join(th[t], NULL);
		failed |= f[t].failed;
	}
	histd_driver_close(d);
	free(packed);
	free(text);
	return failed ? -1 : 0;
}

/* Wall time of `cat FILES > /dev/null`. */
static double
time_cat(const char *dir)
{
	char *argv[64];
	int argc = 0, status;
	DIR *d = opendir(dir);
	struct dirent *e;
	double t0;
	pid_t pid;

	argv[argc++] = "cat";
	while (d && (e = readdir(d)) && argc < 62) {
		char *p;

		if (!strstr(e->d_name, ".hsd"))
			continue;
		p = malloc(strlen(dir) + strlen(e->d_name) + 2);
		sprintf(p, "%s/%s", dir, e->d_name);
		argv[argc++] = p;
	}
	if (d)
		closedir(d);
	argv[argc] = NULL;
	t0 = mono_s();
	pid = fork();
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);

		dup2(fd, 1);
		execvp("cat", argv);
		_exit(127);
	}
	waitpid(pid, &status, 0);
	t0 = mono_s() - t0;
	for (int i = 1; i < argc; i++)
		free(argv[i]);
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? t0 : -1;
}

static double
time_open(const char *dir, uint64_t *open_us)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "batch" };
	histd_file_stats st;
	histd_driver *d;
	double t0 = mono_s(), t;

	if (histd_driver_open("file", &cfg, &d)) {
		fprintf(stderr, "histd-file-bench: open: %s\n", histd_error_message());
		return -1;
	}
	t = mono_s() - t0;
	histd_file_driver_stats(d, &st);
	*open_us = st.open_us;
	histd_driver_close(d);
	return t;
}

static long
status_kb(pid_t pid, const char *field)
{
	char path[64], line[256];
	long kb = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	if (!(f = fopen(path, "r")))
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, strlen(field)) == 0)
			kb = strtol(line + strlen(field) + 1, NULL, 10);
	fclose(f);
	return kb;
}

/* Wall time from exec of histd to its port file (polled every 0.5 ms);
 * *anon_kb: its RssAnon then. */
static double
time_histd(const struct opts *o, const char *dir, long *anon_kb, long *rss_kb)
{
	char port[600];
	const char *argv[] = { o->histd, "--driver", "file", "--data-dir", dir,
			       "--listen", "127.0.0.1:0", "--port-file", port,
			       "--log-level", "warn", "--auth-disabled", NULL };
	double t0, t = -1;
	pid_t pid;

	snprintf(port, sizeof(port), "%s/startup.port", o->dir);
	unlink(port);
	t0 = mono_s();
	pid = fork();
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(o->histd, (char *const *)argv);
		_exit(127);
	}
	while (mono_s() - t0 < 120) {
		if (access(port, F_OK) == 0) {
			t = mono_s() - t0;
			break;
		}
		if (waitpid(pid, NULL, WNOHANG) == pid)
			return -1;
		usleep(500);
	}
	*anon_kb = status_kb(pid, "RssAnon:");
	*rss_kb = status_kb(pid, "VmRSS:");
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	unlink(port);
	return t;
}

static double
min3(double a, double b, double c)
{
	double m = a < b ? a : b;

	return m < c ? m : c;
}

/* ---------------------------------------------------------------------- */

static void
usage(void)
{
	fprintf(stderr,
		"usage: histd-file-bench --histd PATH [--callers N] [--size BYTES]\n"
		"       [--duration S] [--rounds N] [--messages N] [--dir DIR]\n"
		"       [--skip-throughput] [--skip-startup] [--server-threads N]\n");
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "histd", required_argument, NULL, 'h' },
		{ "callers", required_argument, NULL, 'c' },
		{ "size", required_argument, NULL, 's' },
		{ "duration", required_argument, NULL, 'd' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "messages", required_argument, NULL, 'm' },
		{ "dir", required_argument, NULL, 'D' },
		{ "skip-throughput", no_argument, NULL, 'T' },
		{ "skip-startup", no_argument, NULL, 'S' },
		{ "server-threads", required_argument, NULL, 't' },
		{ NULL, 0, NULL, 0 },
	};
	struct opts o = { .callers = 16, .size = 1024, .duration = 3,
			  .rounds = 3, .messages = 1000000, .threads = 2 };
	struct config cf[N_CONFIGS] = {
		{ .name = "memory", .driver = "memory" },
		{ .name = "file-batch", .driver = "file", .fsync = "batch" },
		{ .name = "file-always", .driver = "file", .fsync = "always" },
		{ .name = "file-never", .driver = "file", .fsync = "never" },
	};
	char tmpl[256], data[600], *text;
	double tput[N_CONFIGS] = { 0 }, cat_s = -1, open_s = -1, histd_s = -1;
	uint64_t open_us = 0;
	long anon_kb = -1, rss_kb = -1;
	int opt, failed = 0;

	while ((opt = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (opt) {
		case 'h': o.histd = optarg; break;
		case 'c': o.callers = strtoul(optarg, NULL, 10); break;
		case 's': o.size = strtoul(optarg, NULL, 10); break;
		case 'd': o.duration = atof(optarg); break;
		case 'r': o.rounds = atoi(optarg); break;
		case 'm': o.messages = strtoull(optarg, NULL, 10); break;
		case 'D': o.dir = optarg; break;
		case 'T': o.skip_throughput = 1; break;
		case 'S': o.skip_startup = 1; break;
		case 't': o.threads = atoi(optarg); break;
		default: usage(); return 2;
		}
	}
	if (!o.histd || !o.callers || !o.size || o.rounds < 1 ||
	    o.threads < 1) {
		usage();
		return 2;
	}
	if (!o.dir) {
		const char *t = getenv("TMPDIR");

		snprintf(tmpl, sizeof(tmpl), "%s/histd-file-bench-XXXXXX",
			 t && *t ? t : "/tmp");
		if (!mkdtemp(tmpl)) {
			perror("mkdtemp");
			return 1;
		}
		o.dir = tmpl;
	} else if (mkdir(o.dir, 0700) != 0 && errno != EEXIST) {
		fprintf(stderr, "histd-file-bench: cannot create %s: %s\n", o.dir,
			strerror(errno));
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	text = text_of(o.size);

	if (!o.skip_throughput) {
		grpc_init();
		for (int r = 0; r < o.rounds; r++)
			for (int i = 0; i < N_CONFIGS; i++)
				if (run_config(&o, &cf[i], text) != 0) {
					fprintf(stderr, "histd-file-bench: %s run failed\n",
						cf[i].name);
					failed = 1;
				}
		grpc_shutdown();
		printf("\nAppend, %zu callers, one %zu-byte text message per call, "
		       "%d x %.1f s each (histd --threads %d)\n", o.callers, o.size,
		       o.rounds, o.duration, o.threads);
		printf("%-12s %10s %9s %9s %9s %10s %12s %9s %9s\n", "config",
		       "appends/s", "vs memory", "p50 us", "p99 us", "fsyncs",
		       "appends/fsync", "fsync us", "gather us");
		printf("%-12s (server CPU per append, host busy %%)\n", "");
		for (int i = 0; i < N_CONFIGS; i++) {
			bench_lat_sort(&cf[i].lat);
			tput[i] = cf[i].elapsed > 0 ? (double)cf[i].ok / cf[i].elapsed : 0;
		}
		for (int i = 0; i < N_CONFIGS; i++) {
			char per[32] = "-", fs[32] = "-", su[32] = "-", gu[32] = "-";

			/* never syncs only when histd stops. */
			if (cf[i].fsync && strcmp(cf[i].fsync, "never") != 0 &&
			    cf[i].fsyncs) {
				snprintf(per, sizeof(per), "%.1f",
					 (double)cf[i].appends / (double)cf[i].fsyncs);
				snprintf(fs, sizeof(fs), "%llu",
					 (unsigned long long)cf[i].fsyncs);
				snprintf(su, sizeof(su), "%.0f",
					 (double)cf[i].sync_us / (double)cf[i].fsyncs);
				snprintf(gu, sizeof(gu), "%.0f", cf[i].batches ?
					 (double)cf[i].gather_us / (double)cf[i].batches : 0);
			}
			printf("%-12s %10.0f %8.2fx %9.0f %9.0f %10s %12s %9s %9s\n",
			       cf[i].name, tput[i], tput[0] > 0 ? tput[i] / tput[0] : 0,
			       bench_lat_quantile_us(&cf[i].lat, 0.5),
			       bench_lat_quantile_us(&cf[i].lat, 0.99), fs, per, su, gu);
			printf("%-12s %8.1f us/append, host %3.0f%% of 2 cores\n", "",
			       cf[i].ok ? (double)cf[i].srv_cpu_us / (double)cf[i].ok : 0,
			       cf[i].elapsed > 0 ? (double)cf[i].host_busy_us /
			       (cf[i].elapsed * 1e6 * 2) * 100 : 0);
		}
	}

	if (!o.skip_startup) {
		uint64_t u;

		snprintf(data, sizeof(data), "%s/startup", o.dir);
		printf("\nStart-up with %llu stored messages of %zu bytes (100 sessions, "
		       "one per Append record)\n", (unsigned long long)o.messages, o.size);
		fflush(stdout);
		if (fill_dir(data, o.messages, o.size) != 0) {
			failed = 1;
		} else {
			time_cat(data);         /* into the page cache */
			cat_s = min3(time_cat(data), time_cat(data), time_cat(data));
			open_s = min3(time_open(data, &u), time_open(data, &open_us),
				      time_open(data, &u));
			{
				long a = -1, r = -1;
				double t1 = time_histd(&o, data, &a, &r);
				double t2 = time_histd(&o, data, &a, &r);
				double t3 = time_histd(&o, data, &anon_kb, &rss_kb);

				histd_s = min3(t1 < 0 ? 1e9 : t1, t2 < 0 ? 1e9 : t2,
					       t3 < 0 ? 1e9 : t3);
			}
			printf("%-34s %8.3f s\n", "cat of the data files", cat_s);
			printf("%-34s %8.3f s  %5.2fx cat\n", "file driver open (in-process)",
			       open_s, open_s / cat_s);
			printf("%-34s %8.3f s  %5.2fx cat\n", "histd exec to serving",
			       histd_s, histd_s / cat_s);
			printf("%-34s %8.0f B/message anonymous, %.0f B/message resident\n",
			       "histd memory after start",
			       anon_kb * 1024.0 / (double)o.messages,
			       rss_kb * 1024.0 / (double)o.messages);
		}
		rm_rf(data);
	}

	printf("{\"file_bench\":{\"callers\":%zu,\"size\":%zu,"
	       "\"memory_appends_per_s\":%.0f,\"batch_appends_per_s\":%.0f,"
	       "\"always_appends_per_s\":%.0f,\"never_appends_per_s\":%.0f,"
	       "\"batch_vs_memory\":%.3f,\"always_vs_memory\":%.3f,"
	       "\"never_vs_memory\":%.3f,\"batch_appends_per_fsync\":%.2f,"
	       "\"always_appends_per_fsync\":%.2f,\"startup_messages\":%llu,"
	       "\"cat_s\":%.3f,\"open_s\":%.3f,\"histd_start_s\":%.3f,"
	       "\"open_vs_cat\":%.2f,\"histd_vs_cat\":%.2f,"
	       "\"anon_bytes_per_message\":%.0f}}\n",
	       o.callers, o.size, tput[0], tput[1], tput[2], tput[3],
	       tput[0] > 0 ? tput[1] / tput[0] : 0,
	       tput[0] > 0 ? tput[2] / tput[0] : 0,
	       tput[0] > 0 ? tput[3] / tput[0] : 0,
	       cf[1].fsyncs ? (double)cf[1].appends / (double)cf[1].fsyncs : 0,
	       cf[2].fsyncs ? (double)cf[2].appends / (double)cf[2].fsyncs : 0,
	       (unsigned long long)o.messages, cat_s, open_s, histd_s,
	       cat_s > 0 ? open_s / cat_s : 0, cat_s > 0 ? histd_s / cat_s : 0,
	       anon_kb > 0 ? anon_kb * 1024.0 / (double)o.messages : 0);
	for (int i = 0; i < N_CONFIGS; i++)
		bench_lat_free(&cf[i].lat);
	free(text);
	if (o.dir == tmpl)
		rmdir(tmpl);
	(void)open_us;
	return failed ? 1 : 0;
}
