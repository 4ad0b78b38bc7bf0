#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "histd_error.h"
#include "histd_wire.h"
#include "log.h"

#define DIGEST 32
#define MAX_TENANT 64

struct key {
	unsigned char digest[DIGEST];
	char tenant[MAX_TENANT + 1];
	int read_only;
	int line;               /* in the file */
};

/* One loaded set of keys; replaced whole on reload. Tenant strings given
 * to callers point into a set, so sets are kept until histd_auth_free. */
struct keyset {
	struct key *keys;
	size_t n;
	struct keyset *older;
};

struct histd_auth {
	char *path;
	pthread_rwlock_t lock;
	struct keyset *set;
	struct stat seen;
	int64_t checked;        /* monotonic us of the last look at the
	                         * file; __atomic, written under reload_mu */
	int missing;            /* the file was gone at the last look */
	pthread_mutex_t reload_mu;
};

static void
digest(const char *s, size_t len, unsigned char out[DIGEST])
{
	unsigned int n = DIGEST;

	EVP_Digest(s, len, out, &n, EVP_sha256(), NULL);
}

static int
tenant_ok(const char *t)
{
	size_t n = strlen(t);

	if (n == 0 || n > MAX_TENANT)
		return 0;
	for (; *t; t++)
		if (!isalnum((unsigned char)*t) && *t != '-' && *t != '_' &&
		    *t != '.')
			return 0;
	return 1;
}

/* Parses the file into a new set; EINVALID naming the line. Lines have
 * no length limit (a long comment must not spill into a key line), a
 * UTF-8 byte order mark before the first line is skipped, and a line
 * whose first word starts with '#' is a comment. */
