/*
 * A small blocking client of histd on gRPC C core.
 *
 * One histd_client is one channel to one server. It serves the integration
 * tests, histctl and the benchmark: a unary call is one function call that
 * returns when the call is over; a server-streaming call (Subscribe) is a
 * handle read message by message with a timeout.
 *
 * Requests and responses are protobuf-c messages: the caller packs nothing
 * and names the method by its path ("/histd.v1.HistoryService/Append"),
 * because protobuf-c has no gRPC stubs.
 *
 * Status: every call that reached the point of having a gRPC status fills a
 * histd_status with the status code, its details and the trailing metadata
 * (histd_status_trailer(st, "histd-revision")). Failures the client itself
 * produces are reported the same way, as gRPC does: a deadline is
 * DEADLINE_EXCEEDED, a response that does not decode is INTERNAL.
 *
 * Threads: a histd_client may be shared by any number of threads; every
 * unary call uses its own completion queue. A histd_client_stream belongs to
 * one thread at a time, except histd_client_stream_cancel, which any thread
 * may call at any time (to wake a reader blocked in _next).
 *
 * Timeouts: every timeout_ms here is in milliseconds; 0 or negative means
 * none (no deadline, wait for ever).
 *
 * gRPC's library is initialized by histd_client_open and released by
 * histd_client_close (reference counted by gRPC: a program may also call
 * grpc_init itself).
 */
#ifndef HISTD_CLIENT_H
#define HISTD_CLIENT_H

#include <stddef.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

/* The method paths of the API, for the method_path arguments. */
#define HISTD_PATH(name) "/histd.v1.HistoryService/" name
#define HISTD_PATH_HEALTH_CHECK "/grpc.health.v1.Health/Check"

/* ------------------------------------------------------------------------
 * Status of a finished call */

/* One metadata entry. Binary values ("-bin" keys) may hold NUL bytes: use
 * value_len; value is NUL-terminated all the same. */
typedef struct histd_metadata {
	char *key;
	char *value;
	size_t value_len;
} histd_metadata;

typedef struct histd_status {
	grpc_status_code code;
	/* The status message; "" when the server sent none. NULL only while
	 * the status is unset (after histd_status_init). Owned by the status. */
	char *details;
	/* Trailing metadata as received, in order. Owned by the status. */
	histd_metadata *trailers;
	size_t n_trailers;
} histd_status;

/* Makes st empty (code UNKNOWN, no details, no trailers). A status must be
 * initialized before it is first passed to any call here. */
void histd_status_init(histd_status *st);

/* Frees what st holds and makes it empty again; st itself is the caller's.
 * Calls that fill a status reset it first, so one status can be reused. */
void histd_status_reset(histd_status *st);

/* The value of the first trailing metadata entry named key (keys are
 * lower case on the wire), or NULL. Borrowed from st. */
const char *histd_status_trailer(const histd_status *st, const char *key);

/* "OK", "NOT_FOUND", ... for a gRPC status code; "UNKNOWN_CODE" past the
 * known ones. A constant string. */
const char *histd_status_code_name(grpc_status_code code);

/* The HISTD_E* code (proto/histd_error.h) a gRPC status code stands for,
 * the inverse of the server's mapping: 0 for OK, HISTD_ENOTFOUND for
 * NOT_FOUND, HISTD_ECONFLICT for ABORTED, HISTD_ELIMIT for
 * RESOURCE_EXHAUSTED, and so on. A call that did not get through
 * (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED) is HISTD_EUNAVAILABLE;
 * OUT_OF_RANGE is HISTD_EINVALID; UNKNOWN, INTERNAL and codes histd never
 * sends are HISTD_EINTERNAL. */
int histd_status_to_error(grpc_status_code code);

/* ------------------------------------------------------------------------
 * Channel */

typedef struct histd_client histd_client;

#define HISTD_CLIENT_OPTIONS_VERSION 2

/* Options of histd_client_open_ex. Start from HISTD_CLIENT_OPTIONS_INIT;
 * fields are only ever appended (and version bumped). */
typedef struct histd_client_options {
	unsigned int version;
	/* Largest response message accepted: 0 for gRPC's default (4 MiB),
	 * -1 for no limit. */
	int max_receive_message_bytes;
	/* Largest request message sent: 0 for gRPC's default (no limit). A
	 * larger request fails locally with RESOURCE_EXHAUSTED. */
	int max_send_message_bytes;
	/* Request metadata sent on every call, before the per-call metadata:
	 * NULL-terminated key, value, key, value, ... (e.g. "authorization",
	 * "Bearer ..."). Copied by open; may be NULL. */
	const char *const *metadata_kv;
	/* Version 2. TLS: nonzero to connect over TLS, trusting
	 * tls_root_pem (PEM CA certificates; NULL: gRPC's default roots).
	 * tls_cert_pem and tls_key_pem (PEM, both or neither): a client
	 * certificate for mutual TLS. Copied by open; may be NULL. */
	int tls;
	const char *tls_root_pem;
	const char *tls_cert_pem;
	const char *tls_key_pem;
} histd_client_options;

#define HISTD_CLIENT_OPTIONS_INIT \
	{ HISTD_CLIENT_OPTIONS_VERSION, 0, 0, NULL, 0, NULL, NULL, NULL }

