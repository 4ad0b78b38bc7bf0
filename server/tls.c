#include "tls.h"

#include <errno.h>
#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "histd_error.h"
#include "log.h"

struct histd_tls {
	char *cert_file, *key_file, *ca_file;
	pthread_mutex_t mu;
	struct stat seen[3];    /* what the files were at the last load */
	int loaded;
	/* What they were when a reload last failed (failed: one did). */
	struct stat failed_seen[3];
	int failed;
};

static char *
read_file(const char *path, size_t max)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	size_t n;

	if (!f)
		return NULL;
	buf = malloc(max + 1);
	if (!buf) {
		fclose(f);
		return NULL;
	}
	n = fread(buf, 1, max, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* Reads and checks the three files; 0, or EINVALID naming the file. */
static int
load(histd_tls *t, char **cert, char **key, char **ca)
{
	BIO *bio = NULL;
	X509 *x = NULL;
	EVP_PKEY *pk = NULL;
	int rc = 0;

	*cert = *key = *ca = NULL;
	if (!(*cert = read_file(t->cert_file, 1 << 20)))
		return histd_error_set(HISTD_EINVALID, "tls-cert %s: %s",
				       t->cert_file, strerror(errno));
	if (!(*key = read_file(t->key_file, 1 << 20))) {
		rc = histd_error_set(HISTD_EINVALID, "tls-key %s: %s",
				     t->key_file, strerror(errno));
		goto out;
	}
	if (t->ca_file && !(*ca = read_file(t->ca_file, 1 << 20))) {
		rc = histd_error_set(HISTD_EINVALID, "tls-client-ca %s: %s",
				     t->ca_file, strerror(errno));
		goto out;
	}
	bio = BIO_new_mem_buf(*cert, -1);
	if (!bio || !(x = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
		rc = histd_error_set(HISTD_EINVALID, "tls-cert %s holds no PEM "
				     "certificate", t->cert_file);
		goto out;
	}
	BIO_free(bio);
	bio = BIO_new_mem_buf(*key, -1);
	if (!bio || !(pk = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL))) {
		rc = histd_error_set(HISTD_EINVALID, "tls-key %s holds no PEM "
				     "private key", t->key_file);
		goto out;
	}
	if (X509_check_private_key(x, pk) != 1) {
		rc = histd_error_set(HISTD_EINVALID, "tls-key %s does not match "
				     "tls-cert %s", t->key_file, t->cert_file);
		goto out;
	}
	if (*ca) {
		X509 *cax;

		BIO_free(bio);
		bio = BIO_new_mem_buf(*ca, -1);
		if (!bio || !(cax = PEM_read_bio_X509(bio, NULL, NULL, NULL))) {
			rc = histd_error_set(HISTD_EINVALID, "tls-client-ca %s "
					     "holds no PEM certificate",
					     t->ca_file);
			goto out;
		}
		X509_free(cax);
	}
out:
	BIO_free(bio);
	X509_free(x);
	EVP_PKEY_free(pk);
	if (rc) {
		free(*cert);
		free(*key);
		free(*ca);
		*cert = *key = *ca = NULL;
	}
	return rc;
}

static void
stat_files(const histd_tls *t, struct stat st[3])
{
	memset(st, 0, 3 * sizeof(*st));
	stat(t->cert_file, &st[0]);
	stat(t->key_file, &st[1]);
	if (t->ca_file)
		stat(t->ca_file, &st[2]);
}

static int
changed(const struct stat *a, const struct stat *b)
{
	for (int i = 0; i < 3; i++)
		if (a[i].st_mtim.tv_sec != b[i].st_mtim.tv_sec ||
		    a[i].st_mtim.tv_nsec != b[i].st_mtim.tv_nsec ||
		    a[i].st_size != b[i].st_size || a[i].st_ino != b[i].st_ino)
			return 1;
	return 0;
}

/* gRPC asks at each handshake: a new config when the files changed. */
static grpc_ssl_certificate_config_reload_status
fetch(void *user_data, grpc_ssl_server_certificate_config **config)
{
	histd_tls *t = user_data;
	grpc_ssl_pem_key_cert_pair pair;
	struct stat now[3];
	char *cert, *key, *ca;
	grpc_ssl_certificate_config_reload_status st;

	pthread_mutex_lock(&t->mu);
	stat_files(t, now);
	if (t->loaded && !changed(now, t->seen)) {
		pthread_mutex_unlock(&t->mu);
		return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
	}
	/* Files that failed to load as they are now are not read (nor
	 * reported) again at every handshake, only once they change. */
	if (t->loaded && t->failed && !changed(now, t->failed_seen)) {
		pthread_mutex_unlock(&t->mu);
		return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
	}
	if (load(t, &cert, &key, &ca) != 0) {
		histd_log(HISTD_LOG_WARN, "TLS files not reloaded; keeping the "
			  "previous ones", "error", histd_error_message(), NULL);
		st = t->loaded ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED :
				 GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
		memcpy(t->failed_seen, now, sizeof(now));
		t->failed = 1;
		pthread_mutex_unlock(&t->mu);
		return st;
	}
	t->failed = 0;
	pair.private_key = key;
	pair.cert_chain = cert;
	/* gRPC 1.51 asserts that a fetched config has root certificates even
	 * when client certificates are not requested; then they are never
	 * used, so our own chain stands in. */
	*config = grpc_ssl_server_certificate_config_create(ca ? ca : cert,
							     &pair, 1);
	if (t->loaded)
		histd_log(HISTD_LOG_INFO, "TLS certificates reloaded",
			  "cert", t->cert_file, NULL);
	memcpy(t->seen, now, sizeof(now));
	t->loaded = 1;
	pthread_mutex_unlock(&t->mu);
	/* gRPC copied the PEM strings. */
	OPENSSL_cleanse(key, strlen(key));
	free(cert);
	free(key);
	free(ca);
	return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

int
histd_tls_new(histd_tls **out, const char *cert_file, const char *key_file,
	      const char *client_ca_file)
{
	histd_tls *t = calloc(1, sizeof(*t));
	char *cert, *key, *ca;
	int rc;

	if (!t)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	t->cert_file = strdup(cert_file);
	t->key_file = strdup(key_file);
	if (client_ca_file && *client_ca_file)
		t->ca_file = strdup(client_ca_file);
	pthread_mutex_init(&t->mu, NULL);
	if ((rc = load(t, &cert, &key, &ca)) != 0) {
		histd_tls_free(t);
		return rc;
	}
	OPENSSL_cleanse(key, strlen(key));
	free(cert);
	free(key);
	free(ca);
	*out = t;
	return 0;
}

grpc_server_credentials *
histd_tls_credentials(histd_tls *t)
{
	grpc_ssl_server_credentials_options *o =
		grpc_ssl_server_credentials_create_options_using_config_fetcher(
			t->ca_file ?
			GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY :
			GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
			fetch, t);

	return grpc_ssl_server_credentials_create_with_options(o);
}

void
histd_tls_free(histd_tls *t)
{
	if (!t)
		return;
	free(t->cert_file);
	free(t->key_file);
	free(t->ca_file);
	pthread_mutex_destroy(&t->mu);
	free(t);
}
