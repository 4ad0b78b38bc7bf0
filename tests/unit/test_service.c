/*
 * The HistoryService rules (server/service.c), driven through
 * histd_service_unary with packed requests against the real memory driver:
 * every method's happy path, every validation rule (the code and the field
 * path in the message), revisions, idempotency, permissions, tenants,
 * pagination and the RAW fast path.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "driver.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"
#include "histd_wire.h"
#include "service.h"
#include "status.h"
#include "tokens.h"

/* Conversation text that must never appear in an error message. */
#define SECRET "SECRET-CONVERSATION-TEXT"

/* ---------------------------------------------------------------------- */
/* Fixture: a fresh memory driver and service per test, and an arena that  */
/* frees whatever a test built.                                            */

static histd_driver *drv;
static histd_service *svc;
static histd_service_config cfg;

static void *allocs[16384];
static size_t n_allocs;
static ProtobufCMessage *unpacked[4096];
static size_t n_unpacked;
static uint64_t last_current_revision;

static const histd_caller alice = { "alice", 0 };
static const histd_caller alice_ro = { "alice", 1 };
static const histd_caller bob = { "bob", 0 };

static void *
A(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	assert_non_null(p);
	assert_true(n_allocs < sizeof(allocs) / sizeof(allocs[0]));
	allocs[n_allocs++] = p;
	return p;
}

static int
setup(void **state)
{
	histd_driver_config dc = { 0 };

	(void)state;
	assert_int_equal(histd_driver_open("memory", &dc, &drv), 0);
	histd_service_config_default(&cfg);
	cfg.max_messages_per_append = 8;
	cfg.max_message_bytes = 4096;
	cfg.max_page_size = 50;
	assert_int_equal(histd_service_new(&svc, drv, &cfg), 0);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	histd_service_free(svc);
	histd_driver_close(drv);
	for (size_t i = 0; i < n_unpacked; i++)
		protobuf_c_message_free_unpacked(unpacked[i], NULL);
	n_unpacked = 0;
	for (size_t i = 0; i < n_allocs; i++)
		free(allocs[i]);
	n_allocs = 0;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Calling the service                                                     */

static int
call_raw_on(histd_service *s, const histd_caller *who, enum histd_method m,
	    const uint8_t *req, size_t len,
	    const ProtobufCMessageDescriptor *resp_desc, void *resp)
{
	histd_reply r = { .data = (uint8_t *)1, .len = 99,
			   .current_revision = 99 };
	int rc;

	histd_error_clear();
	rc = histd_service_unary(s, m, who, req, len, &r);
	if (rc == 0) {
		assert_non_null(r.data);
		if (resp) {
			ProtobufCMessage *u = protobuf_c_message_unpack(
				resp_desc, NULL, r.len, r.data);

			assert_non_null(u);
			unpacked[n_unpacked++] = u;
			*(ProtobufCMessage **)resp = u;
		}
		free(r.data);
	} else {
		assert_null(r.data);
		assert_int_equal(r.len, 0);
		last_current_revision = r.current_revision;
		/* One factual line. */
		assert_true(histd_error_message()[0] != '\0');
		assert_null(strchr(histd_error_message(), '\n'));
		assert_null(strstr(histd_error_message(), SECRET));
	}
	return rc;
}

/* Packs req into arena bytes. */
static uint8_t *
pack(const void *req, size_t *len)
{
	*len = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = A(*len);

	protobuf_c_message_pack(req, buf);
	return buf;
}

static int
call_on(histd_service *s, const histd_caller *who, enum histd_method m,
	const void *req, const ProtobufCMessageDescriptor *resp_desc,
	void *resp)
{
	size_t len;
	uint8_t *buf = pack(req, &len);

	return call_raw_on(s, who, m, buf, len, resp_desc, resp);
}

#define CALL_AS(who, m, req, rdesc, resp) \
	call_on(svc, who, m, req, rdesc, resp)
#define CALL(m, req, rdesc, resp) CALL_AS(&alice, m, req, rdesc, resp)

/* The error message contains `what`. */
#define assert_err(expr, code, what) do { \
	int rc_ = (expr); \
	assert_int_equal(rc_, code); \
	if (!strstr(histd_error_message(), what)) \
		fail_msg("message \"%s\" does not contain \"%s\"", \
			 histd_error_message(), what); \
} while (0)

/* ---------------------------------------------------------------------- */
/* Building requests                                                       */

static Histd__V1__ContentBlock *
blk(void)
{
	Histd__V1__ContentBlock *b = A(sizeof(*b));

	histd__v1__content_block__init(b);
	return b;
}

static Histd__V1__ContentBlock *
b_text(const char *s)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__TextBlock *t = A(sizeof(*t));

	histd__v1__text_block__init(t);
	t->text = (char *)s;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = t;
	return b;
}

static Histd__V1__ContentBlock *
b_image(const char *url, size_t data_len, const char *media_type)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__ImageBlock *i = A(sizeof(*i));

	histd__v1__image_block__init(i);
	if (url) {
		i->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
		i->url = (char *)url;
	} else if (data_len != (size_t)-1) {
		i->source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_DATA;
		i->data.len = data_len;
		i->data.data = A(data_len);
	}
	if (media_type)
		i->media_type = (char *)media_type;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = i;
	return b;
}

static Histd__V1__ContentBlock *
b_doc(const char *url, size_t data_len, const char *media_type)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__DocumentBlock *d = A(sizeof(*d));

	histd__v1__document_block__init(d);
	if (url) {
		d->source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL;
		d->url = (char *)url;
	} else if (data_len != (size_t)-1) {
		d->source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
		d->data.len = data_len;
		d->data.data = A(data_len);
	}
	if (media_type)
		d->media_type = (char *)media_type;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT;
	b->document = d;
	return b;
}

static Histd__V1__ContentBlock *
b_reasoning(const char *text, const char *signature)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__ReasoningBlock *r = A(sizeof(*r));

	histd__v1__reasoning_block__init(r);
	r->text = (char *)text;
	r->signature = (char *)signature;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
	b->reasoning = r;
	return b;
}

static Histd__V1__ContentBlock *
b_call(const char *id, const char *name, const char *args)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__ToolCallBlock *c = A(sizeof(*c));

	histd__v1__tool_call_block__init(c);
	c->id = (char *)id;
	c->name = (char *)name;
	c->arguments = (char *)args;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b->tool_call = c;
	return b;
}

/* A tool result holding n blocks (varargs). */
static Histd__V1__ContentBlock *
b_result(const char *call_id, size_t n, ...)
{
	Histd__V1__ContentBlock *b = blk();
	Histd__V1__ToolResultBlock *r = A(sizeof(*r));
	va_list ap;

	histd__v1__tool_result_block__init(r);
	r->tool_call_id = (char *)call_id;
	r->tool_name = "tool";
	r->n_content = n;
	r->content = A(n * sizeof(*r->content));
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		r->content[i] = va_arg(ap, Histd__V1__ContentBlock *);
	va_end(ap);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b->tool_result = r;
	return b;
}

/* A message of role holding n blocks (varargs). */
static Histd__V1__Message *
msg(Histd__V1__Role role, size_t n, ...)
{
	Histd__V1__Message *m = A(sizeof(*m));
	va_list ap;

	histd__v1__message__init(m);
	m->role = role;
	m->n_content = n;
	m->content = A(n * sizeof(*m->content));
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		m->content[i] = va_arg(ap, Histd__V1__ContentBlock *);
	va_end(ap);
	return m;
}

#define SYSTEM HISTD__V1__ROLE__ROLE_SYSTEM
#define USER HISTD__V1__ROLE__ROLE_USER
#define ASSISTANT HISTD__V1__ROLE__ROLE_ASSISTANT
#define TOOL HISTD__V1__ROLE__ROLE_TOOL

static Histd__V1__Message *
user(const char *s)
{
	return msg(USER, 1, b_text(s));
}

/* A map of n string pairs "k0".."kn" for any *Entry type (they share a
 * layout: base, key, value). */
static void *
pairs(const ProtobufCMessageDescriptor *entry, size_t n, const char *const *kv)
{
	ProtobufCMessage **v = A(n * sizeof(*v));

	for (size_t i = 0; i < n; i++) {
		ProtobufCMessage *e = A(entry->sizeof_message);
		const ProtobufCFieldDescriptor *fk =
			protobuf_c_message_descriptor_get_field(entry, 1);
		const ProtobufCFieldDescriptor *fv =
			protobuf_c_message_descriptor_get_field(entry, 2);

		protobuf_c_message_init(entry, e);
		*(const char **)((char *)e + fk->offset) = kv[2 * i];
		*(const char **)((char *)e + fv->offset) = kv[2 * i + 1];
		v[i] = e;
	}
	return v;
}

#define SET_MAP(req, member, entry_desc, n, ...) do { \
	static const char *const kv_[] = { __VA_ARGS__ }; \
	(req)->n_##member = (n); \
	(req)->member = pairs(&(entry_desc), (n), kv_); \
} while (0)

/* ---------------------------------------------------------------------- */
/* Method helpers                                                          */

static Histd__V1__Session *
create_as(const histd_caller *who, const char *id)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;

	r.session_id = (char *)id;
	assert_int_equal(CALL_AS(who, HISTD_M_CREATE_SESSION, &r,
				 &histd__v1__session__descriptor, &s), 0);
	return s;
}

static Histd__V1__Session *
create(const char *id)
{
	return create_as(&alice, id);
}

