/*
 * Anthropic Messages: {"system": string | [text blocks], "messages": [{role
 * "user" | "assistant", content: string | [blocks]}]}.
 *
 * Blocks: text, image and document (source base64 | url | text), thinking
 * (with its signature) and redacted_thinking, tool_use (input is an object)
 * and tool_result (in a user message; content string or blocks). A user
 * message of tool results stays a user message here; tool messages of other
 * formats are merged into one user turn on export, as Anthropic wants the
 * results of parallel calls together.
 */
#include "provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY "anthropic"

static const char *const k_text[] = { "type", "text", NULL };
static const char *const k_media[] = { "type", "source", "title", NULL };
static const char *const k_source[] = { "type", "media_type", "data", "url",
					NULL };
static const char *const k_thinking[] = { "type", "thinking", "signature",
					  NULL };
static const char *const k_redacted[] = { "type", "data", NULL };
static const char *const k_tool_use[] = { "type", "id", "name", "input",
					  NULL };
static const char *const k_tool_result[] = { "type", "tool_use_id",
					     "content", "is_error", NULL };
static const char *const k_message[] = { "role", "content", NULL };

/* Block types Anthropic defines that histd has no block for: dropped. */
static const char *const unsupported[] = {
	"server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
	"code_execution_tool_result", "mcp_tool_use", "mcp_tool_result",
	"container_upload", "search_result", "bash_code_execution_tool_result",
	"text_editor_code_execution_tool_result", NULL,
};

