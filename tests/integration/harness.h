/*
 * The integration harness: runs the real histd binary on a free loopback
 * port and gives the tests small builders for requests.
 *
 * Every test program takes the path of the histd binary as its first
 * argument (CMake passes $<TARGET_FILE:histd>) or in $HISTD_BIN, and calls
 * harness_init(argc, argv) before cmocka runs.
 *
 * A server is started with --listen 127.0.0.1:0 --port-file DIR/port
 * --driver memory plus the test's own flags, in a fresh temporary directory;
 * its stdout and stderr go to DIR/histd.log, which is printed when the
 * server fails to start or to stop cleanly. The child gets SIGKILL if the
 * test process dies, so a crashed test leaves no server behind.
 */
#ifndef HISTD_TEST_HARNESS_H
#define HISTD_TEST_HARNESS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "client.h"
#include "histd/v1/histd.pb-c.h"

/* Default deadline of a unary call in the tests: generous, for a loaded
 * 2-core machine and sanitizer builds. */
#define T_TIMEOUT_MS 20000

typedef struct histd_proc {
	pid_t pid;
	int port;
	char dir[128];     /* the temporary directory */
	char target[64];   /* "127.0.0.1:<port>" */
} histd_proc;

/* Finds the histd binary (argv[1], else $HISTD_BIN). Returns 0, or -1 with a
 * line on stderr. */
int harness_init(int argc, char **argv);

/* Starts histd with the standard flags and extra (NULL-terminated, may be
 * NULL) and waits until it has written its port file (at most 30 s).
 * Returns 0 with *out set, or -1 (with the server's log on stderr). */
int harness_start(histd_proc **out, const char *const *extra);

/* Sends sig and waits up to timeout_ms for the process to exit. Returns its
 * exit status (0..255), 128 + the signal if a signal killed it, or -1 if it
 * did not exit in time (it is then killed with SIGKILL). The process is
 * reaped either way; the proc stays allocated (harness_free). */
int harness_signal_wait(histd_proc *p, int sig, int timeout_ms);

/* SIGTERM, wait up to 60 s, check exit status 0 (printing the log if not),
 * remove the directory and free p. Returns 0 if the exit status was 0.
 * NULL is allowed (returns 0). */
int harness_stop(histd_proc *p);

/* Removes the directory and frees p, without signalling (after
 * harness_signal_wait). */
void harness_free(histd_proc *p);

/* Prints the server's log to stderr. */
void harness_dump_log(const histd_proc *p);

/* Whether a line of the server's log holds needle yet. */
int harness_log_has(const histd_proc *p, const char *needle);

/* Opens a client to the server (asserts success). */
histd_client *harness_client(const histd_proc *p);

/* The same, sending "authorization: Bearer <key>" on every call (for a
 * server started with --api-keys-file). */
histd_client *harness_client_key(const histd_proc *p, const char *key);

/* ------------------------------------------------------------------------
 * Building requests: an arena holds every allocation of a test's request
 * messages, freed at once. Allocation failure aborts the test program. */

typedef struct tarena tarena;

tarena *ta_new(void);
void ta_free(tarena *a);
void *ta_alloc(tarena *a, size_t size);  /* zeroed */
char *ta_strdup(tarena *a, const char *s);
char *ta_printf(tarena *a, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* A message with one text block. */
Histd__V1__Message *tm_text(tarena *a, Histd__V1__Role role, const char *text);
/* An assistant message with one tool_call block. */
Histd__V1__Message *tm_tool_call(tarena *a, const char *id, const char *name,
				 const char *arguments);
/* A tool message with one tool_result block holding one text block. */
Histd__V1__Message *tm_tool_result(tarena *a, const char *call_id,
				   const char *name, const char *text);
/* An array of n user text messages "<prefix> <i>" (i from 0). */
Histd__V1__Message **tm_texts(tarena *a, size_t n, const char *prefix);
/* One map entry of the string maps of the API (labels, context_keys,
 * metadata): all share this layout. */
void *tm_entry(tarena *a, const ProtobufCMessageDescriptor *d,
	       const char *key, const char *value);

/* ------------------------------------------------------------------------
 * Calls: thin wrappers over histd_client_unary with T_TIMEOUT_MS. */

/* Calls "/histd.v1.HistoryService/<name>". */
int t_call(histd_client *c, const char *name, const void *req,
	   const ProtobufCMessageDescriptor *resp_desc, void *resp_out,
	   histd_status *st);

/* Creates a session (id NULL or "" lets the server choose); asserts OK and
 * returns the session id (malloc'ed). */
char *t_create_session(histd_client *c, const char *id);

/* Appends n user text messages "<prefix> <i>". Returns the status code;
 * *out gets the response when OK (may be NULL to drop it). */
grpc_status_code t_append_texts(histd_client *c, const char *session_id,
				size_t n, const char *prefix,
				uint64_t expected_revision,
				Histd__V1__AppendResponse **out);

/* GetMessages RAW after after_seq, asserting nothing: the status in *st
 * (histd_status_init'ed by the caller), the response in *out (NULL unless
 * OK). For callers that must not fail while their threads run. */
void t_try_get_raw(histd_client *c, const char *session_id,
		   uint64_t after_seq, uint32_t limit,
		   Histd__V1__GetMessagesResponse **out, histd_status *st);

/* GetMessages RAW after after_seq; asserts OK. */
Histd__V1__GetMessagesResponse *t_get_raw(histd_client *c,
					  const char *session_id,
					  uint64_t after_seq, uint32_t limit);

/* GetSession; asserts OK. */
Histd__V1__Session *t_get_session(histd_client *c, const char *session_id);

/* Opens a Subscribe stream (asserts the call started). */
histd_client_stream *t_subscribe(histd_client *c, const char *session_id,
				 uint64_t after_seq);

/* Reads the next event within timeout_ms. Returns the event (free with
 * histd_client_message_free), or NULL on end of stream or timeout, with
 * *result set to the histd_stream_result (may be NULL). */
Histd__V1__HistoryEvent *t_next_event(histd_client_stream *s, int timeout_ms,
				      int *result);

/* The text of a message's first block if it is text, else "". */
const char *tm_first_text(const Histd__V1__Message *m);

/* Monotonic milliseconds. */
int64_t t_now_ms(void);

/* Prints a status on stderr ("what: CODE details"). */
void t_print_status(const char *what, const histd_status *st);

/* Asserts a status code, printing the status when it differs. */
#define assert_status(st, expected)                                        \
	do {                                                               \
		if ((st)->code != (expected))                              \
			t_print_status("unexpected status", (st));         \
		assert_int_equal((st)->code, (expected));                  \
	} while (0)

#endif
