/*
 * Chat-completions-shaped formats (internal): OpenAI Chat Completions and
 * Mistral chat completions share their shape, {"messages": [{role,
 * content, tool_calls, tool_call_id}]}, and differ in details this dialect
 * struct names.
 */
#ifndef HISTD_CHAT_H
#define HISTD_CHAT_H

#include "provider.h"

typedef struct histd_chat_dialect {
	const char *key;            /* provider_state key */
	int developer_role;         /* "developer" is a system role */
	int refusal;                /* assistant refusal (field and part) */
	int file_parts;             /* {"type":"file","file":{file_data}} */
	int document_url;           /* {"type":"document_url"} (Mistral) */
	int thinking_chunks;        /* {"type":"thinking"} (Mistral) */
	int args_object;            /* function.arguments may be an object */
	int image_url_string;       /* image_url is a string by default */
	int tool_name;              /* tool messages carry "name" */
	int empty_content_null;     /* assistant with only calls: null */
} histd_chat_dialect;

int histd_chat_import(const histd_chat_dialect *d, histd_imp *im,
		      json_t *root);
int histd_chat_export(const histd_chat_dialect *d, histd_exp *ex,
		      Histd__V1__Message *const *m, size_t n, json_t **out);

/* Summaries: the request and answer of chat completions. */
json_t *histd_chat_summary_request(const histd_summary_call *c,
				   const char *max_tokens_key);
int histd_chat_summary_response(json_t *root, histd_summary_result *out);

#endif