static int
is_one_of(const char *s, const char *const *v)
{
	for (size_t i = 0; v[i]; i++)
		if (!strcmp(s, v[i]))
			return 1;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Import                                                                 */

/* image / document with a source object. *out NULL: dropped. */
static int
imp_media(histd_imp *im, json_t *blk, int doc, json_t *x,
	  Histd__V1__ContentBlock **out)
{
	const char *stype, *mt = NULL, *data = NULL, *url = NULL;
	const char *title = NULL;
	json_t *src;
	size_t p;
	uint8_t *bytes;
	size_t n;
	int rc;

	*out = NULL;
	if ((rc = histd_get_obj(im, blk, "source", 1, &src)))
		return rc;
	if (doc && (rc = histd_get_str(im, blk, "title", 0, &title)))
		return rc;
	p = histd_imp_key(im, "source");
	if ((rc = histd_get_str(im, src, "type", 1, &stype)))
		return rc;
	if ((rc = histd_extras_into(x, "$source", src, k_source)))
		return rc;
	if (!strcmp(stype, "base64") || (doc && !strcmp(stype, "text"))) {
		if ((rc = histd_get_str(im, src, "media_type", 1, &mt)) ||
		    (rc = histd_get_str(im, src, "data", 1, &data)))
			return rc;
		if (!*mt)
			return histd_imp_fail_at(im, "media_type", "is empty");
		if (!strcmp(stype, "text")) {
			n = strlen(data);
			if (!n)
				return histd_imp_fail_at(im, "data", "is empty");
			if (!(bytes = malloc(n)))
				return histd_error_set(HISTD_ENOMEM,
						       "out of memory");
			memcpy(bytes, data, n);
			if (json_object_set_new(x, "$source_type",
						json_string("text")))
				return free(bytes),
				       histd_error_set(HISTD_ENOMEM,
						       "out of memory");
		} else {
			if (histd_b64_decode(data, strlen(data), &bytes, &n))
				return histd_imp_fail_at(im, "data",
							 "not valid base64");
			if (!n) {
				free(bytes);
				return histd_imp_fail_at(im, "data",
							 "is empty");
			}
			if (doc && !strcmp(mt, "text/plain") &&
			    json_object_set_new(x, "$source_type",
						json_string("base64")))
				return free(bytes),
				       histd_error_set(HISTD_ENOMEM,
						       "out of memory");
		}
		if (!doc && !histd_image_type(mt)) {
			free(bytes);
			return histd_imp_fail_at(im, "media_type",
				"not one of image/png, image/jpeg, image/gif, "
				"image/webp");
		}
		*out = doc ? histd_blk_doc_data(bytes, n, mt, title)
			   : histd_blk_image_data(bytes, n, mt);
	} else if (!strcmp(stype, "url")) {
		if ((rc = histd_get_str(im, src, "url", 1, &url)))
			return rc;
		if (!*url)
			return histd_imp_fail_at(im, "url", "is empty");
		if ((rc = histd_imp_check_url(im, "url", url)))
			return rc;
		*out = doc ? histd_blk_doc_url(url, NULL, title)
			   : histd_blk_image_url(url, NULL);
	} else {
		/* file ids and custom content: nothing histd can hold. */
		rc = histd_imp_drop(im, "a %s source histd does not keep",
				    doc ? "document" : "image");
		histd_imp_pop(im, p);
		return rc;
	}
	histd_imp_pop(im, p);
	return *out ? 0 : histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int imp_blocks(histd_imp *im, json_t *arr, Histd__V1__Message *m,
		      Histd__V1__ToolResultBlock *into);

/* tool_result content: string, array of blocks, or absent. */
static int
imp_result_content(histd_imp *im, json_t *blk, Histd__V1__ToolResultBlock *r,
		   json_t *x)
{
	json_t *c = json_object_get(blk, "content");
	size_t p;
	int rc;

	if (!c)
		return 0;
	p = histd_imp_key(im, "content");
	if (json_is_string(c)) {
		if (json_object_set_new(x, "$content", json_string("string")))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		if (json_string_length(c) &&
		    (rc = histd_result_add(r, histd_blk_text(
						  json_string_value(c)))))
			return rc;
	} else if (json_is_array(c)) {
		if (json_object_set_new(x, "$content", json_string("array")))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		if ((rc = imp_blocks(im, c, NULL, r)))
			return rc;
	} else {
		return histd_imp_fail(im, "expected a string or an array");
	}
	histd_imp_pop(im, p);
	return 0;
}

/* One block into m (or into the tool result r: nested). */
static int
imp_block(histd_imp *im, json_t *blk, Histd__V1__Message *m,
	  Histd__V1__ToolResultBlock *r)
{
	Histd__V1__ContentBlock *b = NULL;
	const char *type, *s, *sig, *id, *name;
	json_t *x = NULL, *in;
	int rc, flag;
	int role = m ? (int)m->role : 0;

	if ((rc = histd_expect_obj(im, blk)) ||
	    (rc = histd_get_str(im, blk, "type", 1, &type)))
		return rc;
	/* Kinds histd does not keep are dropped (and listed) wherever they
	 * are, as Anthropic allows some inside a tool_result too. */
	if (r && is_one_of(type, unsupported))
		return histd_imp_drop(im, "a %s block histd does not keep",
				      type);
	if (r && strcmp(type, "text") && strcmp(type, "image") &&
	    strcmp(type, "document"))
		return histd_imp_fail_at(im, "type", "a tool_result may hold "
					 "only text, image and document");
	if (!strcmp(type, "text")) {
		if ((rc = histd_get_str(im, blk, "text", 1, &s)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "text", "is empty");
		x = histd_extras(blk, k_text);
		b = histd_blk_text(s);
	} else if (!strcmp(type, "image") || !strcmp(type, "document")) {
		int doc = type[0] == 'd';

		x = histd_extras(blk, k_media);
		if (!x)
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		if ((rc = imp_media(im, blk, doc, x, &b)))
			goto out;
		if (!b)
			goto out;
	} else if (!strcmp(type, "thinking") ||
		   !strcmp(type, "redacted_thinking")) {
		if (role != HISTD__V1__ROLE__ROLE_ASSISTANT)
			return histd_imp_fail_at(im, "type", "reasoning only in "
						 "assistant messages");
		if (type[0] == 't') {
			/* Anthropic requires the signature: export could not
			 * write thinking without one. */
			if ((rc = histd_get_str(im, blk, "thinking", 1, &s)) ||
			    (rc = histd_get_str(im, blk, "signature", 1, &sig)))
				return rc;
			if (!*s && !*sig)
				return histd_imp_fail_at(im, "thinking",
							 "is empty");
			x = histd_extras(blk, k_thinking);
			b = histd_blk_reasoning(s, NULL, sig, NULL, 0, 0);
			/* An explicit empty signature is kept as such. */
			if (x && !*sig &&
			    json_object_set_new(x, "$signature",
						json_string("")))
				goto nomem;
		} else {
			if ((rc = histd_get_str(im, blk, "data", 1, &s)))
				return rc;
			if (!*s)
				return histd_imp_fail_at(im, "data", "is empty");
			x = histd_extras(blk, k_redacted);
			b = histd_blk_reasoning(NULL, NULL, NULL, s, strlen(s),
						1);
		}
		/* Marks the origin even without extras: signatures verify
		 * only with the provider that made them. */
		if (x && json_object_size(x) == 0 &&
		    json_object_set_new(x, "$origin", json_true()))
			goto nomem;
	} else if (!strcmp(type, "tool_use")) {
		char *args;

		if (role != HISTD__V1__ROLE__ROLE_ASSISTANT)
			return histd_imp_fail_at(im, "type", "tool_use only in "
						 "assistant messages");
		if ((rc = histd_get_str(im, blk, "id", 1, &id)) ||
		    (rc = histd_get_str(im, blk, "name", 1, &name)) ||
		    (rc = histd_get_obj(im, blk, "input", 1, &in)))
			return rc;
		if (!*id || strlen(id) > 128)
			return histd_imp_fail_at(im, "id", "must be 1..128 "
						 "bytes");
		if (!*name || strlen(name) > 128)
			return histd_imp_fail_at(im, "name", "must be 1..128 "
						 "bytes");
		if (!(args = histd_json_text(in)))
			goto nomem;
		x = histd_extras(blk, k_tool_use);
		b = histd_blk_tool_call(id, name, args);
		free(args);
		if ((rc = histd_calls_add(&im->calls, &im->n_calls,
					  &im->cap_calls, id, name)))
			goto out;
	} else if (!strcmp(type, "tool_result")) {
		if (role != HISTD__V1__ROLE__ROLE_USER)
			return histd_imp_fail_at(im, "type", "tool_result only "
						 "in user messages");
		if ((rc = histd_get_str(im, blk, "tool_use_id", 1, &id)) ||
		    (rc = histd_get_bool(im, blk, "is_error", &flag)))
			return rc;
		if (!*id || strlen(id) > 128)
			return histd_imp_fail_at(im, "tool_use_id", "must be "
						 "1..128 bytes");
		x = histd_extras(blk, k_tool_result);
		b = histd_blk_tool_result(id, histd_calls_name(im->calls,
							       im->n_calls, id),
					  flag);
		if (!x || !b)
			goto nomem;
		if (json_object_get(blk, "is_error") &&
		    json_object_set_new(x, "$is_error", json_true()))
			goto nomem;
		if ((rc = imp_result_content(im, blk, b->tool_result, x)))
			goto out;
	} else if (is_one_of(type, unsupported)) {
		return histd_imp_drop(im, "a %s block histd does not keep",
				      type);
	} else {
		return histd_imp_fail_at(im, "type", "not a known block type");
	}
	if (!x || !b)
		goto nomem;
	if ((rc = histd_blk_state(b, KEY, x)))
		goto out;
	json_decref(x);
	x = NULL;
	rc = r ? histd_result_add(r, b) : histd_msg_add(m, b);
	b = NULL;
out:
	if (b)
		histd__v1__content_block__free_unpacked(b, NULL);
	json_decref(x);
	return rc;
nomem:
	rc = histd_error_set(HISTD_ENOMEM, "out of memory");
	goto out;
}

static int
imp_blocks(histd_imp *im, json_t *arr, Histd__V1__Message *m,
	   Histd__V1__ToolResultBlock *into)
{
	json_t *e;
	size_t i, p;
	int rc;

	json_array_foreach(arr, i, e) {
		p = histd_imp_idx(im, i);
		if ((rc = imp_block(im, e, m, into)))
			return rc;
		histd_imp_pop(im, p);
	}
	return 0;
}

/* content of a message or of system: string or array; sets "$content". */
static int
imp_content(histd_imp *im, json_t *c, Histd__V1__Message *m, json_t *mx)
{
	int rc;

	if (json_is_string(c)) {
		if (json_object_set_new(mx, "$content", json_string("string")))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		if (!json_string_length(c))
			return histd_imp_fail(im, "is empty");
		return histd_msg_add(m, histd_blk_text(json_string_value(c)));
	}
	if (!json_is_array(c))
		return histd_imp_fail(im, "expected a string or an array");
	if (json_object_set_new(mx, "$content", json_string("array")))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if ((rc = imp_blocks(im, c, m, NULL)))
		return rc;
	if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM)
		for (size_t j = 0; j < m->n_content; j++)
			if (m->content[j]->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT)
				return histd_imp_fail(im, "system may hold "
						      "only text blocks");
	return 0;
}

static int
finish_message(histd_imp *im, Histd__V1__Message *m, json_t *mx)
{
	int rc = histd_msg_state(m, KEY, mx);

	json_decref(mx);
	return rc ? rc : histd_msg_drop_if_empty(im, m);
}

static int
import(histd_imp *im, json_t *root)
{
	Histd__V1__Message *m;
	json_t *msgs, *e, *c, *v, *mx;
	const char *k, *role;
	size_t i, p, q;
	int rc;

	json_object_foreach(root, k, v)
		if (strcmp(k, "system") && strcmp(k, "messages") &&
		    (rc = histd_imp_drop_member(im, k)))
			return rc;
	if ((v = json_object_get(root, "system"))) {
		p = histd_imp_key(im, "system");
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_SYSTEM, &m)))
			return rc;
		if (!(mx = json_object()))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		if ((rc = imp_content(im, v, m, mx))) {
			json_decref(mx);
			return rc;
		}
		if ((rc = finish_message(im, m, mx)))
			return rc;
		histd_imp_pop(im, p);
	}
	if ((rc = histd_get_arr(im, root, "messages", 1, &msgs)))
		return rc;
	p = histd_imp_key(im, "messages");
	json_array_foreach(msgs, i, e) {
		Histd__V1__Role r;

		q = histd_imp_idx(im, i);
		if ((rc = histd_expect_obj(im, e)) ||
		    (rc = histd_get_str(im, e, "role", 1, &role)))
			return rc;
		if (!strcmp(role, "user"))
			r = HISTD__V1__ROLE__ROLE_USER;
		else if (!strcmp(role, "assistant"))
			r = HISTD__V1__ROLE__ROLE_ASSISTANT;
		else
			return histd_imp_fail_at(im, "role", "must be user or "
						 "assistant");
		if (!(c = json_object_get(e, "content")))
			return histd_imp_fail_at(im, "content", "is required");
		if ((rc = histd_msg_new(im, r, &m)))
			return rc;
		if (!(mx = histd_extras(e, k_message)))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		histd_imp_key(im, "content");
		if ((rc = imp_content(im, c, m, mx))) {
			json_decref(mx);
			return rc;
		}
		histd_imp_pop(im, q);
		if ((rc = finish_message(im, m, mx)))
			return rc;
		histd_imp_pop(im, q);
	}
	histd_imp_pop(im, p);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Export                                                                 */