static Histd__V1__Session *
get_session(const char *id)
{
	Histd__V1__GetSessionRequest r = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;

	r.session_id = (char *)id;
	assert_int_equal(CALL(HISTD_M_GET_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	return s;
}

static Histd__V1__AppendRequest *
append_req(const char *sid, size_t n, Histd__V1__Message **m)
{
	Histd__V1__AppendRequest *r = A(sizeof(*r));

	histd__v1__append_request__init(r);
	r->session_id = (char *)sid;
	r->n_messages = n;
	r->messages = m;
	return r;
}

/* Appends the n messages given (varargs); returns the code. */
static int
append_as(const histd_caller *who, const char *sid,
	  Histd__V1__AppendResponse **out, size_t n, ...)
{
	Histd__V1__Message **m = A(n * sizeof(*m));
	Histd__V1__AppendResponse *resp = NULL;
	va_list ap;
	int rc;

	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		m[i] = va_arg(ap, Histd__V1__Message *);
	va_end(ap);
	rc = CALL_AS(who, HISTD_M_APPEND, append_req(sid, n, m),
		     &histd__v1__append_response__descriptor, &resp);
	if (out)
		*out = resp;
	return rc;
}

#define APPEND(sid, out, n, ...) append_as(&alice, sid, out, n, __VA_ARGS__)

/* Appends n user text messages "m1".."mn". */
static void
append_n(const char *sid, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char *t = A(24);

		snprintf(t, 24, "m%zu", i + 1);
		assert_int_equal(APPEND(sid, NULL, 1, user(t)), 0);
	}
}

static int
get_messages_on(histd_service *s, const char *sid, Histd__V1__View view,
		uint64_t after, uint32_t limit, uint32_t last_n,
		Histd__V1__GetMessagesResponse **out)
{
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;

	r.session_id = (char *)sid;
	r.view = view;
	r.after_seq = after;
	r.limit = limit;
	r.last_n = last_n;
	return call_on(s, &alice, HISTD_M_GET_MESSAGES, &r,
		       &histd__v1__get_messages_response__descriptor, out);
}

static Histd__V1__GetMessagesResponse *
read_raw(const char *sid, uint64_t after, uint32_t limit, uint32_t last_n)
{
	Histd__V1__GetMessagesResponse *g = NULL;

	assert_int_equal(get_messages_on(svc, sid, HISTD__V1__VIEW__VIEW_RAW,
					 after, limit, last_n, &g), 0);
	return g;
}

static void
assert_seqs(const Histd__V1__GetMessagesResponse *g, uint64_t first,
	    size_t n)
{
	assert_int_equal(g->n_messages, n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(g->messages[i]->seq, first + i);
}

/* ---------------------------------------------------------------------- */
/* Tables and small functions                                              */

static void
method_tables_follow_the_enum(void **state)
{
	(void)state;
	assert_string_equal(histd_method_paths[HISTD_M_CREATE_SESSION],
			    "/histd.v1.HistoryService/CreateSession");
	assert_string_equal(histd_method_paths[HISTD_M_APPEND],
			    "/histd.v1.HistoryService/Append");
	assert_string_equal(histd_method_paths[HISTD_M_SUBSCRIBE],
			    "/histd.v1.HistoryService/Subscribe");
	for (int m = 0; m < HISTD_M_COUNT; m++) {
		char want[96];

		assert_non_null(histd_method_names[m]);
		snprintf(want, sizeof(want), "/histd.v1.HistoryService/%s",
			 histd_method_names[m]);
		assert_string_equal(histd_method_paths[m], want);
	}
	assert_string_equal(histd_method_names[HISTD_M_GET_TOOL_RESULT],
			    "GetToolResult");
	assert_true(histd_method_writes(HISTD_M_APPEND));
	assert_true(histd_method_writes(HISTD_M_RESOLVE_SESSION));
	assert_true(histd_method_writes(HISTD_M_REPLACE));
	assert_true(histd_method_writes(HISTD_M_IMPORT));
	assert_false(histd_method_writes(HISTD_M_GET_MESSAGES));
	assert_false(histd_method_writes(HISTD_M_LIST_SESSIONS));
	assert_false(histd_method_writes(HISTD_M_EXPORT));
	assert_false(histd_method_writes(HISTD_M_SUBSCRIBE));
}

static void
config_defaults_match_the_header(void **state)
{
	histd_service_config c;

	(void)state;
	histd_service_config_default(&c);
	assert_int_equal(c.max_messages_per_append, 1000);
	assert_int_equal(c.max_message_bytes, 1024 * 1024);
	assert_int_equal(c.max_page_size, 1000);
	assert_true(c.idempotency_ttl_us == INT64_C(86400000000));
	assert_int_equal(c.provider_call_threads, 16);
	assert_ptr_equal(histd_service_driver(svc), drv);
	assert_int_equal(histd_service_get_config(svc)->max_page_size, 50);
}

static void
session_id_is_1_to_128_of_the_allowed_characters(void **state)
{
	char id[130];

	(void)state;
	assert_int_equal(histd_check_session_id("a-B_9.x:y", "session_id"), 0);
	memset(id, 'a', 128);
	id[128] = '\0';
	assert_int_equal(histd_check_session_id(id, "session_id"), 0);
	id[128] = 'a';
	id[129] = '\0';
	assert_err(histd_check_session_id(id, "new_session_id"),
		   HISTD_EINVALID, "new_session_id is longer than 128");
	assert_err(histd_check_session_id("", "session_id"), HISTD_EINVALID,
		   "session_id is required");
	assert_err(histd_check_session_id("a b", "session_id"),
		   HISTD_EINVALID, "session_id holds a character outside");
	assert_err(histd_check_session_id("a/b", "session_id"),
		   HISTD_EINVALID, "session_id");
}

/* ---------------------------------------------------------------------- */
/* Sessions                                                                */

static void
create_session_returns_it_at_revision_1(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	int64_t now = histd_now_us() / 1000000;

	(void)state;
	r.session_id = "chat-1";
	SET_MAP(&r, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 2,
		"zeta", "z", "alpha", "a");
	SET_MAP(&r, context_keys,
		histd__v1__create_session_request__context_keys_entry__descriptor,
		1, "user", "u1");
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_string_equal(s->id, "chat-1");
	assert_int_equal(s->revision, 1);
	assert_int_equal(s->n_labels, 2);
	assert_string_equal(s->labels[0]->key, "alpha");   /* sorted */
	assert_string_equal(s->labels[1]->key, "zeta");
	assert_int_equal(s->n_context_keys, 1);
	assert_string_equal(s->context_keys[0]->value, "u1");
	assert_null(s->config);
	assert_non_null(s->created_at);
	assert_non_null(s->updated_at);
	assert_true(s->created_at->seconds >= now - 5 &&
		    s->created_at->seconds <= now + 5);
	assert_non_null(s->stats);
	assert_int_equal(s->stats->message_count, 0);
	assert_int_equal(s->stats->last_seq, 0);

	s = get_session("chat-1");
	assert_int_equal(s->revision, 1);
	assert_string_equal(s->labels[0]->value, "a");
}

static void
create_session_without_id_assigns_a_uuid(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *a = NULL, *b = NULL;

	(void)state;
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &a), 0);
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &b), 0);
	assert_int_equal(strlen(a->id), 36);
	assert_string_not_equal(a->id, b->id);
	for (size_t i = 0; i < 36; i++) {
		char c = a->id[i];

		if (i == 8 || i == 13 || i == 18 || i == 23)
			assert_int_equal(c, '-');
		else
			assert_true((c >= '0' && c <= '9') ||
				    (c >= 'a' && c <= 'f'));
	}
	assert_int_equal(a->id[14], '4');   /* random UUID */
	assert_int_equal(histd_check_session_id(a->id, "id"), 0);
}

static void
create_session_with_a_taken_id_is_already_exists(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;

	(void)state;
	create("dup");
	r.session_id = "dup";
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
			 HISTD_EEXISTS);
	r.session_id = "bad id";
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "session_id holds a character");
}

static void
labels_and_context_keys_are_validated(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	char *long_value = A(300), *long_key = A(80);
	const char **kv = A(2 * 65 * sizeof(char *));

	(void)state;
	r.session_id = "s";
	SET_MAP(&r, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 1,
		"has space", "v");
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "labels[\"has space\"]: a key must be 1..63 characters");
	SET_MAP(&r, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 1,
		"", "v");
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "labels[\"\"]: a key must be");
	/* A key is shown only as printable ASCII without quotes. */
	r.labels[0]->key = "a\"b\x01" "c";
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "labels[\"a?b?c\"]: a key must be");
	memset(long_key, 'k', 64);
	r.labels[0]->key = long_key;
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "labels[\"kkkk");
	long_key[63] = '\0';   /* 63 bytes: fine */
	r.labels[0]->key = long_key;
	memset(long_value, 'v', 257);
	r.labels[0]->value = long_value;
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "is 257 bytes; the limit is 256");
	SET_MAP(&r, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 1,
		"team", "x");
	r.labels[0]->value = long_value;
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "labels[\"team\"] is 257 bytes");
	r.n_labels = 0;

	for (int i = 0; i < 65; i++) {
		char *k = A(16);

		snprintf(k, 16, "k%d", i);
		kv[2 * i] = k;
		kv[2 * i + 1] = "v";
	}
	r.n_context_keys = 65;
	r.context_keys = pairs(
		&histd__v1__create_session_request__context_keys_entry__descriptor,
		65, kv);
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "context_keys: too many");
	r.n_context_keys = 64;
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_int_equal(s->n_context_keys, 64);
}

static void
a_repeated_map_key_keeps_the_last_value(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;

	(void)state;
	r.session_id = "s";
	SET_MAP(&r, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 3,
		"k", "first", "a", "x", "k", "last");
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_int_equal(s->n_labels, 2);
	assert_string_equal(s->labels[1]->key, "k");
	assert_string_equal(s->labels[1]->value, "last");
}

static Histd__V1__SessionConfig *
config_with(size_t n_plugins, const char *name)
{
	Histd__V1__SessionConfig *c = A(sizeof(*c));
	Histd__V1__Pipeline *p = A(sizeof(*p));

	histd__v1__session_config__init(c);
	histd__v1__pipeline__init(p);
	c->pipeline = p;
	p->n_plugins = n_plugins;
	p->plugins = A(n_plugins * sizeof(*p->plugins));
	for (size_t i = 0; i < n_plugins; i++) {
		p->plugins[i] = A(sizeof(*p->plugins[i]));
		histd__v1__plugin_config__init(p->plugins[i]);
		p->plugins[i]->name = (char *)name;
	}
	return c;
}

static void
config_with_an_unknown_plugin_is_invalid(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;

	(void)state;
	r.session_id = "s";
	r.config = config_with(1, "no_such_plugin");
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "config.pipeline.plugins[0].name: unknown plugin");
	r.config = config_with(1, "");
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "config.pipeline.plugins[0].name is required");
	/* Set and empty: no pipeline; kept and given back. */
	r.config = config_with(0, NULL);
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_non_null(s->config);
	assert_non_null(s->config->pipeline);
	assert_int_equal(s->config->pipeline->n_plugins, 0);
	s = get_session("s");
	assert_non_null(s->config);
	assert_non_null(s->config->pipeline);
}

static void
config_embeddings_name_a_known_provider_and_a_clean_model(void **state)
{
	Histd__V1__CreateSessionRequest r = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__EmbeddingConfig e = HISTD__V1__EMBEDDING_CONFIG__INIT;

	(void)state;
	c.embeddings = &e;
	r.config = &c;
	r.session_id = "e1";
	e.provider = "cohere";
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL), HISTD_EINVALID,
		   "config.embeddings.provider");
	e.provider = "gemini";
	e.model = "../../v1/evil";
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL), HISTD_EINVALID,
		   "config.embeddings.model");
	e.provider = "";
	e.model = "text-embedding-3-small";
	assert_err(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL), HISTD_EINVALID,
		   "needs a provider");
	e.provider = "openai";
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &r, NULL, NULL), 0);
}

