/*
 * The one place where histd error codes become gRPC status codes.
 */
#ifndef HISTD_STATUS_H
#define HISTD_STATUS_H

#include <grpc/status.h>

/* HISTD_OK -> GRPC_STATUS_OK, HISTD_ENOTFOUND -> NOT_FOUND, ... as in
 * README "Status codes". Unknown codes map to INTERNAL. */
grpc_status_code histd_status_from_error(int err);

/* "OK", "NOT_FOUND", ... (for logs and metrics). */
const char *histd_status_name(grpc_status_code code);

#endif
