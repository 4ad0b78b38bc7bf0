/*
 * An in-process full-text index for the drivers that keep their messages in
 * memory (memory, file): BM25 over the words of one tenant's messages,
 * maintained as messages come and go.
 *
 * What is indexed (driver.h, histd_search_query): from each packed Message
 * the text of text blocks, the text and summary of reasoning blocks, the
 * name and arguments of tool calls ("main" text), and the text blocks
 * inside tool results ("tool" text, counted only by searches that ask for
 * it). Tokens: maximal runs of Unicode letters and digits (as glibc's
 * C.UTF-8 classes them) and combining marks; symbols, emoji, spaces and
 * punctuation separate them. ASCII, Latin-1, Greek (with tonos and dialytika too) and
 * Cyrillic capitals are lowercased, and Greek final sigma is sigma.
 * No stemming and no stop words: "run" does not find "running". Tokens
 * longer than 64 bytes are cut there. The query is tokenized the same way;
 * its distinct tokens (at most 32) are OR'ed.
 *
 * Scoring: BM25 with k1 = 1.2, b = 0.75, idf = ln(1 + (N - df + 0.5) /
 * (df + 0.5)), where N, df and the average length are over the tenant's
 * live messages (with tool text or without, as the query asks), whatever
 * the scope: scores are comparable across scopes of one tenant.
 *
 * Structure: messages are documents numbered in the order they were
 * indexed; each term keeps its postings as delta-encoded varints
 * (document, frequencies), append-only. Removing a session's messages
 * (clear, replace, delete) marks its documents dead at once, so they never
 * match again; when the dead outnumber the live, the index rewrites its
 * postings without them.
 *
 * Sessions are known by a key the driver chooses (a uint64 that stays the
 * same for the session's life: the memory and file drivers use the
 * address of their session struct, which cannot be reused while the
 * session is in the index, since delete forgets it first) and by id.
 *
 * Threads: every function may be called from any thread; the index has its
 * own read-write lock, taken innermost (it never waits for another lock
 * while holding its own). A driver calls histd_index_sync for a session
 * only while holding what serializes that session's writes, so a session's
 * syncs, clears and forgets come in the order of its changes.
 */
#ifndef HISTD_INDEX_H
#define HISTD_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"

typedef struct histd_index histd_index;

int histd_index_new(histd_index **out);
void histd_index_free(histd_index *ix);

/*
 * Brings the session's documents up to date with its stored messages:
 * indexes every record of recs (seq order, n of them, the session's whole
 * array) with a seq above the last one this session had indexed. So the
 * same call serves an append (only the new tail is read) and a first build
 * (everything is). On ENOMEM the index is marked incomplete (see
 * histd_index_incomplete) and what is missing is not indexed.
 */
int histd_index_sync(histd_index *ix, uint64_t key, const char *id,
		     const histd_record *recs, size_t n);

/* Clear, and the first half of replace: the session's documents are dead
 * from now on; later syncs index seqs above the last one seen. */
void histd_index_clear(histd_index *ix, uint64_t key);

/* Delete: the session is gone from the index. */
void histd_index_forget(histd_index *ix, uint64_t key);

/* Whether a sync failed (out of memory) since the index was made or
 * reset: the driver then resets it and syncs every session again. */
int histd_index_incomplete(histd_index *ix);

/* Forgets everything (sessions, documents, the incomplete mark). */
void histd_index_reset(histd_index *ix);

/* A hit: the session's key and id (borrowed from the index: valid until
 * the session is forgotten; copy it under the driver's locks), seq, score. */
typedef struct histd_index_hit {
	uint64_t key;
	const char *id;
	uint64_t seq;
	double score;
} histd_index_hit;

/* Whether a session is in the scope of a search: 1 or 0. Called under the
 * index's read lock, once per session the index holds: it must not call
 * into the index. */
typedef int (*histd_index_scope_fn)(void *ctx, uint64_t key, const char *id);

/*
 * The q->k best documents of the sessions in scope (scope NULL: every
 * session), best first (ties by id, then seq), filtered by q->roles and
 * q->exclude_newest, with q->include_tool_results; q's scope fields and
 * mode are not read. *hits (malloc'ed, n of them) is the caller's, and so
 * are the copies of the ids: free them with histd_index_hits_free. 0 or
 * EINVALID (no token in q->text) or ENOMEM.
 */
