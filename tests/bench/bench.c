/*
 * histd-bench: measures histd against the targets of its performance issue.
 *
 * In one run it starts the histd binary (or uses a running server) and
 * measures, each phase chosen by --phases:
 *   null       grpc.health.v1.Health/Check "": the transport's own limit
 *   append     Append of one 1 KiB user text message per call
 *   get        GetMessages last_n=20 on a 100-message and on a
 *              100,000-message session, filled first by batched Appends;
 *              the fill also gives the resident memory per stored message
 *   subscribe  100 Subscribe streams on one session, one appender at a
 *              steady rate: delivery latency against Append latency
 *   context    (not in the default list) GetMessages view CONTEXT on a
 *              10,000-message session with a pipeline and a summary,
 *              against RAW last-20 on the same session
 *   search     (not in the default list) lexical Search over 100,000
 *              messages in 10 sessions of one tenant, against GetMessages
 *              last-20 on one of them
 *   compaction (not in the default list) Append while automatic
 *              compaction calls a provider stub (in this process) that
 *              takes 2 s per call, against Append without compaction
 * null, append and get are measured in --rounds interleaved slices (each
 * with a warm-up), so that background load that comes and goes weighs on
 * all of them alike: their targets are ratios between them. The server's
 * CPU time (/proc/PID/stat) is read around the measured parts only.
 *
 * Timings are reported, never asserted: the exit status says whether the
 * run completed (every call answered OK), not whether targets were met
 * (unless --strict).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bench.h"
#include "stub_provider.h"

/* ---------------------------------------------------------------------
 * Options */

static void usage(FILE *f)
{
	fputs(
"usage: histd-bench (--histd PATH | --target HOST:PORT) [options]\n"
"  --histd PATH          start this histd binary on 127.0.0.1:0\n"
"  --target HOST:PORT    use a running server instead\n"
"  --server-pid PID      with --target: its pid, for CPU and memory\n"
"  --driver NAME         storage driver passed to histd (memory)\n"
"  --server-threads N    histd --threads (number of CPUs)\n"
"  --histd-arg ARG       one more argument for histd (repeatable)\n"
"  --server-log PATH     keep histd's output there (default: a temporary\n"
"                        file, removed unless the server fails)\n"
"  --client-threads N    client worker threads, one queue each (2)\n"
"  --connections N       client channels (= client threads)\n"
"  --concurrency N       calls in flight (16)\n"
"  --message-size BYTES  text of each message (1024)\n"
"  --count N             calls per measured phase; Subscribe: Appends\n"
"                        (default: by duration)\n"
"  --duration SECONDS    length of each measured phase (5)\n"
"  --warmup SECONDS      warm-up before each measured phase (1; 0: none)\n"
"  --rounds N            null, append and get are measured in N slices\n"
"                        each, interleaved, and summed (5)\n"
"  --session-length N    messages of the long GetMessages session (100000)\n"
"  --short-length N      messages of the short one (100)\n"
"  --fill-batch N        messages per Append when filling (500)\n"
"  --append-sessions N   0: each caller its own session; N: callers spread\n"
"                        over N sessions (1: all on one) (0)\n"
"  --subscribers N       Subscribe streams on the fan-out session (100)\n"
"  --rate N              fan-out appends per second (100)\n"
"  --timeout SECONDS     per call (30)\n"
"  --phases LIST         comma list of null,append,get,subscribe,context,\n"
"                        compaction,search (default: the first four)\n"
"  --strict              exit 2 if a target is missed\n", f);
}

static int parse_u64(const char *name, const char *s, uint64_t min,
		     uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *end != '\0' || s[0] == '-' || v < min) {
		fprintf(stderr, "histd-bench: --%s: expected an integer >= %"
			PRIu64 "\n", name, min);
		return -1;
	}
	*out = v;
	return 0;
}

