/*
 * OpenAI Responses: {"instructions": string, "input": string | [items]}.
 *
 * Items are flat where histd groups: the reasoning, assistant message and
 * function_call items of one turn become one assistant message, and
 * consecutive function_call_output items one tool message. Each assistant
 * text block remembers which item it came from ("$item"), so that export
 * splits them back exactly; item-level members (id, status) ride on the
 * first block of the item, or on the message for user and system items.
 *
 * Reasoning items carry their summary, their encrypted_content (for
 * requests with store=false) and their id: a follow-up request needs them
 * back verbatim, and only from OpenAI.
 */
#include "provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY "openai_responses"

static const char *const k_msg_item[] = { "type", "role", "content", NULL };
static const char *const k_in_text[] = { "type", "text", NULL };
static const char *const k_in_image[] = { "type", "image_url", NULL };
static const char *const k_in_file[] = { "type", "file_data", "file_url",
					 "filename", NULL };
static const char *const k_refusal[] = { "type", "refusal", NULL };
static const char *const k_fcall[] = { "type", "call_id", "name",
				       "arguments", NULL };
static const char *const k_fout[] = { "type", "call_id", "output", NULL };
static const char *const k_reason[] = { "type", "summary",
					"encrypted_content", "content", NULL };

static const char *const dropped_items[] = {
	"item_reference", "web_search_call", "file_search_call",
	"computer_call", "computer_call_output", "image_generation_call",
	"code_interpreter_call", "local_shell_call", "local_shell_call_output",
	"mcp_list_tools", "mcp_approval_request", "mcp_approval_response",
	"mcp_call", "custom_tool_call", "custom_tool_call_output", NULL,
};

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
add(histd_imp *im, Histd__V1__Message *m, Histd__V1__ToolResultBlock *r,
    Histd__V1__ContentBlock *b, json_t *x)
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
	return r ? histd_result_add(r, b) : histd_msg_add(m, b);
}

/* ---------------------------------------------------------------------- */
/* Import                                                                 */

/* One content part. first_x: item-level marks to put on the first block
 * made (consumed when used; set to NULL). */
