/*
 * Mistral chat completions: the chat completions shape (chat.c) with
 * Mistral's chunks: image_url as a string, document_url, thinking chunks
 * (reasoning text, kept on export), tool_calls whose arguments may be an
 * object, and tool messages that name their tool.
 */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>

static const histd_chat_dialect dialect = {
	.key = "mistral",
	.document_url = 1,
	.thinking_chunks = 1,
	.args_object = 1,
	.image_url_string = 1,
	.tool_name = 1,
};

static int
import(histd_imp *im, json_t *root)
{
	return histd_chat_import(&dialect, im, root);
}

static int
export(histd_exp *ex, Histd__V1__Message *const *m, size_t n, json_t **out)
{
	return histd_chat_export(&dialect, ex, m, n, out);
}

static char *
summary_url(const char *base, const char *model)
{
	char *s;

	(void)model;
	return asprintf(&s, "%s/v1/chat/completions", base) < 0 ? NULL : s;
}

static json_t *
summary_request(const histd_summary_call *c)
{
	return histd_chat_summary_request(c, "max_tokens");
}

const histd_format_ops histd_format_mistral = {
	.format = HISTD__V1__FORMAT__FORMAT_MISTRAL,
	.name = "mistral",
	.key = "mistral",
	.import = import,
	.export = export,
	.default_base_url = "https://api.mistral.ai",
	.key_env = "MISTRAL_API_KEY",
	.auth = HISTD_AUTH_BEARER,
	.summary_url = summary_url,
	.summary_request = summary_request,
	.summary_response = histd_chat_summary_response,
};
