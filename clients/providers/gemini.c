/*
 * Google Gemini generateContent: {"systemInstruction": {parts}, "contents":
 * [{role "user" | "model", parts: [...]}]}.
 *
 * Parts: text; thought (text with "thought": true) as reasoning with its
 * thoughtSignature; inlineData (base64) and fileData (URI) as images or
 * documents by MIME type; functionCall and functionResponse. A signature
 * Gemini puts on a text or functionCall part is kept in that block's
 * provider_state and written back on export, as Gemini checks it on the
 * follow-up request.
 *
 * Gemini's function calls may have no id, while histd's always have one:
 * import makes one up ("$gen_id" marks it, so export leaves it out) and
 * pairs each functionResponse without an id with the oldest unanswered call
 * of its name: in the session before the body (limits.tail), then in the
 * body.
 */
#include "provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define KEY "gemini"

static const char *const k_content[] = { "role", "parts", NULL };
static const char *const k_sys[] = { "parts", NULL };
static const char *const k_text[] = { "text", NULL };
static const char *const k_thought[] = { "text", "thought",
					 "thoughtSignature", NULL };
static const char *const k_inline_part[] = { "inlineData", NULL };
static const char *const k_inline[] = { "mimeType", "data", NULL };
static const char *const k_file_part[] = { "fileData", NULL };
static const char *const k_file[] = { "mimeType", "fileUri", NULL };
static const char *const k_call_part[] = { "functionCall", NULL };
static const char *const k_call[] = { "name", "args", "id", NULL };
static const char *const k_resp_part[] = { "functionResponse", NULL };
static const char *const k_resp[] = { "name", "response", "id", NULL };

static int
nomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
mark(json_t *x, const char *k, json_t *v)
{
	return !x || json_object_set_new(x, k, v) ? nomem() : 0;
}

static int
add(histd_imp *im, Histd__V1__Message *m, Histd__V1__ContentBlock *b,
    json_t *x)
{
	int rc;

	if (!b || !x) {
		json_decref(x);
		if (b)
			histd__v1__content_block__free_unpacked(b, NULL);
		return nomem();
	}
	rc = histd_blk_state(b, im->key, x);
	json_decref(x);
	if (rc) {
		histd__v1__content_block__free_unpacked(b, NULL);
		return rc;
	}
	return histd_msg_add(m, b);
}

/* ---------------------------------------------------------------------- */
/* Import                                                                 */

static int
gen_id(char out[40])
{
	unsigned char r[12];

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return histd_error_set(HISTD_EINTERNAL, "no random bytes");
	snprintf(out, 40, "gemini_");
	for (size_t i = 0; i < sizeof(r); i++)
		snprintf(out + 7 + 2 * i, 3, "%02x", r[i]);
	return 0;
}

static int
imp_media(histd_imp *im, json_t *part, int inline_data, Histd__V1__Message *m)
{
	const char *key = inline_data ? "inlineData" : "fileData";
	const char *mt, *s;
	Histd__V1__ContentBlock *b;
	json_t *o, *x;
	size_t p;
	int rc;

	if ((rc = histd_get_obj(im, part, key, 1, &o)))
		return rc;
	p = histd_imp_key(im, key);
	if ((rc = histd_get_str(im, o, "mimeType", inline_data, &mt)) ||
	    (rc = histd_get_str(im, o, inline_data ? "data" : "fileUri", 1,
				&s)))
		return rc;
	if (!*s)
		return histd_imp_fail_at(im, inline_data ? "data" : "fileUri",
					 "is empty");
	if (!inline_data && (rc = histd_imp_check_url(im, "fileUri", s)))
		return rc;
	if (inline_data) {
		uint8_t *d;
		size_t n;

		if (histd_b64_decode(s, strlen(s), &d, &n))
			return histd_imp_fail_at(im, "data",
						 "not valid base64");
		if (!n) {
			free(d);
			return histd_imp_fail_at(im, "data", "is empty");
		}
		if (!*mt) {
			free(d);
			return histd_imp_fail_at(im, "mimeType", "is empty");
		}
		b = histd_blk_media_data(d, n, mt, NULL);
	} else if (mt && histd_image_type(mt)) {
		b = histd_blk_image_url(s, mt);
	} else {
		b = histd_blk_doc_url(s, mt, NULL);
	}
	histd_imp_pop(im, p);
	x = histd_extras(part, inline_data ? k_inline_part : k_file_part);
	if (x && (rc = histd_extras_into(x, inline_data ? "$inline" : "$file",
					 o, inline_data ? k_inline : k_file))) {
		json_decref(x);
		if (b)
			histd__v1__content_block__free_unpacked(b, NULL);
		return rc;
	}
	return add(im, m, b, x);
}

