/* protobuf-c <-> JSON for histctl: see pbjson.h for the mapping. */
#include "pbjson.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MEMBER(type, msg, off) (*(type *)((char *)(msg) + (off)))

static const char TIMESTAMP[] = "google.protobuf.Timestamp";

/* ------------------------------------------------------------------------
 * Small helpers */

static size_t elt_size(ProtobufCType t)
{
	switch (t) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_UINT32:
	case PROTOBUF_C_TYPE_FIXED32: case PROTOBUF_C_TYPE_ENUM:
		return 4;
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_FIXED64:
		return 8;
	case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
	case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
	case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
	case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
	case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
	case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
	}
	return 0;
}

/* protoc-c gives map<K,V> as a repeated nested "...Entry" message. */
static int is_map_entry(const ProtobufCMessageDescriptor *d)
{
	size_t n = strlen(d->name);
	return d->n_fields == 2 && n > 5 && strcmp(d->name + n - 5, "Entry") == 0 &&
	       protobuf_c_message_descriptor_get_field_by_name(d, "key") &&
	       protobuf_c_message_descriptor_get_field_by_name(d, "value");
}

static const char b64[] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const uint8_t *p, size_t n)
{
	char *out = malloc(4 * ((n + 2) / 3) + 1), *o = out;
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)p[i] << 16;
		if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
		if (i + 2 < n) v |= p[i + 2];
		*o++ = b64[v >> 18 & 63];
		*o++ = b64[v >> 12 & 63];
		*o++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
		*o++ = i + 2 < n ? b64[v & 63] : '=';
	}
	*o = 0;
	return out;
}

/* Standard or URL-safe alphabet, padding optional. -1 on a bad character. */
static int b64_decode(const char *s, uint8_t **out, size_t *outlen)
{
	size_t n = strlen(s), k = 0;
	uint8_t *buf = malloc(n / 4 * 3 + 3);
	uint32_t acc = 0;
	int bits = 0;
	if (!buf)
		return -1;
	for (; *s && *s != '='; s++) {
		int v;
		if (*s >= 'A' && *s <= 'Z') v = *s - 'A';
		else if (*s >= 'a' && *s <= 'z') v = *s - 'a' + 26;
		else if (*s >= '0' && *s <= '9') v = *s - '0' + 52;
		else if (*s == '+' || *s == '-') v = 62;
		else if (*s == '/' || *s == '_') v = 63;
		else { free(buf); return -1; }
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			buf[k++] = (uint8_t)(acc >> bits);
		}
	}
	*out = buf;
	*outlen = k;
	return 0;
}

/* The prefix every value name of an enum shares, up to and including its
 * last '_' ("ROLE_"); its length, 0 when there is none. */
static size_t enum_prefix(const ProtobufCEnumDescriptor *d)
{
	size_t len;
	if (d->n_values == 0)
		return 0;
	len = strlen(d->values[0].name);
	for (unsigned i = 1; i < d->n_values; i++) {
		size_t j = 0;
		while (j < len && d->values[i].name[j] == d->values[0].name[j])
			j++;
		len = j;
	}
	while (len > 0 && d->values[0].name[len - 1] != '_')
		len--;
	return len;
}

int histctl_enum_parse(const ProtobufCEnumDescriptor *d, const char *text,
		       int *value)
{
	char norm[128], full[256];
	const ProtobufCEnumValue *v;
	size_t i, pre = enum_prefix(d);
	char *end;
	long num;

	if (!text || !*text || strlen(text) >= sizeof norm)
		return -1;
	for (i = 0; text[i]; i++)
		norm[i] = text[i] == '-' ? '_' : (char)toupper((unsigned char)text[i]);
	norm[i] = 0;
	v = protobuf_c_enum_descriptor_get_value_by_name(d, norm);
	if (!v && pre > 0) {
		snprintf(full, sizeof full, "%.*s%s", (int)pre, d->values[0].name, norm);
		v = protobuf_c_enum_descriptor_get_value_by_name(d, full);
	}
	if (v) {
		*value = v->value;
		return 0;
	}
	errno = 0;
	num = strtol(text, &end, 10);
	if (errno || *end || end == text || !protobuf_c_enum_descriptor_get_value(d, (int)num))
		return -1;
	*value = (int)num;
	return 0;
}

