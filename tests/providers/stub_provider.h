/*
 * A stub LLM provider on loopback (libmicrohttpd), for tests of the HTTP
 * layer and the summarizers. It answers every POST in the wire format its
 * path names (/v1/messages: Anthropic; /v1/chat/completions: OpenAI Chat
 * and Mistral; /v1/responses: OpenAI Responses; /v1beta/models/...:
 * Gemini) unless a scripted reply is queued: a status, a Retry-After, a
 * delay, a body (malformed on purpose, if the test wants).
 *
 * Embeddings: /v1/embeddings (OpenAI, Mistral) and /v1beta/models/
 * <model>:embedContent / :batchEmbedContents (Gemini) answer with
 * stub_embed_text's vector of every input, so that tests know the nearest
 * neighbours of a query.
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

/* A delay before every answer (scripted delays add to it); 0: none. */
void stub_set_delay(stub *s, int delay_ms);
/* Embedding requests answered so far, and the texts they carried. */
unsigned stub_embed_requests(stub *s);
unsigned stub_embed_texts(stub *s);

#define STUB_EMBED_DIM 64
/* The stub's embedding: every lowercased run of ASCII letters and digits
 * hashed (FNV-1a) into one of STUB_EMBED_DIM counts, normalized to length
 * 1 (a text without a word: the first unit vector). Texts sharing words
 * are near; texts sharing none are orthogonal unless their words collide. */
void stub_embed_text(const char *text, float v[STUB_EMBED_DIM]);

#endif
