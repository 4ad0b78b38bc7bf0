/*
 * Option parsing shared by the built-in plugins (static inline: a shared
 * object plugin may include it too, it calls nothing in the host).
 */
#ifndef HISTD_PLUGIN_OPTS_H
#define HISTD_PLUGIN_OPTS_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

/* A whole number 0..max (decimal). 0 or HISTD_EINVALID with err set. */
static inline int
histd_opt_uint(const histd_plugin_opt *o, uint64_t max, uint64_t *out,
	       char *err, size_t cap)
{
	const char *s = o->value;
	char *end;
	unsigned long long v;

	/* Digits only: strtoull would take leading white space and a
	 * sign. */
	if (*s < '0' || *s > '9')
		goto bad;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || *end || v > max)
		goto bad;
	*out = v;
	return 0;
bad:
	snprintf(err, cap, "options.%s must be a whole number from 0 to %llu",
		 o->key, (unsigned long long)max);
	return HISTD_EINVALID;
}

static inline int
histd_opt_unknown(const histd_plugin_opt *o, const char *plugin, char *err,
		  size_t cap)
{
	size_t n = strlen(o->key);

	/* Option keys are the client's: print only safe characters. */
	for (size_t i = 0; i < n; i++)
		if (!((o->key[i] >= 'a' && o->key[i] <= 'z') ||
		      (o->key[i] >= '0' && o->key[i] <= '9') || o->key[i] == '_'))
			n = 0;
	if (n == 0 || n > 64)
		snprintf(err, cap, "options: an option is not one the %s "
			 "plugin knows", plugin);
	else
		snprintf(err, cap, "options.%s is not an option of the %s "
			 "plugin", o->key, plugin);
	return HISTD_EINVALID;
}

#endif