static int
imp_part(histd_imp *im, json_t *p, Histd__V1__Message *m,
	 Histd__V1__ToolResultBlock *r, json_t **first_x, long item)
{
	Histd__V1__ContentBlock *b = NULL;
	const char *type, *s, *fn;
	json_t *x = NULL;
	int rc;

	if ((rc = histd_expect_obj(im, p)) ||
	    (rc = histd_get_str(im, p, "type", 1, &type)))
		return rc;
	if (m && m->role == HISTD__V1__ROLE__ROLE_SYSTEM &&
	    strcmp(type, "input_text"))
		return histd_imp_fail_at(im, "type", "system messages hold "
					 "only input_text");
	if (!strcmp(type, "input_text") || !strcmp(type, "output_text")) {
		if ((rc = histd_get_str(im, p, "text", 1, &s)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "text", "is empty");
		x = histd_extras(p, k_in_text);
		if (type[0] == 'o' && (rc = mark(x, "$output", json_true())))
			goto fail;
		b = histd_blk_text(s);
	} else if (!strcmp(type, "refusal")) {
		if ((rc = histd_get_str(im, p, "refusal", 1, &s)))
			return rc;
		if (!*s)
			return histd_imp_fail_at(im, "refusal", "is empty");
		x = histd_extras(p, k_refusal);
		if ((rc = mark(x, "$refusal", json_true())))
			goto fail;
		b = histd_blk_text(s);
	} else if (!strcmp(type, "input_image")) {
		if ((rc = histd_get_str_or_null(im, p, "image_url", &s)))
			return rc;
		if (!s || !*s)
			return histd_imp_drop(im, "an image by file id (not "
					      "kept)");
		if ((rc = histd_imp_check_url(im, "image_url", s)))
			return rc;
		x = histd_extras(p, k_in_image);
		/* Export writes "detail": "auto" for an image it has no
		 * state for (one a caller appended): keep that none came. */
		if (!json_object_get(p, "detail") &&
		    (rc = mark(x, "$no_detail", json_true())))
			goto fail;
		if ((rc = histd_blk_from_url(s, 0, NULL, &b)))
			goto fail;
	} else if (!strcmp(type, "input_file")) {
		const char *data, *url;

		if ((rc = histd_get_str(im, p, "file_data", 0, &data)) ||
		    (rc = histd_get_str(im, p, "file_url", 0, &url)) ||
		    (rc = histd_get_str(im, p, "filename", 0, &fn)))
			return rc;
		if (data && !strncmp(data, "data:", 5)) {
			if ((rc = histd_imp_check_url(im, "file_data", data)))
				return rc;
			x = histd_extras(p, k_in_file);
			if ((rc = histd_blk_from_url(data, 1, fn, &b)))
				goto fail;
		} else if (data && *data) {
			return histd_imp_fail_at(im, "file_data", "expected a "
						 "data: URI");
		} else if (url && *url) {
			if ((rc = histd_imp_check_url(im, "file_url", url)))
				return rc;
			x = histd_extras(p, k_in_file);
			if ((rc = mark(x, "$file_url", json_true())))
				goto fail;
			b = histd_blk_doc_url(url, NULL, fn);
		} else {
			return histd_imp_drop(im, "a file by file id (not "
					      "kept)");
		}
		/* Export names inline data it has no state for (the API
		 * wants a filename): keep that none came, or "". */
		if (!(fn && *fn) &&
		    (rc = mark(x, "$filename", fn ? json_string("")
						  : json_null())))
			goto fail;
	} else {
		return histd_imp_fail_at(im, "type", "not a known part type");
	}
	if (x && item >= 0 && (rc = mark(x, "$item", json_integer(item))))
		goto fail;
	if (x && first_x && *first_x) {
		if ((rc = mark(x, "$item_x", *first_x)))
			goto fail;
		*first_x = NULL;
	}
	return add(im, m, r, b, x);
fail:
	json_decref(x);
	if (b)
		histd__v1__content_block__free_unpacked(b, NULL);
	return rc;
}

/* content of a message item or output of function_call_output: string or
 * array. Records the shape in sx ("$content"). */
static int
imp_parts(histd_imp *im, json_t *c, const char *key, Histd__V1__Message *m,
	  Histd__V1__ToolResultBlock *r, json_t *sx, json_t **first_x,
	  long item)
{
	json_t *e;
	size_t i, p = histd_imp_key(im, key), q;
	int rc;

	if (json_is_string(c)) {
		if (sx && (rc = mark(sx, "$content", json_string("string"))))
			return rc;
		if (json_string_length(c)) {
			json_t *x = json_object();

			if (x && item >= 0 &&
			    (rc = mark(x, "$item", json_integer(item))))
				return json_decref(x), rc;
			if (x && first_x && *first_x) {
				if ((rc = mark(x, "$item_x", *first_x)))
					return json_decref(x), rc;
				*first_x = NULL;
			}
			if ((rc = add(im, m, r, histd_blk_text(
					json_string_value(c)), x)))
				return rc;
		}
	} else if (json_is_array(c)) {
		json_array_foreach(c, i, e) {
			q = histd_imp_idx(im, i);
			if ((rc = imp_part(im, e, m, r, first_x, item)))
				return rc;
			histd_imp_pop(im, q);
		}
	} else {
		return histd_imp_fail(im, c ? "expected a string or an array"
					    : "is required");
	}
	histd_imp_pop(im, p);
	return 0;
}

typedef struct group {
	Histd__V1__Message *assistant;
	Histd__V1__Message *tool;
} group;

static int
imp_message_item(histd_imp *im, json_t *it, long k, group *g)
{
	const char *role, *type;
	json_t *x, *c;
	Histd__V1__Message *m;
	int rc;

	if ((rc = histd_get_str(im, it, "role", 1, &role)) ||
	    (rc = histd_get_str(im, it, "type", 0, &type)))
		return rc;
	c = json_object_get(it, "content");
	if (!c)
		return histd_imp_fail_at(im, "content", "is required");
	if (!(x = histd_extras(it, k_msg_item)))
		return nomem();
	if (!type && (rc = mark(x, "$untyped", json_true())))
		goto out;
	if (!strcmp(role, "assistant")) {
		json_t *first;
		size_t before;

		/* The item's shape and members ride on its first block. */
		if (json_is_string(c) &&
		    (rc = mark(x, "$content", json_string("string"))))
			goto out;
		g->tool = NULL;
		if (!g->assistant &&
		    (rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_ASSISTANT,
					&g->assistant)))
			goto out;
		m = g->assistant;
		before = m->n_content;
		first = x;
		x = NULL;
		rc = imp_parts(im, c, "content", m, NULL, NULL, &first, k);
		json_decref(first);
		if (!rc && m->n_content == before)
			rc = histd_imp_drop(im, "an assistant message with no "
					    "content");
		return rc;
	}
	g->assistant = g->tool = NULL;
	if (!strcmp(role, "user")) {
		rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_USER, &m);
	} else if (!strcmp(role, "system") || !strcmp(role, "developer")) {
		rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_SYSTEM, &m);
		if (!rc && role[0] == 'd')
			rc = mark(x, "$role", json_string("developer"));
	} else {
		rc = histd_imp_fail_at(im, "role", "not a supported role");
	}
	if (rc || (rc = imp_parts(im, c, "content", m, NULL, x, NULL, -1)) ||
	    (rc = histd_msg_state(m, KEY, x)))
		goto out;
	rc = histd_msg_drop_if_empty(im, m);