static int parse_size(const char *name, const char *s, uint64_t min,
		      size_t *out)
{
	uint64_t v;

	if (parse_u64(name, s, min, &v) != 0)
		return -1;
	*out = (size_t)v;
	return 0;
}

static int parse_number(const char *name, const char *s, double min,
			double max, const char *unit, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !(v >= min) || v > max) {
		fprintf(stderr, "histd-bench: --%s: expected %s from %g to %g\n",
			name, unit, min, max);
		return -1;
	}
	*out = v;
	return 0;
}

int bench_phase_on(const struct options *o, const char *name)
{
	const char *p = o->phases;
	size_t n = strlen(name);

	while (*p) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);

		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		p += len + (e ? 1 : 0);
	}
	return 0;
}

static int check_phases(const char *list)
{
	static const char *const known[] = { "null", "append", "get",
					     "subscribe", "context",
					     "compaction", "search" };
	const char *p = list;

	if (!*p)
		return -1;
	while (*p) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		int ok = 0;

		for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
			if (len == strlen(known[i]) &&
			    strncmp(p, known[i], len) == 0)
				ok = 1;
		if (!ok) {
			fprintf(stderr, "histd-bench: --phases: unknown phase "
				"'%.*s' (null, append, get, subscribe, context, "
				"compaction, search)\n",
				(int)len, p);
			return -1;
		}
		p += len + (e ? 1 : 0);
	}
	return 0;
}

