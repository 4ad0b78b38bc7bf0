/*
 * Export and Import (see transcript.h): the driver on one side, the
 * provider formats of clients/ on the other.
 */
#include "transcript.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histd_wire.h"

/* Messages read per driver call. */
#define PAGE 1000

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
check_format(Histd__V1__Format f)
{
	if (f == HISTD__V1__FORMAT__FORMAT_UNSPECIFIED)
		return histd_error_set(HISTD_EINVALID, "format is required");
	if (!histd_format_name(f))
		return histd_error_set(HISTD_EINVALID,
				       "format is not a known Format");
	return 0;
}

static int
pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	uint8_t *buf = malloc(n ? n : 1);

	if (!buf)
		return enomem();
	*out_len = protobuf_c_message_pack(m, buf);
	*out = buf;
	return 0;
}

int
histd_transcript_export_messages(Histd__V1__Format format,
				 Histd__V1__Message *const *messages, size_t n,
				 const Histd__V1__Summary *summary,
				 uint8_t **out, size_t *out_len)
{
	Histd__V1__ExportResponse resp = HISTD__V1__EXPORT_RESPONSE__INIT;
	Histd__V1__Message **all = NULL, sm = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock sb = HISTD__V1__CONTENT_BLOCK__INIT, *sbp = &sb;
	Histd__V1__TextBlock st = HISTD__V1__TEXT_BLOCK__INIT;
	histd_strlist dropped = { 0 };
	char *json = NULL, *text = NULL;
	int rc;

	if ((rc = check_format(format)))
		return rc;
	if (summary && summary->text[0]) {
		if (asprintf(&text, "Summary of the earlier conversation:\n%s",
			     summary->text) < 0 ||
		    !(all = malloc((n + 1) * sizeof(*all)))) {
			if (text && all == NULL)
				free(text);
			return enomem();
		}
		st.text = text;
		sb.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		sb.text = &st;
		sm.role = HISTD__V1__ROLE__ROLE_SYSTEM;
		sm.n_content = 1;
		sm.content = &sbp;
		all[0] = &sm;
		if (n)
			memcpy(all + 1, messages, n * sizeof(*all));
		messages = all;
		n++;
	}
	rc = histd_transcript_to_json(format, messages, n, &json, &dropped);
	if (!rc) {
		resp.json = json;
		resp.n_dropped = dropped.n;
		resp.dropped = dropped.v;
		rc = pack(&resp.base, out, out_len);
	}
	free(json);
	free(text);
	free(all);
	histd_strlist_clear(&dropped);
	return rc;
}

/* Appends the messages of res to t, decoded; 0, ENOMEM or ECORRUPT. */
static int
add_records(histd_transcript *t, const histd_read_result *res)
{
	for (size_t i = 0; i < res->records.n; i++) {
		const histd_record *r = &res->records.v[i];
		Histd__V1__Message *m;
		int rc;

		if ((rc = histd_unpack_stored(&histd__v1__message__descriptor,
					      NULL, r->data, r->len, &m,
					      "the stored message at seq %llu",
					      (unsigned long long)r->seq)))
			return rc;
		if ((rc = histd_transcript_add(t, m))) {
			histd__v1__message__free_unpacked(m, NULL);
			return rc;
		}
	}
	return 0;
}

int
histd_transcript_check_request(const Histd__V1__ExportRequest *req)
{
	int rc;

	if ((rc = check_format(req->format)))
		return rc;
	switch (req->view) {
	case HISTD__V1__VIEW__VIEW_UNSPECIFIED:
	case HISTD__V1__VIEW__VIEW_RAW:
	/* Without a context pipeline, CONTEXT is RAW, as in GetMessages. */
	case HISTD__V1__VIEW__VIEW_CONTEXT:
		return 0;
	default:
		return histd_error_set(HISTD_EINVALID,
				       "view is not a known View");
	}
}

int
histd_transcript_too_large(size_t bytes, int stored, size_t max_bytes)
{
	return histd_error_set(HISTD_ELIMIT, "%s %zu bytes; an Export answer "
			       "is at most %zu (--max-response-bytes)",
			       stored ? "the session's messages are over"
				      : "the transcript is",
			       bytes, max_bytes);
}

