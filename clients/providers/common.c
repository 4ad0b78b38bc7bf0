/*
 * Shared pieces of the provider modules: JSON paths, typed getters,
 * message and block builders, provider_state extras, base64, and the
 * entry points of transcript.h that dispatch to a format's module.
 */
#include "provider.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static char *
xstrdup(const char *s)
{
	return strdup(s ? s : "");
}

/* ---------------------------------------------------------------------- */
/* Lists                                                                  */

int
histd_strlist_addf(histd_strlist *l, const char *fmt, ...)
{
	va_list ap;
	char *s;
	int n;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 8;
		char **v = realloc(l->v, cap * sizeof(*v));

		if (!v)
			return enomem();
		l->v = v;
		l->cap = cap;
	}
	va_start(ap, fmt);
	n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		return enomem();
	l->v[l->n++] = s;
	return 0;
}

void
histd_strlist_clear(histd_strlist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	memset(l, 0, sizeof(*l));
}

void
histd_transcript_clear(histd_transcript *t)
{
	for (size_t i = 0; i < t->n_messages; i++)
		if (t->messages[i])
			histd__v1__message__free_unpacked(t->messages[i], NULL);
	free(t->messages);
	histd_strlist_clear(&t->dropped);
	histd_strlist_clear(&t->origins);
	memset(t, 0, sizeof(*t));
}

int
histd_transcript_add(histd_transcript *t, Histd__V1__Message *m)
{
	if (t->n_messages == t->cap_messages) {
		size_t cap = t->cap_messages ? 2 * t->cap_messages : 16;
		Histd__V1__Message **v = realloc(t->messages,
						 cap * sizeof(*v));

		if (!v)
			return enomem();
		t->messages = v;
		t->cap_messages = cap;
	}
	t->messages[t->n_messages++] = m;
	return 0;
}

void
histd_transcript_limits_default(histd_transcript_limits *l)
{
	l->max_json_bytes = 64u << 20;
	l->max_string_bytes = 1u << 20;
	l->max_messages = 1000;
	l->max_depth = HISTD_TRANSCRIPT_MAX_DEPTH;
	l->tail = NULL;
	l->tail_arg = NULL;
}

/* ---------------------------------------------------------------------- */
/* Formats                                                                */

const histd_format_ops *
histd_format_ops_get(Histd__V1__Format f)
{
	switch (f) {
	case HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES:
		return &histd_format_anthropic;
	case HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT:
		return &histd_format_openai_chat;
	case HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES:
		return &histd_format_openai_responses;
	case HISTD__V1__FORMAT__FORMAT_GEMINI:
		return &histd_format_gemini;
	case HISTD__V1__FORMAT__FORMAT_MISTRAL:
		return &histd_format_mistral;
	default:
		return NULL;
	}
}

const char *
histd_format_name(Histd__V1__Format f)
{
	const histd_format_ops *o = histd_format_ops_get(f);

	return o ? o->name : NULL;
}

const char *
histd_format_state_key(Histd__V1__Format f)
{
	const histd_format_ops *o = histd_format_ops_get(f);

	return o ? o->key : NULL;
}

int
histd_format_parse(const char *name, Histd__V1__Format *out)
{
	static const struct {
		const char *name;
		Histd__V1__Format f;
	} names[] = {
		{ "anthropic_messages", HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES },
		{ "anthropic", HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES },
		{ "openai_chat", HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT },
		{ "openai", HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT },
		{ "openai_responses", HISTD__V1__FORMAT__FORMAT_OPENAI_RESPONSES },
		{ "gemini", HISTD__V1__FORMAT__FORMAT_GEMINI },
		{ "google", HISTD__V1__FORMAT__FORMAT_GEMINI },
		{ "mistral", HISTD__V1__FORMAT__FORMAT_MISTRAL },
	};

	for (size_t i = 0; name && i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(name, names[i].name)) {
			*out = names[i].f;
			return 0;
		}
	return histd_error_set(HISTD_EINVALID, "not a known provider format");
}

/* ---------------------------------------------------------------------- */
/* Paths                                                                  */

/* A JSON key as a path names it: a control byte (a key may hold any) as
 * \xNN, so that a path, and an error naming it, stays one line. */
static void
key_text(char *out, size_t cap, const char *key)
{
	size_t o = 0;

	for (const unsigned char *k = (const unsigned char *)key;
	     *k && o + 5 < cap; k++) {
		if (*k < 0x20 || *k == 0x7f)
			o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *k);
		else
			out[o++] = (char)*k;
	}
	out[o] = '\0';
}

size_t
histd_imp_key(histd_imp *im, const char *key)
{
	char k[HISTD_PATH_MAX];
	size_t old = im->plen;
	int n;

	key_text(k, sizeof(k), key);
	n = snprintf(im->path + old, sizeof(im->path) - old, "%s%s",
		     old ? "." : "", k);
	if (n > 0)
		im->plen = old + (size_t)n < sizeof(im->path)
				   ? old + (size_t)n : sizeof(im->path) - 1;
	return old;
}

size_t
histd_imp_idx(histd_imp *im, size_t i)
{
	size_t old = im->plen;
	int n = snprintf(im->path + old, sizeof(im->path) - old, "[%zu]", i);

	if (n > 0)
		im->plen = old + (size_t)n < sizeof(im->path)
				   ? old + (size_t)n : sizeof(im->path) - 1;
	return old;
}

static int
vfail(histd_imp *im, int code, const char *key, const char *fmt, va_list ap)
{
	char what[160];

	vsnprintf(what, sizeof(what), fmt, ap);
	if (key) {
		char k[HISTD_PATH_MAX];

		key_text(k, sizeof(k), key);
		return histd_error_set(code, "%s%s%s: %s", im->path,
				       im->plen ? "." : "", k, what);
	}
	return histd_error_set(code, "%s: %s",
			       im->plen ? im->path : "(body)", what);
}

int
histd_imp_fail(histd_imp *im, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vfail(im, HISTD_EINVALID, NULL, fmt, ap);
	va_end(ap);
	return rc;
}

/* histd_imp_fail for a configured limit (the caller's, not the format's):
 * ELIMIT, as Append answers for the same limit. */