static int parse_options(struct options *o, int argc, char **argv)
{
	enum {
		O_HISTD = 256, O_TARGET, O_SERVER_PID, O_DRIVER, O_SRV_THREADS,
		O_SERVER_LOG, O_HISTD_ARG, O_CLI_THREADS, O_CONNECTIONS,
		O_CONCURRENCY, O_MSG_SIZE, O_COUNT, O_DURATION, O_WARMUP,
		O_ROUNDS, O_SESSION_LEN, O_SHORT_LEN, O_FILL_BATCH, O_APPEND_SESSIONS,
		O_SUBSCRIBERS, O_RATE, O_TIMEOUT, O_PHASES, O_STRICT, O_HELP
	};
	static const struct option longopts[] = {
		{ "histd", required_argument, NULL, O_HISTD },
		{ "target", required_argument, NULL, O_TARGET },
		{ "server-pid", required_argument, NULL, O_SERVER_PID },
		{ "driver", required_argument, NULL, O_DRIVER },
		{ "server-threads", required_argument, NULL, O_SRV_THREADS },
		{ "server-log", required_argument, NULL, O_SERVER_LOG },
		{ "histd-arg", required_argument, NULL, O_HISTD_ARG },
		{ "client-threads", required_argument, NULL, O_CLI_THREADS },
		{ "connections", required_argument, NULL, O_CONNECTIONS },
		{ "concurrency", required_argument, NULL, O_CONCURRENCY },
		{ "message-size", required_argument, NULL, O_MSG_SIZE },
		{ "count", required_argument, NULL, O_COUNT },
		{ "duration", required_argument, NULL, O_DURATION },
		{ "warmup", required_argument, NULL, O_WARMUP },
		{ "rounds", required_argument, NULL, O_ROUNDS },
		{ "session-length", required_argument, NULL, O_SESSION_LEN },
		{ "short-length", required_argument, NULL, O_SHORT_LEN },
		{ "fill-batch", required_argument, NULL, O_FILL_BATCH },
		{ "append-sessions", required_argument, NULL, O_APPEND_SESSIONS },
		{ "subscribers", required_argument, NULL, O_SUBSCRIBERS },
		{ "rate", required_argument, NULL, O_RATE },
		{ "timeout", required_argument, NULL, O_TIMEOUT },
		{ "phases", required_argument, NULL, O_PHASES },
		{ "strict", no_argument, NULL, O_STRICT },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 }
	};
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	uint64_t u;
	int opt;

	memset(o, 0, sizeof(*o));
	o->driver = TARGET_DRIVER;
	o->server_threads = ncpu > 0 ? (unsigned)ncpu : 2;
	o->client_threads = 2;
	o->concurrency = TARGET_CALLERS;
	o->message_size = TARGET_MSG_SIZE;
	o->duration_s = 5;
	o->warmup_s = 1;
	o->rounds = 5;
	o->session_length = 100000;
	o->short_length = 100;
	o->fill_batch = 500;
	o->subscribers = TARGET_SUBSCRIBERS;
	o->rate = 100;
	o->timeout_s = 30;
	snprintf(o->phases, sizeof(o->phases), "null,append,get,subscribe");

	while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		int rc = 0;
		const char *name = NULL;

		for (const struct option *lo = longopts; lo->name; lo++)
			if (lo->val == opt)
				name = lo->name;
		switch (opt) {
		case O_HISTD: o->histd = optarg; break;
		case O_TARGET: o->target = optarg; break;
		case O_SERVER_PID:
			rc = parse_u64(name, optarg, 1, &u);
			o->server_pid = (long)u;
			break;
		case O_DRIVER: o->driver = optarg; break;
		case O_SRV_THREADS:
			rc = parse_u64(name, optarg, 1, &u);
			o->server_threads = (unsigned)u;
			break;
		case O_SERVER_LOG: o->server_log = optarg; break;
		case O_HISTD_ARG: {
			const char **a = realloc(o->histd_args,
				(o->n_histd_args + 1) * sizeof(*a));

			if (!a)
				return -1;
			a[o->n_histd_args++] = optarg;
			o->histd_args = a;
			break;
		}
		case O_CLI_THREADS:
			rc = parse_size(name, optarg, 1, &o->client_threads);
			break;
		case O_CONNECTIONS:
			rc = parse_size(name, optarg, 1, &o->connections);
			break;
		case O_CONCURRENCY:
			rc = parse_size(name, optarg, 1, &o->concurrency);
			break;
		case O_MSG_SIZE:
			rc = parse_size(name, optarg, 1, &o->message_size);
			break;
		case O_COUNT: rc = parse_u64(name, optarg, 1, &o->count); break;
		case O_DURATION:
			rc = parse_number(name, optarg, 0.01, 86400, "seconds",
					  &o->duration_s);
			break;
		case O_WARMUP:
			rc = parse_number(name, optarg, 0, 3600, "seconds",
					  &o->warmup_s);
			break;
		case O_ROUNDS:
			rc = parse_size(name, optarg, 1, &o->rounds);
			break;
		case O_SESSION_LEN:
			rc = parse_size(name, optarg, 1, &o->session_length);
			break;
		case O_SHORT_LEN:
			rc = parse_size(name, optarg, 1, &o->short_length);
			break;
		case O_FILL_BATCH:
			rc = parse_size(name, optarg, 1, &o->fill_batch);
			break;
		case O_APPEND_SESSIONS:
			rc = parse_size(name, optarg, 0, &o->append_sessions);
			break;
		case O_SUBSCRIBERS:
			rc = parse_size(name, optarg, 1, &o->subscribers);
			break;
		case O_RATE:
			rc = parse_number(name, optarg, 0.1, 1e6,
					  "appends per second", &o->rate);
			break;
		case O_TIMEOUT:
			rc = parse_number(name, optarg, 0.1, 3600, "seconds",
					  &o->timeout_s);
			break;
		case O_PHASES:
			snprintf(o->phases, sizeof(o->phases), "%s", optarg);
			rc = check_phases(o->phases);
			break;
		case O_STRICT: o->strict = 1; break;
		case O_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
		if (rc != 0)
			return -1;
	}
	if (optind < argc) {
		fprintf(stderr, "histd-bench: unexpected argument '%s'\n",
			argv[optind]);
		return -1;
	}
	if (!o->histd == !o->target) {
		fprintf(stderr, "histd-bench: give one of --histd or --target\n");
		usage(stderr);
		return -1;
	}
	if (o->connections == 0)
		o->connections = o->client_threads;
	return 0;
}

