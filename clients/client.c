/*
 * The blocking histd client: see client.h for the contract.
 *
 * Every call, unary or streaming, has its own pluck completion queue: a
 * queue allows at most GRPC_MAX_COMPLETION_QUEUE_PLUCKERS concurrent
 * pluckers, so one queue per client would cap the threads that may share a
 * client, and per-call queues keep the tags of one call apart from every
 * other call's.
 */
#include "client.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "histd_error.h"

struct histd_client {
	grpc_channel *channel;
	/* Default request metadata, copied from the options: pairs of
	 * malloc'ed strings, n_md pairs. */
	char **md_kv;
	size_t n_md;
};

/* ------------------------------------------------------------------------
 * Status */

void histd_status_init(histd_status *st)
{
	st->code = GRPC_STATUS_UNKNOWN;
	st->details = NULL;
	st->trailers = NULL;
	st->n_trailers = 0;
}

void histd_status_reset(histd_status *st)
{
	if (!st)
		return;
	free(st->details);
	for (size_t i = 0; i < st->n_trailers; i++) {
		free(st->trailers[i].key);
		free(st->trailers[i].value);
	}
	free(st->trailers);
	histd_status_init(st);
}

const char *histd_status_trailer(const histd_status *st, const char *key)
{
	if (!st || !key)
		return NULL;
	for (size_t i = 0; i < st->n_trailers; i++)
		if (strcmp(st->trailers[i].key, key) == 0)
			return st->trailers[i].value;
	return NULL;
}

const char *histd_status_code_name(grpc_status_code code)
{
	static const char *const names[] = {
		"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
		"DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
		"PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
		"FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
		"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
		"UNAUTHENTICATED",
	};
	if ((unsigned)code < sizeof(names) / sizeof(names[0]))
		return names[code];
	return "UNKNOWN_CODE";
}

int histd_status_to_error(grpc_status_code code)
{
	switch (code) {
	case GRPC_STATUS_OK:
		return HISTD_OK;
	case GRPC_STATUS_INVALID_ARGUMENT:
	case GRPC_STATUS_OUT_OF_RANGE:
		return HISTD_EINVALID;
	case GRPC_STATUS_NOT_FOUND:
		return HISTD_ENOTFOUND;
	case GRPC_STATUS_ALREADY_EXISTS:
		return HISTD_EEXISTS;
	case GRPC_STATUS_ABORTED:
		return HISTD_ECONFLICT;
	case GRPC_STATUS_FAILED_PRECONDITION:
		return HISTD_EPRECONDITION;
	case GRPC_STATUS_RESOURCE_EXHAUSTED:
		return HISTD_ELIMIT;
	/* The call did not get through, for now: worth retrying. */
	case GRPC_STATUS_UNAVAILABLE:
	case GRPC_STATUS_DEADLINE_EXCEEDED:
	case GRPC_STATUS_CANCELLED:
		return HISTD_EUNAVAILABLE;
	case GRPC_STATUS_DATA_LOSS:
		return HISTD_ECORRUPT;
	case GRPC_STATUS_UNAUTHENTICATED:
		return HISTD_EUNAUTH;
	case GRPC_STATUS_PERMISSION_DENIED:
		return HISTD_EPERM;
	case GRPC_STATUS_UNIMPLEMENTED:
		return HISTD_EUNIMPL;
	default:
		return HISTD_EINTERNAL;
	}
}

static char *copy_bytes(const void *p, size_t n)
{
	char *s = malloc(n + 1);
	if (s) {
		if (n)
			memcpy(s, p, n);
		s[n] = '\0';
	}
	return s;
}

/* Sets a status the client made itself (no trailers). */
static void status_local(histd_status *st, grpc_status_code code,
			 const char *details)
{
	if (!st)
		return;
	histd_status_reset(st);
	st->code = code;
	st->details = copy_bytes(details, strlen(details));
}

/* Fills st from what RECV_STATUS_ON_CLIENT received. The status code is
 * kept even when copying the text runs out of memory. */