static int
set_new(json_t *o, const char *k, json_t *v)
{
	return v ? json_object_set_new(o, k, v) : -1;
}

static json_t *
exp_source_data(const char *mt, const uint8_t *d, size_t n, int text)
{
	json_t *s = json_object();
	char *b;

	if (!s)
		return NULL;
	if (text) {
		char *t = strndup((const char *)d, n);

		if (!t || set_new(s, "type", json_string("text")) ||
		    set_new(s, "media_type", json_string(mt)) ||
		    set_new(s, "data", json_string(t))) {
			free(t);
			json_decref(s);
			return NULL;
		}
		free(t);
		return s;
	}
	if (!(b = histd_b64_encode(d, n)) ||
	    set_new(s, "type", json_string("base64")) ||
	    set_new(s, "media_type", json_string(mt)) ||
	    set_new(s, "data", json_string(b))) {
		free(b);
		json_decref(s);
		return NULL;
	}
	free(b);
	return s;
}

static json_t *
exp_source_url(const char *url)
{
	json_t *s = json_object();

	if (s && (set_new(s, "type", json_string("url")) ||
		  set_new(s, "url", json_string(url)))) {
		json_decref(s);
		return NULL;
	}
	return s;
}

/* Whether bytes can travel as a JSON string (UTF-8 without NUL). */
static int
text_ok(const uint8_t *d, size_t n)
{
	json_t *j;

	if (memchr(d, 0, n))
		return 0;
	j = json_stringn((const char *)d, n);
	json_decref(j);
	return j != NULL;
}

