/*
 * Counting, and failing, the allocations of the calling thread, for the
 * unit tests that check behaviour out of memory (test_hub, test_search).
 * Linked only into those programs: it replaces malloc, calloc, realloc
 * and free with wrappers around glibc's own. Other threads are never
 * counted or failed.
 *
 * Under a sanitizer (which brings its own allocator) the hook is off:
 * ALLOC_HOOK is 0 and the tests that need it skip.
 */
#ifndef HISTD_TEST_ALLOC_HOOK_H
#define HISTD_TEST_ALLOC_HOOK_H

#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOC_HOOK 0
#else
#define ALLOC_HOOK 1
#endif

/* Counts this thread's allocations from now on. fail_at >= 0: the
 * allocation with that index (0: the next one) returns NULL, and only
 * that one; -1: none fails. */
void alloc_hook_start(long fail_at);

/* Stops counting; the allocations counted since alloc_hook_start. */
size_t alloc_hook_stop(void);

/* Whether the allocation chosen by alloc_hook_start was reached (and
 * failed) since. */
int alloc_hook_failed(void);

/* Since alloc_hook_start: blocks allocated minus blocks freed on this
 * thread (a free of a block from before counts too). */
long alloc_hook_live(void);

#endif