/* A message's text: printable, not one repeated byte, so that no layer
 * gets an unrealistically easy ride. */
static char *make_text(size_t n)
{
	char *t = malloc(n + 1);

	if (!t)
		return NULL;
	for (size_t i = 0; i < n; i++)
		t[i] = (char)('a' + (i * 7 + i / 26) % 26);
	t[n] = '\0';
	return t;
}

/* ---------------------------------------------------------------------
 * Report */

static void ratio(char *buf, size_t size, double v, double base)
{
	if (v > 0 && base > 0)
		snprintf(buf, size, "%.2f", v / base);
	else
		snprintf(buf, size, "-");
}

static void print_table(const struct bench *b)
{
	const struct row *nul = &b->rows[R_NULL];
	double worst_other = 0;

	printf("\n%-28s %9s %9s %8s %8s %8s %8s %6s | %6s %6s %6s %6s\n",
	       "phase", "calls", "calls/s", "p50 us", "p99 us", "srv us/c",
	       "cli us/c", "other%", "tput/N", "p50/N", "p99/N", "cpu/N");
	for (int i = 0; i < R_COUNT; i++) {
		const struct row *r = &b->rows[i];
		char srv[16], cli[16], oth[16], rt[16], r50[16], r99[16], rc[16];
		int base = nul->ran;

		if (!r->name[0])
			continue;
		if (!r->ran) {
			printf("%-28s %9s%s%s\n", r->name, "not run",
			       r->note[0] ? "  " : "", r->note);
			continue;
		}
		if (r->srv_cpu >= 0)
			snprintf(srv, sizeof(srv), "%.1f", r->srv_cpu);
		else
			snprintf(srv, sizeof(srv), "-");
		if (r->cli_cpu >= 0)
			snprintf(cli, sizeof(cli), "%.1f", r->cli_cpu);
		else
			snprintf(cli, sizeof(cli), "-");
		if (r->other >= 0)
			snprintf(oth, sizeof(oth), "%.0f", r->other);
		else
			snprintf(oth, sizeof(oth), "-");
		if (r->other > worst_other)
			worst_other = r->other;
		/* A paced phase's rate is ours, not the server's limit. */
		ratio(rt, sizeof(rt), r->paced ? 0 : r->tput,
		      base ? nul->tput : 0);
		ratio(r50, sizeof(r50), r->p50, base ? nul->p50 : 0);
		ratio(r99, sizeof(r99), r->p99, base ? nul->p99 : 0);
		ratio(rc, sizeof(rc), r->srv_cpu, base ? nul->srv_cpu : 0);
		printf("%-28s %9" PRIu64 " %9.0f %8.1f %8.1f %8s %8s %6s | %6s "
		       "%6s %6s %6s\n", r->name, r->calls, r->tput, r->p50,
		       r->p99, srv, cli, oth, rt, r50, r99, rc);
		if (r->note[0])
			printf("%-28s   note: %s\n", "", r->note);
	}
	printf("srv/cli us/c: CPU per call of the server (/proc/PID/stat, "
	       "10 ms ticks) and of this client;\nother%%: CPU of other "
	       "processes during the phase, %% of one core; x/N: ratio to the "
	       "null RPC;\nSubscribe rows: CPU of the window per Append and "
	       "per delivered event.\n");
	if (worst_other > 20)
		printf("WARNING: other processes used up to %.0f%% of a core "
		       "during a phase: throughput and latency figures are "
		       "disturbed; rerun on a quiet machine.\n", worst_other);

	if (b->mem.ran) {
		double limit = 1.5 * (double)b->mem.packed + 128;

		printf("\nmemory: VmRSS %.1f MiB -> %.1f MiB over %" PRIu64
		       " stored messages: %.0f B per message; packed Message "
		       "%zu B", (double)b->mem.rss_before / 1048576.0,
		       (double)b->mem.rss_after / 1048576.0, b->mem.messages,
		       b->mem.per_message, b->mem.packed);
		if (b->mem.stats_bytes > 0)
			printf(" (server stats: %.0f B)", b->mem.stats_bytes);
		printf("; target <= 1.5 x %zu + 128 = %.0f B (%.2fx packed)\n",
		       b->mem.packed, limit,
		       b->mem.packed ? b->mem.per_message /
				       (double)b->mem.packed : 0);
	}
}

