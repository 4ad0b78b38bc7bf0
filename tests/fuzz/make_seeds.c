/*
 * Writes the seed corpora of the fuzz targets (run at build time):
 *
 *   make_seeds <tests/fuzz/seeds> <out>
 *
 *   <out>/service/        one input per valid request of fixture.c
 *   <out>/file_recovery/  data directories the file driver wrote, in the
 *                         layouts of fixture.h (raw, checksums to fix, a
 *                         torn tail, zero padding, snapshots, two logs)
 *   <out>/import/         <tests/fuzz/seeds>/import/<format>[-x].json with
 *                         the format byte in front
 *
 * Seeds are inputs only: the fuzz runs read them and write what they
 * find elsewhere.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "driver.h"
#include "file/file.h"
#include "fixture.h"

/* The data directory file_seeds works in ("" when none). */
static char work[64];

/* Removes work/data's files, work/data and work. */
static void
remove_work(void)
{
	char dir[128], path[700];
	DIR *dd;
	struct dirent *e;

	if (!work[0])
		return;
	snprintf(dir, sizeof(dir), "%s/data", work);
	if ((dd = opendir(dir))) {
		while ((e = readdir(dd))) {
			if (e->d_name[0] == '.')
				continue;
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			unlink(path);
		}
		closedir(dd);
	}
	rmdir(dir);
	rmdir(work);
	work[0] = '\0';
}

static void __attribute__((noreturn))
die(const char *what, const char *arg)
{
	remove_work();
	fprintf(stderr, "make_seeds: %s %s: %s\n", what, arg ? arg : "",
		errno ? strerror(errno) : histd_error_message());
	exit(1);
}

static void
mkdir_p(const char *path)
{
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		die("cannot create", path);
	errno = 0;
}

/* Writes head (hlen bytes) then body into dir/name. */
static void
put(const char *dir, const char *name, const void *head, size_t hlen,
    const void *body, size_t blen)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!(f = fopen(path, "wb")) ||
	    (hlen && fwrite(head, 1, hlen, f) != hlen) ||
	    (blen && fwrite(body, 1, blen, f) != blen) || fclose(f) != 0)
		die("cannot write", path);
}

typedef struct bytes {
	uint8_t *p;
	size_t n;
} bytes;

static bytes
slurp(const char *path)
{
	bytes b = { 0 };
	FILE *f = fopen(path, "rb");
	long n;

	if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
	    fseek(f, 0, SEEK_SET) != 0 || !(b.p = malloc((size_t)n + 1)) ||
	    fread(b.p, 1, (size_t)n, f) != (size_t)n)
		die("cannot read", path);
	fclose(f);
	b.n = (size_t)n;
	return b;
}

static void
cat(bytes *b, const void *p, size_t n)
{
	if (!(b->p = realloc(b->p, b->n + n + 1)))
		die("out of memory", NULL);
	memcpy(b->p + b->n, p, n);
	b->n += n;
}

/* ---------------------------------------------------------------------- */
/* service                                                                 */

static void
service_seeds(const char *out)
{
	fz_req reqs[64];
	size_t n = fz_seed_requests(reqs, sizeof(reqs) / sizeof(reqs[0]));

	if (!n)
		die("cannot build the requests", NULL);
	for (size_t i = 0; i < n; i++) {
		uint8_t m = (uint8_t)reqs[i].method;

		put(out, reqs[i].name, &m, 1, reqs[i].data, reqs[i].len);
	}
	fz_reqs_free(reqs, n);
}

/* ---------------------------------------------------------------------- */
/* file_recovery                                                           */

#define T "t"
#define NOW 1700000000000000

static void
check(int rc, const char *what)
{
	if (rc) {
		errno = 0;
		die(what, histd_error_name(rc));
	}
}

static histd_driver *
open_dir(const char *dir)
{
	histd_driver_config cfg = { .data_dir = dir, .fsync_mode = "never" };
	histd_driver *d;

	check(histd_driver_open("file", &cfg, &d), "cannot open the file driver");
	return d;
}

static void
create(histd_driver *d, const char *id, const char *ck)
{
	histd_kv label = { "team", "search" }, key = { "user", (char *)ck };
	static const uint8_t config[] = { 0x0a, 0x00 };   /* empty pipeline */
	histd_session in = { .tenant = T, .id = (char *)id,
			     .labels = &label, .n_labels = 1,
			     .context_keys = ck ? &key : NULL,
			     .n_context_keys = ck ? 1 : 0,
			     .config = (uint8_t *)config,
			     .config_len = sizeof(config),
			     .created_at_us = NOW };
	histd_session *out;

	check(histd_driver_session_create(d, &in, &out), "create");
	histd_session_free(out);
}

