/*
 * libFuzzer target: the file driver's recovery (drivers/file/load.c).
 *
 * Input (fixture.h): a flags byte, then the bytes of one or two files of a
 * data directory: a log, a snapshot and its log, or two logs. The target
 * writes them into an empty directory under the generation the flags name
 * and opens the driver there. Whatever the bytes, the open must either
 * refuse with ECORRUPT or succeed; it must never crash, hang or leak.
 *
 * When it opens, the recovered state must also be usable and stable:
 *   - every session of tenant "t" reads (all messages, the last two, its
 *     summary, a tool result) without an error other than NOTFOUND;
 *   - appends (with FZ_PLAIN_APPEND, one naming no tool call too), an
 *     update and a fork on it either succeed or are refused with a code
 *     a caller can act on;
 *   - with flags & FZ_COMPACT, a compaction writes a snapshot of it;
 *   - once closed, the directory opens again, and holds exactly what the
 *     driver showed before the close: recovery of what recovery accepted
 *     (and then wrote) never fails and never differs.
 * A failed check abort()s, which libFuzzer reports as a crash. With
 * FUZZ_VERBOSE set in the environment, each run prints how the open went.
 *
 * The directory lives under $FUZZ_TMPDIR, else /dev/shm, else /tmp, and is
 * removed at exit (after a crash: by the next run).
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "driver.h"
#include "file/file.h"
#include "fixture.h"

#define TENANT "t"
#define MAX_SESSIONS 64

static char base_dir[256];
static char data_dir[300];

static void __attribute__((noreturn))
fail(const char *what, int rc)
{
	fprintf(stderr, "fuzz_file_recovery: %s (rc %d %s: %s)\n", what, rc,
		histd_error_name(rc), histd_error_message());
	abort();
}

/* Removes every file of the data directory (it holds no subdirectory). */
static void
empty_dir(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;
	char name[600];

	if (!dir)
		return;
	while ((e = readdir(dir))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(name, sizeof(name), "%s/%s", path, e->d_name);
		unlink(name);
	}
	closedir(dir);
}

static void
remove_base(const char *base)
{
	char data[600];

	snprintf(data, sizeof(data), "%s/data", base);
	empty_dir(data);
	rmdir(data);
	rmdir(base);
}

static void
cleanup(void)
{
	remove_base(base_dir);
}

/* A crash (abort) skips atexit: removes what dead fuzz processes left in
 * tmp. Names are histd-fuzz-<pid>-XXXXXX. */
static void
sweep(const char *tmp)
{
	DIR *dir = opendir(tmp);
	struct dirent *e;
	char path[600];

	if (!dir)
		return;
	while ((e = readdir(dir))) {
		long pid;
		char *end;

		if (strncmp(e->d_name, "histd-fuzz-", 11) != 0)
			continue;
		pid = strtol(e->d_name + 11, &end, 10);
		if (end == e->d_name + 11 || *end != '-' || pid <= 0 ||
		    kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		snprintf(path, sizeof(path), "%s/%s", tmp, e->d_name);
		remove_base(path);
	}
	closedir(dir);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const char *tmp = getenv("FUZZ_TMPDIR");
	struct stat st;

	(void)argc;
	(void)argv;
	if (!tmp || !*tmp)
		tmp = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) &&
		      access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	sweep(tmp);
	snprintf(base_dir, sizeof(base_dir), "%s/histd-fuzz-%ld-XXXXXX", tmp,
		 (long)getpid());
	if (!mkdtemp(base_dir)) {
		perror("fuzz_file_recovery: mkdtemp");
		abort();
	}
	snprintf(data_dir, sizeof(data_dir), "%s/data", base_dir);
	atexit(cleanup);
	return 0;
}

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* Rewrites the checksum of every frame whose length fits, in place. */
static void
fix_crcs(uint8_t *p, size_t n)
{
	size_t off = 0;

	while (n - off >= 8) {
		uint32_t len = le32(p + off);
		uLong c;

		if (len > n - off - 8)
			break;
		c = crc32(0L, Z_NULL, 0);
		c = crc32(c, p + off, 4);
		c = crc32(c, p + off + 8, len);
		p[off + 4] = (uint8_t)c;
		p[off + 5] = (uint8_t)(c >> 8);
		p[off + 6] = (uint8_t)(c >> 16);
		p[off + 7] = (uint8_t)(c >> 24);
		off += 8 + (size_t)len;
	}
}

static void
write_file(const char *kind, uint64_t gen, const uint8_t *p, size_t n,
	   int fix)
{
	char path[400];
	uint8_t *copy = malloc(n ? n : 1);
	FILE *f;

	if (!copy)
		abort();
	memcpy(copy, p, n);
	if (fix)
		fix_crcs(copy, n);
	snprintf(path, sizeof(path), "%s/%s-%016llx.hsd", data_dir, kind,
		 (unsigned long long)gen);
	if (!(f = fopen(path, "wb")) || fwrite(copy, 1, n, f) != n ||
	    fclose(f) != 0) {
		perror("fuzz_file_recovery: write");
		abort();
	}
	free(copy);
}