static int
parse(const char *path, struct keyset **out)
{
	FILE *f = fopen(path, "r");
	struct keyset *ks;
	char *line = NULL;
	size_t line_cap = 0;
	ssize_t got;
	int lineno = 0, rc = 0;
	size_t cap = 0;

	if (!f)
		return histd_error_set(HISTD_EINVALID, "api-keys-file %s: %s",
				       path, strerror(errno));
	if (!(ks = calloc(1, sizeof(*ks)))) {
		fclose(f);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	while ((got = getline(&line, &line_cap, f)) >= 0) {
		char *save = NULL, *key, *tenant, *role, *extra, *text = line;

		lineno++;
		if (lineno == 1 && strncmp(text, "\xEF\xBB\xBF", 3) == 0)
			text += 3;
		text[strcspn(text, "\r\n")] = '\0';
		key = strtok_r(text, " \t", &save);
		if (!key || key[0] == '#')
			continue;
		tenant = strtok_r(NULL, " \t", &save);
		role = strtok_r(NULL, " \t", &save);
		extra = strtok_r(NULL, " \t", &save);
		if (!tenant || extra || strlen(key) < 16 || !tenant_ok(tenant) ||
		    (role && strcmp(role, "read-only") != 0 &&
		     strcmp(role, "read-write") != 0)) {
			rc = histd_error_set(HISTD_EINVALID, "api-keys-file %s "
				"line %d: want 'KEY TENANT [read-only|read-write]' "
				"with a key of at least 16 characters and a "
				"tenant of [A-Za-z0-9._-]", path, lineno);
			break;
		}
		if (ks->n == cap) {
			size_t c = cap ? cap * 2 : 8;
			struct key *v = realloc(ks->keys, c * sizeof(*v));

			if (!v) {
				rc = histd_error_set(HISTD_ENOMEM, "out of memory");
				break;
			}
			ks->keys = v;
			cap = c;
		}
		digest(key, strlen(key), ks->keys[ks->n].digest);
		/* A key listed twice would be whichever line came last: an
		 * operator demoting or moving a key by adding a line would get
		 * the opposite of what they meant, so neither counts. */
		for (size_t i = 0; i < ks->n; i++)
			if (CRYPTO_memcmp(ks->keys[i].digest,
					  ks->keys[ks->n].digest, DIGEST) == 0) {
				rc = histd_error_set(HISTD_EINVALID,
					"api-keys-file %s line %d: the key of "
					"line %d again (a key may be listed once)",
					path, lineno, ks->keys[i].line);
				break;
			}
		if (rc)
			break;
		snprintf(ks->keys[ks->n].tenant, sizeof(ks->keys[ks->n].tenant),
			 "%s", tenant);
		ks->keys[ks->n].read_only = role && strcmp(role, "read-only") == 0;
		ks->keys[ks->n].line = lineno;
		ks->n++;
		OPENSSL_cleanse(line, line_cap);
	}
	if (line)
		OPENSSL_cleanse(line, line_cap);
	free(line);
	if (rc == 0 && (ferror(f) || !feof(f)))
		rc = histd_error_set(HISTD_EINVALID, "api-keys-file %s: %s",
				     path, strerror(errno));
	fclose(f);
	if (rc == 0 && ks->n == 0)
		rc = histd_error_set(HISTD_EINVALID, "api-keys-file %s holds no "
				     "keys", path);
	if (rc) {
		free(ks->keys);
		free(ks);
		return rc;
	}
	*out = ks;
	return 0;
}

int
histd_auth_new(histd_auth **out, const char *keys_file)
{
	histd_auth *a = calloc(1, sizeof(*a));
	int rc;

	if (!a)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	a->path = strdup(keys_file);
	pthread_rwlock_init(&a->lock, NULL);
	pthread_mutex_init(&a->reload_mu, NULL);
	stat(keys_file, &a->seen);
	a->checked = histd_mono_us();
	if ((rc = parse(keys_file, &a->set)) != 0) {
		histd_auth_free(a);
		return rc;
	}
	*out = a;
	return 0;
}

void
histd_auth_free(histd_auth *a)
{
	if (!a)
		return;
	for (struct keyset *ks = a->set, *next; ks; ks = next) {
		next = ks->older;
		OPENSSL_cleanse(ks->keys, ks->n * sizeof(*ks->keys));
		free(ks->keys);
		free(ks);
	}
	pthread_rwlock_destroy(&a->lock);
	pthread_mutex_destroy(&a->reload_mu);
	free(a->path);
	free(a);
}

static int
same_file(const struct stat *x, const struct stat *y)
{
	return x->st_mtim.tv_sec == y->st_mtim.tv_sec &&
	       x->st_mtim.tv_nsec == y->st_mtim.tv_nsec &&
	       x->st_size == y->st_size && x->st_ino == y->st_ino;
}

/* Puts the file's keys in front; on a bad file, keeps the ones held. */
static void
reload(histd_auth *a)
{
	struct keyset *ks;
	char n[24];

	if (parse(a->path, &ks) != 0) {
		histd_log(HISTD_LOG_WARN, "API keys not reloaded; keeping the "
			  "previous ones", "error", histd_error_message(), NULL);
		return;
	}
	pthread_rwlock_wrlock(&a->lock);
	ks->older = a->set;
	a->set = ks;
	pthread_rwlock_unlock(&a->lock);
	snprintf(n, sizeof(n), "%zu", ks->n);
	histd_log(HISTD_LOG_INFO, "API keys reloaded", "keys", n, NULL);
}

/* Reads the file again if it changed, looking at most once a second (a
 * stat per call would cost every call); one thread at a time. */
static void
maybe_reload(histd_auth *a)
{
	int64_t now = histd_mono_us();
	struct stat st;

	if (now - __atomic_load_n(&a->checked, __ATOMIC_RELAXED) < 1000000)
		return;
	if (pthread_mutex_trylock(&a->reload_mu) != 0)
		return;
	/* Read without the lock by every call: atomic, as its read is. */
	__atomic_store_n(&a->checked, now, __ATOMIC_RELAXED);
	if (stat(a->path, &st) != 0) {
		/* Gone or out of reach: an editor replacing the file, or an
		 * operator's mistake. Revoking every key then would stop the
		 * whole service, so the keys held stay, and that is said once. */
		if (!a->missing)
			histd_log(HISTD_LOG_WARN, "API keys file unreadable; "
				  "keeping the previous keys", "file", a->path,
				  "error", strerror(errno), NULL);
		a->missing = 1;
	} else {
		a->missing = 0;
		if (!same_file(&st, &a->seen)) {
			a->seen = st;
			reload(a);
		}
	}
	pthread_mutex_unlock(&a->reload_mu);
}

int
histd_auth_check(histd_auth *a, const char *header, size_t len,
		 const char **tenant, int *read_only)
{
	unsigned char d[DIGEST];
	const struct key *hit = NULL;

	if (!header)
		return histd_error_set(HISTD_EUNAUTH, "missing credentials: send "
				       "the metadata 'authorization: Bearer "
				       "<api key>'");
	if (len < 7 || strncasecmp(header, "Bearer ", 7) != 0)
		return histd_error_set(HISTD_EUNAUTH, "authorization must be "
				       "'Bearer <api key>'");
	header += 7;
	len -= 7;
	while (len && *header == ' ') {
		header++;
		len--;
	}
	maybe_reload(a);
	digest(header, len, d);
	pthread_rwlock_rdlock(&a->lock);
	/* Every entry is compared, whatever matches, in constant time. */
	for (size_t i = 0; i < a->set->n; i++) {
		int same = CRYPTO_memcmp(d, a->set->keys[i].digest, DIGEST) == 0;

		hit = same ? &a->set->keys[i] : hit;
	}
	if (hit) {
		*tenant = hit->tenant;
		*read_only = hit->read_only;
	}
	pthread_rwlock_unlock(&a->lock);
	OPENSSL_cleanse(d, sizeof(d));
	if (!hit)
		return histd_error_set(HISTD_EUNAUTH, "the API key is not valid");
	return 0;
}

int
histd_auth_still_valid(histd_auth *a, const char *tenant)
{
	const struct key *k = (const struct key *)(const void *)
		(tenant - offsetof(struct key, tenant));
	const struct keyset *cur;
	int ok = 0;

	maybe_reload(a);
	pthread_rwlock_rdlock(&a->lock);
	cur = a->set;
	if (k >= cur->keys && k < cur->keys + cur->n) {
		ok = 1;         /* from the set in force */
	} else {
		for (size_t i = 0; i < cur->n && !ok; i++)
			ok = CRYPTO_memcmp(k->digest, cur->keys[i].digest,
					   DIGEST) == 0 &&
			     strcmp(k->tenant, cur->keys[i].tenant) == 0;
	}
	pthread_rwlock_unlock(&a->lock);
	return ok;
}

size_t
histd_auth_count(histd_auth *a)
{
	size_t n;

	pthread_rwlock_rdlock(&a->lock);
	n = a->set->n;
	pthread_rwlock_unlock(&a->lock);
	return n;
}
