/*
 * Embedding clients (see embeddings.h): the request each provider wants,
 * the vectors read back from its answer.
 */
#include "embeddings.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum style { STYLE_OPENAI, STYLE_GEMINI };

typedef struct provider_info {
	const char *name;
	const char *default_base_url;
	const char *key_env;
	const char *default_model;
	enum style style;
} provider_info;

static const provider_info providers[] = {
	{ "openai", "https://api.openai.com", "OPENAI_API_KEY",
	  "text-embedding-3-small", STYLE_OPENAI },
	{ "gemini", "https://generativelanguage.googleapis.com",
	  "GEMINI_API_KEY", "gemini-embedding-001", STYLE_GEMINI },
	{ "mistral", "https://api.mistral.ai", "MISTRAL_API_KEY",
	  "mistral-embed", STYLE_OPENAI },
};

struct histd_embeddings {
	const provider_info *p;
	histd_http *http;
	char *base;
	char *auth_header;      /* holds the key: wiped on free */
	char *key_env;          /* where the key came from; NULL: given */
	uint32_t timeout_ms;
};

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static const provider_info *
find(const char *name)
{
	for (size_t i = 0; name && i < sizeof(providers) / sizeof(providers[0]); i++)
		if (strcmp(providers[i].name, name) == 0)
			return &providers[i];
	return NULL;
}

int
histd_embeddings_known(const char *provider)
{
	return find(provider) != NULL;
}

const char *
histd_embeddings_default_model(const char *provider)
{
	const provider_info *p = find(provider);

	return p ? p->default_model : NULL;
}

const char *
histd_embeddings_provider(const histd_embeddings *e)
{
	return e->p->name;
}

void
histd_embeddings_free(histd_embeddings *e)
{
	if (!e)
		return;
	if (e->auth_header) {
		explicit_bzero(e->auth_header, strlen(e->auth_header));
		free(e->auth_header);
	}
	free(e->base);
	free(e->key_env);
	free(e);
}