static void status_fill(histd_status *st, grpc_status_code code,
			grpc_slice details, const grpc_metadata_array *trailing)
{
	histd_status_reset(st);
	st->code = code;
	st->details = copy_bytes(GRPC_SLICE_START_PTR(details),
				 GRPC_SLICE_LENGTH(details));
	if (trailing->count == 0)
		return;
	st->trailers = calloc(trailing->count, sizeof(*st->trailers));
	if (!st->trailers)
		return;
	for (size_t i = 0; i < trailing->count; i++) {
		const grpc_metadata *m = &trailing->metadata[i];
		histd_metadata *t = &st->trailers[st->n_trailers];
		t->key = copy_bytes(GRPC_SLICE_START_PTR(m->key),
				    GRPC_SLICE_LENGTH(m->key));
		t->value = copy_bytes(GRPC_SLICE_START_PTR(m->value),
				      GRPC_SLICE_LENGTH(m->value));
		if (!t->key || !t->value) {
			free(t->key);
			free(t->value);
			break;
		}
		t->value_len = GRPC_SLICE_LENGTH(m->value);
		st->n_trailers++;
	}
}

/* ------------------------------------------------------------------------
 * Messages <-> byte buffers */

/* A byte buffer holding msg packed; NULL if out of memory. */
static grpc_byte_buffer *pack_message(const ProtobufCMessage *msg)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	grpc_slice slice = grpc_slice_malloc(len);
	protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(slice));
	grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
	grpc_slice_unref(slice);
	return bb;
}

/* Decodes bb as desc; NULL if it does not decode. A message in one slice
 * is unpacked in place; a larger one arrives in many slices and is first
 * copied into one. */
static ProtobufCMessage *unpack_message(grpc_byte_buffer *bb,
					const ProtobufCMessageDescriptor *desc)
{
	grpc_byte_buffer_reader reader;
	if (!grpc_byte_buffer_reader_init(&reader, bb))
		return NULL;
	ProtobufCMessage *msg;
	/* buffer_out is the decompressed buffer the reader walks. */
	const grpc_slice_buffer *sb = &reader.buffer_out->data.raw.slice_buffer;
	if (sb->count == 1) {
		msg = protobuf_c_message_unpack(
			desc, NULL, GRPC_SLICE_LENGTH(sb->slices[0]),
			GRPC_SLICE_START_PTR(sb->slices[0]));
	} else {
		grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
		msg = protobuf_c_message_unpack(desc, NULL,
						GRPC_SLICE_LENGTH(all),
						GRPC_SLICE_START_PTR(all));
		grpc_slice_unref(all);
	}
	grpc_byte_buffer_reader_destroy(&reader);
	return msg;
}

void histd_client_message_free(ProtobufCMessage *msg)
{
	if (msg)
		protobuf_c_message_free_unpacked(msg, NULL);
}

/* ------------------------------------------------------------------------
 * Metadata and deadlines */

static size_t count_pairs(const char *const *kv)
{
	size_t n = 0;
	if (kv)
		while (kv[2 * n] && kv[2 * n + 1])
			n++;
	return n;
}

/*
 * The request metadata of a call: the client's defaults, then the call's
 * own. copy 0: the slices point at the strings, which must outlive the
 * batch; copy 1: the slices own copies (unref with free_metadata). Returns
 * a calloc'ed array (NULL with *n 0 when there is none), or NULL with
 * *n != 0 if out of memory.
 */
static grpc_metadata *build_metadata(const histd_client *c,
				     const char *const *kv, int copy, size_t *n)
{
	size_t n_call = count_pairs(kv);
	*n = c->n_md + n_call;
	if (*n == 0)
		return NULL;
	grpc_metadata *md = calloc(*n, sizeof(*md));
	if (!md)
		return NULL;
	for (size_t i = 0; i < *n; i++) {
		const char *k, *v;
		if (i < c->n_md) {
			k = c->md_kv[2 * i];
			v = c->md_kv[2 * i + 1];
		} else {
			k = kv[2 * (i - c->n_md)];
			v = kv[2 * (i - c->n_md) + 1];
		}
		md[i].key = copy ? grpc_slice_from_copied_string(k)
				 : grpc_slice_from_static_string(k);
		md[i].value = copy ? grpc_slice_from_copied_string(v)
				   : grpc_slice_from_static_string(v);
	}
	return md;
}

