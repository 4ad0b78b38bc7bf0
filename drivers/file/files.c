/*
 * The file driver's small file helpers (see internal.h): names, whole
 * writes, directory syncs, log creation, and its log lines.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

void
hf_log_name(char *buf, size_t size, uint64_t gen)
{
	snprintf(buf, size, "log-%016" PRIx64 ".hsd", gen);
}

void
hf_snapshot_name(char *buf, size_t size, uint64_t gen)
{
	snprintf(buf, size, "snapshot-%016" PRIx64 ".hsd", gen);
}

int
hf_write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = write(fd, b, n);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

int
hf_pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const uint8_t *b = p;

	while (n) {
		ssize_t w = pwrite(fd, b, n, (off_t)off);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		b += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

int
hf_sync_dir(hf_driver *d)
{
	if (fsync(d->dirfd) != 0)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "cannot sync data directory %s: %s", d->dir,
				       strerror(errno));
	return 0;
}

static const char *const level_names[] = {
	[HF_LOG_DEBUG] = "debug", [HF_LOG_INFO] = "info",
	[HF_LOG_WARN] = "warn", [HF_LOG_ERROR] = "error",
};

int
hf_log_level_parse(const char *s)
{
	if (!s || !*s)
		return HF_LOG_INFO;
	for (int i = HF_LOG_DEBUG; i <= HF_LOG_ERROR; i++)
		if (strcmp(s, level_names[i]) == 0)
			return i;
	return -1;
}

void
hf_log_line(const hf_driver *d, enum hf_log_level level, const char *msg,
	    ...)
{
	char line[1024];
	size_t n;
	struct timespec ts;
	struct tm tm;
	va_list ap;

	if (level < d->log_level)
		return;
	/* histd's log format (server/log.h), which the driver cannot link:
	 * drivers depend on nothing but proto. Values here are paths and
	 * numbers, never conversation text; quotes are escaped anyway. */
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = (size_t)snprintf(line, sizeof(line),
			     "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\","
			     "\"level\":\"%s\",\"msg\":\"%s\"",
			     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
			     tm.tm_hour, tm.tm_min, tm.tm_sec,
			     ts.tv_nsec / 1000000, level_names[level], msg);
	va_start(ap, msg);
	for (;;) {
		const char *k = va_arg(ap, const char *), *v;

		if (!k)
			break;
		v = va_arg(ap, const char *);
		if (n >= sizeof(line) - 8)
			continue;
		n += (size_t)snprintf(line + n, sizeof(line) - n, ",\"%s\":\"", k);
		for (; v && *v && n < sizeof(line) - 8; v++) {
			if (*v == '"' || *v == '\\')
				line[n++] = '\\';
			line[n++] = (unsigned char)*v < 0x20 ? '?' : *v;
		}
		line[n++] = '"';
	}
	va_end(ap);
	if (n > sizeof(line) - 3)
		n = sizeof(line) - 3;
	line[n++] = '}';
	line[n++] = '\n';
	fwrite(line, 1, n, stderr);
}

/* The header frame of a file of this kind and generation. */
void
hf_put_file_header(hf_buf *b, const char *magic, uint64_t gen,
		   uint64_t prev_len)
{
	size_t m = hf_frame_begin(b, HF_T_FILE);

	hf_put_raw(b, magic, HF_MAGIC_LEN);
	hf_put_varint(b, HF_FORMAT_VERSION);
	hf_put_varint(b, gen);
	if (prev_len)
		hf_put_varint(b, prev_len);
	hf_frame_end(b, m);
}

int
hf_log_create(hf_driver *d, uint64_t gen, uint64_t prev_len)
{
	char name[64];
	hf_buf b = { 0 };
	int fd, rc;

	hf_log_name(name, sizeof(name), gen);
	fd = openat(d->dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return histd_error_set(HISTD_EUNAVAILABLE, "cannot create %s/%s: %s",
				       d->dir, name, strerror(errno));
	hf_put_file_header(&b, HF_MAGIC_LOG, gen, prev_len);
	if (b.oom) {
		close(fd);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	rc = hf_write_all(fd, b.p, b.len);
	hf_buf_free(&b);
	if (rc == 0 && fdatasync(fd) != 0)
		rc = -errno;
	if (rc) {
		close(fd);
		return histd_error_set(HISTD_EUNAVAILABLE, "cannot write %s/%s: %s",
				       d->dir, name, strerror(-rc));
	}
	/* The new name must survive a crash before any record in it is
	 * acknowledged. */
	if ((rc = hf_sync_dir(d))) {
		close(fd);
		return rc;
	}
	return fd;
}

