/*
 * The stub provider (see stub_provider.h). One thread per connection, so
 * that a slow reply does not hold up the others.
 */
#include "stub_provider.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_SCRIPT 64
#define MAX_HEADERS 16

struct stub {
	struct MHD_Daemon *d;
	char url[64];
	pthread_mutex_t mu;
	stub_reply script[MAX_SCRIPT];
	size_t head, n;
	unsigned requests, active, max_active;
	char *last_body, *last_path;
	char *hdr_name[MAX_HEADERS], *hdr_value[MAX_HEADERS];
	size_t n_hdr;
	int delay_ms;
	unsigned embed_requests, embed_texts;
	pthread_cond_t stop_cv;     /* delays end early once stopping */
	int stopping;
};

typedef struct upload {
	char *p;
	size_t n;
} upload;

static const char answer_anthropic[] =
	"{\"id\":\"msg_stub\",\"type\":\"message\",\"role\":\"assistant\","
	"\"model\":\"claude-stub\",\"content\":[{\"type\":\"text\",\"text\":"
	"\"stub summary\"}],\"stop_reason\":\"end_turn\",\"usage\":"
	"{\"input_tokens\":11,\"output_tokens\":7}}";
static const char answer_chat[] =
	"{\"id\":\"chatcmpl-stub\",\"object\":\"chat.completion\",\"model\":"
	"\"chat-stub\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
	"\"assistant\",\"content\":\"stub summary\"},\"finish_reason\":"
	"\"stop\"}],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":7,"
	"\"total_tokens\":18}}";
static const char answer_responses[] =
	"{\"id\":\"resp_stub\",\"object\":\"response\",\"model\":"
	"\"responses-stub\",\"output\":[{\"type\":\"reasoning\",\"id\":\"rs_1\","
	"\"summary\":[]},{\"type\":\"message\",\"id\":\"msg_1\",\"role\":"
	"\"assistant\",\"status\":\"completed\",\"content\":[{\"type\":"
	"\"output_text\",\"text\":\"stub summary\",\"annotations\":[]}]}],"
	"\"usage\":{\"input_tokens\":11,\"output_tokens\":7}}";
static const char answer_gemini[] =
	"{\"candidates\":[{\"content\":{\"role\":\"model\",\"parts\":["
	"{\"text\":\"thinking about it\",\"thought\":true},{\"text\":"
	"\"stub summary\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":"
	"{\"promptTokenCount\":11,\"candidatesTokenCount\":7},"
	"\"modelVersion\":\"gemini-stub\"}";

static const char *
default_answer(const char *path)
{
	if (!strcmp(path, "/v1/messages"))
		return answer_anthropic;
	if (!strcmp(path, "/v1/chat/completions"))
		return answer_chat;
	if (!strcmp(path, "/v1/responses"))
		return answer_responses;
	if (!strncmp(path, "/v1beta/models/", 15))
		return answer_gemini;
	return NULL;
}

void
stub_embed_text(const char *text, float v[STUB_EMBED_DIM])
{
	const unsigned char *p = (const unsigned char *)text;
	double norm = 0;

	memset(v, 0, STUB_EMBED_DIM * sizeof(float));
	while (*p) {
		uint32_t h = 2166136261u;
		int any = 0;

		while (*p && isalnum(*p) && *p < 128) {
			h = (h ^ (uint32_t)tolower(*p)) * 16777619u;
			any = 1;
			p++;
		}
		if (any)
			v[h % STUB_EMBED_DIM] += 1;
		else
			p++;
	}
	for (int i = 0; i < STUB_EMBED_DIM; i++)
		norm += (double)v[i] * v[i];
	if (norm == 0) {
		v[0] = 1;
		return;
	}
	norm = sqrt(norm);
	for (int i = 0; i < STUB_EMBED_DIM; i++)
		v[i] = (float)(v[i] / norm);
}

static json_t *
vector_json(const char *text)
{
	float v[STUB_EMBED_DIM];
	json_t *a = json_array();

	stub_embed_text(text ? text : "", v);
	for (int i = 0; a && i < STUB_EMBED_DIM; i++)
		json_array_append_new(a, json_real(v[i]));
	return a;
}

static const char *
gemini_text(json_t *req)
{
	json_t *parts = json_object_get(json_object_get(req, "content"), "parts");

	return json_string_value(json_object_get(json_array_get(parts, 0), "text"));
}

/* The answer to an embedding request (malloc'ed), or NULL if path is not
 * an embedding endpoint or the body does not parse; *n: texts. */