static void
resolve_session_is_get_or_create_by_context_keys(void **state)
{
	Histd__V1__ResolveSessionRequest r =
		HISTD__V1__RESOLVE_SESSION_REQUEST__INIT;
	Histd__V1__ResolveSessionResponse *a = NULL, *b = NULL, *c = NULL;

	(void)state;
	assert_err(CALL(HISTD_M_RESOLVE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "context_keys is required");
	SET_MAP(&r, context_keys,
		histd__v1__resolve_session_request__context_keys_entry__descriptor,
		2, "user", "u1", "chat", "c1");
	SET_MAP(&r, labels,
		histd__v1__resolve_session_request__labels_entry__descriptor,
		1, "team", "a");
	assert_int_equal(CALL(HISTD_M_RESOLVE_SESSION, &r,
			      &histd__v1__resolve_session_response__descriptor,
			      &a), 0);
	assert_true(a->created);
	assert_int_equal(strlen(a->session->id), 36);
	assert_int_equal(a->session->n_labels, 1);
	/* Same keys in another order: the same session. */
	SET_MAP(&r, context_keys,
		histd__v1__resolve_session_request__context_keys_entry__descriptor,
		2, "chat", "c1", "user", "u1");
	r.n_labels = 0;
	assert_int_equal(CALL(HISTD_M_RESOLVE_SESSION, &r,
			      &histd__v1__resolve_session_response__descriptor,
			      &b), 0);
	assert_false(b->created);
	assert_string_equal(b->session->id, a->session->id);
	assert_int_equal(b->session->n_labels, 1);
	/* Another tenant, the same keys: its own session. */
	assert_int_equal(CALL_AS(&bob, HISTD_M_RESOLVE_SESSION, &r,
				 &histd__v1__resolve_session_response__descriptor,
				 &c), 0);
	assert_true(c->created);
	r.config = config_with(1, "no_such_plugin");
	assert_err(CALL(HISTD_M_RESOLVE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "config.pipeline.plugins[0].name");
}

static void
get_session_of_an_unknown_id_is_not_found(void **state)
{
	Histd__V1__GetSessionRequest r = HISTD__V1__GET_SESSION_REQUEST__INIT;

	(void)state;
	r.session_id = "nope";
	assert_int_equal(CALL(HISTD_M_GET_SESSION, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
	r.session_id = "";
	assert_err(CALL(HISTD_M_GET_SESSION, &r, NULL, NULL), HISTD_EINVALID,
		   "session_id is required");
}

static Histd__V1__ListSessionsResponse *
list_on(histd_service *s, uint32_t page_size, const char *token)
{
	Histd__V1__ListSessionsRequest r = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__ListSessionsResponse *l = NULL;

	r.page_size = page_size;
	r.page_token = (char *)token;
	assert_int_equal(call_on(s, &alice, HISTD_M_LIST_SESSIONS, &r,
				 &histd__v1__list_sessions_response__descriptor,
				 &l), 0);
	return l;
}

static void
list_sessions_pages_in_id_order_by_opaque_tokens(void **state)
{
	Histd__V1__ListSessionsResponse *l;
	char ids[7][16];

	(void)state;
	for (int i = 6; i >= 0; i--) {
		snprintf(ids[i], sizeof(ids[i]), "s%d", i);
		create(ids[i]);
	}
	l = list_on(svc, 3, "");
	assert_int_equal(l->n_sessions, 3);
	assert_string_equal(l->sessions[0]->id, "s0");
	assert_string_equal(l->sessions[2]->id, "s2");
	assert_int_equal(strncmp(l->next_page_token, "v1.", 3), 0);
	assert_null(strstr(l->next_page_token, "s2"));   /* opaque */
	l = list_on(svc, 3, l->next_page_token);
	assert_int_equal(l->n_sessions, 3);
	assert_string_equal(l->sessions[0]->id, "s3");
	assert_non_null(l->sessions[0]->stats);
	l = list_on(svc, 3, l->next_page_token);
	assert_int_equal(l->n_sessions, 1);
	assert_string_equal(l->sessions[0]->id, "s6");
	assert_string_equal(l->next_page_token, "");
	/* page_size 0 means 100: everything at once. */
	l = list_on(svc, 0, "");
	assert_int_equal(l->n_sessions, 7);
	assert_string_equal(l->next_page_token, "");
}

static void
list_sessions_refuses_a_token_it_did_not_give(void **state)
{
	const char *bad[] = {
		"garbage", "v1.", "v1.!!!!", "v2.czE", "v1.YSBi" /* "a b" */,
		"v1.czF" /* non-canonical trailing bits of "s1" */,
		"v1.czE=",
	};
	Histd__V1__ListSessionsRequest r = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;

	(void)state;
	create("s1");
	r.page_token = "v1.czE";   /* "s1": valid */
	assert_int_equal(CALL(HISTD_M_LIST_SESSIONS, &r, NULL, NULL), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		r.page_token = (char *)bad[i];
		assert_err(CALL(HISTD_M_LIST_SESSIONS, &r, NULL, NULL),
			   HISTD_EINVALID, "page_token is not valid");
	}
}

static void
list_sessions_clamps_the_page_size_and_filters_by_labels(void **state)
{
	histd_service_config small = cfg;
	histd_service *s2;
	Histd__V1__ListSessionsResponse *l = NULL;
	Histd__V1__ListSessionsRequest r = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__CreateSessionRequest c = HISTD__V1__CREATE_SESSION_REQUEST__INIT;

	(void)state;
	small.max_page_size = 2;
	assert_int_equal(histd_service_new(&s2, drv, &small), 0);
	create("a");
	create("b");
	create("c");
	l = list_on(s2, 1000, "");
	assert_int_equal(l->n_sessions, 2);
	assert_string_not_equal(l->next_page_token, "");
	l = list_on(s2, 0, "");
	assert_int_equal(l->n_sessions, 2);
	histd_service_free(s2);

	c.session_id = "prod-1";
	SET_MAP(&c, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 2,
		"env", "prod", "team", "x");
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &c, NULL, NULL), 0);
	SET_MAP(&r, label_selector,
		histd__v1__list_sessions_request__label_selector_entry__descriptor,
		1, "env", "prod");
	assert_int_equal(CALL(HISTD_M_LIST_SESSIONS, &r,
			      &histd__v1__list_sessions_response__descriptor,
			      &l), 0);
	assert_int_equal(l->n_sessions, 1);
	assert_string_equal(l->sessions[0]->id, "prod-1");
	SET_MAP(&r, label_selector,
		histd__v1__list_sessions_request__label_selector_entry__descriptor,
		1, "bad key!", "prod");
	assert_err(CALL(HISTD_M_LIST_SESSIONS, &r, NULL, NULL),
		   HISTD_EINVALID, "label_selector[\"bad key!\"]: a key must be");
}

static Google__Protobuf__FieldMask *
mask(size_t n, const char *a, const char *b)
{
	Google__Protobuf__FieldMask *m = A(sizeof(*m));

	google__protobuf__field_mask__init(m);
	m->n_paths = n;
	m->paths = A(2 * sizeof(char *));
	m->paths[0] = (char *)a;
	m->paths[1] = (char *)b;
	return m;
}

static void
update_session_replaces_what_the_mask_names(void **state)
{
	Histd__V1__UpdateSessionRequest r = HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;

	(void)state;
	create("u");
	r.session_id = "u";
	SET_MAP(&r, labels,
		histd__v1__update_session_request__labels_entry__descriptor, 2,
		"b", "2", "a", "1");
	assert_err(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "update_mask is required");
	r.update_mask = mask(2, "labels", "bogus");
	assert_err(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "update_mask.paths[1]: unknown field \"bogus\"");
	r.update_mask = mask(1, "labels", NULL);
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_int_equal(s->revision, 2);
	assert_int_equal(s->n_labels, 2);
	assert_string_equal(s->labels[0]->key, "a");

	/* config only: labels stay, even though the request holds some. */
	r.update_mask = mask(1, "config", NULL);
	r.config = config_with(1, "no_such_plugin");
	assert_err(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL),
		   HISTD_EINVALID, "config.pipeline.plugins[0].name: unknown plugin");
	r.config = config_with(0, NULL);
	r.n_labels = 0;
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_int_equal(s->revision, 3);
	assert_int_equal(s->n_labels, 2);
	assert_non_null(s->config);
	assert_non_null(s->config->pipeline);

	/* Both, with nothing: labels and config cleared. */
	r.update_mask = mask(2, "config", "labels");
	r.config = NULL;
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r,
			      &histd__v1__session__descriptor, &s), 0);
	assert_int_equal(s->n_labels, 0);
	assert_null(s->config);
	assert_int_equal(s->revision, 4);

	r.expected_revision = 2;
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL),
			 HISTD_ECONFLICT);
	assert_int_equal(last_current_revision, 4);
	r.expected_revision = 4;
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL), 0);
	r.session_id = "missing";
	r.expected_revision = 0;
	assert_int_equal(CALL(HISTD_M_UPDATE_SESSION, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
}

static void
delete_session_removes_it_and_checks_the_revision(void **state)
{
	Histd__V1__DeleteSessionRequest r = HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__DeleteSessionResponse *d = NULL;

	(void)state;
	create("d");
	append_n("d", 2);
	r.session_id = "d";
	r.expected_revision = 1;
	assert_int_equal(CALL(HISTD_M_DELETE_SESSION, &r, NULL, NULL),
			 HISTD_ECONFLICT);
	assert_int_equal(last_current_revision, 3);
	r.expected_revision = 3;
	assert_int_equal(CALL(HISTD_M_DELETE_SESSION, &r,
			      &histd__v1__delete_session_response__descriptor,
			      &d), 0);
	g.session_id = "d";
	assert_int_equal(CALL(HISTD_M_GET_SESSION, &g, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL(HISTD_M_DELETE_SESSION, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
}

static void
fork_session_copies_up_to_a_seq(void **state)
{
	Histd__V1__CreateSessionRequest c = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__ForkSessionRequest r = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	Histd__V1__Session *f = NULL;
	Histd__V1__AppendResponse *a = NULL;
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	c.session_id = "src";
	SET_MAP(&c, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 1,
		"team", "a");
	assert_int_equal(CALL(HISTD_M_CREATE_SESSION, &c, NULL, NULL), 0);
	append_n("src", 3);

	r.session_id = "src";
	r.up_to_seq = 2;
	r.new_session_id = "fork";
	assert_int_equal(CALL(HISTD_M_FORK_SESSION, &r,
			      &histd__v1__session__descriptor, &f), 0);
	assert_string_equal(f->id, "fork");
	assert_int_equal(f->revision, 1);
	assert_int_equal(f->stats->message_count, 2);
	assert_int_equal(f->stats->last_seq, 2);
	assert_int_equal(f->n_labels, 1);   /* the source's */
	assert_string_equal(f->labels[0]->value, "a");
	g = read_raw("fork", 0, 0, 0);
	assert_seqs(g, 1, 2);
	assert_string_equal(g->messages[1]->content[0]->text->text, "m2");
	assert_int_equal(APPEND("fork", &a, 1, user("next")), 0);
	assert_int_equal(a->first_seq, 3);

	/* Given labels, no id: a UUID with those labels. */
	r.new_session_id = "";
	SET_MAP(&r, labels,
		histd__v1__fork_session_request__labels_entry__descriptor, 1,
		"team", "b");
	assert_int_equal(CALL(HISTD_M_FORK_SESSION, &r,
			      &histd__v1__session__descriptor, &f), 0);
	assert_int_equal(strlen(f->id), 36);
	assert_string_equal(f->labels[0]->value, "b");

	r.new_session_id = "fork";
	assert_int_equal(CALL(HISTD_M_FORK_SESSION, &r, NULL, NULL),
			 HISTD_EEXISTS);
	r.new_session_id = "x y";
	assert_err(CALL(HISTD_M_FORK_SESSION, &r, NULL, NULL), HISTD_EINVALID,
		   "new_session_id");
	r.session_id = "missing";
	r.new_session_id = "f2";
	assert_int_equal(CALL(HISTD_M_FORK_SESSION, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
	r.n_labels = 0;
	assert_int_equal(CALL(HISTD_M_FORK_SESSION, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
}

/* ---------------------------------------------------------------------- */
/* Append                                                                  */

static void
append_assigns_seqs_revision_and_token_estimates(void **state)
{
	Histd__V1__AppendResponse *a = NULL;
	Histd__V1__Message *m1 = user("hello there, model");
	Histd__V1__Message *m2 = msg(ASSISTANT, 3,
		b_reasoning("thinking about it", "sig"),
		b_text("calling a tool"),
		b_call("call_1", "get_weather", "{\"city\":\"Paris\"}"));
	Histd__V1__Message *m3 = msg(TOOL, 1,
		b_result("call_1", 1, b_text("18C and sunny")));
	uint32_t t1 = histd_tokens_message(m1), t2 = histd_tokens_message(m2),
		 t3 = histd_tokens_message(m3);
	Histd__V1__Session *s;

	(void)state;
	create("a");
	assert_int_equal(APPEND("a", &a, 3, m1, m2, m3), 0);
	assert_int_equal(a->first_seq, 1);
	assert_int_equal(a->last_seq, 3);
	assert_int_equal(a->revision, 2);
	assert_false(a->replayed);
	assert_int_equal(a->n_token_estimates, 3);
	assert_int_equal(a->token_estimates[0], t1);
	assert_int_equal(a->token_estimates[1], t2);
	assert_int_equal(a->token_estimates[2], t3);

	assert_int_equal(APPEND("a", &a, 1, user("again")), 0);
	assert_int_equal(a->first_seq, 4);
	assert_int_equal(a->revision, 3);

	s = get_session("a");
	assert_int_equal(s->stats->message_count, 4);
	assert_int_equal(s->stats->last_seq, 4);
	assert_int_equal(s->stats->first_seq, 1);
	assert_int_equal(s->stats->token_estimate,
			 t1 + t2 + t3 + histd_tokens_message(user("again")));
	assert_true(s->stats->bytes > 0);
}

static void
append_stores_seq_estimate_and_created_at_and_keeps_the_rest(void **state)
{
	Histd__V1__GetMessagesResponse *g;
	Histd__V1__Message *m = user("kept as given");
	Google__Protobuf__Timestamp given = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Histd__V1__Message *n = msg(USER, 1, b_image("https://x/y.png", 0,
						   "image/png"));
	int64_t now = histd_now_us() / 1000000;

	(void)state;
	create("a");
	given.seconds = 1700000000;
	given.nanos = 5000;
	m->created_at = &given;
	m->author = "planner";
	m->seq = 77;                /* ignored */
	m->token_estimate = 99999;  /* ignored */
	assert_int_equal(APPEND("a", NULL, 2, m, n), 0);
	g = read_raw("a", 0, 0, 0);
	assert_seqs(g, 1, 2);
	assert_int_equal(g->messages[0]->created_at->seconds, 1700000000);
	assert_int_equal(g->messages[0]->created_at->nanos, 5000);
	assert_string_equal(g->messages[0]->author, "planner");
	m->seq = 0;
	m->token_estimate = 0;
	assert_int_equal(g->messages[0]->token_estimate,
			 histd_tokens_message(m));
	assert_non_null(g->messages[1]->created_at);
	assert_true(g->messages[1]->created_at->seconds >= now - 5 &&
		    g->messages[1]->created_at->seconds <= now + 5);
	assert_int_equal(g->messages[1]->token_estimate,
			 HISTD_TOKENS_MESSAGE_OVERHEAD + HISTD_TOKENS_IMAGE);
	assert_int_equal(g->token_estimate,
			 g->messages[0]->token_estimate +
			 g->messages[1]->token_estimate);
}

static void
append_accepts_every_valid_shape(void **state)
{
	(void)state;
	create("ok");
	assert_int_equal(APPEND("ok", NULL, 6,
		msg(SYSTEM, 1, b_text("be brief")),
		msg(USER, 4, b_text("look"), b_image(NULL, 10, "image/webp"),
		    b_doc("https://x/a.pdf", 0, NULL),
		    b_doc(NULL, 3, "application/pdf")),
		msg(ASSISTANT, 4, b_reasoning("", "signature-only"),
		    b_call("c1", "f", ""), b_call("c2", "g", "42"),
		    b_call("c3", "h", "[1, {\"a\": null}]")),
		msg(TOOL, 2, b_result("c1", 0),
		    b_result("c2", 2, b_text("r"),
			     b_image("https://x/i.gif", 0, "image/gif"))),
		msg(USER, 2, b_result("c3", 1, b_doc(NULL, 1, "text/plain")),
		    b_text("and more")),
		msg(ASSISTANT, 1, b_text("done"))), 0);
}

/* Appends [a good message, bad] and expects code with `what` in the
 * message, and nothing stored. */
static void
expect_bad(Histd__V1__Message *bad, int code, const char *what)
{
	Histd__V1__GetMessagesResponse *g;

	assert_err(APPEND("v", NULL, 2, user("fine " SECRET), bad), code,
		   what);
	g = read_raw("v", 0, 0, 0);
	assert_int_equal(g->n_messages, 0);
}

static void
append_validates_every_message_and_names_the_field_path(void **state)
{
	Histd__V1__Message *m;
	Google__Protobuf__Timestamp bad_ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	char *long_id = A(200);

	(void)state;
	create("v");
	expect_bad(msg(HISTD__V1__ROLE__ROLE_UNSPECIFIED, 1, b_text(SECRET)),
		   HISTD_EINVALID, "messages[1].role is required");
	expect_bad(msg((Histd__V1__Role)9, 1, b_text(SECRET)),
		   HISTD_EINVALID, "messages[1].role is not a known Role");
	expect_bad(msg(USER, 0), HISTD_EINVALID,
		   "messages[1].content is empty");
	expect_bad(msg(USER, 2, b_text(SECRET), blk()), HISTD_EINVALID,
		   "messages[1].content[1] has no block set");
	expect_bad(msg(USER, 1, b_text("")), HISTD_EINVALID,
		   "messages[1].content[0].text.text is empty");
	/* Images and documents. */
	expect_bad(msg(USER, 1, b_image(NULL, (size_t)-1, "image/png")),
		   HISTD_EINVALID, "messages[1].content[0].image: url or data is required");
	expect_bad(msg(USER, 1, b_image("", 0, NULL)),
		   HISTD_EINVALID, "messages[1].content[0].image.url is empty");
	expect_bad(msg(USER, 1, b_image(NULL, 0, "image/png")),
		   HISTD_EINVALID, "messages[1].content[0].image.data is empty");
	expect_bad(msg(USER, 1, b_image(NULL, 8, NULL)), HISTD_EINVALID,
		   "messages[1].content[0].image.media_type is required with data");
	expect_bad(msg(USER, 1, b_image(NULL, 8, "image/tiff")),
		   HISTD_EINVALID, "messages[1].content[0].image.media_type is not one of");
	expect_bad(msg(USER, 1, b_image("https://x", 0, "text/html")),
		   HISTD_EINVALID, "image.media_type is not one of");
	expect_bad(msg(USER, 1, b_doc(NULL, (size_t)-1, NULL)),
		   HISTD_EINVALID, "messages[1].content[0].document: url or data is required");
	expect_bad(msg(USER, 1, b_doc(NULL, 8, "")), HISTD_EINVALID,
		   "messages[1].content[0].document.media_type is required with data");
	expect_bad(msg(USER, 1, b_doc("", 0, NULL)), HISTD_EINVALID,
		   "messages[1].content[0].document.url is empty");
	/* Reasoning. */
	expect_bad(msg(USER, 1, b_reasoning(SECRET, "")), HISTD_EINVALID,
		   "messages[1].content[0].reasoning: only assistant messages may hold reasoning");
	expect_bad(msg(ASSISTANT, 1, b_reasoning("", "")), HISTD_EINVALID,
		   "messages[1].content[0].reasoning is empty");
	/* Tool calls. */
	expect_bad(msg(USER, 1, b_call("c", "f", "{}")), HISTD_EINVALID,
		   "messages[1].content[0].tool_call: only assistant messages may hold tool calls");
	expect_bad(msg(ASSISTANT, 2, b_text("x"), b_call("", "f", "{}")),
		   HISTD_EINVALID, "messages[1].content[1].tool_call.id is required");
	memset(long_id, 'i', 129);
	expect_bad(msg(ASSISTANT, 1, b_call(long_id, "f", "{}")),
		   HISTD_EINVALID, "messages[1].content[0].tool_call.id is 129 bytes; the limit is 128");
	expect_bad(msg(ASSISTANT, 1, b_call("c", "", "{}")), HISTD_EINVALID,
		   "messages[1].content[0].tool_call.name is required");
	expect_bad(msg(ASSISTANT, 1, b_call("c", long_id, "{}")),
		   HISTD_EINVALID, "messages[1].content[0].tool_call.name is 129 bytes");
	expect_bad(msg(ASSISTANT, 1, b_call("c", "f", "{\"q\": \"" SECRET "\"")),
		   HISTD_EINVALID, "messages[1].content[0].tool_call.arguments is not valid JSON");
	expect_bad(msg(ASSISTANT, 1, b_call("c", "f", SECRET)),
		   HISTD_EINVALID, "tool_call.arguments is not valid JSON");
	/* Tool results. */
	expect_bad(msg(ASSISTANT, 1, b_result("c", 1, b_text(SECRET))),
		   HISTD_EINVALID, "messages[1].content[0].tool_result: only tool and user messages may hold tool results");
	expect_bad(msg(SYSTEM, 1, b_result("c", 0)), HISTD_EINVALID,
		   "messages[1].content[0]: system messages may hold only text blocks");
	expect_bad(msg(TOOL, 1, b_result("", 0)), HISTD_EINVALID,
		   "messages[1].content[0].tool_result.tool_call_id is required");
	expect_bad(msg(TOOL, 1, b_result("c", 2, b_text("x"),
					 b_call("c2", "f", "{}"))),
		   HISTD_EINVALID, "messages[1].content[0].tool_result.content[1]: a tool result may hold only text, image and document blocks");
	expect_bad(msg(TOOL, 1, b_result("c", 1, b_result("d", 0))),
		   HISTD_EINVALID, "messages[1].content[0].tool_result.content[0]: a tool result may hold only");
	expect_bad(msg(TOOL, 1, b_result("c", 1, b_image(NULL, 4, NULL))),
		   HISTD_EINVALID, "messages[1].content[0].tool_result.content[0].image.media_type is required with data");
	expect_bad(msg(TOOL, 1, b_result("c", 1, b_text(""))),
		   HISTD_EINVALID, "messages[1].content[0].tool_result.content[0].text.text is empty");
	/* Role rules. */
	expect_bad(msg(TOOL, 2, b_result("c", 0), b_text(SECRET)),
		   HISTD_EINVALID, "messages[1].content[1]: tool messages may hold only tool_result blocks");
	expect_bad(msg(SYSTEM, 2, b_text("x"), b_image("https://x", 0, NULL)),
		   HISTD_EINVALID, "messages[1].content[1]: system messages may hold only text blocks");
	/* Timestamps. */
	m = user(SECRET);
	bad_ts.seconds = 1;
	bad_ts.nanos = 1000000000;
	m->created_at = &bad_ts;
	expect_bad(m, HISTD_EINVALID,
		   "messages[1].created_at is not a valid timestamp");
	/* Strings must be UTF-8. */
	expect_bad(msg(USER, 2, b_text("ok"), b_text("bad \xff " SECRET)),
		   HISTD_EINVALID, "messages[1].content[1].text.text is not valid UTF-8");
	m = user("x");
	m->author = "\xc0\xaf";
	expect_bad(m, HISTD_EINVALID, "messages[1].author is not valid UTF-8");
}

static void
append_checks_tool_references_through_the_driver(void **state)
{
	(void)state;
	create("v");
	expect_bad(msg(TOOL, 1, b_result("never-called", 0)), HISTD_EINVALID,
		   "messages[1].content[0].tool_result.tool_call_id");
	assert_err(APPEND("v", NULL, 2, msg(ASSISTANT, 1, b_call("c1", "f", "")),
			  msg(ASSISTANT, 2, b_text("x"), b_call("c1", "f", ""))),
		   HISTD_EINVALID, "messages[1].content[1].tool_call.id");
	assert_int_equal(APPEND("v", NULL, 1,
				msg(ASSISTANT, 1, b_call("c1", "f", ""))), 0);
	assert_int_equal(APPEND("v", NULL, 1, msg(TOOL, 1, b_result("c1", 0))),
			 0);
	/* Answered already. */
	assert_err(APPEND("v", NULL, 1, msg(TOOL, 1, b_result("c1", 0))),
		   HISTD_EINVALID, "messages[0].content[0].tool_result.tool_call_id");
}

static void
append_limits_count_and_size(void **state)
{
	Histd__V1__Message **m = A(9 * sizeof(*m));
	char *big = A(5000);

	(void)state;
	create("l");
	assert_err(CALL(HISTD_M_APPEND, append_req("l", 0, NULL), NULL, NULL),
		   HISTD_EINVALID, "messages is empty");
	for (int i = 0; i < 9; i++)
		m[i] = user("x");
	assert_err(CALL(HISTD_M_APPEND, append_req("l", 9, m), NULL, NULL),
		   HISTD_ELIMIT, "the limit is 8");
	assert_int_equal(CALL(HISTD_M_APPEND, append_req("l", 8, m), NULL,
			      NULL), 0);
	memset(big, 'b', 4999);
	assert_err(APPEND("l", NULL, 2, user("x"), user(big)), HISTD_ELIMIT,
		   "messages[1] is ");
	assert_err(APPEND("l", NULL, 2, user("x"), user(big)), HISTD_ELIMIT,
		   "bytes; the limit is 4096");
	assert_int_equal(get_session("l")->stats->message_count, 8);
	assert_err(APPEND("", NULL, 1, user("x")), HISTD_EINVALID,
		   "session_id is required");
	assert_int_equal(APPEND("missing", NULL, 1, user("x")),
			 HISTD_ENOTFOUND);
}

static void
append_at_a_stale_revision_is_aborted_with_the_current_one(void **state)
{
	Histd__V1__AppendRequest *r;
	Histd__V1__Message *m[1];
	Histd__V1__AppendResponse *a = NULL;

	(void)state;
	create("c");
	append_n("c", 2);            /* revision 3 */
	m[0] = user("x");
	r = append_req("c", 1, m);
	r->expected_revision = 2;
	last_current_revision = 0;
	assert_int_equal(CALL(HISTD_M_APPEND, r, NULL, NULL), HISTD_ECONFLICT);
	assert_int_equal(last_current_revision, 3);
	r->expected_revision = 3;
	assert_int_equal(CALL(HISTD_M_APPEND, r,
			      &histd__v1__append_response__descriptor, &a), 0);
	assert_int_equal(a->revision, 4);
}

static void
an_idempotency_key_is_at_most_256_bytes(void **state)
{
	Histd__V1__Message *m[1];
	Histd__V1__AppendRequest *r;
	char *key = A(258);

	(void)state;
	create("k");
	m[0] = user("x");
	r = append_req("k", 1, m);
	memset(key, 'k', 257);
	r->idempotency_key = key;
	assert_err(CALL(HISTD_M_APPEND, r, NULL, NULL), HISTD_EINVALID,
		   "idempotency_key is longer than 256 bytes");
	assert_int_equal(read_raw("k", 0, 0, 0)->n_messages, 0);
	key[256] = '\0';
	assert_int_equal(CALL(HISTD_M_APPEND, r, NULL, NULL), 0);
}

static void
an_idempotent_retry_returns_the_first_answer_and_appends_nothing(void **state)
{
	Histd__V1__Message *m[2];
	Histd__V1__AppendRequest *r;
	Histd__V1__AppendResponse *a = NULL, *b = NULL;
	uint8_t *bytes;
	size_t len;

	(void)state;
	create("i");
	m[0] = user("one");
	m[1] = msg(ASSISTANT, 1, b_text("two"));
	r = append_req("i", 2, m);
	r->idempotency_key = "key-1";
	r->expected_revision = 1;
	bytes = pack(r, &len);
	assert_int_equal(call_raw_on(svc, &alice, HISTD_M_APPEND, bytes, len,
				     &histd__v1__append_response__descriptor,
				     &a), 0);
	assert_false(a->replayed);
	/* The same bytes again: replayed, even though revision moved on. */
	assert_int_equal(call_raw_on(svc, &alice, HISTD_M_APPEND, bytes, len,
				     &histd__v1__append_response__descriptor,
				     &b), 0);
	assert_true(b->replayed);
	assert_int_equal(b->first_seq, a->first_seq);
	assert_int_equal(b->last_seq, a->last_seq);
	assert_int_equal(b->revision, a->revision);
	assert_int_equal(b->n_token_estimates, 2);
	assert_int_equal(b->token_estimates[1], a->token_estimates[1]);
	assert_int_equal(get_session("i")->stats->message_count, 2);
	assert_int_equal(get_session("i")->revision, 2);

	/* The same key with another request. */
	m[1] = msg(ASSISTANT, 1, b_text("changed"));
	assert_err(CALL(HISTD_M_APPEND, r, NULL, NULL), HISTD_EPRECONDITION,
		   "");
	assert_int_equal(get_session("i")->stats->message_count, 2);
	/* Keys are per session. */
	create("j");
	r->session_id = "j";
	r->expected_revision = 0;
	assert_int_equal(CALL(HISTD_M_APPEND, r,
			      &histd__v1__append_response__descriptor, &a), 0);
	assert_false(a->replayed);
}

/* ---------------------------------------------------------------------- */
/* GetMessages                                                             */

static void
get_messages_pages_by_after_seq_and_limit(void **state)
{
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	create("p");
	append_n("p", 7);
	g = read_raw("p", 0, 3, 0);
	assert_seqs(g, 1, 3);
	assert_int_equal(g->next_after_seq, 3);
	assert_int_equal(g->revision, 8);
	g = read_raw("p", g->next_after_seq, 3, 0);
	assert_seqs(g, 4, 3);
	assert_int_equal(g->next_after_seq, 6);
	g = read_raw("p", g->next_after_seq, 3, 0);
	assert_seqs(g, 7, 1);
	assert_int_equal(g->next_after_seq, 0);
	g = read_raw("p", 7, 3, 0);
	assert_seqs(g, 8, 0);
	assert_int_equal(g->next_after_seq, 0);
	assert_int_equal(g->token_estimate, 0);
	assert_int_equal(g->revision, 8);
	/* limit 0: 100. */
	g = read_raw("p", 0, 0, 0);
	assert_seqs(g, 1, 7);
	assert_int_equal(g->next_after_seq, 0);
	/* last_n: the newest, after_seq and limit ignored. */
	g = read_raw("p", 5, 1, 2);
	assert_seqs(g, 6, 2);
	assert_int_equal(g->next_after_seq, 0);
	assert_false(g->truncated);
	g = read_raw("p", 0, 0, 100);
	assert_seqs(g, 1, 7);
	assert_false(g->truncated);
}

/* A service on the same driver whose pages hold at most n. */
static histd_service *
service_with_page_size(uint32_t n)
{
	histd_service_config small = cfg;
	histd_service *s2;

	small.max_page_size = n;
	assert_int_equal(histd_service_new(&s2, drv, &small), 0);
	return s2;
}

static void
get_messages_clamps_limit_and_last_n_to_the_page_size(void **state)
{
	histd_service *s2 = service_with_page_size(2);
	Histd__V1__GetMessagesResponse *g = NULL;

	(void)state;
	create("p");
	append_n("p", 5);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 1000, 0, &g), 0);
	assert_seqs(g, 1, 2);
	assert_int_equal(g->next_after_seq, 2);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 0, &g), 0);
	assert_seqs(g, 1, 2);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 5, &g), 0);
	assert_seqs(g, 4, 2);
	assert_true(g->truncated);      /* asked for 5, got the newest 2 */
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 2, &g), 0);
	assert_seqs(g, 4, 2);
	assert_false(g->truncated);
	histd_service_free(s2);
}

