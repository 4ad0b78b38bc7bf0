#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static enum histd_log_level min_level = HISTD_LOG_INFO;

int
histd_log_set_level(const char *name)
{
	static const char *const names[] = { "debug", "info", "warn", "error" };

	for (int i = 0; i < 4; i++) {
		if (strcmp(name, names[i]) == 0) {
			min_level = (enum histd_log_level)i;
			return 0;
		}
	}
	return -1;
}

int
histd_log_enabled(enum histd_log_level level)
{
	return level >= min_level;
}

static size_t
put_json_string(char *buf, size_t cap, size_t n, const char *s)
{
	if (n < cap)
		buf[n] = '"';
	n++;
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		char esc[8];
		size_t el = 0;

		if (ch == '"' || ch == '\\') {
			esc[0] = '\\';
			esc[1] = (char)ch;
			el = 2;
		} else if (ch < 0x20) {
			el = (size_t)snprintf(esc, sizeof(esc), "\\u%04x", ch);
		} else {
			esc[0] = (char)ch;
			el = 1;
		}
		for (size_t i = 0; i < el; i++, n++)
			if (n < cap)
				buf[n] = esc[i];
	}
	if (n < cap)
		buf[n] = '"';
	return n + 1;
}

void
histd_log(enum histd_log_level level, const char *msg, ...)
{
	static const char *const names[] = { "debug", "info", "warn", "error" };
	char buf[2048];
	size_t n = 0, cap = sizeof(buf) - 2;
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (level < min_level)
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n += (size_t)snprintf(buf, cap,
			      "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\","
			      "\"level\":\"%s\",\"msg\":",
			      tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			      tm.tm_hour, tm.tm_min, tm.tm_sec,
			      ts.tv_nsec / 1000000, names[level]);
	n = put_json_string(buf, cap, n, msg);
	va_start(ap, msg);
	for (;;) {
		const char *k = va_arg(ap, const char *);
		const char *v;

		if (!k)
			break;
		v = va_arg(ap, const char *);
		if (n < cap)
			buf[n] = ',';
		n++;
		n = put_json_string(buf, cap, n, k);
		if (n < cap)
			buf[n] = ':';
		n++;
		n = put_json_string(buf, cap, n, v ? v : "");
	}
	va_end(ap);
	if (n > cap)
		n = cap;
	buf[n++] = '}';
	buf[n++] = '\n';
	fwrite(buf, 1, n, stderr);
}
