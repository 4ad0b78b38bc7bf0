/*
 * The postgres driver: sessions and messages in PostgreSQL (libpq), shared
 * by every histd replica that points at the same database.
 *
 * Configuration (histd_driver_config): dsn, a libpq connection string or
 * URI (required); pool_size, the connections it keeps (1..1000, 0: 8);
 * timeout_ms, how long a statement may take (0..86400000, 0: no limit).
 * Open creates or upgrades the schema (refusing one newer than this
 * binary) and fails with EUNAVAILABLE if the database cannot be reached.
 * See deploy/postgres.md for the settings it expects.
 */
#ifndef HISTD_POSTGRES_H
#define HISTD_POSTGRES_H

#include "driver.h"

int histd_postgres_driver_open(const histd_driver_config *cfg,
			       histd_driver **out);

#endif
