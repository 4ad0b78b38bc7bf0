/*
 * Session TTL through the histd binary on the file driver. The sweeper
 * learns the tenants from storage: a session stored before a restart
 * expires after it without any call to its tenant, and so does one of a
 * tenant whose API key was removed from the keys file meanwhile.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"

#define KEY_ACME "acme-key-0123456789"
#define KEY_GHOST "ghost-key-0123456789"

/* How long a test waits for the sweeper: TTL 2 s, a sweep every 1 s,
 * with room for a loaded machine. */
#define EXPIRY_WAIT_MS 30000

static char data_dir[128];
static char keys_path[160];

static void
write_keys(const char *text)
{
	FILE *f = fopen(keys_path, "w");

	assert_non_null(f);
	assert_true(fputs(text, f) >= 0);
	assert_int_equal(fclose(f), 0);
}

static histd_proc *
start(const char *ttl)
{
	const char *args[] = { "--driver", "file", "--data-dir", data_dir,
			       "--api-keys-file", keys_path,
			       "--session-ttl", ttl,
			       "--ttl-sweep-interval", "1", NULL };
	histd_proc *p = NULL;

	assert_int_equal(harness_start(&p, args), 0);
	return p;
}

/* Waits until the server logged that it deleted session `id`. */
static int
wait_expired(const histd_proc *p, const char *id)
{
	char needle[160];
	int64_t give_up = t_now_ms() + EXPIRY_WAIT_MS;

	snprintf(needle, sizeof(needle),
		 "\"msg\":\"session expired\",\"session\":\"%s\"", id);
	while (t_now_ms() < give_up) {
		if (harness_log_has(p, needle))
			return 1;
		usleep(100 * 1000);
	}
	return 0;
}

static void
expect_get_session(histd_client *c, const char *id, grpc_status_code code)
{
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	histd_status st;

	histd_status_init(&st);
	req.session_id = (char *)id;
	t_call(c, "GetSession", &req, &histd__v1__session__descriptor, &s, &st);
	assert_status(&st, code);
	histd_status_reset(&st);
	if (s)
		histd_client_message_free(&s->base);
}

static void
session_stored_before_a_restart_expires_with_no_call_to_its_tenant(void **state)
{
	histd_proc *p;
	histd_client *acme, *ghost;
	int acme_gone, ghost_gone;

	(void)state;
	write_keys(KEY_ACME " acme read-write\n"
		   KEY_GHOST " ghost read-write\n");
	/* Sessions created, never appended to, under a TTL far away (its
	 * sweeper runs every second all the same). */
	p = start("3600");
	acme = harness_client_key(p, KEY_ACME);
	ghost = harness_client_key(p, KEY_GHOST);
	free(t_create_session(acme, "acme-chat"));
	free(t_create_session(ghost, "ghost-chat"));
	expect_get_session(acme, "acme-chat", GRPC_STATUS_OK);
	histd_client_close(acme);
	histd_client_close(ghost);
	assert_int_equal(harness_stop(p), 0);

	/* Restarted with a TTL of 2 s and ghost's key gone: nobody calls
	 * either tenant until both sessions are reported deleted. */
	write_keys(KEY_ACME " acme read-write\n");
	p = start("2");
	acme_gone = wait_expired(p, "acme-chat");
	ghost_gone = acme_gone && wait_expired(p, "ghost-chat");
	if (!acme_gone || !ghost_gone)
		harness_dump_log(p);
	assert_true(acme_gone);
	assert_true(ghost_gone);
	acme = harness_client_key(p, KEY_ACME);
	expect_get_session(acme, "acme-chat", GRPC_STATUS_NOT_FOUND);
	histd_client_close(acme);
	assert_int_equal(harness_stop(p), 0);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(data_dir, sizeof(data_dir), "/tmp/histd-ttl-XXXXXX");
	if (!mkdtemp(data_dir))
		return -1;
	snprintf(keys_path, sizeof(keys_path), "%s.keys", data_dir);
	return 0;
}

static int
teardown(void **state)
{
	char cmd[400];

	(void)state;
	unlink(keys_path);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", data_dir);
	return system(cmd) == 0 ? 0 : -1;
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			session_stored_before_a_restart_expires_with_no_call_to_its_tenant,
			setup, teardown),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
