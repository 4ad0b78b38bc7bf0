/*
 * The sample conversation and the valid requests of fixture.h, built with
 * protobuf-c and packed. Every piece is allocated from a pool freed once
 * the requests are packed.
 */
#include "fixture.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "histd/v1/histd.pb-c.h"
#include "service.h"

typedef struct pool {
	void **v;
	size_t n, cap;
	int oom;
} pool;

static void *
pool_alloc(pool *p, size_t size)
{
	void *x;

	if (p->n == p->cap) {
		size_t cap = p->cap ? 2 * p->cap : 64;
		void **v = realloc(p->v, cap * sizeof(*v));

		if (!v) {
			p->oom = 1;
			return NULL;
		}
		p->v = v;
		p->cap = cap;
	}
	if (!(x = calloc(1, size))) {
		p->oom = 1;
		return NULL;
	}
	p->v[p->n++] = x;
	return x;
}

static void
pool_free(pool *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->v[i]);
	free(p->v);
}

/* A message of any type, initialized; NULL if out of memory (later
 * builders then see NULL and the caller checks p->oom once). */
static void *
msg_new(pool *p, const ProtobufCMessageDescriptor *d)
{
	ProtobufCMessage *m = pool_alloc(p, d->sizeof_message);

	if (m)
		protobuf_c_message_init(d, m);
	return m;
}

/* A map<string, string> entry of any map type: key is field 1, value
 * field 2, both strings in every map of histd.proto used here. */
static void *
kv_new(pool *p, const ProtobufCMessageDescriptor *d, const char *k,
       const char *v)
{
	char *m = msg_new(p, d);

	if (!m)
		return NULL;
	*(const char **)(m + d->fields[0].offset) = k;
	*(const char **)(m + d->fields[1].offset) = v;
	return m;
}

/* An array of n pointers from the arguments. */
static void **
arr(pool *p, size_t n, ...)
{
	void **v = pool_alloc(p, (n ? n : 1) * sizeof(*v));
	va_list ap;

	if (!v)
		return NULL;
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		v[i] = va_arg(ap, void *);
	va_end(ap);
	return v;
}

static Histd__V1__ContentBlock *
blk(pool *p)
{
	return msg_new(p, &histd__v1__content_block__descriptor);
}

static Histd__V1__ContentBlock *
text(pool *p, const char *s)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__TextBlock *t = msg_new(p, &histd__v1__text_block__descriptor);

	if (!b || !t)
		return NULL;
	t->text = (char *)s;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = t;
	return b;
}

static Histd__V1__ContentBlock *
tool_call(pool *p, const char *id, const char *name, const char *args)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__ToolCallBlock *t =
		msg_new(p, &histd__v1__tool_call_block__descriptor);

	if (!b || !t)
		return NULL;
	t->id = (char *)id;
	t->name = (char *)name;
	t->arguments = (char *)args;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b->tool_call = t;
	return b;
}

static Histd__V1__ContentBlock *
tool_result(pool *p, const char *call_id, const char *name, const char *s)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__ToolResultBlock *t =
		msg_new(p, &histd__v1__tool_result_block__descriptor);

	if (!b || !t)
		return NULL;
	t->tool_call_id = (char *)call_id;
	t->tool_name = (char *)name;
	t->n_content = 1;
	t->content = (Histd__V1__ContentBlock **)arr(p, 1, text(p, s));
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b->tool_result = t;
	return b;
}

static Histd__V1__ContentBlock *
reasoning(pool *p, const char *s, const char *signature)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__ReasoningBlock *r =
		msg_new(p, &histd__v1__reasoning_block__descriptor);

	if (!b || !r)
		return NULL;
	r->text = (char *)s;
	r->signature = (char *)signature;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
	b->reasoning = r;
	return b;
}

static Histd__V1__ContentBlock *
image_url(pool *p, const char *url)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__ImageBlock *i = msg_new(p, &histd__v1__image_block__descriptor);

	if (!b || !i)
		return NULL;
	i->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	i->url = (char *)url;
	i->media_type = "image/png";
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = i;
	return b;
}