/* One summary line; returns 1 if missed. */
static int verdict(const char *target, int known, int pass,
		   const char *measured)
{
	printf("  %-58s %-28s %s\n", target, known ? measured : "n/a",
	       !known ? "n/a" : pass ? "PASS" : "MISS");
	return known && !pass;
}

static int print_summary(const struct bench *b)
{
	const struct row *nul = &b->rows[R_NULL], *ap = &b->rows[R_APPEND];
	const struct row *gs = &b->rows[R_GET_SHORT], *gl = &b->rows[R_GET_LONG];
	const struct row *sa = &b->rows[R_SUB_APPEND];
	const struct row *sd = &b->rows[R_SUB_DELIVERY];
	const struct options *o = &b->o;
	char m[64], t[96];
	int misses = 0, known;
	double v;

	printf("\nsummary (targets for the memory driver, %d callers, %d B "
	       "messages, %d subscribers):\n", TARGET_CALLERS,
	       TARGET_MSG_SIZE, TARGET_SUBSCRIBERS);
	if (strcmp(o->driver, TARGET_DRIVER) != 0 ||
	    o->concurrency != TARGET_CALLERS ||
	    o->message_size != TARGET_MSG_SIZE ||
	    o->subscribers != TARGET_SUBSCRIBERS || o->target)
		printf("  note: this run's settings differ (driver %s, %zu "
		       "callers, %zu B, %zu subscribers%s)\n", o->driver,
		       o->concurrency, o->message_size, o->subscribers,
		       o->target ? ", external server" : "");

	known = nul->ran && ap->ran && nul->tput > 0;
	v = known ? ap->tput / nul->tput : 0;
	snprintf(m, sizeof(m), "%.2fx", v);
	misses += verdict("Append throughput >= 0.8x null RPC", known,
			  v >= 0.8, m);

	known = nul->ran && gs->ran && nul->tput > 0;
	v = known ? gs->tput / nul->tput : 0;
	snprintf(m, sizeof(m), "%.2fx", v);
	snprintf(t, sizeof(t), "GetMessages last-20 @%zu throughput >= 0.8x "
		 "null RPC", o->short_length);
	misses += verdict(t, known, v >= 0.8, m);

	known = nul->ran && gl->ran && nul->tput > 0;
	v = known ? gl->tput / nul->tput : 0;
	snprintf(m, sizeof(m), "%.2fx", v);
	snprintf(t, sizeof(t), "GetMessages last-20 @%zu throughput >= 0.8x "
		 "null RPC", o->session_length);
	misses += verdict(t, known, v >= 0.8, m);

	/* Cost is the server's CPU per call; without the server's pid the
	 * client-side latency stands in for it. */
	known = gs->ran && gl->ran;
	if (known && gs->srv_cpu > 0 && gl->srv_cpu >= 0) {
		v = gl->srv_cpu / gs->srv_cpu - 1;
		snprintf(m, sizeof(m), "%+.1f%% CPU/call", v * 100);
	} else if (known && gs->p50 > 0) {
		v = gl->p50 / gs->p50 - 1;
		snprintf(m, sizeof(m), "%+.1f%% p50", v * 100);
	} else {
		known = 0;
		v = 0;
	}
	snprintf(t, sizeof(t), "GetMessages cost @%zu within 10%% of @%zu",
		 o->session_length, o->short_length);
	misses += verdict(t, known, fabs(v) <= 0.10, m);

	known = sa->ran && sd->ran && sa->p99 > 0 && sd->calls > 0;
	v = known ? sd->p99 / sa->p99 : 0;
	snprintf(m, sizeof(m), "%.2fx (%.0f vs %.0f us)", v, sd->p99, sa->p99);
	snprintf(t, sizeof(t), "Subscribe delivery p99 (%zu subs) <= 2x "
		 "Append p99", o->subscribers);
	misses += verdict(t, known, v <= 2.0, m);

	if (bench_phase_on(o, "context")) {
		const struct row *cr = &b->rows[R_CTX_RAW];
		const struct row *cv = &b->rows[R_CTX_VIEW];

		known = cr->ran && cv->ran && cr->tput > 0;
		v = known ? cv->tput / cr->tput : 0;
		snprintf(m, sizeof(m), "%.2fx (%.0f vs %.0f/s)", v, cv->tput,
			 cr->tput);
		misses += verdict("CONTEXT view (window+masking+summary) "
				  "@10000 >= 0.7x RAW last-20", known,
				  v >= 0.7, m);
	}
	if (bench_phase_on(o, "compaction")) {
		const struct row *cb = &b->rows[R_CMP_BASE];
		const struct row *ca = &b->rows[R_CMP_APPEND];

		known = cb->ran && ca->ran && cb->p99 > 0 && b->stub_calls > 0;
		v = known ? ca->p99 / cb->p99 : 0;
		snprintf(m, sizeof(m), "%.2fx (%.0f vs %.0f us)", v, ca->p99,
			 cb->p99);
		misses += verdict("Append p99 during compaction (2 s stub) <= "
				  "1.1x without", known, v <= 1.1, m);
	}

	if (bench_phase_on(o, "search")) {
		const struct row *sg = &b->rows[R_SEARCH_GET];
		const struct row *ss = &b->rows[R_SEARCH];

		/* No target: the figures for README, as ratios. */
		if (sg->ran && ss->ran && sg->tput > 0 && sg->p50 > 0)
			printf("  info  lexical Search @100000 vs GetMessages "
			       "last-20: throughput %.2fx (%.0f vs %.0f/s), "
			       "p50 %.2fx (%.0f vs %.0f us), p99 %.2fx (%.0f vs "
			       "%.0f us)\n", ss->tput / sg->tput, ss->tput,
			       sg->tput, ss->p50 / sg->p50, ss->p50, sg->p50,
			       sg->p99 > 0 ? ss->p99 / sg->p99 : 0, ss->p99,
			       sg->p99);
	}

	known = b->mem.ran && b->mem.packed > 0;
	v = 1.5 * (double)b->mem.packed + 128;
	snprintf(m, sizeof(m), "%.0f B (limit %.0f B)", b->mem.per_message, v);
	misses += verdict("RSS per stored message <= 1.5x packed + 128 B",
			  known, b->mem.per_message <= v, m);
	return misses;
}

