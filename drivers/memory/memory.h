/*
 * The memory driver: every session in this process's memory, gone when it
 * exits. The reference for the behaviour every driver shares (driver.h),
 * and the fastest one.
 *
 * Locking: one read-write lock over the tenants and their session maps, and
 * one mutex per session over that session's data; appends to different
 * sessions do not contend. It reads no option of histd_driver_config.
 */
#ifndef HISTD_MEMORY_H
#define HISTD_MEMORY_H

#include "driver.h"

/* Opens an empty memory driver; *out is freed with histd_driver_close.
 * cfg may be NULL. Returns 0 or HISTD_ENOMEM. */
int histd_memory_driver_open(const histd_driver_config *cfg,
			     histd_driver **out);

/* Tests only (NULL in histd): called at the start of every read, before
 * the session is looked up; what it does races the read's caller. */
extern void (*_Atomic histd_memory_read_test_hook)(const histd_read *q);

#endif