const char *histctl_enum_short(const ProtobufCEnumDescriptor *d, int value,
			       char *buf, size_t buflen)
{
	const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(d, value);
	size_t i, pre = enum_prefix(d);
	const char *s;
	if (!v) {
		snprintf(buf, buflen, "?");
		return buf;
	}
	s = v->name + pre;
	for (i = 0; s[i] && i + 1 < buflen; i++)
		buf[i] = (char)tolower((unsigned char)s[i]);
	buf[i] = 0;
	return buf;
}

/* ------------------------------------------------------------------------
 * Timestamps */

static json_t *timestamp_to_json(const ProtobufCMessage *m)
{
	const ProtobufCMessageDescriptor *d = m->descriptor;
	const ProtobufCFieldDescriptor *fs = protobuf_c_message_descriptor_get_field_by_name(d, "seconds");
	const ProtobufCFieldDescriptor *fn = protobuf_c_message_descriptor_get_field_by_name(d, "nanos");
	time_t sec = (time_t)MEMBER(int64_t, m, fs->offset);
	int32_t nanos = MEMBER(int32_t, m, fn->offset);
	struct tm tm;
	char buf[64];
	size_t n;

	if (!gmtime_r(&sec, &tm))
		return json_string("invalid");
	n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
	if (nanos > 0 && nanos < 1000000000) {
		if (nanos % 1000000 == 0)
			n += (size_t)snprintf(buf + n, sizeof buf - n, ".%03d", nanos / 1000000);
		else if (nanos % 1000 == 0)
			n += (size_t)snprintf(buf + n, sizeof buf - n, ".%06d", nanos / 1000);
		else
			n += (size_t)snprintf(buf + n, sizeof buf - n, ".%09d", nanos);
	}
	snprintf(buf + n, sizeof buf - n, "Z");
	return json_string(buf);
}

/* "2024-05-01T12:00:00[.fff]Z" or with a +hh:mm / -hh:mm offset. */
static int timestamp_parse(const char *s, int64_t *sec, int32_t *nanos)
{
	struct tm tm = {0};
	int used = 0, oh = 0, om = 0;
	long long ns = 0;
	time_t t;

	if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon,
		   &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &used) != 6)
		return -1;
	s += used;
	if (*s == '.') {
		int digits = 0;
		for (s++; isdigit((unsigned char)*s); s++, digits++)
			if (digits < 9)
				ns = ns * 10 + (*s - '0');
		if (digits == 0)
			return -1;
		for (; digits < 9; digits++)
			ns *= 10;
	}
	if (*s == 'Z' || *s == 'z') {
		s++;
	} else if ((*s == '+' || *s == '-') &&
		   sscanf(s + 1, "%2d:%2d%n", &oh, &om, &used) == 2) {
		int sign = *s == '-' ? -1 : 1;
		oh *= sign;
		om *= sign;
		s += 1 + used;
	} else {
		return -1;
	}
	if (*s)
		return -1;
	tm.tm_year -= 1900;
	tm.tm_mon -= 1;
	t = timegm(&tm);
	*sec = (int64_t)t - oh * 3600 - om * 60;
	*nanos = (int32_t)ns;
	return 0;
}

/* ------------------------------------------------------------------------
 * Encoding */

