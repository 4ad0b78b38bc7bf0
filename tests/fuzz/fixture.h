/*
 * What the fuzz targets and their seed generator (make_seeds.c) share: the
 * sample conversation a fuzz_service run starts from, a valid request of
 * every unary method, and the layout of a fuzz_file_recovery input.
 */
#ifndef HISTD_FUZZ_FIXTURE_H
#define HISTD_FUZZ_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

/* One packed request of a unary method (enum histd_method). */
typedef struct fz_req {
	int method;
	const char *name;       /* seed file name */
	uint8_t *data;          /* malloc'ed */
	size_t len;
} fz_req;

/* The session fuzz_service sets up before each input. */
#define FZ_TENANT "t"
#define FZ_SESSION "s"

/*
 * Fills out[0..n) with the requests that build the starting state, in
 * order: session "s" (labels, a masking+window pipeline), session "k"
 * (context keys), and an Append to "s" of a system prompt, a user turn, an
 * assistant tool call answered by a tool message, and an assistant call
 * left open ("call_open"). Returns n, or 0 if out of memory. Free with
 * fz_reqs_free.
 */
size_t fz_setup_requests(fz_req *out, size_t cap);

/* Valid requests of every unary method against that state, at least one
 * each, for the seed corpus. Returns n, or 0 if out of memory. */
size_t fz_seed_requests(fz_req *out, size_t cap);

void fz_reqs_free(fz_req *v, size_t n);

/*
 * A fuzz_file_recovery input: byte 0 is flags, the rest the files.
 *   flags & 3: the layout
 *     FZ_LAYOUT_LOG       rest = log-g, the last log
 *     FZ_LAYOUT_SNAPSHOT  rest = snapshot-g; log-g is a valid empty log
 *     FZ_LAYOUT_SNAP_LOG  rest = u32le n, snapshot-g (n bytes), log-g
 *     FZ_LAYOUT_TWO_LOGS  rest = u32le n, log-g (n bytes), log-g+1
 *     (n larger than what follows: the first file takes all of it)
 *   flags & FZ_FIX_CRC: the target rewrites the checksum of every frame
 *     whose length fits before writing the files, so that mutations reach
 *     the record decoders instead of stopping at the checksum.
 *   (flags >> 3) & 7: g - 1, g being the generation of the first file.
 *   flags & FZ_COMPACT: once open, compact (write a snapshot of what was
 *     recovered) before the reopen.
 *   flags & FZ_PLAIN_APPEND: once open, also append a message that names
 *     no tool call.
 */
enum {
	FZ_LAYOUT_LOG = 0,
	FZ_LAYOUT_SNAPSHOT = 1,
	FZ_LAYOUT_SNAP_LOG = 2,
	FZ_LAYOUT_TWO_LOGS = 3,
};
#define FZ_FIX_CRC 0x04
#define FZ_GEN(g) ((uint8_t)(((g) - 1) << 3))    /* g in 1..8 */
#define FZ_COMPACT 0x40
#define FZ_PLAIN_APPEND 0x80

#endif