static int
imp_call(histd_imp *im, json_t *part, Histd__V1__Message *m)
{
	const char *name, *id;
	char gid[40], *args = NULL;
	json_t *o, *a, *x;
	size_t p;
	int rc;

	if (m->role != HISTD__V1__ROLE__ROLE_ASSISTANT)
		return histd_imp_fail_at(im, "functionCall", "only in model "
					 "content");
	if ((rc = histd_get_obj(im, part, "functionCall", 1, &o)))
		return rc;
	p = histd_imp_key(im, "functionCall");
	if ((rc = histd_get_str(im, o, "name", 1, &name)) ||
	    (rc = histd_get_str(im, o, "id", 0, &id)) ||
	    (rc = histd_get_obj(im, o, "args", 0, &a)))
		return rc;
	if (!*name || strlen(name) > 128)
		return histd_imp_fail_at(im, "name", "must be 1..128 bytes");
	if (id && (!*id || strlen(id) > 128))
		return histd_imp_fail_at(im, "id", "must be 1..128 bytes");
	histd_imp_pop(im, p);
	if (!(x = histd_extras(part, k_call_part)))
		return nomem();
	if ((rc = histd_extras_into(x, "$call", o, k_call)))
		goto fail;
	if (!id) {
		if ((rc = gen_id(gid)) ||
		    (rc = mark(x, "$gen_id", json_true())))
			goto fail;
		id = gid;
	}
	if (a) {
		if (!(args = histd_json_text(a)))
			goto nomem;
	} else if ((rc = mark(x, "$no_args", json_true()))) {
		goto fail;
	}
	if ((rc = histd_calls_add(&im->calls, &im->n_calls, &im->cap_calls,
				  id, name)))
		goto fail;
	rc = add(im, m, histd_blk_tool_call(id, name, args ? args : ""), x);
	free(args);
	return rc;
nomem:
	rc = nomem();
fail:
	free(args);
	json_decref(x);
	return rc;
}

static int
imp_response(histd_imp *im, json_t *part, Histd__V1__Message *m)
{
	Histd__V1__ContentBlock *b;
	const char *name, *id;
	json_t *o, *r, *x;
	char *text;
	size_t p;
	int rc;

	if (m->role != HISTD__V1__ROLE__ROLE_USER)
		return histd_imp_fail_at(im, "functionResponse", "only in user "
					 "content");
	if ((rc = histd_get_obj(im, part, "functionResponse", 1, &o)))
		return rc;
	p = histd_imp_key(im, "functionResponse");
	if ((rc = histd_get_str(im, o, "name", 1, &name)) ||
	    (rc = histd_get_str(im, o, "id", 0, &id)) ||
	    (rc = histd_get_obj(im, o, "response", 1, &r)))
		return rc;
	if (id && (!*id || strlen(id) > 128))
		return histd_imp_fail_at(im, "id", "must be 1..128 bytes");
	if (!(x = histd_extras(part, k_resp_part)))
		return nomem();
	if (!id) {
		/* The oldest unanswered call of that name, the calls stored
		 * before the body first. */
		if ((rc = histd_imp_open_calls(im)))
			return json_decref(x), rc;
		for (size_t i = 0; i < im->n_calls && !id; i++)
			if (!im->calls[i].answered &&
			    !strcmp(im->calls[i].name, name)) {
				im->calls[i].answered = 1;
				id = im->calls[i].id;
			}
		if (!id) {
			json_decref(x);
			return histd_imp_fail_at(im, "name", "answers no "
						 "earlier functionCall");
		}
		if ((rc = mark(x, "$gen_id", json_true())))
			return json_decref(x), rc;
	} else {
		for (size_t i = 0; i < im->n_calls; i++)
			if (!strcmp(im->calls[i].id, id))
				im->calls[i].answered = 1;
	}
	histd_imp_pop(im, p);
	if ((rc = histd_extras_into(x, "$resp", o, k_resp)) ||
	    (rc = mark(x, "$json", json_true())))
		return json_decref(x), rc;
	if (!(b = histd_blk_tool_result(id, name, 0)) ||
	    !(text = histd_json_text(r))) {
		if (b)
			histd__v1__content_block__free_unpacked(b, NULL);
		json_decref(x);
		return nomem();
	}
	rc = histd_result_add(b->tool_result, histd_blk_text(text));
	free(text);
	if (rc) {
		histd__v1__content_block__free_unpacked(b, NULL);
		json_decref(x);
		return rc;
	}
	return add(im, m, b, x);
}

