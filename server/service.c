#include "service.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <uuid/uuid.h>

#include "histd/v1/histd.pb-c.h"
#include "context.h"
#include "transcript.h"
#include "search.h"
#include "histd_wire.h"
#include "tokens.h"

const char *const histd_method_names[HISTD_M_COUNT] = {
	[HISTD_M_CREATE_SESSION] = "CreateSession",
	[HISTD_M_RESOLVE_SESSION] = "ResolveSession",
	[HISTD_M_GET_SESSION] = "GetSession",
	[HISTD_M_LIST_SESSIONS] = "ListSessions",
	[HISTD_M_UPDATE_SESSION] = "UpdateSession",
	[HISTD_M_DELETE_SESSION] = "DeleteSession",
	[HISTD_M_FORK_SESSION] = "ForkSession",
	[HISTD_M_APPEND] = "Append",
	[HISTD_M_GET_MESSAGES] = "GetMessages",
	[HISTD_M_GET_TOOL_RESULT] = "GetToolResult",
	[HISTD_M_CLEAR] = "Clear",
	[HISTD_M_REPLACE] = "Replace",
	[HISTD_M_REDUCE] = "Reduce",
	[HISTD_M_EXPORT] = "Export",
	[HISTD_M_IMPORT] = "Import",
	[HISTD_M_SUBSCRIBE] = "Subscribe",
	[HISTD_M_SEARCH] = "Search",
};

#define PATH(n) "/histd.v1.HistoryService/" n
const char *const histd_method_paths[HISTD_M_COUNT] = {
	[HISTD_M_CREATE_SESSION] = PATH("CreateSession"),
	[HISTD_M_RESOLVE_SESSION] = PATH("ResolveSession"),
	[HISTD_M_GET_SESSION] = PATH("GetSession"),
	[HISTD_M_LIST_SESSIONS] = PATH("ListSessions"),
	[HISTD_M_UPDATE_SESSION] = PATH("UpdateSession"),
	[HISTD_M_DELETE_SESSION] = PATH("DeleteSession"),
	[HISTD_M_FORK_SESSION] = PATH("ForkSession"),
	[HISTD_M_APPEND] = PATH("Append"),
	[HISTD_M_GET_MESSAGES] = PATH("GetMessages"),
	[HISTD_M_GET_TOOL_RESULT] = PATH("GetToolResult"),
	[HISTD_M_CLEAR] = PATH("Clear"),
	[HISTD_M_REPLACE] = PATH("Replace"),
	[HISTD_M_REDUCE] = PATH("Reduce"),
	[HISTD_M_EXPORT] = PATH("Export"),
	[HISTD_M_IMPORT] = PATH("Import"),
	[HISTD_M_SUBSCRIBE] = PATH("Subscribe"),
	[HISTD_M_SEARCH] = PATH("Search"),
};
#undef PATH

int
histd_method_writes(enum histd_method m)
{
	switch (m) {
	case HISTD_M_CREATE_SESSION:
	case HISTD_M_RESOLVE_SESSION:   /* get-or-create may create */
	case HISTD_M_UPDATE_SESSION:
	case HISTD_M_DELETE_SESSION:
	case HISTD_M_FORK_SESSION:
	case HISTD_M_APPEND:
	case HISTD_M_CLEAR:
	case HISTD_M_REPLACE:
	case HISTD_M_REDUCE:
	case HISTD_M_IMPORT:
		return 1;
	default:
		return 0;
	}
}

void
histd_service_config_default(histd_service_config *cfg)
{
	cfg->max_messages_per_append = 1000;
	cfg->max_message_bytes = 1024 * 1024;
	cfg->max_page_size = 1000;
	cfg->max_response_bytes = 4000000;
	cfg->idempotency_ttl_us = INT64_C(24) * 3600 * 1000000;
	cfg->context = NULL;
	cfg->provider_call_threads = 16;
}

/* A call queued for a provider-call thread: its request as received. */
struct slow_job {
	struct slow_job *next;
	enum histd_method m;
	int read_only;
	int64_t deadline_us;
	void (*finish)(void *ctx, int rc, uint8_t *data, size_t len,
		       const char *msg, uint64_t current_revision);
	void *finish_ctx;
	char *tenant;           /* in the same allocation, after req */
	size_t len;
	uint8_t req[];
};

struct histd_service {
	histd_driver *d;
	histd_service_config cfg;
	/* Provider-call threads and their queue, under slow_mu. */
	pthread_mutex_t slow_mu;
	pthread_cond_t slow_cv;
	struct slow_job *slow_head, **slow_tail;
	size_t slow_queued;
	pthread_t *slow_threads;     /* cfg.provider_call_threads slots */
	uint32_t n_slow, idle_slow;
	int slow_stop;
};

int
histd_service_new(histd_service **out, histd_driver *d,
		  const histd_service_config *cfg)
{
	histd_service *s;

	if (!out || !d)
		return histd_error_set(HISTD_EINVALID,
				       "the service needs a driver");
	if (cfg && (cfg->max_messages_per_append == 0 ||
		    cfg->max_message_bytes == 0 || cfg->max_page_size == 0 ||
		    cfg->idempotency_ttl_us <= 0))
		return histd_error_set(HISTD_EINVALID,
				       "service limits must be positive");
	s = calloc(1, sizeof(*s));
	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	s->d = d;
	if (cfg)
		s->cfg = *cfg;
	else
		histd_service_config_default(&s->cfg);
	if (s->cfg.max_response_bytes == 0)
		s->cfg.max_response_bytes = 4000000;
	if (s->cfg.provider_call_threads &&
	    !(s->slow_threads = calloc(s->cfg.provider_call_threads,
				       sizeof(*s->slow_threads)))) {
		free(s);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	pthread_mutex_init(&s->slow_mu, NULL);
	pthread_cond_init(&s->slow_cv, NULL);
	s->slow_tail = &s->slow_head;
	*out = s;
	return 0;
}

/* Queued calls still run (the transport waits for their answers before
 * the service goes); then the threads end. */
void
histd_service_free(histd_service *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->slow_mu);
	s->slow_stop = 1;
	pthread_cond_broadcast(&s->slow_cv);
	pthread_mutex_unlock(&s->slow_mu);
	for (uint32_t i = 0; i < s->n_slow; i++)
		pthread_join(s->slow_threads[i], NULL);
	pthread_mutex_destroy(&s->slow_mu);
	pthread_cond_destroy(&s->slow_cv);
	free(s->slow_threads);
	free(s);
}

histd_driver *
histd_service_driver(histd_service *s)
{
	return s->d;
}

const histd_service_config *
histd_service_get_config(histd_service *s)
{
	return &s->cfg;
}

/* ---------------------------------------------------------------------- */
/* Small helpers                                                           */

#define ID_MAX 128
#define KV_MAX_PAIRS 64
#define KV_MAX_KEY 63
#define KV_MAX_VALUE 256
#define TOOL_ID_MAX 128
#define TOOL_NAME_MAX 128
#define IDEM_KEY_MAX 256
#define DEFAULT_PAGE 100
/* Deepest nesting a valid request needs is about 6 (append, message,
 * block, tool result, block, image); anything far deeper is refused before
 * the recursive checks below walk it. */
#define MAX_DEPTH 32

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static uint32_t
min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* Packs m into malloc'ed reply bytes. */
static int
reply_pack(const ProtobufCMessage *m, histd_reply *reply)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(len ? len : 1);

	if (!buf)
		return enomem();
	reply->len = protobuf_c_message_pack(m, buf);
	reply->data = buf;
	return 0;
}

static void
ts_from_us(Google__Protobuf__Timestamp *ts, int64_t us)
{
	int64_t sec = us / 1000000, rem = us % 1000000;

	if (rem < 0) {
		rem += 1000000;
		sec--;
	}
	ts->seconds = sec;
	ts->nanos = (int32_t)(rem * 1000);
}

/* 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z, as google.protobuf says. */
static int
ts_valid(const Google__Protobuf__Timestamp *ts)
{
	return ts->seconds >= INT64_C(-62135596800) &&
	       ts->seconds <= INT64_C(253402300799) &&
	       ts->nanos >= 0 && ts->nanos <= 999999999;
}

/* Copies s into buf for an error message: printable ASCII only (others
 * become '?', quotes and backslashes too), cut at 64 bytes. Used only for
 * names a client chose (field paths), never for content. */
