/*
 * The chat completions shape, shared by OpenAI Chat Completions and
 * Mistral (see chat.h for what differs).
 *
 * Roles: system (and developer) -> system; user; assistant with text
 * parts and tool_calls; tool (one result per message, by tool_call_id).
 * Parts: text, image_url (URL or data URI), file (file_data as a data URI),
 * document_url and thinking chunks (Mistral), refusal (OpenAI).
 * A user message holding tool results (Anthropic, Gemini) becomes tool
 * messages on export, placed first, as tool messages must follow the
 * assistant message that called.
 */
#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_message[] = { "role", "content", "tool_calls",
					 "tool_call_id", "refusal", NULL };
static const char *const k_text[] = { "type", "text", NULL };
static const char *const k_image[] = { "type", "image_url", NULL };
static const char *const k_url[] = { "url", NULL };
static const char *const k_file[] = { "type", "file", NULL };
static const char *const k_file_in[] = { "file_data", "filename", NULL };
static const char *const k_docurl[] = { "type", "document_url",
					"document_name", NULL };
static const char *const k_thinking[] = { "type", "thinking", NULL };
static const char *const k_refusal[] = { "type", "refusal", NULL };
static const char *const k_call[] = { "id", "type", "function", NULL };
static const char *const k_fn[] = { "name", "arguments", NULL };

static int
nomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
mark(json_t *x, const char *k, json_t *v)
{
	return json_object_set_new(x, k, v) ? nomem() : 0;
}

/* Adds b with its extras x (consumed) to m or r. */
static int
add(histd_imp *im, Histd__V1__Message *m, Histd__V1__ToolResultBlock *r,
    Histd__V1__ContentBlock *b, json_t *x)
{
	int rc;

	if (!b) {
		json_decref(x);
		return nomem();
	}
	if (!x || (rc = histd_blk_state(b, im->key, x))) {
		json_decref(x);
		histd__v1__content_block__free_unpacked(b, NULL);
		return x ? rc : nomem();
	}
	json_decref(x);
	return r ? histd_result_add(r, b) : histd_msg_add(m, b);
}

/* ---------------------------------------------------------------------- */
/* Import                                                                 */

