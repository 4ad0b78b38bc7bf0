/*
 * Recovery of the file driver (drivers/file/): what survives a reopen, a
 * torn or corrupted log, a compaction, and a kill in the middle of one.
 *
 * The state is compared through the driver interface only: dump() renders
 * everything a caller can observe (sessions, messages, summaries, tool
 * results, idempotent replays) into text, before and after.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "driver.h"
#include "file/file.h"
#include "file/internal.h"
#include "histd_wire.h"

#define LOG1 "log-0000000000000001.hsd"
#define LOG2 "log-0000000000000002.hsd"

/* ---------------------------------------------------------------------- */
/* Helpers                                                                 */

typedef struct text {
	char *p;
	size_t len, cap;
} text;

static void
tprintf(text *t, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(t->p ? t->p + t->len : NULL,
			      t->p ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		assert_true(n >= 0);
		if (t->p && t->len + (size_t)n < t->cap)
			break;
		t->cap = (t->cap + (size_t)n + 1) * 2;
		t->p = realloc(t->p, t->cap);
		assert_non_null(t->p);
	}
	t->len += (size_t)n;
}

static void
hexdump(text *t, const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		tprintf(t, "%02x", p[i]);
}

static char *
tmpdir_new(void)
{
	const char *base = getenv("TMPDIR");
	char *dir = malloc(256);

	assert_non_null(dir);
	snprintf(dir, 256, "%s/histd-recovery-XXXXXX", base && *base ? base : "/tmp");
	assert_non_null(mkdtemp(dir));
	return dir;
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

static void
path_in(char *buf, size_t size, const char *dir, const char *name)
{
	snprintf(buf, size, "%s/%s", dir, name);
}

static uint8_t *
read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *p;
	long n;

	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	fseek(f, 0, SEEK_SET);
	p = malloc(n ? (size_t)n : 1);
	assert_non_null(p);
	assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return p;
}

static void
write_file(const char *path, const uint8_t *p, size_t len)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static off_t
file_size(const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return st.st_size;
}

/* Each file of dir by name, with its size and CRC32: what a refused open
 * must leave as it was. */
static char *
dir_state(const char *dir)
{
	struct dirent **e;
	int n = scandir(dir, &e, NULL, alphasort);
	text t = { 0 };

	assert_true(n >= 0);
	tprintf(&t, "%s\n", dir);
	for (int i = 0; i < n; i++) {
		char path[512];
		uint8_t *p;
		size_t len;

		if (e[i]->d_name[0] != '.') {
			path_in(path, sizeof(path), dir, e[i]->d_name);
			p = read_file(path, &len);
			tprintf(&t, "%s %zu %08lx\n", e[i]->d_name, len,
				crc32(0L, p, (uInt)len));
			free(p);
		}
		free(e[i]);
	}
	free(e);
	return t.p;
}

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

/* The offset of the last frame of a whole file (the header is the
 * first): each frame is a u32le body length, a u32le CRC, the body. */
static size_t
last_frame(const uint8_t *bytes, size_t len)
{
	size_t off = 0, last = 0;

	while (off < len) {
		last = off;
		off += 8 + (size_t)le32(bytes + off);
	}
	assert_int_equal(off, len);
	return last;
}

/* Files of dir this process still maps although they were removed. */
static int
mapped_removed_files(const char *dir)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[1024];
	int n = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, dir) && strstr(line, "(deleted)");
	fclose(f);
	return n;
}

static int
dopen(const char *dir, const char *mode, histd_driver **d)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = mode };

	return histd_driver_open("file", &cfg, d);
}

/* Opens dir with these options, fsync never. */
static int
dopen_ex(const char *dir, const histd_file_options *opt, histd_driver **d)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "never" };

	return histd_file_driver_open_ex(&cfg, opt, d);
}

static histd_driver *
must_open(const char *dir)
{
	histd_driver *d = NULL;
	int rc = dopen(dir, "always", &d);

	if (rc)
		fail_msg("open %s: %s", dir, histd_error_message());
	return d;
}

static void
create(histd_driver *d, const char *tenant, const char *id,
       const histd_kv *ck, size_t n_ck, const histd_kv *labels, size_t n_l)
{
	static const uint8_t config[] = { 0x08, 0x2a };
	histd_session in = {
		.tenant = (char *)tenant, .id = (char *)id,
		.context_keys = (histd_kv *)ck, .n_context_keys = n_ck,
		.labels = (histd_kv *)labels, .n_labels = n_l,
		.config = (uint8_t *)config, .config_len = sizeof(config),
		.created_at_us = 1700000000000000LL,
	};
	histd_session *out = NULL;

	assert_int_equal(histd_driver_session_create(d, &in, &out), 0);
	histd_session_free(out);
}

/* One message: bytes that name it (the driver never parses them). */
typedef struct msg {
	char body[4096];
	const char *call, *result;
	histd_tool_ref c, r;
} msg;

static histd_msg_in
msg_in(msg *m, const char *text, const char *call, const char *result)
{
	snprintf(m->body, sizeof(m->body), "\x1a%c%s", (int)strlen(text), text);
	m->c = (histd_tool_ref){ call, 0 };
	m->r = (histd_tool_ref){ result, 0 };
	return (histd_msg_in){
		.data = (const uint8_t *)m->body, .len = strlen(m->body),
		.token_estimate = (uint32_t)strlen(text),
		.calls = call ? &m->c : NULL, .n_calls = call != NULL,
		.results = result ? &m->r : NULL, .n_results = result != NULL,
	};
}

static int
append(histd_driver *d, const char *tenant, const char *id, const char *key,
       uint8_t hash_byte, const char *text, const char *call,
       const char *result, histd_append_result *res)
{
	uint8_t hash[HISTD_HASH_LEN];
	msg m;
	histd_msg_in in = msg_in(&m, text, call, result);
	histd_append a = {
		.tenant = tenant, .session_id = id, .idempotency_key = key,
		.request_hash = hash, .now_us = 1700000000000000LL,
		.idem_expires_us = 4000000000000000LL, .msgs = &in, .n_msgs = 1,
	};
	histd_append_result r;

	memset(hash, hash_byte, sizeof(hash));
	return histd_driver_append(d, &a, res ? res : &r);
}

static void
must_append(histd_driver *d, const char *tenant, const char *id,
	    const char *text)
{
	int rc = append(d, tenant, id, NULL, 0, text, NULL, NULL, NULL);

	if (rc)
		fail_msg("append: %s", histd_error_message());
}

/* Everything observable, as text. */
static char *
dump(histd_driver *d)
{
	static const char *const tenants[] = { "t1", "t2", "crash" };
	static const char *const calls[] = { "c1", "c2", "c9" };
	text t = { 0 };

	for (size_t ti = 0; ti < 3; ti++) {
		histd_list q = { .tenant = tenants[ti], .limit = 1000 };
		histd_session_list l = { 0 };

		assert_int_equal(histd_driver_session_list(d, &q, &l), 0);
		tprintf(&t, "tenant %s: %zu sessions\n", tenants[ti], l.n);
		for (size_t i = 0; i < l.n; i++) {
			const histd_session *s = l.v[i];
			histd_read rq = { .tenant = tenants[ti], .session_id = s->id };
			histd_read_result rr = { 0 };
			histd_record *sum = NULL;
			histd_append_result ar = { 0 };
			int rc;

			tprintf(&t, "session %s rev=%llu last=%llu cleared=%llu n=%llu tok=%llu bytes=%llu first=%llu sums=%llu created=%lld updated=%lld\n",
				s->id, (unsigned long long)s->revision,
				(unsigned long long)s->last_seq,
				(unsigned long long)s->cleared_to_seq,
				(unsigned long long)s->message_count,
				(unsigned long long)s->token_total,
				(unsigned long long)s->bytes_total,
				(unsigned long long)s->first_seq,
				(unsigned long long)s->summary_count,
				(long long)s->created_at_us, (long long)s->updated_at_us);
			for (size_t k = 0; k < s->n_context_keys; k++)
				tprintf(&t, " ck %s=%s\n", s->context_keys[k].key,
					s->context_keys[k].value);
			for (size_t k = 0; k < s->n_labels; k++)
				tprintf(&t, " label %s=%s\n", s->labels[k].key,
					s->labels[k].value);
			tprintf(&t, " config ");
			hexdump(&t, s->config, s->config_len);
			tprintf(&t, "\n");
			assert_int_equal(histd_driver_read(d, &rq, &rr), 0);
			for (size_t k = 0; k < rr.records.n; k++) {
				tprintf(&t, " msg %llu tok=%u ",
					(unsigned long long)rr.records.v[k].seq,
					rr.records.v[k].token_estimate);
				hexdump(&t, rr.records.v[k].data, rr.records.v[k].len);
				tprintf(&t, "\n");
			}
			histd_read_result_clear(&rr);
			assert_int_equal(histd_driver_summary_get(d, tenants[ti], s->id,
								  &sum), 0);
			if (sum) {
				tprintf(&t, " summary %llu ", (unsigned long long)sum->seq);
				hexdump(&t, sum->data, sum->len);
				tprintf(&t, "\n");
				histd_record_free(sum);
			}
			for (size_t k = 0; k < 3; k++) {
				histd_record *r = NULL;

				rc = histd_driver_tool_result(d, tenants[ti], s->id,
							      calls[k], &r);
				tprintf(&t, " tool %s -> %s %llu\n", calls[k],
					histd_error_name(rc),
					(unsigned long long)(r ? r->seq : 0));
				histd_record_free(r);
			}
			/* An idempotent retry answers the first result (only
			 * t1/a has the key: elsewhere it would append). */
			if (strcmp(tenants[ti], "t1") || strcmp(s->id, "a"))
				continue;
			rc = append(d, tenants[ti], s->id, "k1", 1, "retry", NULL,
				    NULL, &ar);
			tprintf(&t, " retry k1 -> %s first=%llu last=%llu rev=%llu replayed=%d\n",
				histd_error_name(rc), (unsigned long long)ar.first_seq,
				(unsigned long long)ar.last_seq,
				(unsigned long long)ar.revision, ar.replayed);
			if (rc == 0 && !ar.replayed)
				fail_msg("key k1 was forgotten in %s", s->id);
		}
		histd_session_list_free(&l);
	}
	return t.p;
}