/* last_n above the page size sets truncated only when older messages are
 * stored: a session that fits one page came back whole. */
static void
get_messages_last_n_above_the_page_size_is_not_truncated_when_all_came(
	void **state)
{
	histd_service *s2 = service_with_page_size(2);
	Histd__V1__GetMessagesResponse *g = NULL;

	(void)state;
	create("p");
	append_n("p", 2);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 5, &g), 0);
	assert_seqs(g, 1, 2);
	assert_false(g->truncated);
	append_n("p", 1);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 5, &g), 0);
	assert_seqs(g, 2, 2);
	assert_true(g->truncated);      /* seq 1 is still stored */
	histd_service_free(s2);
}

static void
get_messages_pages_end_at_the_response_size_limit(void **state)
{
	histd_service_config small = cfg;
	histd_service *s2;
	Histd__V1__GetMessagesResponse *g = NULL;
	uint64_t after = 0;
	size_t seen = 0;

	(void)state;
	create("p");
	append_n("p", 9);
	/* Each stored message is ~20 bytes: 50 bytes hold two of them. */
	small.max_response_bytes = 50;
	assert_int_equal(histd_service_new(&s2, drv, &small), 0);
	do {
		assert_int_equal(get_messages_on(s2, "p",
						 HISTD__V1__VIEW__VIEW_RAW,
						 after, 100, 0, &g), 0);
		assert_true(g->n_messages >= 1 && g->n_messages <= 2);
		assert_int_equal(g->messages[0]->seq, after + 1);
		seen += g->n_messages;
		after = g->next_after_seq;
	} while (after);
	assert_int_equal(seen, 9);
	/* last_n keeps the newest that fit. */
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 0, 9, &g), 0);
	assert_true(g->n_messages >= 1 && g->n_messages <= 2);
	assert_int_equal(g->messages[g->n_messages - 1]->seq, 9);
	assert_int_equal(g->next_after_seq, 0);
	assert_true(g->truncated);      /* and says older ones were left out */
	/* One message larger than the limit still goes, alone. */
	small.max_response_bytes = 1;
	histd_service_free(s2);
	assert_int_equal(histd_service_new(&s2, drv, &small), 0);
	assert_int_equal(get_messages_on(s2, "p", HISTD__V1__VIEW__VIEW_RAW,
					 0, 100, 0, &g), 0);
	assert_seqs(g, 1, 1);
	assert_int_equal(g->next_after_seq, 1);
	histd_service_free(s2);
}

