/*
 * Summarizers backed by an LLM provider (see summarizer.h for the
 * interface): one per provider format, each asking its provider's API for a
 * summary of the rendered transcript and reporting model and usage.
 */
#ifndef HISTD_PROVIDER_SUMMARIZER_H
#define HISTD_PROVIDER_SUMMARIZER_H

#include "http.h"
#include "summarizer.h"

typedef struct histd_provider_options {
	/* Required: "anthropic", "openai" (Chat Completions),
	 * "openai_responses", "gemini", "mistral" (or a histd_format_name). */
	const char *provider;
	/* Required: the model asked for summaries. */
	const char *model;
	/* NULL: the provider's public endpoint. Tests point it at a stub. */
	const char *base_url;
	/* The API key. NULL: read from the variable api_key_env names, or
	 * from the provider's usual one (ANTHROPIC_API_KEY, OPENAI_API_KEY,
	 * GEMINI_API_KEY, MISTRAL_API_KEY). Copied; never logged. */
	const char *api_key;
	const char *api_key_env;
	/* NULL: a default instruction to summarize for a later model turn. */
	const char *prompt;
	/* 0: 1024. */
	uint32_t max_output_tokens;
	/* The whole call, retries included; 0: 120000. A request's own
	 * timeout_ms, if set, wins. */
	uint32_t timeout_ms;
	/* A shared HTTP layer (borrowed, outlives the summarizer); NULL: the
	 * summarizer makes its own from http_config (NULL: defaults). */
	histd_http *http;
	const histd_http_config *http_config;
} histd_provider_options;

/*
 * Opens a provider summarizer. 0 with *out (freed through its free
 * callback), EINVALID naming the missing option (unknown provider, no
 * model, no API key: the message names the variable, never a value), or
 * ENOMEM.
 */
int histd_provider_summarizer_open(const histd_provider_options *o,
				   histd_summarizer **out);

#endif