/* Appends (or replaces with) n messages: message i issues calls[i] (or
 * nothing) and answers results[i] (or nothing). */
static void
append(histd_driver *d, const char *id, size_t n, const char *const *calls,
       const char *const *results, const char *key, int replace)
{
	static const uint8_t text[] = { 0x10, 0x02, 0x1a, 0x07, 0x0a, 0x05,
					'h', 'e', 'l', 'l', 'o' };
	histd_msg_in in[8];
	histd_tool_ref c[8], r[8];
	uint8_t hash[HISTD_HASH_LEN];
	histd_append a = { .tenant = T, .session_id = id,
			   .idempotency_key = key, .request_hash = hash,
			   .now_us = NOW, .idem_expires_us = NOW + 86400000000,
			   .msgs = in, .n_msgs = n };
	histd_append_result res;
	uint64_t cleared;

	memset(hash, 0xab, sizeof(hash));
	for (size_t i = 0; i < n; i++) {
		c[i] = (histd_tool_ref){ calls ? calls[i] : NULL, 0 };
		r[i] = (histd_tool_ref){ results ? results[i] : NULL, 0 };
		in[i] = (histd_msg_in){
			.data = text, .len = sizeof(text),
			.token_estimate = (uint32_t)(5 + i),
			.calls = c[i].id ? &c[i] : NULL, .n_calls = c[i].id != NULL,
			.results = r[i].id ? &r[i] : NULL,
			.n_results = r[i].id != NULL,
		};
	}
	if (replace)
		check(histd_driver_replace(d, &a, &res, &cleared), "replace");
	else
		check(histd_driver_append(d, &a, &res), "append");
}

/* Every kind of log record, in a state that exercises them all. */
static void
scenario_log(histd_driver *d)
{
	static const char *const calls[] = { NULL, "call_1", NULL };
	static const char *const results[] = { NULL, NULL, "call_1" };
	static const char *const rcalls[] = { "call_r", NULL };
	static const char *const rresults[] = { NULL, "call_r" };
	static const char *const open_call[] = { "call_open" };
	static const uint8_t summary[] = { 0x08, 0x01, 0x10, 0x02, 0x1a, 0x03,
					   's', 'u', 'm' };
	histd_record sum = { .seq = 2, .token_estimate = 3,
			     .len = sizeof(summary), .data = (uint8_t *)summary };
	histd_kv label = { "stage", "two" };
	histd_session fork = { .tenant = T, .id = "f", .created_at_us = NOW + 1 };
	histd_session *out;

	create(d, "s", "u1");
	create(d, "k", NULL);
	append(d, "s", 3, calls, results, "key-1", 0);
	append(d, "s", 1, open_call, NULL, NULL, 0);
	check(histd_driver_session_update(d, T, "s", 0, &label, 1, NULL, 0,
					  NOW + 2, &out, NULL), "update");
	histd_session_free(out);
	check(histd_driver_summary_put(d, T, "s", 0, &sum, NULL, NULL),
	      "summary_put");
	check(histd_driver_session_fork(d, T, "s", 2, &fork, &out), "fork");
	histd_session_free(out);
	append(d, "f", 1, NULL, NULL, NULL, 0);
	check(histd_driver_clear(d, T, "f", 0, NULL, NULL, NULL), "clear");
	append(d, "k", 2, rcalls, rresults, NULL, 1);
	check(histd_driver_session_delete(d, T, "f", 0, NULL), "delete");
	create(d, "d", "u2");
	append(d, "d", 2, NULL, NULL, "key-2", 0);
}