/* Sessions in every state a log record can leave them. */
static void
populate(histd_driver *d)
{
	const histd_kv ck[] = { { "user", "u1" } };
	const histd_kv labels[] = { { "env", "prod" } };
	const histd_kv labels2[] = { { "env", "test" }, { "team", "x" } };
	histd_record sum = { .seq = 2, .token_estimate = 7,
			     .data = (uint8_t *)"summary", .len = 7 };
	histd_session in = { .id = "a-fork", .created_at_us = 1700000000000001LL };
	histd_session *out = NULL;
	histd_append_result res;
	uint64_t rev, cleared;

	create(d, "t1", "a", ck, 1, labels, 1);
	assert_int_equal(append(d, "t1", "a", "k1", 1, "hello", NULL, NULL, &res), 0);
	assert_int_equal(append(d, "t1", "a", NULL, 0, "calls", "c1", NULL, NULL), 0);
	assert_int_equal(append(d, "t1", "a", NULL, 0, "answers", NULL, "c1", NULL), 0);
	assert_int_equal(append(d, "t1", "a", NULL, 0, "calls2", "c2", NULL, NULL), 0);
	assert_int_equal(histd_driver_summary_put(d, "t1", "a", 0, &sum, &rev, NULL), 0);
	assert_int_equal(histd_driver_session_update(d, "t1", "a", 0, labels2, 2,
						     NULL, 0, 1700000000000099LL,
						     &out, NULL), 0);
	histd_session_free(out);
	assert_int_equal(histd_driver_session_fork(d, "t1", "a", 3, &in, &out), 0);
	histd_session_free(out);
	assert_int_equal(append(d, "t1", "a", NULL, 0, "answers2", NULL, "c2", NULL), 0);

	create(d, "t1", "b", NULL, 0, NULL, 0);
	for (int i = 0; i < 3; i++)
		must_append(d, "t1", "b", "b-old");
	assert_int_equal(histd_driver_clear(d, "t1", "b", 0, &rev, &cleared, NULL), 0);
	must_append(d, "t1", "b", "b-new");

	create(d, "t1", "c", NULL, 0, NULL, 0);
	for (int i = 0; i < 3; i++)
		must_append(d, "t1", "c", "c-old");
	{
		msg m[2];
		histd_msg_in ms[2] = { msg_in(&m[0], "restored", "c9", NULL),
				       msg_in(&m[1], "restored2", NULL, "c9") };
		histd_append a = { .tenant = "t1", .session_id = "c", .msgs = ms,
				   .n_msgs = 2 };

		assert_int_equal(histd_driver_replace(d, &a, &res, &cleared), 0);
	}
	/* Replaced by nothing, then appended to: the empty replace must
	 * replay as an empty array. */
	create(d, "t1", "e", NULL, 0, NULL, 0);
	must_append(d, "t1", "e", "e-old");
	{
		histd_append a = { .tenant = "t1", .session_id = "e" };

		assert_int_equal(histd_driver_replace(d, &a, &res, &cleared), 0);
	}
	must_append(d, "t1", "e", "e-new");
	must_append(d, "t1", "e", "e-new2");

	/* Truncated: the oldest messages, the call they issued and the
	 * summary covering them gone; what follows kept. */
	create(d, "t1", "f", NULL, 0, NULL, 0);
	assert_int_equal(append(d, "t1", "f", NULL, 0, "f-calls", "c1", NULL, NULL), 0);
	assert_int_equal(append(d, "t1", "f", NULL, 0, "f-answers", NULL, "c1", NULL), 0);
	assert_int_equal(append(d, "t1", "f", NULL, 0, "f-calls2", "c2", NULL, NULL), 0);
	must_append(d, "t1", "f", "f-kept");
	assert_int_equal(histd_driver_summary_put(d, "t1", "f", 0, &sum, &rev, NULL), 0);
	assert_int_equal(histd_driver_truncate(d, "t1", "f", 2, 0, &rev, NULL), 0);
	assert_int_equal(append(d, "t1", "f", NULL, 0, "f-answers2", NULL, "c2", NULL), 0);

	create(d, "t1", "d", NULL, 0, NULL, 0);
	must_append(d, "t1", "d", "gone");
	assert_int_equal(histd_driver_session_delete(d, "t1", "d", 0, NULL), 0);

	create(d, "t2", "a", ck, 1, NULL, 0);
	must_append(d, "t2", "a", "other tenant");
}

/* ---------------------------------------------------------------------- */
/* Reopen and compaction                                                   */

static void
state_survives_reopen_and_compaction(void **state)
{
	char *dir = tmpdir_new(), *before, *after, *compacted;
	histd_driver *d = must_open(dir);
	histd_file_stats st;

	(void)state;
	populate(d);
	before = dump(d);
	histd_driver_close(d);

	d = must_open(dir);
	after = dump(d);
	assert_string_equal(before, after);
	assert_int_equal(histd_file_driver_compact(d), 0);
	assert_int_equal(histd_file_driver_stats(d, &st), 0);
	assert_int_equal(st.compactions, 1);
	/* Loaded messages moved to the snapshot: the old log is gone for
	 * good, not kept alive by a mapping. */
	assert_int_equal(mapped_removed_files(dir), 0);
	assert_string_equal(before, (free(after), after = dump(d)));
	must_append(d, "t1", "b", "after compaction");
	/* Twice: the snapshot's own mapping is let go of too. */
	assert_int_equal(histd_file_driver_compact(d), 0);
	assert_int_equal(mapped_removed_files(dir), 0);
	compacted = dump(d);
	histd_driver_close(d);

	/* Snapshot plus the new log's tail. */
	d = must_open(dir);
	free(after);
	after = dump(d);
	assert_string_equal(compacted, after);
	histd_driver_close(d);

	free(before);
	free(after);
	free(compacted);
	rm_rf(dir);
	free(dir);
}

/* A system message (role 1), then the text. */
static void
must_append_system(histd_driver *d, const char *tenant, const char *id,
		   const char *text)
{
	uint8_t hash[HISTD_HASH_LEN] = { 0 };
	msg m;
	histd_msg_in in = msg_in(&m, text, NULL, NULL);
	histd_append a = {
		.tenant = tenant, .session_id = id, .request_hash = hash,
		.now_us = 1700000000000000LL, .msgs = &in, .n_msgs = 1,
	};
	histd_append_result r;

	snprintf(m.body, sizeof(m.body), "\x10\x01\x1a%c%s",
		 (int)strlen(text), text);
	in.len = strlen(m.body);
	if (histd_driver_append(d, &a, &r))
		fail_msg("append: %s", histd_error_message());
}

static histd_driver *racing;

/* During the compaction: retention deletes the user message between the
 * two system messages, so the kept ones move to lower indexes. */
static void
truncate_during_compaction(hf_driver *d)
{
	(void)d;
	assert_int_equal(histd_driver_truncate(racing, "t1", "s", 2, 0, NULL,
					       NULL), 0);
}

/* The writer, held before its fdatasync while `held` is set. */
static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int held, waiting;
} sync_gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };

static void
hold_before_sync(void)
{
	pthread_mutex_lock(&sync_gate.mu);
	sync_gate.waiting = 1;
	pthread_cond_broadcast(&sync_gate.cv);
	while (sync_gate.held)
		pthread_cond_wait(&sync_gate.cv, &sync_gate.mu);
	sync_gate.waiting = 0;
	pthread_mutex_unlock(&sync_gate.mu);
}

