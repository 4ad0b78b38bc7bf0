/*
 * Values between histd and rows: labels and context keys as jsonb (with
 * jansson), session rows, the columns stored beside a message (read from
 * its protobuf bytes without unpacking), and message records with their
 * seq in front (stored without it).
 */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "histd_wire.h"
#include "pg.h"

/* ---------------------------------------------------------------------- */
/* Text, labels and sessions                                               */

int
pg_utf8_ok(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;

	while (i < len) {
		unsigned char c = p[i];
		size_t n;
		uint32_t cp;

		if (c == 0)
			return 0;
		if (c < 0x80) {
			i++;
			continue;
		}
		if ((c & 0xe0) == 0xc0) {
			n = 1;
			cp = c & 0x1f;
		} else if ((c & 0xf0) == 0xe0) {
			n = 2;
			cp = c & 0x0f;
		} else if ((c & 0xf8) == 0xf0) {
			n = 3;
			cp = c & 0x07;
		} else {
			return 0;
		}
		if (len - i <= n)
			return 0;
		for (size_t k = 1; k <= n; k++) {
			if ((p[i + k] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (p[i + k] & 0x3f);
		}
		/* Overlong forms, surrogates, past U+10FFFF. */
		if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
		    (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		i += n + 1;
	}
	return 1;
}

int
pg_kv_json(const histd_kv *kv, size_t n, int null_if_empty, const char *field,
	   char **out)
{
	json_t *o;
	char *s;

	*out = NULL;
	if (n == 0 && null_if_empty)
		return 0;
	o = json_object();
	if (!o)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_string(kv[i].value);

		if (!v || json_object_set_new(o, kv[i].key, v) != 0) {
			json_decref(o);
			return histd_error_set(HISTD_EINVALID,
					       "%s[%zu] is not valid UTF-8", field, i);
		}
	}
	s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(o);
	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	*out = s;
	return 0;
}

static int
kv_cmp(const void *a, const void *b)
{
	return strcmp(((const histd_kv *)a)->key, ((const histd_kv *)b)->key);
}

/* A jsonb value in binary: a version byte, then its text. */
static int
json_kv(const PGresult *r, int row, int col, histd_kv **out, size_t *n_out)
{
	json_t *o, *v;
	const char *k;
	size_t len, n = 0;
	const char *p;
	histd_kv *kv;

	*out = NULL;
	*n_out = 0;
	if (pg_r_null(r, row, col))
		return 0;
	p = pg_r_str(r, row, col, &len);
	if (len < 1 || p[0] != 1)
		return histd_error_set(HISTD_ECORRUPT, "stored labels or context_keys "
				       "are not readable");
	o = json_loadb(p + 1, len - 1, 0, NULL);
	if (!o || !json_is_object(o)) {
		json_decref(o);
		return histd_error_set(HISTD_ECORRUPT, "stored labels or context_keys "
				       "are not a JSON object");
	}
	if (json_object_size(o) == 0) {
		json_decref(o);
		return 0;
	}
	kv = calloc(json_object_size(o), sizeof(*kv));
	if (!kv) {
		json_decref(o);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	json_object_foreach(o, k, v) {
		if (!json_is_string(v)) {
			histd_kv_free(kv, n);
			json_decref(o);
			return histd_error_set(HISTD_ECORRUPT, "stored labels or "
					       "context_keys hold a non-string value");
		}
		kv[n].key = strdup(k);
		kv[n].value = strdup(json_string_value(v));
		n++;
		if (!kv[n - 1].key || !kv[n - 1].value) {
			histd_kv_free(kv, n);
			json_decref(o);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
	}
	json_decref(o);
	/* jsonb orders keys by length first; histd by bytes. */
	qsort(kv, n, sizeof(*kv), kv_cmp);
	*out = kv;
	*n_out = n;
	return 0;
}

int
pg_row_session(const PGresult *r, int row, int col, histd_session **out,
	       int64_t *sid)
{
	histd_session *s = calloc(1, sizeof(*s));
	size_t len;
	const char *p;
	int rc;

	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (sid)
		*sid = pg_r_i64(r, row, col);
	/* A session created again under its id gets another sid. */
	s->incarnation = (uint64_t)pg_r_i64(r, row, col);
	s->tenant = strdup(pg_r_str(r, row, col + 1, NULL));
	s->id = strdup(pg_r_str(r, row, col + 2, NULL));
	if (!s->tenant || !s->id) {
		histd_session_free(s);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	if ((rc = json_kv(r, row, col + 3, &s->context_keys, &s->n_context_keys)) ||
	    (rc = json_kv(r, row, col + 4, &s->labels, &s->n_labels))) {
		histd_session_free(s);
		return rc;
	}
	if (!pg_r_null(r, row, col + 5)) {
		p = pg_r_str(r, row, col + 5, &len);
		if (len) {
			s->config = malloc(len);
			if (!s->config) {
				histd_session_free(s);
				return histd_error_set(HISTD_ENOMEM, "out of memory");
			}
			memcpy(s->config, p, len);
			s->config_len = len;
		}
	}
	s->created_at_us = pg_r_ts(r, row, col + 6);
	s->updated_at_us = pg_r_ts(r, row, col + 7);
	s->revision = (uint64_t)pg_r_i64(r, row, col + 8);
	s->last_seq = (uint64_t)pg_r_i64(r, row, col + 9);
	s->cleared_to_seq = (uint64_t)pg_r_i64(r, row, col + 10);
	s->message_count = (uint64_t)pg_r_i64(r, row, col + 11);
	s->token_total = (uint64_t)pg_r_i64(r, row, col + 12);
	s->bytes_total = (uint64_t)pg_r_i64(r, row, col + 13);
	s->first_seq = (uint64_t)pg_r_i64(r, row, col + 14);
	s->summary_count = (uint64_t)pg_r_i64(r, row, col + 15);
	s->active_at_us = pg_r_ts(r, row, col + 16);    /* NULL: 0, unknown */
	*out = s;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The columns stored beside a message                                     */

static int
varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t x = 0;

	for (int shift = 0; shift < 64 && *p < end; shift += 7) {
		uint8_t b = *(*p)++;

		x |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -1;
}

/* Skips a field of wire type wt; -1 if malformed or a group. */
static int
skip(const uint8_t **p, const uint8_t *end, unsigned wt)
{
	uint64_t v;

	switch (wt) {
	case 0:
		return varint(p, end, &v);
	case 1:
		if (end - *p < 8)
			return -1;
		*p += 8;
		return 0;
	case 2:
		if (varint(p, end, &v) || v > (uint64_t)(end - *p))
			return -1;
		*p += v;
		return 0;
	case 5:
		if (end - *p < 4)
			return -1;
		*p += 4;
		return 0;
	default:
		return -1;
	}
}

void
pg_msg_scan(const uint8_t *data, size_t len, pg_msg_cols *out)
{
	const uint8_t *p = data, *end = data + len;

	memset(out, 0, sizeof(*out));
	out->author = "";
	/* Message: role = 2 (enum), author = 4 (string), created_at = 5
	 * (Timestamp: seconds = 1, nanos = 2). Other fields are skipped;
	 * malformed bytes leave the defaults. */
	while (p < end) {
		uint64_t key, v;
		unsigned field, wt;

		if (varint(&p, end, &key))
			return;
		field = (unsigned)(key >> 3);
		wt = (unsigned)(key & 7);
		if (field == 2 && wt == 0) {
			if (varint(&p, end, &v))
				return;
			out->role = (int16_t)(v <= 32767 ? v : 0);
		} else if ((field == 4 || field == 5) && wt == 2) {
			const uint8_t *sub;

			if (varint(&p, end, &v) || v > (uint64_t)(end - p))
				return;
			sub = p;
			p += v;
			if (field == 4) {
				out->author = (const char *)sub;
				out->author_len = (size_t)v;
			} else {
				int64_t secs = 0, nanos = 0;

				while (sub < p) {
					uint64_t k2, x;

					if (varint(&sub, p, &k2))
						break;
					if ((k2 >> 3) == 1 && (k2 & 7) == 0 &&
					    !varint(&sub, p, &x))
						secs = (int64_t)x;
					else if ((k2 >> 3) == 2 && (k2 & 7) == 0 &&
						 !varint(&sub, p, &x))
						nanos = (int32_t)x;
					else if (skip(&sub, p, (unsigned)(k2 & 7)))
						break;
				}
				/* timestamptz holds years 4713 BC..294276 AD. */
				if (secs > -210866803200 && secs < 9224318016000) {
					out->has_created = 1;
					out->created_us = secs * 1000000 + nanos / 1000;
				}
			}
		} else if (skip(&p, end, wt)) {
			return;
		}
	}
}

/* ---------------------------------------------------------------------- */
/* Message records                                                         */

size_t
pg_record_len(uint64_t seq, size_t len)
{
	return 1 + histd_wire_varint_size(seq) + len;
}

int
pg_records_add_msg(histd_records *l, uint64_t seq, uint32_t tokens,
		   const void *data, size_t len)
{
	size_t total = pg_record_len(seq, len);
	uint8_t small[4096], *p = small;
	int rc;

	if (total > UINT32_MAX)
		return histd_error_set(HISTD_ECORRUPT, "stored message is too large");
	/* histd_records_add owns the list's memory: give it the record
	 * whole, built here (on the stack when small). */
	if (total > sizeof(small) && !(p = malloc(total)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	memcpy(p + histd_wire_put_seq(p, seq), data, len);
	rc = histd_records_add(l, seq, tokens, p, total);
	if (p != small)
		free(p);
	return rc;
}

histd_record *
pg_record_msg(uint64_t seq, uint32_t tokens, const void *data, size_t len)
{
	size_t total = pg_record_len(seq, len);
	histd_record *r;

	if (total > UINT32_MAX)
		return NULL;
	r = malloc(sizeof(*r) + total);
	if (!r)
		return NULL;
	r->seq = seq;
	r->token_estimate = tokens;
	r->len = (uint32_t)total;
	r->data = (uint8_t *)(r + 1);
	memcpy(r->data + histd_wire_put_seq(r->data, seq), data, len);
	return r;
}