int
histd_transcript_export(histd_driver *d, const char *tenant,
			const Histd__V1__ExportRequest *req, size_t max_bytes,
			uint8_t **out, size_t *out_len)
{
	histd_transcript t = { 0 };
	uint64_t after = 0;
	size_t stored = 0;
	int rc, more = 1;

	if ((rc = histd_transcript_check_request(req)))
		return rc;
	while (more && !rc) {
		histd_read q = { .tenant = tenant,
				 .session_id = req->session_id,
				 .after_seq = after, .limit = PAGE };
		histd_read_result res = { 0 };

		if ((rc = histd_driver_read(d, &q, &res)))
			break;
		more = res.has_more && res.records.n > 0;
		if (res.records.n)
			after = res.records.v[res.records.n - 1].seq;
		for (size_t i = 0; i < res.records.n; i++)
			stored += res.records.v[i].len;
		/* JSON is rarely smaller than the stored bytes: twice the
		 * limit will not fit, and is not read on. */
		if (max_bytes && stored / 2 > max_bytes)
			rc = histd_transcript_too_large(max_bytes * 2, 1,
							max_bytes);
		else
			rc = add_records(&t, &res);
		histd_read_result_clear(&res);
	}
	if (!rc)
		rc = histd_transcript_export_messages(req->format, t.messages,
						      t.n_messages, NULL, out,
						      out_len);
	histd_transcript_clear(&t);
	return rc;
}

/* What the import continues: the session's newest messages, or with
 * before_seq those before it. */
struct import_tail {
	histd_driver *d;
	const char *tenant;
	const char *session_id;
	uint64_t before_seq;
};

static int
read_tail(void *arg, histd_transcript *out)
{
	const struct import_tail *it = arg;
	histd_read q = { .tenant = it->tenant, .session_id = it->session_id,
			 .last_n = HISTD_IMPORT_TAIL };
	histd_read_result res = { 0 };
	int rc;

	if (it->before_seq) {
		uint64_t end = it->before_seq - 1;

		if (!end)
			return 0;
		q.last_n = 0;
		q.after_seq = end > HISTD_IMPORT_TAIL
			? end - HISTD_IMPORT_TAIL : 0;
		q.limit = (uint32_t)(end - q.after_seq);
	}
	if ((rc = histd_driver_read(it->d, &q, &res)))
		return rc;
	rc = add_records(out, &res);
	histd_read_result_clear(&res);
	return rc;
}

int
histd_transcript_import(histd_driver *d, const char *tenant,
			const Histd__V1__ImportRequest *req,
			const histd_transcript_limits *lim,
			histd_transcript *out)
{
	return histd_transcript_import_before(d, tenant, req, lim, 0, out);
}

int
histd_transcript_import_before(histd_driver *d, const char *tenant,
			       const Histd__V1__ImportRequest *req,
			       const histd_transcript_limits *lim,
			       uint64_t before_seq, histd_transcript *out)
{
	struct import_tail it = { .d = d, .tenant = tenant,
				  .session_id = req->session_id,
				  .before_seq = before_seq };
	histd_transcript_limits l;
	int rc;

	if ((rc = check_format(req->format)))
		return rc;
	if (!req->json[0])
		return histd_error_set(HISTD_EINVALID, "json is required");
	if (lim)
		l = *lim;
	else
		histd_transcript_limits_default(&l);
	if (d) {
		l.tail = read_tail;
		l.tail_arg = &it;
	}
	if ((rc = histd_transcript_from_json(req->format, req->json,
					     strlen(req->json), &l, out)))
		return rc;
	if (out->n_messages == 0) {
		histd_transcript_clear(out);
		return histd_error_set(HISTD_EINVALID, "json holds no message "
				       "histd can keep");
	}
	return 0;
}

int
histd_transcript_import_error(const histd_transcript *t, int rc)
{
	const char *msg = histd_error_message();
	char was[1024], name[48];
	const char *origin;
	unsigned long long i;
	char *end;

	if (!rc || rc == HISTD_ENOMEM || strncmp(msg, "messages[", 9) ||
	    !isdigit((unsigned char)msg[9]) ||
	    t->origins.n != t->n_messages)
		return rc;
	i = strtoull(msg + 9, &end, 10);
	if (*end != ']' || i >= t->origins.n)
		return rc;
	origin = t->origins.v[i];
	snprintf(name, sizeof(name), "messages[%llu]", i);
	if (!origin[0] || !strcmp(origin, name))
		return rc;
	snprintf(was, sizeof(was), "%s", msg);
	return histd_error_set(rc, "%s (histd's %s begins at %s in the body)",
			       was, name, origin);
}

int
histd_transcript_import_reply(const Histd__V1__AppendResponse *append,
			      const histd_transcript *t, uint8_t **out,
			      size_t *out_len)
{
	Histd__V1__ImportResponse resp = HISTD__V1__IMPORT_RESPONSE__INIT;

	resp.append = (Histd__V1__AppendResponse *)append;
	resp.n_dropped = t->dropped.n;
	resp.dropped = t->dropped.v;
	return pack(&resp.base, out, out_len);
}