/* One append of a tool call, from its own thread. */
struct bg_append {
	histd_driver *d;
	const char *text;
	pthread_t thread;
	int rc;
	atomic_int done;
};

static void *
bg_append_main(void *arg)
{
	struct bg_append *b = arg;

	b->rc = append(b->d, "t1", "s", NULL, 0, b->text, "c1", NULL, NULL);
	atomic_store(&b->done, 1);
	return NULL;
}

/* An append refused because of another append not yet durable (here, its
 * tool call id is taken) is answered only once that append is: a crash
 * before it would leave the refusal resting on nothing. */
static void
a_refusal_resting_on_a_pending_append_waits_for_its_fsync(void **state)
{
	char *dir = tmpdir_new();
	histd_driver *d = must_open(dir);
	struct bg_append first = { .d = d, .text = "first call" };
	struct bg_append second = { .d = d, .text = "second call" };

	(void)state;
	create(d, "t1", "s", NULL, 0, NULL, 0);
	sync_gate.held = 1;
	hf_wal_sync_test_hook = hold_before_sync;
	assert_int_equal(pthread_create(&first.thread, NULL, bg_append_main,
					&first), 0);
	pthread_mutex_lock(&sync_gate.mu);
	while (!sync_gate.waiting)
		pthread_cond_wait(&sync_gate.cv, &sync_gate.mu);
	pthread_mutex_unlock(&sync_gate.mu);
	/* The first append is applied and written, not durable. */
	assert_int_equal(pthread_create(&second.thread, NULL, bg_append_main,
					&second), 0);
	usleep(300 * 1000);
	assert_int_equal(atomic_load(&second.done), 0);
	assert_int_equal(atomic_load(&first.done), 0);

	pthread_mutex_lock(&sync_gate.mu);
	sync_gate.held = 0;
	pthread_cond_broadcast(&sync_gate.cv);
	pthread_mutex_unlock(&sync_gate.mu);
	pthread_join(first.thread, NULL);
	pthread_join(second.thread, NULL);
	assert_int_equal(first.rc, 0);
	assert_int_equal(second.rc, HISTD_EINVALID);
	histd_driver_close(d);
	hf_wal_sync_test_hook = NULL;
	rm_rf(dir);
	free(dir);
}

/* Loaded messages that a truncate moved while the snapshot was written
 * still move to the snapshot: the old log is let go of, not kept mapped
 * (and on disk) by the messages after the first one that moved. */
static void
compaction_repoints_messages_a_truncate_moved(void **state)
{
	static const uint64_t kept[] = { 1, 3, 4, 5 };
	char *dir = tmpdir_new(), *before, *after;
	histd_driver *d = must_open(dir);
	histd_read q = { .tenant = "t1", .session_id = "s" };
	histd_read_result res = { 0 };

	(void)state;
	create(d, "t1", "s", NULL, 0, NULL, 0);
	must_append_system(d, "t1", "s", "first system");
	must_append(d, "t1", "s", "a user message");
	must_append_system(d, "t1", "s", "second system");
	must_append(d, "t1", "s", "later 1");
	must_append(d, "t1", "s", "later 2");
	histd_driver_close(d);

	d = racing = must_open(dir);
	hf_compact_test_hook = truncate_during_compaction;
	assert_int_equal(histd_file_driver_compact(d), 0);
	hf_compact_test_hook = NULL;
	assert_int_equal(histd_driver_read(d, &q, &res), 0);
	assert_int_equal(res.records.n, 4);
	for (size_t i = 0; i < 4; i++)
		assert_int_equal(res.records.v[i].seq, kept[i]);
	histd_read_result_clear(&res);
	before = dump(d);
	assert_int_equal(mapped_removed_files(dir), 0);
	histd_driver_close(d);

	d = must_open(dir);
	after = dump(d);
	assert_string_equal(before, after);
	histd_driver_close(d);
	free(before);
	free(after);
	rm_rf(dir);
	free(dir);
}

static void
compaction_reclaims_what_clear_and_delete_left(void **state)
{
	char *dir = tmpdir_new(), *before, *after, path[512];
	histd_file_options opt;
	histd_driver *d = NULL;
	histd_file_stats st;
	char big[2000];
	int64_t t0;

	(void)state;
	histd_file_options_default(&opt);
	opt.compact_min_bytes = 1 << 20;
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	/* Online: garbage crosses the ratio, the thread compacts. */
	assert_int_equal(dopen_ex(dir, &opt, &d), 0);
	create(d, "t2", "a", NULL, 0, NULL, 0);
	create(d, "t2", "keep", NULL, 0, NULL, 0);
	must_append(d, "t2", "keep", "kept");
	for (int i = 0; i < 1000; i++)
		must_append(d, "t2", "a", big);
	assert_int_equal(histd_driver_clear(d, "t2", "a", 0, NULL, NULL, NULL), 0);
	must_append(d, "t2", "a", "small");
	t0 = time(NULL);
	do {
		assert_int_equal(histd_file_driver_stats(d, &st), 0);
		if (st.compactions)
			break;
		usleep(10000);
	} while (time(NULL) - t0 < 10);
	assert_int_equal(st.compactions, 1);
	assert_true(st.file_bytes < 100000);
	before = dump(d);
	histd_driver_close(d);
	path_in(path, sizeof(path), dir, LOG1);
	assert_int_equal(access(path, F_OK), -1);       /* the old log is gone */

	/* At open: lots of garbage, written with compaction out of reach. */
	opt.compact_min_bytes = UINT64_MAX;
	assert_int_equal(dopen_ex(dir, &opt, &d), 0);
	for (int i = 0; i < 1000; i++)
		must_append(d, "t2", "a", big);
	assert_int_equal(histd_driver_session_delete(d, "t2", "a", 0, NULL), 0);
	create(d, "t2", "a", NULL, 0, NULL, 0);
	must_append(d, "t2", "a", "small");
	free(before);
	before = dump(d);
	assert_int_equal(histd_file_driver_stats(d, &st), 0);
	assert_true(st.file_bytes > 1000 * 2000);
	histd_driver_close(d);

	opt.compact_min_bytes = 1 << 20;
	assert_int_equal(dopen_ex(dir, &opt, &d), 0);
	assert_int_equal(histd_file_driver_stats(d, &st), 0);
	assert_int_equal(st.compactions, 1);
	assert_true(st.file_bytes < 100000);
	after = dump(d);
	assert_string_equal(before, after);
	histd_driver_close(d);
	free(before);
	free(after);
	rm_rf(dir);
	free(dir);
}

/* The file size limit before a test lowered it: restored even when the
 * test fails. */
static struct rlimit fsize_was;
static int fsize_lowered;

static int
restore_fsize(void **state)
{
	(void)state;
	if (!fsize_lowered)
		return 0;
	fsize_lowered = 0;
	signal(SIGXFSZ, SIG_DFL);
	return setrlimit(RLIMIT_FSIZE, &fsize_was);
}

/*
 * Leaves dir with two logs and no snapshot: log-1 (garbage enough to
 * compact at open), then log-2, begun by a compaction at open that could
 * not write its snapshot (a full disk; here a file size limit) and so
 * failed without stopping the open. Returns the state's dump.
 */
static char *
two_logs(const char *dir, histd_file_options *opt)
{
	histd_driver *d = NULL;
	histd_file_stats st;
	struct rlimit small;
	char big[2000], *state;

	histd_file_options_default(opt);
	opt->compact_min_bytes = UINT64_MAX;
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(dopen_ex(dir, opt, &d), 0);
	create(d, "t2", "keep", NULL, 0, NULL, 0);
	for (int i = 0; i < 100; i++)
		must_append(d, "t2", "keep", big);
	create(d, "t2", "a", NULL, 0, NULL, 0);
	for (int i = 0; i < 1000; i++)
		must_append(d, "t2", "a", big);
	assert_int_equal(histd_driver_session_delete(d, "t2", "a", 0, NULL), 0);
	histd_driver_close(d);

	/* The snapshot (200 KB) cannot be written; the new log can. */
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &fsize_was), 0);
	small = fsize_was;
	small.rlim_cur = 100 << 10;
	signal(SIGXFSZ, SIG_IGN);
	fsize_lowered = 1;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
	opt->compact_min_bytes = 1 << 20;
	assert_int_equal(dopen_ex(dir, opt, &d), 0);
	assert_int_equal(histd_file_driver_stats(d, &st), 0);
	assert_int_equal(st.compactions, 0);
	must_append(d, "t2", "keep", "after the failed compaction");
	state = dump(d);
	histd_driver_close(d);
	assert_int_equal(restore_fsize(NULL), 0);
	return state;
}

/* A failed compaction at open leaves the data served from the logs as
 * they are; a later open with room compacts. */