/* A block as Anthropic JSON; *out NULL when dropped. */
static int
exp_block(histd_exp *ex, size_t i, long j, const Histd__V1__ContentBlock *b,
	  json_t **out)
{
	json_t *o = json_object(), *x = histd_blk_state_get(b, KEY), *src = NULL;
	const Histd__V1__ReasoningBlock *r;
	int rc = 0;

	*out = NULL;
	if (!o)
		goto nomem;
	switch (b->block_case) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
		if (set_new(o, "type", json_string("text")) ||
		    set_new(o, "text", json_string(b->text->text)))
			goto nomem;
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE: {
		const Histd__V1__ImageBlock *im = b->image;
		Histd__V1__ContentBlock *tmp = NULL;

		if (im->source_case == HISTD__V1__IMAGE_BLOCK__SOURCE_DATA) {
			src = exp_source_data(im->media_type, im->data.data,
					      im->data.len, 0);
		} else if (!strncmp(im->url, "data:", 5)) {
			/* Anthropic takes no data URIs: send the bytes. */
			if (histd_blk_from_url(im->url, 0, NULL, &tmp))
				goto nomem;
			if (tmp->image->source_case ==
			    HISTD__V1__IMAGE_BLOCK__SOURCE_DATA)
				src = exp_source_data(tmp->image->media_type,
						      tmp->image->data.data,
						      tmp->image->data.len, 0);
			histd__v1__content_block__free_unpacked(tmp, NULL);
			if (!src) {
				histd_exp_drop(ex, i, j, "an image data URI "
					       "Anthropic does not take");
				goto dropped;
			}
		} else {
			src = exp_source_url(im->url);
		}
		if (!src || set_new(o, "type", json_string("image")) ||
		    json_object_set_new(o, "source", src))
			goto nomem;
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT: {
		const Histd__V1__DocumentBlock *d = b->document;
		const char *st = histd_mark_str(x, "$source_type");

		if (d->source_case == HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA) {
			int text = !strcmp(d->media_type, "text/plain") &&
				   !(st && !strcmp(st, "base64")) &&
				   text_ok(d->data.data, d->data.len);

			if (strcmp(d->media_type, "application/pdf") &&
			    strcmp(d->media_type, "text/plain")) {
				histd_exp_drop(ex, i, j, "a document of a media "
					       "type Anthropic does not take");
				goto dropped;
			}
			src = exp_source_data(d->media_type, d->data.data,
					      d->data.len, text);
		} else {
			src = exp_source_url(d->url);
		}
		if (!src || set_new(o, "type", json_string("document")) ||
		    json_object_set_new(o, "source", src))
			goto nomem;
		if (d->filename[0] &&
		    set_new(o, "title", json_string(d->filename)))
			goto nomem;
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
		r = b->reasoning;
		if (histd_blk_foreign(b, KEY)) {
			histd_exp_drop(ex, i, j, "reasoning of another "
				       "provider (its signature does not "
				       "verify with Anthropic)");
			goto dropped;
		}
		if (r->redacted && r->encrypted_data.len) {
			json_t *data;

			if (histd_json_bytes_text(&r->encrypted_data, &data))
				goto nomem;
			if (!data) {
				histd_exp_drop(ex, i, j, "redacted reasoning "
					       "whose data is not text");
				goto dropped;
			}
			if (set_new(o, "type",
				    json_string("redacted_thinking"))) {
				json_decref(data);
				goto nomem;
			}
			if (set_new(o, "data", data))
				goto nomem;
		} else if (r->signature[0] || histd_mark_str(x, "$signature")) {
			if (set_new(o, "type", json_string("thinking")) ||
			    set_new(o, "thinking", json_string(r->text)) ||
			    set_new(o, "signature", json_string(r->signature)))
				goto nomem;
		} else {
			histd_exp_drop(ex, i, j, "reasoning without a "
				       "signature");
			goto dropped;
		}
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL: {
		json_t *in = histd_args_value(ex, i, j,
					      b->tool_call->arguments);

		if (in && !json_is_object(in)) {
			json_t *w = json_object();

			if (!w || json_object_set_new(w, "value", in))
				goto nomem;
			in = w;
			histd_exp_drop(ex, i, j, "tool arguments that are not "
				       "an object, wrapped as {\"value\": ...}");
		}
		if (!in || set_new(o, "type", json_string("tool_use")) ||
		    set_new(o, "id", json_string(b->tool_call->id)) ||
		    set_new(o, "name", json_string(b->tool_call->name)) ||
		    json_object_set_new(o, "input", in))
			goto nomem;
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT: {
		const Histd__V1__ToolResultBlock *t = b->tool_result;
		const char *shape = histd_mark_str(x, "$content");
		int all_text = 1;

		if (set_new(o, "type", json_string("tool_result")) ||
		    set_new(o, "tool_use_id", json_string(t->tool_call_id)))
			goto nomem;
		for (size_t k = 0; k < t->n_content; k++)
			all_text &= t->content[k]->block_case ==
				    HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		if (shape && !strcmp(shape, "string") && all_text &&
		    t->n_content <= 1) {
			if (set_new(o, "content", json_string(
				t->n_content ? t->content[0]->text->text : "")))
				goto nomem;
		} else if (!shape && t->n_content == 1 && all_text &&
			   !t->content[0]->n_provider_state) {
			if (set_new(o, "content",
				    json_string(t->content[0]->text->text)))
				goto nomem;
		} else if (t->n_content || shape) {
			json_t *arr = json_array();

			if (!arr || json_object_set_new(o, "content", arr))
				goto nomem;
			for (size_t k = 0; k < t->n_content; k++) {
				json_t *e;

				if ((rc = exp_block(ex, i, j, t->content[k],
						    &e)))
					goto out;
				if (e && json_array_append_new(arr, e))
					goto nomem;
			}
		}
		if ((t->is_error || histd_mark_bool(x, "$is_error")) &&
		    set_new(o, "is_error", json_boolean(t->is_error)))
			goto nomem;
		break;
	}
	default:
		goto dropped;
	}
	if ((rc = histd_extras_apply(o, x, NULL)) ||
	    (rc = histd_extras_apply(json_object_get(o, "source"), x,
				     "$source")))
		goto out;
	*out = o;
	o = NULL;
	goto out;
dropped:
	rc = 0;
	goto out;
nomem:
	rc = histd_error_set(HISTD_ENOMEM, "out of memory");
out:
	json_decref(o);
	json_decref(x);
	return rc;
}

static int has_state(const Histd__V1__Message *m, const char *key);

/* Writes blocks of message i into arr. Anthropic wants a user turn's
 * tool_result blocks before anything else in it: a user or tool message
 * that did not come from Anthropic (whose order is kept as it was) has
 * them moved first. */
static int
exp_blocks(histd_exp *ex, size_t i, const Histd__V1__Message *m, json_t *arr)
{
	int results_first = (m->role == HISTD__V1__ROLE__ROLE_USER ||
			     m->role == HISTD__V1__ROLE__ROLE_TOOL) &&
			    !has_state(m, KEY);

	for (int pass = results_first ? 0 : 1; pass < 2; pass++)
		for (size_t j = 0; j < m->n_content; j++) {
			int result = m->content[j]->block_case ==
				     HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
			json_t *e;
			int rc;

			/* pass 0: results only; pass 1: the rest (all of
			 * them when results stay where they are) */
			if (results_first && result != (pass == 0))
				continue;
			if ((rc = exp_block(ex, i, (long)j, m->content[j], &e)))
				return rc;
			if (e && json_array_append_new(arr, e))
				return histd_error_set(HISTD_ENOMEM,
						       "out of memory");
		}
	return 0;
}

/* A string when the shape says so (or by default for one plain text). */
static json_t *
maybe_string(const Histd__V1__Message *m, json_t *mx, json_t *arr)
{
	const char *shape = histd_mark_str(mx, "$content");
	json_t *only = json_array_size(arr) == 1 ? json_array_get(arr, 0)
						 : NULL;
	const char *t = only ? json_string_value(json_object_get(only, "type"))
			     : NULL;

	if (!t || strcmp(t, "text") || json_object_size(only) != 2 ||
	    (shape && strcmp(shape, "string")) || m->n_content != 1)
		return json_incref(arr);
	return json_incref(json_object_get(only, "text"));
}

static int
has_state(const Histd__V1__Message *m, const char *key)
{
	for (size_t i = 0; i < m->n_provider_state; i++)
		if (!strcmp(m->provider_state[i]->key, key))
			return 1;
	return 0;
}

static int
export(histd_exp *ex, Histd__V1__Message *const *msgs, size_t n, json_t **out)
{
	json_t *root = json_object(), *sys = json_array(), *arr = json_array();
	json_t *last = NULL, *mx = NULL;
	const Histd__V1__Message *sys_first = NULL;
	int last_tool = 0, seen_other = 0, n_sys = 0, rc = 0;

	if (!root || !sys || !arr)
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		const Histd__V1__Message *m = msgs[i];
		json_t *o, *blocks;

		if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM) {
			if (seen_other)
				histd_exp_drop(ex, i, -1, "a system message "
					       "after the first turn, moved to "
					       "system");
			if (!n_sys++)
				sys_first = m;
			if ((rc = exp_blocks(ex, i, m, sys)))
				goto out;
			continue;
		}
		seen_other = 1;
		if (!(blocks = json_array()))
			goto nomem;
		if ((rc = exp_blocks(ex, i, m, blocks))) {
			json_decref(blocks);
			goto out;
		}
		/* Results of parallel calls (tool messages of other formats)
		 * go together in one user turn, with what follows them. */
		if (last && last_tool &&
		    (m->role == HISTD__V1__ROLE__ROLE_TOOL ||
		     (m->role == HISTD__V1__ROLE__ROLE_USER &&
		      !has_state(m, KEY)))) {
			json_t *c = json_object_get(last, "content");

			if (json_array_extend(c, blocks)) {
				json_decref(blocks);
				goto nomem;
			}
			json_decref(blocks);
			last_tool = m->role == HISTD__V1__ROLE__ROLE_TOOL;
			continue;
		}
		if (json_array_size(blocks) == 0) {
			json_decref(blocks);
			histd_exp_drop(ex, i, -1, "a message with nothing "
				       "Anthropic takes");
			continue;
		}
		mx = histd_msg_state_get(m, KEY);
		if (!(o = json_object()) || json_array_append_new(arr, o) ||
		    set_new(o, "role", json_string(
			    m->role == HISTD__V1__ROLE__ROLE_ASSISTANT
				    ? "assistant" : "user")) ||
		    json_object_set_new(o, "content",
					m->role == HISTD__V1__ROLE__ROLE_TOOL
						? json_incref(blocks)
						: maybe_string(m, mx, blocks)) ||
		    histd_extras_apply(o, mx, NULL)) {
			json_decref(blocks);
			goto nomem;
		}
		json_decref(blocks);
		json_decref(mx);
		mx = NULL;
		last = o;
		last_tool = m->role == HISTD__V1__ROLE__ROLE_TOOL;
	}
	if (json_array_size(sys)) {
		json_t *sx = sys_first ? histd_msg_state_get(sys_first, KEY)
				       : NULL;
		json_t *v = n_sys == 1 ? maybe_string(sys_first, sx, sys)
				       : json_incref(sys);

		json_decref(sx);
		if (json_object_set_new(root, "system", v))
			goto nomem;
	}
	if (json_object_set(root, "messages", arr))
		goto nomem;
	*out = root;
	root = NULL;
	goto out;
nomem:
	rc = histd_error_set(HISTD_ENOMEM, "out of memory");
out:
	json_decref(mx);
	json_decref(root);
	json_decref(sys);
	json_decref(arr);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                              */

static char *
summary_url(const char *base, const char *model)
{
	char *s;

	(void)model;
	return asprintf(&s, "%s/v1/messages", base) < 0 ? NULL : s;
}

static json_t *
summary_request(const histd_summary_call *c)
{
	return json_pack("{s:s, s:I, s:s, s:[{s:s, s:s}]}", "model", c->model,
			 "max_tokens", (json_int_t)c->max_output_tokens,
			 "system", c->instructions, "messages", "role", "user",
			 "content", c->input);
}

static int
summary_response(json_t *root, histd_summary_result *out)
{
	json_t *content = json_object_get(root, "content"), *e;
	json_t *usage = json_object_get(root, "usage");
	const char *model = json_string_value(json_object_get(root, "model"));
	size_t i, len = 0;
	char *text;

	if (!json_is_array(content))
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answer "
				       "has no content array");
	/* Text blocks only, as copied below: a thinking block's text is
	 * no summary. */
	json_array_foreach(content, i, e)
		if (json_is_string(json_object_get(e, "text")) &&
		    !strcmp(json_string_value(json_object_get(e, "type")) ?: "",
			    "text"))
			len += json_string_length(json_object_get(e, "text"));
	if (!len)
		return histd_error_set(HISTD_EUNAVAILABLE, "the summarizer "
				       "returned an empty summary");
	if (!(text = malloc(len + 1)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	len = 0;
	json_array_foreach(content, i, e) {
		json_t *t = json_object_get(e, "text");

		if (!json_is_string(t) ||
		    strcmp(json_string_value(json_object_get(e, "type")) ?: "",
			   "text"))
			continue;
		memcpy(text + len, json_string_value(t), json_string_length(t));
		len += json_string_length(t);
	}
	text[len] = '\0';
	if (!(out->model = strdup(model ? model : ""))) {
		free(text);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	out->text = text;
	out->input_tokens = histd_usage_count(usage, "input_tokens");
	out->output_tokens = histd_usage_count(usage, "output_tokens");
	return 0;
}

const histd_format_ops histd_format_anthropic = {
	.format = HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES,
	.name = "anthropic_messages",
	.key = KEY,
	.import = import,
	.export = export,
	.default_base_url = "https://api.anthropic.com",
	.key_env = "ANTHROPIC_API_KEY",
	.auth = HISTD_AUTH_ANTHROPIC,
	.summary_url = summary_url,
	.summary_request = summary_request,
	.summary_response = summary_response,
};