/* Packs m into arena bytes. */
static uint8_t *
pack_msg(const Histd__V1__Message *m, size_t *len)
{
	return pack(m, len);
}

static void
raw_fast_path_bytes_are_a_valid_response_equal_to_the_stored_messages(void **state)
{
	Histd__V1__Message *in[3];
	Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetMessagesResponse *g;
	histd_reply rep = { 0 };
	uint8_t *req, *again;
	size_t req_len, again_len;
	uint64_t sum = 0;

	(void)state;
	create("f");
	in[0] = msg(SYSTEM, 1, b_text("system prompt"));
	in[1] = msg(ASSISTANT, 2, b_reasoning("hmm", "sig"),
		    b_call("c1", "search", "{\"q\":\"x\"}"));
	in[2] = msg(TOOL, 1, b_result("c1", 2, b_text("result"),
				      b_doc(NULL, 40, "application/pdf")));
	in[2]->author = "searcher";
	assert_int_equal(APPEND("f", NULL, 3, in[0], in[1], in[2]), 0);
	append_n("f", 2);

	r.session_id = "f";
	r.limit = 3;
	req = pack(&r, &req_len);
	assert_int_equal(histd_service_unary(svc, HISTD_M_GET_MESSAGES, &alice,
					     req, req_len, &rep), 0);
	g = histd__v1__get_messages_response__unpack(NULL, rep.len, rep.data);
	assert_non_null(g);
	/* Canonical: packing what was unpacked gives the same bytes. */
	again_len = histd__v1__get_messages_response__get_packed_size(g);
	assert_int_equal(again_len, rep.len);
	again = A(again_len);
	histd__v1__get_messages_response__pack(g, again);
	assert_memory_equal(again, rep.data, rep.len);

	assert_int_equal(g->n_messages, 3);
	assert_int_equal(g->next_after_seq, 3);
	assert_int_equal(g->revision, 4);
	for (size_t i = 0; i < 3; i++) {
		Histd__V1__Message *got = g->messages[i];
		size_t a_len, b_len;
		uint8_t *a, *b;

		/* What was sent, with what the server adds. */
		in[i]->seq = i + 1;
		in[i]->token_estimate = histd_tokens_message(in[i]);
		in[i]->created_at = got->created_at;
		assert_int_equal(got->token_estimate, in[i]->token_estimate);
		a = pack_msg(in[i], &a_len);
		b = pack_msg(got, &b_len);
		assert_int_equal(a_len, b_len);
		assert_memory_equal(a, b, a_len);
		in[i]->created_at = NULL;
		sum += got->token_estimate;
	}
	assert_int_equal(g->token_estimate, sum);
	histd__v1__get_messages_response__free_unpacked(g, NULL);
	free(rep.data);
}

