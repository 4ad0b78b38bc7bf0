#include "status.h"

#include "histd_error.h"

grpc_status_code
histd_status_from_error(int err)
{
	switch (err) {
	case HISTD_OK: return GRPC_STATUS_OK;
	case HISTD_ENOTFOUND: return GRPC_STATUS_NOT_FOUND;
	case HISTD_EEXISTS: return GRPC_STATUS_ALREADY_EXISTS;
	case HISTD_ECONFLICT: return GRPC_STATUS_ABORTED;
	case HISTD_EINVALID: return GRPC_STATUS_INVALID_ARGUMENT;
	case HISTD_EPRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
	case HISTD_ELIMIT: return GRPC_STATUS_RESOURCE_EXHAUSTED;
	case HISTD_ENOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
	case HISTD_EUNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
	case HISTD_ECORRUPT: return GRPC_STATUS_DATA_LOSS;
	case HISTD_EUNAUTH: return GRPC_STATUS_UNAUTHENTICATED;
	case HISTD_EPERM: return GRPC_STATUS_PERMISSION_DENIED;
	case HISTD_EUNIMPL: return GRPC_STATUS_UNIMPLEMENTED;
	default: return GRPC_STATUS_INTERNAL;
	}
}

const char *
histd_status_name(grpc_status_code code)
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
	return "UNKNOWN";
}
