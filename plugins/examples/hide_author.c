/*
 * hide_author: an example of a plugin built outside histd's tree.
 *
 * It leaves out of the CONTEXT view the messages written by given authors
 * (Message.author), e.g. a "debug" agent whose notes the model should not
 * see. Build it as a shared object against plugins/plugin.h and start
 * histd with --plugins /path/to/hide_author.so; then a session's pipeline
 * may name it:
 *
 *   {"name": "hide_author", "options": {"authors": "debug|tracer"}}
 *
 * Everything it needs from the host comes through v->ops; it calls no
 * histd function directly (the host binary exports none).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

struct state {
	char *authors;          /* '|'-separated, with a '|' at each end */
};

static int
configure(const histd_plugin_opt *o, size_t n, void **state, char *err,
	  size_t cap)
{
	struct state *s;
	const char *authors = NULL;
	size_t len;

	for (size_t i = 0; i < n; i++) {
		if (strcmp(o[i].key, "authors")) {
			snprintf(err, cap, "options: only \"authors\" is an "
				 "option of hide_author");
			return HISTD_EINVALID;
		}
		authors = o[i].value;
	}
	if (!authors || !*authors) {
		snprintf(err, cap, "options.authors is required");
		return HISTD_EINVALID;
	}
	if (!(s = malloc(sizeof(*s))))
		return HISTD_ENOMEM;
	len = strlen(authors);
	if (!(s->authors = malloc(len + 3))) {
		free(s);
		return HISTD_ENOMEM;
	}
	snprintf(s->authors, len + 3, "|%s|", authors);
	*state = s;
	return 0;
}

static void
release(void *state)
{
	struct state *s = state;

	free(s->authors);
	free(s);
}

static int
hidden(const struct state *s, const char *author)
{
	size_t n = strlen(author);
	const char *p = s->authors;

	/* '|' separates the names: an author holding one is none of them
	 * (and so every match starts after the list's first '|'). */
	if (!n || strchr(author, '|'))
		return 0;
	while ((p = strstr(p, author))) {
		if (p[-1] == '|' && p[n] == '|')
			return 1;
		p++;
	}
	return 0;
}

static int
transform(void *state, histd_view *v)
{
	for (size_t i = 0; i < v->n;) {
		Histd__V1__Message *m;

		if (v->items[i].flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY)) {
			i++;
			continue;
		}
		if (!(m = v->ops->message(v, i)))
			return HISTD_ECORRUPT;
		if (hidden(state, m->author))
			v->ops->remove(v, i);
		else
			i++;
	}
	return 0;
}

static const histd_plugin plugin = {
	.version = HISTD_PLUGIN_VERSION,
	.name = "hide_author",
	.configure = configure,
	.release = release,
	.transform = transform,
};

const histd_plugin *histd_plugin_entry(unsigned int host_version);

const histd_plugin *
histd_plugin_entry(unsigned int host_version)
{
	return host_version >= HISTD_PLUGIN_VERSION ? &plugin : NULL;
}