static void
file_seeds(const char *out)
{
	static const char *const answer[] = { "call_open" };
	char dir[600], path[700];
	bytes log1, snap2, log2, b = { 0 };
	uint8_t flags, len[4], zeros[64] = { 0 };
	histd_driver *d;

	strcpy(work, "/tmp/histd-seeds-XXXXXX");
	if (!mkdtemp(work)) {
		work[0] = '\0';
		die("mkdtemp", "/tmp");
	}
	snprintf(dir, sizeof(dir), "%s/data", work);

	d = open_dir(dir);
	scenario_log(d);
	histd_driver_close(d);
	snprintf(path, sizeof(path), "%s/log-%016x.hsd", dir, 1);
	log1 = slurp(path);

	/* A compaction: snapshot-2 holds the state, log-2 what follows. */
	d = open_dir(dir);
	check(histd_file_driver_compact(d), "compact");
	append(d, "s", 1, NULL, answer, NULL, 0);
	create(d, "n", NULL);
	histd_driver_close(d);
	snprintf(path, sizeof(path), "%s/snapshot-%016x.hsd", dir, 2);
	snap2 = slurp(path);
	snprintf(path, sizeof(path), "%s/log-%016x.hsd", dir, 2);
	log2 = slurp(path);

	flags = FZ_LAYOUT_LOG | FZ_GEN(1);
	put(out, "log", &flags, 1, log1.p, log1.n);
	put(out, "log_torn", &flags, 1, log1.p, log1.n - 5);
	cat(&b, log1.p, log1.n);
	cat(&b, zeros, sizeof(zeros));
	put(out, "log_zero_tail", &flags, 1, b.p, b.n);
	flags |= FZ_FIX_CRC;
	put(out, "log_fix_crc", &flags, 1, log1.p, log1.n);
	flags |= FZ_COMPACT;
	put(out, "log_fix_crc_compact", &flags, 1, log1.p, log1.n);

	flags = FZ_LAYOUT_SNAPSHOT | FZ_GEN(2) | FZ_FIX_CRC;
	put(out, "snapshot", &flags, 1, snap2.p, snap2.n);

	for (int two = 0; two < 2; two++) {
		const bytes *first = two ? &log1 : &snap2;

		free(b.p);
		b = (bytes){ 0 };
		flags = two ? FZ_LAYOUT_TWO_LOGS | FZ_GEN(1) | FZ_FIX_CRC
			    : FZ_LAYOUT_SNAP_LOG | FZ_GEN(2) | FZ_FIX_CRC;
		cat(&b, &flags, 1);
		len[0] = (uint8_t)first->n;
		len[1] = (uint8_t)(first->n >> 8);
		len[2] = (uint8_t)(first->n >> 16);
		len[3] = (uint8_t)(first->n >> 24);
		cat(&b, len, 4);
		cat(&b, first->p, first->n);
		cat(&b, log2.p, log2.n);
		put(out, two ? "two_logs" : "snapshot_log", NULL, 0, b.p, b.n);
	}

	free(b.p);
	free(log1.p);
	free(snap2.p);
	free(log2.p);
	remove_work();
}

/* ---------------------------------------------------------------------- */
/* import                                                                  */

/* Histd__V1__Format values 1..5, by histd_format_name. */
static const char *const formats[] = {
	"anthropic_messages", "openai_chat", "openai_responses", "gemini",
	"mistral",
};

static void
import_seeds(const char *src, const char *out)
{
	char dir[600], path[900];
	DIR *dd;
	struct dirent *e;

	snprintf(dir, sizeof(dir), "%s/import", src);
	if (!(dd = opendir(dir)))
		die("cannot list", dir);
	while ((e = readdir(dd))) {
		size_t nl = strlen(e->d_name);

		if (nl < 6 || strcmp(e->d_name + nl - 5, ".json") != 0)
			continue;
		for (uint8_t f = 0; f < 5; f++) {
			size_t fl = strlen(formats[f]);
			/* Format f + 1; the cross-format export: the next. */
			uint8_t b = (uint8_t)(f + 10 * ((f + 1) % 5));
			bytes j;

			if (strncmp(e->d_name, formats[f], fl) != 0 ||
			    (e->d_name[fl] != '.' && e->d_name[fl] != '-'))
				continue;
			snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
			j = slurp(path);
			put(out, e->d_name, &b, 1, j.p, j.n);
			free(j.p);
		}
	}
	closedir(dd);
}

int
main(int argc, char **argv)
{
	char sub[600];

	if (argc != 3) {
		fprintf(stderr, "usage: make_seeds <tests/fuzz/seeds> <out>\n");
		return 2;
	}
	mkdir_p(argv[2]);
	snprintf(sub, sizeof(sub), "%s/service", argv[2]);
	mkdir_p(sub);
	service_seeds(sub);
	snprintf(sub, sizeof(sub), "%s/file_recovery", argv[2]);
	mkdir_p(sub);
	file_seeds(sub);
	snprintf(sub, sizeof(sub), "%s/import", argv[2]);
	mkdir_p(sub);
	import_seeds(argv[1], sub);
	return 0;
}
