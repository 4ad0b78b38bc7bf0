/*
 * The HistoryService RPCs, without gRPC.
 *
 * The transport hands each unary call here as the method and the packed
 * request bytes; the service decodes and validates the request, calls the
 * driver through its wrappers, and returns the packed response. This keeps
 * every rule of the API testable without a network, and the transport
 * generic.
 *
 * Thread-safe: any number of threads may call histd_service_unary at once.
 */
#ifndef HISTD_SERVICE_H
#define HISTD_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "driver.h"

enum histd_method {
	HISTD_M_CREATE_SESSION,
	HISTD_M_RESOLVE_SESSION,
	HISTD_M_GET_SESSION,
	HISTD_M_LIST_SESSIONS,
	HISTD_M_UPDATE_SESSION,
	HISTD_M_DELETE_SESSION,
	HISTD_M_FORK_SESSION,
	HISTD_M_APPEND,
	HISTD_M_GET_MESSAGES,
	HISTD_M_GET_TOOL_RESULT,
	HISTD_M_CLEAR,
	HISTD_M_REPLACE,
	HISTD_M_REDUCE,
	HISTD_M_EXPORT,
	HISTD_M_IMPORT,
	HISTD_M_SUBSCRIBE,      /* server streaming: see server/subscribe.c */
	HISTD_M_SEARCH,
	HISTD_M_COUNT
};

/* "/histd.v1.HistoryService/<Name>" for each method. */
extern const char *const histd_method_paths[HISTD_M_COUNT];
/* "<Name>" for each method (logs, metrics). */
extern const char *const histd_method_names[HISTD_M_COUNT];
/* Whether a method changes storage (a read-only caller may not call it). */
int histd_method_writes(enum histd_method m);

typedef struct histd_service_config {
	uint32_t max_messages_per_append;  /* default 1000 */
	uint32_t max_message_bytes;        /* one packed Message; default 1 MiB */
	uint32_t max_page_size;            /* GetMessages / ListSessions; 1000 */
	uint32_t max_response_bytes;       /* one GetMessages page; 4,000,000
					    * (gRPC clients accept 4 MiB) */
	int64_t idempotency_ttl_us;        /* how long keys are kept; 24 h */
	/* The context pipeline (server/context.h): the CONTEXT view, Reduce,
	 * automatic compaction. Borrowed; must outlive the service. NULL:
	 * no default pipeline and no automatic compaction. */
	struct histd_context *context;
	/* Threads for the calls that may wait on a provider (Reduce, and
	 * Search in SEMANTIC or HYBRID mode) when the transport takes
	 * deferred answers: started as needed, at most this many; default
	 * 16. 0 runs such calls on the caller's thread. */
	uint32_t provider_call_threads;
} histd_service_config;

/* Fills the defaults above. */
void histd_service_config_default(histd_service_config *cfg);

/* Who is calling: the tenant every session lookup is scoped to. */
typedef struct histd_caller {
	const char *tenant;
	int read_only;
} histd_caller;

/* The answer to one unary call. */
typedef struct histd_reply {
	/* The packed response, malloc'ed (freed with free() by the
	 * transport). Set only on success. */
	uint8_t *data;
	size_t len;
	/* With HISTD_ECONFLICT: the session's current revision, which the
	 * transport sends as trailing metadata "histd-revision". */
	uint64_t current_revision;
	/*
	 * Set by the transport, or NULL: how an answer that waits for the
	 * driver (durability, or the whole result), or for a provider-call
	 * thread (Reduce, SEMANTIC and HYBRID Search), is given without
	 * holding the calling thread. The service then returns 0 with `deferred` set and calls
	 * finish(finish_ctx, ...) exactly once, possibly from another thread
	 * and possibly before it returns: rc 0 with the packed response
	 * (malloc'ed, the callee's), or the error with its message (and
	 * with HISTD_ECONFLICT the current revision, else 0).
	 */
	void (*finish)(void *ctx, int rc, uint8_t *data, size_t len,
		       const char *msg, uint64_t current_revision);
	void *finish_ctx;
	int deferred;
	/* Set by the transport with finish: the call's deadline
	 * (histd_mono_us clock; 0: none). A call queued for a provider-call
	 * thread past it is not run; Search's query embedding ends by it. */
	int64_t deadline_us;
} histd_reply;

typedef struct histd_service histd_service;

/* The driver is borrowed and must outlive the service. */
int histd_service_new(histd_service **out, histd_driver *d,
		      const histd_service_config *cfg);
void histd_service_free(histd_service *s);

histd_driver *histd_service_driver(histd_service *s);
const histd_service_config *histd_service_get_config(histd_service *s);

/*
 * Runs one unary method on a packed request. Returns 0 with reply->data set,
 * or a negative HISTD_E* code with the thread's error message naming what
 * is wrong (EINVALID for a request that does not decode: "request does not
 * decode as histd.v1.AppendRequest"). m must not be HISTD_M_SUBSCRIBE.
 */
int histd_service_unary(histd_service *s, enum histd_method m,
			const histd_caller *who, const uint8_t *req,
			size_t len, histd_reply *reply);

/*
 * Checks a request's bytes before they are unpacked: EINVALID if it nests
 * messages too deeply (protobuf-c would recurse without limit) or a string
 * field holds a NUL character (its C string would end there), naming the
 * field. Malformed bytes pass: unpacking refuses them.
 */
int histd_check_request_bytes(const ProtobufCMessageDescriptor *d,
			      const uint8_t *p, size_t len);

/*
 * Validates a map<string, string> of a request (its n entries, `field` its
 * name for errors: at most 64 pairs, keys 1..63 characters of
 * [A-Za-z0-9._/-], values at most 256 bytes) and returns its pairs sorted
 * by key, keys unique (a repeated key: the last one wins, as proto maps
 * say). The strings are borrowed from the request; *out is malloc'ed
 * (NULL when empty) and freed with free().
 */
int histd_kv_collect(ProtobufCMessage *const *entries, size_t n,
		     const char *field, histd_kv **out, size_t *n_out);

/* Checks a session id: 1..128 characters of [A-Za-z0-9._:-]. EINVALID
 * naming `field` otherwise. */
int histd_check_session_id(const char *id, const char *field);

#endif
