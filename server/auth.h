/*
 * API keys and tenants.
 *
 * Keys come from a file (a Kubernetes Secret mounted as a file works as
 * is), one per line:
 *
 *     # key                              tenant     [role]
 *     3f9c0e1b7a...                      acme
 *     0b6d52aa4c...                      acme       read-only
 *
 * A caller sends "authorization: Bearer <key>". Keys are kept only as
 * SHA-256 digests, compared in constant time against every entry, and
 * never logged. The file is read again when it changes (checked at most
 * every two seconds); a file that no longer parses keeps the old keys. A
 * key may be listed once.
 */
#ifndef HISTD_AUTH_H
#define HISTD_AUTH_H

#include <stddef.h>

typedef struct histd_auth histd_auth;

/* Loads the key file: EINVALID naming the line that is wrong. */
int histd_auth_new(histd_auth **out, const char *keys_file);
void histd_auth_free(histd_auth *a);

/*
 * Checks the value of an authorization header (not NUL-terminated; NULL
 * when absent). 0 with *tenant (a static copy, valid until histd_auth_free)
 * and *read_only, or EUNAUTH with the thread's message set.
 */
int histd_auth_check(histd_auth *a, const char *header, size_t len,
		     const char **tenant, int *read_only);

/*
 * Whether the key that histd_auth_check accepted with *tenant (the pointer
 * it gave) still holds, with that tenant, in the file as it is now (read
 * again if it changed). For calls that outlive a reload: a stream of a
 * key that was removed or moved to another tenant must end.
 */
int histd_auth_still_valid(histd_auth *a, const char *tenant);

/* Number of keys loaded (logs, tests). */
size_t histd_auth_count(histd_auth *a);

#endif
