/*
 * OpenAI Chat Completions: {"messages": [...]} with system or developer
 * messages, user parts (text, image_url, file), assistant text, refusal
 * and tool_calls (arguments as a JSON string), and tool messages. Chat
 * takes no reasoning as input: reasoning blocks are dropped on export.
 */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>

static const histd_chat_dialect dialect = {
	.key = "openai_chat",
	.developer_role = 1,
	.refusal = 1,
	.file_parts = 1,
	.empty_content_null = 1,
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
	return histd_chat_summary_request(c, "max_completion_tokens");
}

const histd_format_ops histd_format_openai_chat = {
	.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT,
	.name = "openai_chat",
	.key = "openai_chat",
	.import = import,
	.export = export,
	.default_base_url = "https://api.openai.com",
	.key_env = "OPENAI_API_KEY",
	.auth = HISTD_AUTH_BEARER,
	.summary_url = summary_url,
	.summary_request = summary_request,
	.summary_response = histd_chat_summary_response,
};