/* CONTEXT takes every last_n RAW takes: above the window's own limit of
 * 10,000,000 it means the whole view. */
static void
context_last_n_takes_any_value(void **state)
{
	Histd__V1__GetMessagesResponse *g = NULL;

	(void)state;
	create("n");
	append_n("n", 5);
	assert_int_equal(get_messages_on(svc, "n", HISTD__V1__VIEW__VIEW_CONTEXT,
					 0, 0, 2, &g), 0);
	assert_seqs(g, 4, 2);
	assert_int_equal(get_messages_on(svc, "n", HISTD__V1__VIEW__VIEW_CONTEXT,
					 0, 0, 10000001, &g), 0);
	assert_seqs(g, 1, 5);
	assert_int_equal(get_messages_on(svc, "n", HISTD__V1__VIEW__VIEW_CONTEXT,
					 0, 0, UINT32_MAX, &g), 0);
	assert_seqs(g, 1, 5);
}

static void
context_view_without_pipeline_or_summary_holds_every_message(void **state)
{
	Histd__V1__GetMessagesResponse *raw = NULL, *ctx = NULL, *unspec = NULL;

	(void)state;
	create("x");
	append_n("x", 4);
	assert_int_equal(get_messages_on(svc, "x", HISTD__V1__VIEW__VIEW_RAW, 0, 0,
					 0, &raw), 0);
	assert_int_equal(get_messages_on(svc, "x", HISTD__V1__VIEW__VIEW_CONTEXT,
					 0, 0, 0, &ctx), 0);
	assert_int_equal(get_messages_on(svc, "x",
					 HISTD__V1__VIEW__VIEW_UNSPECIFIED, 0, 0,
					 0, &unspec), 0);
	/* No pipeline, no summary: the same messages, byte for byte. */
	assert_int_equal(ctx->n_messages, 4);
	assert_int_equal(raw->n_messages, 4);
	assert_int_equal(unspec->n_messages, 4);
	assert_null(ctx->summary);
	for (size_t i = 0; i < 4; i++) {
		size_t a = histd__v1__message__get_packed_size(raw->messages[i]);
		size_t b = histd__v1__message__get_packed_size(ctx->messages[i]);
		uint8_t *pa = A(a), *pb = A(b);

		histd__v1__message__pack(raw->messages[i], pa);
		histd__v1__message__pack(ctx->messages[i], pb);
		assert_int_equal(a, b);
		assert_memory_equal(pa, pb, a);
		assert_int_equal(unspec->messages[i]->seq, raw->messages[i]->seq);
	}
	/* CONTEXT is the whole view, not a page. */
	assert_int_equal(ctx->next_after_seq, 0);

	{
		Histd__V1__GetMessagesRequest r = HISTD__V1__GET_MESSAGES_REQUEST__INIT;

		r.session_id = "x";
		r.view = (Histd__V1__View)7;
		assert_err(CALL(HISTD_M_GET_MESSAGES, &r, NULL, NULL),
			   HISTD_EINVALID, "view is not a known View");
		r.view = HISTD__V1__VIEW__VIEW_CONTEXT;
		r.session_id = "missing";
		assert_int_equal(CALL(HISTD_M_GET_MESSAGES, &r, NULL, NULL),
				 HISTD_ENOTFOUND);
	}
}

/* ---------------------------------------------------------------------- */
/* GetToolResult, Clear, Replace                                           */

static void
get_tool_result_returns_the_original_result_and_its_message(void **state)
{
	Histd__V1__GetToolResultRequest r = HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	Histd__V1__GetToolResultResponse *t = NULL;

	(void)state;
	create("t");
	assert_int_equal(APPEND("t", NULL, 3, user("weather?"),
		msg(ASSISTANT, 2, b_call("c1", "weather", "{}"),
		    b_call("c2", "time", "{}")),
		msg(TOOL, 2, b_result("c1", 1, b_text("sunny")),
		    b_result("c2", 1, b_text("noon")))), 0);
	r.session_id = "t";
	r.tool_call_id = "c2";
	assert_int_equal(CALL(HISTD_M_GET_TOOL_RESULT, &r,
			      &histd__v1__get_tool_result_response__descriptor,
			      &t), 0);
	assert_int_equal(t->seq, 3);
	assert_non_null(t->result);
	assert_string_equal(t->result->tool_call_id, "c2");
	assert_string_equal(t->result->content[0]->text->text, "noon");
	assert_non_null(t->message);
	assert_int_equal(t->message->seq, 3);
	assert_int_equal(t->message->role, TOOL);
	assert_int_equal(t->message->n_content, 2);

	r.tool_call_id = "c9";
	assert_int_equal(CALL(HISTD_M_GET_TOOL_RESULT, &r, NULL, NULL),
			 HISTD_ENOTFOUND);
	r.tool_call_id = "";
	assert_err(CALL(HISTD_M_GET_TOOL_RESULT, &r, NULL, NULL),
		   HISTD_EINVALID, "tool_call_id is required");
	{
		char long_id[130];

		memset(long_id, 'c', 129);
		long_id[129] = '\0';
		r.tool_call_id = long_id;
		assert_err(CALL(HISTD_M_GET_TOOL_RESULT, &r, NULL, NULL),
			   HISTD_EINVALID,
			   "tool_call_id is 129 bytes; the limit is 128");
	}
}

static void
clear_removes_messages_and_seqs_continue(void **state)
{
	Histd__V1__ClearRequest r = HISTD__V1__CLEAR_REQUEST__INIT;
	Histd__V1__ClearResponse *c = NULL;
	Histd__V1__AppendResponse *a = NULL;

	(void)state;
	create("c");
	append_n("c", 3);
	r.session_id = "c";
	r.expected_revision = 3;
	assert_int_equal(CALL(HISTD_M_CLEAR, &r, NULL, NULL), HISTD_ECONFLICT);
	assert_int_equal(last_current_revision, 4);
	r.expected_revision = 0;
	assert_int_equal(CALL(HISTD_M_CLEAR, &r,
			      &histd__v1__clear_response__descriptor, &c), 0);
	assert_int_equal(c->revision, 5);
	assert_int_equal(c->cleared_to_seq, 3);
	assert_int_equal(read_raw("c", 0, 0, 0)->n_messages, 0);
	assert_int_equal(APPEND("c", &a, 1, user("after")), 0);
	assert_int_equal(a->first_seq, 4);
}

static void
replace_validates_like_append_and_swaps_the_messages(void **state)
{
	Histd__V1__ReplaceRequest r = HISTD__V1__REPLACE_REQUEST__INIT;
	Histd__V1__ReplaceResponse *p = NULL;
	Histd__V1__Message *m[9];
	Histd__V1__GetMessagesResponse *g;

	(void)state;
	create("r");
	assert_int_equal(APPEND("r", NULL, 2,
				msg(ASSISTANT, 1, b_call("old", "f", "{}")),
				user("x")), 0);
	r.session_id = "r";
	m[0] = user("restored");
	m[1] = msg(ASSISTANT, 1, b_call("c1", "f", "{bad json " SECRET));
	r.n_messages = 2;
	r.messages = m;
	assert_err(CALL(HISTD_M_REPLACE, &r, NULL, NULL), HISTD_EINVALID,
		   "messages[1].content[0].tool_call.arguments is not valid JSON");
	/* Checked against an empty tool call index. */
	m[1] = msg(TOOL, 1, b_result("old", 0));
	assert_err(CALL(HISTD_M_REPLACE, &r, NULL, NULL), HISTD_EINVALID,
		   "messages[1].content[0].tool_result.tool_call_id");
	m[1] = msg(ASSISTANT, 1, b_text("restored too"));
	r.expected_revision = 1;
	assert_int_equal(CALL(HISTD_M_REPLACE, &r, NULL, NULL), HISTD_ECONFLICT);
	assert_int_equal(last_current_revision, 2);
	r.expected_revision = 2;
	assert_int_equal(CALL(HISTD_M_REPLACE, &r,
			      &histd__v1__replace_response__descriptor, &p), 0);
	assert_int_equal(p->revision, 3);
	assert_int_equal(p->first_seq, 3);
	assert_int_equal(p->last_seq, 4);
	g = read_raw("r", 0, 0, 0);
	assert_seqs(g, 3, 2);
	assert_string_equal(g->messages[0]->content[0]->text->text, "restored");
	assert_non_null(g->messages[0]->created_at);
	assert_true(g->messages[0]->token_estimate > 0);

	/* Empty: like Clear. */
	r.n_messages = 0;
	r.expected_revision = 0;
	assert_int_equal(CALL(HISTD_M_REPLACE, &r,
			      &histd__v1__replace_response__descriptor, &p), 0);
	assert_int_equal(p->first_seq, 0);
	assert_int_equal(p->last_seq, 0);
	assert_int_equal(read_raw("r", 0, 0, 0)->n_messages, 0);

	for (int i = 0; i < 9; i++)
		m[i] = user("x");
	r.n_messages = 9;
	assert_err(CALL(HISTD_M_REPLACE, &r, NULL, NULL), HISTD_ELIMIT,
		   "the limit is 8");
}

