/*
 * A histd_summarizer per provider: renders the messages as text, sends the
 * provider's summarization request through the shared HTTP layer and reads
 * the text, model and usage from its answer.
 */
#include "provider_summarizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "providers/provider.h"

static const char default_prompt[] =
	"You compact the history of a conversation between a user, an AI "
	"assistant and its tools. Write a concise summary that another model "
	"can continue from: the user's goals and constraints, decisions "
	"made, facts and results obtained from tools (with identifiers, "
	"paths and numbers), and what remains to be done. If a previous "
	"summary is given, merge it with the new messages into one summary. "
	"Answer with the summary only.";

typedef struct provider_summarizer {
	histd_summarizer base;
	const histd_format_ops *ops;
	histd_http *http;
	int own_http;
	char *url;
	char *auth_header;      /* holds the key: wiped on free */
	char *model;
	char *prompt;
	char *key_env;          /* where the key came from; NULL: given */
	uint32_t max_output_tokens;
	uint32_t timeout_ms;
} provider_summarizer;

static void
wipe_free(char *s)
{
	if (s) {
		explicit_bzero(s, strlen(s));
		free(s);
	}
}

static void
ps_free(histd_summarizer *s)
{
	provider_summarizer *p = (provider_summarizer *)s;

	if (!p)
		return;
	if (p->own_http)
		histd_http_free(p->http);
	free(p->url);
	wipe_free(p->auth_header);
	free(p->model);
	free(p->prompt);
	free(p->key_env);
	free(p);
}

static int
ps_summarize(histd_summarizer *s, const histd_summary_request *req,
	     histd_summary_result *out)
{
	provider_summarizer *p = (provider_summarizer *)s;
	const char *headers[2];
	size_t n_headers = 0;
	histd_summary_call call;
	histd_summary_result res = { 0 };
	histd_http_response resp;
	json_t *body = NULL, *answer;
	char *input, *text = NULL;
	int rc;

	if (!(input = histd_render_transcript(req->previous, req->messages,
					      req->n_messages)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	call.model = p->model;
	call.instructions = req->prompt ? req->prompt : p->prompt;
	call.input = input;
	call.max_output_tokens = req->max_output_tokens
		? req->max_output_tokens : p->max_output_tokens;
	body = p->ops->summary_request(&call);
	free(input);
	if (!body || !(text = json_dumps(body, JSON_COMPACT))) {
		json_decref(body);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	json_decref(body);
	headers[n_headers++] = p->auth_header;
	if (p->ops->auth == HISTD_AUTH_ANTHROPIC)
		headers[n_headers++] = "anthropic-version: 2023-06-01";
	rc = histd_http_post(p->http, p->url, headers, n_headers, text,
			     strlen(text),
			     req->timeout_ms ? req->timeout_ms : p->timeout_ms,
			     &resp);
	free(text);
	if (rc) {
		/* The state key is the provider's short name, as sessions
		 * name the summarizer ("anthropic", "openai_chat", ...). */
		rc = histd_http_error_name(rc, p->ops->key, p->key_env,
					   &resp);
		histd_http_response_clear(&resp);
		return rc;
	}
	answer = json_loadb(resp.body, resp.len, 0, NULL);
	histd_http_response_clear(&resp);
	if (!answer || !json_is_object(answer)) {
		json_decref(answer);
		return histd_error_set(HISTD_EUNAVAILABLE, "%s: provider answer "
				       "is not a JSON object", p->ops->key);
	}
	rc = p->ops->summary_response(answer, &res);
	json_decref(answer);
	if (rc) {
		/* Named like the HTTP layer's errors: which provider. */
		char was[256];

		snprintf(was, sizeof(was), "%s", histd_error_message());
		return histd_error_set(rc, "%s: %s", p->ops->key, was);
	}
	if (!res.model[0]) {
		/* Some answers omit the model: report the one asked for. */
		free(res.model);
		if (!(res.model = strdup(p->model))) {
			histd_summary_result_clear(&res);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
	}
	/* The host cuts a text past this many tokens of histd's estimate.
	 * The provider counts its own tokens, which the estimate can
	 * exceed (non-Latin scripts): cut only far past what was asked. */
	res.max_output_tokens = call.max_output_tokens > UINT32_MAX / 2
		? UINT32_MAX : call.max_output_tokens * 2;
	*out = res;
	return 0;
}

static const histd_format_ops *
ops_for(const char *name)
{
	Histd__V1__Format f;

	if (!name)
		return NULL;
	if (histd_format_parse(name, &f)) {
		histd_error_clear();
		return NULL;
	}
	return histd_format_ops_get(f);
}

int
histd_provider_summarizer_open(const histd_provider_options *o,
			       histd_summarizer **out)
{
	const histd_format_ops *ops = ops_for(o->provider);
	const char *key = o->api_key, *env, *base;
	provider_summarizer *p;
	histd_http_config hc;
	int rc, n;

	if (!ops)
		return histd_error_set(HISTD_EINVALID, "provider is not one of "
				       "anthropic, openai, openai_responses, "
				       "gemini, mistral");
	if (!o->model || !*o->model)
		return histd_error_set(HISTD_EINVALID, "model is required");
	env = o->api_key_env && *o->api_key_env ? o->api_key_env
						: ops->key_env;
	if (!key || !*key)
		key = getenv(env);
	if (!key || !*key)
		return histd_error_set(HISTD_EINVALID, "no API key: %s is not "
				       "set", env);
	if (!(p = calloc(1, sizeof(*p))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	p->base.version = HISTD_SUMMARIZER_VERSION;
	p->base.name = ops->name;
	p->base.summarize = ps_summarize;
	p->base.free = ps_free;
	p->ops = ops;
	p->max_output_tokens = o->max_output_tokens ? o->max_output_tokens
						    : 1024;
	p->timeout_ms = o->timeout_ms ? o->timeout_ms : 120000;
	base = o->base_url && *o->base_url ? o->base_url
					   : ops->default_base_url;
	switch (ops->auth) {
	case HISTD_AUTH_ANTHROPIC:
		n = asprintf(&p->auth_header, "x-api-key: %s", key);
		break;
	case HISTD_AUTH_GOOGLE:
		n = asprintf(&p->auth_header, "x-goog-api-key: %s", key);
		break;
	default:
		n = asprintf(&p->auth_header, "Authorization: Bearer %s", key);
		break;
	}
	if (n < 0)
		p->auth_header = NULL;
	p->url = ops->summary_url(base, o->model);
	p->model = strdup(o->model);
	p->prompt = strdup(o->prompt && *o->prompt ? o->prompt
						   : default_prompt);
	if (!(o->api_key && *o->api_key))
		p->key_env = strdup(env);
	if (!p->auth_header || !p->url || !p->model || !p->prompt ||
	    (!(o->api_key && *o->api_key) && !p->key_env)) {
		ps_free(&p->base);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	if (o->http) {
		p->http = o->http;
	} else {
		if (!o->http_config)
			histd_http_config_default(&hc);
		if ((rc = histd_http_new(&p->http, o->http_config
							 ? o->http_config
							 : &hc))) {
			ps_free(&p->base);
			return rc;
		}
		p->own_http = 1;
	}
	*out = &p->base;
	return 0;
}
