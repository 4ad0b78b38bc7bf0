/*
 * The API-keys file (server/auth.c): what loads, and what is refused with
 * the line named.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "auth.h"
#include "histd_error.h"

#define KEY_A "alpha-key-0123456789abcdef"
#define KEY_B "bravo-key-0123456789abcdef"

static char path[64];

static int
setup(void **state)
{
	int fd;

	(void)state;
	snprintf(path, sizeof(path), "/tmp/histd-auth-XXXXXX");
	fd = mkstemp(path);
	if (fd < 0)
		return -1;
	close(fd);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	unlink(path);
	return 0;
}

static void
write_keys(const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
}

/* Loading text fails with EINVALID and a message holding each of the
 * NULL-ended words. */
static void
refused(const char *text, ...)
{
	histd_auth *a = NULL;
	const char *w;
	va_list ap;

	write_keys(text);
	assert_int_equal(histd_auth_new(&a, path), HISTD_EINVALID);
	assert_null(a);
	va_start(ap, text);
	while ((w = va_arg(ap, const char *)))
		if (!strstr(histd_error_message(), w))
			fail_msg("\"%s\" does not say \"%s\"", histd_error_message(), w);
	va_end(ap);
}

static void
a_good_file_loads_each_key_with_its_tenant_and_role(void **state)
{
	histd_auth *a = NULL;
	const char *tenant;
	int ro;

	(void)state;
	write_keys("# key tenant role\n\n" KEY_A " alpha\n" KEY_B " bravo read-only\n");
	assert_int_equal(histd_auth_new(&a, path), 0);
	assert_int_equal(histd_auth_count(a), 2);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_B,
					  strlen("Bearer " KEY_B), &tenant, &ro), 0);
	assert_string_equal(tenant, "bravo");
	assert_true(ro);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_A,
					  strlen("Bearer " KEY_A), &tenant, &ro), 0);
	assert_string_equal(tenant, "alpha");
	assert_false(ro);
	histd_auth_free(a);
}

static void
bad_lines_are_refused_naming_the_line(void **state)
{
	(void)state;
	refused(KEY_A " alpha\nshort-key alpha\n", "line 2", "16 characters", NULL);
	refused(KEY_A " alpha admin\n", "line 1", "read-only|read-write", NULL);
	refused(KEY_A "\n", "line 1", NULL);
	refused("# nothing\n", "holds no keys", NULL);
}

/* The same key twice, whatever its tenant or role: the later line would
 * silently win, so the file is refused. */
static void
a_key_listed_twice_is_refused(void **state)
{
	(void)state;
	refused(KEY_A " alpha\n" KEY_B " bravo\n" KEY_A " bravo\n",
		"line 3", "line 1", "listed once", NULL);
	refused(KEY_A " alpha read-only\n" KEY_A " alpha\n",
		"line 2", "line 1", NULL);
}

/* A key accepted before a reload holds after it only if the file still
 * lists it with the same tenant. */
static void
a_key_removed_or_moved_no_longer_holds(void **state)
{
	histd_auth *a = NULL;
	const char *alpha, *bravo;
	int ro;

	(void)state;
	write_keys(KEY_A " alpha\n" KEY_B " bravo\n");
	assert_int_equal(histd_auth_new(&a, path), 0);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_A,
					  strlen("Bearer " KEY_A), &alpha, &ro), 0);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_B,
					  strlen("Bearer " KEY_B), &bravo, &ro), 0);
	assert_true(histd_auth_still_valid(a, alpha));
	/* The file is looked at every two seconds at most. */
	write_keys(KEY_A " bravo\n");
	usleep(2100 * 1000);
	assert_false(histd_auth_still_valid(a, alpha));     /* moved */
	assert_false(histd_auth_still_valid(a, bravo));     /* removed */
	write_keys(KEY_B " bravo\n" KEY_A " alpha\n");
	usleep(2100 * 1000);
	assert_true(histd_auth_still_valid(a, alpha));
	assert_true(histd_auth_still_valid(a, bravo));
	histd_auth_free(a);
}

/* A line is read whole however long: the tail of a long comment is not a
 * line of its own (it used to be, past 1,023 bytes, and could hold a key),
 * and a long key works. */