static int
imp_limit(histd_imp *im, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vfail(im, HISTD_ELIMIT, NULL, fmt, ap);
	va_end(ap);
	return rc;
}

int
histd_imp_fail_at(histd_imp *im, const char *key, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = vfail(im, HISTD_EINVALID, key, fmt, ap);
	va_end(ap);
	return rc;
}

int
histd_imp_drop(histd_imp *im, const char *fmt, ...)
{
	char what[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return histd_strlist_addf(&im->t->dropped, "%s: %s",
				  im->plen ? im->path : "(body)", what);
}

int
histd_imp_drop_member(histd_imp *im, const char *key)
{
	char k[HISTD_PATH_MAX];

	key_text(k, sizeof(k), key);
	return histd_strlist_addf(&im->t->dropped,
				  "%s: not part of the transcript", k);
}

static const char *
type_name(json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER:
	case JSON_REAL: return "a number";
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	default: return "null";
	}
}

static int
get_typed(histd_imp *im, json_t *obj, const char *key, int required,
	  json_type t, const char *want, json_t **out)
{
	json_t *v = json_object_get(obj, key);

	*out = NULL;
	if (!v) {
		if (required)
			return histd_imp_fail_at(im, key, "is required");
		return 0;
	}
	if (json_typeof(v) != t)
		return histd_imp_fail_at(im, key, "expected %s, got %s", want,
					 type_name(v));
	*out = v;
	return 0;
}

int
histd_get_str(histd_imp *im, json_t *obj, const char *key, int required,
	      const char **out)
{
	json_t *v;
	int rc = get_typed(im, obj, key, required, JSON_STRING, "a string",
			   &v);

	*out = v ? json_string_value(v) : NULL;
	return rc;
}

int
histd_get_str_or_null(histd_imp *im, json_t *obj, const char *key,
		      const char **out)
{
	json_t *v = json_object_get(obj, key);

	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return histd_imp_fail_at(im, key, "expected a string, got %s",
					 type_name(v));
	*out = json_string_value(v);
	return 0;
}

int
histd_get_obj(histd_imp *im, json_t *obj, const char *key, int required,
	      json_t **out)
{
	return get_typed(im, obj, key, required, JSON_OBJECT, "an object",
			 out);
}

int
histd_get_arr(histd_imp *im, json_t *obj, const char *key, int required,
	      json_t **out)
{
	return get_typed(im, obj, key, required, JSON_ARRAY, "an array", out);
}

int
histd_get_bool(histd_imp *im, json_t *obj, const char *key, int *out)
{
	json_t *v = json_object_get(obj, key);

	*out = 0;
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return histd_imp_fail_at(im, key, "expected a boolean, got %s",
					 type_name(v));
	*out = json_is_true(v);
	return 0;
}

int
histd_expect_obj(histd_imp *im, json_t *v)
{
	if (!json_is_object(v))
		return histd_imp_fail(im, "expected an object, got %s",
				      type_name(v));
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Building                                                               */

int
histd_msg_new(histd_imp *im, Histd__V1__Role role, Histd__V1__Message **out)
{
	histd_transcript *t = im->t;
	Histd__V1__Message *m;

	if (t->n_messages >= im->lim->max_messages)
		return imp_limit(im, "more than %zu messages",
				 im->lim->max_messages);
	if (!(m = malloc(sizeof(*m))))
		return enomem();
	histd__v1__message__init(m);
	m->role = role;
	if (histd_transcript_add(t, m)) {
		free(m);
		return enomem();
	}
	/* Where it begins, for errors; without memory for it, no origins
	 * at all rather than shifted ones. */
	if (t->origins.n + 1 == t->n_messages &&
	    histd_strlist_addf(&t->origins, "%s", im->plen ? im->path : ""))
		histd_strlist_clear(&t->origins);
	*out = m;
	return 0;
}

int
histd_msg_drop_if_empty(histd_imp *im, Histd__V1__Message *m)
{
	histd_transcript *t = im->t;

	if (m->n_content || !t->n_messages || t->messages[t->n_messages - 1] != m)
		return 0;
	histd__v1__message__free_unpacked(m, NULL);
	t->messages[--t->n_messages] = NULL;
	if (t->origins.n == t->n_messages + 1)
		free(t->origins.v[--t->origins.n]);
	return histd_imp_drop(im, "a message with no content histd keeps");
}

static int
push_block(Histd__V1__ContentBlock ***v, size_t *n, Histd__V1__ContentBlock *b)
{
	Histd__V1__ContentBlock **nv;

	if (!b)
		return enomem();
	/* Grow by powers of two: n is the count, capacity the next power. */
	if ((*n & (*n - 1)) == 0) {
		nv = realloc(*v, (*n ? 2 * *n : 1) * sizeof(*nv));
		if (!nv) {
			histd__v1__content_block__free_unpacked(b, NULL);
			return enomem();
		}
		*v = nv;
	}
	(*v)[(*n)++] = b;
	return 0;
}

int
histd_msg_add(Histd__V1__Message *m, Histd__V1__ContentBlock *b)
{
	return push_block(&m->content, &m->n_content, b);
}

int
histd_result_add(Histd__V1__ToolResultBlock *r, Histd__V1__ContentBlock *b)
{
	return push_block(&r->content, &r->n_content, b);
}

static Histd__V1__ContentBlock *
blk_new(void)
{
	Histd__V1__ContentBlock *b = malloc(sizeof(*b));

	if (b)
		histd__v1__content_block__init(b);
	return b;
}

/* Frees a block being built (strings may still be the empty default). */
static Histd__V1__ContentBlock *
blk_abort(Histd__V1__ContentBlock *b)
{
	histd__v1__content_block__free_unpacked(b, NULL);
	return NULL;
}

Histd__V1__ContentBlock *
histd_blk_text(const char *s)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__TextBlock *t;

	if (!b)
		return NULL;
	if (!(t = malloc(sizeof(*t))))
		return blk_abort(b);
	histd__v1__text_block__init(t);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = t;
	if (!(t->text = xstrdup(s))) {
		t->text = (char *)protobuf_c_empty_string;
		return blk_abort(b);
	}
	return b;
}

