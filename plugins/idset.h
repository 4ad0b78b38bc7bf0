/*
 * A small set of strings (tool call ids) for the pipeline: open
 * addressing, borrowed keys (the caller keeps them alive while the set
 * is used). Internal to plugins/.
 */
#ifndef HISTD_IDSET_H
#define HISTD_IDSET_H

#include <stddef.h>

#define HISTD_IDSET_INLINE 16

typedef struct histd_idset {
	const char **slot;      /* NULL: empty; TOMBSTONE: deleted */
	size_t cap;             /* power of two, or 0 */
	size_t used;            /* live + deleted slots */
	size_t count;           /* live keys */
	/* The first slots, inside the set: a small set allocates nothing
	 * (so a set is not copied once used). */
	const char *inl[HISTD_IDSET_INLINE];
} histd_idset;

void histd_idset_init(histd_idset *s);
void histd_idset_free(histd_idset *s);
/* 0 (also if present already) or HISTD_ENOMEM. */
int histd_idset_add(histd_idset *s, const char *key);
void histd_idset_del(histd_idset *s, const char *key);
int histd_idset_has(const histd_idset *s, const char *key);

#endif
