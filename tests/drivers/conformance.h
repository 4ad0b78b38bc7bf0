/*
 * The driver conformance suite: what drivers/driver.h promises, written once
 * and run on every driver.
 *
 * The suite knows drivers only by name: each test opens the driver with
 * histd_driver_open on a fresh, empty store, calls nothing but the
 * histd_driver_* wrappers, closes it, and lets the fixture remove the store.
 * So a test never sees another test's sessions, and a driver that passes
 * here passes for the reasons the header gives, not for its internals.
 *
 * A runner (tests/drivers/<driver>.c) is a fixture and a main:
 *
 *	static int store_new(void *ctx, histd_driver_config *cfg, void **store)
 *	{ ... make a temp dir, cfg->data_dir = it, *store = it ... }
 *	static void store_free(void *ctx, void *store) { ... remove it ... }
 *
 *	int main(void)
 *	{
 *		const histd_conformance_fixture fx = {
 *			.driver = "file", .store_new = store_new,
 *			.store_free = store_free,
 *		};
 *		return histd_conformance_run(&fx) ? 1 : 0;
 *	}
 *
 * HISTD_TEST_FILTER in the environment (a cmocka pattern, e.g. "append_*")
 * runs only the matching tests.
 */
#ifndef HISTD_TESTS_CONFORMANCE_H
#define HISTD_TESTS_CONFORMANCE_H

#include "driver.h"

typedef struct histd_conformance_fixture {
	/* The registered name given to histd_driver_open ("memory", ...). */
	const char *driver;
	/* Required. Makes a fresh, empty store (a new temp dir, a new
	 * database or schema) and fills *cfg (zeroed before the call) to open
	 * the driver on it. *store is the fixture's own handle, given back to
	 * store_free; the strings cfg points at must live until then. Returns
	 * 0 or a negative HISTD_E* code (the test then fails in its setup).
	 * Called once per test, on the test's thread. */
	int (*store_new)(void *ctx, histd_driver_config *cfg, void **store);
	/* Optional. Removes what store_new made; called after the driver is
	 * closed. */
	void (*store_free)(void *ctx, void *store);
	/* Passed to both, as given. */
	void *ctx;
	/* Non-zero: the driver honours histd_read.max_bytes (optional in
	 * driver.h), and the suite checks that it returns exactly what the
	 * budget keeps; else only that what it returns is right. */
	int read_budget;
} histd_conformance_fixture;

/* Runs every conformance test on `fx`, each on its own fresh store, and
 * prints cmocka's report. Returns the number of tests that failed (0: the
 * driver conforms). `fx` is borrowed for the call. */
int histd_conformance_run(const histd_conformance_fixture *fx);

/* The search tests alone (conformance_search.c); histd_conformance_run
 * runs them after the others. A version 1 driver, which cannot search, is
 * reported as skipped. */
int histd_conformance_search_run(const histd_conformance_fixture *fx);

#endif
