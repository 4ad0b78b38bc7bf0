/*
 * A stub LLM provider on loopback (libmicrohttpd), for tests of the HTTP
 * layer and the summarizers. It answers every POST in the wire format its
 * path names (/v1/messages: Anthropic; /v1/chat/completions: OpenAI Chat
 * and Mistral; /v1/responses: OpenAI Responses; /v1beta/models/...:
 * Gemini) unless a scripted reply is queued: a status, a Retry-After, a
 * delay, a body (malformed on purpose, if the test wants).
 */
#ifndef HISTD_STUB_PROVIDER_H
#define HISTD_STUB_PROVIDER_H

typedef struct stub stub;

typedef struct stub_reply {
	int status;          /* 0: 200 */
	int retry_after;     /* seconds; < 0: no header */
	int delay_ms;        /* sleep before answering */
	const char *body;    /* NULL: the default answer of the path */
} stub_reply;

/* Starts on 127.0.0.1, an ephemeral port; NULL on failure. */
stub *stub_start(void);
void stub_stop(stub *s);
/* "http://127.0.0.1:<port>" (borrowed). */
const char *stub_url(stub *s);
/* Queues a reply for the next request (FIFO). */
void stub_push(stub *s, stub_reply r);
/* Requests received so far. */
unsigned stub_requests(stub *s);
/* The most requests answered at the same time. */
unsigned stub_max_concurrent(stub *s);
/* Copies of what the last request carried (malloc'ed; NULL if none). */
char *stub_last_body(stub *s);
char *stub_last_path(stub *s);
char *stub_last_header(stub *s, const char *name);

#endif
