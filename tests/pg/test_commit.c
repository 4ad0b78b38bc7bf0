/*
 * An Append is acknowledged only once PostgreSQL confirmed its COMMIT.
 *
 * The fast path runs a batch as one statement in the implicit transaction
 * of the extended protocol: the statement's rows come back before the
 * commit, which happens at the Sync. A deferred constraint trigger that
 * refuses at commit makes exactly that commit fail after the rows: the
 * Append must fail, store nothing, and leave the session usable. The same
 * for the checked path (an idempotency key), whose transaction ends with
 * an explicit COMMIT.
 *
 * Usage: pg_commit <histd binary>; the cluster comes from the ctest
 * fixture "pg" ($HISTD_PG_STATE), the database is the test's own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "harness.h"
#include "pgharness.h"

static const char *const trigger_sql[] = {
	"CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql "
	"AS $$ BEGIN IF NEW.author = 'refused-at-commit' THEN "
	"RAISE EXCEPTION 'refused at commit'; END IF; RETURN NULL; END $$",
	"CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON messages "
	"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
	"EXECUTE FUNCTION refuse_at_commit()",
};

/* Appends one user message by `author`; the status code, *seq its seq. */
static grpc_status_code
append_by(histd_client *c, const char *author, const char *idem,
	  uint64_t *seq)
{
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	Histd__V1__Message *m = tm_text(a, HISTD__V1__ROLE__ROLE_USER, author);
	Histd__V1__AppendResponse *resp = NULL;
	histd_status st;
	grpc_status_code code;

	m->author = (char *)author;
	req.session_id = "s";
	req.messages = &m;
	req.n_messages = 1;
	req.idempotency_key = (char *)(idem ? idem : "");
	histd_status_init(&st);
	t_call(c, "Append", &req, &histd__v1__append_response__descriptor,
	       &resp, &st);
	code = st.code;
	*seq = resp ? resp->first_seq : 0;
	histd_client_message_free((ProtobufCMessage *)resp);
	histd_status_reset(&st);
	ta_free(a);
	return code;
}

/* The authors of the stored messages, joined with ','. */
static void
stored_authors(histd_client *c, char *out, size_t cap)
{
	Histd__V1__GetMessagesResponse *r = t_get_raw(c, "s", 0, 100);
	size_t o = 0;

	out[0] = '\0';
	for (size_t i = 0; i < r->n_messages && o < cap; i++)
		o += (size_t)snprintf(out + o, cap - o, "%s%s", i ? "," : "",
				      r->messages[i]->author);
	histd_client_message_free(&r->base);
}

static void
a_commit_that_fails_after_the_rows_is_never_acknowledged(void **state)
{
	const char *cluster;
	char *db, authors[256];
	histd_proc *p = NULL;
	histd_client *c;
	uint64_t seq = 0;
	grpc_status_code code;
	const char *extra[] = {
		"--driver", "postgres", "--dsn", NULL, "--pool-size", "2",
		"--threads", "2", NULL,
	};

	(void)state;
	assert_int_equal(pgh_cluster_dsn(&cluster), 0);
	assert_non_null(db = pgh_new_database(cluster, "commit"));
	extra[3] = db;
	assert_int_equal(harness_start(&p, extra), 0);
	c = harness_client(p);
	free(t_create_session(c, "s"));
	assert_int_equal(append_by(c, "first", NULL, &seq), GRPC_STATUS_OK);
	assert_int_equal(seq, 1);
	for (size_t i = 0; i < sizeof(trigger_sql) / sizeof(trigger_sql[0]); i++) {
		PGresult *r = pgh_sql(db, trigger_sql[i]);

		assert_non_null(r);
		PQclear(r);
	}

	/* Fast path: the rows come, the commit fails. */
	code = append_by(c, "refused-at-commit", NULL, &seq);
	print_message("fast path: %s\n", histd_status_code_name(code));
	assert_int_not_equal(code, GRPC_STATUS_OK);
	/* Checked path: the explicit COMMIT fails. */
	code = append_by(c, "refused-at-commit", "key-1", &seq);
	print_message("checked path: %s\n", histd_status_code_name(code));
	assert_int_not_equal(code, GRPC_STATUS_OK);

	/* Nothing of them is stored; the session goes on at seq 2. */
	assert_int_equal(append_by(c, "second", NULL, &seq), GRPC_STATUS_OK);
	assert_int_equal(seq, 2);
	stored_authors(c, authors, sizeof(authors));
	assert_string_equal(authors, "first,second");

	histd_client_close(c);
	assert_int_equal(harness_stop(p), 0);
	pgh_drop_database(db);
	free(db);
}

/* The first insert of session "dies" ends its own connection (a sequence
 * counts across the rolled-back attempts): the connection is lost while
 * the create, which commits as it is answered, is in flight. */
static const char *const die_once_sql[] = {
	"CREATE SEQUENCE die_once",
	"CREATE FUNCTION die_once() RETURNS trigger LANGUAGE plpgsql "
	"AS $$ BEGIN IF NEW.id = 'dies' AND nextval('die_once') = 1 THEN "
	"PERFORM pg_terminate_backend(pg_backend_pid()); END IF; "
	"RETURN NULL; END $$",
	"CREATE TRIGGER die_once AFTER INSERT ON sessions FOR EACH ROW "
	"EXECUTE FUNCTION die_once()",
};

/* A CreateSession whose connection is lost mid-create has an unknown
 * outcome: UNAVAILABLE saying so, not a retry on another connection,
 * which after a create that did commit would answer ALREADY_EXISTS for
 * the caller's own session. (Here the create did not commit: the
 * session is not there, and the next create makes it.) */
static void
a_create_that_loses_its_connection_is_unavailable_not_retried(void **state)
{
	Histd__V1__CreateSessionRequest req =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__Session *out = NULL;
	const char *cluster;
	char *db;
	histd_proc *p = NULL;
	histd_client *c;
	histd_status st;
	const char *extra[] = {
		"--driver", "postgres", "--dsn", NULL, "--pool-size", "2",
		NULL,
	};

	(void)state;
	assert_int_equal(pgh_cluster_dsn(&cluster), 0);
	assert_non_null(db = pgh_new_database(cluster, "create_lost"));
	extra[3] = db;
	assert_int_equal(harness_start(&p, extra), 0);
	c = harness_client(p);
	for (size_t i = 0; i < sizeof(die_once_sql) / sizeof(die_once_sql[0]);
	     i++) {
		PGresult *r = pgh_sql(db, die_once_sql[i]);

		assert_non_null(r);
		PQclear(r);
	}

	req.session_id = "dies";
	histd_status_init(&st);
	t_call(c, "CreateSession", &req, &histd__v1__session__descriptor,
	       &out, &st);
	print_message("lost create: %s: %s\n",
		      histd_status_code_name(st.code),
		      st.details ? st.details : "");
	assert_int_equal(st.code, GRPC_STATUS_UNAVAILABLE);
	assert_non_null(strstr(st.details, "may not be applied"));
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)out);
	out = NULL;

	histd_status_init(&st);
	t_call(c, "CreateSession", &req, &histd__v1__session__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)out);

	histd_client_close(c);
	assert_int_equal(harness_stop(p), 0);
	pgh_drop_database(db);
	free(db);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(
			a_commit_that_fails_after_the_rows_is_never_acknowledged),
		cmocka_unit_test(
			a_create_that_loses_its_connection_is_unavailable_not_retried),
	};

	if (harness_init(argc, argv) != 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
