/*
 * Calls on an in-process service (server/service.h) for the unit tests:
 * a method run on a packed request, and CreateSession with a pipeline.
 */
#ifndef HISTD_SVC_CALLS_H
#define HISTD_SVC_CALLS_H

#include <protobuf-c/protobuf-c.h>

#include "service.h"

/* The service the calls below go to, and who makes them. */
void ut_use(histd_service *svc, const histd_caller *who);

/* Runs method m; returns its code, and with resp the answer unpacked by
 * rd (free with ut_free_msg). */
int ut_call(enum histd_method m, const ProtobufCMessage *req,
	    const ProtobufCMessageDescriptor *rd, void **resp);

/* Creates session id with the pipeline given as (plugin, key, value)
 * triples, NULL-terminated: a plugin named again adds an option to it,
 * a NULL key names it without one; { NULL } is an empty pipeline.
 * plugins NULL: no config (the default pipeline applies). Returns the
 * call's code. */
int ut_create(const char *id, const char *const *plugins);

/* Frees an unpacked answer (NULL is fine). */
void ut_free_msg(void *m);

#endif