static json_t *value_to_json(const ProtobufCFieldDescriptor *f, const void *p)
{
	char buf[32];
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		return json_integer(*(const int32_t *)p);
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
		return json_integer(*(const uint32_t *)p);
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		snprintf(buf, sizeof buf, "%" PRId64, *(const int64_t *)p);
		return json_string(buf);
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
		snprintf(buf, sizeof buf, "%" PRIu64, *(const uint64_t *)p);
		return json_string(buf);
	case PROTOBUF_C_TYPE_FLOAT:
		return json_real(*(const float *)p);
	case PROTOBUF_C_TYPE_DOUBLE:
		return json_real(*(const double *)p);
	case PROTOBUF_C_TYPE_BOOL:
		return json_boolean(*(const protobuf_c_boolean *)p);
	case PROTOBUF_C_TYPE_ENUM: {
		const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
			f->descriptor, *(const int *)p);
		return v ? json_string(v->name) : json_integer(*(const int *)p);
	}
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		/* Invalid UTF-8 from a peer is shown, not dropped. */
		return json_stringn_nocheck(s ? s : "", s ? strlen(s) : 0);
	}
	case PROTOBUF_C_TYPE_BYTES: {
		const ProtobufCBinaryData *b = p;
		char *s = b64_encode(b->data, b->len);
		json_t *j = s ? json_string(s) : NULL;
		free(s);
		return j;
	}
	case PROTOBUF_C_TYPE_MESSAGE: {
		const ProtobufCMessage *m = *(ProtobufCMessage *const *)p;
		return m ? histctl_pb_to_json(m) : json_null();
	}
	}
	return json_null();
}

/* Whether a singular proto3 field holds its default (and is left out). */
static int is_default(const ProtobufCFieldDescriptor *f, const void *p)
{
	switch (f->type) {
	case PROTOBUF_C_TYPE_STRING: {
		const char *s = *(char *const *)p;
		return !s || !*s;
	}
	case PROTOBUF_C_TYPE_BYTES:
		return ((const ProtobufCBinaryData *)p)->len == 0;
	case PROTOBUF_C_TYPE_MESSAGE:
		return *(ProtobufCMessage *const *)p == NULL;
	case PROTOBUF_C_TYPE_FLOAT:
		return *(const float *)p == 0;
	case PROTOBUF_C_TYPE_DOUBLE:
		return *(const double *)p == 0;
	default: {
		size_t n = elt_size(f->type);
		const uint8_t *b = p;
		for (size_t i = 0; i < n; i++)
			if (b[i])
				return 0;
		return 1;
	}
	}
}

static json_t *map_to_json(const ProtobufCFieldDescriptor *f,
			   ProtobufCMessage *const *entries, size_t n)
{
	const ProtobufCMessageDescriptor *ed = f->descriptor;
	const ProtobufCFieldDescriptor *kf = protobuf_c_message_descriptor_get_field_by_name(ed, "key");
	const ProtobufCFieldDescriptor *vf = protobuf_c_message_descriptor_get_field_by_name(ed, "value");
	json_t *obj = json_object();
	if (!obj)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		const char *key;
		json_t *k = value_to_json(kf, (const char *)entries[i] + kf->offset);
		char buf[32];
		if (!k)
			goto fail;
		if (json_is_string(k)) {
			key = json_string_value(k);
		} else {
			snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(k));
			key = buf;
		}
		if (json_object_set_new_nocheck(obj, key,
				value_to_json(vf, (const char *)entries[i] + vf->offset)) < 0) {
			json_decref(k);
			goto fail;
		}
		json_decref(k);
	}
	return obj;
fail:
	json_decref(obj);
	return NULL;
}

