/*
 * TLS and mutual TLS for the gRPC port, from PEM files.
 *
 * Certificates are reloaded without a restart: at each new TLS handshake
 * gRPC asks for the current configuration, and the files are read again
 * when their modification time or size changed (a Kubernetes Secret update
 * or a cert-manager renewal). A reload that fails (a half-written file)
 * keeps the previous certificates and is logged.
 */
#ifndef HISTD_TLS_H
#define HISTD_TLS_H

#include <grpc/grpc_security.h>

typedef struct histd_tls histd_tls;

/* Checks the files now (readable PEM, the key matches the certificate, the
 * client CA parses): EINVALID naming the file otherwise. client_ca NULL or
 * "": TLS only; else every client must present a certificate signed by
 * it (mutual TLS). */
int histd_tls_new(histd_tls **out, const char *cert_file,
		  const char *key_file, const char *client_ca_file);

/* Server credentials that reload from the files; released by the caller
 * with grpc_server_credentials_release. t must outlive the server. */
grpc_server_credentials *histd_tls_credentials(histd_tls *t);

void histd_tls_free(histd_tls *t);

#endif