static int
imp_part(const histd_chat_dialect *d, histd_imp *im, json_t *p,
	 Histd__V1__Message *m, Histd__V1__ToolResultBlock *r, int only_text)
{
	Histd__V1__ContentBlock *b = NULL;
	const char *type, *s, *name;
	json_t *x, *o;
	int rc;

	if ((rc = histd_expect_obj(im, p)) ||
	    (rc = histd_get_str(im, p, "type", 1, &type)))
		return rc;
	if (only_text && strcmp(type, "text"))
		return histd_imp_fail_at(im, "type", "only text parts here");
	if (!strcmp(type, "text")) {
		if ((rc = histd_get_str(im, p, "text", 1, &s)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "text", "is empty");
		return add(im, m, r, histd_blk_text(s), histd_extras(p, k_text));
	}
	if (!strcmp(type, "refusal") && d->refusal) {
		if ((rc = histd_get_str(im, p, "refusal", 1, &s)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "refusal", "is empty");
		x = histd_extras(p, k_refusal);
		if (x && (rc = mark(x, "$refusal", json_string("part"))))
			return json_decref(x), rc;
		return add(im, m, r, histd_blk_text(s), x);
	}
	if (!strcmp(type, "image_url")) {
		const char *ukey = "image_url.url";

		o = json_object_get(p, "image_url");
		x = histd_extras(p, k_image);
		if (!x)
			return nomem();
		if (json_is_string(o) && d->image_url_string) {
			s = json_string_value(o);
			ukey = "image_url";
			rc = mark(x, "$image_url", json_string("string"));
		} else if (json_is_object(o)) {
			size_t q = histd_imp_key(im, "image_url");

			rc = histd_get_str(im, o, "url", 1, &s);
			histd_imp_pop(im, q);
			if (!rc && d->image_url_string)
				rc = mark(x, "$image_url", json_string("object"));
			if (!rc)
				rc = histd_extras_into(x, "$image_url_obj", o,
						       k_url);
		} else {
			rc = histd_imp_fail_at(im, "image_url", o
				? "expected an object" : "is required");
		}
		if (!rc && !*s)
			rc = histd_imp_fail_at(im, "image_url", "url is empty");
		if (!rc)
			rc = histd_imp_check_url(im, ukey, s);
		if (!rc && (rc = histd_blk_from_url(s, 0, NULL, &b)) == 0)
			return add(im, m, r, b, x);
		json_decref(x);
		return rc;
	}
	if (!strcmp(type, "file") && d->file_parts) {
		const char *data = NULL, *fn = NULL;
		size_t q;

		if ((rc = histd_get_obj(im, p, "file", 1, &o)))
			return rc;
		q = histd_imp_key(im, "file");
		if ((rc = histd_get_str(im, o, "file_data", 0, &data)) ||
		    (rc = histd_get_str(im, o, "filename", 0, &fn)))
			return rc;
		if (!data || strncmp(data, "data:", 5)) {
			rc = histd_imp_drop(im, "a file part without inline "
					    "data (file ids are not kept)");
			histd_imp_pop(im, q);
			return rc;
		}
		histd_imp_pop(im, q);
		if (!(x = histd_extras(p, k_file)))
			return nomem();
		if ((rc = histd_imp_check_url(im, "file.file_data", data)) ||
		    (rc = histd_extras_into(x, "$file", o, k_file_in)) ||
		    (rc = histd_blk_from_url(data, 1, fn, &b))) {
			json_decref(x);
			return rc;
		}
		return add(im, m, r, b, x);
	}
	if (!strcmp(type, "document_url") && d->document_url) {
		if ((rc = histd_get_str(im, p, "document_url", 1, &s)) ||
		    (rc = histd_get_str_or_null(im, p, "document_name", &name)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "document_url", "is empty");
		if ((rc = histd_imp_check_url(im, "document_url", s)))
			return rc;
		return add(im, m, r, histd_blk_doc_url(s, NULL, name),
			   histd_extras(p, k_docurl));
	}
	if (!strcmp(type, "thinking") && d->thinking_chunks) {
		json_t *chunks, *e;
		size_t i, len = 0, q;
		char *text;

		if (m == NULL || m->role != HISTD__V1__ROLE__ROLE_ASSISTANT)
			return histd_imp_fail_at(im, "type", "thinking only in "
						 "assistant messages");
		if ((rc = histd_get_arr(im, p, "thinking", 1, &chunks)))
			return rc;
		q = histd_imp_key(im, "thinking");
		json_array_foreach(chunks, i, e) {
			size_t q2 = histd_imp_idx(im, i);

			if ((rc = histd_expect_obj(im, e)) ||
			    (rc = histd_get_str(im, e, "text", 1, &s)))
				return rc;
			len += strlen(s);
			histd_imp_pop(im, q2);
		}
		histd_imp_pop(im, q);
		if (!len)
			return histd_imp_fail_at(im, "thinking", "is empty");
		if (!(text = malloc(len + 1)))
			return nomem();
		len = 0;
		json_array_foreach(chunks, i, e) {
			s = json_string_value(json_object_get(e, "text"));
			memcpy(text + len, s, strlen(s));
			len += strlen(s);
		}
		text[len] = '\0';
		x = histd_extras(p, k_thinking);
		/* Several chunks (or chunks with more than text) are kept
		 * whole, and used again while the text is unchanged. */
		if (x && (json_array_size(chunks) != 1 ||
			  json_object_size(json_array_get(chunks, 0)) != 2 ||
			  !json_is_string(json_object_get(
				  json_array_get(chunks, 0), "type"))))
			rc = mark(x, "$thinking", json_incref(chunks));
		if (x && !rc && json_object_size(x) == 0)
			rc = mark(x, "$origin", json_true());
		b = histd_blk_reasoning(text, NULL, NULL, NULL, 0, 0);
		free(text);
		if (rc) {
			json_decref(x);
			if (b)
				histd__v1__content_block__free_unpacked(b, NULL);
			return rc;
		}
		return add(im, m, r, b, x);
	}
	if (!strcmp(type, "input_audio") || !strcmp(type, "reference") ||
	    !strcmp(type, "audio_url") || !strcmp(type, "file"))
		return histd_imp_drop(im, "a %s part histd does not keep",
				      type);
	return histd_imp_fail_at(im, "type", "not a known part type");
}

/* content: string | array | (null | absent where allowed). Sets the
 * "$content" shape mark in mx. */
static int
imp_content(const histd_chat_dialect *d, histd_imp *im, json_t *msg,
	    Histd__V1__Message *m, Histd__V1__ToolResultBlock *r, json_t *mx,
	    int optional, int only_text)
{
	json_t *c = json_object_get(msg, "content"), *e;
	size_t i, q, p;
	int rc;

	if (!c || json_is_null(c)) {
		if (!optional)
			return histd_imp_fail_at(im, "content", c
				? "expected a string or an array, got null"
				: "is required");
		return mark(mx, "$content", json_string(c ? "null"
							  : "absent"));
	}
	p = histd_imp_key(im, "content");
	if (json_is_string(c)) {
		if ((rc = mark(mx, "$content", json_string("string"))))
			return rc;
		if (json_string_length(c) &&
		    (rc = add(im, m, r, histd_blk_text(json_string_value(c)),
			      json_object())))
			return rc;
	} else if (json_is_array(c)) {
		if ((rc = mark(mx, "$content", json_string("array"))))
			return rc;
		json_array_foreach(c, i, e) {
			q = histd_imp_idx(im, i);
			if ((rc = imp_part(d, im, e, m, r, only_text)))
				return rc;
			histd_imp_pop(im, q);
		}
	} else {
		return histd_imp_fail(im, "expected a string or an array");
	}
	histd_imp_pop(im, p);
	return 0;
}

static int
imp_calls(const histd_chat_dialect *d, histd_imp *im, json_t *msg,
	  Histd__V1__Message *m)
{
	json_t *calls = json_object_get(msg, "tool_calls"), *c, *fn, *a;
	const char *id, *name, *type;
	size_t i, p, q;
	int rc;

	if (!calls || json_is_null(calls))
		return 0;
	if (!json_is_array(calls))
		return histd_imp_fail_at(im, "tool_calls", "expected an array");
	p = histd_imp_key(im, "tool_calls");
	json_array_foreach(calls, i, c) {
		json_t *x;
		char *args = NULL;

		q = histd_imp_idx(im, i);
		if ((rc = histd_expect_obj(im, c)) ||
		    (rc = histd_get_str(im, c, "id", 1, &id)) ||
		    (rc = histd_get_str(im, c, "type", 0, &type)) ||
		    (rc = histd_get_obj(im, c, "function", 1, &fn)))
			return rc;
		if (!*id || strlen(id) > 128)
			return histd_imp_fail_at(im, "id", "must be 1..128 "
						 "bytes");
		if (type && strcmp(type, "function"))
			return histd_imp_fail_at(im, "type", "must be function");
		histd_imp_key(im, "function");
		if ((rc = histd_get_str(im, fn, "name", 1, &name)))
			return rc;
		if (!*name || strlen(name) > 128)
			return histd_imp_fail_at(im, "name", "must be 1..128 "
						 "bytes");
		if (!(x = histd_extras(c, k_call)))
			return nomem();
		a = json_object_get(fn, "arguments");
		if (json_is_string(a)) {
			if (json_string_length(a) &&
			    (rc = histd_imp_check_args(im, "arguments",
						json_string_value(a)))) {
				json_decref(x);
				return rc;
			}
			args = strdup(json_string_value(a));
			/* "" is histd's "no arguments" too, which export
			 * writes as "{}": keep which one came. */
			if (!json_string_length(a))
				rc = mark(x, "$args", json_string("empty"));
		} else if (json_is_object(a) && d->args_object) {
			args = histd_json_text(a);
			rc = mark(x, "$args", json_string("object"));
		} else {
			json_decref(x);
			return histd_imp_fail_at(im, "arguments", a
				? "expected a string" : "is required");
		}
		if (!args || rc ||
		    (rc = histd_extras_into(x, "$function", fn, k_fn)) ||
		    (!type && (rc = mark(x, "$no_type", json_true())))) {
			free(args);
			json_decref(x);
			return rc ? rc : nomem();
		}
		rc = add(im, m, NULL, histd_blk_tool_call(id, name, args), x);
		free(args);
		if (rc || (rc = histd_calls_add(&im->calls, &im->n_calls,
						&im->cap_calls, id, name)))
			return rc;
		histd_imp_pop(im, q);
	}
	histd_imp_pop(im, p);
	return 0;
}

/*
 * Members of k_message that role (or the dialect) does not read: a
 * tool_call_id outside a tool message, a refusal outside an assistant
 * message of OpenAI are kept in mx as they came. Tool calls outside an
 * assistant message would go unseen (no pairing, no export but as
 * extras): refused, unless null or empty. A null or empty tool_calls
 * holds no call, in any role: kept as it came (Export writes tool_calls
 * only for calls).
 */
static int
keep_unread(const histd_chat_dialect *d, histd_imp *im, json_t *e,
	    const char *role, json_t *mx)
{
	json_t *v = json_object_get(e, "tool_calls");
	int no_calls = json_is_null(v) || (json_is_array(v) &&
					   !json_array_size(v));

	if (v && !no_calls && strcmp(role, "assistant"))
		return histd_imp_fail_at(im, "tool_calls", "only in assistant "
					 "messages");
	if (v && no_calls && json_object_set(mx, "tool_calls", v))
		return nomem();
	if (strcmp(role, "tool") &&
	    (v = json_object_get(e, "tool_call_id")) &&
	    json_object_set(mx, "tool_call_id", v))
		return nomem();
	if ((!d->refusal || strcmp(role, "assistant")) &&
	    (v = json_object_get(e, "refusal")) &&
	    json_object_set(mx, "refusal", v))
		return nomem();
	return 0;
}

static int
imp_message(const histd_chat_dialect *d, histd_imp *im, json_t *e)
{
	Histd__V1__Message *m;
	const char *role, *s;
	json_t *mx = NULL;
	int rc;

	if ((rc = histd_expect_obj(im, e)) ||
	    (rc = histd_get_str(im, e, "role", 1, &role)))
		return rc;
	if (!(mx = histd_extras(e, k_message)))
		return nomem();
	if ((rc = keep_unread(d, im, e, role, mx)))
		goto out;
	if (!strcmp(role, "system") ||
	    (d->developer_role && !strcmp(role, "developer"))) {
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_SYSTEM, &m)) ||
		    (role[0] == 'd' &&
		     (rc = mark(mx, "$role", json_string("developer")))) ||
		    (rc = imp_content(d, im, e, m, NULL, mx, 0, 1)))
			goto out;
	} else if (!strcmp(role, "user")) {
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_USER, &m)) ||
		    (rc = imp_content(d, im, e, m, NULL, mx, 0, 0)))
			goto out;
	} else if (!strcmp(role, "assistant")) {
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_ASSISTANT,
					&m)) ||
		    (rc = imp_content(d, im, e, m, NULL, mx, 1, 0)))
			goto out;
		if (d->refusal) {
			if ((rc = histd_get_str_or_null(im, e, "refusal", &s)))
				goto out;
			if (s && *s) {
				json_t *x = json_object();

				if (!x || (rc = mark(x, "$refusal",
						     json_string("field"))))
					goto out_nomem;
				if ((rc = add(im, m, NULL, histd_blk_text(s),
					      x)))
					goto out;
			} else if (json_object_get(e, "refusal") &&
				   (rc = mark(mx, "$refusal",
					      json_incref(json_object_get(
						      e, "refusal"))))) {
				goto out;
			}
		}
		if ((rc = imp_calls(d, im, e, m)))
			goto out;
	} else if (!strcmp(role, "tool")) {
		Histd__V1__ContentBlock *b;
		const char *id, *name = NULL;

		if ((rc = histd_get_str(im, e, "tool_call_id", 1, &id)))
			goto out;
		if (!*id || strlen(id) > 128) {
			rc = histd_imp_fail_at(im, "tool_call_id", "must be "
					       "1..128 bytes");
			goto out;
		}
		if (d->tool_name) {
			if ((rc = histd_get_str(im, e, "name", 0, &name)))
				goto out;
			if (name) {
				json_object_del(mx, "name");
				if ((rc = mark(mx, "$name", json_true())))
					goto out;
			}
		}
		if (!name)
			name = histd_calls_name(im->calls, im->n_calls, id);
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_TOOL, &m)))
			goto out;
		if (!(b = histd_blk_tool_result(id, name, 0)))
			goto out_nomem;
		if ((rc = histd_msg_add(m, b)) ||
		    (rc = imp_content(d, im, e, NULL, b->tool_result, mx, 0,
				      1)))
			goto out;
	} else {
		rc = histd_imp_fail_at(im, "role", "not a supported role");
		goto out;
	}
	rc = histd_msg_state(m, im->key, mx);
	json_decref(mx);
	return rc ? rc : histd_msg_drop_if_empty(im, m);