static char *
embed_answer(const char *path, const char *body, unsigned *n)
{
	json_t *req = json_loads(body ? body : "", 0, NULL), *ans = NULL;
	const char *colon = strrchr(path, ':');
	char *out = NULL;

	*n = 0;
	if (!req)
		return NULL;
	if (!strcmp(path, "/v1/embeddings")) {
		json_t *in = json_object_get(req, "input"), *data = json_array();
		size_t i;
		json_t *x;

		ans = json_pack("{s:s, s:o, s:s}", "object", "list", "data", data,
				"model", json_string_value(json_object_get(req, "model"))
					? json_string_value(json_object_get(req, "model")) : "");
		json_array_foreach(in, i, x) {
			json_array_append_new(data, json_pack("{s:s, s:i, s:o}",
				"object", "embedding", "index", (int)i,
				"embedding", vector_json(json_string_value(x))));
			(*n)++;
		}
	} else if (!strncmp(path, "/v1beta/models/", 15) && colon &&
		   !strcmp(colon, ":embedContent")) {
		ans = json_pack("{s:{s:o}}", "embedding", "values",
				vector_json(gemini_text(req)));
		*n = 1;
	} else if (!strncmp(path, "/v1beta/models/", 15) && colon &&
		   !strcmp(colon, ":batchEmbedContents")) {
		json_t *embs = json_array(), *x;
		size_t i;

		json_array_foreach(json_object_get(req, "requests"), i, x) {
			json_array_append_new(embs, json_pack("{s:o}", "values",
							     vector_json(gemini_text(x))));
			(*n)++;
		}
		ans = json_pack("{s:o}", "embeddings", embs);
	}
	if (ans)
		out = json_dumps(ans, JSON_COMPACT);
	json_decref(ans);
	json_decref(req);
	return out;
}

static enum MHD_Result
keep_header(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
	stub *s = cls;

	(void)kind;
	if (s->n_hdr < MAX_HEADERS) {
		s->hdr_name[s->n_hdr] = strdup(k);
		s->hdr_value[s->n_hdr] = strdup(v ? v : "");
		s->n_hdr++;
	}
	return MHD_YES;
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url,
       const char *method, const char *version, const char *data,
       size_t *data_size, void **con_cls)
{
	stub *s = cls;
	upload *u = *con_cls;
	stub_reply r = { 0, -1, 0, NULL };
	struct MHD_Response *resp;
	const char *body;
	char *made = NULL;
	unsigned n_texts = 0;
	int delay;
	enum MHD_Result ret;
	char ra[16];

	(void)version;
	if (!u) {
		*con_cls = calloc(1, sizeof(upload));
		return *con_cls ? MHD_YES : MHD_NO;
	}
	if (*data_size) {
		char *p = realloc(u->p, u->n + *data_size + 1);

		if (!p)
			return MHD_NO;
		memcpy(p + u->n, data, *data_size);
		u->n += *data_size;
		p[u->n] = '\0';
		u->p = p;
		*data_size = 0;
		return MHD_YES;
	}
	pthread_mutex_lock(&s->mu);
	s->requests++;
	if (++s->active > s->max_active)
		s->max_active = s->active;
	free(s->last_body);
	free(s->last_path);
	s->last_body = strdup(u->p ? u->p : "");
	s->last_path = strdup(url);
	for (size_t i = 0; i < s->n_hdr; i++) {
		free(s->hdr_name[i]);
		free(s->hdr_value[i]);
	}
	s->n_hdr = 0;
	MHD_get_connection_values(c, MHD_HEADER_KIND, keep_header, s);
	if (s->n) {
		r = s->script[s->head];
		s->head = (s->head + 1) % MAX_SCRIPT;
		s->n--;
	}
	delay = r.delay_ms + s->delay_ms;
	if (delay) {
		struct timespec until;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += delay / 1000;
		until.tv_nsec += (delay % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!s->stopping &&
		       pthread_cond_timedwait(&s->stop_cv, &s->mu, &until) == 0)
			;
	}
	pthread_mutex_unlock(&s->mu);
	if (!r.body && (made = embed_answer(url, u->p, &n_texts))) {
		pthread_mutex_lock(&s->mu);
		s->embed_requests++;
		s->embed_texts += n_texts;
		pthread_mutex_unlock(&s->mu);
	}
	body = r.body ? r.body : made ? made : default_answer(url);
	if (strcmp(method, "POST") || !body) {
		body = "{\"error\":{\"message\":\"not found\"}}";
		r.status = 404;
	}
	resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
					       MHD_RESPMEM_MUST_COPY);
	MHD_add_response_header(resp, "Content-Type", "application/json");
	if (r.retry_after >= 0) {
		snprintf(ra, sizeof(ra), "%d", r.retry_after);
		MHD_add_response_header(resp, "Retry-After", ra);
	}
	ret = MHD_queue_response(c, r.status ? (unsigned)r.status : 200, resp);
	MHD_destroy_response(resp);
	free(made);
	pthread_mutex_lock(&s->mu);
	s->active--;
	pthread_mutex_unlock(&s->mu);
	return ret;
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
	  enum MHD_RequestTerminationCode toe)
{
	upload *u = *con_cls;