static void free_metadata(grpc_metadata *md, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		grpc_slice_unref(md[i].key);
		grpc_slice_unref(md[i].value);
	}
	free(md);
}

static gpr_timespec deadline_in(int timeout_ms)
{
	if (timeout_ms <= 0)
		return gpr_inf_future(GPR_CLOCK_MONOTONIC);
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			    gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

/* Shuts down and destroys a pluck queue whose tags were all plucked. */
static void cq_destroy(grpc_completion_queue *cq)
{
	grpc_completion_queue_shutdown(cq);
	/* Returns GRPC_QUEUE_SHUTDOWN at once: nothing is pending. */
	grpc_completion_queue_pluck(cq, NULL,
				    gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
	grpc_completion_queue_destroy(cq);
}

/* ------------------------------------------------------------------------
 * Channel */

int histd_client_open(const char *target, histd_client **out)
{
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	return histd_client_open_ex(target, &opt, out);
}

int histd_client_open_ex(const char *target, const histd_client_options *opt,
			 histd_client **out)
{
	*out = NULL;
	if (!target)
		return histd_error_set(HISTD_EINVALID, "target is required");
	if (opt && (opt->version == 0 ||
		    opt->version > HISTD_CLIENT_OPTIONS_VERSION))
		return histd_error_set(HISTD_EINVALID,
				       "client options version %u is unknown",
				       opt->version);
	/* Fields of version 2 on. */
	int tls = opt && opt->version >= 2 && opt->tls;
	if (tls && !opt->tls_cert_pem != !opt->tls_key_pem)
		return histd_error_set(HISTD_EINVALID, "a client certificate "
				       "and its key go together");
	histd_client *c = calloc(1, sizeof(*c));
	if (!c)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (opt && opt->metadata_kv) {
		size_t n = count_pairs(opt->metadata_kv);
		c->md_kv = calloc(2 * n + 1, sizeof(char *));
		if (!c->md_kv)
			goto nomem;
		for (size_t i = 0; i < 2 * n; i++) {
			c->md_kv[i] = strdup(opt->metadata_kv[i]);
			if (!c->md_kv[i])
				goto nomem;
		}
		c->n_md = n;
	}

	grpc_arg args[2];
	size_t n_args = 0;
	if (opt && opt->max_receive_message_bytes != 0) {
		args[n_args].type = GRPC_ARG_INTEGER;
		args[n_args].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
		args[n_args].value.integer = opt->max_receive_message_bytes;
		n_args++;
	}
	if (opt && opt->max_send_message_bytes != 0) {
		args[n_args].type = GRPC_ARG_INTEGER;
		args[n_args].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
		args[n_args].value.integer = opt->max_send_message_bytes;
		n_args++;
	}
	grpc_channel_args chargs = { .num_args = n_args, .args = args };

	grpc_init();
	grpc_channel_credentials *creds;
	if (tls) {
		/* gRPC copies the PEM strings. */
		grpc_ssl_pem_key_cert_pair pair = {
			.private_key = opt->tls_key_pem,
			.cert_chain = opt->tls_cert_pem,
		};
		creds = grpc_ssl_credentials_create(
			opt->tls_root_pem, opt->tls_cert_pem ? &pair : NULL,
			NULL, NULL);
	} else {
		creds = grpc_insecure_credentials_create();
	}
	c->channel = grpc_channel_create(target, creds,
					 n_args ? &chargs : NULL);
	grpc_channel_credentials_release(creds);
	/* grpc_channel_create never returns NULL: a bad target gives a lame
	 * channel whose calls fail. */
	*out = c;
	return 0;

nomem:
	if (c->md_kv)
		for (size_t i = 0; c->md_kv[i]; i++)
			free(c->md_kv[i]);
	free(c->md_kv);
	free(c);
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

void histd_client_close(histd_client *c)
{
	if (!c)
		return;
	grpc_channel_destroy(c->channel);
	for (size_t i = 0; i < 2 * c->n_md; i++)
		free(c->md_kv[i]);
	free(c->md_kv);
	free(c);
	grpc_shutdown();
}

/* ------------------------------------------------------------------------
 * Unary */

int histd_client_unary(histd_client *c, const char *method_path,
		       const ProtobufCMessage *req,
		       const ProtobufCMessageDescriptor *resp_desc,
		       int timeout_ms, const char *const *metadata_kv,
		       ProtobufCMessage **resp, histd_status *st)
{
	histd_status local;
	histd_status_init(&local);
	if (!st)
		st = &local;
	*resp = NULL;
	if (!c || !method_path || !req || !resp_desc) {
		status_local(st, GRPC_STATUS_INVALID_ARGUMENT,
			     !c ? "client is required"
			     : !method_path ? "method path is required"
			     : !req ? "request is required"
			     : "response descriptor is required");
		histd_status_reset(&local);
		return HISTD_EINVALID;
	}

	size_t n_md;
	grpc_metadata *md = build_metadata(c, metadata_kv, 0, &n_md);
	grpc_byte_buffer *req_bb = pack_message(req);
	if ((!md && n_md) || !req_bb) {
		free(md);
		if (req_bb)
			grpc_byte_buffer_destroy(req_bb);
		status_local(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
			     "out of memory");
		histd_status_reset(&local);
		return HISTD_ENOMEM;
	}

	grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
	grpc_call *call = grpc_channel_create_call(
		c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
		grpc_slice_from_static_string(method_path), NULL,
		deadline_in(timeout_ms), NULL);

	grpc_metadata_array initial_md, trailing_md;
	grpc_metadata_array_init(&initial_md);
	grpc_metadata_array_init(&trailing_md);
	grpc_byte_buffer *resp_bb = NULL;
	grpc_status_code code = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice();
	const char *error_string = NULL;

	grpc_op ops[6];
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[0].data.send_initial_metadata.count = n_md;
	ops[0].data.send_initial_metadata.metadata = md;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = req_bb;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &resp_bb;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
	ops[5].data.recv_status_on_client.status = &code;
	ops[5].data.recv_status_on_client.status_details = &details;
	ops[5].data.recv_status_on_client.error_string = &error_string;

	int tag;
	grpc_call_error ce = grpc_call_start_batch(call, ops, 6, &tag, NULL);
	int rc;
	if (ce != GRPC_CALL_OK) {
		/* The tag never fires: nothing to pluck. */
		status_local(st, GRPC_STATUS_INTERNAL,
			     grpc_call_error_to_string(ce));
		rc = HISTD_EINTERNAL;
	} else {
		/* The call's deadline bounds this wait. */
		grpc_completion_queue_pluck(
			cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
		status_fill(st, code, details, &trailing_md);
		if (code == GRPC_STATUS_OK) {
			*resp = resp_bb ? unpack_message(resp_bb, resp_desc)
					: NULL;
			if (!*resp) {
				char line[200];
				snprintf(line, sizeof(line),
					 resp_bb ? "response does not decode as %s"
						 : "no response message (%s)",
					 resp_desc->name);
				status_local(st, GRPC_STATUS_INTERNAL, line);
			}
		}
		rc = histd_status_to_error(st->code);
	}

	if (resp_bb)
		grpc_byte_buffer_destroy(resp_bb);
	grpc_byte_buffer_destroy(req_bb);
	grpc_slice_unref(details);
	gpr_free((void *)error_string);
	grpc_metadata_array_destroy(&initial_md);
	grpc_metadata_array_destroy(&trailing_md);
	free_metadata(md, n_md);
	grpc_call_unref(call);
	cq_destroy(cq);
	histd_status_reset(&local);
	return rc;
}

/* ------------------------------------------------------------------------
 * Server streaming
 *
 * Three batches, each with its own tag, each outstanding at most once:
 * send (metadata, request, half-close) started by open; status
 * (RECV_STATUS_ON_CLIENT) started by open, plucked after the end of the
 * messages; recv (one RECV_MESSAGE, with RECV_INITIAL_METADATA the first
 * time) started by _next and left outstanding across a timeout, so that a
 * timed out read loses nothing. close plucks whatever is still out. */

struct histd_client_stream {
	grpc_call *call;
	grpc_completion_queue *cq;
	grpc_metadata *md;       /* owns its slices: alive until close */
	size_t n_md;
	grpc_byte_buffer *req_bb;

	grpc_metadata_array initial_md;
	grpc_metadata_array trailing_md;
	grpc_byte_buffer *recv_bb;
	grpc_status_code code;
	grpc_slice details;
	const char *error_string;

	int send_pending;
	int recv_pending;
	int status_pending;
	int initial_md_asked;    /* RECV_INITIAL_METADATA was started */
	int eos;                 /* no more messages */
	int done;                /* status received and filled */
	/* A message did not decode: the status says so, not CANCELLED. */
	const ProtobufCMessageDescriptor *bad_desc;
	histd_status st;

	/* Tags: the addresses of these. */
	char tag_send, tag_recv, tag_status;
};

static void stream_free(histd_client_stream *s)
{
	if (s->call)
		grpc_call_unref(s->call);
	if (s->cq)
		cq_destroy(s->cq);
	if (s->recv_bb)
		grpc_byte_buffer_destroy(s->recv_bb);
	if (s->req_bb)
		grpc_byte_buffer_destroy(s->req_bb);
	free_metadata(s->md, s->n_md);
	grpc_metadata_array_destroy(&s->initial_md);
	grpc_metadata_array_destroy(&s->trailing_md);
	grpc_slice_unref(s->details);
	gpr_free((void *)s->error_string);
	histd_status_reset(&s->st);
	free(s);
}

int histd_client_stream_open(histd_client *c, const char *method_path,
			     const ProtobufCMessage *req, int timeout_ms,
			     histd_client_stream **out)
{
	return histd_client_stream_open_md(c, method_path, req, timeout_ms,
					   NULL, out);
}

int histd_client_stream_open_md(histd_client *c, const char *method_path,
				const ProtobufCMessage *req, int timeout_ms,
				const char *const *metadata_kv,
				histd_client_stream **out)
{
	*out = NULL;
	if (!c || !method_path || !req)
		return histd_error_set(HISTD_EINVALID,
				       "client, method path and request are required");
	histd_client_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	grpc_metadata_array_init(&s->initial_md);
	grpc_metadata_array_init(&s->trailing_md);
	s->details = grpc_empty_slice();
	histd_status_init(&s->st);

	s->md = build_metadata(c, metadata_kv, 1, &s->n_md);
	if (!s->md && s->n_md) {
		s->n_md = 0;
		stream_free(s);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	s->req_bb = pack_message(req);
	if (!s->req_bb) {
		stream_free(s);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}

	s->cq = grpc_completion_queue_create_for_pluck(NULL);
	s->call = grpc_channel_create_call(
		c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
		grpc_slice_from_static_string(method_path), NULL,
		deadline_in(timeout_ms), NULL);

	grpc_op ops[3];
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[0].data.send_initial_metadata.count = s->n_md;
	ops[0].data.send_initial_metadata.metadata = s->md;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = s->req_bb;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	grpc_call_error ce = grpc_call_start_batch(s->call, ops, 3,
						   &s->tag_send, NULL);
	if (ce != GRPC_CALL_OK) {
		stream_free(s);
		return histd_error_set(HISTD_EINTERNAL, "gRPC refused the call: %s",
				       grpc_call_error_to_string(ce));
	}
	s->send_pending = 1;

	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
	ops[0].data.recv_status_on_client.status = &s->code;
	ops[0].data.recv_status_on_client.status_details = &s->details;
	ops[0].data.recv_status_on_client.error_string = &s->error_string;
	ce = grpc_call_start_batch(s->call, ops, 1, &s->tag_status, NULL);
	if (ce != GRPC_CALL_OK) {
		grpc_call_cancel(s->call, NULL);
		grpc_completion_queue_pluck(s->cq, &s->tag_send,
					    gpr_inf_future(GPR_CLOCK_REALTIME),
					    NULL);
		stream_free(s);
		return histd_error_set(HISTD_EINTERNAL, "gRPC refused the call: %s",
				       grpc_call_error_to_string(ce));
	}
	s->status_pending = 1;
	*out = s;
	return 0;
}

/* Plucks tag, waiting until deadline; 1 if it completed, 0 on timeout. */
static int pluck_until(histd_client_stream *s, void *tag, gpr_timespec deadline)
{
	grpc_event ev = grpc_completion_queue_pluck(s->cq, tag, deadline, NULL);
	return ev.type == GRPC_OP_COMPLETE;
}

static void stream_finish(histd_client_stream *s)
{
	status_fill(&s->st, s->code, s->details, &s->trailing_md);
	if (s->bad_desc) {
		char line[200];
		snprintf(line, sizeof(line), "message does not decode as %s",
			 s->bad_desc->name);
		status_local(&s->st, GRPC_STATUS_INTERNAL, line);
	}
	s->done = 1;
}

int histd_client_stream_next(histd_client_stream *s,
			     const ProtobufCMessageDescriptor *resp_desc,
			     int timeout_ms, ProtobufCMessage **msg)
{
	*msg = NULL;
	gpr_timespec deadline = deadline_in(timeout_ms);

	if (!s->eos) {
		if (!s->recv_pending) {
			grpc_op ops[2];
			size_t n = 0;
			memset(ops, 0, sizeof(ops));
			if (!s->initial_md_asked) {
				ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
				ops[n].data.recv_initial_metadata
					.recv_initial_metadata = &s->initial_md;
				n++;
			}
			ops[n].op = GRPC_OP_RECV_MESSAGE;
			ops[n].data.recv_message.recv_message = &s->recv_bb;
			n++;
			grpc_call_error ce = grpc_call_start_batch(
				s->call, ops, n, &s->tag_recv, NULL);
			if (ce != GRPC_CALL_OK) {
				/* Cannot read on: treat as the end. */
				grpc_call_cancel(s->call, NULL);
				s->eos = 1;
			} else {
				s->recv_pending = 1;
				s->initial_md_asked = 1;
			}
		}
		if (s->recv_pending) {
			if (!pluck_until(s, &s->tag_recv, deadline))
				return HISTD_STREAM_TIMEOUT;
			s->recv_pending = 0;
			if (s->recv_bb) {
				grpc_byte_buffer *bb = s->recv_bb;
				s->recv_bb = NULL;
				*msg = unpack_message(bb, resp_desc);
				grpc_byte_buffer_destroy(bb);
				if (*msg)
					return HISTD_STREAM_MESSAGE;
				s->bad_desc = resp_desc;
				grpc_call_cancel(s->call, NULL);
				s->eos = 1;
				return histd_error_set(HISTD_EINTERNAL,
						       "message does not decode as %s",
						       resp_desc->name);
			}
			s->eos = 1;
		}
	}

	if (s->status_pending) {
		if (!pluck_until(s, &s->tag_status, deadline))
			return HISTD_STREAM_TIMEOUT;
		s->status_pending = 0;
		stream_finish(s);
	}
	return HISTD_STREAM_END;
}

void histd_client_stream_cancel(histd_client_stream *s)
{
	if (s)
		grpc_call_cancel(s->call, NULL);
}

const histd_status *histd_client_stream_status(const histd_client_stream *s)
{
	return s && s->done ? &s->st : NULL;
}

void histd_client_stream_close(histd_client_stream *s)
{
	if (!s)
		return;
	gpr_timespec forever = gpr_inf_future(GPR_CLOCK_REALTIME);
	if (!s->done)
		grpc_call_cancel(s->call, NULL);
	/* After the cancel every outstanding batch completes promptly. */
	if (s->send_pending)
		pluck_until(s, &s->tag_send, forever);
	if (s->recv_pending)
		pluck_until(s, &s->tag_recv, forever);
	if (s->status_pending)
		pluck_until(s, &s->tag_status, forever);
	stream_free(s);
}