int histd_index_search(histd_index *ix, const histd_search_query *q,
		       histd_index_scope_fn scope, void *scope_ctx,
		       histd_index_hit **hits, size_t *n);
void histd_index_hits_free(histd_index_hit *hits, size_t n);

/* Bytes the index holds (for tests and the README's measurements). */
size_t histd_index_bytes(histd_index *ix);

/* ---------------------------------------------------------------------- */
/* Tokens and text, for other searchers (and tests)                        */

#define HISTD_INDEX_TOKEN_MAX 64

/* Calls fn for every token of text[0..len) (lowercased, NUL-terminated,
 * at most HISTD_INDEX_TOKEN_MAX bytes), in order. */
void histd_index_tokens(const char *text, size_t len,
			void (*fn)(void *ctx, const char *tok, size_t len),
			void *ctx);

/* The searchable pieces of a packed Message: fn(ctx, text, len, is_tool)
 * for each; *role is set to the message's role (0 if absent). Returns 0,
 * or -1 if the bytes do not parse (what came before was reported). */
int histd_index_message_text(const uint8_t *data, size_t len, uint32_t *role,
			     void (*fn)(void *ctx, const char *text,
					size_t len, int is_tool),
			     void *ctx);

/* ---------------------------------------------------------------------- */
/* Embedding vectors, as the in-process drivers keep them                  */

/* One stored vector: a message's embedding under a model. */
typedef struct histd_vec {
	uint64_t seq;
	uint32_t dim;
	uint8_t role;
	char *model;            /* malloc'ed with the struct: see vec_new */
	float v[];              /* dim floats, normalized to length 1 */
} histd_vec;

/* A session's vectors in seq order. */
typedef struct histd_vecs {
	histd_vec **v;
	size_t n, cap;
} histd_vecs;

/* A new vector (copied and normalized; the model copied); NULL if out of
 * memory or v has length 0. role: the message's role. Free with free(). */
histd_vec *histd_vec_new(uint64_t seq, uint8_t role, const char *model,
			 const float *v, uint32_t dim);
/* Puts x in seq order, replacing (and freeing) one of the same seq. 0 or
 * ENOMEM (x is then still the caller's). */
int histd_vecs_put(histd_vecs *s, histd_vec *x);
/* Drops every vector (clear, replace, delete). */
void histd_vecs_clear(histd_vecs *s);
/* Copies those with seq <= up_to (fork). 0 or ENOMEM (dst cleared). */
int histd_vecs_copy(histd_vecs *dst, const histd_vecs *src, uint64_t up_to);
/* Bytes held. */
size_t histd_vecs_bytes(const histd_vecs *s);

/* Role of a packed Message (0 if absent or unparsable). */
uint32_t histd_index_message_role(const uint8_t *data, size_t len);

/*
 * A running top-k of (session, seq, score) candidates across sessions, for
 * semantic search: add candidates, then take them best first.
 */
typedef struct histd_topk {
	histd_index_hit *v;     /* ids borrowed from the caller */
	size_t n, k;
} histd_topk;

int histd_topk_init(histd_topk *t, size_t k);
void histd_topk_add(histd_topk *t, uint64_t key, const char *id,
		    uint64_t seq, double score);
/* Sorts best first; the array stays in t. */
void histd_topk_finish(histd_topk *t);
void histd_topk_free(histd_topk *t);

/* Cosine of a normalized stored vector with q (normalized by the caller,
 * of the same dim). */
double histd_vec_cosine(const histd_vec *x, const float *q);
/* Normalizes v[0..dim) in place; 0, or -1 for a zero vector. */
int histd_vec_normalize(float *v, uint32_t dim);

/* Semantic search over one session's vectors: adds to t the vectors of
 * model/dim with a role in roles (0: all) and a cosine with qn above 0
 * (driver.h: search), skipping seq == skip_seq (0: none). qn: the
 * normalized query. */
void histd_vecs_search(const histd_vecs *s, histd_topk *t, uint64_t key,
		       const char *id, const char *model, uint32_t dim,
		       const float *qn, uint32_t roles, uint64_t skip_seq);

#endif