/* Sets *dst to a copy of s unless s is empty (the default stays). */
static int
set_str(char **dst, const char *s)
{
	if (!s || !*s)
		return 0;
	if (!(*dst = strdup(s))) {
		*dst = (char *)protobuf_c_empty_string;
		return -1;
	}
	return 0;
}

Histd__V1__ContentBlock *
histd_blk_image_url(const char *url, const char *media_type)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__ImageBlock *im;

	if (!b)
		return NULL;
	if (!(im = malloc(sizeof(*im))))
		return blk_abort(b);
	histd__v1__image_block__init(im);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = im;
	if (set_str(&im->media_type, media_type))
		return blk_abort(b);
	im->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	if (!(im->url = xstrdup(url))) {
		im->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE__NOT_SET;
		return blk_abort(b);
	}
	return b;
}

Histd__V1__ContentBlock *
histd_blk_image_data(uint8_t *data, size_t len, const char *media_type)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__ImageBlock *im;

	if (!b) {
		free(data);
		return NULL;
	}
	if (!(im = malloc(sizeof(*im)))) {
		free(data);
		return blk_abort(b);
	}
	histd__v1__image_block__init(im);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = im;
	im->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_DATA;
	im->data.data = data;
	im->data.len = len;
	if (set_str(&im->media_type, media_type))
		return blk_abort(b);
	return b;
}

static Histd__V1__ContentBlock *
doc_new(const char *media_type, const char *filename)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__DocumentBlock *d;

	if (!b)
		return NULL;
	if (!(d = malloc(sizeof(*d))))
		return blk_abort(b);
	histd__v1__document_block__init(d);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT;
	b->document = d;
	if (set_str(&d->media_type, media_type) ||
	    set_str(&d->filename, filename))
		return blk_abort(b);
	return b;
}

Histd__V1__ContentBlock *
histd_blk_doc_url(const char *url, const char *media_type,
		  const char *filename)
{
	Histd__V1__ContentBlock *b = doc_new(media_type, filename);

	if (!b)
		return NULL;
	b->document->source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL;
	if (!(b->document->url = xstrdup(url))) {
		b->document->source_case =
			HISTD__V1__DOCUMENT_BLOCK__SOURCE__NOT_SET;
		return blk_abort(b);
	}
	return b;
}

Histd__V1__ContentBlock *
histd_blk_doc_data(uint8_t *data, size_t len, const char *media_type,
		   const char *filename)
{
	Histd__V1__ContentBlock *b = doc_new(media_type, filename);

	if (!b) {
		free(data);
		return NULL;
	}
	b->document->source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
	b->document->data.data = data;
	b->document->data.len = len;
	return b;
}

static const char *const image_types[] = {
	"image/png", "image/jpeg", "image/gif", "image/webp", NULL,
};

int
histd_image_type(const char *t)
{
	for (size_t i = 0; t && image_types[i]; i++)
		if (!strcmp(t, image_types[i]))
			return 1;
	return 0;
}

Histd__V1__ContentBlock *
histd_blk_media_data(uint8_t *data, size_t len, const char *media_type,
		     const char *filename)
{
	if (histd_image_type(media_type) && !(filename && *filename))
		return histd_blk_image_data(data, len, media_type);
	return histd_blk_doc_data(data, len, media_type, filename);
}

/* The parts of "data:<type>[;<name>=<value>]...[;base64],<payload>". */
struct data_uri {
	const char *type;
	size_t type_len;
	int params;           /* other parameters than base64 */
	int base64;
	const char *payload;
};

/* NULL with *d filled when url (which starts with "data:") is well formed,
 * else what is wrong with it. The media type is required: every format
 * that writes data as a data URI, inlineData or a base64 source names
 * its type. */
static const char *
data_uri_parse(const char *url, struct data_uri *d)
{
	const char *comma = strchr(url, ','), *p, *slash;

	memset(d, 0, sizeof(*d));
	if (!comma)
		return "a data: URI without a comma";
	d->type = url + 5;
	d->type_len = strcspn(d->type, ";,");
	slash = memchr(d->type, '/', d->type_len);
	if (!slash || slash == d->type || slash + 1 == d->type + d->type_len)
		return "a data: URI without a media type (type/subtype)";
	for (p = d->type + d->type_len; *p == ';'; p += strcspn(p + 1, ";,") + 1) {
		size_t n = strcspn(p + 1, ";,");

		if (n == 6 && !strncmp(p + 1, "base64", 6) && p[7] == ',')
			d->base64 = 1;
		else if (memchr(p + 1, '=', n) && p[1] != '=')
			d->params = 1;
		else
			return "a data: URI parameter that is neither base64 "
			       "nor name=value";
	}
	d->payload = comma + 1;
	if (d->base64)
		return NULL;
	for (p = d->payload; (p = strchr(p, '%')); p += 3)
		if (!isxdigit((unsigned char)p[1]) ||
		    !isxdigit((unsigned char)p[2]))
			return "a data: URI with a bad %-escape";
	return NULL;
}

int
histd_imp_check_url(histd_imp *im, const char *key, const char *url)
{
	struct data_uri d;
	const char *what;
	uint8_t *data;
	size_t len;
	int rc;

	if (strncmp(url, "data:", 5))
		return 0;
	if ((what = data_uri_parse(url, &d)))
		return histd_imp_fail_at(im, key, "%s", what);
	if (!d.base64)
		return 0;
	rc = histd_b64_decode(d.payload, strlen(d.payload), &data, &len);
	if (rc == HISTD_ENOMEM)
		return rc;
	if (rc)
		return histd_imp_fail_at(im, key, "a data: URI whose data is "
					 "not valid base64");
	free(data);
	return 0;
}

int
histd_blk_from_url(const char *url, int as_document, const char *filename,
		   Histd__V1__ContentBlock **out)
{
	struct data_uri d;
	char type[128];
	uint8_t *data;
	size_t len;

	*out = NULL;
	/* Only the form export rebuilds ("data:<type>;base64,"): a data URI
	 * with other parameters stays a url. */
	if (!strncmp(url, "data:", 5) && !data_uri_parse(url, &d) &&
	    d.base64 && !d.params && d.type_len < sizeof(type)) {
		memcpy(type, d.type, d.type_len);
		type[d.type_len] = '\0';
		if ((as_document || histd_image_type(type)) &&
		    histd_b64_decode(d.payload, strlen(d.payload), &data,
				     &len) == 0) {
			if (len > 0) {
				*out = as_document
				     ? histd_blk_doc_data(data, len, type,
							  filename)
				     : histd_blk_image_data(data, len, type);
				return *out ? 0 : enomem();
			}
			free(data); /* empty: kept as the URL it came as */
		}
		histd_error_clear();
	}
	*out = as_document ? histd_blk_doc_url(url, NULL, filename)
			   : histd_blk_image_url(url, NULL);
	return *out ? 0 : enomem();
}

