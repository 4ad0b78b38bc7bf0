/*
 * Starting histd for the bench and reading /proc. See proc.h.
 */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void sleep_ms(long ms)
{
	struct timespec ts = { .tv_sec = ms / 1000,
			       .tv_nsec = (ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The port in a port file: "PORT" or "HOST:PORT", with optional trailing
 * whitespace. 0 if the file is absent, empty or not (yet) complete. */
static unsigned read_port(const char *path)
{
	char buf[128];
	FILE *f = fopen(path, "r");
	size_t n;
	char *p, *end;
	unsigned long port;

	if (!f)
		return 0;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' ||
			 buf[n - 1] == '\r' || buf[n - 1] == '\t'))
		buf[--n] = '\0';
	if (n == 0)
		return 0;
	p = strrchr(buf, ':');
	p = p ? p + 1 : buf;
	errno = 0;
	port = strtoul(p, &end, 10);
	if (errno || end == p || *end != '\0' || port == 0 || port > 65535)
		return 0;
	return (unsigned)port;
}

int bench_server_start(bench_server *s, const char *histd, const char *driver,
		       unsigned threads, const char *const *extra,
		       size_t n_extra, const char *log_path, double timeout_s)
{
	char threads_s[16];
	const char **argv;
	size_t argc = 0;
	int logfd;
	pid_t pid;
	double until;
	unsigned port = 0;

	memset(s, 0, sizeof(*s));
	snprintf(s->port_file, sizeof(s->port_file),
		 "/tmp/histd-bench-%ld.port", (long)getpid());
	unlink(s->port_file);
	if (log_path) {
		snprintf(s->log_path, sizeof(s->log_path), "%s", log_path);
		s->keep_log = 1;
	} else {
		snprintf(s->log_path, sizeof(s->log_path),
			 "/tmp/histd-bench-%ld.log", (long)getpid());
	}
	logfd = open(s->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
		     0644);
	if (logfd < 0) {
		fprintf(stderr, "histd-bench: cannot create %s: %s\n",
			s->log_path, strerror(errno));
		return -1;
	}

	argv = calloc(12 + n_extra, sizeof(*argv));
	if (!argv) {
		close(logfd);
		return -1;
	}
	snprintf(threads_s, sizeof(threads_s), "%u", threads);
	argv[argc++] = histd;
	argv[argc++] = "--listen";
	argv[argc++] = "127.0.0.1:0";
	argv[argc++] = "--port-file";
	argv[argc++] = s->port_file;
	argv[argc++] = "--driver";
	argv[argc++] = driver;
	argv[argc++] = "--threads";
	argv[argc++] = threads_s;
	argv[argc++] = "--auth-disabled";
	for (size_t i = 0; i < n_extra; i++)
		argv[argc++] = extra[i];
	argv[argc] = NULL;

	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "histd-bench: fork: %s\n", strerror(errno));
		free(argv);
		close(logfd);
		return -1;
	}
	if (pid == 0) {
		/* The server must not outlive a bench that crashed. */
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		dup2(logfd, STDOUT_FILENO);
		dup2(logfd, STDERR_FILENO);
		execv(histd, (char *const *)argv);
		fprintf(stderr, "histd-bench: cannot run %s: %s\n", histd,
			strerror(errno));
		_exit(127);
	}
	free(argv);
	close(logfd);
	s->pid = pid;

	until = mono_s() + timeout_s;
	while (mono_s() < until) {
		int status = -1;

		if (!bench_server_running(s, &status)) {
			fprintf(stderr, "histd-bench: %s exited at start "
				"(wait status %d); its log:\n", histd, status);
			bench_server_log_tail(s, 20);
			return -1;
		}
		port = read_port(s->port_file);
		if (port) {
			/* Read it twice: a half-written file could parse. */
			sleep_ms(20);
			if (read_port(s->port_file) == port)
				break;
			port = 0;
		}
		sleep_ms(20);
	}
	if (!port) {
		fprintf(stderr, "histd-bench: %s wrote no port to %s within "
			"%.0f s\n", histd, s->port_file, timeout_s);
		bench_server_log_tail(s, 20);
		bench_server_stop(s, 2.0);
		return -1;
	}
	snprintf(s->addr, sizeof(s->addr), "127.0.0.1:%u", port);
	return 0;
}

