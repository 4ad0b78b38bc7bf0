/*
 * The gRPC transport on gRPC C core: registered methods served from one
 * completion queue by a configurable number of threads, the health
 * service, UNIMPLEMENTED for unknown methods, and graceful shutdown.
 */
#ifndef HISTD_TRANSPORT_H
#define HISTD_TRANSPORT_H

#include "config.h"
#include "hub.h"
#include "service.h"

typedef struct histd_server histd_server;

/* Binds cfg->listen, starts serving with cfg->threads threads. Everything
 * passed is borrowed and must outlive the server. *bound_port is the port
 * actually bound (useful with port 0); 0 for a unix socket, which has
 * none. Call grpc_init() first. 0; EINVALID for an API keys or TLS file
 * refused (a bad option); EUNAVAILABLE when cfg->listen cannot be bound;
 * ENOMEM. */
int histd_server_start(histd_server **out, const histd_config *cfg,
		       histd_service *svc, histd_hub *hub, int *bound_port);

/* Graceful shutdown: health turns NOT_SERVING, the server stops accepting
 * calls, Subscribe streams end with UNAVAILABLE, calls in flight get
 * cfg->shutdown_grace_us microseconds to finish and are cancelled after that;
 * returns when every call is freed and every thread joined. */
void histd_server_shutdown(histd_server *s);

/* fn(arg) runs in histd_server_shutdown once calls in flight finished or
 * the grace ran out, before the remaining calls are cancelled: what they
 * wait on (provider calls) is to end there. */
void histd_server_on_grace_over(histd_server *s, void (*fn)(void *arg),
				void *arg);

/* Frees a server after histd_server_shutdown. */
void histd_server_free(histd_server *s);

#endif