/* A valid empty log of generation gen: its header frame alone. */
static void
write_empty_log(uint64_t gen)
{
	uint8_t f[32] = { 0 };
	size_t n = 8;

	f[n++] = 1;     /* the file header record */
	memcpy(f + n, "histdlog", 8);
	n += 8;
	f[n++] = 1;     /* format version */
	f[n++] = (uint8_t)gen;   /* gen < 128: one varint byte */
	f[0] = (uint8_t)(n - 8);
	write_file("log", gen, f, n, 1);
}

/* Lays the input out as fixture.h says. */
static void
write_input(const uint8_t *data, size_t size)
{
	uint8_t flags = data[0];
	int layout = flags & 3, fix = (flags & FZ_FIX_CRC) != 0;
	uint64_t gen = ((flags >> 3) & 7) + 1;
	const uint8_t *p = data + 1;
	size_t n = size - 1, first = n;

	if (layout == FZ_LAYOUT_SNAP_LOG || layout == FZ_LAYOUT_TWO_LOGS) {
		if (n >= 4) {
			first = le32(p);
			p += 4;
			n -= 4;
		} else {
			first = n = 0;
		}
		if (first > n)
			first = n;
	}
	switch (layout) {
	case FZ_LAYOUT_LOG:
		write_file("log", gen, p, n, fix);
		break;
	case FZ_LAYOUT_SNAPSHOT:
		write_file("snapshot", gen, p, n, fix);
		write_empty_log(gen);
		break;
	case FZ_LAYOUT_SNAP_LOG:
		write_file("snapshot", gen, p, first, fix);
		write_file("log", gen, p + first, n - first, fix);
		break;
	default:
		write_file("log", gen, p, first, fix);
		write_file("log", gen + 1, p + first, n - first, fix);
		break;
	}
}

/* What the driver shows of tenant "t": every session record, its
 * messages and its summary, folded into one hash. */
typedef struct view {
	uint64_t h;
	size_t sessions;
} view;

static void
mix(view *v, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		v->h = (v->h ^ b[i]) * 0x100000001b3ull;
	v->h = (v->h ^ n) * 0x100000001b3ull;
}

static void
mix_u64(view *v, uint64_t x)
{
	mix(v, &x, sizeof(x));
}

static void
mix_kv(view *v, const histd_kv *kv, size_t n)
{
	mix_u64(v, n);
	for (size_t i = 0; i < n; i++) {
		mix(v, kv[i].key, strlen(kv[i].key));
		mix(v, kv[i].value, strlen(kv[i].value));
	}
}

static void
mix_session(view *v, const histd_session *s)
{
	mix(v, s->id, strlen(s->id));
	mix_kv(v, s->context_keys, s->n_context_keys);
	mix_kv(v, s->labels, s->n_labels);
	mix(v, s->config ? s->config : (const uint8_t *)"", s->config_len);
	mix_u64(v, (uint64_t)s->created_at_us);
	mix_u64(v, (uint64_t)s->updated_at_us);
	mix_u64(v, s->revision);
	mix_u64(v, s->last_seq);
	mix_u64(v, s->cleared_to_seq);
	mix_u64(v, s->message_count);
	mix_u64(v, s->token_total);
	mix_u64(v, s->bytes_total);
	mix_u64(v, s->first_seq);
	mix_u64(v, s->summary_count);
}

static void
mix_record(view *v, const histd_record *r)
{
	mix_u64(v, r->seq);
	mix_u64(v, r->token_estimate);
	mix(v, r->data, r->len);
}

/* Only NOTFOUND may answer a read of a listed session. */
static int
read_ok(const char *what, int rc)
{
	if (rc && rc != HISTD_ENOTFOUND)
		fail(what, rc);
	return rc == 0;
}

static view
look(histd_driver *d, int probe)
{
	histd_list q = { .tenant = TENANT, .limit = MAX_SESSIONS };
	histd_session_list l = { 0 };
	view v = { 0xcbf29ce484222325ull, 0 };
	int rc = histd_driver_session_list(d, &q, &l);

	if (rc)
		fail("listing sessions failed", rc);
	for (size_t i = 0; i < l.n; i++) {
		const histd_session *s = l.v[i];
		histd_read all = { .tenant = TENANT, .session_id = s->id,
				   .want_session = 1 };
		histd_read last = { .tenant = TENANT, .session_id = s->id,
				    .last_n = 2 };
		histd_read_result res = { 0 };
		histd_record *rec = NULL;

		mix_session(&v, s);
		v.sessions++;
		if (read_ok("reading a session failed",
			    histd_driver_read(d, &all, &res))) {
			if (res.records.n != s->message_count)
				fail("a read disagrees with the session's count", 0);
			for (size_t j = 0; j < res.records.n; j++)
				mix_record(&v, &res.records.v[j]);
		}
		histd_read_result_clear(&res);
		if (read_ok("summary_get failed",
			    histd_driver_summary_get(d, TENANT, s->id, &rec)) &&
		    rec)
			mix_record(&v, rec);
		histd_record_free(rec);
		if (!probe)
			continue;
		if (read_ok("reading the last messages failed",
			    histd_driver_read(d, &last, &res)) &&
		    res.records.n > 2)
			fail("last_n 2 returned more", 0);
		histd_read_result_clear(&res);
		rec = NULL;
		read_ok("tool_result failed",
			histd_driver_tool_result(d, TENANT, s->id, "call_1", &rec));
		histd_record_free(rec);
	}
	histd_session_list_free(&l);
	return v;
}

