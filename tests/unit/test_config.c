/* server/config.c: defaults, YAML file, environment and flags, in that
 * order of precedence; clear errors for bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "histd_error.h"
#include "status.h"

static int
load(histd_config *cfg, int argc, char **argv)
{
	return histd_config_load(cfg, argc, argv);
}

static void
defaults_apply_without_input(void **state)
{
	histd_config cfg;
	char *argv[] = { "histd" };

	(void)state;
	unsetenv("HISTD_CONFIG");
	unsetenv("HISTD_LISTEN");
	setenv("HISTD_AUTH_DISABLED", "true", 1);
	assert_int_equal(load(&cfg, 1, argv), 0);
	unsetenv("HISTD_AUTH_DISABLED");
	assert_int_equal(cfg.auth_disabled, 1);
	assert_string_equal(cfg.listen, "0.0.0.0:50051");
	assert_string_equal(cfg.driver, "file");
	assert_string_equal(cfg.data_dir, "./data");
	assert_int_equal(cfg.max_receive_bytes, 4u * 1024 * 1024);
	assert_int_equal(cfg.service.max_messages_per_append, 1000);
	assert_int_equal(cfg.service.idempotency_ttl_us, 86400LL * 1000000);
	assert_int_equal(cfg.hub.queue_max, 1024);
	assert_true(cfg.threads > 0);
	histd_config_free(&cfg);
}

static void
flag_beats_environment_beats_file(void **state)
{
	char path[] = "/tmp/histd-config-XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");
	histd_config cfg;
	char *argv[] = { "histd", "--config", path, "--listen", "127.0.0.1:7",
			 "--subscriber-queue=8", "--auth-disabled" };

	(void)state;
	fprintf(f, "# histd\nlisten: 127.0.0.1:5\nmax_page_size: 50\n"
		   "idempotency_ttl: 60\nmax_message_bytes: 2M\n");
	fclose(f);
	setenv("HISTD_LISTEN", "127.0.0.1:6", 1);
	setenv("HISTD_MAX_PAGE_SIZE", "70", 1);
	assert_int_equal(load(&cfg, 7, argv), 0);
	assert_string_equal(cfg.listen, "127.0.0.1:7");          /* flag */
	assert_int_equal(cfg.service.max_page_size, 70);          /* env */
	assert_int_equal(cfg.service.idempotency_ttl_us, 60000000); /* file */
	assert_int_equal(cfg.max_receive_bytes, 2u * 1024 * 1024); /* file */
	assert_int_equal(cfg.hub.queue_max, 8);                   /* flag= */
	histd_config_free(&cfg);
	unsetenv("HISTD_LISTEN");
	unsetenv("HISTD_MAX_PAGE_SIZE");
	unlink(path);
}

/* histd --auth-disabled FLAG value, for each value: load returns want. */
static void
each_value_loads(const char *flag, const char *const *values, size_t n,
		 int want)
{
	histd_config cfg;

	for (size_t i = 0; i < n; i++) {
		char *argv[] = { "histd", "--auth-disabled", (char *)flag,
				 (char *)values[i] };

		assert_int_equal(load(&cfg, 4, argv), want);
		histd_config_free(&cfg);
	}
}