Histd__V1__ContentBlock *
histd_blk_reasoning(const char *text, const char *summary,
		    const char *signature, const char *enc, size_t enc_len,
		    int redacted)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__ReasoningBlock *r;

	if (!b)
		return NULL;
	if (!(r = malloc(sizeof(*r))))
		return blk_abort(b);
	histd__v1__reasoning_block__init(r);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
	b->reasoning = r;
	r->redacted = redacted != 0;
	if (set_str(&r->text, text) || set_str(&r->summary, summary) ||
	    set_str(&r->signature, signature))
		return blk_abort(b);
	if (enc && enc_len) {
		if (!(r->encrypted_data.data = malloc(enc_len)))
			return blk_abort(b);
		memcpy(r->encrypted_data.data, enc, enc_len);
		r->encrypted_data.len = enc_len;
	}
	return b;
}

Histd__V1__ContentBlock *
histd_blk_tool_call(const char *id, const char *name, const char *arguments)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__ToolCallBlock *c;

	if (!b)
		return NULL;
	if (!(c = malloc(sizeof(*c))))
		return blk_abort(b);
	histd__v1__tool_call_block__init(c);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b->tool_call = c;
	if (set_str(&c->id, id) || set_str(&c->name, name) ||
	    set_str(&c->arguments, arguments))
		return blk_abort(b);
	return b;
}

Histd__V1__ContentBlock *
histd_blk_tool_result(const char *call_id, const char *name, int is_error)
{
	Histd__V1__ContentBlock *b = blk_new();
	Histd__V1__ToolResultBlock *r;

	if (!b)
		return NULL;
	if (!(r = malloc(sizeof(*r))))
		return blk_abort(b);
	histd__v1__tool_result_block__init(r);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b->tool_result = r;
	r->is_error = is_error != 0;
	if (set_str(&r->tool_call_id, call_id) || set_str(&r->tool_name, name))
		return blk_abort(b);
	return b;
}

/* ---------------------------------------------------------------------- */
/* Tool calls seen                                                        */

int
histd_calls_add(struct histd_callref **v, size_t *n, size_t *cap,
		const char *id, const char *name)
{
	if (*n == *cap) {
		size_t nc = *cap ? 2 * *cap : 16;
		struct histd_callref *nv = realloc(*v, nc * sizeof(*nv));

		if (!nv)
			return enomem();
		*v = nv;
		*cap = nc;
	}
	(*v)[*n].id = xstrdup(id);
	(*v)[*n].name = xstrdup(name);
	(*v)[*n].answered = 0;
	if (!(*v)[*n].id || !(*v)[*n].name) {
		free((*v)[*n].id);
		free((*v)[*n].name);
		return enomem();
	}
	(*n)++;
	return 0;
}

const char *
histd_calls_name(struct histd_callref *v, size_t n, const char *id)
{
	for (size_t i = n; i-- > 0;)
		if (!strcmp(v[i].id, id))
			return v[i].name;
	return NULL;
}

void
histd_calls_free(struct histd_callref *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].id);
		free(v[i].name);
	}
	free(v);
}

/* Marks the calls of v that a tool_result in m[0..n) answers. */
static void
calls_answer(struct histd_callref *v, size_t nv, Histd__V1__Message *const *m,
	     size_t n)
{
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < m[i]->n_content; j++) {
			const Histd__V1__ContentBlock *b = m[i]->content[j];

			if (b->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				continue;
			for (size_t k = 0; k < nv; k++)
				if (!strcmp(v[k].id, b->tool_result->tool_call_id))
					v[k].answered = 1;
		}
}

int
histd_imp_open_calls(histd_imp *im)
{
	histd_transcript tail = { 0 };
	struct histd_callref *v = NULL, *nv;
	size_t n = 0, cap = 0, o = 0;
	int rc;

	if (im->tail_read || !im->lim->tail)
		return 0;
	im->tail_read = 1;
	if ((rc = im->lim->tail(im->lim->tail_arg, &tail)))
		goto out;
	for (size_t i = 0; i < tail.n_messages && !rc; i++)
		for (size_t j = 0; j < tail.messages[i]->n_content && !rc; j++) {
			const Histd__V1__ContentBlock *b =
				tail.messages[i]->content[j];

			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL)
				rc = histd_calls_add(&v, &n, &cap,
						     b->tool_call->id,
						     b->tool_call->name);
		}
	if (rc)
		goto out;
	/* An answer always comes after its call: a call the tail answers
	 * has its result in the tail or in this body. */
	calls_answer(v, n, tail.messages, tail.n_messages);
	calls_answer(v, n, im->t->messages, im->t->n_messages);
	for (size_t i = 0; i < n; i++) {
		if (!v[i].answered) {
			v[o++] = v[i];
			continue;
		}
		free(v[i].id);
		free(v[i].name);
	}
	n = o;
	if (n && im->n_calls) {
		if (!(nv = realloc(v, (n + im->n_calls) * sizeof(*nv)))) {
			rc = enomem();
			goto out;
		}
		v = nv;
		memcpy(v + n, im->calls, im->n_calls * sizeof(*v));
	}
	if (n) {
		free(im->calls);
		im->calls = v;
		im->n_calls += n;
		im->cap_calls = im->n_calls;
		v = NULL;
		n = 0;
	}
out:
	histd_calls_free(v, n);
	histd_transcript_clear(&tail);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Extras                                                                 */

static int
known_key(const char *k, const char *const *known)
{
	for (size_t i = 0; known && known[i]; i++)
		if (!strcmp(k, known[i]))
			return 1;
	return 0;
}