out:
	json_decref(x);
	return rc;
}

static int
imp_reasoning(histd_imp *im, json_t *it, group *g)
{
	json_t *sum, *cont, *x, *e;
	const char *enc, *id;
	char *summary = NULL, *text = NULL;
	size_t i, n;
	int rc;

	if ((rc = histd_get_arr(im, it, "summary", 1, &sum)) ||
	    (rc = histd_get_str_or_null(im, it, "encrypted_content", &enc)) ||
	    (rc = histd_get_arr(im, it, "content", 0, &cont)))
		return rc;
	if (!(x = histd_extras(it, k_reason)))
		return nomem();
	/* Join the parts; several are kept whole as well. */
	for (int pass = 0; pass < 2; pass++) {
		json_t *arr = pass ? cont : sum;
		const char *want = pass ? "reasoning_text" : "summary_text";
		size_t len = 0, p;
		char *s;

		if (!arr)
			continue;
		p = histd_imp_key(im, pass ? "content" : "summary");
		json_array_foreach(arr, i, e) {
			const char *t, *ty;
			size_t q = histd_imp_idx(im, i);

			if ((rc = histd_expect_obj(im, e)) ||
			    (rc = histd_get_str(im, e, "type", 1, &ty)) ||
			    (rc = histd_get_str(im, e, "text", 1, &t)))
				goto out;
			if (strcmp(ty, want)) {
				rc = histd_imp_fail_at(im, "type", "must be %s",
						       want);
				goto out;
			}
			len += strlen(t) + 2;
			histd_imp_pop(im, q);
		}
		histd_imp_pop(im, p);
		if (!(s = calloc(1, len + 1))) {
			rc = nomem();
			goto out;
		}
		n = 0;
		json_array_foreach(arr, i, e) {
			const char *t = json_string_value(
				json_object_get(e, "text"));

			if (n) {
				memcpy(s + n, "\n\n", 2);
				n += 2;
			}
			memcpy(s + n, t, strlen(t));
			n += strlen(t);
		}
		if (pass)
			text = s;
		else
			summary = s;
		if ((json_array_size(arr) != 1 ||
		     json_object_size(json_array_get(arr, 0)) != 2) &&
		    (rc = mark(x, pass ? "$content" : "$summary",
			       json_incref(arr))))
			goto out;
	}
	if (json_object_get(it, "encrypted_content") && !enc &&
	    (rc = mark(x, "$enc_null", json_true())))
		goto out;
	/* OpenAI requires the id (kept in extras): export writes no
	 * reasoning without one. */
	if ((rc = histd_get_str(im, it, "id", 1, &id)))
		goto out;
	if (!*id) {
		rc = histd_imp_fail_at(im, "id", "is empty");
		goto out;
	}
	if (!(summary && *summary) && !(text && *text) && !(enc && *enc)) {
		rc = histd_imp_drop(im, "a reasoning item with no summary, "
				    "text or encrypted content");
		goto out;
	}
	g->tool = NULL;
	if (!g->assistant &&
	    (rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_ASSISTANT,
				&g->assistant)))
		goto out;
	rc = add(im, g->assistant, NULL,
		 histd_blk_reasoning(text, summary, NULL, enc,
				     enc ? strlen(enc) : 0, 0),
		 x);
	x = NULL;