static Histd__V1__ContentBlock *
document_data(pool *p, const char *bytes, const char *media_type)
{
	Histd__V1__ContentBlock *b = blk(p);
	Histd__V1__DocumentBlock *d =
		msg_new(p, &histd__v1__document_block__descriptor);

	if (!b || !d)
		return NULL;
	d->source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
	d->data.data = (uint8_t *)bytes;
	d->data.len = strlen(bytes);
	d->media_type = (char *)media_type;
	d->filename = "notes.txt";
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT;
	b->document = d;
	return b;
}

/* A message of n blocks. */
static Histd__V1__Message *
message(pool *p, Histd__V1__Role role, const char *author, size_t n, ...)
{
	Histd__V1__Message *m = msg_new(p, &histd__v1__message__descriptor);
	Histd__V1__ContentBlock **v = pool_alloc(p, n * sizeof(*v));
	va_list ap;

	if (!m || !v)
		return NULL;
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		v[i] = va_arg(ap, Histd__V1__ContentBlock *);
	va_end(ap);
	m->role = role;
	m->author = (char *)author;
	m->n_content = n;
	m->content = v;
	return m;
}

/* A pipeline of one or two plugins, each with one option. */
static Histd__V1__SessionConfig *
config(pool *p, const char *plugin1, const char *k1, const char *v1,
       const char *plugin2, const char *k2, const char *v2)
{
	Histd__V1__SessionConfig *c =
		msg_new(p, &histd__v1__session_config__descriptor);
	Histd__V1__Pipeline *pl = msg_new(p, &histd__v1__pipeline__descriptor);
	Histd__V1__PluginConfig *a =
		msg_new(p, &histd__v1__plugin_config__descriptor);
	Histd__V1__PluginConfig *b =
		msg_new(p, &histd__v1__plugin_config__descriptor);

	if (!c || !pl || !a || !b)
		return NULL;
	a->name = (char *)plugin1;
	a->n_options = 1;
	a->options = (Histd__V1__PluginConfig__OptionsEntry **)arr(p, 1,
		kv_new(p, &histd__v1__plugin_config__options_entry__descriptor,
		       k1, v1));
	b->name = (char *)plugin2;
	b->n_options = 1;
	b->options = (Histd__V1__PluginConfig__OptionsEntry **)arr(p, 1,
		kv_new(p, &histd__v1__plugin_config__options_entry__descriptor,
		       k2, v2));
	pl->n_plugins = plugin2 ? 2 : 1;
	pl->plugins = (Histd__V1__PluginConfig **)arr(p, 2, a, b);
	c->pipeline = pl;
	return c;
}

/* Packs m as request i of method `method`. */
static void
add(pool *p, fz_req *out, size_t cap, size_t *n, int method,
    const char *name, const void *msg)
{
	const ProtobufCMessage *m = msg;
	size_t len;
	uint8_t *buf;

	if (p->oom || !m || *n >= cap) {
		p->oom = 1;
		return;
	}
	len = protobuf_c_message_get_packed_size(m);
	if (!(buf = malloc(len ? len : 1))) {
		p->oom = 1;
		return;
	}
	out[*n] = (fz_req){ method, name, buf, protobuf_c_message_pack(m, buf) };
	(*n)++;
}

static size_t
finish(pool *p, fz_req *out, size_t n)
{
	int oom = p->oom;

	pool_free(p);
	if (oom) {
		fz_reqs_free(out, n);
		return 0;
	}
	return n;
}

void
fz_reqs_free(fz_req *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i].data);
		v[i].data = NULL;
	}
}

