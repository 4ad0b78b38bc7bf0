/*
 * Embedding clients: the vector of a text by a provider's embedding
 * endpoint, for semantic search (server/embedder.c, server/search.c).
 *
 *   openai   POST {base}/v1/embeddings {"model", "input": [texts]}
 *            -> {"data": [{"index", "embedding": [floats]}], "model"}
 *   mistral  the same path and shapes as OpenAI's
 *   gemini   POST {base}/v1beta/models/{model}:embedContent
 *            {"content": {"parts": [{"text"}]}} -> {"embedding": {"values"}}
 *            and, for more than one text, :batchEmbedContents
 *            {"requests": [{"model": "models/{model}", "content": ...}]}
 *            -> {"embeddings": [{"values"}]}
 *
 * Calls go through the shared HTTP layer (http.h: timeouts, retries with
 * backoff, Retry-After, the cap on concurrent calls) and its error codes,
 * with messages naming the provider (histd_http_error_name): EUNAVAILABLE,
 * ELIMIT, EPRECONDITION (the provider refused histd's key or request); an
 * answer that is not the expected JSON is EUNAVAILABLE naming what is
 * missing. The API key comes
 * from the environment (or the options), is kept only in the request
 * header, wiped when the client is freed, and never logged.
 *
 * Threads: histd_embeddings_embed may be called from any number of threads
 * at once on one client.
 */
#ifndef HISTD_EMBEDDINGS_H
#define HISTD_EMBEDDINGS_H

#include <stddef.h>
#include <stdint.h>

#include "http.h"

/* Texts one call may embed (larger batches are the caller's to split). */
#define HISTD_EMBED_BATCH_MAX 96
/* Longest vector accepted from a provider. */
#define HISTD_EMBED_DIM_MAX 16384

typedef struct histd_embeddings histd_embeddings;

typedef struct histd_embeddings_options {
	/* Required: "openai", "gemini" or "mistral". */
	const char *provider;
	/* NULL or "": the provider's public endpoint. Tests point it at a
	 * stub. */
	const char *base_url;
	/* The API key. NULL: read from the variable api_key_env names, or
	 * from the provider's usual one (OPENAI_API_KEY, GEMINI_API_KEY,
	 * MISTRAL_API_KEY). Copied; never logged. */
	const char *api_key;
	const char *api_key_env;
	/* One call, retries included; 0: 30000. */
	uint32_t timeout_ms;
	/* The shared HTTP layer (borrowed, outlives the client); required. */
	histd_http *http;
} histd_embeddings_options;

/* Whether name is a provider with an embedding endpoint. */
int histd_embeddings_known(const char *provider);

/* The model used when a session names none ("text-embedding-3-small",
 * "gemini-embedding-001", "mistral-embed"); NULL for an unknown provider.
 * Static. */
const char *histd_embeddings_default_model(const char *provider);

/*
 * Opens a client. 0 with *out (histd_embeddings_free); EINVALID for an
 * unknown provider, no http, or no API key (the message names the
 * variable, never a value); ENOMEM.
 */
int histd_embeddings_open(const histd_embeddings_options *o,
			  histd_embeddings **out);
void histd_embeddings_free(histd_embeddings *e);

/* The provider's name (static). */
const char *histd_embeddings_provider(const histd_embeddings *e);

/*
 * Embeds n texts (1..HISTD_EMBED_BATCH_MAX, UTF-8, non-empty) with model
 * ("" or NULL: the provider's default), within timeout_ms (the whole call,
 * retries included: the smaller of it and the client's timeout_ms; 0: the
 * client's). On success *out holds n * *dim
 * floats, text i's vector at (*out)[i * *dim] (malloc'ed, the caller's),
 * all of one dimension. Errors as the header says; EINVALID also for bad
 * arguments (a model name is 1..128 of [A-Za-z0-9._-]: it goes into
 * Gemini's URL). Nothing is allocated on error.
 */
int histd_embeddings_embed(histd_embeddings *e, const char *model,
			   const char *const *texts, size_t n,
			   uint32_t timeout_ms, float **out, uint32_t *dim);

#endif