static void
bad_input_is_refused(void **state)
{
	histd_config cfg;
	char *unknown[] = { "histd", "--no-such-option", "1" };
	char *negative[] = { "histd", "--threads", "-3" };
	char *missing[] = { "histd", "--listen" };
	char *suffix[] = { "histd", "--max-message-bytes", "4X" };
	char *zero_queue[] = { "histd", "--subscriber-queue", "0" };
	char *nofile[] = { "histd", "--config", "/nonexistent/histd.yaml" };
	char *config_last[] = { "histd", "--auth-disabled", "--config" };
	char *no_auth[] = { "histd", "--listen", "127.0.0.1:0" };
	char *both[] = { "histd", "--auth-disabled", "--api-keys-file", "/k" };
	char *bad_bool[] = { "histd", "--auth-disabled=maybe" };
	char *bad_driver[] = { "histd", "--auth-disabled", "--driver", "filez" };
	char *bad_fsync[] = { "histd", "--auth-disabled", "--fsync", "sometimes" };
	char *good_choices[] = { "histd", "--auth-disabled", "--driver",
				 "postgres", "--fsync", "never" };
	/* gRPC would bind port 99999 - 65536 = 34463. */
	const char *bad_listen[] = { "127.0.0.1:99999", "127.0.0.1:65536",
				     "127.0.0.1", "127.0.0.1:", "[::1]:8x",
				     "h:000001" };
	const char *good_listen[] = { "127.0.0.1:65535", "[::]:0",
				      "unix:/tmp/histd.sock" };

	(void)state;
	each_value_loads("--listen", bad_listen,
			 sizeof(bad_listen) / sizeof(*bad_listen), -1);
	each_value_loads("--listen", good_listen,
			 sizeof(good_listen) / sizeof(*good_listen), 0);
	assert_int_equal(load(&cfg, 3, unknown), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 3, negative), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 2, missing), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 3, suffix), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 3, zero_queue), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 3, nofile), -1);
	histd_config_free(&cfg);
	/* A --config without its file is not quietly no file. */
	assert_int_equal(load(&cfg, 3, config_last), -1);
	histd_config_free(&cfg);
	/* Authentication is off only when asked for. */
	assert_int_equal(load(&cfg, 3, no_auth), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 4, both), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 2, bad_bool), -1);
	histd_config_free(&cfg);
	/* Choices are checked here, not first by the driver at open. */
	assert_int_equal(load(&cfg, 4, bad_driver), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 4, bad_fsync), -1);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 6, good_choices), 0);
	histd_config_free(&cfg);
}

/* A metrics port that is not a number would have the endpoint bind a
 * random one (strtol's 0) and histd serve on without it. */
static void
metrics_listen_needs_a_port(void **state)
{
	const char *bad[] = { "127.0.0.1:abc", "127.0.0.1:", "0.0.0.0:9090x",
			      "0.0.0.0", "[::]:65536", "unix:/tmp/m.sock" };
	const char *good[] = { "0.0.0.0:9090", "127.0.0.1:0", "[::]:9090",
			       "localhost:9090", ":9090", "" };

	(void)state;
	each_value_loads("--metrics-listen", bad, sizeof(bad) / sizeof(*bad),
			 -1);
	each_value_loads("--metrics-listen", good,
			 sizeof(good) / sizeof(*good), 0);
}

/* A misspelt variable sets nothing: it is listed for main to log, by name
 * only; histctl's variables are not. */
static void
unknown_environment_variable_is_listed(void **state)
{
	histd_config cfg;
	char *argv[] = { "histd", "--auth-disabled" };

	(void)state;
	setenv("HISTD_MAX_MESAGE_BYTES", "16M", 1);
	setenv("HISTD_TARGET", "127.0.0.1:1", 1);
	/* What Kubernetes sets for a Service named histd. */
	setenv("HISTD_SERVICE_HOST", "10.0.0.7", 1);
	setenv("HISTD_SERVICE_PORT_GRPC", "50051", 1);
	setenv("HISTD_PORT", "tcp://10.0.0.7:50051", 1);
	setenv("HISTD_PORT_50051_TCP_ADDR", "10.0.0.7", 1);
	assert_int_equal(load(&cfg, 2, argv), 0);
	unsetenv("HISTD_MAX_MESAGE_BYTES");
	unsetenv("HISTD_TARGET");
	unsetenv("HISTD_SERVICE_HOST");
	unsetenv("HISTD_SERVICE_PORT_GRPC");
	unsetenv("HISTD_PORT");
	unsetenv("HISTD_PORT_50051_TCP_ADDR");
	assert_string_equal(cfg.unknown_env, "HISTD_MAX_MESAGE_BYTES");
	assert_int_equal(cfg.max_receive_bytes, 4u * 1024 * 1024);
	histd_config_free(&cfg);
	assert_int_equal(load(&cfg, 2, argv), 0);
	assert_null(strstr(cfg.unknown_env, "HISTD_MAX_MESAGE_BYTES"));
	histd_config_free(&cfg);
}

