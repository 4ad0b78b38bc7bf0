#include "idset.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "histd_error.h"

static const char tombstone[1];
#define TOMBSTONE ((const char *)tombstone)

static uint64_t
hash(const char *s)
{
	uint64_t h = 1469598103934665603ull;   /* FNV-1a */

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

void
histd_idset_init(histd_idset *s)
{
	memset(s, 0, sizeof(*s));
}

void
histd_idset_free(histd_idset *s)
{
	if (s->slot != s->inl)
		free(s->slot);
	s->slot = NULL;
	s->cap = s->used = s->count = 0;
}

/* The slot holding key, or the first free one on its probe path. */
static size_t
probe(const histd_idset *s, const char *key, int *found)
{
	size_t mask = s->cap - 1, i = (size_t)hash(key) & mask;
	size_t free_at = SIZE_MAX;

	*found = 0;
	for (;;) {
		const char *k = s->slot[i];

		if (!k)
			return free_at != SIZE_MAX ? free_at : i;
		if (k == TOMBSTONE) {
			if (free_at == SIZE_MAX)
				free_at = i;
		} else if (!strcmp(k, key)) {
			*found = 1;
			return i;
		}
		i = (i + 1) & mask;
	}
}

static int
grow(histd_idset *s)
{
	size_t cap = s->cap * 2;
	histd_idset n = { 0 };
	int found;

	if (!s->cap) {
		memset(s->inl, 0, sizeof(s->inl));
		s->slot = s->inl;
		s->cap = HISTD_IDSET_INLINE;
		return 0;
	}
	n.slot = calloc(cap, sizeof(char *));
	n.cap = cap;
	if (!n.slot)
		return HISTD_ENOMEM;
	for (size_t i = 0; i < s->cap; i++)
		if (s->slot[i] && s->slot[i] != TOMBSTONE) {
			n.slot[probe(&n, s->slot[i], &found)] = s->slot[i];
			n.used++;
			n.count++;
		}
	if (s->slot != s->inl)
		free(s->slot);
	s->slot = n.slot;
	s->cap = n.cap;
	s->used = n.used;
	s->count = n.count;
	return 0;
}

int
histd_idset_add(histd_idset *s, const char *key)
{
	size_t i;
	int found;

	if ((s->used + 1) * 2 > s->cap && grow(s))
		return HISTD_ENOMEM;
	i = probe(s, key, &found);
	if (found)
		return 0;
	if (!s->slot[i])
		s->used++;
	s->slot[i] = key;
	s->count++;
	return 0;
}

void
histd_idset_del(histd_idset *s, const char *key)
{
	size_t i;
	int found;

	if (!s->cap)
		return;
	i = probe(s, key, &found);
	if (found) {
		s->slot[i] = TOMBSTONE;
		s->count--;
	}
}

int
histd_idset_has(const histd_idset *s, const char *key)
{
	int found;

	if (!s->cap)
		return 0;
	probe(s, key, &found);
	return found;
}