out:
	json_decref(x);
	free(summary);
	free(text);
	return rc;
}

static int
imp_item(histd_imp *im, json_t *it, long k, group *g)
{
	const char *type, *id, *name, *args;
	json_t *x;
	int rc;

	if ((rc = histd_expect_obj(im, it)) ||
	    (rc = histd_get_str(im, it, "type", 0, &type)))
		return rc;
	if (!type || !strcmp(type, "message"))
		return imp_message_item(im, it, k, g);
	if (!strcmp(type, "reasoning"))
		return imp_reasoning(im, it, g);
	if (!strcmp(type, "function_call")) {
		if ((rc = histd_get_str(im, it, "call_id", 1, &id)) ||
		    (rc = histd_get_str(im, it, "name", 1, &name)) ||
		    (rc = histd_get_str(im, it, "arguments", 1, &args)))
			return rc;
		if (!*id || strlen(id) > 128)
			return histd_imp_fail_at(im, "call_id", "must be "
						 "1..128 bytes");
		if (!*name || strlen(name) > 128)
			return histd_imp_fail_at(im, "name", "must be 1..128 "
						 "bytes");
		if (*args && (rc = histd_imp_check_args(im, "arguments",
							 args)))
			return rc;
		g->tool = NULL;
		if (!g->assistant &&
		    (rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_ASSISTANT,
					&g->assistant)))
			return rc;
		if ((rc = histd_calls_add(&im->calls, &im->n_calls,
					  &im->cap_calls, id, name)))
			return rc;
		x = histd_extras(it, k_fcall);
		/* "" is histd's "no arguments" too, which export writes as
		 * "{}": keep which one came. */
		if (!*args && (rc = mark(x, "$args", json_string("empty")))) {
			json_decref(x);
			return rc;
		}
		return add(im, g->assistant, NULL,
			   histd_blk_tool_call(id, name, args), x);
	}
	if (!strcmp(type, "function_call_output")) {
		Histd__V1__ContentBlock *b;
		json_t *out;

		if ((rc = histd_get_str(im, it, "call_id", 1, &id)))
			return rc;
		if (!*id || strlen(id) > 128)
			return histd_imp_fail_at(im, "call_id", "must be "
						 "1..128 bytes");
		g->assistant = NULL;
		if (!g->tool &&
		    (rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_TOOL,
					&g->tool)))
			return rc;
		b = histd_blk_tool_result(id, histd_calls_name(im->calls,
							       im->n_calls, id),
					  0);
		if (!b || !(x = histd_extras(it, k_fout))) {
			if (b)
				histd__v1__content_block__free_unpacked(b,
									NULL);
			return nomem();
		}
		/* Export writes a result of one text (or none) as a string,
		 * as an appended one goes: keep that a list came. */
		out = json_object_get(it, "output");
		if ((json_is_array(out) &&
		     (rc = mark(x, "$content", json_string("array")))) ||
		    (rc = imp_parts(im, out, "output", NULL, b->tool_result,
				    x, NULL, -1))) {
			json_decref(x);
			histd__v1__content_block__free_unpacked(b, NULL);
			return rc;
		}
		return add(im, g->tool, NULL, b, x);
	}
	for (size_t i = 0; dropped_items[i]; i++)
		if (!strcmp(type, dropped_items[i])) {
			g->assistant = g->tool = NULL;
			return histd_imp_drop(im, "a %s item histd does not "
					      "keep", type);
		}
	return histd_imp_fail_at(im, "type", "not a known item type");
}