/* ---------------------------------------------------------------------- */
/* Callers, tenants, requests                                              */

static void
a_read_only_caller_may_not_write(void **state)
{
	static const enum histd_method writes[] = {
		HISTD_M_CREATE_SESSION, HISTD_M_RESOLVE_SESSION,
		HISTD_M_UPDATE_SESSION, HISTD_M_DELETE_SESSION,
		HISTD_M_FORK_SESSION, HISTD_M_APPEND, HISTD_M_CLEAR,
		HISTD_M_REPLACE, HISTD_M_REDUCE, HISTD_M_IMPORT,
	};
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__GetMessagesRequest gm = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__ListSessionsRequest l = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__Message *m[1];

	(void)state;
	create("ro");
	for (size_t i = 0; i < sizeof(writes) / sizeof(writes[0]); i++)
		assert_err(call_raw_on(svc, &alice_ro, writes[i], NULL, 0,
				       NULL, NULL),
			   HISTD_EPERM, histd_method_names[writes[i]]);
	m[0] = user("x");
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_APPEND,
				 append_req("ro", 1, m), NULL, NULL),
			 HISTD_EPERM);
	assert_int_equal(get_session("ro")->stats->message_count, 0);
	g.session_id = "ro";
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_GET_SESSION, &g, NULL,
				 NULL), 0);
	gm.session_id = "ro";
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_GET_MESSAGES, &gm, NULL,
				 NULL), 0);
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_LIST_SESSIONS, &l, NULL,
				 NULL), 0);
}

static void
another_tenants_session_is_not_found(void **state)
{
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__GetMessagesRequest gm = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetToolResultRequest gt =
		HISTD__V1__GET_TOOL_RESULT_REQUEST__INIT;
	Histd__V1__ClearRequest c = HISTD__V1__CLEAR_REQUEST__INIT;
	Histd__V1__ReplaceRequest rp = HISTD__V1__REPLACE_REQUEST__INIT;
	Histd__V1__DeleteSessionRequest d = HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__ForkSessionRequest f = HISTD__V1__FORK_SESSION_REQUEST__INIT;
	Histd__V1__UpdateSessionRequest u = HISTD__V1__UPDATE_SESSION_REQUEST__INIT;
	Histd__V1__ListSessionsRequest l = HISTD__V1__LIST_SESSIONS_REQUEST__INIT;
	Histd__V1__ListSessionsResponse *lr = NULL;
	Histd__V1__Session *mine;

	(void)state;
	create("shared-name");
	assert_int_equal(APPEND("shared-name", NULL, 2,
				msg(ASSISTANT, 1, b_call("c1", "f", "{}")),
				msg(TOOL, 1, b_result("c1", 0))), 0);
	g.session_id = gm.session_id = gt.session_id = c.session_id =
		rp.session_id = d.session_id = f.session_id = u.session_id =
		"shared-name";
	gt.tool_call_id = "c1";
	u.update_mask = mask(1, "labels", NULL);
	assert_int_equal(CALL_AS(&bob, HISTD_M_GET_SESSION, &g, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_GET_MESSAGES, &gm, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_GET_TOOL_RESULT, &gt, NULL,
				 NULL), HISTD_ENOTFOUND);
	assert_int_equal(append_as(&bob, "shared-name", NULL, 1, user("x")),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_CLEAR, &c, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_REPLACE, &rp, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_UPDATE_SESSION, &u, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_FORK_SESSION, &f, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_DELETE_SESSION, &d, NULL, NULL),
			 HISTD_ENOTFOUND);
	assert_int_equal(CALL_AS(&bob, HISTD_M_LIST_SESSIONS, &l,
				 &histd__v1__list_sessions_response__descriptor,
				 &lr), 0);
	assert_int_equal(lr->n_sessions, 0);
	/* Bob's own session of the same name is his alone. */
	mine = create_as(&bob, "shared-name");
	assert_int_equal(mine->revision, 1);
	assert_int_equal(get_session("shared-name")->stats->message_count, 2);
}

static void
a_request_that_does_not_decode_is_invalid(void **state)
{
	static const uint8_t junk[] = { 0x0a, 0xff, 0xff, 0xff };
	static const uint8_t bad_wire[] = { 0x0f };

	(void)state;
	assert_err(call_raw_on(svc, &alice, HISTD_M_APPEND, junk, sizeof(junk),
			       NULL, NULL),
		   HISTD_EINVALID, "request does not decode as histd.v1.AppendRequest");
	assert_err(call_raw_on(svc, &alice, HISTD_M_GET_SESSION, bad_wire,
			       sizeof(bad_wire), NULL, NULL),
		   HISTD_EINVALID, "request does not decode as histd.v1.GetSessionRequest");
	/* An empty request decodes: all fields default. */
	assert_err(call_raw_on(svc, &alice, HISTD_M_GET_SESSION, NULL, 0, NULL,
			       NULL),
		   HISTD_EINVALID, "session_id is required");
	/* Not unary, or no tenant: the transport's mistake. */
	assert_int_equal(call_raw_on(svc, &alice, HISTD_M_SUBSCRIBE, NULL, 0,
				     NULL, NULL), HISTD_EINTERNAL);
	assert_int_equal(call_raw_on(svc, NULL, HISTD_M_GET_SESSION, NULL, 0,
				     NULL, NULL), HISTD_EINTERNAL);
}

static void
a_deeply_nested_request_is_refused_before_it_is_decoded(void **state)
{
	/* A tool result in a tool result ... 20000 levels: about 100 KB,
	 * which would overflow the stack of a recursive decoder. */
	const int depth = 20000;
	size_t cap = (size_t)depth * 16 + 64, n = 0, h;
	uint8_t *a = A(cap), *b = A(cap), hdr[24];

	(void)state;
	for (int i = 0; i < depth; i++) {
		h = histd_wire_put_len_key(hdr, 3, n);      /* content */
		memcpy(b, hdr, h);
		memcpy(b + h, a, n);
		n += h;
		h = histd_wire_put_len_key(hdr, 6, n);      /* tool_result */
		memcpy(a, hdr, h);
		memcpy(a + h, b, n);
		n += h;
	}
	/* Message{content(3)}, then AppendRequest{messages(2)}. */
	h = histd_wire_put_len_key(hdr, 3, n);
	memcpy(b, hdr, h);
	memcpy(b + h, a, n);
	n += h;
	h = histd_wire_put_len_key(hdr, 2, n);
	memcpy(a, hdr, h);
	memcpy(a + h, b, n);
	n += h;
	assert_err(call_raw_on(svc, &alice, HISTD_M_APPEND, a, n, NULL, NULL),
		   HISTD_EINVALID, "request nests messages deeper than");
}

/* Packs req, turns its one '#' into a NUL and calls m with the bytes. */
static int
call_with_a_nul(enum histd_method m, const void *req)
{
	size_t len;
	uint8_t *buf = pack(req, &len), *hash = memchr(buf, '#', len);

	assert_non_null(hash);
	*hash = '\0';
	return call_raw_on(svc, &alice, m, buf, len, NULL, NULL);
}

static void
a_string_holding_a_nul_is_refused_naming_the_field(void **state)
{
	Histd__V1__Message *m[2];
	Histd__V1__CreateSessionRequest c = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__GetSessionRequest g = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__GetMessagesResponse *r;

	(void)state;
	create("z");
	/* The text after the NUL would have been lost once acknowledged. */
	m[0] = user("fine");
	m[1] = msg(USER, 2, b_text("ok"), b_text("hello#world"));
	assert_err(call_with_a_nul(HISTD_M_APPEND, append_req("z", 2, m)),
		   HISTD_EINVALID,
		   "messages[1].content[1].text.text holds a NUL character");
	m[1] = user("x");
	m[1]->author = "bob#";
	assert_err(call_with_a_nul(HISTD_M_APPEND, append_req("z", 2, m)),
		   HISTD_EINVALID, "messages[1].author holds a NUL character");
	r = read_raw("z", 0, 0, 0);
	assert_int_equal(r->n_messages, 0);
	/* An id would have been checked and used as its prefix. */
	c.session_id = "nul#/../x";
	assert_err(call_with_a_nul(HISTD_M_CREATE_SESSION, &c), HISTD_EINVALID,
		   "session_id holds a NUL character");
	g.session_id = "z#zz";
	assert_err(call_with_a_nul(HISTD_M_GET_SESSION, &g), HISTD_EINVALID,
		   "session_id holds a NUL character");
	/* Bytes fields may hold any byte. */
	m[1] = msg(USER, 2, b_text("see"), b_image(NULL, 4, "image/png"));
	m[1]->content[1]->image->data.data[0] = '#';
	assert_int_equal(call_with_a_nul(HISTD_M_APPEND, append_req("z", 2, m)),
			 0);
}

/* A map's entries have no order a client can count: a bad value is named
 * by its key (a bad key by its position, the only name it has). */
static void
a_bad_string_in_a_map_is_named_by_its_key(void **state)
{
	Histd__V1__CreateSessionRequest c = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Message *m;

	(void)state;
	SET_MAP(&c, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 2,
		"app", "demo", "team", "a#b");
	assert_err(call_with_a_nul(HISTD_M_CREATE_SESSION, &c), HISTD_EINVALID,
		   "labels[\"team\"] holds a NUL character");
	SET_MAP(&c, labels,
		histd__v1__create_session_request__labels_entry__descriptor, 2,
		"app", "demo", "te#am", "x");
	assert_err(call_with_a_nul(HISTD_M_CREATE_SESSION, &c), HISTD_EINVALID,
		   "labels[1].key holds a NUL character");
	create("v");
	m = user("x");
	SET_MAP(m, metadata, histd__v1__message__metadata_entry__descriptor,
		2, "trace", "t-1", "span", "bad \xff");
	expect_bad(m, HISTD_EINVALID,
		   "messages[1].metadata[\"span\"] is not valid UTF-8");
	m = user("x");
	SET_MAP(m, metadata, histd__v1__message__metadata_entry__descriptor,
		2, "trace", "t-1", "sp\xff" "an", "s");
	expect_bad(m, HISTD_EINVALID,
		   "messages[1].metadata[1].key is not valid UTF-8");
}

