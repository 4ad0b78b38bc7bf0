/*
 * Session TTL through the histd binary on the file driver. The sweeper
 * learns the tenants from storage: a session stored before a restart
 * expires after it without any call to its tenant, and so does one of a
 * tenant whose API key was removed from the keys file meanwhile. Idleness
 * is dated by the time storage keeps of a session's last change, not by
 * the created_at its caller gave a message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

/* Appends one user message whose created_at is `secs` (Unix seconds): an
 * imported transcript's. */
static void
append_dated(histd_client *c, const char *id, int64_t secs)
{
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER,
					"said long ago");
	Google__Protobuf__Timestamp *ts = ta_alloc(a, sizeof(*ts));
	Histd__V1__AppendResponse *resp = NULL;
	histd_status st;

	google__protobuf__timestamp__init(ts);
	ts->seconds = secs;
	m->created_at = ts;
	req.session_id = (char *)id;
	req.n_messages = 1;
	req.messages = &m;
	histd_status_init(&st);
	t_call(c, "Append", &req, &histd__v1__append_response__descriptor,
	       &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	if (resp)
		histd_client_message_free(&resp->base);
	ta_free(a);
}

/*
 * A session created long before (more than the TTL), appended to just
 * before a restart with a message dated three days back: after the
 * restart, the sweeps within the TTL of the append leave it (the append
 * is what storage dates), and one after deletes it. (Dated by its newest
 * message, as histd did before, it would go at the first sweep.)
 */
static void
append_of_an_old_dated_message_keeps_the_session_across_a_restart(void **state)
{
	enum { TTL_S = 6 };
	histd_proc *p;
	histd_client *acme;
	int64_t appended_ms;
	int gone;

	(void)state;
	write_keys(KEY_ACME " acme read-write\n");
	p = start("3600");
	acme = harness_client_key(p, KEY_ACME);
	free(t_create_session(acme, "imported"));
	/* Older than the TTL of the restart by the time of the append. */
	sleep(TTL_S + 2);
	append_dated(acme, "imported", (int64_t)time(NULL) - 3 * 86400);
	appended_ms = t_now_ms();
	histd_client_close(acme);
	assert_int_equal(harness_stop(p), 0);

	p = start("6");
	/* Sweeps run every second meanwhile; within the TTL of the append
	 * (less a second, for a loaded machine's clocks) nothing expires. */
	while (t_now_ms() < appended_ms + (TTL_S - 1) * 1000)
		usleep(100 * 1000);
	if (harness_log_has(p, "\"msg\":\"session expired\""))
		harness_dump_log(p);
	acme = harness_client_key(p, KEY_ACME);
	expect_get_session(acme, "imported", GRPC_STATUS_OK);
	histd_client_close(acme);
	assert_false(harness_log_has(p, "\"msg\":\"session expired\""));
	/* Then it is idle for longer than the TTL, and goes. */
	gone = wait_expired(p, "imported");
	if (!gone)
		harness_dump_log(p);
	assert_true(gone);
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
		cmocka_unit_test_setup_teardown(
			append_of_an_old_dated_message_keeps_the_session_across_a_restart,
			setup, teardown),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