/*
 * Opens a channel to target ("127.0.0.1:50051",
 * "localhost:50051", "unix:/path"), plaintext unless opt asks for TLS.
 * The channel connects lazily: open does not fail when nobody listens (or
 * the certificates do not fit); the first call then ends UNAVAILABLE.
 * Returns 0 with *out set (free it with histd_client_close), HISTD_EINVALID
 * for a NULL target, an options version this library does not know or a
 * client certificate without its key (or the reverse), HISTD_ENOMEM. On
 * failure *out is NULL.
 */
int histd_client_open(const char *target, histd_client **out);
int histd_client_open_ex(const char *target, const histd_client_options *opt,
			 histd_client **out);

/* Closes the channel. Every stream of the client must have been closed
 * first and no unary call may be in progress. NULL is allowed. */
void histd_client_close(histd_client *c);

/* ------------------------------------------------------------------------
 * Unary calls */

/*
 * Calls method_path with req and waits for the answer (at most timeout_ms).
 *
 * metadata_kv: request metadata for this call, NULL-terminated key, value,
 * key, value, ... (keys lower case); may be NULL. Borrowed for the call.
 * resp_desc: the descriptor of the response type, e.g.
 * &histd__v1__append_response__descriptor.
 *
 * Returns 0 when the status is OK: *resp is the decoded response, owned by
 * the caller and freed with histd_client_message_free. Otherwise returns the
 * HISTD_E* code of the status (histd_status_to_error) and *resp is NULL. st
 * (may be NULL) receives the status in both cases; reset it with
 * histd_status_reset when done. Arguments that make no call (NULL client,
 * path, request or descriptor) return HISTD_EINVALID with st->code
 * INVALID_ARGUMENT and a details line saying which.
 */
int histd_client_unary(histd_client *c, const char *method_path,
		       const ProtobufCMessage *req,
		       const ProtobufCMessageDescriptor *resp_desc,
		       int timeout_ms, const char *const *metadata_kv,
		       ProtobufCMessage **resp, histd_status *st);

/* Frees a message returned by this library (unpacked with protobuf-c's
 * default allocator). NULL is allowed. */
void histd_client_message_free(ProtobufCMessage *msg);

/* ------------------------------------------------------------------------
 * Server-streaming calls */

typedef struct histd_client_stream histd_client_stream;

/* What histd_client_stream_next returns (besides negative HISTD_E*). */
enum histd_stream_result {
	HISTD_STREAM_END = 0,      /* no more messages; the status is set */
	HISTD_STREAM_MESSAGE = 1,  /* *msg is the next message */
	HISTD_STREAM_TIMEOUT = 2,  /* nothing arrived within timeout_ms */
};

/*
 * Starts a server-streaming call of method_path with req. timeout_ms is the
 * deadline of the whole call (0: none, the usual for Subscribe). Returns as
 * soon as the call is started, without waiting for the server: a call that
 * fails shows it in the first _next (HISTD_STREAM_END with the status).
 * Returns 0 with *out set (close it with histd_client_stream_close),
 * HISTD_EINVALID for NULL arguments, HISTD_ENOMEM, or HISTD_EINTERNAL if
 * gRPC refused to start the call (its reason in this thread's
 * histd_error_message). On failure *out is NULL.
 */
int histd_client_stream_open(histd_client *c, const char *method_path,
			     const ProtobufCMessage *req, int timeout_ms,
			     histd_client_stream **out);

/* The same with request metadata for this call (as in histd_client_unary;
 * borrowed until it returns). */
int histd_client_stream_open_md(histd_client *c, const char *method_path,
				const ProtobufCMessage *req, int timeout_ms,
				const char *const *metadata_kv,
				histd_client_stream **out);

/*
 * Waits at most timeout_ms for the next message.
 *
 * HISTD_STREAM_MESSAGE: *msg is the message, decoded as resp_desc, owned by
 * the caller (histd_client_message_free).
 * HISTD_STREAM_END: the server ended the stream (or the call failed, was
 * cancelled or hit its deadline); histd_client_stream_status has the
 * status. Later calls return HISTD_STREAM_END again.
 * HISTD_STREAM_TIMEOUT: nothing arrived in time; the stream is intact and
 * the read goes on where it was at the next call.
 * Negative HISTD_E*: HISTD_EINTERNAL if a message does not decode as
 * resp_desc (the call is then cancelled; the next call returns END).
 * *msg is NULL unless HISTD_STREAM_MESSAGE.
 */
int histd_client_stream_next(histd_client_stream *s,
			     const ProtobufCMessageDescriptor *resp_desc,
			     int timeout_ms, ProtobufCMessage **msg);

/* Cancels the call: the server sees the client go away, and the stream ends
 * with CANCELLED (unless it had ended already). Any thread, any time before
 * close; calling it twice is harmless. */
void histd_client_stream_cancel(histd_client_stream *s);

/* The final status once _next returned HISTD_STREAM_END; NULL before.
 * Borrowed from the stream, valid until histd_client_stream_close. */
const histd_status *histd_client_stream_status(const histd_client_stream *s);

/* Ends the call if it is still running (cancelling it), waits for gRPC to
 * release it, and frees the stream. NULL is allowed. */
void histd_client_stream_close(histd_client_stream *s);

#endif