static void
reduce_export_and_import_check_their_input_and_rights(void **state)
{
	Histd__V1__ReduceRequest r = HISTD__V1__REDUCE_REQUEST__INIT;
	Histd__V1__ExportRequest e = HISTD__V1__EXPORT_REQUEST__INIT;
	Histd__V1__ImportRequest i = HISTD__V1__IMPORT_REQUEST__INIT;
	Histd__V1__ExportResponse *er = NULL;

	(void)state;
	create("n");
	append_n("n", 3);
	r.session_id = e.session_id = i.session_id = "n";
	/* Export needs a format; it only reads, so a read-only caller may. */
	assert_err(CALL(HISTD_M_EXPORT, &e, NULL, NULL), HISTD_EINVALID,
		   "format");
	e.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_EXPORT, &e,
				 &histd__v1__export_response__descriptor, &er),
			 0);
	assert_non_null(strstr(er->json, "\"m3\""));
	/* Import writes; its body must parse in its format. */
	i.format = HISTD__V1__FORMAT__FORMAT_OPENAI_CHAT;
	i.json = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_IMPORT, &i, NULL, NULL),
			 HISTD_EPERM);
	i.json = "{\"messages\": 3}";
	assert_err(CALL(HISTD_M_IMPORT, &i, NULL, NULL), HISTD_EINVALID,
		   "messages");
	i.format = HISTD__V1__FORMAT__FORMAT_UNSPECIFIED;
	assert_err(CALL(HISTD_M_IMPORT, &i, NULL, NULL), HISTD_EINVALID,
		   "format");
	/* Reduce writes (a summary). */
	assert_int_equal(CALL_AS(&alice_ro, HISTD_M_REDUCE, &r, NULL, NULL),
			 HISTD_EPERM);
	/* Another tenant's session does not exist. */
	assert_int_equal(CALL_AS(&bob, HISTD_M_EXPORT, &e, NULL, NULL),
			 HISTD_ENOTFOUND);
}

/* Threads share one packed request; they touch nothing else of the test. */
struct hammer {
	const uint8_t *req;
	size_t len;
	int failures;
};

static void *
hammer_appends(void *arg)
{
	struct hammer *h = arg;

	for (int i = 0; i < 50; i++) {
		histd_reply r = { 0 };

		if (histd_service_unary(svc, HISTD_M_APPEND, &alice, h->req,
					h->len, &r) != 0)
			h->failures++;
		else
			free(r.data);
	}
	return NULL;
}

static void
concurrent_appends_get_distinct_seqs(void **state)
{
	Histd__V1__Message *m[2];
	struct hammer h[4];
	pthread_t th[4];
	Histd__V1__GetMessagesResponse *g;
	uint8_t *req;
	size_t len;
	int started = 0;

	(void)state;
	create("busy");
	m[0] = msg(ASSISTANT, 1, b_text("a"));
	m[1] = user("b");
	req = pack(append_req("busy", 2, m), &len);
	for (int i = 0; i < 4; i++)
		h[i] = (struct hammer){ req, len, 0 };
	while (started < 4 && pthread_create(&th[started], NULL,
					     hammer_appends, &h[started]) == 0)
		started++;
	for (int i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(started, 4);
	for (int i = 0; i < 4; i++)
		assert_int_equal(h[i].failures, 0);
	assert_int_equal(get_session("busy")->stats->last_seq, 400);
	assert_int_equal(get_session("busy")->revision, 201);
	g = read_raw("busy", 0, 50, 0);
	assert_seqs(g, 1, 50);
}

static void
service_refuses_missing_driver_and_zero_limits(void **state)
{
	histd_service *s2 = NULL;
	histd_service_config bad = cfg;

	(void)state;
	assert_int_equal(histd_service_new(&s2, NULL, NULL), HISTD_EINVALID);
	bad.max_page_size = 0;
	assert_int_equal(histd_service_new(&s2, drv, &bad), HISTD_EINVALID);
	assert_int_equal(histd_service_new(&s2, drv, NULL), 0);
	assert_int_equal(histd_service_get_config(s2)->max_page_size, 1000);
	histd_service_free(s2);
}

/* A deferred answer, as the transport would take it. */
struct deferred {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, rc;
	pthread_t thread;
	char msg[256];
};

static void
deferred_finish(void *ctx, int rc, uint8_t *data, size_t len,
		const char *msg, uint64_t current_revision)
{
	struct deferred *d = ctx;

	(void)len;
	(void)current_revision;
	free(data);
	pthread_mutex_lock(&d->mu);
	d->done = 1;
	d->rc = rc;
	d->thread = pthread_self();
	snprintf(d->msg, sizeof(d->msg), "%s", msg ? msg : "");
	pthread_cond_signal(&d->cv);
	pthread_mutex_unlock(&d->mu);
}

/* Runs m with a deferred answer possible: whether it was deferred, and
 * then the code the answer carried (waited for). */
static int
call_deferrable(histd_service *s, enum histd_method m, const void *req,
		int64_t deadline_us, int *rc_out, char *msg, size_t cap)
{
	struct deferred d = { .done = 0 };
	histd_reply r = { .finish = deferred_finish, .finish_ctx = &d,
			   .deadline_us = deadline_us };
	size_t len;
	uint8_t *bytes = pack(req, &len);
	int rc, deferred;

	pthread_mutex_init(&d.mu, NULL);
	pthread_cond_init(&d.cv, NULL);
	rc = histd_service_unary(s, m, &alice, bytes, len, &r);
	deferred = rc == 0 && r.deferred;
	if (deferred) {
		pthread_mutex_lock(&d.mu);
		while (!d.done)
			pthread_cond_wait(&d.cv, &d.mu);
		pthread_mutex_unlock(&d.mu);
		assert_false(pthread_equal(d.thread, pthread_self()));
		*rc_out = d.rc;
		snprintf(msg, cap, "%s", d.msg);
	} else {
		*rc_out = rc;
		snprintf(msg, cap, "%s", rc ? histd_error_message() : "");
		free(r.data);
	}
	pthread_mutex_destroy(&d.mu);
	pthread_cond_destroy(&d.cv);
	return deferred;
}

/* Reduce and SEMANTIC or HYBRID Search may wait on a provider: with a
 * transport that takes deferred answers, they run on a provider-call
 * thread; everything else (LEXICAL Search here) runs on the caller's. */
static void
calls_that_may_wait_on_a_provider_run_on_their_own_threads(void **state)
{
	Histd__V1__ReduceRequest red = HISTD__V1__REDUCE_REQUEST__INIT;
	Histd__V1__SearchRequest sr = HISTD__V1__SEARCH_REQUEST__INIT;
	histd_service_config c0 = cfg;
	histd_service *s0;
	char msg[256];
	int rc;

	(void)state;
	red.session_id = "nosuch";
	assert_true(call_deferrable(svc, HISTD_M_REDUCE, &red, 0, &rc, msg,
				    sizeof(msg)));
	assert_int_equal(rc, HISTD_ENOTFOUND);
	sr.query = "anything";
	sr.mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC;
	assert_true(call_deferrable(svc, HISTD_M_SEARCH, &sr, 0, &rc, msg,
				    sizeof(msg)));
	assert_int_equal(rc, 0);
	sr.mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID;
	assert_true(call_deferrable(svc, HISTD_M_SEARCH, &sr, 0, &rc, msg,
				    sizeof(msg)));
	assert_int_equal(rc, 0);
	sr.mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL;
	assert_false(call_deferrable(svc, HISTD_M_SEARCH, &sr, 0, &rc, msg,
				     sizeof(msg)));
	assert_int_equal(rc, 0);

	/* Queued past its deadline: not run, and answered as the deadline
	 * it is (not a server failure). */
	assert_true(call_deferrable(svc, HISTD_M_REDUCE, &red, 1, &rc, msg,
				    sizeof(msg)));
	assert_int_equal(rc, HISTD_EDEADLINE);
	assert_int_equal(histd_status_from_error(rc), GRPC_STATUS_DEADLINE_EXCEEDED);
	assert_non_null(strstr(msg, "deadline passed"));

	/* No provider-call threads: on the caller's thread. */
	c0.provider_call_threads = 0;
	assert_int_equal(histd_service_new(&s0, drv, &c0), 0);
	assert_false(call_deferrable(s0, HISTD_M_REDUCE, &red, 0, &rc, msg,
				     sizeof(msg)));
	assert_int_equal(rc, HISTD_ENOTFOUND);
	histd_service_free(s0);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int
main(void)
{
	const struct CMUnitTest tests[] = {
		T(method_tables_follow_the_enum),
		T(config_defaults_match_the_header),
		T(calls_that_may_wait_on_a_provider_run_on_their_own_threads),
		T(session_id_is_1_to_128_of_the_allowed_characters),
		T(create_session_returns_it_at_revision_1),
		T(create_session_without_id_assigns_a_uuid),
		T(create_session_with_a_taken_id_is_already_exists),
		T(labels_and_context_keys_are_validated),
		T(a_repeated_map_key_keeps_the_last_value),
		T(config_with_an_unknown_plugin_is_invalid),
		T(config_embeddings_name_a_known_provider_and_a_clean_model),
		T(resolve_session_is_get_or_create_by_context_keys),
		T(get_session_of_an_unknown_id_is_not_found),
		T(list_sessions_pages_in_id_order_by_opaque_tokens),
		T(list_sessions_refuses_a_token_it_did_not_give),
		T(list_sessions_clamps_the_page_size_and_filters_by_labels),
		T(update_session_replaces_what_the_mask_names),
		T(delete_session_removes_it_and_checks_the_revision),
		T(fork_session_copies_up_to_a_seq),
		T(append_assigns_seqs_revision_and_token_estimates),
		T(append_stores_seq_estimate_and_created_at_and_keeps_the_rest),
		T(append_accepts_every_valid_shape),
		T(append_validates_every_message_and_names_the_field_path),
		T(append_checks_tool_references_through_the_driver),
		T(append_limits_count_and_size),
		T(append_at_a_stale_revision_is_aborted_with_the_current_one),
		T(an_idempotency_key_is_at_most_256_bytes),
		T(an_idempotent_retry_returns_the_first_answer_and_appends_nothing),
		T(get_messages_pages_by_after_seq_and_limit),
		T(get_messages_clamps_limit_and_last_n_to_the_page_size),
		T(get_messages_last_n_above_the_page_size_is_not_truncated_when_all_came),
		T(context_last_n_takes_any_value),
		T(get_messages_pages_end_at_the_response_size_limit),
		T(raw_fast_path_bytes_are_a_valid_response_equal_to_the_stored_messages),
		T(context_view_without_pipeline_or_summary_holds_every_message),
		T(get_tool_result_returns_the_original_result_and_its_message),
		T(clear_removes_messages_and_seqs_continue),
		T(replace_validates_like_append_and_swaps_the_messages),
		T(a_read_only_caller_may_not_write),
		T(another_tenants_session_is_not_found),
		T(a_request_that_does_not_decode_is_invalid),
		T(a_deeply_nested_request_is_refused_before_it_is_decoded),
		T(a_string_holding_a_nul_is_refused_naming_the_field),
		T(a_bad_string_in_a_map_is_named_by_its_key),
		T(reduce_export_and_import_check_their_input_and_rights),
		T(concurrent_appends_get_distinct_seqs),
		T(service_refuses_missing_driver_and_zero_limits),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