static const char *
safe_span(const char *s, size_t n, char *buf, size_t cap)
{
	size_t i = 0;

	for (; i < n && s[i] && i + 1 < cap && i < 64; i++) {
		unsigned char c = (unsigned char)s[i];

		buf[i] = (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ?
			 (char)c : '?';
	}
	buf[i] = '\0';
	return buf;
}

static const char *
safe_name(const char *s, char *buf, size_t cap)
{
	return safe_span(s, SIZE_MAX, buf, cap);
}

static int
id_char(unsigned char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
	       (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
	       c == '-';
}

int
histd_check_session_id(const char *id, const char *field)
{
	size_t n = 0;

	if (!id || !id[0])
		return histd_error_set(HISTD_EINVALID, "%s is required", field);
	for (; id[n]; n++) {
		if (n >= ID_MAX)
			return histd_error_set(HISTD_EINVALID,
				"%s is longer than %d characters", field,
				ID_MAX);
		if (!id_char((unsigned char)id[n]))
			return histd_error_set(HISTD_EINVALID,
				"%s holds a character outside [A-Za-z0-9._:-]",
				field);
	}
	return 0;
}

static void
new_uuid(char out[37])
{
	uuid_t u;

	uuid_generate_random(u);
	uuid_unparse_lower(u, out);
}

/* ---------------------------------------------------------------------- */
/* Field paths for errors                                                   */

/* The field path walked so far, printed only when something is wrong. */
struct walk {
	const char *name[MAX_DEPTH];
	long index[MAX_DEPTH];       /* -1: not a repeated field */
	/* A map entry's key (NULL: not a map): a bad value is named
	 * name["key"], as the maps' own checks name it, since the position
	 * of an entry on the wire is one that map order does not define. */
	const char *key[MAX_DEPTH];
	size_t key_len[MAX_DEPTH];
	int depth;
};

/* protobuf-c marks no map entry: one is a message "...Entry" of exactly
 * a string key (1) and a value (2), as protoc generates it. */
static int
is_map_entry(const ProtobufCMessageDescriptor *d)
{
	size_t n = strlen(d->name);

	return d->n_fields == 2 && n > 5 && !strcmp(d->name + n - 5, "Entry") &&
	       d->fields[0].id == 1 && !strcmp(d->fields[0].name, "key") &&
	       d->fields[0].type == PROTOBUF_C_TYPE_STRING &&
	       d->fields[1].id == 2 && !strcmp(d->fields[1].name, "value");
}

static int
walk_fail(const struct walk *w, const char *what)
{
	char path[512];
	size_t n = 0;

	path[0] = '\0';
	for (int i = 0; i < w->depth && n < sizeof(path); i++) {
		char key[72];
		int k = snprintf(path + n, sizeof(path) - n, "%s%s",
				 i ? "." : "", w->name[i]);

		if (k > 0)
			n += (size_t)k;
		if (w->key[i] && i + 1 < w->depth &&
		    !strcmp(w->name[i + 1], "value") && n < sizeof(path)) {
			k = snprintf(path + n, sizeof(path) - n, "[\"%s\"]",
				     safe_span(w->key[i], w->key_len[i], key,
					       sizeof(key)));
			if (k > 0)
				n += (size_t)k;
			i++;    /* the value is what the key names */
		} else if (w->index[i] >= 0 && n < sizeof(path)) {
			k = snprintf(path + n, sizeof(path) - n, "[%ld]",
				     w->index[i]);
			if (k > 0)
				n += (size_t)k;
		}
	}
	return histd_error_set(HISTD_EINVALID, "%s %s", path, what);
}

/* ---------------------------------------------------------------------- */
/* The bytes, before protobuf-c sees them.                                  */
/* Nesting: protobuf-c unpacks recursively with no depth limit, so a small  */
/* request nested some thousands of levels deep (a tool result in a tool    */
/* result ...) overflows the stack.                                         */
/* NUL: protobuf-c unpacks a string into a C string, which would end at a   */
/* NUL character; the text after it would be acknowledged and then lost,   */
/* and an id would be checked and used as its prefix. proto3 allows U+0000, */
/* histd refuses it, naming the field.                                      */
/* The bytes are scanned first, guided by the descriptors, iteratively      */
/* within a level and at most MAX_DEPTH deep.                               */

static size_t
read_varint(const uint8_t *p, size_t avail, uint64_t *v)
{
	uint64_t x = 0;

	for (size_t i = 0; i < avail && i < HISTD_WIRE_VARINT_MAX; i++) {
		x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (!(p[i] & 0x80)) {
			*v = x;
			return i + 1;
		}
	}
	return 0;
}

enum { SCAN_OK, SCAN_TOO_DEEP, SCAN_NUL };

static size_t wire_field(const uint8_t *p, size_t avail, uint64_t *key,
			 const uint8_t **val, size_t *val_len);

/* The key of the map entry in p (its last, as protobuf-c keeps), into
 * w->key[depth]; left NULL when the entry has none. */
static void
entry_key(const uint8_t *p, size_t len, struct walk *w, int depth)
{
	const uint8_t *val = NULL;
	size_t i = 0, n, val_len = 0;
	uint64_t key;

	while (i < len && (n = wire_field(p + i, len - i, &key, &val,
					  &val_len))) {
		if (key == (1 << 3 | 2)) {
			w->key[depth] = (const char *)val;
			w->key_len[depth] = val_len;
		}
		i += n;
	}
}

/* The field at p (avail bytes): its key, and for a length-delimited one
 * its payload (*val, *val_len). Returns the field's whole size, or 0 when
 * the bytes are malformed. */
static size_t
wire_field(const uint8_t *p, size_t avail, uint64_t *key,
	   const uint8_t **val, size_t *val_len)
{
	uint64_t v;
	size_t n = read_varint(p, avail, key), m;

	if (!n)
		return 0;
	switch (*key & 7) {
	case 0:
		m = read_varint(p + n, avail - n, &v);
		return m ? n + m : 0;
	case 1:
		return avail - n >= 8 ? n + 8 : 0;
	case 5:
		return avail - n >= 4 ? n + 4 : 0;
	case 2:
		m = read_varint(p + n, avail - n, &v);
		if (!m || v > avail - n - m)
			return 0;
		*val = p + n + m;
		*val_len = (size_t)v;
		return n + m + (size_t)v;
	default:
		return 0;
	}
}

/* How many fields numbered `number` the message in p holds before offset
 * end: the index of a repeated field's element, for the error's path. */
static long
index_of_field(const uint8_t *p, size_t end, uint64_t number)
{
	const uint8_t *val;
	size_t i = 0, n, val_len;
	uint64_t key;
	long count = 0;

	while (i < end && (n = wire_field(p + i, end - i, &key, &val,
					  &val_len))) {
		if ((key >> 3) == number)
			count++;
		i += n;
	}
	return count;
}

/*
 * SCAN_TOO_DEEP if the message in p nests deeper than MAX_DEPTH; SCAN_NUL
 * if a string field holds a NUL character, with its path in w; SCAN_OK
 * otherwise, also when the bytes are malformed (protobuf-c then refuses
 * them).
 */
static int
scan_request(const ProtobufCMessageDescriptor *d, const uint8_t *p,
	     size_t len, int depth, struct walk *w)
{
	size_t i = 0;

	if (depth >= MAX_DEPTH)
		return SCAN_TOO_DEEP;
	while (i < len) {
		const ProtobufCFieldDescriptor *f;
		const uint8_t *val = NULL;
		size_t val_len = 0;
		uint64_t key;
		size_t n = wire_field(p + i, len - i, &key, &val, &val_len);
		int rc = SCAN_OK;

		if (!n)
			return SCAN_OK;
		if ((key & 7) != 2) {
			i += n;
			continue;
		}
		f = (key >> 3) <= UINT32_MAX ?
		    protobuf_c_message_descriptor_get_field(d,
				(unsigned)(key >> 3)) : NULL;
		if (f && f->type == PROTOBUF_C_TYPE_MESSAGE)
			rc = scan_request(f->descriptor, val, val_len,
					  depth + 1, w);
		else if (f && f->type == PROTOBUF_C_TYPE_STRING &&
			 memchr(val, 0, val_len)) {
			rc = SCAN_NUL;
			w->depth = depth + 1;
		}
		if (rc == SCAN_NUL) {
			w->name[depth] = f->name;
			w->index[depth] = f->label == PROTOBUF_C_LABEL_REPEATED ?
					  index_of_field(p, i, key >> 3) : -1;
			w->key[depth] = NULL;
			if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
			    is_map_entry(f->descriptor))
				entry_key(val, val_len, w, depth);
		}
		if (rc != SCAN_OK)
			return rc;
		i += n;
	}
	return SCAN_OK;
}

int
histd_check_request_bytes(const ProtobufCMessageDescriptor *d,
			  const uint8_t *p, size_t len)
{
	struct walk w = { .depth = 0 };

	switch (scan_request(d, p, len, 0, &w)) {
	case SCAN_TOO_DEEP:
		return histd_error_set(HISTD_EINVALID,
			"request nests messages deeper than %d levels",
			MAX_DEPTH);
	case SCAN_NUL:
		return walk_fail(&w, "holds a NUL character");
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* UTF-8: every string of every request must be well-formed UTF-8, as       */
/* proto3 requires; protobuf-c does not check, and a client in another      */
/* language could not read such a string back.                              */

static int
utf8_valid(const unsigned char *p, size_t len)
{
	size_t i = 0;

	while (i < len) {
		unsigned char c = p[i];
		unsigned char lo = 0x80, hi = 0xbf;
		size_t n;

		/* Most text is ASCII: take it eight bytes at a time. */
		while (len - i >= 8) {
			uint64_t w;

			memcpy(&w, p + i, 8);
			if (w & UINT64_C(0x8080808080808080))
				break;
			i += 8;
		}
		if (i == len)
			break;
		c = p[i];
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			n = 2;
		else if (c >= 0xe0 && c <= 0xef)
			n = 3;
		else if (c >= 0xf0 && c <= 0xf4)
			n = 4;
		else
			return 0;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
		else if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
		if (len - i < n || p[i + 1] < lo || p[i + 1] > hi)
			return 0;
		for (size_t k = 2; k < n; k++)
			if ((p[i + k] & 0xc0) != 0x80)
				return 0;
		i += n;
	}
	return 1;
}

static int walk_message(const ProtobufCMessage *m, struct walk *w);

static int
walk_value(const ProtobufCFieldDescriptor *f, const void *v, long index,
	   struct walk *w)
{
	int rc = 0;

	if (!v)
		return 0;
	w->name[w->depth] = f->name;
	w->index[w->depth] = index;
	w->key[w->depth] = NULL;
	if (f->type == PROTOBUF_C_TYPE_MESSAGE &&
	    is_map_entry(f->descriptor)) {
		const ProtobufCMessageDescriptor *d = f->descriptor;

		w->key[w->depth] = *(const char *const *)((const char *)v +
			d->fields[0].offset);
		w->key_len[w->depth] = SIZE_MAX;
	}
	w->depth++;
	if (f->type == PROTOBUF_C_TYPE_STRING) {
		if (!utf8_valid(v, strlen(v)))
			rc = walk_fail(w, "is not valid UTF-8");
	} else if (w->depth >= MAX_DEPTH) {
		rc = walk_fail(w, "nests messages too deeply");
	} else {
		rc = walk_message(v, w);
	}
	w->depth--;
	return rc;
}

/* Checks every string field of m (and of every message it holds) by its
 * descriptor, so that no field can be forgotten. */
static int
walk_message(const ProtobufCMessage *m, struct walk *w)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const char *base = (const char *)m;

	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		int rc;

		if (f->type != PROTOBUF_C_TYPE_STRING &&
		    f->type != PROTOBUF_C_TYPE_MESSAGE)
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = *(const size_t *)(base + f->quantifier_offset);
			void *const *v = *(void *const *const *)(base + f->offset);

			for (size_t k = 0; k < n; k++)
				if ((rc = walk_value(f, v[k], (long)k, w)))
					return rc;
			continue;
		}
		if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
		    *(const uint32_t *)(base + f->quantifier_offset) != f->id)
			continue;
		rc = walk_value(f, *(void *const *)(base + f->offset), -1, w);
		if (rc)
			return rc;
	}
	return 0;
}

static int
check_request_strings(const ProtobufCMessage *m)
{
	struct walk w = { .depth = 0 };

	return walk_message(m, &w);
}

/* ---------------------------------------------------------------------- */
/* Context keys, labels, selectors: string maps                             */

typedef struct kv_sorting {
	histd_kv kv;
	size_t order;   /* position in the request: the last one wins */
} kv_sorting;

static int
kv_cmp(const void *a, const void *b)
{
	const kv_sorting *x = a, *y = b;
	int c = strcmp(x->kv.key, y->kv.key);

	if (c)
		return c;
	return x->order < y->order ? -1 : x->order > y->order;
}

static int
kv_key_valid(const char *k)
{
	size_t n = 0;

	for (; k[n]; n++) {
		unsigned char c = (unsigned char)k[n];

		if (n >= KV_MAX_KEY)
			return 0;
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '.' || c == '_' ||
		      c == '/' || c == '-'))
			return 0;
	}
	return n > 0;
}