/*
 * Keys that begin with '$' are histd's marks in provider_state ("$content",
 * "$thinking"). A body's own member of such a name is kept under one '$'
 * more ("$meta" as "$$meta"), so that it can never read as a mark, and
 * histd_extras_apply gives it back its name.
 */
int
histd_extras_into(json_t *dst, const char *sub, json_t *src,
		  const char *const *known)
{
	json_t *into = dst, *v;
	const char *k;
	int made = 0;

	if (!json_is_object(src))
		return 0;
	json_object_foreach(src, k, v) {
		char *esc = NULL;
		int rc;

		if (known_key(k, known))
			continue;
		if (sub && !made) {
			if (!(into = json_object()) ||
			    json_object_set_new(dst, sub, into))
				return enomem();
			made = 1;
		}
		if (k[0] == '$' && asprintf(&esc, "$%s", k) < 0)
			return enomem();
		rc = json_object_set(into, esc ? esc : k, v);
		free(esc);
		if (rc)
			return enomem();
	}
	return 0;
}

json_t *
histd_extras(json_t *obj, const char *const *known)
{
	json_t *x = json_object();

	if (x && histd_extras_into(x, NULL, obj, known)) {
		json_decref(x);
		return NULL;
	}
	return x;
}

static int
state_bytes(json_t *x, uint8_t **data, size_t *len)
{
	char *s;

	*data = NULL;
	*len = 0;
	if (!x || !json_is_object(x) || json_object_size(x) == 0)
		return 1;
	if (!(s = json_dumps(x, JSON_COMPACT | JSON_PRESERVE_ORDER)))
		return enomem();
	*data = (uint8_t *)s;
	*len = strlen(s);
	return 0;
}

int
histd_msg_state(Histd__V1__Message *m, const char *key, json_t *x)
{
	Histd__V1__Message__ProviderStateEntry *e, **v;
	uint8_t *data;
	size_t len;
	int rc = state_bytes(x, &data, &len);

	if (rc)
		return rc > 0 ? 0 : rc;
	if (!(e = malloc(sizeof(*e))) ||
	    !(v = realloc(m->provider_state,
			  (m->n_provider_state + 1) * sizeof(*v)))) {
		free(e);
		free(data);
		return enomem();
	}
	m->provider_state = v;
	histd__v1__message__provider_state_entry__init(e);
	if (!(e->key = strdup(key))) {
		free(e);
		free(data);
		return enomem();
	}
	e->value.data = data;
	e->value.len = len;
	v[m->n_provider_state++] = e;
	return 0;
}

int
histd_blk_state(Histd__V1__ContentBlock *b, const char *key, json_t *x)
{
	Histd__V1__ContentBlock__ProviderStateEntry *e, **v;
	uint8_t *data;
	size_t len;
	int rc = state_bytes(x, &data, &len);

	if (rc)
		return rc > 0 ? 0 : rc;
	if (!(e = malloc(sizeof(*e))) ||
	    !(v = realloc(b->provider_state,
			  (b->n_provider_state + 1) * sizeof(*v)))) {
		free(e);
		free(data);
		return enomem();
	}
	b->provider_state = v;
	histd__v1__content_block__provider_state_entry__init(e);
	if (!(e->key = strdup(key))) {
		free(e);
		free(data);
		return enomem();
	}
	e->value.data = data;
	e->value.len = len;
	v[b->n_provider_state++] = e;
	return 0;
}

static json_t *
state_parse(const ProtobufCBinaryData *v)
{
	json_t *j;

	if (!v->len)
		return NULL;
	j = json_loadb((const char *)v->data, v->len, 0, NULL);
	if (j && !json_is_object(j)) {
		json_decref(j);
		return NULL;
	}
	return j;
}

json_t *
histd_msg_state_get(const Histd__V1__Message *m, const char *key)
{
	for (size_t i = 0; i < m->n_provider_state; i++)
		if (!strcmp(m->provider_state[i]->key, key))
			return state_parse(&m->provider_state[i]->value);
	return NULL;
}

int
histd_msg_mark(Histd__V1__Message *m, const char *key, const char *name,
	       json_t *v)
{
	json_t *x = histd_msg_state_get(m, key);
	uint8_t *data;
	size_t len;
	int rc;

	if (!x && !(x = json_object())) {
		json_decref(v);
		return enomem();
	}
	if (!v || json_object_set_new(x, name, v)) {
		json_decref(x);
		return enomem();
	}
	for (size_t i = 0; i < m->n_provider_state; i++) {
		if (strcmp(m->provider_state[i]->key, key))
			continue;
		if ((rc = state_bytes(x, &data, &len)) == 0) {
			free(m->provider_state[i]->value.data);
			m->provider_state[i]->value.data = data;
			m->provider_state[i]->value.len = len;
		}
		json_decref(x);
		return rc;
	}
	rc = histd_msg_state(m, key, x);
	json_decref(x);
	return rc;
}

json_t *
histd_blk_state_get(const Histd__V1__ContentBlock *b, const char *key)
{
	for (size_t i = 0; i < b->n_provider_state; i++)
		if (!strcmp(b->provider_state[i]->key, key))
			return state_parse(&b->provider_state[i]->value);
	return NULL;
}

int
histd_blk_foreign(const Histd__V1__ContentBlock *b, const char *key)
{
	int other = 0;

	for (size_t i = 0; i < b->n_provider_state; i++) {
		if (!strcmp(b->provider_state[i]->key, key))
			return 0;
		other = 1;
	}
	return other;
}

int
histd_extras_apply(json_t *obj, json_t *x, const char *sub)
{
	const char *k;
	json_t *v;

	if (x && sub)
		x = json_object_get(x, sub);
	if (!x || !json_is_object(x))
		return 0;
	json_object_foreach(x, k, v) {
		const char *name = k[0] == '$' ? k + 1 : k;

		/* A mark, or a member the export has written itself. */
		if ((k[0] == '$' && k[1] != '$') || json_object_get(obj, name))
			continue;
		if (json_object_set(obj, name, v))
			return enomem();
	}
	return 0;
}

const char *
histd_mark_str(json_t *x, const char *name)
{
	return x ? json_string_value(json_object_get(x, name)) : NULL;
}

int
histd_mark_bool(json_t *x, const char *name)
{
	return x && json_is_true(json_object_get(x, name));
}