/* The sample transcript: what an agent loop with one tool writes. */
static Histd__V1__AppendRequest *
sample_append(pool *p)
{
	Histd__V1__AppendRequest *a =
		msg_new(p, &histd__v1__append_request__descriptor);

	if (!a)
		return NULL;
	a->session_id = FZ_SESSION;
	a->n_messages = 6;
	a->messages = (Histd__V1__Message **)arr(p, 6,
		message(p, HISTD__V1__ROLE__ROLE_SYSTEM, "", 1,
			text(p, "You are a careful assistant.")),
		message(p, HISTD__V1__ROLE__ROLE_USER, "alice", 2,
			text(p, "What is the weather in Paris?"),
			image_url(p, "https://example.com/sky.png")),
		message(p, HISTD__V1__ROLE__ROLE_ASSISTANT, "planner", 2,
			reasoning(p, "Look it up.", "sig-1"),
			tool_call(p, "call_1", "weather",
				  "{\"city\":\"Paris\"}")),
		message(p, HISTD__V1__ROLE__ROLE_TOOL, "", 1,
			tool_result(p, "call_1", "weather",
				    "18 C, light rain and a long tool output")),
		message(p, HISTD__V1__ROLE__ROLE_ASSISTANT, "planner", 1,
			text(p, "It is 18 C and raining in Paris.")),
		message(p, HISTD__V1__ROLE__ROLE_ASSISTANT, "planner", 1,
			tool_call(p, "call_open", "calendar", "{}")));
	return a;
}

size_t
fz_setup_requests(fz_req *out, size_t cap)
{
	pool p = { 0 };
	size_t n = 0;
	Histd__V1__CreateSessionRequest *s =
		msg_new(&p, &histd__v1__create_session_request__descriptor);
	Histd__V1__CreateSessionRequest *k =
		msg_new(&p, &histd__v1__create_session_request__descriptor);

	if (s && k) {
		s->session_id = FZ_SESSION;
		s->n_labels = 1;
		s->labels = (Histd__V1__CreateSessionRequest__LabelsEntry **)arr(&p, 1,
			kv_new(&p, &histd__v1__create_session_request__labels_entry__descriptor,
			       "team", "search"));
		s->config = config(&p, "masking", "keep_recent_results", "1",
				   "window", "max_messages", "20");
		k->session_id = "k";
		k->n_context_keys = 2;
		k->context_keys = (Histd__V1__CreateSessionRequest__ContextKeysEntry **)arr(&p, 2,
			kv_new(&p, &histd__v1__create_session_request__context_keys_entry__descriptor,
			       "chat", "c1"),
			kv_new(&p, &histd__v1__create_session_request__context_keys_entry__descriptor,
			       "user", "u1"));
	}
	add(&p, out, cap, &n, HISTD_M_CREATE_SESSION, "create", s);
	add(&p, out, cap, &n, HISTD_M_CREATE_SESSION, "create_k", k);
	add(&p, out, cap, &n, HISTD_M_APPEND, "append", sample_append(&p));
	return finish(&p, out, n);
}