static void
a_long_line_is_one_line(void **state)
{
	char text[4096], longkey[2001];
	histd_auth *a = NULL;
	const char *tenant;
	char header[2100];
	int ro;

	(void)state;
	memset(longkey, 'k', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	/* '#' and 1,022 more bytes: exactly what one read of 1,023 took. */
	snprintf(text, sizeof(text), KEY_A " alpha\n#%01022d " KEY_B
		 " bravo\n%s charlie read-only\n", 0, longkey);
	write_keys(text);
	assert_int_equal(histd_auth_new(&a, path), 0);
	assert_int_equal(histd_auth_count(a), 2);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_B,
					  strlen("Bearer " KEY_B), &tenant, &ro),
			 HISTD_EUNAUTH);
	snprintf(header, sizeof(header), "Bearer %s", longkey);
	assert_int_equal(histd_auth_check(a, header, strlen(header), &tenant,
					  &ro), 0);
	assert_string_equal(tenant, "charlie");
	assert_true(ro);
	histd_auth_free(a);
}

/* Files saved by some editors begin with a UTF-8 byte order mark. */
static void
a_byte_order_mark_is_skipped(void **state)
{
	histd_auth *a = NULL;
	const char *tenant;
	int ro;

	(void)state;
	write_keys("\xEF\xBB\xBF" KEY_A " alpha\n");
	assert_int_equal(histd_auth_new(&a, path), 0);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_A,
					  strlen("Bearer " KEY_A), &tenant, &ro), 0);
	assert_string_equal(tenant, "alpha");
	histd_auth_free(a);
}

/* A file that goes away (an editor's unlink and write, a mistake) does
 * not revoke every key; when it is back, it counts again. */
static void
a_missing_file_keeps_the_keys_held(void **state)
{
	histd_auth *a = NULL;
	const char *alpha;
	int ro;

	(void)state;
	write_keys(KEY_A " alpha\n");
	assert_int_equal(histd_auth_new(&a, path), 0);
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_A,
					  strlen("Bearer " KEY_A), &alpha, &ro), 0);
	assert_int_equal(unlink(path), 0);
	usleep(2100 * 1000);
	assert_true(histd_auth_still_valid(a, alpha));
	assert_int_equal(histd_auth_check(a, "Bearer " KEY_A,
					  strlen("Bearer " KEY_A), &alpha, &ro), 0);
	write_keys(KEY_B " bravo\n");
	usleep(2100 * 1000);
	assert_false(histd_auth_still_valid(a, alpha));
	histd_auth_free(a);
}

struct checker {
	histd_auth *a;
	atomic_int *stop;
	long checks, failed;
};

static void *
check_loop(void *arg)
{
	struct checker *c = arg;
	const char *tenant;
	int ro;

	while (!atomic_load(c->stop)) {
		if (histd_auth_check(c->a, "Bearer " KEY_A,
				     strlen("Bearer " KEY_A), &tenant, &ro) != 0 ||
		    strcmp(tenant, "alpha") != 0)
			c->failed++;
		c->checks++;
	}
	return NULL;
}

/* Calls check keys on many threads at once, and whichever notices that
 * two seconds passed reloads the file; the others keep checking. */
static void
keys_reload_while_other_threads_check(void **state)
{
	histd_auth *a = NULL;
	atomic_int stop = 0;
	struct checker c[3];
	pthread_t t[3];

	(void)state;
	write_keys(KEY_A " alpha\n");
	assert_int_equal(histd_auth_new(&a, path), 0);
	for (int i = 0; i < 3; i++) {
		c[i] = (struct checker){ .a = a, .stop = &stop };
		assert_int_equal(pthread_create(&t[i], NULL, check_loop, &c[i]), 0);
	}
	write_keys(KEY_A " alpha\n" KEY_B " bravo\n");
	usleep(2300 * 1000);
	atomic_store(&stop, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 3; i++) {
		assert_true(c[i].checks > 0);
		assert_int_equal(c[i].failed, 0);
	}
	assert_int_equal(histd_auth_count(a), 2);
	histd_auth_free(a);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(a_good_file_loads_each_key_with_its_tenant_and_role),
		cmocka_unit_test(bad_lines_are_refused_naming_the_line),
		cmocka_unit_test(a_key_listed_twice_is_refused),
		cmocka_unit_test(a_key_removed_or_moved_no_longer_holds),
		cmocka_unit_test(a_long_line_is_one_line),
		cmocka_unit_test(a_byte_order_mark_is_skipped),
		cmocka_unit_test(a_missing_file_keeps_the_keys_held),
		cmocka_unit_test(keys_reload_while_other_threads_check),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