/* See service.h. */
int
histd_kv_collect(ProtobufCMessage *const *entries, size_t n,
		 const char *field, histd_kv **out, size_t *n_out)
{
	const ProtobufCFieldDescriptor *fk, *fv;
	kv_sorting *tmp;
	histd_kv *kv;
	size_t m = 0;

	*out = NULL;
	*n_out = 0;
	if (n == 0)
		return 0;
	if (n > KV_MAX_PAIRS)
		return histd_error_set(HISTD_EINVALID,
			"%s: too many (%zu pairs; the limit is %d)", field, n,
			KV_MAX_PAIRS);
	fk = protobuf_c_message_descriptor_get_field(entries[0]->descriptor, 1);
	fv = protobuf_c_message_descriptor_get_field(entries[0]->descriptor, 2);
	tmp = malloc(n * sizeof(*tmp));
	if (!tmp)
		return enomem();
	for (size_t i = 0; i < n; i++) {
		const char *e = (const char *)entries[i];
		char *k = *(char *const *)(e + fk->offset);
		char *v = *(char *const *)(e + fv->offset);
		size_t vlen = strlen(v);

		if (!kv_key_valid(k)) {
			char name[72];

			free(tmp);
			return histd_error_set(HISTD_EINVALID,
				"%s[\"%s\"]: a key must be 1..%d characters "
				"of [A-Za-z0-9._/-]", field,
				safe_name(k, name, sizeof(name)), KV_MAX_KEY);
		}
		if (vlen > KV_MAX_VALUE) {
			free(tmp);
			return histd_error_set(HISTD_EINVALID,
				"%s[\"%s\"] is %zu bytes; the limit is %d",
				field, k, vlen, KV_MAX_VALUE);
		}
		tmp[i].kv.key = k;
		tmp[i].kv.value = v;
		tmp[i].order = i;
	}
	qsort(tmp, n, sizeof(*tmp), kv_cmp);
	kv = malloc(n * sizeof(*kv));
	if (!kv) {
		free(tmp);
		return enomem();
	}
	for (size_t i = 0; i < n; i++) {
		if (i + 1 < n && !strcmp(tmp[i].kv.key, tmp[i + 1].kv.key))
			continue;
		kv[m++] = tmp[i].kv;
	}
	free(tmp);
	*out = kv;
	*n_out = m;
	return 0;
}

