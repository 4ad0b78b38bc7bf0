/*
 * The Search RPC: lexical (BM25, by the driver), semantic (cosine of
 * embeddings, by the driver, with the query embedded here through an
 * embedder) and hybrid (reciprocal rank fusion of both), over one session,
 * the sessions matching labels, or the whole tenant.
 *
 * Semantic scope: each session in scope is searched by its own embedding
 * model (SessionConfig.embeddings, else the server's default); sessions
 * grouped by (provider, model) are searched with one query vector per
 * group. A session with no embedding configuration, or whose provider the
 * server cannot call, is searched lexically instead and listed in
 * lexical_fallback_sessions. When one response mixes rankings (several
 * groups, fallbacks, or HYBRID), scores are reciprocal rank fusion scores,
 * sum of 1 / (60 + rank), comparable within the response.
 *
 * Thread-safe: called by any number of handler threads at once.
 */
#ifndef HISTD_SEARCH_H
#define HISTD_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "driver.h"
#include "histd/v1/histd.pb-c.h"

/*
 * What computes a query's embedding. embed: the vector of `text` by
 * provider/model (model "" : the provider's default; *model_out then names
 * the model the vectors are stored under: borrowed, static or owned by the
 * embedder); *v malloc'ed (caller frees), *dim its length, nothing
 * allocated on error. deadline_us (histd_mono_us clock; 0: none) is the
 * caller's: the provider call ends by it at the latest (or by the
 * embedder's own timeout, if sooner), and is not made once it has passed
 * (EUNAVAILABLE). EUNAVAILABLE (provider not configured or unreachable,
 * or the time is up) makes the sessions of that model fall back to
 * lexical search. Called from handler threads.
 */
typedef struct histd_search_embedder {
	int (*embed)(void *ctx, const char *provider, const char *model,
		     const char *text, int64_t deadline_us, float **v,
		     uint32_t *dim, const char **model_out);
	/* The default for sessions whose config names no embeddings:
	 * provider "" for none. */
	const char *default_provider;
	const char *default_model;
	void *ctx;
	/* Optional: told of every session a semantic or hybrid search
	 * covers by meaning, with its last seq and its life
	 * (histd_session.incarnation), so that messages stored without a
	 * vector get one later (lazy backfill). Called from handler
	 * threads; must not block. */
	void (*backfill)(void *ctx, const char *tenant, const char *session_id,
			 uint64_t last_seq, uint64_t life);
} histd_search_embedder;

/* Sets the process's embedder (NULL: none, every semantic search falls
 * back to lexical). Set once at start, before calls are served; the
 * struct is borrowed and must outlive the server. */
void histd_search_set_embedder(const histd_search_embedder *e);

/*
 * Runs Search for `tenant` on the unpacked request r (alloc: the call's
 * arena, used for the response's messages). deadline_us: the caller's
 * deadline (histd_mono_us clock; 0: none); a query embedding gets at most
 * the time left before it, and none once it has passed. On success *out is
 * the packed SearchResponse (malloc'ed) and *out_len its length. EINVALID
 * naming the field (query, k, roles, mode, label_selector, session_id);
 * ENOTFOUND for an unknown session_id; EUNAVAILABLE when the deadline
 * passed before a query could be embedded (the caller has gone: no
 * fallback is searched for it); the driver's errors as they are.
 */
int histd_search_rpc(histd_driver *d, const char *tenant,
		     const Histd__V1__SearchRequest *r, int64_t deadline_us,
		     ProtobufCAllocator *alloc, uint8_t **out, size_t *out_len);

/* The effective embedding (provider, model) of a packed SessionConfig
 * (NULL config: none), with the embedder's default when it names none:
 * 1 and the two strings set (borrowed from *cfg, the embedder or the
 * provider's default model when the config names none), or 0
 * for no embeddings; ENOMEM, or ECORRUPT for bytes that do not decode
 * (*cfg NULL), never taken for "no embeddings". *cfg is freed with
 * histd__v1__session_config__free_unpacked(cfg, NULL) by the caller. */
int histd_search_session_embedding(const uint8_t *config, size_t len,
				   Histd__V1__SessionConfig **cfg,
				   const char **provider, const char **model);

#endif