static void
compaction_failing_at_open_still_opens(void **state)
{
	char *dir = tmpdir_new(), *before, *after;
	histd_file_options opt;
	histd_driver *d = NULL;
	histd_file_stats st;

	(void)state;
	before = two_logs(dir, &opt);
	assert_int_equal(dopen_ex(dir, &opt, &d), 0);
	assert_int_equal(histd_file_driver_stats(d, &st), 0);
	assert_int_equal(st.compactions, 1);
	after = dump(d);
	assert_string_equal(before, after);
	histd_driver_close(d);
	free(before);
	free(after);
	rm_rf(dir);
	free(dir);
}

/* Zeros where a log that is not the last had its last record: a lost
 * block, not space the writer prepared (it trims a log before the next
 * one begins). Refused, and the files are left as they were. */
static void
zeros_ending_a_log_before_the_last_are_refused(void **state)
{
	char *dir = tmpdir_new(), *st, path[512];
	histd_file_options opt;
	histd_driver *d = NULL;
	uint8_t *bytes, *again;
	size_t len, len2, last;

	(void)state;
	st = two_logs(dir, &opt);
	free(st);
	path_in(path, sizeof(path), dir, LOG1);
	bytes = read_file(path, &len);
	last = last_frame(bytes, len);
	memset(bytes + last, 0, len - last);    /* the session's delete */
	write_file(path, bytes, len);
	assert_int_equal(dopen_ex(dir, &opt, &d), HISTD_ECORRUPT);
	assert_non_null(strstr(histd_error_message(), "is zeros"));
	assert_non_null(strstr(histd_error_message(), LOG1));
	again = read_file(path, &len2);
	assert_int_equal(len2, len);
	assert_memory_equal(again, bytes, len);
	free(again);
	free(bytes);
	rm_rf(dir);
	free(dir);
}

/* A log before the last that lost its last record at a record boundary
 * (a copy or file system fault) reads as whole, but the next log's header
 * says where it ended: refused, naming both logs and both lengths, and
 * the files are left as they were. */
static void
log_before_the_last_cut_at_a_record_boundary_is_refused(void **state)
{
	char *dir = tmpdir_new(), *st, *before, *after, path[512], want[128];
	histd_file_options opt;
	histd_driver *d = NULL;
	uint8_t *bytes;
	size_t len, last;

	(void)state;
	st = two_logs(dir, &opt);
	free(st);
	path_in(path, sizeof(path), dir, LOG1);
	bytes = read_file(path, &len);
	last = last_frame(bytes, len);
	write_file(path, bytes, last);          /* the session's delete */
	before = dir_state(dir);
	assert_int_equal(dopen_ex(dir, &opt, &d), HISTD_ECORRUPT);
	assert_null(d);
	assert_non_null(strstr(histd_error_message(), LOG1));
	assert_non_null(strstr(histd_error_message(), LOG2));
	snprintf(want, sizeof(want), "ends at %zu bytes", last);
	assert_non_null(strstr(histd_error_message(), want));
	snprintf(want, sizeof(want), "says it ended at %zu: truncated", len);
	assert_non_null(strstr(histd_error_message(), want));
	after = dir_state(dir);
	assert_string_equal(after, before);
	free(before);
	free(after);
	free(bytes);
	rm_rf(dir);
	free(dir);
}

/* A log whose header does not say where the log before it ended (written
 * by a histd before it did) loads as before: that log is not checked. */
static void
log_header_without_the_previous_length_loads(void **state)
{
	char *dir = tmpdir_new(), *st, *got, path[512];
	histd_file_options opt;
	histd_driver *d = NULL;
	hf_buf b = { 0 };
	uint8_t *bytes;
	size_t len, hdr;

	(void)state;
	st = two_logs(dir, &opt);
	path_in(path, sizeof(path), dir, LOG2);
	bytes = read_file(path, &len);
	hdr = 8 + (size_t)le32(bytes);
	hf_put_file_header(&b, HF_MAGIC_LOG, 2, 0);
	assert_true(b.len < hdr);       /* log-2 recorded log-1's length */
	hf_put_raw(&b, bytes + hdr, len - hdr);
	assert_false(b.oom);
	write_file(path, b.p, b.len);
	opt.compact_min_bytes = UINT64_MAX;
	assert_int_equal(dopen_ex(dir, &opt, &d), 0);
	got = dump(d);
	assert_string_equal(got, st);
	histd_driver_close(d);
	free(got);
	free(st);
	free(bytes);
	hf_buf_free(&b);
	rm_rf(dir);
	free(dir);
}

/* ---------------------------------------------------------------------- */
/* Torn and corrupted logs                                                 */

/* A directory whose log ends with two single appends, X then Y; the sizes
 * before X, before Y and at the end, and the state dumps before X, before
 * Y and at the end. */
typedef struct fixture {
	char *dir;
	char log[512];
	uint8_t *bytes;
	size_t s0, s1, s2;
	char *d0, *d1, *d2;
} fixture;

static void
fixture_make(fixture *f)
{
	histd_driver *d;

	/* Sizes are taken closed: an open log has zeros written ahead. */
	memset(f, 0, sizeof(*f));
	f->dir = tmpdir_new();
	path_in(f->log, sizeof(f->log), f->dir, LOG1);
	d = must_open(f->dir);
	populate(d);
	f->d0 = dump(d);
	histd_driver_close(d);
	f->s0 = (size_t)file_size(f->log);
	d = must_open(f->dir);
	must_append(d, "t1", "b", "record X");
	f->d1 = dump(d);
	histd_driver_close(d);
	f->s1 = (size_t)file_size(f->log);
	d = must_open(f->dir);
	must_append(d, "t1", "b", "record Y");
	f->d2 = dump(d);
	histd_driver_close(d);
	f->bytes = read_file(f->log, &f->s2);
	assert_true(f->s0 < f->s1 && f->s1 < f->s2);
}

static void
fixture_free(fixture *f)
{
	rm_rf(f->dir);
	free(f->dir);
	free(f->bytes);
	free(f->d0);
	free(f->d1);
	free(f->d2);
}

/* Opens the log as given and checks it recovers to the state before Y,
 * cut back to where Y started, and takes new appends. */
static void
expect_recovered_without_y(fixture *f, const uint8_t *bytes, size_t len,
			   size_t at)
{
	histd_driver *d = NULL;
	char *got;
	int rc;

	write_file(f->log, bytes, len);
	rc = dopen(f->dir, "always", &d);
	if (rc)
		fail_msg("offset %zu: open: %s", at, histd_error_message());
	got = dump(d);
	if (strcmp(got, f->d1) != 0)
		fail_msg("offset %zu: state differs from the state before the last record", at);
	free(got);
	assert_int_equal((size_t)file_size(f->log), f->s1);
	must_append(d, "t1", "b", "record Y");
	histd_driver_close(d);
	d = must_open(f->dir);
	got = dump(d);
	if (strcmp(got, f->d2) != 0)
		fail_msg("offset %zu: the append after recovery did not persist", at);
	free(got);
	histd_driver_close(d);
}

/* A well-formed frame of body at p (as a message may hold one):
 * its size. */
static size_t
frame_put(uint8_t *p, const uint8_t *body, size_t n)
{
	uint32_t crc;

	p[0] = (uint8_t)n;
	p[1] = p[2] = p[3] = 0;
	crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), p, 4);
	crc = (uint32_t)crc32(crc, body, (uInt)n);
	for (int i = 0; i < 4; i++)
		p[4 + i] = (uint8_t)(crc >> (8 * i));
	memcpy(p + 8, body, n);
	return 8 + n;
}

/* A new directory holding the populated log; *before its dump, *s1 its
 * size, then one append of a message whose bytes are data[0..n): the log
 * read back, *s2 its size. */
static uint8_t *
log_with_raw_message(char **dir, char *log, size_t cap, char **before,
		     size_t *s1, const uint8_t *data, size_t n, size_t *s2)
{
	histd_msg_in in = { .data = data, .len = n, .token_estimate = 1 };
	histd_append a = { .tenant = "t1", .session_id = "b", .msgs = &in,
			   .n_msgs = 1 };
	histd_append_result res;
	histd_driver *d;

	*dir = tmpdir_new();
	path_in(log, cap, *dir, LOG1);
	d = must_open(*dir);
	populate(d);
	*before = dump(d);
	histd_driver_close(d);
	*s1 = (size_t)file_size(log);
	d = must_open(*dir);
	assert_int_equal(histd_driver_append(d, &a, &res), 0);
	histd_driver_close(d);
	return read_file(log, s2);
}

/* Opens dir with the log cut at `cut` as written: the record after s1
 * is gone, the state is `before`, the log is s1 bytes long. */
