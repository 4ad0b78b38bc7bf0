/*
 * libFuzzer target: request decoding and validation of the service.
 *
 * Input: byte 0 picks the method (byte % 15: the unary methods of enum
 * histd_method, Subscribe excluded) and the format of the export check
 * below ((byte / 15) % 5 + 1); the rest is the packed request, given to
 * histd_service_unary as the transport would, by caller tenant "t", on a
 * fresh memory driver holding the sample conversation of fixture.h.
 *
 * Besides "no crash, no leak, no undefined behaviour", each run checks
 * what must hold whatever the request:
 *   - the return code is 0 or a known HISTD_E* code, never EINTERNAL or
 *     ECORRUPT (the memory driver holds only what the service packed);
 *   - an error carries a one-line, non-empty message;
 *   - a success returns bytes that decode as the method's response;
 *   - afterwards, the session "s" (unless the request removed it) still
 *     reads in both views, every stored message decodes, and Export in
 *     the chosen format succeeds: whatever the service accepted, it can
 *     read back and convert.
 * A failed check abort()s, which libFuzzer reports as a crash. With
 * FUZZ_VERBOSE set in the environment, each run prints its method and
 * answer (to see what a corpus exercises).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "histd/v1/histd.pb-c.h"
#include "service.h"

#define N_UNARY HISTD_M_SUBSCRIBE

static const ProtobufCMessageDescriptor *const responses[N_UNARY] = {
	[HISTD_M_CREATE_SESSION] = &histd__v1__session__descriptor,
	[HISTD_M_RESOLVE_SESSION] = &histd__v1__resolve_session_response__descriptor,
	[HISTD_M_GET_SESSION] = &histd__v1__session__descriptor,
	[HISTD_M_LIST_SESSIONS] = &histd__v1__list_sessions_response__descriptor,
	[HISTD_M_UPDATE_SESSION] = &histd__v1__session__descriptor,
	[HISTD_M_DELETE_SESSION] = &histd__v1__delete_session_response__descriptor,
	[HISTD_M_FORK_SESSION] = &histd__v1__session__descriptor,
	[HISTD_M_APPEND] = &histd__v1__append_response__descriptor,
	[HISTD_M_GET_MESSAGES] = &histd__v1__get_messages_response__descriptor,
	[HISTD_M_GET_TOOL_RESULT] = &histd__v1__get_tool_result_response__descriptor,
	[HISTD_M_CLEAR] = &histd__v1__clear_response__descriptor,
	[HISTD_M_REPLACE] = &histd__v1__replace_response__descriptor,
	[HISTD_M_REDUCE] = &histd__v1__reduce_response__descriptor,
	[HISTD_M_EXPORT] = &histd__v1__export_response__descriptor,
	[HISTD_M_IMPORT] = &histd__v1__import_response__descriptor,
};

static fz_req setup[8];
static size_t n_setup;
static int verbose;

static void __attribute__((noreturn))
fail(const char *what, enum histd_method m, int rc)
{
	fprintf(stderr, "fuzz_service: %s (method %s, rc %d %s: %s)\n", what,
		histd_method_names[m], rc, histd_error_name(rc),
		histd_error_message());
	abort();
}

/* Checks the answer to one call; returns rc. */
static int
check(enum histd_method m, int rc, const histd_reply *reply)
{
	if (rc == 0) {
		ProtobufCMessage *r = protobuf_c_message_unpack(
			responses[m], NULL, reply->len,
			reply->len ? reply->data : (const uint8_t *)"");

		if (!r)
			fail("the response does not decode", m, rc);
		protobuf_c_message_free_unpacked(r, NULL);
		return 0;
	}
	if (rc < HISTD_EDEADLINE || rc > 0)
		fail("an unknown error code", m, rc);
	if (rc == HISTD_EINTERNAL || rc == HISTD_ECORRUPT)
		fail("an internal or corrupt error", m, rc);
	if (!histd_error_message()[0] || strchr(histd_error_message(), '\n'))
		fail("the error message is empty or not one line", m, rc);
	return rc;
}

static int
call(histd_service *s, enum histd_method m, const ProtobufCMessage *req,
     histd_reply *reply)
{
	static const histd_caller who = { FZ_TENANT, 0 };
	uint8_t buf[256];
	size_t len = protobuf_c_message_get_packed_size(req);

	if (len > sizeof(buf))
		abort();
	protobuf_c_message_pack(req, buf);
	return check(m, histd_service_unary(s, m, &who, buf, len, reply),
		     reply);
}

/* What must hold after any request: "s" reads back and exports. */
static void
check_after(histd_service *s, Histd__V1__Format format)
{
	Histd__V1__GetMessagesRequest get = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__ExportRequest exp = HISTD__V1__EXPORT_REQUEST__INIT;
	histd_reply reply = { 0 };
	int rc;

	get.session_id = FZ_SESSION;
	for (int view = HISTD__V1__VIEW__VIEW_RAW;
	     view <= HISTD__V1__VIEW__VIEW_CONTEXT; view++) {
		get.view = view;
		rc = call(s, HISTD_M_GET_MESSAGES, &get.base, &reply);
		if (rc == HISTD_ENOTFOUND)
			return;         /* deleted by the request */
		if (rc)
			fail("the session no longer reads", HISTD_M_GET_MESSAGES, rc);
		free(reply.data);
	}
	exp.session_id = FZ_SESSION;
	exp.format = format;
	exp.view = HISTD__V1__VIEW__VIEW_RAW;
	rc = call(s, HISTD_M_EXPORT, &exp.base, &reply);
	/* EUNIMPL: Export not wired into the service yet. */
	if (rc && rc != HISTD_EUNIMPL)
		fail("the session no longer exports", HISTD_M_EXPORT, rc);
	free(reply.data);
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	verbose = getenv("FUZZ_VERBOSE") != NULL;
	if (!(n_setup = fz_setup_requests(setup, sizeof(setup) / sizeof(setup[0]))))
		abort();
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const histd_caller who = { FZ_TENANT, 0 };
	histd_driver_config dc = { 0 };
	histd_service_config cfg;
	histd_driver *d;
	histd_service *s;
	histd_reply reply = { 0 };
	enum histd_method m;
	int rc;

	if (size < 1)
		return 0;
	m = (enum histd_method)(data[0] % N_UNARY);
	if (histd_driver_open("memory", &dc, &d))
		abort();
	histd_service_config_default(&cfg);
	if (histd_service_new(&s, d, &cfg))
		abort();
	for (size_t i = 0; i < n_setup; i++) {
		rc = histd_service_unary(s, setup[i].method, &who,
					 setup[i].data, setup[i].len, &reply);
		if (rc)
			fail("the set-up request failed", setup[i].method, rc);
		free(reply.data);
	}
	rc = check(m, histd_service_unary(s, m, &who, data + 1, size - 1,
					  &reply), &reply);
	if (verbose)
		fprintf(stderr, "fuzz_service: %s: %s %s\n", histd_method_names[m],
			histd_error_name(rc), rc ? histd_error_message() : "");
	free(reply.data);
	check_after(s, (Histd__V1__Format)((data[0] / N_UNARY) % 5 + 1));
	histd_service_free(s);
	histd_driver_close(d);
	return 0;
}