long long
histd_mark_int(json_t *x, const char *name)
{
	json_t *v = x ? json_object_get(x, name) : NULL;

	return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* ---------------------------------------------------------------------- */
/* Export helpers                                                         */

int
histd_json_bytes_text(const ProtobufCBinaryData *b, json_t **out)
{
	json_t *probe;

	if ((*out = json_stringn((const char *)b->data, b->len)))
		return 0;
	/* jansson says NULL for bytes that are not UTF-8 and for a lack of
	 * memory alike: a string that is text tells them apart. */
	if (!(probe = json_string("")))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	json_decref(probe);
	return 0;
}

void
histd_exp_drop(histd_exp *ex, size_t i, long j, const char *fmt, ...)
{
	char what[160];
	va_list ap;
	int rc;

	if (!ex->dropped)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (j >= 0)
		rc = histd_strlist_addf(ex->dropped,
					"messages[%zu].content[%ld]: %s", i, j,
					what);
	else
		rc = histd_strlist_addf(ex->dropped, "messages[%zu]: %s", i,
					what);
	if (rc)
		ex->nomem = 1;
}

char *
histd_result_text(const Histd__V1__ToolResultBlock *r, int *other)
{
	size_t len = 0, o = 0;
	char *s;

	*other = 0;
	for (size_t k = 0; k < r->n_content; k++) {
		if (r->content[k]->block_case ==
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT)
			len += strlen(r->content[k]->text->text) + 1;
		else
			*other = 1;
	}
	if (!(s = malloc(len + 1)))
		return NULL;
	for (size_t k = 0; k < r->n_content; k++) {
		const char *t;
		size_t tl;

		if (r->content[k]->block_case !=
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT)
			continue;
		t = r->content[k]->text->text;
		tl = strlen(t);
		if (o)
			s[o++] = '\n';
		memcpy(s + o, t, tl);
		o += tl;
	}
	s[o] = '\0';
	return s;
}

uint32_t
histd_usage_count(json_t *usage, const char *key)
{
	json_t *v = json_object_get(usage, key);
	json_int_t n = json_is_integer(v) ? json_integer_value(v) : 0;

	if (n < 0)
		return 0;
	return (uint64_t)n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

json_t *
histd_args_value(histd_exp *ex, size_t i, long j, const char *arguments)
{
	json_error_t err;
	json_t *v;

	if (!arguments || !*arguments)
		return json_object();
	if ((v = json_loads(arguments, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
			    &err)))
		return v;
	if (json_error_code(&err) == json_error_duplicate_key &&
	    (v = json_loads(arguments, JSON_DECODE_ANY, NULL))) {
		histd_exp_drop(ex, i, j, "a key repeated in one object of the "
			       "tool arguments (the last one kept)");
		return v;
	}
	if (json_error_code(&err) == json_error_out_of_memory)
		return NULL;
	histd_exp_drop(ex, i, j, "tool arguments that do not parse, sent "
		       "as {}");
	return json_object();
}

char *
histd_json_text(json_t *v)
{
	return json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER |
			     JSON_ENCODE_ANY);
}

char *
histd_data_uri(const char *media_type, const uint8_t *data, size_t len)
{
	char *b = histd_b64_encode(data, len), *s = NULL;

	if (b && asprintf(&s, "data:%s;base64,%s", media_type, b) < 0)
		s = NULL;
	free(b);
	return s;
}

/* ---------------------------------------------------------------------- */
/* base64                                                                 */

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *
histd_b64_encode(const uint8_t *p, size_t len)
{
	size_t n = 4 * ((len + 2) / 3), o = 0;
	char *s = malloc(n + 1);

	if (!s)
		return NULL;
	for (size_t i = 0; i < len; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;

		if (i + 1 < len)
			v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < len)
			v |= p[i + 2];
		s[o++] = b64[(v >> 18) & 63];
		s[o++] = b64[(v >> 12) & 63];
		s[o++] = i + 1 < len ? b64[(v >> 6) & 63] : '=';
		s[o++] = i + 2 < len ? b64[v & 63] : '=';
	}
	s[o] = '\0';
	return s;
}

static int
b64_val(unsigned char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+')
		return 62;
	if (c == '/')
		return 63;
	return -1;
}