int bench_server_running(bench_server *s, int *status)
{
	int st;
	pid_t r;

	if (s->pid <= 0)
		return 0;
	r = waitpid(s->pid, &st, WNOHANG);
	if (r == 0)
		return 1;
	if (status)
		*status = (r == s->pid) ? st : -1;
	s->pid = 0;
	return 0;
}

int bench_server_stop(bench_server *s, double grace_s)
{
	int status = -1;

	if (s->pid > 0) {
		double until = mono_s() + grace_s;
		pid_t pid = s->pid;

		kill(pid, SIGTERM);
		while (mono_s() < until) {
			if (waitpid(pid, &status, WNOHANG) == pid)
				break;
			sleep_ms(10);
		}
		if (mono_s() >= until) {
			fprintf(stderr, "histd-bench: the server did not exit "
				"within %.0f s of SIGTERM; killing it\n",
				grace_s);
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
		}
		s->pid = 0;
	}
	if (s->port_file[0])
		unlink(s->port_file);
	if (s->log_path[0] && !s->keep_log)
		unlink(s->log_path);
	return status;
}

void bench_server_log_tail(const bench_server *s, size_t lines)
{
	FILE *f = fopen(s->log_path, "r");
	char **ring;
	char buf[512];
	size_t n = 0;

	if (!f)
		return;
	ring = calloc(lines, sizeof(*ring));
	if (!ring) {
		fclose(f);
		return;
	}
	while (fgets(buf, sizeof(buf), f)) {
		free(ring[n % lines]);
		ring[n % lines] = strdup(buf);
		n++;
	}
	fclose(f);
	for (size_t i = n > lines ? n - lines : 0; i < n; i++)
		if (ring[i % lines])
			fprintf(stderr, "  | %s", ring[i % lines]);
	for (size_t i = 0; i < lines; i++)
		free(ring[i]);
	free(ring);
}

int bench_proc_cpu_us(pid_t pid, uint64_t *out)
{
	char path[64], buf[1024];
	FILE *f;
	size_t n;
	char *p;
	unsigned long long utime, stime;
	long tck = sysconf(_SC_CLK_TCK);

	snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* The command name (field 2) may hold spaces and parentheses: the
	 * fields after it start behind the last ')'. utime and stime are
	 * fields 14 and 15, i.e. the 12th and 13th after field 2. */
	p = strrchr(buf, ')');
	if (!p || tck <= 0)
		return -1;
	if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
		   &utime, &stime) != 2)
		return -1;
	*out = (utime + stime) * 1000000ull / (unsigned long long)tck;
	return 0;
}

int bench_proc_rss_bytes(pid_t pid, uint64_t *out)
{
	char path[64], line[256];
	FILE *f;
	int rc = -1;

	snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long kb;

		if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) {
			*out = kb * 1024ull;
			rc = 0;
			break;
		}
	}
	fclose(f);
	return rc;
}

int bench_host_busy_us(uint64_t *out)
{
	unsigned long long v[8] = { 0 };
	long tck = sysconf(_SC_CLK_TCK);
	FILE *f = fopen("/proc/stat", "r");
	int n;

	if (!f)
		return -1;
	/* cpu user nice system idle iowait irq softirq steal ... */
	n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
		   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]);
	fclose(f);
	if (n < 7 || tck <= 0)
		return -1;
	/* irq and softirq left out: loopback TCP work done there is the
	 * bench's own, whichever process it is charged to. */
	*out = (v[0] + v[1] + v[2] + v[7]) * 1000000ull /
	       (unsigned long long)tck;
	return 0;
}

uint64_t bench_self_cpu_us(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000ull +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}