json_t *histctl_pb_to_json(const ProtobufCMessage *msg)
{
	const ProtobufCMessageDescriptor *d = msg->descriptor;
	json_t *obj;

	if (strcmp(d->name, TIMESTAMP) == 0)
		return timestamp_to_json(msg);
	obj = json_object();
	if (!obj)
		return NULL;
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *f = &d->fields[i];
		const void *p = (const char *)msg + f->offset;
		json_t *v;

		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			size_t n = MEMBER(size_t, msg, f->quantifier_offset);
			const char *arr = *(char *const *)p;
			if (n == 0)
				continue;
			if (f->type == PROTOBUF_C_TYPE_MESSAGE && is_map_entry(f->descriptor)) {
				v = map_to_json(f, (ProtobufCMessage *const *)arr, n);
			} else {
				v = json_array();
				for (size_t k = 0; v && k < n; k++)
					if (json_array_append_new(v, value_to_json(f, arr + k * elt_size(f->type))) < 0) {
						json_decref(v);
						v = NULL;
					}
			}
		} else {
			if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
				if (MEMBER(uint32_t, msg, f->quantifier_offset) != f->id)
					continue;
			} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
				   f->type != PROTOBUF_C_TYPE_MESSAGE &&
				   f->type != PROTOBUF_C_TYPE_STRING) {
				if (!MEMBER(protobuf_c_boolean, msg, f->quantifier_offset))
					continue;
			} else if (f->label == PROTOBUF_C_LABEL_NONE && is_default(f, p)) {
				continue;
			}
			v = value_to_json(f, p);
		}
		if (!v || json_object_set_new_nocheck(obj, f->name, v) < 0) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}

/* ------------------------------------------------------------------------
 * Decoding */

typedef struct decoder {
	char *err;
	size_t errlen;
} decoder;