static void
expect_cut_back(const char *dir, const char *log, const char *before,
		size_t s1, size_t cut)
{
	histd_driver *d = NULL;
	char *got;

	if (dopen(dir, "always", &d))
		fail_msg("cut at %zu: open: %s", cut, histd_error_message());
	got = dump(d);
	if (strcmp(got, before) != 0)
		fail_msg("cut at %zu: state differs from the state before the record", cut);
	free(got);
	histd_driver_close(d);
	assert_int_equal((size_t)file_size(log), s1);
}

static void
torn_last_record_is_truncated_at_every_offset(void **state)
{
	fixture f;

	(void)state;
	fixture_make(&f);
	for (size_t cut = f.s1; cut < f.s2; cut++)
		expect_recovered_without_y(&f, f.bytes, cut, cut);
	fixture_free(&f);
}

/* A torn last record whose message holds a well-formed frame (a message
 * may hold any bytes) is still a torn record: the frame inside it is not
 * followed by records, only by the rest of the record's bytes. Cut
 * exactly where the inner frame ends, the file does end in a valid frame
 * after a bad one, which is what corruption looks like: refused. */
static void
torn_record_holding_a_frame_is_truncated_at_every_offset(void **state)
{
	static const uint8_t inner[] = { 0x02, 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H' };
	char *dir, log[512], *before;
	uint8_t data[160], *bytes;
	size_t n = 0, s1, s2, inner_end;
	const uint8_t *at;
	histd_driver *d;

	(void)state;
	/* Field 3 (bytes): 20 x, the frame (length, crc32, body), 100 y. */
	data[n++] = 0x1a;
	data[n++] = 20 + 8 + sizeof(inner) + 100;
	memset(data + n, 'x', 20);
	n += 20;
	n += frame_put(data + n, inner, sizeof(inner));
	memset(data + n, 'y', 100);
	n += 100;
	bytes = log_with_raw_message(&dir, log, sizeof(log), &before, &s1,
				     data, n, &s2);
	assert_true(s2 > s1 + n);

	at = memmem(bytes + s1, s2 - s1, data + 22, 8 + sizeof(inner));
	assert_non_null(at);
	inner_end = (size_t)(at - bytes) + 8 + sizeof(inner);
	for (size_t cut = s1; cut < s2; cut++) {
		write_file(log, bytes, cut);
		d = NULL;
		if (cut == inner_end) {
			assert_int_equal(dopen(dir, "always", &d), HISTD_ECORRUPT);
			continue;
		}
		expect_cut_back(dir, log, before, s1, cut);
	}
	free(bytes);
	free(before);
	rm_rf(dir);
	free(dir);
}

/* The same torn inside the zeros written ahead of the log's end (a kill
 * between the pages of the batch's write): a message of back-to-back
 * well-formed frames, cut anywhere, leaves a valid frame followed by one
 * torn in the zeros, as a record would be. Its extent still ends in the
 * zeros, so it is the torn last record, cut at every offset. */
static void
torn_record_of_frames_in_the_prepared_zeros_is_truncated(void **state)
{
	enum { INNER = 12 };
	static const uint8_t body[] = { 0x02, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h' };
	char *dir, log[512], *before;
	uint8_t data[2 + INNER * (8 + sizeof(body))], *bytes, *file;
	size_t n = 0, s1, s2, size;

	(void)state;
	/* Field 3 (bytes) holding INNER frames. */
	data[n++] = 0x1a;
	data[n++] = INNER * (8 + sizeof(body));
	for (int k = 0; k < INNER; k++)
		n += frame_put(data + n, body, sizeof(body));
	bytes = log_with_raw_message(&dir, log, sizeof(log), &before, &s1,
				     data, n, &s2);
	size = s2 + (64u << 10);
	file = malloc(size);
	assert_non_null(file);
	for (size_t cut = s1 + HF_FRAME_HEADER + 1; cut < s2; cut++) {
		memset(file, 0, size);
		memcpy(file, bytes, cut);
		if (hf_all_zero(bytes + cut, s2 - cut))
			continue;
		write_file(log, file, size);
		expect_cut_back(dir, log, before, s1, cut);
	}
	free(file);
	free(bytes);
	free(before);
	rm_rf(dir);
	free(dir);
}

static void
corrupted_last_record_is_truncated_at_every_offset(void **state)
{
	fixture f;
	uint8_t *copy;

	(void)state;
	fixture_make(&f);
	copy = malloc(f.s2);
	assert_non_null(copy);
	for (size_t at = f.s1; at < f.s2; at++) {
		memcpy(copy, f.bytes, f.s2);
		copy[at] ^= 0x5a;
		expect_recovered_without_y(&f, copy, f.s2, at);
	}
	free(copy);
	fixture_free(&f);
}

/* Opens the log made of bytes with byte `at` flipped: refused as
 * corrupt, naming the log, and the file left as it was (the operator
 * gets it so). */
static void
expect_refused_with_flip(fixture *f, const uint8_t *bytes, size_t len,
			 size_t at)
{
	uint8_t *copy = malloc(len), *after;
	histd_driver *d = NULL;
	size_t got;
	int rc;

	assert_non_null(copy);
	memcpy(copy, bytes, len);
	copy[at] ^= 0x5a;
	write_file(f->log, copy, len);
	rc = dopen(f->dir, "always", &d);
	if (rc != HISTD_ECORRUPT)
		fail_msg("offset %zu: open returned %s, not CORRUPT", at,
			 histd_error_name(rc));
	assert_null(d);
	assert_non_null(strstr(histd_error_message(), LOG1));
	after = read_file(f->log, &got);
	assert_int_equal(got, len);
	assert_memory_equal(after, copy, len);
	free(after);
	free(copy);
}

/* Whether flipping byte `at` of the length of the frame at `frame`
 * makes it end inside the zeros at the end of bytes. */
static int
flip_ends_in_zeros(const uint8_t *bytes, size_t len, size_t frame, size_t at)
{
	uint8_t h[4];
	size_t n, end;

	memcpy(h, bytes + frame, 4);
	h[at - frame] ^= 0x5a;
	n = h[0] | (size_t)h[1] << 8 | (size_t)h[2] << 16 | (size_t)h[3] << 24;
	end = frame + HF_FRAME_HEADER + n;
	return n && n <= HF_FRAME_MAX && end <= len &&
	       hf_all_zero(bytes + end, len - end);
}

/* The same flip, cut as a torn last record: the state before X. */
static void
expect_cut_with_flip(fixture *f, const uint8_t *bytes, size_t len, size_t at)
{
	uint8_t *copy = malloc(len);
	histd_driver *d = NULL;
	char *got;

	assert_non_null(copy);
	memcpy(copy, bytes, len);
	copy[at] ^= 0x5a;
	write_file(f->log, copy, len);
	if (dopen(f->dir, "always", &d))
		fail_msg("offset %zu: open: %s", at, histd_error_message());
	got = dump(d);
	if (strcmp(got, f->d0) != 0)
		fail_msg("offset %zu: state differs from the state before X", at);
	free(got);
	histd_driver_close(d);
	assert_int_equal((size_t)file_size(f->log), f->s0);
	free(copy);
}

static void
corrupted_middle_record_refuses_to_open_at_every_offset(void **state)
{
	fixture f;

	(void)state;
	fixture_make(&f);
	for (size_t at = f.s0; at < f.s1; at++)
		expect_refused_with_flip(&f, f.bytes, f.s2, at);
	fixture_free(&f);
}

/* A crash in always or batch mode tears the last record inside the zeros
 * written ahead of it: its length fits, its checksum fails, and zeros
 * follow. That tail is cut. But damage before valid records is still
 * refused when the log ends so (a bad record or file header, then valid
 * records, then such a torn one), not taken for the start of the torn
 * tail with the acknowledged records after it. */
static void
record_torn_inside_the_prepared_zeros(void **state)
{
	fixture f;
	size_t len, hdr;
	uint8_t *torn;
	int n_torn = 0;

	(void)state;
	fixture_make(&f);
	len = f.s2 + (f.s2 - f.s1) + (64u << 10);
	torn = calloc(1, len);
	assert_non_null(torn);
	/* Y keeps its header and part of its body; the rest is zeros. */
	for (size_t t = f.s1 + HF_FRAME_HEADER + 1; t < f.s2; t++) {
		memset(torn, 0, len);
		memcpy(torn, f.bytes, t);
		if (hf_all_zero(f.bytes + t, f.s2 - t))
			continue;       /* Y's bytes from t were zeros already */
		n_torn++;
		expect_recovered_without_y(&f, torn, len, t);
	}
	assert_true(n_torn > 8);

	/* X, or the header, damaged; Y whole; a record like Y after it torn
	 * in its middle. */
	memset(torn, 0, len);
	memcpy(torn, f.bytes, f.s2);
	memcpy(torn + f.s2, f.bytes + f.s1, (f.s2 - f.s1) / 2);
	hdr = HF_FRAME_HEADER + (f.bytes[0] | (size_t)f.bytes[1] << 8 |
				 (size_t)f.bytes[2] << 16 | (size_t)f.bytes[3] << 24);
	assert_true(hdr < f.s0);
	for (size_t at = 0; at < f.s1; at++) {
		if (at >= hdr && at < f.s0)     /* the file's header, and X */
			continue;
		if (at >= f.s0 && at < f.s0 + 4 &&
		    flip_ends_in_zeros(torn, len, f.s0, at)) {
			/* X's length changed to end in the zeros: that is what
			 * a torn last record looks like (README), so X and
			 * what follows are cut. */
			expect_cut_with_flip(&f, torn, len, at);
			continue;
		}
		expect_refused_with_flip(&f, torn, len, at);
	}
	free(torn);
	fixture_free(&f);
}

static void
torn_file_header_opens_empty(void **state)
{
	fixture f;
	histd_driver *d;
	char *got;
	size_t hdr = 30;        /* the header frame is shorter than this */

	(void)state;
	fixture_make(&f);
	for (size_t cut = 0; cut < 20; cut++) {
		write_file(f.log, f.bytes, cut);
		d = must_open(f.dir);
		got = dump(d);
		assert_string_equal(got, "tenant t1: 0 sessions\ntenant t2: 0 sessions\ntenant crash: 0 sessions\n");
		free(got);
		histd_driver_close(d);
		assert_true((size_t)file_size(f.log) < hdr);
	}
	fixture_free(&f);
}

static void
corrupted_snapshot_refuses_to_open(void **state)
{
	char *dir = tmpdir_new(), snap[512], path[512];
	histd_driver *d = must_open(dir);
	uint8_t *bytes, *copy;
	size_t len;

	(void)state;
	populate(d);
	assert_int_equal(histd_file_driver_compact(d), 0);
	histd_driver_close(d);
	path_in(snap, sizeof(snap), dir, "snapshot-0000000000000002.hsd");
	bytes = read_file(snap, &len);
	copy = malloc(len);
	assert_non_null(copy);
	for (size_t at = 0; at < len; at += 3) {
		memcpy(copy, bytes, len);
		copy[at] ^= 0x01;
		write_file(snap, copy, len);
		d = NULL;
		if (dopen(dir, "always", &d) != HISTD_ECORRUPT)
			fail_msg("snapshot offset %zu: not refused", at);
	}
	/* Cut short: refused too (a snapshot is renamed only once whole). */
	write_file(snap, bytes, len - 1);
	assert_int_equal(dopen(dir, "always", &d), HISTD_ECORRUPT);
	assert_non_null(strstr(histd_error_message(),
			       "cut short: the snapshot ends inside it"));
	/* A missing log generation is refused. */
	write_file(snap, bytes, len);
	path_in(path, sizeof(path), dir, LOG2);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(dopen(dir, "always", &d), HISTD_ECORRUPT);
	assert_non_null(strstr(histd_error_message(), "is missing"));
	free(bytes);
	free(copy);
	rm_rf(dir);
	free(dir);
}

/* ---------------------------------------------------------------------- */
/* The directory                                                           */

static void
second_open_of_a_data_directory_is_unavailable(void **state)
{
	char *dir = tmpdir_new(), path[512];
	histd_driver *d = must_open(dir), *d2 = NULL;
	int fd;

	(void)state;
	assert_int_equal(dopen(dir, "batch", &d2), HISTD_EUNAVAILABLE);
	assert_null(d2);
	assert_non_null(strstr(histd_error_message(),
			       "is in use by another process"));
	/* The directory itself is locked, not only the LOCK file. */
	path_in(path, sizeof(path), dir, "LOCK");
	assert_int_equal(unlink(path), 0);
	assert_int_equal(dopen(dir, "batch", &d2), HISTD_EUNAVAILABLE);
	assert_null(d2);
	assert_non_null(strstr(histd_error_message(),
			       "is in use by another process"));
	histd_driver_close(d);
	/* A histd of an earlier version locks only LOCK. */
	fd = open(path, O_RDWR | O_CREAT, 0600);
	assert_true(fd >= 0);
	assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
	assert_int_equal(dopen(dir, "batch", &d2), HISTD_EUNAVAILABLE);
	assert_null(d2);
	close(fd);
	d = must_open(dir);
	histd_driver_close(d);
	rm_rf(dir);
	free(dir);
}

static void
bad_options_are_refused(void **state)
{
	histd_driver *d = NULL;
	histd_driver_config cfg = { .data_dir = "/tmp/x", .fsync_mode = "sometimes" };

	(void)state;
	assert_int_equal(histd_driver_open("file", &cfg, &d), HISTD_EINVALID);
	cfg = (histd_driver_config){ .data_dir = "/tmp/x", .log_level = "loud" };
	assert_int_equal(histd_driver_open("file", &cfg, &d), HISTD_EINVALID);
	assert_non_null(strstr(histd_error_message(), "got 'loud'"));
	cfg = (histd_driver_config){ 0 };
	assert_int_equal(histd_driver_open("file", &cfg, &d), HISTD_EINVALID);
	assert_null(d);
}

/* Opens and closes the driver on dir at log level `level` with stderr
 * sent to a file; returns what the driver wrote there. */
static char *
driver_lines(const char *dir, const char *level)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "never",
				    .log_level = level };
	histd_driver *d = NULL;
	char path[512];
	uint8_t *p;
	size_t len;
	int fd, saved, rc;

	path_in(path, sizeof(path), dir, "stderr.txt");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	rc = histd_driver_open("file", &cfg, &d);
	if (rc == 0)
		histd_driver_close(d);
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	close(fd);
	assert_int_equal(rc, 0);
	p = read_file(path, &len);
	p = realloc(p, len + 1);
	assert_non_null(p);
	p[len] = 0;
	unlink(path);
	return (char *)p;
}