int
histd_b64_decode(const char *s, size_t len, uint8_t **out, size_t *out_len)
{
	size_t pad = 0, o = 0;
	uint8_t *p;

	if (len % 4)
		return histd_error_set(HISTD_EINVALID, "not valid base64");
	if (len && s[len - 1] == '=')
		pad = len >= 2 && s[len - 2] == '=' ? 2 : 1;
	if (!(p = malloc(len / 4 * 3 + 1)))
		return enomem();
	for (size_t i = 0; i < len; i += 4) {
		int v[4];
		uint32_t w;
		int last = i + 4 == len;

		for (int k = 0; k < 4; k++) {
			v[k] = b64_val((unsigned char)s[i + k]);
			if (v[k] < 0 && !(last && k >= 4 - (int)pad)) {
				free(p);
				return histd_error_set(HISTD_EINVALID,
						       "not valid base64");
			}
			if (v[k] < 0)
				v[k] = 0;
		}
		w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
		    (uint32_t)v[2] << 6 | (uint32_t)v[3];
		/* Canonical: the bits padding leaves over are zero. */
		if (last && ((pad == 1 && (w & 0xff)) ||
			     (pad == 2 && (w & 0xffff)))) {
			free(p);
			return histd_error_set(HISTD_EINVALID,
					       "not valid base64");
		}
		p[o++] = (uint8_t)(w >> 16);
		if (!(last && pad == 2))
			p[o++] = (uint8_t)(w >> 8);
		if (!(last && pad >= 1))
			p[o++] = (uint8_t)w;
	}
	*out = p;
	*out_len = o;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Entry points                                                           */

const char *
histd_json_error_why(const json_error_t *e)
{
	/* jansson's own text may quote the input, which is conversation
	 * data: only its error code is used. */
	switch (json_error_code(e)) {
	case json_error_stack_overflow:
		return "is not valid JSON: it nests too deeply";
	case json_error_null_character:
		return "is not valid JSON: it holds a \\u0000 (NUL) character";
	case json_error_invalid_utf8:
		return "is not valid JSON: it is not valid UTF-8";
	case json_error_duplicate_key:
		return "is not valid JSON: it repeats a key in one object";
	case json_error_premature_end_of_input:
		return "is not valid JSON: it ends before its value does";
	case json_error_numeric_overflow:
		/* Valid JSON, past what jansson holds: integers are
		 * json_int_t (int64), reals double. */
		return strncmp(e->text, "too big", 7)
		       ? "holds a number out of range (too large for a double)"
		       : "holds an integer out of range (more than 64 bits)";
	case json_error_end_of_input_expected:
		return "is not valid JSON: it holds more after its value";
	default:
		return "is not valid JSON";
	}
}

/*
 * The member of a body that holds byte pos, where jansson stopped (it read
 * everything before as valid JSON): "messages[3]", "system", or "" when
 * pos is outside any member or the key is escaped. Names the top-level
 * member and its element only, as check_body does: keys deeper down may
 * be conversation data.
 */
static void
path_at(const char *json, size_t pos, char *out, size_t cap)
{
	const char *key = NULL;
	size_t klen = 0, idx = 0;
	int depth = 0, in_arr = 0, want_key = 0;
	char k[HISTD_PATH_MAX];

	out[0] = '\0';
	for (size_t i = 0; i < pos; i++) {
		size_t start;

		switch (json[i]) {
		case '"':
			for (start = ++i; i < pos && json[i] != '"'; i++)
				if (json[i] == '\\')
					i++;
			if (depth == 1 && want_key) {
				key = json + start;
				klen = i - start;
				want_key = 0;
				in_arr = 0;
			}
			break;
		case '{':
		case '[':
			if (++depth == 1) {
				want_key = json[i] == '{';
			} else if (depth == 2) {
				in_arr = json[i] == '[';
				idx = 0;
			}
			break;
		case '}':
		case ']':
			depth--;
			break;
		case ',':
			if (depth == 1)
				want_key = 1;
			else if (depth == 2 && in_arr)
				idx++;
			break;
		}
	}
	if (!key || depth < 1 || klen >= sizeof(k) || memchr(key, '\\', klen))
		return;
	memcpy(k, key, klen);
	k[klen] = '\0';
	key_text(out, cap, k);
	if (depth >= 2 && in_arr) {
		size_t o = strlen(out);

		snprintf(out + o, cap - o, "[%zu]", idx);
	}
}

/* Depth and string sizes of a value; the path stays at its root, since
 * keys below a tool's arguments are conversation data. */
static int
check_value(histd_imp *im, json_t *v, unsigned depth)
{
	const char *k;
	json_t *e;
	size_t i;
	int rc;

	switch (json_typeof(v)) {
	case JSON_OBJECT:
	case JSON_ARRAY:
		if (depth >= im->lim->max_depth ||
		    depth >= HISTD_TRANSCRIPT_MAX_DEPTH)
			return histd_imp_fail(im, "nested deeper than %u "
					      "levels", im->lim->max_depth);
		if (json_is_object(v)) {
			json_object_foreach(v, k, e) {
				if (strlen(k) > im->lim->max_string_bytes)
					return imp_limit(im,
						"a key is longer than %zu bytes",
						im->lim->max_string_bytes);
				if ((rc = check_value(im, e, depth + 1)))
					return rc;
			}
		} else {
			json_array_foreach(v, i, e)
				if ((rc = check_value(im, e, depth + 1)))
					return rc;
		}
		return 0;
	case JSON_STRING:
		if (json_string_length(v) > im->lim->max_string_bytes)
			return imp_limit(im, "a string is %zu bytes; the "
					 "limit is %zu",
					 json_string_length(v),
					 im->lim->max_string_bytes);
		return 0;
	default:
		return 0;
	}
}

/* Checks every member of the body; arrays are checked per element so that
 * the error names the element ("messages[3]"). */
static int
check_body(histd_imp *im, json_t *root)
{
	const char *k;
	json_t *v, *e;
	size_t i, a, b;
	int rc;

	json_object_foreach(root, k, v) {
		a = histd_imp_key(im, k);
		if (json_is_array(v)) {
			json_array_foreach(v, i, e) {
				b = histd_imp_idx(im, i);
				if ((rc = check_value(im, e, 2)))
					return rc;
				histd_imp_pop(im, b);
			}
		} else if ((rc = check_value(im, v, 1))) {
			return rc;
		}
		histd_imp_pop(im, a);
	}
	return 0;
}

int
histd_imp_check_args(histd_imp *im, const char *key, const char *args)
{
	json_error_t jerr;
	unsigned depth = 1;
	size_t q;
	json_t *v;
	int rc;

	if (!(v = json_loads(args, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
			     &jerr)))
		return histd_imp_fail_at(im, key, "%s",
					 histd_json_error_why(&jerr));
	/* The path's components count the levels above the value, as
	 * check_body counts them in the body. */
	for (const char *p = im->path; *p; p++)
		depth += *p == '.' || *p == '[';
	q = histd_imp_key(im, key);
	rc = check_value(im, v, depth + 1);
	histd_imp_pop(im, q);
	json_decref(v);
	return rc;
}

int
histd_transcript_from_json(Histd__V1__Format format, const char *json,
			   size_t len, const histd_transcript_limits *lim,
			   histd_transcript *out)
{
	const histd_format_ops *ops = histd_format_ops_get(format);
	histd_transcript_limits dl;
	histd_imp im;
	json_error_t jerr;
	json_t *root;
	int rc;

	if (!ops)
		return histd_error_set(HISTD_EUNIMPL,
				       "format is not a known Format");
	if (!lim) {
		histd_transcript_limits_default(&dl);
		lim = &dl;
	}
	if (!json || len == 0)
		return histd_error_set(HISTD_EINVALID, "json is empty");
	if (len > lim->max_json_bytes)
		return histd_error_set(HISTD_ELIMIT,
				       "json is %zu bytes; the limit is %zu",
				       len, lim->max_json_bytes);
	/* jansson refuses NUL in strings and invalid UTF-8 by default and
	 * stops nesting at its own depth limit, so no input crashes it. */
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY,
			  &jerr);
	if (!root && json_error_code(&jerr) == json_error_stack_overflow)
		return histd_error_set(HISTD_EINVALID,
			"json is not valid JSON: it is nested deeper than %u "
			"levels (line %d, column %d)", lim->max_depth,
			jerr.line, jerr.column);
	if (!root && json_error_code(&jerr) == json_error_numeric_overflow) {
		char where[HISTD_PATH_MAX];

		path_at(json, jerr.position > 0 ? (size_t)jerr.position : 0,
			where, sizeof(where));
		return histd_error_set(HISTD_EINVALID, "%s%s %s (line %d, "
				       "column %d)", where[0] ? where : "json",
				       where[0] ? ":" : "",
				       histd_json_error_why(&jerr), jerr.line,
				       jerr.column);
	}
	if (!root)
		return histd_error_set(HISTD_EINVALID, "json %s (line %d, "
				       "column %d)", histd_json_error_why(&jerr),
				       jerr.line, jerr.column);
	memset(&im, 0, sizeof(im));
	im.lim = lim;
	im.key = ops->key;
	im.t = out;
	if (!json_is_object(root)) {
		rc = histd_error_set(HISTD_EINVALID,
				     "json: expected an object");
	} else if (!(rc = check_body(&im, root))) {
		im.plen = 0;
		im.path[0] = '\0';
		rc = ops->import(&im, root);
	}
	/* A provider message with nothing histd keeps (only dropped parts,
	 * an empty list) leaves no empty message behind. */
	if (!rc) {
		histd_strlist *og = &out->origins;
		size_t o = 0;

		if (og->n != out->n_messages)
			histd_strlist_clear(og);
		for (size_t i = 0; i < out->n_messages; i++) {
			Histd__V1__Message *m = out->messages[i];

			if (m->n_content) {
				if (og->n)
					og->v[o] = og->v[i];
				out->messages[o++] = m;
				continue;
			}
			histd__v1__message__free_unpacked(m, NULL);
			if (og->n)
				free(og->v[i]);
			if (!rc)
				rc = histd_strlist_addf(&out->dropped,
					"a message with no content histd "
					"keeps");
		}
		out->n_messages = o;
		if (og->n)
			og->n = o;
	}
	json_decref(root);
	histd_calls_free(im.calls, im.n_calls);
	if (rc)
		histd_transcript_clear(out);
	return rc;
}