	(void)cls;
	(void)c;
	(void)toe;
	if (u) {
		free(u->p);
		free(u);
		*con_cls = NULL;
	}
}

stub *
stub_start(void)
{
	struct sockaddr_in sa;
	const union MHD_DaemonInfo *info;
	stub *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->stop_cv, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = 0;
	s->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
					MHD_USE_THREAD_PER_CONNECTION |
					MHD_USE_POLL,
				0, NULL, NULL, handle, s,
				MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
				MHD_OPTION_NOTIFY_COMPLETED, completed, s,
				MHD_OPTION_CONNECTION_TIMEOUT, 10u,
				MHD_OPTION_END);
	if (!s->d || !(info = MHD_get_daemon_info(s->d,
						  MHD_DAEMON_INFO_BIND_PORT))) {
		stub_stop(s);
		return NULL;
	}
	snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%u",
		 (unsigned)info->port);
	return s;
}

void
stub_stop(stub *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	s->stopping = 1;
	pthread_cond_broadcast(&s->stop_cv);
	pthread_mutex_unlock(&s->mu);
	if (s->d)
		MHD_stop_daemon(s->d);
	free(s->last_body);
	free(s->last_path);
	for (size_t i = 0; i < s->n_hdr; i++) {
		free(s->hdr_name[i]);
		free(s->hdr_value[i]);
	}
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->stop_cv);
	free(s);
}

const char *
stub_url(stub *s)
{
	return s->url;
}

void
stub_push(stub *s, stub_reply r)
{
	pthread_mutex_lock(&s->mu);
	if (s->n < MAX_SCRIPT) {
		s->script[(s->head + s->n) % MAX_SCRIPT] = r;
		s->n++;
	}
	pthread_mutex_unlock(&s->mu);
}

unsigned
stub_requests(stub *s)
{
	unsigned n;

	pthread_mutex_lock(&s->mu);
	n = s->requests;
	pthread_mutex_unlock(&s->mu);
	return n;
}

unsigned
stub_max_concurrent(stub *s)
{
	unsigned n;

	pthread_mutex_lock(&s->mu);
	n = s->max_active;
	pthread_mutex_unlock(&s->mu);
	return n;
}

/* A copy of *field, read under the lock: a request in flight frees it. */
static char *
dup_locked(stub *s, char *const *field)
{
	char *r;

	pthread_mutex_lock(&s->mu);
	r = *field ? strdup(*field) : NULL;
	pthread_mutex_unlock(&s->mu);
	return r;
}

char *
stub_last_body(stub *s)
{
	return dup_locked(s, &s->last_body);
}

char *
stub_last_path(stub *s)
{
	return dup_locked(s, &s->last_path);
}

char *
stub_last_header(stub *s, const char *name)
{
	char *r = NULL;

	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < s->n_hdr && !r; i++)
		if (!strcasecmp(s->hdr_name[i], name))
			r = strdup(s->hdr_value[i]);
	pthread_mutex_unlock(&s->mu);
	return r;
}

void
stub_set_delay(stub *s, int delay_ms)
{
	pthread_mutex_lock(&s->mu);
	s->delay_ms = delay_ms;
	pthread_mutex_unlock(&s->mu);
}

unsigned
stub_embed_requests(stub *s)
{
	unsigned n;

	pthread_mutex_lock(&s->mu);
	n = s->embed_requests;
	pthread_mutex_unlock(&s->mu);
	return n;
}

unsigned
stub_embed_texts(stub *s)
{
	unsigned n;

	pthread_mutex_lock(&s->mu);
	n = s->embed_texts;
	pthread_mutex_unlock(&s->mu);
	return n;
}