/* Options where 0 would not mean "none" but break the server quietly. */
static void
zero_is_refused_where_one_is_the_least(void **state)
{
	const char *names[] = { "--subscriber-queue",
				"--summarizer-max-concurrent",
				"--max-messages-per-append", "--max-page-size",
				"--ttl-sweep-interval", "--max-message-bytes",
				"--max-concurrent-streams",
				"--max-stored-message-bytes",
				"--idempotency-ttl",
				"--summarizer-request-timeout-ms" };
	histd_config cfg;

	(void)state;
	for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++) {
		char *zero[] = { "histd", "--auth-disabled", (char *)names[i],
				 "0" };
		char *one[] = { "histd", "--auth-disabled", (char *)names[i],
				"1" };

		assert_int_equal(load(&cfg, 4, zero), -1);
		histd_config_free(&cfg);
		assert_int_equal(load(&cfg, 4, one), 0);
		histd_config_free(&cfg);
	}
}

/* Values that would have start-up allocate or spawn without end, or a
 * time that overflows when added to now. */
static void
values_past_their_limit_are_refused(void **state)
{
	const char *cases[][3] = {
		{ "--threads", "1025", "1024" },
		{ "--posted-calls", "1025", "1024" },
		{ "--idempotency-ttl", "3155760001", "3155760000" },
		{ "--session-ttl", "9223372036854", "3155760000" },
		{ "--shutdown-grace", "3155760001", "3155760000" },
	};
	histd_config cfg;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		char *over[] = { "histd", "--auth-disabled", (char *)cases[i][0],
				 (char *)cases[i][1] };
		char *most[] = { "histd", "--auth-disabled", (char *)cases[i][0],
				 (char *)cases[i][2] };

		assert_int_equal(load(&cfg, 4, over), -1);
		histd_config_free(&cfg);
		assert_int_equal(load(&cfg, 4, most), 0);
		histd_config_free(&cfg);
	}
}

static void
unknown_yaml_key_is_refused(void **state)
{
	char path[] = "/tmp/histd-config-XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");
	histd_config cfg;
	char *argv[] = { "histd", "--config", path };

	(void)state;
	fprintf(f, "listen: 127.0.0.1:5\nlisen: typo\n");
	fclose(f);
	assert_int_equal(load(&cfg, 3, argv), -1);
	histd_config_free(&cfg);
	unlink(path);
}

/* Loads a config file holding text (and --auth-disabled); load's code. */
static int
load_yaml_text(histd_config *cfg, const char *text)
{
	char path[] = "/tmp/histd-config-XXXXXX";
	int fd = mkstemp(path);
	FILE *f = fdopen(fd, "w");
	char *argv[] = { "histd", "--auth-disabled", "--config", path };
	int rc;

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	rc = load(cfg, 4, argv);
	unlink(path);
	return rc;
}

/* The file is one flat mapping of scalars: nothing in it may hide
 * another value or be read as something else. */
static void
repeated_yaml_key_or_document_is_refused(void **state)
{
	const char *texts[] = {
		"max_messages_per_append: 3\nmax_messages_per_append: 6\n",
		"max_messages_per_append: 3\n---\nmax_messages_per_append: 6\n",
		"---\nlisten: 127.0.0.1:5\n---\n",
		/* Not a mapping: a list would be read as pairs. */
		"- max_messages_per_append\n- 6\n",
		"max_messages_per_append\n",
		/* An alias would leave its key without a value. */
		"replay_max: &n 7\nmax_page_size: *n\n",
	};
	histd_config cfg;

	(void)state;
	for (size_t i = 0; i < sizeof(texts) / sizeof(*texts); i++) {
		assert_int_equal(load_yaml_text(&cfg, texts[i]), -1);
		histd_config_free(&cfg);
	}
}