int
histd_transcript_to_json(Histd__V1__Format format,
			 Histd__V1__Message *const *messages, size_t n,
			 char **json, histd_strlist *dropped)
{
	const histd_format_ops *ops = histd_format_ops_get(format);
	histd_exp ex;
	json_t *root = NULL;
	int rc;

	if (!ops)
		return histd_error_set(HISTD_EUNIMPL,
				       "format is not a known Format");
	memset(&ex, 0, sizeof(ex));
	ex.key = ops->key;
	ex.format = ops->name;
	ex.dropped = dropped;
	rc = ops->export(&ex, messages, n, &root);
	if (!rc && ex.nomem)
		rc = enomem();
	if (!rc && !(*json = json_dumps(root, JSON_COMPACT |
					      JSON_PRESERVE_ORDER)))
		rc = enomem();
	json_decref(root);
	histd_calls_free(ex.calls, ex.n_calls);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Rendering for summaries                                                */

typedef struct sbuf {
	char *p;
	size_t n, cap;
	int nomem;
} sbuf;

static void
sb_add(sbuf *b, const char *s, size_t len)
{
	if (b->nomem)
		return;
	if (b->n + len + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		char *p;

		while (cap < b->n + len + 1)
			cap *= 2;
		if (!(p = realloc(b->p, cap))) {
			b->nomem = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->n, s, len);
	b->n += len;
	b->p[b->n] = '\0';
}

static void
sb_str(sbuf *b, const char *s)
{
	sb_add(b, s, strlen(s));
}

static const char *
role_label(Histd__V1__Role r)
{
	switch (r) {
	case HISTD__V1__ROLE__ROLE_SYSTEM: return "system";
	case HISTD__V1__ROLE__ROLE_USER: return "user";
	case HISTD__V1__ROLE__ROLE_ASSISTANT: return "assistant";
	case HISTD__V1__ROLE__ROLE_TOOL: return "tool";
	default: return "unknown";
	}
}

static void
render_block(sbuf *b, const Histd__V1__ContentBlock *c)
{
	switch (c->block_case) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
		sb_str(b, c->text->text);
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
		sb_str(b, "[image]");
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
		sb_str(b, "[document");
		if (c->document->filename[0]) {
			sb_str(b, " ");
			sb_str(b, c->document->filename);
		}
		sb_str(b, "]");
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
		/* Reasoning is the model's scratch work: not summarized. */
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
		sb_str(b, "[call ");
		sb_str(b, c->tool_call->name);
		sb_str(b, " ");
		sb_str(b, c->tool_call->id);
		sb_str(b, "] ");
		sb_str(b, c->tool_call->arguments);
		break;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
		sb_str(b, c->tool_result->is_error ? "[error of "
						   : "[result of ");
		sb_str(b, c->tool_result->tool_call_id);
		sb_str(b, "] ");
		for (size_t k = 0; k < c->tool_result->n_content; k++) {
			if (k)
				sb_str(b, " ");
			render_block(b, c->tool_result->content[k]);
		}
		break;
	default:
		break;
	}
}

char *
histd_render_transcript(const char *previous, Histd__V1__Message *const *m,
			size_t n)
{
	sbuf b = { 0 };

	if (previous && *previous) {
		sb_str(&b, "Summary so far:\n");
		sb_str(&b, previous);
		sb_str(&b, "\n\nConversation since then:\n");
	}
	for (size_t i = 0; i < n; i++) {
		sb_str(&b, role_label(m[i]->role));
		if (m[i]->author[0]) {
			sb_str(&b, " (");
			sb_str(&b, m[i]->author);
			sb_str(&b, ")");
		}
		sb_str(&b, ":");
		for (size_t j = 0; j < m[i]->n_content; j++) {
			sb_str(&b, " ");
			render_block(&b, m[i]->content[j]);
		}
		sb_str(&b, "\n");
	}
	sb_str(&b, "");
	if (b.nomem) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