size_t
fz_seed_requests(fz_req *out, size_t cap)
{
	pool p = { 0 };
	size_t n = 0;

	{
		Histd__V1__CreateSessionRequest *r =
			msg_new(&p, &histd__v1__create_session_request__descriptor);

		if (r) {
			r->session_id = "new.session-1";
			r->n_labels = 1;
			r->labels = (Histd__V1__CreateSessionRequest__LabelsEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__create_session_request__labels_entry__descriptor,
				       "team", "infra"));
			r->config = config(&p, "compaction", "keep_recent", "2",
					   "window", "max_tokens", "500");
		}
		add(&p, out, cap, &n, HISTD_M_CREATE_SESSION, "create_session", r);
	}
	{
		Histd__V1__CreateSessionRequest *r =
			msg_new(&p, &histd__v1__create_session_request__descriptor);

		if (r) {
			r->n_context_keys = 1;
			r->context_keys = (Histd__V1__CreateSessionRequest__ContextKeysEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__create_session_request__context_keys_entry__descriptor,
				       "user", "u2"));
		}
		add(&p, out, cap, &n, HISTD_M_CREATE_SESSION, "create_session_uuid", r);
	}
	{
		Histd__V1__ResolveSessionRequest *r =
			msg_new(&p, &histd__v1__resolve_session_request__descriptor);

		if (r) {
			r->n_context_keys = 2;
			r->context_keys = (Histd__V1__ResolveSessionRequest__ContextKeysEntry **)arr(&p, 2,
				kv_new(&p, &histd__v1__resolve_session_request__context_keys_entry__descriptor,
				       "chat", "c1"),
				kv_new(&p, &histd__v1__resolve_session_request__context_keys_entry__descriptor,
				       "user", "u1"));
			r->n_labels = 1;
			r->labels = (Histd__V1__ResolveSessionRequest__LabelsEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__resolve_session_request__labels_entry__descriptor,
				       "team", "search"));
			r->config = config(&p, "window", "max_messages", "4", NULL,
					   "", "");
		}
		add(&p, out, cap, &n, HISTD_M_RESOLVE_SESSION, "resolve_session", r);
	}
	{
		Histd__V1__GetSessionRequest *r =
			msg_new(&p, &histd__v1__get_session_request__descriptor);

		if (r)
			r->session_id = FZ_SESSION;
		add(&p, out, cap, &n, HISTD_M_GET_SESSION, "get_session", r);
	}
	{
		Histd__V1__ListSessionsRequest *r =
			msg_new(&p, &histd__v1__list_sessions_request__descriptor);

		if (r) {
			r->page_size = 1;
			r->n_label_selector = 1;
			r->label_selector = (Histd__V1__ListSessionsRequest__LabelSelectorEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__list_sessions_request__label_selector_entry__descriptor,
				       "team", "search"));
		}
		add(&p, out, cap, &n, HISTD_M_LIST_SESSIONS, "list_sessions", r);
	}
	{
		Histd__V1__UpdateSessionRequest *r =
			msg_new(&p, &histd__v1__update_session_request__descriptor);
		Google__Protobuf__FieldMask *mask =
			msg_new(&p, &google__protobuf__field_mask__descriptor);

		if (r && mask) {
			r->session_id = FZ_SESSION;
			r->n_labels = 1;
			r->labels = (Histd__V1__UpdateSessionRequest__LabelsEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__update_session_request__labels_entry__descriptor,
				       "stage", "two"));
			r->config = config(&p, "masking", "include_tools", "weather",
					   "compaction", "auto_reduce_when",
					   "messages>=4|tokens>=100");
			mask->n_paths = 2;
			mask->paths = (char **)arr(&p, 2, "labels", "config");
			r->update_mask = mask;
			r->expected_revision = 2;
		}
		add(&p, out, cap, &n, HISTD_M_UPDATE_SESSION, "update_session", r);
	}
	{
		Histd__V1__DeleteSessionRequest *r =
			msg_new(&p, &histd__v1__delete_session_request__descriptor);

		if (r)
			r->session_id = "k";
		add(&p, out, cap, &n, HISTD_M_DELETE_SESSION, "delete_session", r);
	}
	{
		Histd__V1__ForkSessionRequest *r =
			msg_new(&p, &histd__v1__fork_session_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->up_to_seq = 3;
			r->new_session_id = "fork";
			r->n_labels = 1;
			r->labels = (Histd__V1__ForkSessionRequest__LabelsEntry **)arr(&p, 1,
				kv_new(&p, &histd__v1__fork_session_request__labels_entry__descriptor,
				       "from", "s"));
		}
		add(&p, out, cap, &n, HISTD_M_FORK_SESSION, "fork_session", r);
	}
	{
		Histd__V1__AppendRequest *r =
			msg_new(&p, &histd__v1__append_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->idempotency_key = "turn-7";
			r->expected_revision = 2;
			r->n_messages = 2;
			r->messages = (Histd__V1__Message **)arr(&p, 2,
				message(&p, HISTD__V1__ROLE__ROLE_TOOL, "", 1,
					tool_result(&p, "call_open", "calendar",
						    "no events")),
				message(&p, HISTD__V1__ROLE__ROLE_USER, "alice", 2,
					text(&p, "Thanks. Summarize the notes."),
					document_data(&p, "first line\nsecond",
						      "text/plain")));
		}
		add(&p, out, cap, &n, HISTD_M_APPEND, "append", r);
		add(&p, out, cap, &n, HISTD_M_APPEND, "append_sample",
		    sample_append(&p));
	}
	{
		Histd__V1__GetMessagesRequest *raw =
			msg_new(&p, &histd__v1__get_messages_request__descriptor);
		Histd__V1__GetMessagesRequest *ctx =
			msg_new(&p, &histd__v1__get_messages_request__descriptor);

		if (raw && ctx) {
			raw->session_id = FZ_SESSION;
			raw->view = HISTD__V1__VIEW__VIEW_RAW;
			raw->after_seq = 1;
			raw->limit = 2;
			ctx->session_id = FZ_SESSION;
			ctx->view = HISTD__V1__VIEW__VIEW_CONTEXT;
			ctx->last_n = 3;
		}
		add(&p, out, cap, &n, HISTD_M_GET_MESSAGES, "get_messages_raw", raw);
		add(&p, out, cap, &n, HISTD_M_GET_MESSAGES, "get_messages_context", ctx);
	}
	{
		Histd__V1__GetToolResultRequest *r =
			msg_new(&p, &histd__v1__get_tool_result_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->tool_call_id = "call_1";
		}
		add(&p, out, cap, &n, HISTD_M_GET_TOOL_RESULT, "get_tool_result", r);
	}
	{
		Histd__V1__ClearRequest *r =
			msg_new(&p, &histd__v1__clear_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->expected_revision = 2;
		}
		add(&p, out, cap, &n, HISTD_M_CLEAR, "clear", r);
	}
	{
		Histd__V1__ReplaceRequest *r =
			msg_new(&p, &histd__v1__replace_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->n_messages = 3;
			r->messages = (Histd__V1__Message **)arr(&p, 3,
				message(&p, HISTD__V1__ROLE__ROLE_USER, "bob", 1,
					text(&p, "Start again.")),
				message(&p, HISTD__V1__ROLE__ROLE_ASSISTANT, "", 1,
					tool_call(&p, "call_2", "search",
						  "{\"q\":[1,2,{}]}")),
				message(&p, HISTD__V1__ROLE__ROLE_USER, "bob", 1,
					tool_result(&p, "call_2", "search",
						    "three hits")));
		}
		add(&p, out, cap, &n, HISTD_M_REPLACE, "replace", r);
	}
	{
		Histd__V1__ReduceRequest *r =
			msg_new(&p, &histd__v1__reduce_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->max_entries = 2;
		}
		add(&p, out, cap, &n, HISTD_M_REDUCE, "reduce", r);
	}
	{
		Histd__V1__ExportRequest *r =
			msg_new(&p, &histd__v1__export_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->format = HISTD__V1__FORMAT__FORMAT_ANTHROPIC_MESSAGES;
			r->view = HISTD__V1__VIEW__VIEW_CONTEXT;
		}
		add(&p, out, cap, &n, HISTD_M_EXPORT, "export", r);
	}
	{
		Histd__V1__ImportRequest *r =
			msg_new(&p, &histd__v1__import_request__descriptor);

		if (r) {
			r->session_id = FZ_SESSION;
			r->format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
			r->json = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
				  "{\"role\":\"assistant\",\"content\":null,"
				  "\"tool_calls\":[{\"id\":\"c9\",\"type\":\"function\","
				  "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
				  "{\"role\":\"tool\",\"tool_call_id\":\"c9\","
				  "\"content\":\"ok\"}]}";
			r->idempotency_key = "import-1";
		}
		add(&p, out, cap, &n, HISTD_M_IMPORT, "import", r);
	}
	return finish(&p, out, n);
}