/* An empty document sets nothing: a template of comments is fine. */
static void
empty_yaml_document_sets_nothing(void **state)
{
	const char *texts[] = { "", "# comments only\n", "---\n",
				"--- # nothing yet\n", "~\n" };
	histd_config cfg;

	(void)state;
	for (size_t i = 0; i < sizeof(texts) / sizeof(*texts); i++) {
		if (load_yaml_text(&cfg, texts[i]) != 0)
			fail_msg("'%s' refused", texts[i]);
		assert_int_equal(cfg.service.max_page_size, 1000);
		histd_config_free(&cfg);
	}
}

static void
help_returns_one(void **state)
{
	histd_config cfg;
	char *argv[] = { "histd", "--help" };
	FILE *saved = stdout;

	(void)state;
	stdout = fopen("/dev/null", "w");
	assert_int_equal(load(&cfg, 2, argv), 1);
	fclose(stdout);
	stdout = saved;
	histd_config_free(&cfg);
}

static void
every_error_maps_to_its_status(void **state)
{
	(void)state;
	assert_int_equal(histd_status_from_error(HISTD_OK), GRPC_STATUS_OK);
	assert_int_equal(histd_status_from_error(HISTD_ENOTFOUND), GRPC_STATUS_NOT_FOUND);
	assert_int_equal(histd_status_from_error(HISTD_EEXISTS), GRPC_STATUS_ALREADY_EXISTS);
	assert_int_equal(histd_status_from_error(HISTD_ECONFLICT), GRPC_STATUS_ABORTED);
	assert_int_equal(histd_status_from_error(HISTD_EINVALID), GRPC_STATUS_INVALID_ARGUMENT);
	assert_int_equal(histd_status_from_error(HISTD_EPRECONDITION), GRPC_STATUS_FAILED_PRECONDITION);
	assert_int_equal(histd_status_from_error(HISTD_ELIMIT), GRPC_STATUS_RESOURCE_EXHAUSTED);
	assert_int_equal(histd_status_from_error(HISTD_EUNAVAILABLE), GRPC_STATUS_UNAVAILABLE);
	assert_int_equal(histd_status_from_error(HISTD_ECORRUPT), GRPC_STATUS_DATA_LOSS);
	assert_int_equal(histd_status_from_error(HISTD_EUNAUTH), GRPC_STATUS_UNAUTHENTICATED);
	assert_int_equal(histd_status_from_error(HISTD_EPERM), GRPC_STATUS_PERMISSION_DENIED);
	assert_int_equal(histd_status_from_error(HISTD_EUNIMPL), GRPC_STATUS_UNIMPLEMENTED);
	assert_int_equal(histd_status_from_error(HISTD_EINTERNAL), GRPC_STATUS_INTERNAL);
	assert_int_equal(histd_status_from_error(HISTD_EDEADLINE), GRPC_STATUS_DEADLINE_EXCEEDED);
	assert_int_equal(histd_status_from_error(-999), GRPC_STATUS_INTERNAL);
	assert_string_equal(histd_status_name(GRPC_STATUS_ABORTED), "ABORTED");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(defaults_apply_without_input),
		cmocka_unit_test(flag_beats_environment_beats_file),
		cmocka_unit_test(bad_input_is_refused),
		cmocka_unit_test(metrics_listen_needs_a_port),
		cmocka_unit_test(unknown_environment_variable_is_listed),
		cmocka_unit_test(zero_is_refused_where_one_is_the_least),
		cmocka_unit_test(values_past_their_limit_are_refused),
		cmocka_unit_test(unknown_yaml_key_is_refused),
		cmocka_unit_test(repeated_yaml_key_or_document_is_refused),
		cmocka_unit_test(empty_yaml_document_sets_nothing),
		cmocka_unit_test(help_returns_one),
		cmocka_unit_test(every_error_maps_to_its_status),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