static int
imp_part(histd_imp *im, json_t *part, Histd__V1__Message *m, int system)
{
	const char *text, *sig;
	int thought, rc;
	json_t *x;

	if ((rc = histd_expect_obj(im, part)) ||
	    (rc = histd_get_bool(im, part, "thought", &thought)) ||
	    (rc = histd_get_str(im, part, "thoughtSignature", 0, &sig)))
		return rc;
	if (json_object_get(part, "text")) {
		if ((rc = histd_get_str(im, part, "text", 1, &text)))
			return rc;
		if (thought || (!*text && sig)) {
			if (system || m->role != HISTD__V1__ROLE__ROLE_ASSISTANT)
				return histd_imp_fail_at(im, "thought",
					"only in model content");
			if (!*text && !(sig && *sig))
				return histd_imp_fail_at(im, "text", "is empty");
			x = histd_extras(part, k_thought);
			if (x && !thought &&
			    (rc = mark(x, "$empty_text", json_true())))
				return json_decref(x), rc;
			if (x && json_object_get(part, "thought") && !thought &&
			    (rc = mark(x, "$thought_false", json_true())))
				return json_decref(x), rc;
			if (x && sig && !*sig &&
			    (rc = mark(x, "$empty_signature", json_true())))
				return json_decref(x), rc;
			if (x && json_object_size(x) == 0 &&
			    (rc = mark(x, "$origin", json_true())))
				return json_decref(x), rc;
			return add(im, m, histd_blk_reasoning(text, NULL, sig,
							      NULL, 0, 0), x);
		}
		if (!*text)
			return histd_imp_drop(im, "an empty text part");
		return add(im, m, histd_blk_text(text),
			   histd_extras(part, k_text));
	}
	if (system)
		return histd_imp_fail(im, "systemInstruction holds only text "
				      "parts");
	if (json_object_get(part, "inlineData"))
		return imp_media(im, part, 1, m);
	if (json_object_get(part, "fileData"))
		return imp_media(im, part, 0, m);
	if (json_object_get(part, "functionCall"))
		return imp_call(im, part, m);
	if (json_object_get(part, "functionResponse"))
		return imp_response(im, part, m);
	if (json_object_get(part, "executableCode") ||
	    json_object_get(part, "codeExecutionResult"))
		return histd_imp_drop(im, "a code execution part histd does "
				      "not keep");
	return histd_imp_fail(im, "not a known part");
}

static int
imp_content(histd_imp *im, json_t *c, Histd__V1__Role role, int system)
{
	Histd__V1__Message *m;
	json_t *parts, *e, *x;
	size_t i, p, q;
	int rc;

	if ((rc = histd_get_arr(im, c, "parts", 1, &parts)) ||
	    (rc = histd_msg_new(im, role, &m)))
		return rc;
	p = histd_imp_key(im, "parts");
	json_array_foreach(parts, i, e) {
		q = histd_imp_idx(im, i);
		if ((rc = imp_part(im, e, m, system)))
			return rc;
		histd_imp_pop(im, q);
	}
	histd_imp_pop(im, p);
	if (!(x = histd_extras(c, system ? k_sys : k_content)))
		return nomem();
	if (!system && !json_object_get(c, "role") &&
	    (rc = mark(x, "$no_role", json_true())))
		return json_decref(x), rc;
	rc = histd_msg_state(m, KEY, x);
	json_decref(x);
	return rc ? rc : histd_msg_drop_if_empty(im, m);
}