#define KV_COLLECT(req, member, field, out, n_out) \
	histd_kv_collect((ProtobufCMessage *const *)(req)->member, \
		   (req)->n_##member, field, out, n_out)

/* ---------------------------------------------------------------------- */
/* Session config                                                          */

/*
 * Checks a SessionConfig: every plugin of its pipeline is registered and
 * takes the options given (the plugin registry, plugins/pipeline.c).
 */
static int
validate_config(const Histd__V1__SessionConfig *c, const char *field)
{
	const Histd__V1__EmbeddingConfig *e = c->embeddings;

	if (e) {
		static const char *const providers[] = { "", "openai", "gemini",
							 "mistral" };
		int known = 0;

		for (size_t i = 0; i < 4; i++)
			known |= strcmp(e->provider, providers[i]) == 0;
		if (!known)
			return histd_error_set(HISTD_EINVALID,
				"%s.embeddings.provider must be openai, gemini, "
				"mistral or empty", field);
		/* Gemini puts the model in the URL path. */
		if (strlen(e->model) > 128 ||
		    strspn(e->model, "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
			   "abcdefghijklmnopqrstuvwxyz0123456789._-") !=
		    strlen(e->model))
			return histd_error_set(HISTD_EINVALID,
				"%s.embeddings.model must be at most 128 "
				"characters of [A-Za-z0-9._-]", field);
		if (!e->provider[0] && e->model[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.embeddings.model needs a provider", field);
	}
	return histd_context_validate(c, field);
}

/* Validates and packs a config for the driver. *out is malloc'ed, or NULL
 * with *len 0 for no config or one that packs to nothing. */
static int
config_pack(const Histd__V1__SessionConfig *c, const char *field,
	    uint8_t **out, size_t *len)
{
	size_t n;
	int rc;

	*out = NULL;
	*len = 0;
	if (!c)
		return 0;
	if ((rc = validate_config(c, field)))
		return rc;
	n = histd__v1__session_config__get_packed_size(c);
	if (n == 0)
		return 0;
	*out = malloc(n);
	if (!*out)
		return enomem();
	*len = histd__v1__session_config__pack(c, *out);
	return 0;
}

/* ---------------------------------------------------------------------- */
/* histd_session -> Histd__V1__Session                                     */

/* A Session message whose strings are borrowed from a histd_session. It
 * must not move once filled: it points into itself. */
typedef struct pb_session {
	Histd__V1__Session msg;
	Histd__V1__SessionStats stats;
	Google__Protobuf__Timestamp created, updated;
	Histd__V1__Session__ContextKeysEntry *ck;
	Histd__V1__Session__ContextKeysEntry **ckp;
	Histd__V1__Session__LabelsEntry *lb;
	Histd__V1__Session__LabelsEntry **lbp;
} pb_session;

static void
pb_session_fini(pb_session *p)
{
	if (p->msg.config)
		histd__v1__session_config__free_unpacked(p->msg.config, NULL);
	free(p->ck);
	free(p->ckp);
	free(p->lb);
	free(p->lbp);
	memset(p, 0, sizeof(*p));
}

static int
pb_session_fill(pb_session *p, const histd_session *s)
{
	static const Histd__V1__Session init = HISTD__V1__SESSION__INIT;
	static const Histd__V1__SessionStats stats = HISTD__V1__SESSION_STATS__INIT;
	static const Google__Protobuf__Timestamp ts =
		GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	static const Histd__V1__Session__ContextKeysEntry cke =
		HISTD__V1__SESSION__CONTEXT_KEYS_ENTRY__INIT;
	static const Histd__V1__Session__LabelsEntry lbe =
		HISTD__V1__SESSION__LABELS_ENTRY__INIT;
	int rc;

	memset(p, 0, sizeof(*p));
	p->msg = init;
	p->stats = stats;
	p->created = ts;
	p->updated = ts;
	p->msg.id = s->id;
	if (s->n_context_keys) {
		p->ck = calloc(s->n_context_keys, sizeof(*p->ck));
		p->ckp = calloc(s->n_context_keys, sizeof(*p->ckp));
		if (!p->ck || !p->ckp)
			goto nomem;
		for (size_t i = 0; i < s->n_context_keys; i++) {
			p->ck[i] = cke;
			p->ck[i].key = s->context_keys[i].key;
			p->ck[i].value = s->context_keys[i].value;
			p->ckp[i] = &p->ck[i];
		}
		p->msg.n_context_keys = s->n_context_keys;
		p->msg.context_keys = p->ckp;
	}
	if (s->n_labels) {
		p->lb = calloc(s->n_labels, sizeof(*p->lb));
		p->lbp = calloc(s->n_labels, sizeof(*p->lbp));
		if (!p->lb || !p->lbp)
			goto nomem;
		for (size_t i = 0; i < s->n_labels; i++) {
			p->lb[i] = lbe;
			p->lb[i].key = s->labels[i].key;
			p->lb[i].value = s->labels[i].value;
			p->lbp[i] = &p->lb[i];
		}
		p->msg.n_labels = s->n_labels;
		p->msg.labels = p->lbp;
	}
	if (s->config_len &&
	    (rc = histd_unpack_stored(&histd__v1__session_config__descriptor,
				      NULL, s->config, s->config_len,
				      &p->msg.config,
				      "the stored config of the session"))) {
		pb_session_fini(p);
		return rc;
	}
	ts_from_us(&p->created, s->created_at_us);
	ts_from_us(&p->updated, s->updated_at_us);
	p->msg.created_at = &p->created;
	p->msg.updated_at = &p->updated;
	p->msg.revision = s->revision;
	p->stats.message_count = s->message_count;
	p->stats.token_estimate = s->token_total;
	p->stats.bytes = s->bytes_total;
	p->stats.last_seq = s->last_seq;
	p->stats.first_seq = s->first_seq;
	p->stats.summary_count = s->summary_count;
	p->msg.stats = &p->stats;
	return 0;
nomem:
	pb_session_fini(p);
	return enomem();
}

static int
reply_session(const histd_session *s, histd_reply *reply)
{
	pb_session p;
	int rc = pb_session_fill(&p, s);

	if (rc)
		return rc;
	rc = reply_pack(&p.msg.base, reply);
	pb_session_fini(&p);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Messages: validation and the batch handed to the driver                 */

static const char *const image_types[] = {
	"image/png", "image/jpeg", "image/gif", "image/webp",
};

static int
image_type_known(const char *t)
{
	for (size_t i = 0; i < sizeof(image_types) / sizeof(image_types[0]);
	     i++)
		if (!strcmp(t, image_types[i]))
			return 1;
	return 0;
}

/* A required string of 1..max bytes. */
static int
check_str(const char *s, size_t max, const char *path, const char *field)
{
	size_t n = strlen(s);

	if (n == 0)
		return histd_error_set(HISTD_EINVALID, "%s.%s is required",
				       path, field);
	if (n > max)
		return histd_error_set(HISTD_EINVALID,
			"%s.%s is %zu bytes; the limit is %zu", path, field,
			n, max);
	return 0;
}

static int
check_image(const Histd__V1__ImageBlock *b, const char *path)
{
	switch (b->source_case) {
	case HISTD__V1__IMAGE_BLOCK__SOURCE_URL:
		if (!b->url[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.image.url is empty", path);
		break;
	case HISTD__V1__IMAGE_BLOCK__SOURCE_DATA:
		if (b->data.len == 0)
			return histd_error_set(HISTD_EINVALID,
				"%s.image.data is empty", path);
		if (!b->media_type[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.image.media_type is required with data",
				path);
		break;
	default:
		return histd_error_set(HISTD_EINVALID,
			"%s.image: url or data is required", path);
	}
	if (b->media_type[0] && !image_type_known(b->media_type))
		return histd_error_set(HISTD_EINVALID,
			"%s.image.media_type is not one of image/png, "
			"image/jpeg, image/gif, image/webp", path);
	return 0;
}

static int
check_document(const Histd__V1__DocumentBlock *b, const char *path)
{
	switch (b->source_case) {
	case HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL:
		if (!b->url[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.document.url is empty", path);
		return 0;
	case HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA:
		if (b->data.len == 0)
			return histd_error_set(HISTD_EINVALID,
				"%s.document.data is empty", path);
		if (!b->media_type[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.document.media_type is required with data",
				path);
		return 0;
	default:
		return histd_error_set(HISTD_EINVALID,
			"%s.document: url or data is required", path);
	}
}

static int
check_tool_call(const Histd__V1__ToolCallBlock *b, const char *path)
{
	json_error_t jerr;
	json_t *j;
	int rc;

	if ((rc = check_str(b->id, TOOL_ID_MAX, path, "tool_call.id")) ||
	    (rc = check_str(b->name, TOOL_NAME_MAX, path, "tool_call.name")))
		return rc;
	if (!b->arguments[0])
		return 0;
	j = json_loadb(b->arguments, strlen(b->arguments), JSON_DECODE_ANY,
		       &jerr);
	if (!j)
		return histd_error_set(HISTD_EINVALID,
			"%s.tool_call.arguments %s (line %d, column %d)", path,
			histd_json_error_why(&jerr), jerr.line, jerr.column);
	json_decref(j);
	return 0;
}

static int check_block(const Histd__V1__ContentBlock *b, Histd__V1__Role role,
		       int nested, const char *path);

static int
check_tool_result(const Histd__V1__ToolResultBlock *b, const char *path)
{
	char sub[256];
	int rc;

	if ((rc = check_str(b->tool_call_id, TOOL_ID_MAX, path,
			    "tool_result.tool_call_id")))
		return rc;
	for (size_t k = 0; k < b->n_content; k++) {
		snprintf(sub, sizeof(sub), "%s.tool_result.content[%zu]", path,
			 k);
		if ((rc = check_block(b->content[k], HISTD__V1__ROLE__ROLE_TOOL,
				      1, sub)))
			return rc;
	}
	return 0;
}

/* One content block at `path`. nested: inside a tool result, where only
 * text, image and document blocks may be (and roles do not apply). */
static int
check_block(const Histd__V1__ContentBlock *b, Histd__V1__Role role,
	    int nested, const char *path)
{
	const Histd__V1__ReasoningBlock *r;
	Histd__V1__ContentBlock__BlockCase c = b->block_case;

	if (c == HISTD__V1__CONTENT_BLOCK__BLOCK__NOT_SET)
		return histd_error_set(HISTD_EINVALID, "%s has no block set",
				       path);
	if (nested) {
		if (c != HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT &&
		    c != HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE &&
		    c != HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT)
			return histd_error_set(HISTD_EINVALID,
				"%s: a tool result may hold only text, image "
				"and document blocks", path);
	} else if (role == HISTD__V1__ROLE__ROLE_SYSTEM &&
		   c != HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT) {
		return histd_error_set(HISTD_EINVALID,
			"%s: system messages may hold only text blocks", path);
	} else if (role == HISTD__V1__ROLE__ROLE_TOOL &&
		   c != HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
		return histd_error_set(HISTD_EINVALID,
			"%s: tool messages may hold only tool_result blocks",
			path);
	}

	switch (c) {
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
		if (!b->text->text[0])
			return histd_error_set(HISTD_EINVALID,
				"%s.text.text is empty", path);
		return 0;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
		return check_image(b->image, path);
	case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
		return check_document(b->document, path);
	case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
		if (role != HISTD__V1__ROLE__ROLE_ASSISTANT)
			return histd_error_set(HISTD_EINVALID,
				"%s.reasoning: only assistant messages may "
				"hold reasoning", path);
		r = b->reasoning;
		if (!r->text[0] && !r->summary[0] && !r->signature[0] &&
		    r->encrypted_data.len == 0)
			return histd_error_set(HISTD_EINVALID,
				"%s.reasoning is empty", path);
		return 0;
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
		if (role != HISTD__V1__ROLE__ROLE_ASSISTANT)
			return histd_error_set(HISTD_EINVALID,
				"%s.tool_call: only assistant messages may "
				"hold tool calls", path);
		return check_tool_call(b->tool_call, path);
	case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
		if (role != HISTD__V1__ROLE__ROLE_TOOL &&
		    role != HISTD__V1__ROLE__ROLE_USER)
			return histd_error_set(HISTD_EINVALID,
				"%s.tool_result: only tool and user messages "
				"may hold tool results", path);
		return check_tool_result(b->tool_result, path);
	default:
		return histd_error_set(HISTD_EINVALID,
			"%s holds an unknown block", path);
	}
}

static int
check_message(const Histd__V1__Message *m, size_t i)
{
	char path[64];
	int rc;

	switch (m->role) {
	case HISTD__V1__ROLE__ROLE_SYSTEM:
	case HISTD__V1__ROLE__ROLE_USER:
	case HISTD__V1__ROLE__ROLE_ASSISTANT:
	case HISTD__V1__ROLE__ROLE_TOOL:
		break;
	case HISTD__V1__ROLE__ROLE_UNSPECIFIED:
		return histd_error_set(HISTD_EINVALID,
				       "messages[%zu].role is required", i);
	default:
		return histd_error_set(HISTD_EINVALID,
			"messages[%zu].role is not a known Role", i);
	}
	if (m->n_content == 0)
		return histd_error_set(HISTD_EINVALID,
				       "messages[%zu].content is empty", i);
	if (m->created_at && !ts_valid(m->created_at))
		return histd_error_set(HISTD_EINVALID,
			"messages[%zu].created_at is not a valid timestamp", i);
	for (size_t j = 0; j < m->n_content; j++) {
		snprintf(path, sizeof(path), "messages[%zu].content[%zu]", i, j);
		if ((rc = check_block(m->content[j], m->role, 0, path)))
			return rc;
	}
	return 0;
}

/* The messages of an Append or Replace, validated and packed, as the
 * driver takes them. Everything points into the request or into memory of
 * the call's allocator (its arena: nothing to free one by one). */
typedef struct batch {
	size_t n;
	histd_msg_in *in;
	uint8_t **bufs;
	uint32_t *tokens;
	histd_tool_ref *refs;
	ProtobufCAllocator *alloc;
} batch;

static void *
batch_alloc(batch *b, size_t size)
{
	void *p = b->alloc->alloc(b->alloc->allocator_data, size ? size : 1);

	if (p)
		memset(p, 0, size);
	return p;
}

static void
batch_free(batch *b)
{
	ProtobufCAllocator *a = b->alloc;

	if (!a)
		return;
	for (size_t i = 0; b->bufs && i < b->n; i++)
		if (b->bufs[i])
			a->free(a->allocator_data, b->bufs[i]);
	if (b->bufs)
		a->free(a->allocator_data, b->bufs);
	if (b->in)
		a->free(a->allocator_data, b->in);
	if (b->tokens)
		a->free(a->allocator_data, b->tokens);
	if (b->refs)
		a->free(a->allocator_data, b->refs);
	memset(b, 0, sizeof(*b));
}

/* Fills seq (0), token_estimate and created_at (now unless given), then
 * packs message i into b->bufs[i]. */
static int
pack_message(Histd__V1__Message *m, size_t i, int64_t now_us,
	     uint32_t max_bytes, batch *b)
{
	Google__Protobuf__Timestamp now = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	int own_ts = !m->created_at;
	size_t size;
	int rc = 0;

	m->seq = 0;
	m->token_estimate = b->tokens[i] = histd_tokens_message(m);
	if (own_ts) {
		ts_from_us(&now, now_us);
		m->created_at = &now;
	}
	size = histd__v1__message__get_packed_size(m);
	if (size > max_bytes) {
		rc = histd_error_set(HISTD_ELIMIT,
			"messages[%zu] is %zu bytes; the limit is %" PRIu32,
			i, size, max_bytes);
	} else if (!(b->bufs[i] = batch_alloc(b, size))) {
		rc = enomem();
	} else {
		b->in[i].data = b->bufs[i];
		b->in[i].len = histd__v1__message__pack(m, b->bufs[i]);
		b->in[i].token_estimate = b->tokens[i];
	}
	/* The stack timestamp must not reach free_unpacked. */
	if (own_ts)
		m->created_at = NULL;
	return rc;
}

/*
 * Validates messages[0..n) (n may be 0) and builds the batch. The messages
 * are changed in place (seq, token_estimate, created_at) and must outlive
 * the batch: the tool refs point at their ids.
 */
static int
batch_build(const histd_service_config *cfg, ProtobufCAllocator *alloc,
	    Histd__V1__Message **msgs, size_t n, batch *b)
{
	int64_t now_us = histd_now_us();
	size_t n_refs = 0, r = 0;
	int rc;

	memset(b, 0, sizeof(*b));
	b->alloc = alloc;
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++) {
		if ((rc = check_message(msgs[i], i)))
			return rc;
		for (size_t j = 0; j < msgs[i]->n_content; j++) {
			int c = msgs[i]->content[j]->block_case;

			n_refs += c == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL ||
				  c == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		}
	}
	b->n = n;
	b->in = batch_alloc(b, n * sizeof(*b->in));
	b->bufs = batch_alloc(b, n * sizeof(*b->bufs));
	b->tokens = batch_alloc(b, n * sizeof(*b->tokens));
	b->refs = batch_alloc(b, (n_refs ? n_refs : 1) * sizeof(*b->refs));
	if (!b->in || !b->bufs || !b->tokens || !b->refs) {
		batch_free(b);
		return enomem();
	}
	for (size_t i = 0; i < n; i++) {
		Histd__V1__Message *m = msgs[i];
		histd_msg_in *in = &b->in[i];

		if ((rc = pack_message(m, i, now_us, cfg->max_message_bytes,
				       b))) {
			batch_free(b);
			return rc;
		}
		/* Calls first, then results, each in block order. */
		in->calls = &b->refs[r];
		for (size_t j = 0; j < m->n_content; j++) {
			if (m->content[j]->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL)
				continue;
			b->refs[r].id = m->content[j]->tool_call->id;
			b->refs[r++].block = (uint32_t)j;
			in->n_calls++;
		}
		in->results = &b->refs[r];
		for (size_t j = 0; j < m->n_content; j++) {
			if (m->content[j]->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				continue;
			b->refs[r].id = m->content[j]->tool_result->tool_call_id;
			b->refs[r++].block = (uint32_t)j;
			in->n_results++;
		}
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* ListSessions page tokens: "v1." + base64url (no padding) of the last     */
/* id returned. Opaque to clients; the prefix lets the format change.       */

static const char b64url[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static void
token_encode(const char *id, char *out)
{
	const unsigned char *p = (const unsigned char *)id;
	size_t n = strlen(id), o = 3, i = 0;

	memcpy(out, "v1.", 3);
	for (; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 |
			     p[i + 2];

		out[o++] = b64url[v >> 18];
		out[o++] = b64url[(v >> 12) & 63];
		out[o++] = b64url[(v >> 6) & 63];
		out[o++] = b64url[v & 63];
	}
	if (n - i == 1) {
		out[o++] = b64url[p[i] >> 2];
		out[o++] = b64url[(p[i] & 3) << 4];
	} else if (n - i == 2) {
		uint32_t v = (uint32_t)p[i] << 8 | p[i + 1];

		out[o++] = b64url[v >> 10];
		out[o++] = b64url[(v >> 4) & 63];
		out[o++] = b64url[(v & 15) << 2];
	}
	out[o] = '\0';
}

/* Longest token: "v1." + 4 * ceil(128 / 3) + NUL. */
#define TOKEN_MAX (3 + 4 * ((ID_MAX + 2) / 3) + 1)

static int
token_decode(const char *tok, char id[ID_MAX + 1])
{
	char again[TOKEN_MAX];
	size_t n = strlen(tok), o = 0;
	uint32_t acc = 0;
	int bits = 0;

	if (n < 4 || n >= TOKEN_MAX || memcmp(tok, "v1.", 3))
		goto bad;
	for (size_t i = 3; i < n; i++) {
		const char *c = memchr(b64url, tok[i], 64);

		if (!c || !tok[i])
			goto bad;
		acc = (acc << 6) | (uint32_t)(c - b64url);
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			if (o >= ID_MAX)
				goto bad;
			id[o++] = (char)((acc >> bits) & 0xff);
		}
	}
	id[o] = '\0';
	/* Only the canonical encoding of a valid id is a token we gave. */
	if (o == 0 || strlen(id) != o)
		goto bad;
	for (size_t i = 0; i < o; i++)
		if (!id_char((unsigned char)id[i]))
			goto bad;
	token_encode(id, again);
	if (strcmp(again, tok))
		goto bad;
	return 0;
bad:
	return histd_error_set(HISTD_EINVALID, "page_token is not valid");
}

/* ---------------------------------------------------------------------- */
/* Handlers. Each gets the decoded request (which it may change; the       */
/* dispatcher frees it) and the bytes as received.                          */

typedef struct call {
	histd_service *s;
	enum histd_method m;
	const char *tenant;
	const uint8_t *raw;
	size_t raw_len;
	histd_reply *reply;
	ProtobufCAllocator *alloc;   /* the call's arena */
	int read_only;
	/* Append: the answer waiting for the driver's durability report
	 * (NULL: none, the driver blocks), and whether the driver took it. */
	struct pending *pending;
	int deferred;
} call;

/*
 * An Append answer that waits for the driver: for durability
 * (histd_append.on_durable), or for its whole result (on_result). Two
 * parties hold it: the driver's report and the handler; whichever comes
 * second gives the answer, so the report may arrive on the driver's
 * thread before the handler is done.
 */
struct pending {
	atomic_int left;
	int rc;                      /* the driver's report */
	int pack_rc;                 /* the handler's packing */
	char msg[256];
	char pack_msg[256];
	uint8_t *data;
	size_t len;
	void (*finish)(void *ctx, int rc, uint8_t *data, size_t len,
		       const char *msg, uint64_t current_revision);
	void *finish_ctx;
	/* With on_result: the driver's result, and what the answer needs
	 * besides it, copied before the driver was called into `room`, the
	 * end of this allocation (room_len bytes): the token estimates,
	 * tenant and session id. */
	int with_result;
	histd_append_result res;
	size_t n_tokens;
	uint32_t *tokens;
	const char *tenant, *session_id;
	histd_context *context;
	histd_driver *d;
	size_t room_len;
	_Alignas(uint32_t) char room[];
};

/* The answer to a deferred append, from the driver's result. */
static int
pending_pack(struct pending *p)
{
	Histd__V1__AppendResponse resp = HISTD__V1__APPEND_RESPONSE__INIT;
	histd_reply r = { 0 };
	int rc;

	resp.first_seq = p->res.first_seq;
	resp.last_seq = p->res.last_seq;
	resp.revision = p->res.revision;
	resp.n_token_estimates = p->n_tokens;
	resp.token_estimates = p->tokens;
	resp.replayed = p->res.replayed != 0;
	if ((rc = reply_pack(&resp.base, &r)))
		return rc;
	p->data = r.data;
	p->len = r.len;
	if (!p->res.replayed)
		histd_context_after_append(p->context, p->d, p->tenant,
					   p->session_id);
	return 0;
}

static void
pending_release(struct pending *p)
{
	if (atomic_fetch_sub(&p->left, 1) != 1)
		return;
	if (!p->rc && !p->pack_rc && p->with_result &&
	    (p->pack_rc = pending_pack(p)))
		snprintf(p->pack_msg, sizeof(p->pack_msg), "%s",
			 histd_error_message());
	if (p->rc)
		p->finish(p->finish_ctx, p->rc, NULL, 0, p->msg,
			  p->rc == HISTD_ECONFLICT ? p->res.current_revision : 0);
	else if (p->pack_rc)
		p->finish(p->finish_ctx, p->pack_rc, NULL, 0, p->pack_msg, 0);
	else {
		p->finish(p->finish_ctx, 0, p->data, p->len, "", 0);
		p->data = NULL;
	}
	free(p->data);
	free(p);
}

static void
pending_durable(void *ctx, int rc, const char *msg)
{
	struct pending *p = ctx;

	p->rc = rc;
	snprintf(p->msg, sizeof(p->msg), "%s", msg ? msg : "");
	pending_release(p);
}

static void
pending_result(void *ctx, int rc, const histd_append_result *res,
	       const char *msg)
{
	struct pending *p = ctx;

	if (res)
		p->res = *res;
	p->rc = rc;
	snprintf(p->msg, sizeof(p->msg), "%s", msg ? msg : "");
	pending_release(p);
}

/* The room a pending answer needs for an append of n messages. */
static size_t
pending_room(const char *tenant, const char *session_id, size_t n)
{
	return n * sizeof(uint32_t) + strlen(tenant) + 1 +
	       strlen(session_id) + 1;
}

/*
 * Lets the driver answer p itself (histd_append.on_result): copies what
 * the answer needs besides the driver's result into p's room. Where it
 * does not fit, nothing is set and the driver blocks as it would anyway.
 */
static void
pending_take_result(struct pending *p, call *c, const char *session_id,
		    const batch *b, histd_append *a)
{
	size_t tok = b->n * sizeof(uint32_t);
	size_t lt = strlen(c->tenant) + 1, ls = strlen(session_id) + 1;

	if (tok + lt + ls > p->room_len)
		return;
	memcpy(p->room, b->tokens, tok);
	memcpy(p->room + tok, c->tenant, lt);
	memcpy(p->room + tok + lt, session_id, ls);
	p->tokens = (uint32_t *)(void *)p->room;
	p->n_tokens = b->n;
	p->tenant = p->room + tok;
	p->session_id = p->room + tok + lt;
	p->context = c->s->cfg.context;
	p->d = c->s->d;
	a->on_result = pending_result;
	a->result_ctx = p;
}

static int
conflict(call *c, int rc, uint64_t current_revision)
{
	if (rc == HISTD_ECONFLICT)
		c->reply->current_revision = current_revision;
	return rc;
}

static int
h_create_session(call *c, void *msg)
{
	Histd__V1__CreateSessionRequest *r = msg;
	histd_session in = { 0 }, *out = NULL;
	char uuid[37];
	int rc;

	if (r->session_id[0]) {
		if ((rc = histd_check_session_id(r->session_id, "session_id")))
			return rc;
		in.id = r->session_id;
	} else {
		new_uuid(uuid);
		in.id = uuid;
	}
	in.tenant = (char *)c->tenant;
	if ((rc = KV_COLLECT(r, context_keys, "context_keys",
			     &in.context_keys, &in.n_context_keys)) ||
	    (rc = KV_COLLECT(r, labels, "labels", &in.labels, &in.n_labels)) ||
	    (rc = config_pack(r->config, "config", &in.config,
			      &in.config_len)))
		goto out;
	in.created_at_us = in.updated_at_us = histd_now_us();
	if ((rc = histd_driver_session_create(c->s->d, &in, &out)))
		goto out;
	rc = reply_session(out, c->reply);
out:
	histd_session_free(out);
	free(in.context_keys);
	free(in.labels);
	free(in.config);
	return rc;
}

static int
h_resolve_session(call *c, void *msg)
{
	Histd__V1__ResolveSessionRequest *r = msg;
	Histd__V1__ResolveSessionResponse resp =
		HISTD__V1__RESOLVE_SESSION_RESPONSE__INIT;
	histd_session in = { 0 }, *out = NULL;
	pb_session p;
	char uuid[37];
	int created = 0, rc;

	if (r->n_context_keys == 0)
		return histd_error_set(HISTD_EINVALID,
				       "context_keys is required");
	new_uuid(uuid);
	in.id = uuid;
	in.tenant = (char *)c->tenant;
	if ((rc = KV_COLLECT(r, context_keys, "context_keys",
			     &in.context_keys, &in.n_context_keys)) ||
	    (rc = KV_COLLECT(r, labels, "labels", &in.labels, &in.n_labels)) ||
	    (rc = config_pack(r->config, "config", &in.config,
			      &in.config_len)))
		goto out;
	in.created_at_us = in.updated_at_us = histd_now_us();
	if ((rc = histd_driver_session_resolve(c->s->d, &in, &out, &created)))
		goto out;
	if ((rc = pb_session_fill(&p, out)))
		goto out;
	resp.session = &p.msg;
	resp.created = created != 0;
	rc = reply_pack(&resp.base, c->reply);
	pb_session_fini(&p);
out:
	histd_session_free(out);
	free(in.context_keys);
	free(in.labels);
	free(in.config);
	return rc;
}

static int
h_get_session(call *c, void *msg)
{
	Histd__V1__GetSessionRequest *r = msg;
	histd_session *out = NULL;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")) ||
	    (rc = histd_driver_session_get(c->s->d, c->tenant, r->session_id,
					   &out)))
		return rc;
	rc = reply_session(out, c->reply);
	histd_session_free(out);
	return rc;
}

static int
h_list_sessions(call *c, void *msg)
{
	Histd__V1__ListSessionsRequest *r = msg;
	Histd__V1__ListSessionsResponse resp =
		HISTD__V1__LIST_SESSIONS_RESPONSE__INIT;
	histd_list q = { .tenant = c->tenant };
	histd_session_list out = { 0 };
	histd_kv *sel = NULL;
	pb_session *ps = NULL;
	Histd__V1__Session **pv = NULL;
	char after[ID_MAX + 1], next[TOKEN_MAX];
	size_t filled = 0;
	int rc;

	q.limit = r->page_size ? min_u32(r->page_size, c->s->cfg.max_page_size)
			       : min_u32(DEFAULT_PAGE, c->s->cfg.max_page_size);
	if (r->page_token[0]) {
		if ((rc = token_decode(r->page_token, after)))
			return rc;
		q.after_id = after;
	}
	if ((rc = KV_COLLECT(r, label_selector, "label_selector", &sel,
			     &q.n_labels)))
		return rc;
	q.labels = sel;
	if ((rc = histd_driver_session_list(c->s->d, &q, &out)))
		goto done;
	if (out.n) {
		ps = calloc(out.n, sizeof(*ps));
		pv = calloc(out.n, sizeof(*pv));
		if (!ps || !pv) {
			rc = enomem();
			goto done;
		}
	}
	for (; filled < out.n; filled++) {
		if ((rc = pb_session_fill(&ps[filled], out.v[filled])))
			goto done;
		pv[filled] = &ps[filled].msg;
	}
	resp.n_sessions = out.n;
	resp.sessions = pv;
	if (out.has_more && out.n) {
		token_encode(out.v[out.n - 1]->id, next);
		resp.next_page_token = next;
	}
	rc = reply_pack(&resp.base, c->reply);
done:
	for (size_t i = 0; i < filled; i++)
		pb_session_fini(&ps[i]);
	free(ps);
	free(pv);
	free(sel);
	histd_session_list_free(&out);
	return rc;
}

static int
h_update_session(call *c, void *msg)
{
	/* Non-NULL "replace with nothing" for the driver. */
	static histd_kv no_labels[1];
	static const uint8_t no_config[1];
	Histd__V1__UpdateSessionRequest *r = msg;
	const Google__Protobuf__FieldMask *mask = r->update_mask;
	histd_kv *labels = NULL;
	size_t n_labels = 0, config_len = 0;
	uint8_t *config = NULL;
	histd_session *out = NULL;
	uint64_t current = 0;
	int want_labels = 0, want_config = 0, rc;
	char name[72];

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (!mask || mask->n_paths == 0)
		return histd_error_set(HISTD_EINVALID,
				       "update_mask is required");
	for (size_t i = 0; i < mask->n_paths; i++) {
		if (!strcmp(mask->paths[i], "labels"))
			want_labels = 1;
		else if (!strcmp(mask->paths[i], "config"))
			want_config = 1;
		else
			return histd_error_set(HISTD_EINVALID,
				"update_mask.paths[%zu]: unknown field \"%s\" "
				"(only \"labels\" and \"config\")", i,
				safe_name(mask->paths[i], name, sizeof(name)));
	}
	if (want_labels &&
	    (rc = KV_COLLECT(r, labels, "labels", &labels, &n_labels)))
		return rc;
	if (want_config &&
	    (rc = config_pack(r->config, "config", &config, &config_len)))
		goto out;
	rc = histd_driver_session_update(c->s->d, c->tenant, r->session_id,
		r->expected_revision,
		want_labels ? (labels ? labels : no_labels) : NULL, n_labels,
		want_config ? (config ? config : no_config) : NULL, config_len,
		histd_now_us(), &out, &current);
	if (rc) {
		rc = conflict(c, rc, current);
		goto out;
	}
	rc = reply_session(out, c->reply);
out:
	histd_session_free(out);
	free(labels);
	free(config);
	return rc;
}

static int
h_delete_session(call *c, void *msg)
{
	Histd__V1__DeleteSessionRequest *r = msg;
	Histd__V1__DeleteSessionResponse resp =
		HISTD__V1__DELETE_SESSION_RESPONSE__INIT;
	uint64_t current = 0;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	rc = histd_driver_session_delete(c->s->d, c->tenant, r->session_id,
					 r->expected_revision, &current);
	if (rc)
		return conflict(c, rc, current);
	return reply_pack(&resp.base, c->reply);
}

/* ForkSession's reads of the source's labels, when its life keeps
 * changing under them. */
#define FORK_ATTEMPTS 4

/*
 * ForkSession without labels: the fork keeps the source's. They are read
 * first and the fork is made from the life they were read from, so that
 * it never holds one life's messages under another's labels; when that
 * life is gone (ENOTFOUND: deleted, and maybe created again since), they
 * are read again, at most FORK_ATTEMPTS times.
 */
static int
fork_keeping_labels(call *c, const Histd__V1__ForkSessionRequest *r,
		    histd_session *in, histd_session **out)
{
	histd_session *src = NULL;
	int rc = 0;

	for (int attempt = 0; attempt < FORK_ATTEMPTS; attempt++) {
		if ((rc = histd_driver_session_get(c->s->d, c->tenant,
						   r->session_id, &src)))
			break;
		in->labels = src->labels;
		in->n_labels = src->n_labels;
		rc = histd_driver_session_fork_life(c->s->d, c->tenant,
						    r->session_id,
						    src->incarnation,
						    r->up_to_seq, in, out);
		in->labels = NULL;
		in->n_labels = 0;
		histd_session_free(src);
		src = NULL;
		if (rc != HISTD_ENOTFOUND)
			break;
	}
	return rc;
}

static int
h_fork_session(call *c, void *msg)
{
	Histd__V1__ForkSessionRequest *r = msg;
	histd_session in = { 0 }, *out = NULL;
	histd_kv *labels = NULL;
	char uuid[37];
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (r->new_session_id[0]) {
		if ((rc = histd_check_session_id(r->new_session_id,
						 "new_session_id")))
			return rc;
		in.id = r->new_session_id;
	} else {
		new_uuid(uuid);
		in.id = uuid;
	}
	in.tenant = (char *)c->tenant;
	in.created_at_us = in.updated_at_us = histd_now_us();
	if (r->n_labels) {
		if ((rc = KV_COLLECT(r, labels, "labels", &labels,
				     &in.n_labels)))
			return rc;
		in.labels = labels;
		rc = histd_driver_session_fork(c->s->d, c->tenant,
					       r->session_id, r->up_to_seq,
					       &in, &out);
	} else {
		rc = fork_keeping_labels(c, r, &in, &out);
	}
	if (!rc)
		rc = reply_session(out, c->reply);
	histd_session_free(out);
	free(labels);
	return rc;
}

/*
 * The Append path, shared with Import: validates and appends r's messages
 * and fills *resp (its token_estimates point into *b, which the caller
 * frees with batch_free, also on error). The idempotency hash covers the
 * whole request as received (c->raw), Append or Import.
 */
static int
append_messages(call *c, const Histd__V1__AppendRequest *r,
		Histd__V1__AppendResponse *resp, batch *b)
{
	const histd_service_config *cfg = &c->s->cfg;
	histd_append a = { .tenant = c->tenant };
	histd_append_result res = { 0 };
	uint8_t hash[HISTD_HASH_LEN];
	int rc;

	memset(b, 0, sizeof(*b));

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (r->n_messages == 0)
		return histd_error_set(HISTD_EINVALID, "messages is empty");
	if (r->n_messages > cfg->max_messages_per_append)
		return histd_error_set(HISTD_ELIMIT,
			"messages holds %zu messages; the limit is %" PRIu32,
			r->n_messages, cfg->max_messages_per_append);
	if (strlen(r->idempotency_key) > IDEM_KEY_MAX)
		return histd_error_set(HISTD_EINVALID,
			"idempotency_key is longer than %d bytes",
			IDEM_KEY_MAX);
	if ((rc = batch_build(cfg, c->alloc, r->messages, r->n_messages, b)))
		return rc;
	a.session_id = r->session_id;
	a.expected_revision = r->expected_revision;
	a.now_us = histd_now_us();
	if (r->idempotency_key[0]) {
		/* The request as received: a retry sends the same bytes. */
		if (!EVP_Digest(c->raw, c->raw_len, hash, NULL, EVP_sha256(),
				NULL))
			return histd_error_set(HISTD_EINTERNAL,
					       "SHA-256 failed");
		a.idempotency_key = r->idempotency_key;
		a.request_hash = hash;
		a.idem_expires_us = a.now_us + cfg->idempotency_ttl_us;
	}
	a.msgs = b->in;
	a.n_msgs = b->n;
	if (c->pending) {
		a.on_durable = pending_durable;
		a.durable_ctx = c->pending;
		pending_take_result(c->pending, c, r->session_id, b, &a);
	}
	rc = histd_driver_append(c->s->d, &a, &res);
	if (rc == HISTD_DEFERRED) {
		/* The driver answers through pending_result. */
		c->pending->with_result = 1;
		c->deferred = 1;
		return 0;
	}
	if (rc == HISTD_PENDING) {
		c->deferred = 1;
		rc = 0;
	}
	if (rc)
		return conflict(c, rc, res.current_revision);
	resp->first_seq = res.first_seq;
	resp->last_seq = res.last_seq;
	resp->revision = res.revision;
	resp->n_token_estimates = b->n;
	resp->token_estimates = b->tokens;
	resp->replayed = res.replayed != 0;
	/* Automatic compaction checks off the request path (no I/O here). */
	if (!res.replayed)
		histd_context_after_append(c->s->cfg.context, c->s->d,
					   c->tenant, r->session_id);
	return 0;
}

static int
h_append(call *c, void *msg)
{
	Histd__V1__AppendResponse resp = HISTD__V1__APPEND_RESPONSE__INIT;
	const Histd__V1__AppendRequest *r = msg;
	size_t room = pending_room(c->tenant, r->session_id, r->n_messages);
	struct pending *p = NULL;
	batch b;
	int rc;

	/* Without memory for it, the driver blocks as it would anyway. */
	if (c->reply->finish && (p = calloc(1, sizeof(*p) + room))) {
		p->room_len = room;
		atomic_init(&p->left, 2);
		p->finish = c->reply->finish;
		p->finish_ctx = c->reply->finish_ctx;
		c->pending = p;
	}
	rc = append_messages(c, msg, &resp, &b);
	if (rc == 0 && !(p && p->with_result))
		rc = reply_pack(&resp.base, c->reply);
	batch_free(&b);
	if (!p)
		return rc;
	if (!c->deferred) {
		free(p);
		return rc;
	}
	/* The driver reports durability to p: the answer goes from there. */
	if (rc) {
		p->pack_rc = rc;
		snprintf(p->pack_msg, sizeof(p->pack_msg), "%s",
			 histd_error_message());
	}
	p->data = c->reply->data;
	p->len = c->reply->len;
	c->reply->data = NULL;
	c->reply->len = 0;
	c->reply->deferred = 1;
	pending_release(p);
	return 0;
}

/* What follows the messages of a GetMessagesResponse, at most: three
 * varint fields and a bool. */
#define TAIL_MAX (3 * (1 + HISTD_WIRE_VARINT_MAX) + 2)

/*
 * RAW: the stored records spliced into the response as they are, never
 * unpacked: each record is already a packed Message with its seq, so the
 * response is field 1 around each, then next_after_seq (2), revision (3)
 * and token_estimate (5) as varints, and truncated (6).
 */
static int
get_messages_raw(call *c, const Histd__V1__GetMessagesRequest *r)
{
	const histd_service_config *cfg = &c->s->cfg;
	histd_read q = { .tenant = c->tenant, .session_id = r->session_id,
			 .frame_field = 1, .frame_slack = TAIL_MAX,
			 .max_bytes = cfg->max_response_bytes };
	histd_read_result res = { 0 };
	uint64_t tokens = 0, next = 0;
	size_t size = 0, o = 0, first, end;
	uint8_t *buf = NULL;
	int truncated, rc;

	if (r->last_n) {
		/* Above the page size, one more than a page (never past
		 * UINT32_MAX: last_n is above it) says whether older
		 * messages are stored, for truncated; it is not sent. */
		q.last_n = r->last_n <= cfg->max_page_size
			 ? r->last_n : cfg->max_page_size + 1;
	} else {
		q.after_seq = r->after_seq;
		q.limit = r->limit ? min_u32(r->limit, cfg->max_page_size)
				   : min_u32(DEFAULT_PAGE, cfg->max_page_size);
	}
	if ((rc = histd_driver_read(c->s->d, &q, &res)))
		return rc;
	/* Keep the response within max_response_bytes, what clients accept:
	 * a page ends early and goes on at next_after_seq; last_n keeps the
	 * newest messages that fit. At least one message always goes. */
	first = r->last_n && res.records.n > cfg->max_page_size
		? res.records.n - cfg->max_page_size : 0;
	end = res.records.n;
	for (size_t k = 0; k < res.records.n - first; k++) {
		size_t i = r->last_n ? res.records.n - 1 - k : k;
		const histd_record *rec = &res.records.v[i];
		size_t one = 1 + histd_wire_varint_size(rec->len) + rec->len;

		if (k > 0 && size + one > cfg->max_response_bytes) {
			if (r->last_n)
				first = i + 1;
			else
				end = i;
			break;
		}
		size += one;
		tokens += rec->token_estimate;
	}
	if ((res.has_more || end < res.records.n) && end > first &&
	    !r->last_n)
		next = res.records.v[end - 1].seq;
	/* has_more with last_n: older ones the driver's budget left out. */
	truncated = r->last_n && (first > 0 || res.has_more);
	/* All of it, framed by the driver: sent as it is. */
	if (first == 0 && end == res.records.n)
		buf = histd_records_take_wire(&res.records, TAIL_MAX, &o);
	if (!buf) {
		o = 0;
		if (!(buf = malloc(size + TAIL_MAX))) {
			rc = enomem();
			goto out;
		}
		for (size_t i = first; i < end; i++) {
			const histd_record *rec = &res.records.v[i];

			o += histd_wire_put_len_key(buf + o, 1, rec->len);
			memcpy(buf + o, rec->data, rec->len);
			o += rec->len;
		}
	}
	/* proto3: zero values are not written. */
	if (next) {
		buf[o++] = 2 << 3;
		o += histd_wire_put_varint(buf + o, next);
	}
	if (res.revision) {
		buf[o++] = 3 << 3;
		o += histd_wire_put_varint(buf + o, res.revision);
	}
	if (tokens) {
		buf[o++] = 5 << 3;
		o += histd_wire_put_varint(buf + o, tokens);
	}
	if (truncated) {
		buf[o++] = 6 << 3;
		buf[o++] = 1;
	}
	c->reply->data = buf;
	c->reply->len = o;
out:
	histd_read_result_clear(&res);
	return rc;
}

/*
 * CONTEXT: the session's pipeline applied at read time (server/context.h):
 * system messages, the summary, then the transformed messages.
 */
static int
get_messages_context(call *c, const Histd__V1__GetMessagesRequest *r)
{
	return histd_context_get_messages(c->s->cfg.context, c->s->d,
					  c->tenant, r,
					  c->s->cfg.max_response_bytes,
					  &c->reply->data, &c->reply->len);
}

static int
h_get_messages(call *c, void *msg)
{
	Histd__V1__GetMessagesRequest *r = msg;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	switch (r->view) {
	case HISTD__V1__VIEW__VIEW_UNSPECIFIED:
	case HISTD__V1__VIEW__VIEW_RAW:
		return get_messages_raw(c, r);
	case HISTD__V1__VIEW__VIEW_CONTEXT:
		return get_messages_context(c, r);
	default:
		return histd_error_set(HISTD_EINVALID,
				       "view is not a known View");
	}
}

static int
h_get_tool_result(call *c, void *msg)
{
	Histd__V1__GetToolResultRequest *r = msg;
	Histd__V1__GetToolResultResponse resp =
		HISTD__V1__GET_TOOL_RESULT_RESPONSE__INIT;
	Histd__V1__Message *m = NULL;
	histd_record *rec = NULL;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (!r->tool_call_id[0])
		return histd_error_set(HISTD_EINVALID,
				       "tool_call_id is required");
	/* No stored call has a longer id: say so, not NOT_FOUND. */
	if (strlen(r->tool_call_id) > TOOL_ID_MAX)
		return histd_error_set(HISTD_EINVALID,
				       "tool_call_id is %zu bytes; the limit is %d",
				       strlen(r->tool_call_id), TOOL_ID_MAX);
	if ((rc = histd_driver_tool_result(c->s->d, c->tenant, r->session_id,
					   r->tool_call_id, &rec)))
		return rc;
	if ((rc = histd_unpack_stored(&histd__v1__message__descriptor, NULL,
				      rec->data, rec->len, &m,
				      "the stored message at seq %" PRIu64,
				      rec->seq)))
		goto out;
	for (size_t j = 0; j < m->n_content && !resp.result; j++) {
		Histd__V1__ContentBlock *b = m->content[j];

		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
		    !strcmp(b->tool_result->tool_call_id, r->tool_call_id))
			resp.result = b->tool_result;
	}
	if (!resp.result) {
		rc = histd_error_set(HISTD_ECORRUPT,
			"the stored message at seq %" PRIu64 " holds no result "
			"for tool_call_id", rec->seq);
		goto out;
	}
	resp.seq = rec->seq;
	resp.message = m;
	rc = reply_pack(&resp.base, c->reply);
out:
	if (m)
		histd__v1__message__free_unpacked(m, NULL);
	histd_record_free(rec);
	return rc;
}

static int
h_clear(call *c, void *msg)
{
	Histd__V1__ClearRequest *r = msg;
	Histd__V1__ClearResponse resp = HISTD__V1__CLEAR_RESPONSE__INIT;
	uint64_t current = 0;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	rc = histd_driver_clear(c->s->d, c->tenant, r->session_id,
				r->expected_revision, &resp.revision,
				&resp.cleared_to_seq, &current);
	if (rc)
		return conflict(c, rc, current);
	return reply_pack(&resp.base, c->reply);
}

static int
h_replace(call *c, void *msg)
{
	Histd__V1__ReplaceRequest *r = msg;
	Histd__V1__ReplaceResponse resp = HISTD__V1__REPLACE_RESPONSE__INIT;
	const histd_service_config *cfg = &c->s->cfg;
	histd_append a = { .tenant = c->tenant };
	histd_append_result res = { 0 };
	uint64_t cleared = 0;
	batch b;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (r->n_messages > cfg->max_messages_per_append)
		return histd_error_set(HISTD_ELIMIT,
			"messages holds %zu messages; the limit is %" PRIu32,
			r->n_messages, cfg->max_messages_per_append);
	if ((rc = batch_build(cfg, c->alloc, r->messages, r->n_messages, &b)))
		return rc;
	a.session_id = r->session_id;
	a.expected_revision = r->expected_revision;
	a.now_us = histd_now_us();
	a.msgs = b.in;
	a.n_msgs = b.n;
	if ((rc = histd_driver_replace(c->s->d, &a, &res, &cleared))) {
		rc = conflict(c, rc, res.current_revision);
		goto out;
	}
	resp.revision = res.revision;
	resp.first_seq = res.first_seq;
	resp.last_seq = res.last_seq;
	rc = reply_pack(&resp.base, c->reply);
out:
	batch_free(&b);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Calls that wait on a provider                                           */

/*
 * Reduce, and Search in SEMANTIC or HYBRID mode, may wait on a provider
 * (a summary, a query embedding) for as long as its timeout allows. On the
 * transport's queue threads, a few of them against a stuck provider would
 * stall every other call. When the transport takes deferred answers, such
 * a call is queued here instead, run again on one of the service's own
 * threads (started as needed, at most cfg.provider_call_threads), and
 * answered from there.
 */
static void
slow_run(histd_service *s, struct slow_job *j)
{
	/* The deadline goes on with the call; finish stays NULL: it runs
	 * here, it is not queued again. */
	histd_reply r = { .deadline_us = j->deadline_us };
	histd_caller who = { j->tenant, j->read_only };
	int rc;

	histd_error_clear();
	if (j->deadline_us && histd_mono_us() >= j->deadline_us)
		rc = histd_error_set(HISTD_EDEADLINE, "the deadline passed "
				     "while the call waited for a provider-call "
				     "thread");
	else
		rc = histd_service_unary(s, j->m, &who, j->req, j->len, &r);
	if (rc)
		j->finish(j->finish_ctx, rc, NULL, 0, histd_error_message(), 0);
	else
		j->finish(j->finish_ctx, 0, r.data, r.len, "", 0);
	free(j);
}

static void *
slow_main(void *arg)
{
	histd_service *s = arg;

	pthread_mutex_lock(&s->slow_mu);
	for (;;) {
		struct slow_job *j;

		while (!s->slow_head && !s->slow_stop) {
			s->idle_slow++;
			pthread_cond_wait(&s->slow_cv, &s->slow_mu);
			s->idle_slow--;
		}
		if (!(j = s->slow_head))
			break;
		if (!(s->slow_head = j->next))
			s->slow_tail = &s->slow_head;
		s->slow_queued--;
		pthread_mutex_unlock(&s->slow_mu);
		slow_run(s, j);
		pthread_mutex_lock(&s->slow_mu);
	}
	pthread_mutex_unlock(&s->slow_mu);
	return NULL;
}

/*
 * Queues the call for a provider-call thread: 1 if it was (the answer is
 * deferred), 0 if it runs here (no deferred answers, no threads
 * configured, or no memory or thread for it).
 */
static int
offload(call *c)
{
	histd_service *s = c->s;
	size_t tlen = strlen(c->tenant) + 1;
	struct slow_job *j;

	if (!c->reply->finish || !s->cfg.provider_call_threads)
		return 0;
	if (!(j = malloc(sizeof(*j) + c->raw_len + tlen)))
		return 0;
	j->next = NULL;
	j->m = c->m;
	j->read_only = c->read_only;
	j->deadline_us = c->reply->deadline_us;
	j->finish = c->reply->finish;
	j->finish_ctx = c->reply->finish_ctx;
	j->len = c->raw_len;
	memcpy(j->req, c->raw, c->raw_len);
	j->tenant = (char *)j->req + c->raw_len;
	memcpy(j->tenant, c->tenant, tlen);

	pthread_mutex_lock(&s->slow_mu);
	/* One more thread when none is idle for it, up to the limit. */
	if (!s->slow_stop && s->slow_queued >= s->idle_slow &&
	    s->n_slow < s->cfg.provider_call_threads &&
	    pthread_create(&s->slow_threads[s->n_slow], NULL, slow_main,
			   s) == 0)
		s->n_slow++;
	if (s->slow_stop || s->n_slow == 0) {
		pthread_mutex_unlock(&s->slow_mu);
		free(j);
		return 0;
	}
	*s->slow_tail = j;
	s->slow_tail = &j->next;
	s->slow_queued++;
	pthread_cond_signal(&s->slow_cv);
	pthread_mutex_unlock(&s->slow_mu);
	c->reply->deferred = 1;
	return 1;
}

/* Reduce: compaction now (server/context.h). */
static int
h_reduce(call *c, void *msg)
{
	Histd__V1__ReduceRequest *r = msg;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (offload(c))
		return 0;
	return histd_context_reduce(c->s->cfg.context, c->s->d, c->tenant, r,
				    &c->reply->data, &c->reply->len);
}

/* Export: the session as a provider's request body. RAW is every stored
 * message; CONTEXT is what the pipeline gives (the summary is already its
 * first user message). */
static int
h_export(call *c, void *msg)
{
	Histd__V1__ExportRequest *r = msg;
	Histd__V1__GetMessagesRequest q = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__GetMessagesResponse *view;
	uint8_t *bytes = NULL;
	size_t len = 0, max = c->s->cfg.max_response_bytes;
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")) ||
	    (rc = histd_transcript_check_request(r)))
		return rc;
	if (r->view != HISTD__V1__VIEW__VIEW_CONTEXT) {
		rc = histd_transcript_export(c->s->d, c->tenant, r, max,
					     &c->reply->data, &c->reply->len);
		goto out;
	}
	q.session_id = r->session_id;
	q.view = HISTD__V1__VIEW__VIEW_CONTEXT;
	/* The whole view: an export is one body, not a page. */
	if ((rc = histd_context_get_messages(c->s->cfg.context, c->s->d,
					     c->tenant, &q, UINT32_MAX,
					     &bytes, &len)))
		return rc;
	if (len / 2 > max) {
		free(bytes);
		return histd_transcript_too_large(max * 2, 1, max);
	}
	view = histd__v1__get_messages_response__unpack(NULL, len, bytes);
	free(bytes);
	if (!view)
		return histd_error_set(HISTD_EINTERNAL, "the CONTEXT view does "
				       "not decode");
	rc = histd_transcript_export_messages(r->format, view->messages,
					      view->n_messages, NULL,
					      &c->reply->data, &c->reply->len);
	histd__v1__get_messages_response__free_unpacked(view, NULL);
out:
	/* What clients take in one answer, as for a GetMessages page. */
	if (rc == 0 && c->reply->len > max) {
		rc = histd_transcript_too_large(c->reply->len, 0, max);
		free(c->reply->data);
		c->reply->data = NULL;
		c->reply->len = 0;
	}
	return rc;
}

/*
 * An Import with an idempotency key whose body no longer converts: a
 * Gemini response without an id answered a call that the first attempt's
 * own messages now answer. Asks the driver whether the key was applied,
 * with an append that cannot apply (a revision no session has: the key
 * check comes first); if so, converts the body against the session as
 * the first attempt saw it, before its first seq, and goes on as a retry
 * does. Otherwise (or if that fails too) the first error stands.
 */
static int
import_retry(call *c, const Histd__V1__ImportRequest *r,
	     const histd_transcript_limits *lim, histd_transcript *t, int rc)
{
	Histd__V1__AppendRequest a = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__AppendResponse resp = HISTD__V1__APPEND_RESPONSE__INIT;
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT, *mp = &m;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__TextBlock text = HISTD__V1__TEXT_BLOCK__INIT;
	char why[512];
	batch probe;
	int prc;

	if (rc != HISTD_EINVALID || !r->idempotency_key[0])
		return rc;
	snprintf(why, sizeof(why), "%s", histd_error_message());
	text.text = "probe";
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &text;
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.n_content = 1;
	m.content = &bp;
	a.session_id = r->session_id;
	a.n_messages = 1;
	a.messages = &mp;
	a.expected_revision = UINT64_MAX;
	a.idempotency_key = r->idempotency_key;
	prc = append_messages(c, &a, &resp, &probe);
	batch_free(&probe);
	c->reply->current_revision = 0;
	if (prc == HISTD_EPRECONDITION)
		return prc;
	if (prc == 0 && resp.replayed && resp.first_seq &&
	    histd_transcript_import_before(c->s->d, c->tenant, r, lim,
					   resp.first_seq, t) == 0)
		return 0;
	return histd_error_set(rc, "%s", why);
}

/* Import: a provider's transcript appended exactly as Append would. */
static int
h_import(call *c, void *msg)
{
	Histd__V1__ImportRequest *r = msg;
	Histd__V1__AppendRequest a = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__AppendResponse resp = HISTD__V1__APPEND_RESPONSE__INIT;
	histd_transcript_limits lim;
	histd_transcript t = { 0 };
	batch b = { 0 };
	int rc;

	if ((rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	histd_transcript_limits_default(&lim);
	/* A string may be the base64 of bytes that fit a stored message;
	 * the message itself is checked as Append checks it. */
	lim.max_string_bytes = (size_t)c->s->cfg.max_message_bytes / 3 * 4 + 4;
	lim.max_messages = c->s->cfg.max_messages_per_append;
	rc = histd_transcript_import(c->s->d, c->tenant, r, &lim, &t);
	if (rc && (rc = import_retry(c, r, &lim, &t, rc)))
		return rc;
	a.session_id = r->session_id;
	a.messages = t.messages;
	a.n_messages = t.n_messages;
	a.expected_revision = r->expected_revision;
	a.idempotency_key = r->idempotency_key;
	rc = append_messages(c, &a, &resp, &b);
	if (rc)
		rc = histd_transcript_import_error(&t, rc);
	else
		rc = histd_transcript_import_reply(&resp, &t, &c->reply->data,
						   &c->reply->len);
	batch_free(&b);
	histd_transcript_clear(&t);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Dispatch                                                                */

typedef int (*handler_fn)(call *c, void *msg);

/* Search lives in server/search.c; the driver and tenant are the call's. */
static int
h_search(call *c, void *msg)
{
	Histd__V1__SearchRequest *r = msg;

	if ((r->mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC ||
	     r->mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID) &&
	    offload(c))
		return 0;
	return histd_search_rpc(c->s->d, c->tenant, msg, c->reply->deadline_us,
				c->alloc, &c->reply->data, &c->reply->len);
}

static const struct method_def {
	const ProtobufCMessageDescriptor *request;
	handler_fn fn;
} methods[HISTD_M_COUNT] = {
	[HISTD_M_CREATE_SESSION] = {
		&histd__v1__create_session_request__descriptor,
		h_create_session },
	[HISTD_M_RESOLVE_SESSION] = {
		&histd__v1__resolve_session_request__descriptor,
		h_resolve_session },
	[HISTD_M_GET_SESSION] = {
		&histd__v1__get_session_request__descriptor, h_get_session },
	[HISTD_M_LIST_SESSIONS] = {
		&histd__v1__list_sessions_request__descriptor,
		h_list_sessions },
	[HISTD_M_UPDATE_SESSION] = {
		&histd__v1__update_session_request__descriptor,
		h_update_session },
	[HISTD_M_DELETE_SESSION] = {
		&histd__v1__delete_session_request__descriptor,
		h_delete_session },
	[HISTD_M_FORK_SESSION] = {
		&histd__v1__fork_session_request__descriptor,
		h_fork_session },
	[HISTD_M_APPEND] = {
		&histd__v1__append_request__descriptor, h_append },
	[HISTD_M_GET_MESSAGES] = {
		&histd__v1__get_messages_request__descriptor,
		h_get_messages },
	[HISTD_M_GET_TOOL_RESULT] = {
		&histd__v1__get_tool_result_request__descriptor,
		h_get_tool_result },
	[HISTD_M_CLEAR] = {
		&histd__v1__clear_request__descriptor, h_clear },
	[HISTD_M_REPLACE] = {
		&histd__v1__replace_request__descriptor, h_replace },
	[HISTD_M_REDUCE] = {
		&histd__v1__reduce_request__descriptor, h_reduce },
	[HISTD_M_EXPORT] = {
		&histd__v1__export_request__descriptor, h_export },
	[HISTD_M_IMPORT] = {
		&histd__v1__import_request__descriptor, h_import },
	[HISTD_M_SEARCH] = {
		&histd__v1__search_request__descriptor, h_search },
};

/*
 * A call-scoped arena for the unpacked request: protobuf-c allocates once
 * per message, string and array, and all of it goes at the end of the
 * call. A small request fits in the first block, on the stack.
 */
struct arena {
	unsigned char *cur, *end;
	void *chunks;                  /* malloc'ed blocks, linked */
	_Alignas(16) unsigned char first[8192];
};

static void *
arena_alloc(void *data, size_t size)
{
	struct arena *a = data;
	void *p;

	size = (size + 15) & ~(size_t)15;
	if ((size_t)(a->end - a->cur) < size) {
		size_t cap = size > 65536 ? size : 65536;
		void **chunk = malloc(2 * sizeof(void *) + cap);

		if (!chunk)
			return NULL;
		chunk[0] = a->chunks;
		a->chunks = chunk;
		a->cur = (unsigned char *)(chunk + 2);
		a->end = a->cur + cap;
	}
	p = a->cur;
	a->cur += size;
	return p;
}

static void
arena_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

static void
arena_release(struct arena *a)
{
	while (a->chunks) {
		void **chunk = a->chunks;

		a->chunks = chunk[0];
		free(chunk);
	}
}

/* The context pipeline remembers which sessions never compact; a write
 * that may change or replace a session's config tells it. */
static void
config_may_have_changed(histd_service *s, enum histd_method m,
			const char *tenant, const void *msg)
{
	const char *id = NULL;

	switch (m) {
	case HISTD_M_CREATE_SESSION:
		id = ((const Histd__V1__CreateSessionRequest *)msg)->session_id;
		break;
	case HISTD_M_UPDATE_SESSION:
		id = ((const Histd__V1__UpdateSessionRequest *)msg)->session_id;
		break;
	case HISTD_M_DELETE_SESSION:
		id = ((const Histd__V1__DeleteSessionRequest *)msg)->session_id;
		break;
	case HISTD_M_FORK_SESSION:
		id = ((const Histd__V1__ForkSessionRequest *)msg)->new_session_id;
		break;
	default:
		return;
	}
	if (id && *id)
		histd_context_config_changed(s->cfg.context, tenant, id);
}

int
histd_service_unary(histd_service *s, enum histd_method m,
		    const histd_caller *who, const uint8_t *req, size_t len,
		    histd_reply *reply)
{
	ProtobufCMessage *msg;
	struct arena arena;
	ProtobufCAllocator alloc = { arena_alloc, arena_free, &arena };
	call c;
	int rc;

	arena.cur = arena.first;
	arena.end = arena.first + sizeof(arena.first);
	arena.chunks = NULL;
	reply->data = NULL;
	reply->len = 0;
	reply->current_revision = 0;
	reply->deferred = 0;
	if ((unsigned)m >= HISTD_M_COUNT || !methods[m].fn)
		return histd_error_set(HISTD_EINTERNAL,
				       "not a unary method of the service");
	/* The transport always names a tenant (a default one without auth);
	 * without one every lookup would be unscoped. */
	if (!who || !who->tenant || !who->tenant[0])
		return histd_error_set(HISTD_EINTERNAL,
				       "the caller has no tenant");
	if (who->read_only && histd_method_writes(m))
		return histd_error_set(HISTD_EPERM,
			"%s needs write access; the caller is read-only",
			histd_method_names[m]);
	if ((rc = histd_check_request_bytes(methods[m].request, req, len)))
		return rc;
	msg = protobuf_c_message_unpack(methods[m].request, &alloc, len,
					len ? req : (const uint8_t *)"");
	if (!msg) {
		arena_release(&arena);
		return histd_error_set(HISTD_EINVALID,
				       "request does not decode as %s",
				       methods[m].request->name);
	}
	if ((rc = check_request_strings(msg)))
		goto out;
	c.s = s;
	c.m = m;
	c.tenant = who->tenant;
	c.raw = req;
	c.raw_len = len;
	c.reply = reply;
	c.alloc = &alloc;
	c.read_only = who->read_only;
	c.pending = NULL;
	c.deferred = 0;
	rc = methods[m].fn(&c, msg);
	/* Also after a failure: the driver may have applied the write
	 * before its answer failed (out of memory packing it), and telling
	 * the context too often costs only a cache entry. */
	config_may_have_changed(s, m, who->tenant, msg);
	if (rc) {
		/* Set only on success, as service.h promises. */
		free(reply->data);
		reply->data = NULL;
		reply->len = 0;
	}
out:
	arena_release(&arena);
	return rc;
}
