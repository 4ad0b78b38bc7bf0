#include "histd_error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err_msg[512];

int
histd_error_set(int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
	va_end(ap);
	return code;
}

const char *
histd_error_message(void)
{
	return err_msg;
}

void
histd_error_clear(void)
{
	err_msg[0] = '\0';
}

const char *
histd_error_name(int code)
{
	switch (code) {
	case HISTD_OK: return "OK";
	case HISTD_ENOTFOUND: return "NOT_FOUND";
	case HISTD_EEXISTS: return "ALREADY_EXISTS";
	case HISTD_ECONFLICT: return "CONFLICT";
	case HISTD_EINVALID: return "INVALID";
	case HISTD_EPRECONDITION: return "PRECONDITION";
	case HISTD_ELIMIT: return "LIMIT";
	case HISTD_EUNAVAILABLE: return "UNAVAILABLE";
	case HISTD_ECORRUPT: return "CORRUPT";
	case HISTD_EUNAUTH: return "UNAUTHENTICATED";
	case HISTD_EPERM: return "PERMISSION_DENIED";
	case HISTD_EUNIMPL: return "UNIMPLEMENTED";
	case HISTD_ENOMEM: return "NO_MEMORY";
	case HISTD_EDEADLINE: return "DEADLINE_EXCEEDED";
	default: return "INTERNAL";
	}
}