static int
import(histd_imp *im, json_t *root)
{
	json_t *v, *contents, *c;
	const char *k, *role;
	size_t i, p, q;
	int rc;

	json_object_foreach(root, k, v)
		if (strcmp(k, "systemInstruction") && strcmp(k, "contents") &&
		    (rc = histd_imp_drop_member(im, k)))
			return rc;
	if ((rc = histd_get_obj(im, root, "systemInstruction", 0, &v)))
		return rc;
	if (v) {
		p = histd_imp_key(im, "systemInstruction");
		if ((rc = imp_content(im, v, HISTD__V1__ROLE__ROLE_SYSTEM, 1)))
			return rc;
		histd_imp_pop(im, p);
	}
	if ((rc = histd_get_arr(im, root, "contents", 1, &contents)))
		return rc;
	p = histd_imp_key(im, "contents");
	json_array_foreach(contents, i, c) {
		Histd__V1__Role r;

		q = histd_imp_idx(im, i);
		if ((rc = histd_expect_obj(im, c)) ||
		    (rc = histd_get_str(im, c, "role", 0, &role)))
			return rc;
		if (!role || !strcmp(role, "user"))
			r = HISTD__V1__ROLE__ROLE_USER;
		else if (!strcmp(role, "model"))
			r = HISTD__V1__ROLE__ROLE_ASSISTANT;
		else
			return histd_imp_fail_at(im, "role", "must be user or "
						 "model");
		if ((rc = imp_content(im, c, r, 0)))
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
inline_data(const char *mt, const uint8_t *d, size_t n)
{
	char *b = histd_b64_encode(d, n);
	json_t *o = b ? json_pack("{s:s, s:s}", "mimeType", mt, "data", b)
		      : NULL;

	free(b);
	return o;
}

static int
exp_media(json_t *o, const char *mt, const ProtobufCBinaryData *data,
	  const char *url, json_t *x)
{
	json_t *v;

	if (data) {
		if (!(v = inline_data(mt, data->data, data->len)) ||
		    json_object_set_new(o, "inlineData", v) ||
		    histd_extras_apply(v, x, "$inline"))
			return -1;
		return 0;
	}
	if (!strncmp(url, "data:", 5)) {
		Histd__V1__ContentBlock *tmp;
		int rc;

		if (histd_blk_from_url(url, 1, NULL, &tmp))
			return -1;
		rc = tmp->document->source_case ==
			     HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA
			? exp_media(o, tmp->document->media_type,
				    &tmp->document->data, NULL, x)
			: 1;
		histd__v1__content_block__free_unpacked(tmp, NULL);
		if (rc <= 0)
			return rc;
	}
	if (!(v = json_object()) || json_object_set_new(o, "fileData", v) ||
	    (mt[0] && set_new(v, "mimeType", json_string(mt))) ||
	    set_new(v, "fileUri", json_string(url)) ||
	    histd_extras_apply(v, x, "$file"))
		return -1;
	return 0;
}

/* The response object of a tool result. */
static json_t *
response_value(histd_exp *ex, size_t i, long j,
	       const Histd__V1__ToolResultBlock *t, json_t *x)
{
	int other;
	char *s = histd_result_text(t, &other);
	json_t *v = NULL;

	if (!s)
		return NULL;
	if (other)
		histd_exp_drop(ex, i, j, "an image or document in a tool "
			       "result, which Gemini does not take");
	if (histd_mark_bool(x, "$json")) {
		/* Came from Gemini: the text is the response object. */
		v = json_loads(s, 0, NULL);
		if (v && !json_is_object(v)) {
			json_decref(v);
			v = NULL;
		}
	}
	if (!v)
		v = json_pack("{s:s}", t->is_error ? "error" : "output", s);
	free(s);
	return v;
}

static int
exp_block(histd_exp *ex, size_t i, long j, const Histd__V1__ContentBlock *b,
	  json_t **out)
{
	json_t *o = json_object(), *x = histd_blk_state_get(b, KEY), *v;
	int rc = 0;

	*out = NULL;
	if (!o)
		goto nomem;
	switch (b->block_case) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
		if (set_new(o, "text", json_string(b->text->text)))
			goto nomem;
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
		if (exp_media(o, b->image->media_type,
			      b->image->source_case ==
					      HISTD__V1__IMAGE_BLOCK__SOURCE_DATA
				      ? &b->image->data : NULL,
			      b->image->source_case ==
					      HISTD__V1__IMAGE_BLOCK__SOURCE_URL
				      ? b->image->url : NULL,
			      x))
			goto nomem;
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
		if (exp_media(o, b->document->media_type,
			      b->document->source_case ==
				      HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA
				      ? &b->document->data : NULL,
			      b->document->source_case ==
				      HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL
				      ? b->document->url : NULL,
			      x))
			goto nomem;
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING: {
		const Histd__V1__ReasoningBlock *r = b->reasoning;

		if (histd_blk_foreign(b, KEY)) {
			histd_exp_drop(ex, i, j, "reasoning of another provider "
				       "(its signature does not verify with "
				       "Gemini)");
			goto dropped;
		}
		if (!r->text[0] && !r->signature[0]) {
			histd_exp_drop(ex, i, j, "reasoning Gemini cannot take "
				       "(no text or signature)");
			goto dropped;
		}
		if (set_new(o, "text", json_string(r->text)))
			goto nomem;
		if (!histd_mark_bool(x, "$empty_text") &&
		    set_new(o, "thought", json_true()))
			goto nomem;
		if (histd_mark_bool(x, "$thought_false") &&
		    set_new(o, "thought", json_false()))
			goto nomem;
		if ((r->signature[0] ||
		     histd_mark_bool(x, "$empty_signature")) &&
		    set_new(o, "thoughtSignature", json_string(r->signature)))
			goto nomem;
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL: {
		const Histd__V1__ToolCallBlock *c = b->tool_call;
		json_t *a = histd_args_value(ex, i, j, c->arguments);

		if (a && !json_is_object(a)) {
			json_t *w = json_pack("{s:o}", "value", a);

			histd_exp_drop(ex, i, j, "tool arguments that are not "
				       "an object, wrapped as {\"value\": ...}");
			a = w;
		}
		if (!a || !(v = json_object()) ||
		    json_object_set_new(o, "functionCall", v) ||
		    set_new(v, "name", json_string(c->name)) ||
		    (!histd_mark_bool(x, "$no_args")
			     ? json_object_set(v, "args", a) : 0) ||
		    (!histd_mark_bool(x, "$gen_id") &&
		     set_new(v, "id", json_string(c->id))) ||
		    histd_extras_apply(v, x, "$call") ||
		    histd_calls_add(&ex->calls, &ex->n_calls, &ex->cap_calls,
				    c->id, c->name)) {
			json_decref(a);
			goto nomem;
		}
		json_decref(a);
		break;
	}
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT: {
		const Histd__V1__ToolResultBlock *t = b->tool_result;
		const char *name = t->tool_name[0] ? t->tool_name
			: histd_calls_name(ex->calls, ex->n_calls,
					   t->tool_call_id);

		if (!name) {
			histd_exp_drop(ex, i, j, "a tool result whose tool name "
				       "is unknown");
			goto dropped;
		}
		if (!(v = json_object()) ||
		    json_object_set_new(o, "functionResponse", v) ||
		    set_new(v, "name", json_string(name)) ||
		    (!histd_mark_bool(x, "$gen_id") &&
		     set_new(v, "id", json_string(t->tool_call_id))) ||
		    set_new(v, "response", response_value(ex, i, j, t, x)) ||
		    histd_extras_apply(v, x, "$resp"))
			goto nomem;
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
	json_decref(o);
	json_decref(x);
	return rc;
}

static int
exp_parts(histd_exp *ex, size_t i, const Histd__V1__Message *m, json_t *parts)
{
	for (size_t j = 0; j < m->n_content; j++) {
		json_t *p;
		int rc = exp_block(ex, i, (long)j, m->content[j], &p);

		if (rc)
			return rc;
		if (p && json_array_append_new(parts, p))
			return nomem();
	}
	return 0;
}

static int
export(histd_exp *ex, Histd__V1__Message *const *msgs, size_t n, json_t **out)
{
	json_t *root = json_object(), *contents = json_array();
	json_t *sys = NULL, *sys_parts = json_array(), *last = NULL;
	int seen_other = 0, last_tool = 0, rc = 0;

	if (!root || !contents || !sys_parts)
		goto nomem;
	for (size_t i = 0; i < n; i++) {
		const Histd__V1__Message *m = msgs[i];
		json_t *mx = histd_msg_state_get(m, KEY), *parts, *c;

		if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM) {
			if (seen_other)
				histd_exp_drop(ex, i, -1, "a system message "
					       "after the first turn, moved to "
					       "systemInstruction");
			if (!sys) {
				sys = json_object();
				if (!sys || histd_extras_apply(sys, mx, NULL)) {
					json_decref(mx);
					goto nomem;
				}
			}
			json_decref(mx);
			if ((rc = exp_parts(ex, i, m, sys_parts)))
				goto out;
			continue;
		}
		seen_other = 1;
		if (m->role == HISTD__V1__ROLE__ROLE_TOOL && last && last_tool) {
			/* Responses to parallel calls go in one content. */
			json_decref(mx);
			if ((rc = exp_parts(ex, i, m, json_object_get(last,
								      "parts"))))
				goto out;
			continue;
		}
		if (!(c = json_object()) || !(parts = json_array()) ||
		    json_array_append_new(contents, c) ||
		    json_object_set_new(c, "parts", parts) ||
		    (!histd_mark_bool(mx, "$no_role") &&
		     set_new(c, "role", json_string(
			     m->role == HISTD__V1__ROLE__ROLE_ASSISTANT
				     ? "model" : "user"))) ||
		    histd_extras_apply(c, mx, NULL)) {
			json_decref(mx);
			goto nomem;
		}
		json_decref(mx);
		if ((rc = exp_parts(ex, i, m, parts)))
			goto out;
		if (json_array_size(parts) == 0) {
			histd_exp_drop(ex, i, -1, "a message with nothing "
				       "Gemini takes");
			json_array_remove(contents,
					  json_array_size(contents) - 1);
			continue;
		}
		last = c;
		last_tool = m->role == HISTD__V1__ROLE__ROLE_TOOL;
	}
	if (json_array_size(sys_parts)) {
		if (json_object_set(sys, "parts", sys_parts) ||
		    json_object_set(root, "systemInstruction", sys))
			goto nomem;
	}
	if (json_object_set(root, "contents", contents))
		goto nomem;
	*out = root;
	root = NULL;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(root);
	json_decref(contents);
	json_decref(sys);
	json_decref(sys_parts);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                              */

static char *
summary_url(const char *base, const char *model)
{
	char *s;

	return asprintf(&s, "%s/v1beta/models/%s:generateContent", base,
			model) < 0 ? NULL : s;
}

static json_t *
summary_request(const histd_summary_call *c)
{
	return json_pack("{s:{s:[{s:s}]}, s:[{s:s, s:[{s:s}]}], s:{s:I}}",
			 "systemInstruction", "parts", "text",
			 c->instructions, "contents", "role", "user", "parts",
			 "text", c->input, "generationConfig",
			 "maxOutputTokens", (json_int_t)c->max_output_tokens);
}

static int
summary_response(json_t *root, histd_summary_result *out)
{
	json_t *cand = json_array_get(json_object_get(root, "candidates"), 0);
	json_t *parts = json_object_get(json_object_get(cand, "content"),
					"parts");
	json_t *usage = json_object_get(root, "usageMetadata"), *p;
	const char *model = json_string_value(
		json_object_get(root, "modelVersion"));
	size_t i, len = 0;
	char *text;

	if (!json_is_array(parts))
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answer "
				       "has no candidates[0].content.parts");
	json_array_foreach(parts, i, p)
		if (!json_is_true(json_object_get(p, "thought")))
			len += json_string_length(json_object_get(p, "text"));
	if (!len)
		return histd_error_set(HISTD_EUNAVAILABLE, "the summarizer "
				       "returned an empty summary");
	if (!(text = malloc(len + 1)))
		return nomem();
	len = 0;
	json_array_foreach(parts, i, p) {
		json_t *t = json_object_get(p, "text");

		if (!json_is_string(t) ||
		    json_is_true(json_object_get(p, "thought")))
			continue;
		memcpy(text + len, json_string_value(t), json_string_length(t));
		len += json_string_length(t);
	}
	text[len] = '\0';
	if (!(out->model = strdup(model ? model : ""))) {
		free(text);
		return nomem();
	}
	out->text = text;
	out->input_tokens = histd_usage_count(usage, "promptTokenCount");
	out->output_tokens = histd_usage_count(usage, "candidatesTokenCount");
	return 0;
}

const histd_format_ops histd_format_gemini = {
	.format = HISTD__V1__FORMAT__FORMAT_GEMINI,
	.name = "gemini",
	.key = KEY,
	.import = import,
	.export = export,
	.default_base_url = "https://generativelanguage.googleapis.com",
	.key_env = "GEMINI_API_KEY",
	.auth = HISTD_AUTH_GOOGLE,
	.summary_url = summary_url,
	.summary_request = summary_request,
	.summary_response = summary_response,
};