out_nomem:
	rc = nomem();
out:
	json_decref(mx);
	return rc;
}

int
histd_chat_import(const histd_chat_dialect *d, histd_imp *im, json_t *root)
{
	json_t *msgs, *e, *v;
	const char *k;
	size_t i, p, q;
	int rc;

	json_object_foreach(root, k, v)
		if (strcmp(k, "messages") &&
		    (rc = histd_imp_drop_member(im, k)))
			return rc;
	if ((rc = histd_get_arr(im, root, "messages", 1, &msgs)))
		return rc;
	p = histd_imp_key(im, "messages");
	json_array_foreach(msgs, i, e) {
		q = histd_imp_idx(im, i);
		if ((rc = imp_message(d, im, e)))
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

/* One non-tool block as a part; *out NULL when dropped. */
static int
exp_part(const histd_chat_dialect *d, histd_exp *ex, size_t i, long j,
	 const Histd__V1__ContentBlock *b, Histd__V1__Role role,
	 json_t **out)
{
	json_t *o = json_object(), *x = histd_blk_state_get(b, d->key);
	char *url = NULL;
	int rc = 0;

	*out = NULL;
	if (!o)
		goto nomem;
	switch (b->block_case) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT: {
		const char *rf = histd_mark_str(x, "$refusal");

		if (rf && !strcmp(rf, "part") && d->refusal) {
			if (set_new(o, "type", json_string("refusal")) ||
			    set_new(o, "refusal", json_string(b->text->text)))
				goto nomem;
		} else if (set_new(o, "type", json_string("text")) ||
			   set_new(o, "text", json_string(b->text->text))) {
			goto nomem;
		}
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE: {
		const Histd__V1__ImageBlock *im = b->image;
		const char *shape = histd_mark_str(x, "$image_url");
		int as_str = shape ? !strcmp(shape, "string")
				   : (d->image_url_string &&
				      !json_object_get(x, "$image_url_obj"));

		if (role == HISTD__V1__ROLE__ROLE_ASSISTANT) {
			histd_exp_drop(ex, i, j, "an image in an assistant "
				       "message");
			goto dropped;
		}
		url = im->source_case == HISTD__V1__IMAGE_BLOCK__SOURCE_DATA
			? histd_data_uri(im->media_type, im->data.data,
					 im->data.len)
			: strdup(im->url);
		if (!url || set_new(o, "type", json_string("image_url")))
			goto nomem;
		if (as_str) {
			if (set_new(o, "image_url", json_string(url)))
				goto nomem;
		} else {
			json_t *io = json_object();

			if (!io || json_object_set_new(o, "image_url", io) ||
			    set_new(io, "url", json_string(url)) ||
			    histd_extras_apply(io, x, "$image_url_obj"))
				goto nomem;
		}
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT: {
		const Histd__V1__DocumentBlock *dc = b->document;

		if (role == HISTD__V1__ROLE__ROLE_ASSISTANT) {
			histd_exp_drop(ex, i, j, "a document in an assistant "
				       "message");
			goto dropped;
		}
		/* A data: URI kept as a URL (parameters, not base64: how
		 * Import keeps one it cannot take apart) goes back as the
		 * inline data it was. */
		if ((dc->source_case == HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA ||
		     (dc->source_case == HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL &&
		      !strncmp(dc->url, "data:", 5))) &&
		    d->file_parts) {
			json_t *f = json_object();

			if (!(url = dc->source_case ==
				    HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL
				    ? strdup(dc->url)
				    : histd_data_uri(dc->media_type,
						     dc->data.data,
						     dc->data.len)) ||
			    !f || json_object_set_new(o, "type",
						      json_string("file")) ||
			    json_object_set_new(o, "file", f) ||
			    set_new(f, "file_data", json_string(url)) ||
			    (dc->filename[0] &&
			     set_new(f, "filename",
				     json_string(dc->filename))) ||
			    histd_extras_apply(f, x, "$file"))
				goto nomem;
		} else if (dc->source_case ==
			   HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL &&
			   d->document_url) {
			if (set_new(o, "type", json_string("document_url")) ||
			    set_new(o, "document_url", json_string(dc->url)) ||
			    (dc->filename[0] &&
			     set_new(o, "document_name",
				     json_string(dc->filename))))
				goto nomem;
		} else {
			histd_exp_drop(ex, i, j, "a document %s, which %s "
				       "does not take",
				       dc->source_case ==
					       HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL
					       ? "by URL" : "as data",
				       ex->format);
			goto dropped;
		}
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING: {
		const Histd__V1__ReasoningBlock *r = b->reasoning;
		json_t *keep = x ? json_object_get(x, "$thinking") : NULL;

		if (!d->thinking_chunks || !r->text[0]) {
			histd_exp_drop(ex, i, j, "reasoning, which %s does not "
				       "take as input", ex->format);
			goto dropped;
		}
		if (histd_blk_foreign(b, d->key) &&
		    (r->signature[0] || r->encrypted_data.len))
			histd_exp_drop(ex, i, j, "the signature of reasoning "
				       "(kept: its text)");
		if (set_new(o, "type", json_string("thinking")))
			goto nomem;
		if (keep) {
			/* The kept chunks, while their text is unchanged. */
			size_t k, len = 0;
			json_t *e;
			int same = 1;

			json_array_foreach(keep, k, e) {
				const char *t = json_string_value(
					json_object_get(e, "text"));
				size_t tl = t ? strlen(t) : 0;

				if (!t || strncmp(r->text + len, t, tl))
					same = 0;
				len += tl;
				if (!same || len > strlen(r->text))
					break;
			}
			if (!same || len != strlen(r->text))
				keep = NULL;
		}
		if (keep) {
			if (json_object_set(o, "thinking", keep))
				goto nomem;
		} else if (set_new(o, "thinking",
				   json_pack("[{s:s, s:s}]", "type", "text",
					     "text", r->text))) {
			goto nomem;
		}
		break;
	}
	default:
		goto dropped;
	}
	if (histd_extras_apply(o, x, NULL))
		goto nomem;
	*out = o;
	o = NULL;
	goto out;
dropped:
	rc = 0;
	goto out;
nomem:
	rc = nomem();
out:
	free(url);
	json_decref(o);
	json_decref(x);
	return rc;
}

/* "content" from parts, shaped as marked (or a string for one text). */
static int
put_content(const histd_chat_dialect *d, json_t *o, json_t *parts, json_t *mx,
	    Histd__V1__Role role, int has_calls)
{
	const char *shape = histd_mark_str(mx, "$content");
	json_t *one = json_array_size(parts) == 1 ? json_array_get(parts, 0)
						  : NULL;
	int plain = one && json_object_size(one) == 2 &&
		    !strcmp(json_string_value(json_object_get(one, "type")),
			    "text");

	if (json_array_size(parts) == 0) {
		if (shape && !strcmp(shape, "absent"))
			return 0;
		if (shape && !strcmp(shape, "null"))
			return json_object_set_new(o, "content", json_null());
		if (shape && !strcmp(shape, "array"))
			return json_object_set(o, "content", parts);
		if (!shape && role == HISTD__V1__ROLE__ROLE_ASSISTANT &&
		    has_calls && d->empty_content_null)
			return json_object_set_new(o, "content", json_null());
		return json_object_set_new(o, "content", json_string(""));
	}
	if (plain && (!shape || !strcmp(shape, "string")))
		return json_object_set(o, "content",
				       json_object_get(one, "text"));
	return json_object_set(o, "content", parts);
}

static int
exp_tool_message(const histd_chat_dialect *d, histd_exp *ex, size_t i,
		 long j, const Histd__V1__ContentBlock *b,
		 const Histd__V1__Message *m, json_t *arr)
{
	const Histd__V1__ToolResultBlock *t = b->tool_result;
	json_t *o = json_object(), *mx = histd_msg_state_get(m, d->key);
	json_t *parts = json_array();
	const char *name = t->tool_name[0] ? t->tool_name
		: histd_calls_name(ex->calls, ex->n_calls, t->tool_call_id);
	int rc = 0;

	if (!o || !parts || json_array_append(arr, o) ||
	    set_new(o, "role", json_string("tool")) ||
	    set_new(o, "tool_call_id", json_string(t->tool_call_id)))
		goto nomem;
	for (size_t k = 0; k < t->n_content; k++) {
		const Histd__V1__ContentBlock *c = t->content[k];
		json_t *p;

		if (c->block_case != HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT) {
			histd_exp_drop(ex, i, j, "an image or document in a "
				       "tool result, which %s does not take",
				       ex->format);
			continue;
		}
		if ((rc = exp_part(d, ex, i, j, c, HISTD__V1__ROLE__ROLE_TOOL,
				   &p)))
			goto out;
		if (p && json_array_append_new(parts, p))
			goto nomem;
	}
	if (t->is_error)
		histd_exp_drop(ex, i, j, "is_error of a tool result");
	if (json_array_size(parts) > 1 &&
	    !(histd_mark_str(mx, "$content") &&
	      !strcmp(histd_mark_str(mx, "$content"), "array"))) {
		/* Several texts as one string, what every model reads. */
		int other;
		char *s = histd_result_text(t, &other);

		if (!s || set_new(o, "content", json_string(s))) {
			free(s);
			goto nomem;
		}
		free(s);
	} else if (put_content(d, o, parts, mx, HISTD__V1__ROLE__ROLE_TOOL,
			       0)) {
		goto nomem;
	}
	if (d->tool_name && name && *name &&
	    (histd_mark_bool(mx, "$name") || !mx) &&
	    set_new(o, "name", json_string(name)))
		goto nomem;
	if (histd_extras_apply(o, mx, NULL))
		goto nomem;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(o);
	json_decref(mx);
	json_decref(parts);
	return rc;
}

static int
exp_call(const histd_chat_dialect *d, histd_exp *ex, size_t i, long j,
	 const Histd__V1__ContentBlock *b, json_t *calls)
{
	const Histd__V1__ToolCallBlock *c = b->tool_call;
	json_t *x = histd_blk_state_get(b, d->key);
	json_t *o = json_object(), *fn = json_object();
	const char *args;
	int rc = 0;

	if (!o || !fn || json_array_append(calls, o) ||
	    set_new(o, "id", json_string(c->id)) ||
	    (!histd_mark_bool(x, "$no_type") &&
	     set_new(o, "type", json_string("function"))) ||
	    json_object_set(o, "function", fn) ||
	    set_new(fn, "name", json_string(c->name)))
		goto nomem;
	args = histd_mark_str(x, "$args");
	if (args && !strcmp(args, "object") && d->args_object) {
		json_t *a = histd_args_value(ex, i, j, c->arguments);

		if (!a || json_object_set_new(fn, "arguments", a))
			goto nomem;
	} else if (set_new(fn, "arguments", json_string(
			c->arguments[0] ? c->arguments
			: args && !strcmp(args, "empty") ? "" : "{}"))) {
		goto nomem;
	}
	if (histd_extras_apply(o, x, NULL) ||
	    histd_extras_apply(fn, x, "$function") ||
	    histd_calls_add(&ex->calls, &ex->n_calls, &ex->cap_calls, c->id,
			    c->name))
		goto nomem;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(o);
	json_decref(fn);
	json_decref(x);
	return rc;
}

static int
exp_message(const histd_chat_dialect *d, histd_exp *ex, size_t i,
	    const Histd__V1__Message *m, json_t *arr)
{
	json_t *mx = histd_msg_state_get(m, d->key), *o = NULL;
	json_t *parts = json_array(), *calls = json_array();
	const char *refusal = NULL;
	const char *role;
	int rc = 0;

	if (!parts || !calls)
		goto nomem;
	/* Tool results first: they answer the assistant message before. */
	for (size_t j = 0; j < m->n_content; j++)
		if (m->content[j]->block_case ==
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
		    (rc = exp_tool_message(d, ex, i, (long)j, m->content[j], m,
					   arr)))
			goto out;
	if (m->role == HISTD__V1__ROLE__ROLE_TOOL)
		goto out;
	for (size_t j = 0; j < m->n_content; j++) {
		const Histd__V1__ContentBlock *b = m->content[j];
		json_t *p, *x;

		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
			continue;
		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
			if ((rc = exp_call(d, ex, i, (long)j, b, calls)))
				goto out;
			continue;
		}
		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT &&
		    d->refusal && (x = histd_blk_state_get(b, d->key))) {
			const char *rf = histd_mark_str(x, "$refusal");
			int field = rf && !strcmp(rf, "field");

			json_decref(x);
			if (field) {
				refusal = b->text->text;
				continue;
			}
		}
		if ((rc = exp_part(d, ex, i, (long)j, b, m->role, &p)))
			goto out;
		if (p && json_array_append_new(parts, p))
			goto nomem;
	}
	if (json_array_size(parts) == 0 && json_array_size(calls) == 0 &&
	    !refusal) {
		/* Only tool results (already written), or nothing kept. */
		if (m->n_content && m->content[0]->block_case !=
				    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
			histd_exp_drop(ex, i, -1, "a message with nothing %s "
				       "takes", ex->format);
		goto out;
	}
	switch (m->role) {
	case HISTD__V1__ROLE__ROLE_SYSTEM:
		role = histd_mark_str(mx, "$role") && d->developer_role
			? "developer" : "system";
		break;
	case HISTD__V1__ROLE__ROLE_ASSISTANT:
		role = "assistant";
		break;
	default:
		role = "user";
		break;
	}
	if (!(o = json_object()) || json_array_append(arr, o) ||
	    set_new(o, "role", json_string(role)) ||
	    put_content(d, o, parts, mx, m->role, json_array_size(calls) > 0))
		goto nomem;
	if (refusal && set_new(o, "refusal", json_string(refusal)))
		goto nomem;
	if (!refusal && json_object_get(mx, "$refusal") &&
	    json_object_set(o, "refusal", json_object_get(mx, "$refusal")))
		goto nomem;
	if (json_array_size(calls) && json_object_set(o, "tool_calls", calls))
		goto nomem;
	if (histd_extras_apply(o, mx, NULL))
		goto nomem;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(o);
	json_decref(mx);
	json_decref(parts);
	json_decref(calls);
	return rc;
}

int
histd_chat_export(const histd_chat_dialect *d, histd_exp *ex,
		  Histd__V1__Message *const *m, size_t n, json_t **out)
{
	json_t *root = json_object(), *arr = json_array();
	int rc;

	if (!root || !arr || json_object_set(root, "messages", arr)) {
		json_decref(root);
		json_decref(arr);
		return nomem();
	}
	for (size_t i = 0; i < n; i++)
		if ((rc = exp_message(d, ex, i, m[i], arr))) {
			json_decref(root);
			json_decref(arr);
			return rc;
		}
	json_decref(arr);
	*out = root;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                              */

json_t *
histd_chat_summary_request(const histd_summary_call *c,
			   const char *max_tokens_key)
{
	return json_pack("{s:s, s:I, s:[{s:s, s:s}, {s:s, s:s}]}", "model",
			 c->model, max_tokens_key,
			 (json_int_t)c->max_output_tokens,
			 "messages", "role", "system", "content",
			 c->instructions, "role", "user", "content", c->input);
}

int
histd_chat_summary_response(json_t *root, histd_summary_result *out)
{
	json_t *choices = json_object_get(root, "choices");
	json_t *msg = json_object_get(json_array_get(choices, 0), "message");
	json_t *c = json_object_get(msg, "content");
	json_t *usage = json_object_get(root, "usage");
	const char *model = json_string_value(json_object_get(root, "model"));
	char *text = NULL;

	if (json_is_string(c)) {
		text = strdup(json_string_value(c));
	} else if (json_is_array(c)) {
		size_t i, len = 0;
		json_t *e;

		json_array_foreach(c, i, e)
			len += json_string_length(json_object_get(e, "text"));
		if ((text = malloc(len + 1))) {
			len = 0;
			json_array_foreach(c, i, e) {
				json_t *t = json_object_get(e, "text");

				if (!json_is_string(t))
					continue;
				memcpy(text + len, json_string_value(t),
				       json_string_length(t));
				len += json_string_length(t);
			}
			text[len] = '\0';
		}
	} else {
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answer "
				       "has no choices[0].message.content");
	}
	if (!text)
		return nomem();
	if (!*text) {
		free(text);
		return histd_error_set(HISTD_EUNAVAILABLE, "the summarizer "
				       "returned an empty summary");
	}
	if (!(out->model = strdup(model ? model : ""))) {
		free(text);
		return nomem();
	}
	out->text = text;
	out->input_tokens = histd_usage_count(usage, "prompt_tokens");
	out->output_tokens = histd_usage_count(usage, "completion_tokens");
	return 0;
}
