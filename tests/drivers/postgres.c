/*
 * The conformance suite on the postgres driver. Each test gets a new, empty
 * database (CREATE DATABASE on the test cluster of tests/pg/pgtest.sh) that
 * the fixture drops once the driver is closed.
 *
 * The cluster: HISTD_PG_DSN (a libpq connection string), or the state file
 * pgtest.sh wrote, named by HISTD_PG_STATE (ctest sets it, and starts the
 * cluster as a fixture).
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"

typedef struct store {
	char name[64];
	char dsn[1024 + 80];
} store;

static char base_dsn[1024];

static int
load_dsn(void)
{
	const char *env = getenv("HISTD_PG_DSN");
	const char *state = getenv("HISTD_PG_STATE");
	char line[1024];
	FILE *f;

	if (env && *env) {
		snprintf(base_dsn, sizeof(base_dsn), "%s", env);
		return 0;
	}
	if (!state || !(f = fopen(state, "r"))) {
		fprintf(stderr, "driver_postgres: set HISTD_PG_DSN or HISTD_PG_STATE "
			"(tests/pg/pgtest.sh start STATE)\n");
		return -1;
	}
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "dsn=", 4)) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(base_dsn, sizeof(base_dsn), "%s", line + 4);
		}
	fclose(f);
	return base_dsn[0] ? 0 : -1;
}

static int
admin(const char *sql)
{
	PGconn *c = PQconnectdb(base_dsn);
	PGresult *r;
	int ok;

	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "driver_postgres: %s", PQerrorMessage(c));
		PQfinish(c);
		return -1;
	}
	r = PQexec(c, sql);
	ok = PQresultStatus(r) == PGRES_COMMAND_OK;
	if (!ok)
		fprintf(stderr, "driver_postgres: %s", PQerrorMessage(c));
	PQclear(r);
	PQfinish(c);
	return ok ? 0 : -1;
}

static int
store_new(void *ctx, histd_driver_config *cfg, void **out)
{
	static unsigned n;
	store *s = calloc(1, sizeof(*s));
	char sql[128];

	(void)ctx;
	if (!s)
		return HISTD_ENOMEM;
	snprintf(s->name, sizeof(s->name), "conf_%ld_%u", (long)getpid(), n++);
	snprintf(sql, sizeof(sql), "CREATE DATABASE %s", s->name);
	if (admin(sql) != 0) {
		free(s);
		return HISTD_EUNAVAILABLE;
	}
	/* A repeated keyword: the last one wins. */
	snprintf(s->dsn, sizeof(s->dsn), "%s dbname=%s", base_dsn, s->name);
	cfg->dsn = s->dsn;
	cfg->pool_size = 4;
	*out = s;
	return 0;
}

static void
store_free(void *ctx, void *p)
{
	store *s = p;
	char sql[128];

	(void)ctx;
	if (!s)
		return;
	snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", s->name);
	admin(sql);
	free(s);
}

int
main(void)
{
	const histd_conformance_fixture fx = {
		.driver = "postgres",
		.read_budget = 1,
		.store_new = store_new,
		.store_free = store_free,
	};

	if (load_dsn() != 0)
		return 1;
	return histd_conformance_run(&fx) ? 1 : 0;
}
