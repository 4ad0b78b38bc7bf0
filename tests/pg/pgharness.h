/*
 * Helpers of the PostgreSQL tests: the test cluster (tests/pg/pgtest.sh),
 * a fresh database per test program, admin SQL.
 *
 * The shared cluster is the ctest fixture "pg": its state file is named by
 * $HISTD_PG_STATE (or a DSN given in $HISTD_PG_DSN). Tests that stop
 * PostgreSQL start a cluster of their own with pgh_cluster_start, using the
 * script named by $HISTD_PGTEST.
 */
#ifndef HISTD_TESTS_PGHARNESS_H
#define HISTD_TESTS_PGHARNESS_H

#include <libpq-fe.h>

/* The DSN of the shared cluster (its "histd" database). Returns 0, or -1
 * with a line on stderr. The string is static. */
int pgh_cluster_dsn(const char **dsn);

/* Starts a cluster of its own with pgtest.sh into state file `state`
 * (a path the caller chose) and returns its DSN (malloc'ed) in *dsn. */
int pgh_cluster_start(const char *state, char **dsn);
/* pgtest.sh <cmd> state: "stop", "halt", "resume". Returns the exit
 * status. PGTEST_STOP_MODE=immediate in the environment of a "halt" makes
 * it a crash. */
int pgh_cluster(const char *cmd, const char *state, const char *stop_mode);

/* Creates a new empty database "<prefix>_<pid>_<n>" on the cluster of
 * `dsn` and returns a DSN for it (malloc'ed). */
char *pgh_new_database(const char *dsn, const char *prefix);
/* Drops it (its DSN as returned above). */
void pgh_drop_database(const char *db_dsn);

/* Runs SQL on a new connection to dsn; returns the result (PQclear it)
 * or NULL with the error on stderr. */
PGresult *pgh_sql(const char *dsn, const char *sql);

#endif
