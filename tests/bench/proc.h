/*
 * The histd process under test: starting and stopping it, and reading its
 * CPU time and resident memory from /proc.
 */
#ifndef HISTD_BENCH_PROC_H
#define HISTD_BENCH_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct bench_server {
	pid_t pid;                /* 0: not started by us */
	char addr[64];            /* "127.0.0.1:PORT" once started */
	char port_file[96];
	char log_path[256];
	int keep_log;             /* leave the log file behind */
} bench_server;

/*
 * Starts `histd --listen 127.0.0.1:0 --port-file F --driver DRIVER
 * --threads N [extra...]` with its stdout and stderr going to log_path
 * (a temporary file when log_path is NULL), and waits up to timeout_s for
 * the port file. The child gets SIGTERM if the bench dies. Returns 0 with
 * s->pid and s->addr set, or -1 with a line on stderr (the child, if any,
 * is killed and reaped).
 */
int bench_server_start(bench_server *s, const char *histd, const char *driver,
		       unsigned threads, const char *const *extra,
		       size_t n_extra, const char *log_path, double timeout_s);

/* 1 while the child runs; 0 once it has exited (then *status, if not NULL,
 * is its wait status). */
int bench_server_running(bench_server *s, int *status);

/* SIGTERM, then waits up to grace_s for it to exit, then SIGKILL. Returns
 * the wait status (-1 if there was no child); removes the port file and,
 * unless s->keep_log, the log file. */
int bench_server_stop(bench_server *s, double grace_s);

/* Prints the last lines of the server's log to stderr (after a failure). */
void bench_server_log_tail(const bench_server *s, size_t lines);

/* utime + stime of pid in microseconds (/proc/PID/stat; clock tick
 * resolution, usually 10 ms). 0 or -1. */
int bench_proc_cpu_us(pid_t pid, uint64_t *out);

/* VmRSS of pid in bytes (/proc/PID/status). 0 or -1. */
int bench_proc_rss_bytes(pid_t pid, uint64_t *out);

/* CPU time every CPU of the host spent busy (user, nice, system, steal
 * in /proc/stat; not irq and softirq), in microseconds. 0 or -1. */
int bench_host_busy_us(uint64_t *out);

/* This process's user + system CPU in microseconds. */
uint64_t bench_self_cpu_us(void);

#endif
