/*
 * Error codes shared by every room of histd.
 *
 * Functions return int: 0 on success, one of the negative codes below on
 * failure. The code is what a caller can act on; the one-line message kept
 * per thread says what happened, for logs and for the gRPC status. The
 * server maps codes to gRPC status codes in one place (server/status.c).
 *
 * Messages are one factual line: they name fields and limits, never
 * conversation text. A function that passes a lower layer's error up leaves
 * its message alone.
 */
#ifndef HISTD_ERROR_H
#define HISTD_ERROR_H

enum histd_err {
	HISTD_OK = 0,
	HISTD_ENOTFOUND = -1,     /* no such session / tool call / key */
	HISTD_EEXISTS = -2,       /* the id or context keys are taken */
	HISTD_ECONFLICT = -3,     /* expected revision does not match */
	HISTD_EINVALID = -4,      /* malformed or invalid input */
	HISTD_EPRECONDITION = -5, /* idempotency key reused, other request */
	HISTD_ELIMIT = -6,        /* a configured limit was reached */
	HISTD_EUNAVAILABLE = -7,  /* storage unreachable, shutting down */
	HISTD_ECORRUPT = -8,      /* stored data failed its checksum */
	HISTD_EUNAUTH = -9,       /* missing or bad credentials */
	HISTD_EPERM = -10,        /* credentials lack the right */
	HISTD_EUNIMPL = -11,      /* not implemented */
	HISTD_ENOMEM = -12,       /* out of memory */
	HISTD_EINTERNAL = -13,    /* a bug or an unexpected library failure */
	HISTD_EDEADLINE = -14,    /* the caller's deadline passed (the service's
				   * own; drivers never return it) */
};

/* Sets this thread's message (printf-style) and returns code, so that
 * `return histd_error_set(HISTD_EINVALID, "...")` reads naturally. */
int histd_error_set(int code, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* This thread's last message; "" if none. Borrowed, valid until the next
 * histd_error_set or histd_error_clear on this thread. */
const char *histd_error_message(void);

void histd_error_clear(void);

/* A short constant name for a code ("NOT_FOUND", ...). */
const char *histd_error_name(int code);

#endif