int
histd_embeddings_open(const histd_embeddings_options *o,
		      histd_embeddings **out)
{
	const provider_info *p = find(o->provider);
	const char *key = o->api_key, *env, *base;
	histd_embeddings *e;
	size_t bl;
	int n;

	if (!p)
		return histd_error_set(HISTD_EINVALID, "embedding provider is not "
				       "one of openai, gemini, mistral");
	if (!o->http)
		return histd_error_set(HISTD_EINVALID, "embeddings need the HTTP layer");
	env = o->api_key_env && *o->api_key_env ? o->api_key_env : p->key_env;
	if (!key || !*key)
		key = getenv(env);
	if (!key || !*key)
		return histd_error_set(HISTD_EINVALID, "no API key: %s is not set",
				       env);
	if (!(e = calloc(1, sizeof(*e))))
		return enomem();
	e->p = p;
	e->http = o->http;
	e->timeout_ms = o->timeout_ms ? o->timeout_ms : 30000;
	base = o->base_url && *o->base_url ? o->base_url : p->default_base_url;
	bl = strlen(base);
	while (bl && base[bl - 1] == '/')
		bl--;               /* "http://host/" and "http://host" alike */
	e->base = strndup(base, bl);
	if (p->style == STYLE_GEMINI)
		n = asprintf(&e->auth_header, "x-goog-api-key: %s", key);
	else
		n = asprintf(&e->auth_header, "Authorization: Bearer %s", key);
	if (n < 0)
		e->auth_header = NULL;
	if (!(o->api_key && *o->api_key))
		e->key_env = strdup(env);
	if (!e->base || !e->auth_header ||
	    (!(o->api_key && *o->api_key) && !e->key_env)) {
		histd_embeddings_free(e);
		return enomem();
	}
	*out = e;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Requests                                                                */

static json_t *
gemini_content(const char *text)
{
	return json_pack("{s:{s:[{s:s}]}}", "content", "parts", "text", text);
}

/* The URL and body of one call; 0 or ENOMEM. */
static int
build(const histd_embeddings *e, const char *model, const char *const *texts,
      size_t n, char **url, char **body)
{
	json_t *root = NULL, *arr;
	int rc;

	*url = *body = NULL;
	if (e->p->style == STYLE_OPENAI) {
		rc = asprintf(url, "%s/v1/embeddings", e->base);
		if ((root = json_object()) && (arr = json_array())) {
			json_object_set_new(root, "model", json_string(model));
			json_object_set_new(root, "input", arr);
			for (size_t i = 0; i < n; i++)
				json_array_append_new(arr, json_string(texts[i]));
		}
	} else if (n == 1) {
		rc = asprintf(url, "%s/v1beta/models/%s:embedContent", e->base,
			      model);
		root = gemini_content(texts[0]);
	} else {
		char *full = NULL;

		rc = asprintf(url, "%s/v1beta/models/%s:batchEmbedContents",
			      e->base, model);
		if (asprintf(&full, "models/%s", model) < 0)
			full = NULL;
		if (full && (root = json_object()) && (arr = json_array())) {
			json_object_set_new(root, "requests", arr);
			for (size_t i = 0; i < n; i++) {
				json_t *r = gemini_content(texts[i]);

				if (r)
					json_object_set_new(r, "model",
							    json_string(full));
				json_array_append_new(arr, r);
			}
		}
		free(full);
	}
	if (rc < 0)
		*url = NULL;
	if (root)
		*body = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!*url || !*body) {
		free(*url);
		free(*body);
		*url = *body = NULL;
		return enomem();
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Answers                                                                 */

static int
bad_answer(const char *what)
{
	return histd_error_set(HISTD_EUNAVAILABLE,
			       "embedding answer: %s", what);
}

/* Copies the numbers of arr into v[0..dim) (dim set by the first). */
static int
read_vector(json_t *arr, float **v, size_t n, size_t i, uint32_t *dim)
{
	size_t len;

	if (!json_is_array(arr) || !(len = json_array_size(arr)))
		return bad_answer("a vector is missing or empty");
	if (len > HISTD_EMBED_DIM_MAX)
		return bad_answer("a vector is longer than allowed");
	if (!*v) {
		*dim = (uint32_t)len;
		if (!(*v = malloc(n * len * sizeof(float))))
			return enomem();
	} else if (len != *dim) {
		return bad_answer("vectors differ in length");
	}
	for (size_t j = 0; j < len; j++) {
		json_t *x = json_array_get(arr, j);

		if (!json_is_number(x))
			return bad_answer("a vector holds a value that is not a number");
		(*v)[i * *dim + j] = (float)json_number_value(x);
	}
	return 0;
}

static int
parse(const histd_embeddings *e, json_t *root, size_t n, float **out,
      uint32_t *dim)
{
	float *v = NULL;
	int rc = 0;

	if (e->p->style == STYLE_OPENAI) {
		json_t *data = json_object_get(root, "data");
		char *seen;

		if (!json_is_array(data) || json_array_size(data) != n)
			return bad_answer("data does not hold one vector per input");
		if (!(seen = calloc(n, 1)))
			return enomem();
		for (size_t i = 0; i < n && rc == 0; i++) {
			json_t *d = json_array_get(data, i);
			json_t *ix = json_object_get(d, "index");
			size_t at = i;

			/* The index says which input a vector is for; answers
			 * are in order in practice, but need not be. */
			if (json_is_integer(ix)) {
				json_int_t k = json_integer_value(ix);

				if (k < 0 || (size_t)k >= n || seen[k]) {
					rc = bad_answer("data[].index is out of range "
							"or repeated");
					break;
				}
				at = (size_t)k;
			}
			seen[at] = 1;
			rc = read_vector(json_object_get(d, "embedding"), &v, n,
					 at, dim);
		}
		free(seen);
	} else if (n == 1) {
		rc = read_vector(json_object_get(json_object_get(root, "embedding"),
						 "values"), &v, 1, 0, dim);
	} else {
		json_t *embs = json_object_get(root, "embeddings");

		if (!json_is_array(embs) || json_array_size(embs) != n)
			return bad_answer("embeddings does not hold one vector per input");
		for (size_t i = 0; i < n && rc == 0; i++)
			rc = read_vector(json_object_get(json_array_get(embs, i),
							 "values"), &v, n, i, dim);
	}
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	return 0;
}

int
histd_embeddings_embed(histd_embeddings *e, const char *model,
		       const char *const *texts, size_t n, uint32_t timeout_ms,
		       float **out, uint32_t *dim)
{
	const char *headers[1];
	histd_http_response resp = { 0 };
	char *url, *body;
	json_t *root;
	uint32_t d = 0;
	float *v = NULL;
	int rc;

	if (!n || n > HISTD_EMBED_BATCH_MAX)
		return histd_error_set(HISTD_EINVALID, "embed 1..%d texts at once",
				       HISTD_EMBED_BATCH_MAX);
	for (size_t i = 0; i < n; i++)
		if (!texts[i] || !texts[i][0])
			return histd_error_set(HISTD_EINVALID,
					       "texts[%zu] is empty", i);
	if (!model || !*model)
		model = e->p->default_model;
	/* The model goes into Gemini's URL path: names only, no path. */
	if (strlen(model) > 128 ||
	    strspn(model, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			  "0123456789._-") != strlen(model))
		return histd_error_set(HISTD_EINVALID, "embedding model must be "
				       "1..128 of [A-Za-z0-9._-]");
	if ((rc = build(e, model, texts, n, &url, &body)))
		return rc;
	headers[0] = e->auth_header;
	if (!timeout_ms || timeout_ms > e->timeout_ms)
		timeout_ms = e->timeout_ms;
	rc = histd_http_post(e->http, url, headers, 1, body, strlen(body),
			     timeout_ms, &resp);
	free(url);
	free(body);
	if (rc) {
		rc = histd_http_error_name(rc, e->p->name, e->key_env, &resp);
		histd_http_response_clear(&resp);
		return rc;
	}
	root = json_loadb(resp.body, resp.len, 0, NULL);
	histd_http_response_clear(&resp);
	if (!json_is_object(root)) {
		json_decref(root);
		return bad_answer("not a JSON object");
	}
	rc = parse(e, root, n, &v, &d);
	json_decref(root);
	if (rc)
		return rc;
	*out = v;
	*dim = d;
	return 0;
}
