/*
 * Structured logs: one JSON object per line on stderr, e.g.
 *   {"ts":"2026-11-21T05:30:00.123Z","level":"info","msg":"listening","address":"127.0.0.1:50051"}
 * Fields are given as key/value string pairs; values are JSON-escaped.
 * Never log conversation content or credentials.
 */
#ifndef HISTD_LOG_H
#define HISTD_LOG_H

enum histd_log_level {
	HISTD_LOG_DEBUG,
	HISTD_LOG_INFO,
	HISTD_LOG_WARN,
	HISTD_LOG_ERROR,
};

/* "debug", "info", "warn", "error": 0, or -1 for an unknown name. */
int histd_log_set_level(const char *name);
int histd_log_enabled(enum histd_log_level level);

/* Logs msg with the NULL-terminated key, value, key, value, ... strings. */
void histd_log(enum histd_log_level level, const char *msg, ...)
	__attribute__((sentinel));

#endif