/* The driver's own lines follow histd's --log-level: "file driver
 * closed" is info, shown at info and debug, not at warn or error. */
static void
log_level_filters_driver_lines(void **state)
{
	static const struct { const char *level; int shown; } cases[] = {
		{ NULL, 1 }, { "debug", 1 }, { "info", 1 }, { "warn", 0 },
		{ "error", 0 },
	};
	char *dir = tmpdir_new();

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char *out = driver_lines(dir, cases[i].level);
		int shown = strstr(out, "\"msg\":\"file driver closed\"") != NULL;

		free(out);
		if (shown != cases[i].shown)
			fail_msg("log level %s: the info line was %s",
				 cases[i].level ? cases[i].level : "(none)",
				 shown ? "written" : "not written");
	}
	rm_rf(dir);
	free(dir);
}

static void
leftover_snapshot_tmp_is_removed(void **state)
{
	char *dir = tmpdir_new(), path[512], *before, *after;
	histd_driver *d = must_open(dir);

	(void)state;
	populate(d);
	before = dump(d);
	histd_driver_close(d);
	path_in(path, sizeof(path), dir, "snapshot-0000000000000002.hsd.tmp");
	write_file(path, (const uint8_t *)"partial", 7);
	d = must_open(dir);
	assert_int_equal(access(path, F_OK), -1);
	after = dump(d);
	assert_string_equal(before, after);
	histd_driver_close(d);
	free(before);
	free(after);
	rm_rf(dir);
	free(dir);
}

/* ---------------------------------------------------------------------- */
/* Embeddings                                                              */

/* The semantic hits of session id for q (dim 4, model "m1"), as text. */
static char *
semantic_hits(histd_driver *d, const char *id, const float *q)
{
	const char *ids[1] = { id };
	histd_search_query sq = {
		.tenant = "t1", .session_ids = ids, .n_session_ids = 1,
		.mode = HISTD_SEARCH_SEMANTIC, .vector = q, .dim = 4,
		.model = "m1", .k = 10,
	};
	histd_search_result r = { 0 };
	text t = { 0 };

	assert_int_equal(histd_driver_search(d, &sq, &r), 0);
	for (size_t i = 0; i < r.n; i++)
		tprintf(&t, "%s/%llu:%.6f;", r.hits[i].session_id,
			(unsigned long long)r.records.v[i].seq, r.hits[i].score);
	histd_search_result_clear(&r);
	tprintf(&t, "|");
	return t.p;
}