/* ---------------------------------------------------------------------
 * main */

/*
 * The compaction phase's provider: a stub on loopback in this process, and
 * the server flags that point histd's Anthropic summarizer at it (added
 * to the --histd-arg list). The key only has to exist.
 */
static int start_provider_stub(struct bench *b)
{
	static const char *flags[] = {
		"--anthropic-base-url", NULL, "--anthropic-model", "bench-stub",
		"--compaction-workers", BENCH_COMPACTION_WORKERS,
	};
	size_t n = sizeof(flags) / sizeof(flags[0]);
	const char **a;

	if (!(b->stub = stub_start())) {
		fprintf(stderr, "histd-bench: cannot start the provider stub\n");
		return -1;
	}
	flags[1] = stub_url(b->stub);
	a = realloc(b->o.histd_args, (b->o.n_histd_args + n) * sizeof(*a));
	if (!a)
		return -1;
	memcpy(a + b->o.n_histd_args, flags, sizeof(flags));
	b->o.histd_args = a;
	b->o.n_histd_args += n;
	if (!getenv("ANTHROPIC_API_KEY"))
		setenv("ANTHROPIC_API_KEY", "histd-bench-stub", 1);
	return 0;
}

static int connect_and_wait(struct bench *b)
{
	const char *addr = b->o.target ? b->o.target : b->srv.addr;

	if (bench_client_new(&b->c, addr, b->o.client_threads,
			     b->o.connections) != 0)
		return -1;
	return bench_wait_serving(b, 10.0);
}

