/* Helpers of the PostgreSQL tests (pgharness.h). */
#include "pgharness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

static char shared_dsn[1024];

static int
read_state_dsn(const char *state, char *out, size_t size)
{
	char line[1024];
	FILE *f = fopen(state, "r");

	if (!f)
		return -1;
	out[0] = '\0';
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "dsn=", 4)) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(out, size, "%s", line + 4);
		}
	fclose(f);
	return out[0] ? 0 : -1;
}

int
pgh_cluster_dsn(const char **dsn)
{
	const char *env = getenv("HISTD_PG_DSN");
	const char *state = getenv("HISTD_PG_STATE");

	if (env && *env)
		snprintf(shared_dsn, sizeof(shared_dsn), "%s", env);
	else if (!state || read_state_dsn(state, shared_dsn, sizeof(shared_dsn))) {
		fprintf(stderr, "pg tests: set HISTD_PG_DSN, or HISTD_PG_STATE to the "
			"state file of tests/pg/pgtest.sh start\n");
		return -1;
	}
	*dsn = shared_dsn;
	return 0;
}

static int
run_script(const char *cmd, const char *state, const char *stop_mode)
{
	const char *script = getenv("HISTD_PGTEST");
	pid_t pid;
	int status;

	if (!script || !*script) {
		fprintf(stderr, "pg tests: set HISTD_PGTEST to tests/pg/pgtest.sh\n");
		return -1;
	}
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		int null = open("/dev/null", 1);

		if (null >= 0) {
			dup2(null, 1);
			close(null);
		}
		if (stop_mode)
			setenv("PGTEST_STOP_MODE", stop_mode, 1);
		execl("/bin/sh", "sh", script, cmd, state, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int
pgh_cluster_start(const char *state, char **dsn)
{
	char buf[1024];

	if (run_script("start", state, NULL) != 0 ||
	    read_state_dsn(state, buf, sizeof(buf)) != 0) {
		fprintf(stderr, "pg tests: pgtest.sh start %s failed\n", state);
		return -1;
	}
	*dsn = strdup(buf);
	return *dsn ? 0 : -1;
}

int
pgh_cluster(const char *cmd, const char *state, const char *stop_mode)
{
	return run_script(cmd, state, stop_mode);
}

PGresult *
pgh_sql(const char *dsn, const char *sql)
{
	PGconn *c = PQconnectdb(dsn);
	PGresult *r;

	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "pg tests: %s", PQerrorMessage(c));
		PQfinish(c);
		return NULL;
	}
	r = PQexec(c, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK &&
	    PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "pg tests: %s: %s", sql, PQerrorMessage(c));
		PQclear(r);
		r = NULL;
	}
	PQfinish(c);
	return r;
}

char *
pgh_new_database(const char *dsn, const char *prefix)
{
	static unsigned n;
	char name[96], sql[160], *out;
	PGresult *r;
	size_t len;

	snprintf(name, sizeof(name), "%s_%ld_%u", prefix, (long)getpid(), n++);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
	r = pgh_sql(dsn, sql);
	if (!r)
		return NULL;
	PQclear(r);
	len = strlen(dsn) + strlen(name) + 16;
	out = malloc(len);
	if (out)
		snprintf(out, len, "%s dbname=%s", dsn, name);
	return out;
}

void
pgh_drop_database(const char *db_dsn)
{
	const char *p = NULL, *q = db_dsn;
	char base[1024], sql[160];
	PGresult *r;

	/* The last dbname= is ours (the cluster DSN has one too). */
	while (q && (q = strstr(q, " dbname=")) != NULL)
		p = q++;
	if (!p)
		return;
	/* The DSN we made: "<cluster dsn> dbname=<name>"; connect to the
	 * cluster's own database to drop it. */
	snprintf(base, sizeof(base), "%.*s", (int)(p - db_dsn), db_dsn);
	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)",
		 p + strlen(" dbname="));
	r = pgh_sql(base, sql);
	PQclear(r);
}