/* Codes a write on a recovered session may answer: the checks of a live
 * call (the data may make them fail), never a fault. */
static void
write_ok(const char *what, int rc)
{
	switch (rc) {
	case 0:
	case HISTD_ENOTFOUND:
	case HISTD_EEXISTS:
	case HISTD_ECONFLICT:
	case HISTD_EINVALID:
	case HISTD_EPRECONDITION:
	case HISTD_ELIMIT:
		return;
	default:
		fail(what, rc);
	}
}

/* A few writes on the first session of tenant "t", if any. plain: also
 * a batch that names no tool call. */
static void
poke(histd_driver *d, int plain)
{
	static const uint8_t msg[] = { 0x10, 0x02, 0x1a, 0x04, 0x0a, 0x02,
				       0x68, 0x69 };   /* user "hi" */
	histd_list q = { .tenant = TENANT, .limit = 1 };
	histd_session_list l = { 0 };
	histd_tool_ref call = { "fuzz_call", 0 }, answer = { "call_open", 0 };
	histd_msg_in in[2] = {
		{ msg, sizeof(msg), 3, &call, 1, NULL, 0 },
		{ msg, sizeof(msg), 2, NULL, 0, &answer, 1 },
	};
	uint8_t hash[HISTD_HASH_LEN] = { 7 };
	histd_append a = { .tenant = TENANT, .idempotency_key = "fuzz-key",
			   .request_hash = hash, .now_us = 1700000000000000,
			   .idem_expires_us = 1700000000000000 + 1000000,
			   .msgs = in, .n_msgs = 2 };
	histd_append_result res = { 0 };
	histd_kv label = { "fuzz", "yes" };
	histd_session fork = { .tenant = TENANT, .id = "fuzz-fork",
			       .created_at_us = 1700000000000001 };
	histd_session *out = NULL;
	int rc = histd_driver_session_list(d, &q, &l);

	if (rc)
		fail("listing sessions failed", rc);
	if (l.n) {
		a.session_id = l.v[0]->id;
		write_ok("append failed", histd_driver_append(d, &a, &res));
		if (plain) {
			a.msgs = in;
			a.n_msgs = 1;
			a.idempotency_key = NULL;
			in[0].calls = NULL;
			in[0].n_calls = 0;
			write_ok("append failed", histd_driver_append(d, &a, &res));
		}
		write_ok("update failed",
			 histd_driver_session_update(d, TENANT, a.session_id, 0,
						     &label, 1, NULL, 0,
						     1700000000000002, &out,
						     NULL));
		histd_session_free(out);
		out = NULL;
		write_ok("fork failed",
			 histd_driver_session_fork(d, TENANT, a.session_id, 0,
						   &fork, &out));
		histd_session_free(out);
	}
	histd_session_list_free(&l);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	histd_driver_config cfg = { .data_dir = data_dir, .fsync_mode = "never" };
	histd_driver *d = NULL;
	view before, after;
	int rc;

	if (size < 1)
		return 0;
	empty_dir(data_dir);
	if (mkdir(data_dir, 0700) != 0 && access(data_dir, W_OK) != 0)
		abort();
	write_input(data, size);
	rc = histd_driver_open("file", &cfg, &d);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "fuzz_file_recovery: open: %s %s\n",
			histd_error_name(rc), rc ? histd_error_message() : "");
	if (rc == HISTD_ECORRUPT)
		return 0;
	if (rc)
		fail("open answered neither 0 nor ECORRUPT", rc);
	look(d, 1);
	poke(d, (data[0] & FZ_PLAIN_APPEND) != 0);
	if ((data[0] & FZ_COMPACT) && (rc = histd_file_driver_compact(d)))
		fail("compaction failed", rc);
	before = look(d, 0);
	histd_driver_close(d);
	if (getenv("FUZZ_VERBOSE"))
		fprintf(stderr, "fuzz_file_recovery: %zu sessions\n",
			before.sessions);
	if ((rc = histd_driver_open("file", &cfg, &d)))
		fail("what was recovered and written does not open again", rc);
	after = look(d, 0);
	histd_driver_close(d);
	if (before.h != after.h || before.sessions != after.sessions)
		fail("the state differs after a close and an open", 0);
	return 0;
}
