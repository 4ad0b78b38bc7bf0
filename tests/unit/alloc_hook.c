/*
 * The allocation hook of alloc_hook.h.
 */
#include "alloc_hook.h"

#if ALLOC_HOOK
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static __thread int counting;
static __thread size_t count;
static __thread long fail_in = -1;      /* fails when it reaches 0 */
static __thread int failed;
static __thread long live;

void
alloc_hook_start(long fail_at)
{
	count = 0;
	live = 0;
	failed = 0;
	fail_in = fail_at;
	counting = 1;
}

size_t
alloc_hook_stop(void)
{
	counting = 0;
	fail_in = -1;
	return count;
}

int
alloc_hook_failed(void)
{
	return failed;
}

long
alloc_hook_live(void)
{
	return live;
}

/* Whether this allocation fails (counted if counting). */
static int
fails(void)
{
	if (!counting)
		return 0;
	count++;
	if (fail_in < 0 || fail_in-- != 0)
		return 0;
	failed = 1;
	return 1;
}

void *
malloc(size_t n)
{
	void *p = fails() ? NULL : __libc_malloc(n);

	if (p && counting)
		live++;
	return p;
}

void *
calloc(size_t a, size_t b)
{
	void *p = fails() ? NULL : __libc_calloc(a, b);

	if (p && counting)
		live++;
	return p;
}

void *
realloc(void *old, size_t n)
{
	void *p;

	if (fails())
		return NULL;
	p = __libc_realloc(old, n);
	if (counting) {
		if (!old && p)
			live++;
		else if (old && !p && n == 0)
			live--;
	}
	return p;
}

void
free(void *p)
{
	if (p && counting)
		live--;
	__libc_free(p);
}
#else
void
alloc_hook_start(long fail_at)
{
	(void)fail_at;
}

size_t
alloc_hook_stop(void)
{
	return 0;
}

int
alloc_hook_failed(void)
{
	return 0;
}

long
alloc_hook_live(void)
{
	return 0;
}
#endif