static void
embeddings_survive_reopen_and_compaction(void **state)
{
	static const float v1[4] = { 1, 0, 0, 0 }, v2[4] = { 0, 1, 0, 0 },
			   v3[4] = { 1, 1, 0, 0 }, q[4] = { 1, 0.2f, 0, 0 };
	char *dir = tmpdir_new(), *before, *fork_before, *after;
	histd_driver *d = must_open(dir);
	histd_session in = { .tenant = "t1", .id = "f" }, *out = NULL;

	(void)state;
	create(d, "t1", "e", NULL, 0, NULL, 0);
	create(d, "t1", "gone", NULL, 0, NULL, 0);
	for (int i = 0; i < 3; i++) {
		must_append(d, "t1", "e", "text");
		must_append(d, "t1", "gone", "text");
	}
	assert_int_equal(histd_driver_embedding_put(d, "t1", "e", 1, "m1", v2, 4), 0);
	assert_int_equal(histd_driver_embedding_put(d, "t1", "e", 2, "m1", v1, 4), 0);
	/* A second put replaces the first. */
	assert_int_equal(histd_driver_embedding_put(d, "t1", "e", 1, "m1", v3, 4), 0);
	assert_int_equal(histd_driver_embedding_put(d, "t1", "e", 9, "m1", v1, 4),
			 HISTD_ENOTFOUND);
	assert_int_equal(histd_driver_embedding_put(d, "t1", "gone", 1, "m1", v1, 4), 0);
	assert_int_equal(histd_driver_clear(d, "t1", "gone", 0, NULL, NULL, NULL), 0);
	/* The fork takes the vectors of the messages it copies. */
	assert_int_equal(histd_driver_session_fork(d, "t1", "e", 1, &in, &out), 0);
	histd_session_free(out);
	before = semantic_hits(d, "e", q);
	fork_before = semantic_hits(d, "f", q);
	assert_string_equal(before, "e/2:0.980581;e/1:0.832050;|");
	assert_string_equal(fork_before, "f/1:0.832050;|");
	histd_driver_close(d);

	/* From the log. */
	d = must_open(dir);
	after = semantic_hits(d, "e", q);
	assert_string_equal(before, after);
	free(after);
	after = semantic_hits(d, "f", q);
	assert_string_equal(fork_before, after);
	free(after);
	after = semantic_hits(d, "gone", q);
	assert_string_equal(after, "|");
	free(after);

	/* From a snapshot, then a snapshot and a log. */
	assert_int_equal(histd_file_driver_compact(d), 0);
	histd_driver_close(d);
	d = must_open(dir);
	after = semantic_hits(d, "e", q);
	assert_string_equal(before, after);
	free(after);
	assert_int_equal(histd_driver_embedding_put(d, "t1", "e", 3, "m1", v1, 4), 0);
	histd_driver_close(d);
	d = must_open(dir);
	after = semantic_hits(d, "e", q);
	assert_string_equal(after, "e/2:0.980581;e/3:0.980581;e/1:0.832050;|");
	free(after);
	after = semantic_hits(d, "f", q);
	assert_string_equal(fork_before, after);
	free(after);
	histd_driver_close(d);

	free(before);
	free(fork_before);
	rm_rf(dir);
	free(dir);
}

/* ---------------------------------------------------------------------- */
/* Killed while compacting                                                 */

/* The child appends and compacts in a loop, writing each acknowledged seq
 * to the pipe, until it is killed. */
static void
child_loop(const char *dir, int out)
{
	histd_file_options opt;
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "batch" };
	histd_driver *d = NULL;
	histd_append_result res;
	char text[32];

	histd_file_options_default(&opt);
	opt.compact_min_bytes = 4096;
	if (histd_file_driver_open_ex(&cfg, &opt, &d))
		_exit(3);
	for (uint64_t i = 0;; i++) {
		snprintf(text, sizeof(text), "m%llu", (unsigned long long)i);
		if (append(d, "crash", "s", NULL, 0, text, NULL, NULL, &res))
			_exit(4);
		if (write(out, &res.last_seq, sizeof(res.last_seq)) != sizeof(res.last_seq))
			_exit(5);
		/* Garbage in another session keeps compaction busy. */
		if (append(d, "crash", "junk", NULL, 0, text, NULL, NULL, NULL) ||
		    (i % 7 == 0 &&
		     histd_driver_clear(d, "crash", "junk", 0, NULL, NULL, NULL)))
			_exit(6);
		if (i % 50 == 0 && histd_file_driver_compact(d))
			_exit(7);
	}
}

static void
kill_during_compaction_loses_nothing_acknowledged(void **state)
{
	char *dir = tmpdir_new();
	histd_driver *d = must_open(dir);
	uint64_t acked = 0, seq;

	(void)state;
	create(d, "crash", "s", NULL, 0, NULL, 0);
	create(d, "crash", "junk", NULL, 0, NULL, 0);
	histd_driver_close(d);
	srand(12345);
	for (int round = 0; round < 15; round++) {
		int p[2], status;
		pid_t pid;
		histd_read q = { .tenant = "crash", .session_id = "s" };
		histd_read_result r = { 0 };

		assert_int_equal(pipe(p), 0);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			close(p[0]);
			child_loop(dir, p[1]);
		}
		close(p[1]);
		usleep(20000 + (useconds_t)(rand() % 80000));
		kill(pid, SIGKILL);
		while (read(p[0], &seq, sizeof(seq)) == sizeof(seq))
			if (seq > acked)
				acked = seq;
		close(p[0]);
		assert_int_equal(waitpid(pid, &status, 0), pid);
		if (!WIFSIGNALED(status))
			fail_msg("round %d: the child exited with %d", round,
				 WEXITSTATUS(status));

		/* Every acknowledged seq is there, in order, with no gap. */
		d = NULL;
		if (dopen(dir, "batch", &d))
			fail_msg("round %d: open: %s", round, histd_error_message());
		assert_int_equal(histd_driver_read(d, &q, &r), 0);
		assert_true(r.last_seq >= acked);
		assert_int_equal(r.records.n, r.last_seq);
		for (size_t i = 0; i < r.records.n; i++)
			assert_int_equal(r.records.v[i].seq, i + 1);
		histd_read_result_clear(&r);
		histd_driver_close(d);
	}
	assert_true(acked > 0);
	rm_rf(dir);
	free(dir);
}

/* A killed writer leaves the zeros it wrote ahead of the log's end: that
 * is the clean end of the log, not a torn record. */
static void
zeros_written_ahead_are_the_clean_end_after_a_kill(void **state)
{
	char *dir = tmpdir_new(), log[512];
	int p[2], status;
	char ready;
	pid_t pid;
	size_t len;
	uint8_t *bytes;
	histd_driver *d;
	histd_read q = { .tenant = "t1", .session_id = "z" };
	histd_read_result r = { 0 };

	(void)state;
	path_in(log, sizeof(log), dir, LOG1);
	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		d = NULL;
		if (dopen(dir, "always", &d))
			_exit(3);
		create(d, "t1", "z", NULL, 0, NULL, 0);
		for (int i = 0; i < 20; i++)
			if (append(d, "t1", "z", NULL, 0, "kept", NULL, NULL, NULL))
				_exit(4);
		if (write(p[1], "r", 1) != 1)
			_exit(5);
		pause();
		_exit(0);
	}
	close(p[1]);
	assert_int_equal(read(p[0], &ready, 1), 1);
	kill(pid, SIGKILL);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	close(p[0]);
	bytes = read_file(log, &len);
	assert_true(len > 4096);
	for (size_t i = len - 4096; i < len; i++)
		assert_int_equal(bytes[i], 0);
	free(bytes);

	d = must_open(dir);
	assert_int_equal(histd_driver_read(d, &q, &r), 0);
	assert_int_equal(r.records.n, 20);
	assert_int_equal(r.last_seq, 20);
	histd_read_result_clear(&r);
	/* Cut back to the records. */
	assert_true((size_t)file_size(log) < len - 4096);
	must_append(d, "t1", "z", "after");
	histd_driver_close(d);
	d = must_open(dir);
	assert_int_equal(histd_driver_read(d, &q, &r), 0);
	assert_int_equal(r.records.n, 21);
	histd_read_result_clear(&r);
	histd_driver_close(d);
	rm_rf(dir);
	free(dir);
}

/* ---------------------------------------------------------------------- */
/* Files of format version 1 (before sessions kept their activity time)    */

#define V1_T1 INT64_C(1600000000000000)   /* created */
#define V1_T2 INT64_C(1600000000500000)   /* updated */

/* The first frame of a version 1 file. */
static void
v1_header(hf_buf *b, const char *magic, uint64_t gen)
{
	size_t m = hf_frame_begin(b, HF_T_FILE);

	hf_put_raw(b, magic, HF_MAGIC_LEN);
	hf_put_varint(b, 1);
	hf_put_varint(b, gen);
	hf_frame_end(b, m);
}

/* The record fields of a session (CREATE, S_SESSION), tenant first. */
static void
v1_session_fields(hf_buf *b, const char *id)
{
	hf_put_str(b, "t");
	hf_put_str(b, id);
	hf_put_kv(b, NULL, 0);
	hf_put_kv(b, NULL, 0);
	hf_put_bytes(b, NULL, 0);
	hf_put_varint(b, (uint64_t)V1_T1);
}