static int
import_body(histd_imp *im, json_t *root)
{
	Histd__V1__Message *m;
	json_t *v, *input, *e, *x;
	const char *k, *ins;
	group g = { 0 };
	size_t i, p, q;
	int rc;

	json_object_foreach(root, k, v)
		if (strcmp(k, "instructions") && strcmp(k, "input") &&
		    (rc = histd_imp_drop_member(im, k)))
			return rc;
	if ((rc = histd_get_str_or_null(im, root, "instructions", &ins)))
		return rc;
	if (ins && *ins) {
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_SYSTEM, &m)) ||
		    (rc = histd_msg_add(m, histd_blk_text(ins))))
			return rc;
		if (!(x = json_pack("{s:b}", "$instructions", 1)))
			return nomem();
		rc = histd_msg_state(m, KEY, x);
		json_decref(x);
		if (rc)
			return rc;
	}
	input = json_object_get(root, "input");
	if (!input)
		return histd_imp_fail_at(im, "input", "is required");
	if (json_is_string(input)) {
		if (!json_string_length(input))
			return histd_imp_fail_at(im, "input", "is empty");
		if ((rc = histd_msg_new(im, HISTD__V1__ROLE__ROLE_USER, &m)) ||
		    (rc = histd_msg_add(m, histd_blk_text(
						   json_string_value(input)))))
			return rc;
		if (!(x = json_pack("{s:s}", "$input", "string")))
			return nomem();
		rc = histd_msg_state(m, KEY, x);
		json_decref(x);
		return rc;
	}
	if (!json_is_array(input))
		return histd_imp_fail_at(im, "input", "expected a string or an "
					 "array");
	p = histd_imp_key(im, "input");
	json_array_foreach(input, i, e) {
		q = histd_imp_idx(im, i);
		if ((rc = imp_item(im, e, (long)i, &g)))
			return rc;
		histd_imp_pop(im, q);
	}
	histd_imp_pop(im, p);
	return 0;
}

/*
 * instructions "" or null make no system message; the first message this
 * import made (n0: the count before it) keeps which one came, and export
 * writes it back when that message comes first.
 */
static int
keep_empty_instructions(histd_imp *im, size_t n0, json_t *ins)
{
	for (size_t i = n0; i < im->t->n_messages; i++)
		if (im->t->messages[i]->n_content)
			return histd_msg_mark(im->t->messages[i], KEY,
					      "$empty_instructions",
					      json_deep_copy(ins));
	return 0;
}