static int fail(decoder *dc, const char *path, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(dc->err, dc->errlen, "%s: ", *path ? path : "(top)");
	if (n >= 0 && (size_t)n < dc->errlen) {
		va_start(ap, fmt);
		vsnprintf(dc->err + n, dc->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static int decode_message(decoder *dc, const ProtobufCMessageDescriptor *d,
			  const json_t *j, const char *path, ProtobufCMessage **out);

static int json_to_int(decoder *dc, const char *path, const json_t *j,
		       int is_signed, int64_t *s, uint64_t *u)
{
	if (json_is_integer(j)) {
		json_int_t v = json_integer_value(j);
		if (!is_signed && v < 0)
			return fail(dc, path, "must not be negative");
		*s = v;
		*u = (uint64_t)v;
		return 0;
	}
	if (json_is_string(j)) {
		const char *t = json_string_value(j);
		char *end;
		errno = 0;
		if (is_signed)
			*s = strtoll(t, &end, 10);
		else if (*t == '-')
			return fail(dc, path, "must not be negative");
		else
			*u = strtoull(t, &end, 10);
		if (errno || end == t || *end)
			return fail(dc, path, "not an integer");
		return 0;
	}
	return fail(dc, path, "expected an integer");
}

/* Decodes j into the storage of one value of field f at p. */
static int decode_value(decoder *dc, const ProtobufCFieldDescriptor *f,
			const json_t *j, const char *path, void *p)
{
	int64_t s = 0;
	uint64_t u = 0;

	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_SFIXED32:
		if (json_to_int(dc, path, j, 1, &s, &u) < 0)
			return -1;
		if (s < INT32_MIN || s > INT32_MAX)
			return fail(dc, path, "out of range");
		*(int32_t *)p = (int32_t)s;
		return 0;
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
		if (json_to_int(dc, path, j, 0, &s, &u) < 0)
			return -1;
		if (u > UINT32_MAX)
			return fail(dc, path, "out of range");
		*(uint32_t *)p = (uint32_t)u;
		return 0;
	case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64:
	case PROTOBUF_C_TYPE_SFIXED64:
		if (json_to_int(dc, path, j, 1, &s, &u) < 0)
			return -1;
		*(int64_t *)p = s;
		return 0;
	case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
		if (json_to_int(dc, path, j, 0, &s, &u) < 0)
			return -1;
		*(uint64_t *)p = u;
		return 0;
	case PROTOBUF_C_TYPE_FLOAT:
	case PROTOBUF_C_TYPE_DOUBLE:
		if (!json_is_number(j))
			return fail(dc, path, "expected a number");
		if (f->type == PROTOBUF_C_TYPE_FLOAT)
			*(float *)p = (float)json_number_value(j);
		else
			*(double *)p = json_number_value(j);
		return 0;
	case PROTOBUF_C_TYPE_BOOL:
		if (!json_is_boolean(j))
			return fail(dc, path, "expected true or false");
		*(protobuf_c_boolean *)p = json_is_true(j);
		return 0;
	case PROTOBUF_C_TYPE_ENUM: {
		int v;
		char num[32];
		const char *t = num;
		if (json_is_integer(j))
			snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
		else if (json_is_string(j))
			t = json_string_value(j);
		else
			return fail(dc, path, "expected an enum name");
		if (histctl_enum_parse(f->descriptor, t, &v) < 0)
			return fail(dc, path, "unknown value of %s",
				    ((const ProtobufCEnumDescriptor *)f->descriptor)->name);
		*(int *)p = v;
		return 0;
	}
	case PROTOBUF_C_TYPE_STRING: {
		char *dup;
		if (!json_is_string(j))
			return fail(dc, path, "expected a string");
		dup = malloc(json_string_length(j) + 1);
		if (!dup)
			return fail(dc, path, "out of memory");
		memcpy(dup, json_string_value(j), json_string_length(j) + 1);
		*(char **)p = dup;
		return 0;
	}
	case PROTOBUF_C_TYPE_BYTES: {
		ProtobufCBinaryData *b = p;
		if (!json_is_string(j))
			return fail(dc, path, "expected a base64 string");
		if (b64_decode(json_string_value(j), &b->data, &b->len) < 0)
			return fail(dc, path, "not base64");
		return 0;
	}
	case PROTOBUF_C_TYPE_MESSAGE:
		return decode_message(dc, f->descriptor, j, path, (ProtobufCMessage **)p);
	}
	return fail(dc, path, "unsupported field type");
}

static void join_path(char *buf, size_t n, const char *path, const char *name)
{
	snprintf(buf, n, "%.300s%s%.100s", path, *path ? "." : "", name);
}

static int decode_map(decoder *dc, const ProtobufCFieldDescriptor *f,
		      const json_t *j, const char *path, ProtobufCMessage *msg)
{
	const ProtobufCMessageDescriptor *ed = f->descriptor;
	const ProtobufCFieldDescriptor *kf = protobuf_c_message_descriptor_get_field_by_name(ed, "key");
	const ProtobufCFieldDescriptor *vf = protobuf_c_message_descriptor_get_field_by_name(ed, "value");
	ProtobufCMessage **arr;
	const char *key;
	json_t *val;
	char sub[512];

	if (!json_is_object(j))
		return fail(dc, path, "expected an object");
	if (json_object_size(j) == 0)
		return 0;
	arr = calloc(json_object_size(j), sizeof *arr);
	if (!arr)
		return fail(dc, path, "out of memory");
	MEMBER(ProtobufCMessage **, msg, f->offset) = arr;
	json_object_foreach((json_t *)j, key, val) {
		ProtobufCMessage *e = malloc(ed->sizeof_message);
		json_t *kj;
		int rc;
		if (!e)
			return fail(dc, path, "out of memory");
		protobuf_c_message_init(ed, e);
		arr[MEMBER(size_t, msg, f->quantifier_offset)++] = e;
		snprintf(sub, sizeof sub, "%.300s[\"%.100s\"]", path, key);
		kj = json_string(key);
		rc = kj ? decode_value(dc, kf, kj, sub, (char *)e + kf->offset) : -1;
		json_decref(kj);
		if (rc < 0 || decode_value(dc, vf, val, sub, (char *)e + vf->offset) < 0)
			return -1;
	}
	return 0;
}

static int decode_repeated(decoder *dc, const ProtobufCFieldDescriptor *f,
			   const json_t *j, const char *path, ProtobufCMessage *msg)
{
	size_t n, es = elt_size(f->type);
	char *arr;
	char sub[512];

	if (!json_is_array(j))
		return fail(dc, path, "expected an array");
	n = json_array_size(j);
	if (n == 0)
		return 0;
	arr = calloc(n, es);
	if (!arr)
		return fail(dc, path, "out of memory");
	MEMBER(char *, msg, f->offset) = arr;
	for (size_t i = 0; i < n; i++) {
		snprintf(sub, sizeof sub, "%.400s[%zu]", path, i);
		/* Counted first: the slot is zeroed, so freeing it is safe
		 * even if decoding it fails half way. */
		MEMBER(size_t, msg, f->quantifier_offset)++;
		if (decode_value(dc, f, json_array_get(j, i), sub, arr + i * es) < 0)
			return -1;
	}
	return 0;
}

/* lowerCamelCase -> snake_case, into buf. */
static void to_snake(const char *in, char *buf, size_t n)
{
	size_t k = 0;
	for (; *in && k + 2 < n; in++) {
		if (isupper((unsigned char)*in)) {
			buf[k++] = '_';
			buf[k++] = (char)tolower((unsigned char)*in);
		} else {
			buf[k++] = *in;
		}
	}
	buf[k] = 0;
}

static int decode_message(decoder *dc, const ProtobufCMessageDescriptor *d,
			  const json_t *j, const char *path, ProtobufCMessage **out)
{
	ProtobufCMessage *msg;
	const char *key;
	json_t *val;

	*out = NULL;
	msg = malloc(d->sizeof_message);
	if (!msg)
		return fail(dc, path, "out of memory");
	protobuf_c_message_init(d, msg);
	/* Stored before it is filled, so that the caller's free reaches
	 * whatever part was decoded when an error stops us. */
	*out = msg;

	if (strcmp(d->name, TIMESTAMP) == 0) {
		int64_t sec;
		int32_t nanos;
		if (!json_is_string(j) || timestamp_parse(json_string_value(j), &sec, &nanos) < 0)
			return fail(dc, path, "expected an RFC 3339 time like 2024-05-01T12:00:00Z");
		MEMBER(int64_t, msg, protobuf_c_message_descriptor_get_field_by_name(d, "seconds")->offset) = sec;
		MEMBER(int32_t, msg, protobuf_c_message_descriptor_get_field_by_name(d, "nanos")->offset) = nanos;
		return 0;
	}
	if (!json_is_object(j))
		return fail(dc, path, "expected an object");

	json_object_foreach((json_t *)j, key, val) {
		const ProtobufCFieldDescriptor *f;
		char name[256], sub[512];

		join_path(sub, sizeof sub, path, key);
		f = protobuf_c_message_descriptor_get_field_by_name(d, key);
		if (!f) {
			to_snake(key, name, sizeof name);
			f = protobuf_c_message_descriptor_get_field_by_name(d, name);
		}
		if (!f)
			return fail(dc, sub, "unknown field of %s", d->name);
		if (json_is_null(val))
			continue;
		if (f->label == PROTOBUF_C_LABEL_REPEATED) {
			int rc = f->type == PROTOBUF_C_TYPE_MESSAGE && is_map_entry(f->descriptor)
				 ? decode_map(dc, f, val, sub, msg)
				 : decode_repeated(dc, f, val, sub, msg);
			if (rc < 0)
				return -1;
			continue;
		}
		if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
			uint32_t *which = &MEMBER(uint32_t, msg, f->quantifier_offset);
			/* Members of a oneof share storage: a second one would
			 * overwrite (and leak) the first. */
			if (*which != 0)
				return fail(dc, sub, "only one member of a oneof may be set");
			*which = f->id;
		} else if (f->label == PROTOBUF_C_LABEL_OPTIONAL &&
			   f->type != PROTOBUF_C_TYPE_MESSAGE &&
			   f->type != PROTOBUF_C_TYPE_STRING) {
			MEMBER(protobuf_c_boolean, msg, f->quantifier_offset) = 1;
		}
		if (decode_value(dc, f, val, sub, (char *)msg + f->offset) < 0)
			return -1;
	}
	return 0;
}

int histctl_pb_from_json(const ProtobufCMessageDescriptor *desc,
			 const json_t *json, ProtobufCMessage **out,
			 char *err, size_t errlen)
{
	decoder dc = { err, errlen };
	if (decode_message(&dc, desc, json, "", out) < 0) {
		protobuf_c_message_free_unpacked(*out, NULL);
		*out = NULL;
		return -1;
	}
	return 0;
}