int main(int argc, char **argv)
{
	struct bench b;
	int misses = 0, rc;

	memset(&b, 0, sizeof(b));
	if (parse_options(&b.o, argc, argv) != 0)
		return 64;
	snprintf(b.tag, sizeof(b.tag), "bench-%ld", (long)getpid());
	b.text = make_text(b.o.message_size);
	if (!b.text)
		return 1;
	/* A line at a time even into a pipe (make, ctest). */
	setvbuf(stdout, NULL, _IOLBF, 0);

	if (b.o.histd && bench_phase_on(&b.o, "compaction") &&
	    start_provider_stub(&b) != 0)
		return 1;
	if (b.o.histd) {
		if (bench_server_start(&b.srv, b.o.histd, b.o.driver,
				       b.o.server_threads, b.o.histd_args,
				       b.o.n_histd_args, b.o.server_log,
				       10.0) != 0)
			return 1;
		b.pid = b.srv.pid;
	} else {
		b.pid = (pid_t)b.o.server_pid;
	}

	grpc_init();
	if (connect_and_wait(&b) != 0) {
		b.failed = 1;
		goto out;
	}
	printf("histd-bench: server %s at %s (pid %ld, driver %s, --threads "
	       "%u); client %zu threads, %zu connections, %zu calls in "
	       "flight, %zu B messages\n",
	       b.o.histd ? b.o.histd : "(external)",
	       b.o.histd ? b.srv.addr : b.o.target, (long)b.pid, b.o.driver,
	       b.o.server_threads, b.o.client_threads, b.o.connections,
	       b.o.concurrency, b.o.message_size);
	if (b.o.count)
		printf("histd-bench: %" PRIu64 " calls per phase in %zu rounds, "
		       "%.1f s warm-up\n", b.o.count, b.o.rounds, b.o.warmup_s);
	else
		printf("histd-bench: %.1f s per phase in %zu rounds, %.1f s "
		       "warm-up\n", b.o.duration_s, b.o.rounds, b.o.warmup_s);

	bench_closed_phases(&b);
	if (bench_phase_on(&b.o, "subscribe") && bench_server_alive(&b))
		bench_subscribe_phase(&b);
	if (bench_phase_on(&b.o, "context") && bench_server_alive(&b))
		bench_context_phase(&b);
	if (bench_phase_on(&b.o, "compaction") && bench_server_alive(&b))
		bench_compaction_phase(&b);
	if (bench_phase_on(&b.o, "search") && bench_server_alive(&b))
		bench_search_phase(&b);
	bench_server_alive(&b);

	print_table(&b);
	misses = print_summary(&b);
	printf("\n%s\n", b.failed ? "histd-bench: INCOMPLETE: some calls "
	       "failed or a phase could not run (see notes above)" :
	       "histd-bench: completed");
out:
	bench_client_free(b.c);
	grpc_shutdown();
	if (b.srv.pid) {
		int st = bench_server_stop(&b.srv, 15.0);

		if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			fprintf(stderr, "histd-bench: the server did not exit "
				"cleanly on SIGTERM (wait status %d)\n", st);
			b.failed = 1;
		}
	}
	if (b.failed && b.srv.log_path[0] && b.srv.keep_log)
		fprintf(stderr, "histd-bench: server log kept at %s\n",
			b.srv.log_path);
	if (b.stub)
		stub_stop(b.stub);
	free(b.text);
	free(b.o.histd_args);
	rc = b.failed ? 1 : (b.o.strict && misses ? 2 : 0);
	return rc;
}