static int
import(histd_imp *im, json_t *root)
{
	json_t *ins_v = json_object_get(root, "instructions");
	size_t n0 = im->t->n_messages;
	int rc;

	if ((rc = import_body(im, root)))
		return rc;
	if (ins_v && (json_is_null(ins_v) ||
		      (json_is_string(ins_v) && !json_string_length(ins_v))))
		return keep_empty_instructions(im, n0, ins_v);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Export                                                                 */

static int
set_new(json_t *o, const char *k, json_t *v)
{
	return v ? json_object_set_new(o, k, v) : -1;
}

/* A text/image/document block as a part; *out NULL when dropped. */
static int
exp_part(histd_exp *ex, size_t i, long j, const Histd__V1__ContentBlock *b,
	 int assistant, json_t **out)
{
	json_t *o = json_object(), *x = histd_blk_state_get(b, KEY);
	char *url = NULL;
	int rc = 0;

	*out = NULL;
	if (!o)
		goto nomem;
	switch (b->block_case) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
		if (histd_mark_bool(x, "$refusal")) {
			if (set_new(o, "type", json_string("refusal")) ||
			    set_new(o, "refusal", json_string(b->text->text)))
				goto nomem;
		} else if (set_new(o, "type", json_string(
				       assistant || histd_mark_bool(x, "$output")
					       ? "output_text" : "input_text")) ||
			   set_new(o, "text", json_string(b->text->text))) {
			goto nomem;
		}
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
		if (assistant) {
			histd_exp_drop(ex, i, j, "an image in an assistant "
				       "message");
			goto dropped;
		}
		url = b->image->source_case ==
				      HISTD__V1__IMAGE_BLOCK__SOURCE_DATA
			? histd_data_uri(b->image->media_type,
					 b->image->data.data,
					 b->image->data.len)
			: strdup(b->image->url);
		if (!url || set_new(o, "type", json_string("input_image")) ||
		    set_new(o, "image_url", json_string(url)))
			goto nomem;
		if (!x && set_new(o, "detail", json_string("auto")))
			goto nomem;
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT: {
		const Histd__V1__DocumentBlock *d = b->document;
		/* "" or none, as an imported file came (a "$filename" mark). */
		const char *fn = d->filename[0] ? d->filename
			: json_string_value(json_object_get(x, "$filename"));

		if (assistant) {
			histd_exp_drop(ex, i, j, "a document in an assistant "
				       "message");
			goto dropped;
		}
		if (set_new(o, "type", json_string("input_file")))
			goto nomem;
		/* A data: URI kept as a URL (how Import keeps one it cannot
		 * take apart) goes back as the inline data it was. */
		if (d->source_case == HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA ||
		    (d->source_case == HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL &&
		     !strncmp(d->url, "data:", 5))) {
			if (!(url = d->source_case ==
				    HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA
				    ? histd_data_uri(d->media_type, d->data.data,
						     d->data.len)
				    : strdup(d->url)) ||
			    set_new(o, "file_data", json_string(url)))
				goto nomem;
			/* The API wants a filename with inline data. */
			if (!fn && !json_object_get(x, "$filename"))
				fn = "document";
			if (fn && set_new(o, "filename", json_string(fn)))
				goto nomem;
		} else {
			if (set_new(o, "file_url", json_string(d->url)) ||
			    (fn && set_new(o, "filename", json_string(fn))))
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

/* Sets item["content"] (or "output") from parts with shape marks in sx:
 * one plain text or none goes as a string where it came as one, and for
 * an output with no mark (a result appended, not imported). */
static int
put_parts(json_t *item, const char *key, json_t *parts, json_t *sx)
{
	const char *shape = histd_mark_str(sx, "$content");
	json_t *one = json_array_size(parts) == 1 ? json_array_get(parts, 0)
						  : NULL;
	const char *t = one ? json_string_value(json_object_get(one, "type"))
			    : NULL;
	int plain = t && json_object_size(one) == 2 &&
		    (!strcmp(t, "input_text") || !strcmp(t, "output_text"));
	int as_string = shape ? !strcmp(shape, "string")
			      : !strcmp(key, "output");

	if (as_string && (plain || json_array_size(parts) == 0))
		return json_object_set_new(item, key, json_string(
			plain ? json_string_value(json_object_get(one, "text"))
			      : ""));
	return json_object_set(item, key, parts);
}

/* Starts a message item of role; x: item-level extras and marks. */
static json_t *
message_item(json_t *arr, const char *role, json_t *x)
{
	json_t *o = json_object();

	if (!o || json_array_append_new(arr, o))
		return NULL;
	if (!histd_mark_bool(x, "$untyped") &&
	    set_new(o, "type", json_string("message")))
		return NULL;
	if (set_new(o, "role", json_string(role)) ||
	    histd_extras_apply(o, x, NULL))
		return NULL;
	return o;
}

static int
exp_reasoning(histd_exp *ex, size_t i, long j, const Histd__V1__ContentBlock *b,
	      json_t *arr)
{
	const Histd__V1__ReasoningBlock *r = b->reasoning;
	json_t *x = histd_blk_state_get(b, KEY), *o = NULL, *s, *enc = NULL;
	int rc = 0;

	if (histd_blk_foreign(b, KEY)) {
		histd_exp_drop(ex, i, j, "reasoning of another provider, which "
			       "OpenAI does not take");
		goto out;
	}
	if (!json_is_string(json_object_get(x, "id"))) {
		histd_exp_drop(ex, i, j, "reasoning without the id OpenAI "
			       "requires");
		goto out;
	}
	if (r->encrypted_data.len) {
		if (histd_json_bytes_text(&r->encrypted_data, &enc))
			goto nomem;
		if (!enc) {
			histd_exp_drop(ex, i, j, "reasoning whose encrypted "
				       "content is not text");
			goto out;
		}
	}
	if (!(o = json_object()) || json_array_append(arr, o) ||
	    set_new(o, "type", json_string("reasoning")))
		goto nomem;
	if ((s = x ? json_object_get(x, "$summary") : NULL)) {
		if (json_object_set(o, "summary", s))
			goto nomem;
	} else if (r->summary[0]) {
		if (set_new(o, "summary", json_pack("[{s:s, s:s}]", "type",
						    "summary_text", "text",
						    r->summary)))
			goto nomem;
	} else if (set_new(o, "summary", json_array())) {
		goto nomem;
	}
	if ((s = x ? json_object_get(x, "$content") : NULL)) {
		if (json_object_set(o, "content", s))
			goto nomem;
	} else if (r->text[0] &&
		   set_new(o, "content", json_pack("[{s:s, s:s}]", "type",
						   "reasoning_text", "text",
						   r->text))) {
		goto nomem;
	}
	if (enc) {
		json_t *e = enc;

		enc = NULL;     /* set_new takes it, also when it fails */
		if (set_new(o, "encrypted_content", e))
			goto nomem;
	} else if (histd_mark_bool(x, "$enc_null") &&
		   json_object_set_new(o, "encrypted_content", json_null())) {
		goto nomem;
	}
	if (histd_extras_apply(o, x, NULL))
		goto nomem;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(enc);
	json_decref(o);
	json_decref(x);
	return rc;
}

static int
exp_result(histd_exp *ex, size_t i, long j, const Histd__V1__ContentBlock *b,
	   json_t *arr)
{
	const Histd__V1__ToolResultBlock *t = b->tool_result;
	json_t *x = histd_blk_state_get(b, KEY), *o = json_object();
	json_t *parts = json_array();
	int rc = 0;

	if (!o || !parts || json_array_append(arr, o) ||
	    set_new(o, "type", json_string("function_call_output")) ||
	    set_new(o, "call_id", json_string(t->tool_call_id)))
		goto nomem;
	for (size_t k = 0; k < t->n_content; k++) {
		json_t *p;

		if ((rc = exp_part(ex, i, j, t->content[k], 0, &p)))
			goto out;
		if (p && json_array_append_new(parts, p))
			goto nomem;
	}
	if (put_parts(o, "output", parts, x) || histd_extras_apply(o, x, NULL))
		goto nomem;
	if (t->is_error)
		histd_exp_drop(ex, i, j, "is_error of a tool result");
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(o);
	json_decref(x);
	json_decref(parts);
	return rc;
}

static int
exp_call(histd_exp *ex, const Histd__V1__ContentBlock *b, json_t *arr)
{
	const Histd__V1__ToolCallBlock *c = b->tool_call;
	json_t *x = histd_blk_state_get(b, KEY), *o = json_object();
	int rc = 0;

	(void)ex;
	if (!o || json_array_append(arr, o) ||
	    set_new(o, "type", json_string("function_call")) ||
	    set_new(o, "call_id", json_string(c->id)) ||
	    set_new(o, "name", json_string(c->name)) ||
	    set_new(o, "arguments", json_string(
		    c->arguments[0] ? c->arguments
		    : histd_mark_str(x, "$args") ? "" : "{}")) ||
	    histd_extras_apply(o, x, NULL))
		rc = nomem();
	json_decref(o);
	json_decref(x);
	return rc;
}

static int
exp_message(histd_exp *ex, size_t i, const Histd__V1__Message *m, json_t *arr,
	    json_t *root)
{
	json_t *mx = histd_msg_state_get(m, KEY), *item = NULL, *parts = NULL;
	json_t *shape_x = NULL;
	int assistant = m->role == HISTD__V1__ROLE__ROLE_ASSISTANT;
	long cur_item = -2;
	int rc = 0;

	if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM &&
	    histd_mark_bool(mx, "$instructions") && m->n_content == 1 &&
	    !json_object_get(root, "instructions")) {
		rc = json_object_set_new(root, "instructions", json_string(
			m->content[0]->text->text)) ? nomem() : 0;
		goto out;
	}
	for (size_t j = 0; j < m->n_content; j++) {
		const Histd__V1__ContentBlock *b = m->content[j];
		json_t *p, *bx;
		long it;

		switch (b->block_case) {
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
			item = NULL;
			if ((rc = exp_call(ex, b, arr)))
				goto out;
			continue;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
			item = NULL;
			if ((rc = exp_result(ex, i, (long)j, b, arr)))
				goto out;
			continue;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
			item = NULL;
			if ((rc = exp_reasoning(ex, i, (long)j, b, arr)))
				goto out;
			continue;
		default:
			break;
		}
		bx = assistant ? histd_blk_state_get(b, KEY) : NULL;
		it = histd_mark_int(bx, "$item");
		if (!item || (assistant && it != cur_item && it >= 0)) {
			/* A new message item: its members and shape come from
			 * the message (user, system) or from its first block
			 * (assistant). */
			const char *role = assistant ? "assistant"
				: m->role == HISTD__V1__ROLE__ROLE_SYSTEM
				? (histd_mark_str(mx, "$role") ? "developer"
							       : "system")
				: "user";

			json_decref(shape_x);
			shape_x = json_incref(assistant
				? json_object_get(bx, "$item_x") : mx);
			json_decref(parts);
			if (!(item = message_item(arr, role, shape_x)) ||
			    !(parts = json_array()) ||
			    json_object_set(item, "content", parts)) {
				json_decref(bx);
				goto nomem;
			}
			cur_item = it;
		}
		json_decref(bx);
		if ((rc = exp_part(ex, i, (long)j, b, assistant, &p)))
			goto out;
		if (p && (json_array_append_new(parts, p) ||
			  put_parts(item, "content", parts, shape_x)))
			goto nomem;
	}
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(parts);
	json_decref(shape_x);
	json_decref(mx);
	return rc;
}

static int
export(histd_exp *ex, Histd__V1__Message *const *msgs, size_t n, json_t **out)
{
	json_t *root = json_object(), *arr = json_array();
	int rc = 0;

	if (!root || !arr)
		goto nomem;
	for (size_t i = 0; i < n; i++)
		if ((rc = exp_message(ex, i, msgs[i], arr, root)))
			goto out;
	/* A lone user text that came as a string goes back as one. */
	if (json_array_size(arr) == 1 && n >= 1) {
		json_t *mx = histd_msg_state_get(msgs[n - 1], KEY);
		json_t *c = json_object_get(json_array_get(arr, 0), "content");

		if (histd_mark_str(mx, "$input") && json_array_size(c) == 1) {
			json_t *t = json_object_get(json_array_get(c, 0),
						    "text");

			if (json_object_set(root, "input", t)) {
				json_decref(mx);
				goto nomem;
			}
		}
		json_decref(mx);
	}
	if (!json_object_get(root, "input") &&
	    json_object_set(root, "input", arr))
		goto nomem;
	if (n >= 1 && !json_object_get(root, "instructions")) {
		json_t *mx = histd_msg_state_get(msgs[0], KEY);
		json_t *ins = json_object_get(mx, "$empty_instructions");

		if (ins && json_object_set(root, "instructions", ins)) {
			json_decref(mx);
			goto nomem;
		}
		json_decref(mx);
	}
	*out = root;
	root = NULL;
	goto out;
nomem:
	rc = nomem();
out:
	json_decref(root);
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
	return asprintf(&s, "%s/v1/responses", base) < 0 ? NULL : s;
}

static json_t *
summary_request(const histd_summary_call *c)
{
	return json_pack("{s:s, s:s, s:s, s:I, s:b}", "model", c->model,
			 "instructions", c->instructions, "input", c->input,
			 "max_output_tokens", (json_int_t)c->max_output_tokens,
			 "store", 0);
}

static int
summary_response(json_t *root, histd_summary_result *out)
{
	json_t *output = json_object_get(root, "output"), *it, *c;
	json_t *usage = json_object_get(root, "usage");
	const char *model = json_string_value(json_object_get(root, "model"));
	size_t i, k, len = 0;
	char *text = NULL;

	if (!json_is_array(output))
		return histd_error_set(HISTD_EUNAVAILABLE, "provider answer "
				       "has no output array");
	for (int pass = 0; pass < 2; pass++) {
		if (pass) {
			if (!len)
				return histd_error_set(HISTD_EUNAVAILABLE,
					"the summarizer returned an empty "
					"summary");
			if (!(text = malloc(len + 1)))
				return nomem();
			len = 0;
		}
		json_array_foreach(output, i, it) {
			if (strcmp(json_string_value(json_object_get(it, "type"))
					   ?: "", "message"))
				continue;
			json_array_foreach(json_object_get(it, "content"), k, c) {
				json_t *t = json_object_get(c, "text");

				if (!json_is_string(t))
					continue;
				if (pass)
					memcpy(text + len, json_string_value(t),
					       json_string_length(t));
				len += json_string_length(t);
			}
		}
	}
	text[len] = '\0';
	if (!(out->model = strdup(model ? model : ""))) {
		free(text);
		return nomem();
	}
	out->text = text;
	out->input_tokens = histd_usage_count(usage, "input_tokens");
	out->output_tokens = histd_usage_count(usage, "output_tokens");
	return 0;
}

const histd_format_ops histd_format_openai_responses = {
	.format = HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES,
	.name = "openai_responses",
	.key = KEY,
	.import = import,
	.export = export,
	.default_base_url = "https://api.openai.com",
	.key_env = "OPENAI_API_KEY",
	.auth = HISTD_AUTH_BEARER,
	.summary_url = summary_url,
	.summary_request = summary_request,
	.summary_response = summary_response,
};
