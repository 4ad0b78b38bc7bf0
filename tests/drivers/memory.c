/*
 * The conformance suite on the memory driver. Its store is the driver's
 * own process memory, fresh at every open: there is nothing to make or
 * remove, and no option to set.
 */
#include "conformance.h"

static int store_new(void *ctx, histd_driver_config *cfg, void **store)
{
	(void)ctx;
	(void)cfg;
	*store = NULL;
	return 0;
}

int main(void)
{
	const histd_conformance_fixture fx = {
		.driver = "memory",
		.read_budget = 1,
		.store_new = store_new,
	};

	return histd_conformance_run(&fx) ? 1 : 0;
}