static void
v1_create(hf_buf *b, const char *id)
{
	size_t m = hf_frame_begin(b, HF_T_CREATE);

	v1_session_fields(b, id);
	hf_frame_end(b, m);
}

/* Tenant, id, revision: how every version 1 change record begins. */
static size_t
v1_change(hf_buf *b, uint8_t type, const char *id, uint64_t rev)
{
	size_t m = hf_frame_begin(b, type);

	hf_put_str(b, "t");
	hf_put_str(b, id);
	hf_put_varint(b, rev);
	return m;
}

/* An append of one message (seq first) with no tool ids and no key. */
static void
v1_append(hf_buf *b, const char *id, uint64_t rev, uint64_t seq,
	  const char *text)
{
	size_t m = v1_change(b, HF_T_APPEND, id, rev), len;
	msg body;
	histd_msg_in in = msg_in(&body, text, NULL, NULL);
	uint8_t *rec = histd_wire_with_seq(seq, in.data, in.len, &len);

	assert_non_null(rec);
	hf_put_varint(b, seq);
	hf_put_varint(b, 1);
	hf_put_varint(b, in.token_estimate);
	hf_put_bytes(b, rec, len);
	hf_put_varint(b, 0);
	hf_put_varint(b, 0);
	hf_put_bytes(b, NULL, 0);
	hf_frame_end(b, m);
	free(rec);
}

static void
v1_write(const char *dir, const char *name, hf_buf *b)
{
	char path[512];

	assert_false(b->oom);
	path_in(path, sizeof(path), dir, name);
	write_file(path, b->p, b->len);
	hf_buf_free(b);
}

/* The session's active_at_us, once it is checked to hold n messages. */
static int64_t
active_at(histd_driver *d, const char *id, size_t n)
{
	histd_read q = { .tenant = "t", .session_id = id, .want_session = 1 };
	histd_read_result r = { 0 };
	int64_t at;

	assert_int_equal(histd_driver_read(d, &q, &r), 0);
	assert_non_null(r.session);
	assert_int_equal(r.records.n, n);
	at = r.session->active_at_us;
	histd_read_result_clear(&r);
	return at;
}

/*
 * A data directory of version 1 (a snapshot and a log after it) loads:
 * what it holds is all there, each session's activity known where version
 * 1 recorded it (a create, an update) and 0 (unknown) where it did not.
 * The version 1 log is not continued: writes go to a new log, of version
 * 2, and the mixed directory loads, also after a compaction.
 */
static void
version_1_files_load_and_new_writes_go_to_a_version_2_log(void **state)
{
	char *dir = tmpdir_new(), log2[512];
	hf_buf b = { 0 };
	size_t m;
	histd_driver *d;
	histd_append_result res;
	uint64_t rev, cleared, cur;
	int64_t before;

	(void)state;
	/* snapshot-1: "old" (changed since its create: activity unknown),
	 * "fresh" (never changed: its create is its last change). */
	v1_header(&b, HF_MAGIC_SNAPSHOT, 1);
	m = hf_frame_begin(&b, HF_T_S_SESSION);
	v1_session_fields(&b, "old");
	hf_put_varint(&b, (uint64_t)V1_T2);    /* updated_at */
	hf_put_varint(&b, 3);                  /* revision */
	hf_put_varint(&b, 2);                  /* last_seq */
	hf_put_varint(&b, 2);                  /* cleared_to_seq */
	hf_put_varint(&b, 0);                  /* messages */
	hf_frame_end(&b, m);
	m = hf_frame_begin(&b, HF_T_S_SESSION);
	v1_session_fields(&b, "fresh");
	hf_put_varint(&b, (uint64_t)V1_T1);
	hf_put_varint(&b, 1);
	hf_put_varint(&b, 0);
	hf_put_varint(&b, 0);
	hf_put_varint(&b, 0);
	hf_frame_end(&b, m);
	m = hf_frame_begin(&b, HF_T_S_END);
	hf_put_varint(&b, 2);
	hf_put_varint(&b, 2);
	hf_frame_end(&b, m);
	v1_write(dir, "snapshot-0000000000000001.hsd", &b);

	/* log-1: "a" created and appended to, "b" created and updated, "c"
	 * created and cleared, "old" appended to. */
	v1_header(&b, HF_MAGIC_LOG, 1);
	v1_create(&b, "a");
	v1_append(&b, "a", 2, 1, "imported long ago");
	v1_create(&b, "b");
	m = v1_change(&b, HF_T_UPDATE, "b", 2);
	hf_put_varint(&b, (uint64_t)V1_T2);
	hf_put_u8(&b, 0);
	hf_put_kv(&b, NULL, 0);
	hf_put_u8(&b, 0);
	hf_put_bytes(&b, NULL, 0);
	hf_frame_end(&b, m);
	v1_create(&b, "c");
	v1_append(&b, "c", 2, 1, "soon cleared");
	m = v1_change(&b, HF_T_CLEAR, "c", 3);
	hf_frame_end(&b, m);
	v1_append(&b, "old", 4, 3, "after the snapshot");
	v1_write(dir, LOG1, &b);

	d = must_open(dir);
	assert_int_equal(active_at(d, "a", 1), 0);
	assert_int_equal(active_at(d, "b", 0), V1_T2);
	assert_int_equal(active_at(d, "c", 0), 0);
	assert_int_equal(active_at(d, "old", 1), 0);
	assert_int_equal(active_at(d, "fresh", 0), V1_T1);
	/* Writes now: dated, in log-2 of version 2. */
	path_in(log2, sizeof(log2), dir, LOG2);
	assert_int_equal(file_size(log2) > 0, 1);
	assert_int_equal(append(d, "t", "a", NULL, 0, "new", NULL, NULL, &res), 0);
	before = histd_now_us();
	assert_int_equal(histd_driver_clear(d, "t", "c", 0, &rev, &cleared,
					    &cur), 0);
	histd_driver_close(d);

	/* The mixed directory: log-1 (version 1), log-2 (version 2). */
	d = must_open(dir);
	assert_int_equal(active_at(d, "a", 2), 1700000000000000LL);
	assert_true(active_at(d, "c", 0) >= before);
	assert_int_equal(active_at(d, "b", 0), V1_T2);
	assert_int_equal(active_at(d, "old", 1), 0);
	before = active_at(d, "c", 0);
	/* A compaction writes it all as version 2. */
	assert_int_equal(histd_file_driver_compact(d), 0);
	histd_driver_close(d);
	d = must_open(dir);
	assert_int_equal(active_at(d, "a", 2), 1700000000000000LL);
	assert_int_equal(active_at(d, "c", 0), before);
	assert_int_equal(active_at(d, "b", 0), V1_T2);
	assert_int_equal(active_at(d, "old", 1), 0);
	assert_int_equal(active_at(d, "fresh", 0), V1_T1);
	histd_driver_close(d);
	rm_rf(dir);
	free(dir);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(state_survives_reopen_and_compaction),
		cmocka_unit_test(compaction_reclaims_what_clear_and_delete_left),
		cmocka_unit_test(compaction_repoints_messages_a_truncate_moved),
		cmocka_unit_test_teardown(compaction_failing_at_open_still_opens,
					  restore_fsize),
		cmocka_unit_test_teardown(zeros_ending_a_log_before_the_last_are_refused,
					  restore_fsize),
		cmocka_unit_test_teardown(log_before_the_last_cut_at_a_record_boundary_is_refused,
					  restore_fsize),
		cmocka_unit_test_teardown(log_header_without_the_previous_length_loads,
					  restore_fsize),
		cmocka_unit_test(torn_last_record_is_truncated_at_every_offset),
		cmocka_unit_test(torn_record_holding_a_frame_is_truncated_at_every_offset),
		cmocka_unit_test(torn_record_of_frames_in_the_prepared_zeros_is_truncated),
		cmocka_unit_test(corrupted_last_record_is_truncated_at_every_offset),
		cmocka_unit_test(corrupted_middle_record_refuses_to_open_at_every_offset),
		cmocka_unit_test(record_torn_inside_the_prepared_zeros),
		cmocka_unit_test(torn_file_header_opens_empty),
		cmocka_unit_test(corrupted_snapshot_refuses_to_open),
		cmocka_unit_test(second_open_of_a_data_directory_is_unavailable),
		cmocka_unit_test(bad_options_are_refused),
		cmocka_unit_test(log_level_filters_driver_lines),
		cmocka_unit_test(leftover_snapshot_tmp_is_removed),
		cmocka_unit_test(embeddings_survive_reopen_and_compaction),
		cmocka_unit_test(kill_during_compaction_loses_nothing_acknowledged),
		cmocka_unit_test(zeros_written_ahead_are_the_clean_end_after_a_kill),
		cmocka_unit_test(version_1_files_load_and_new_writes_go_to_a_version_2_log),
		cmocka_unit_test(a_refusal_resting_on_a_pending_append_waits_for_its_fsync),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
