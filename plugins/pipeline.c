/*
 * The plugin registry, configured pipelines, and views (plugin.h).
 */
#include "plugin.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histd_wire.h"
#include "idset.h"
#include "tokens.h"

/* ---------------------------------------------------------------------- */
/* Registry                                                                */

#define REGISTRY_MAX 64
#define NAME_MAX_LEN 64
#define OPTS_MAX 64

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;
static const histd_plugin *registry[REGISTRY_MAX];
static size_t n_registry;

static int
name_ok(const char *s)
{
	size_t n = 0;

	if (!s || !*s)
		return 0;
	for (; s[n]; n++)
		if (n >= NAME_MAX_LEN ||
		    !((s[n] >= 'a' && s[n] <= 'z') ||
		      (s[n] >= '0' && s[n] <= '9') || s[n] == '_'))
			return 0;
	return 1;
}

static int
register_locked(const histd_plugin *p)
{
	if (!p)
		return histd_error_set(HISTD_EINVALID, "plugin is NULL");
	if (p->version == 0 || p->version > HISTD_PLUGIN_VERSION)
		return histd_error_set(HISTD_EINVALID,
			"plugin version %u is not supported (host %u)",
			p->version, HISTD_PLUGIN_VERSION);
	if (!name_ok(p->name))
		return histd_error_set(HISTD_EINVALID,
			"plugin name must be 1..%d characters of [a-z0-9_]",
			NAME_MAX_LEN);
	if (!p->configure)
		return histd_error_set(HISTD_EINVALID,
			"plugin %s has no configure hook", p->name);
	if (!p->transform && !p->after_append && !p->reduce)
		return histd_error_set(HISTD_EINVALID,
			"plugin %s has no transform, after_append or reduce "
			"hook", p->name);
	for (size_t i = 0; i < n_registry; i++)
		if (!strcmp(registry[i]->name, p->name))
			return histd_error_set(HISTD_EEXISTS,
				"a plugin named %s is registered already",
				p->name);
	if (n_registry == REGISTRY_MAX)
		return histd_error_set(HISTD_ELIMIT,
			"at most %d plugins can be registered", REGISTRY_MAX);
	registry[n_registry++] = p;
	return 0;
}

static void
register_builtins(void)
{
	pthread_mutex_lock(&reg_lock);
	register_locked(&histd_plugin_window);
	register_locked(&histd_plugin_masking);
	register_locked(&histd_plugin_compaction);
	pthread_mutex_unlock(&reg_lock);
}

int
histd_plugin_register(const histd_plugin *p)
{
	int rc;

	pthread_once(&reg_once, register_builtins);
	pthread_mutex_lock(&reg_lock);
	rc = register_locked(p);
	pthread_mutex_unlock(&reg_lock);
	return rc;
}

const histd_plugin *
histd_plugin_find(const char *name)
{
	const histd_plugin *p = NULL;

	pthread_once(&reg_once, register_builtins);
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < n_registry && !p; i++)
		if (!strcmp(registry[i]->name, name))
			p = registry[i];
	pthread_mutex_unlock(&reg_lock);
	return p;
}

/* ---------------------------------------------------------------------- */
/* Pipelines                                                               */

struct stage {
	const histd_plugin *plugin;
	void *state;
	/* The options as given, kept for histd_pipeline_dup. */
	histd_plugin_opt *opts;
	size_t n_opts;
};

struct histd_pipeline {
	struct stage *v;
	size_t n;
};

void
histd_pipeline_free(histd_pipeline *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++) {
		struct stage *s = &p->v[i];

		if (s->state)
			s->plugin->release(s->state);
		for (size_t k = 0; k < s->n_opts; k++) {
			free((char *)s->opts[k].key);
			free((char *)s->opts[k].value);
		}
		free(s->opts);
	}
	free(p->v);
	free(p);
}

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

/* Adds a stage: finds the plugin, configures it with copies of opts.
 * `where` names the plugin in errors ("config.pipeline.plugins[0]"). */
static int
add_stage(histd_pipeline *p, const char *name, const histd_plugin_opt *opts,
	  size_t n, const char *where)
{
	const histd_plugin *pl;
	struct stage *s;
	char err[256] = "";
	int rc;

	if (!name || !name[0])
		return histd_error_set(HISTD_EINVALID, "%s.name is required",
				       where);
	if (!(pl = histd_plugin_find(name)))
		return histd_error_set(HISTD_EINVALID,
			"%s.name: unknown plugin", where);
	if (n > OPTS_MAX)
		return histd_error_set(HISTD_EINVALID,
			"%s.options holds more than %d options", where,
			OPTS_MAX);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < i; k++)
			if (!strcmp(opts[i].key, opts[k].key))
				return histd_error_set(HISTD_EINVALID,
					"%s.options: an option is given twice",
					where);
	s = realloc(p->v, (p->n + 1) * sizeof(*s));
	if (!s)
		return enomem();
	p->v = s;
	s = &p->v[p->n];
	memset(s, 0, sizeof(*s));
	rc = pl->configure(opts, n, &s->state, err, sizeof(err));
	if (rc) {
		s->state = NULL;
		if (rc == HISTD_ENOMEM)
			return enomem();
		return histd_error_set(rc, "%s.%s", where,
				       err[0] ? err : "options are not valid");
	}
	if (s->state && !pl->release) {
		/* Nothing can free it: a bug of the plugin (plugin.h), not of
		 * the options. The state is left to the plugin. */
		s->state = NULL;
		return histd_error_set(HISTD_EINTERNAL,
			"%s: plugin %s made a state but has no release hook",
			where, pl->name);
	}
	s->plugin = pl;
	p->n++;
	if (n) {
		s->opts = calloc(n, sizeof(*s->opts));
		if (!s->opts)
			return enomem();
		s->n_opts = n;
		for (size_t i = 0; i < n; i++) {
			s->opts[i].key = strdup(opts[i].key);
			s->opts[i].value = strdup(opts[i].value);
			if (!s->opts[i].key || !s->opts[i].value)
				return enomem();
		}
	}
	return 0;
}

int
histd_pipeline_build(const Histd__V1__SessionConfig *c, const char *field,
		     const histd_pipeline *def, histd_pipeline **out)
{
	histd_pipeline *p;
	histd_plugin_opt opts[OPTS_MAX];
	char where[160];
	int rc;

	*out = NULL;
	if (!c || !c->pipeline)
		return histd_pipeline_dup(def, out);
	if (!(p = calloc(1, sizeof(*p))))
		return enomem();
	for (size_t i = 0; i < c->pipeline->n_plugins; i++) {
		const Histd__V1__PluginConfig *pc = c->pipeline->plugins[i];
		size_t n = pc->n_options;

		snprintf(where, sizeof(where), "%s.pipeline.plugins[%zu]",
			 field, i);
		if (n > OPTS_MAX) {
			rc = histd_error_set(HISTD_EINVALID,
				"%s.options holds more than %d options", where,
				OPTS_MAX);
			goto fail;
		}
		for (size_t k = 0; k < n; k++) {
			opts[k].key = pc->options[k]->key;
			opts[k].value = pc->options[k]->value;
		}
		if ((rc = add_stage(p, pc->name, opts, n, where)))
			goto fail;
	}
	*out = p;
	return 0;
fail:
	histd_pipeline_free(p);
	return rc;
}

int
histd_pipeline_validate(const Histd__V1__SessionConfig *c, const char *field)
{
	histd_pipeline *p = NULL;
	int rc;

	if (!c || !c->pipeline)
		return 0;
	rc = histd_pipeline_build(c, field, NULL, &p);
	histd_pipeline_free(p);
	return rc;
}

int
histd_pipeline_dup(const histd_pipeline *src, histd_pipeline **out)
{
	histd_pipeline *p;
	int rc;

	*out = NULL;
	if (!src)
		return 0;
	if (!(p = calloc(1, sizeof(*p))))
		return enomem();
	for (size_t i = 0; i < src->n; i++) {
		const struct stage *s = &src->v[i];

		if ((rc = add_stage(p, s->plugin->name, s->opts, s->n_opts,
				    "pipeline"))) {
			histd_pipeline_free(p);
			return rc;
		}
	}
	*out = p;
	return 0;
}

/* Splits s at the first c (in place); returns the rest or NULL. */
static char *
cut_at(char *s, char c)
{
	char *p = strchr(s, c);

	if (!p)
		return NULL;
	*p = '\0';
	return p + 1;
}

static char *
trim(char *s)
{
	char *e;

	while (*s == ' ' || *s == '\t' || *s == '\n')
		s++;
	e = s + strlen(s);
	while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n'))
		*--e = '\0';
	return s;
}

int
histd_pipeline_parse(const char *spec, const char *field,
		     histd_pipeline **out)
{
	histd_pipeline *p;
	histd_plugin_opt opts[OPTS_MAX];
	char *copy, *item, *next, where[160];
	size_t idx = 0;
	int rc = 0;

	*out = NULL;
	if (!(p = calloc(1, sizeof(*p))))
		return enomem();
	if (!spec || !*spec) {
		*out = p;
		return 0;
	}
	if (!(copy = strdup(spec))) {
		free(p);
		return enomem();
	}
	for (item = copy; item && !rc; item = next, idx++) {
		char *name, *rest, *kv, *nkv;
		size_t n = 0;

		next = cut_at(item, ';');
		rest = cut_at(item, ':');
		name = trim(item);
		snprintf(where, sizeof(where), "%s: plugin %zu", field, idx);
		if (!*name && !rest && !next && idx > 0)
			break;      /* a trailing ';' */
		for (kv = rest; kv && !rc; kv = nkv) {
			char *val;

			nkv = cut_at(kv, ',');
			if (!*trim(kv))
				continue;
			if (!(val = cut_at(kv, '='))) {
				rc = histd_error_set(HISTD_EINVALID,
					"%s: an option is not key=value",
					where);
				break;
			}
			if (n == OPTS_MAX) {
				rc = histd_error_set(HISTD_EINVALID,
					"%s: more than %d options", where,
					OPTS_MAX);
				break;
			}
			opts[n].key = trim(kv);
			opts[n].value = trim(val);
			n++;
		}
		if (!rc)
			rc = add_stage(p, name, opts, n, where);
	}
	free(copy);
	if (rc) {
		histd_pipeline_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

size_t
histd_pipeline_len(const histd_pipeline *p)
{
	return p ? p->n : 0;
}

const histd_plugin *
histd_pipeline_plugin(const histd_pipeline *p, size_t i, void **state)
{
	if (!p || i >= p->n)
		return NULL;
	if (state)
		*state = p->v[i].state;
	return p->v[i].plugin;
}

int
histd_pipeline_after_append(const histd_pipeline *p,
			    const histd_session_totals *t)
{
	for (size_t i = 0; p && i < p->n; i++)
		if (p->v[i].plugin->after_append &&
		    p->v[i].plugin->after_append(p->v[i].state, t) > 0)
			return 1;
	return 0;
}

int
histd_pipeline_reducer(const histd_pipeline *p)
{
	for (size_t i = 0; p && i < p->n; i++)
		if (p->v[i].plugin->reduce)
			return (int)i;
	return -1;
}

uint32_t
histd_pipeline_newest_needed(const histd_pipeline *p)
{
	uint32_t most = 0;

	for (size_t i = 0; p && i < p->n; i++) {
		const histd_plugin *pl = p->v[i].plugin;
		uint32_t n;

		/* A version 1 struct ends before the hook. */
		if (pl->version < 2 || !pl->newest_needed)
			continue;
		if ((n = pl->newest_needed(p->v[i].state)) > most)
			most = n;
	}
	return most;
}

static int view_ran_out(const histd_view *v);

int
histd_pipeline_transform(const histd_pipeline *p, histd_view *v)
{
	int rc;

	for (size_t i = 0; p && i < p->n; i++) {
		if (!p->v[i].plugin->transform)
			continue;
		rc = p->v[i].plugin->transform(p->v[i].state, v);
		if (rc == HISTD_PLUGIN_MORE && v->complete)
			rc = 0;     /* nothing older exists */
		/* A message ops->message could not unpack for want of
		 * memory is not corrupt, whatever the plugin concluded. */
		if (rc == HISTD_ECORRUPT && view_ran_out(v))
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
		if (rc)
			return rc;
	}
	if (!v->complete && !v->bounded)
		return HISTD_PLUGIN_MORE;
	return histd_view_fixup(v);
}

/* ---------------------------------------------------------------------- */
/* Views                                                                   */

#define SPARE_CHUNK 32768       /* the size arena_alloc gives a chunk */

struct chunk {
	struct chunk *next;
	size_t cap, used;
	_Alignas(16) unsigned char mem[];
};

/* The tool blocks of one stored message, read from its bytes. */
struct tools_slot {
	const uint8_t *data;           /* NULL: empty slot */
	histd_view_tool *refs;
	size_t n;
};

struct host {
	struct chunk *chunks;
	size_t cap;                    /* of v->items */
	ProtobufCAllocator alloc;
	/* histd_view_tools of items not unpacked; item->host_ix is its slot
	 * + 1. */
	struct tools_slot *tools;
	size_t tools_cap, tools_used;
	int oom;                       /* an arena allocation failed */
	size_t moved;                  /* histd_view_moved */
};

static void *
arena_alloc(struct host *h, size_t size)
{
	struct chunk *c = h->chunks;
	void *p;

	size = (size + 15) & ~(size_t)15;
	if (!c || c->cap - c->used < size) {
		size_t cap = size > SPARE_CHUNK ? size : SPARE_CHUNK;

		if (!(c = malloc(sizeof(*c) + cap))) {
			h->oom = 1;
			return NULL;
		}
		c->cap = cap;
		c->used = 0;
		c->next = h->chunks;
		h->chunks = c;
	}
	p = c->mem + c->used;
	c->used += size;
	return p;
}

static int
view_ran_out(const histd_view *v)
{
	return ((const struct host *)v->host)->oom;
}

static void *
pb_alloc(void *data, size_t size)
{
	return arena_alloc(data, size);
}

static void
pb_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

void *
histd_view_alloc(histd_view *v, size_t size)
{
	void *p = arena_alloc(v->host, size);

	if (p)
		memset(p, 0, size);
	return p;
}

static char *
op_strdup(histd_view *v, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = arena_alloc(v->host, n);

	if (p)
		memcpy(p, s, n);
	return p;
}

Histd__V1__Message *
histd_view_message(histd_view *v, size_t i)
{
	struct host *h = v->host;
	histd_view_item *it;

	if (i >= v->n)
		return NULL;
	it = &v->items[i];
	if (!it->msg)
		it->msg = histd__v1__message__unpack(&h->alloc, it->len,
						     it->data);
	return it->msg;
}

static void
op_changed(histd_view *v, size_t i)
{
	histd_view_item *it = &v->items[i];

	it->flags |= HISTD_ITEM_CHANGED;
	if (it->msg) {
		it->tokens = histd_tokens_message(it->msg);
		it->msg->token_estimate = it->tokens;
	}
}

void
histd_view_remove_range(histd_view *v, size_t i, size_t k)
{
	struct host *h = v->host;
	size_t after;

	if (i >= v->n || !k)
		return;
	if (k > v->n - i)
		k = v->n - i;
	after = v->n - i - k;
	memmove(&v->items[i], &v->items[i + k], after * sizeof(v->items[0]));
	h->moved += after;
	v->n -= k;
}

size_t
histd_view_moved(const histd_view *v)
{
	return ((const struct host *)v->host)->moved;
}

static void
op_remove(histd_view *v, size_t i)
{
	histd_view_remove_range(v, i, 1);
}

static const histd_view_ops view_ops = {
	.version = HISTD_PLUGIN_VERSION,
	.message = histd_view_message,
	.changed = op_changed,
	.remove = op_remove,
	.alloc = histd_view_alloc,
	.strdup = op_strdup,
	.tokens = histd_tokens_message,
};

/*
 * A released view is kept, one per thread, for the next histd_view_new on
 * that thread: its item array, its first arena chunk and its tools table
 * are reused, and a CONTEXT read allocates nothing for its view. The key's
 * destructor frees it when the thread ends.
 */
/* What a kept view may hold on to: larger ones were for rare big views
 * and are freed. */
#define SPARE_ITEMS 1024
#define SPARE_TOOLS 256

static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static int spare_ok;

static void
view_destroy(histd_view *v)
{
	struct host *h = v->host;

	while (h->chunks) {
		struct chunk *c = h->chunks;

		h->chunks = c->next;
		free(c);
	}
	free(h->tools);
	free(h);
	free(v->items);
	free(v);
}

static void
spare_destroy(void *v)
{
	view_destroy(v);
}

static void
spare_init(void)
{
	spare_ok = pthread_key_create(&spare_key, spare_destroy) == 0;
}

histd_view *
histd_view_new(void)
{
	histd_view *v;
	struct host *h;

	pthread_once(&spare_once, spare_init);
	if (spare_ok && (v = pthread_getspecific(spare_key))) {
		pthread_setspecific(spare_key, NULL);
		return v;
	}
	v = calloc(1, sizeof(*v));
	h = calloc(1, sizeof(*h));
	if (!v || !h) {
		free(v);
		free(h);
		return NULL;
	}
	h->alloc.alloc = pb_alloc;
	h->alloc.free = pb_free;
	h->alloc.allocator_data = h;
	v->ops = &view_ops;
	v->host = h;
	return v;
}

void
histd_view_free(histd_view *v)
{
	struct host *h;
	struct chunk *keep = NULL;

	if (!v)
		return;
	if (!spare_ok || pthread_getspecific(spare_key)) {
		view_destroy(v);
		return;
	}
	/* Emptied as new, keeping one standard chunk, the item array and the
	 * tools table. */
	h = v->host;
	while (h->chunks) {
		struct chunk *c = h->chunks;

		h->chunks = c->next;
		if (!keep && c->cap == SPARE_CHUNK) {
			keep = c;
			keep->used = 0;
			keep->next = NULL;
		} else {
			free(c);
		}
	}
	h->chunks = keep;
	if (h->tools_cap > SPARE_TOOLS) {
		free(h->tools);
		h->tools = NULL;
		h->tools_cap = 0;
	}
	h->tools_used = 0;
	h->oom = 0;
	h->moved = 0;
	if (h->cap > SPARE_ITEMS) {
		free(v->items);
		v->items = NULL;
		h->cap = 0;
	}
	*v = (histd_view){ .ops = &view_ops, .items = v->items, .host = h };
	if (pthread_setspecific(spare_key, v))
		view_destroy(v);
}

static histd_view_item *
push_item(histd_view *v)
{
	struct host *h = v->host;

	if (v->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 32;
		histd_view_item *n = realloc(v->items, cap * sizeof(*n));

		if (!n)
			return NULL;
		v->items = n;
		h->cap = cap;
	}
	memset(&v->items[v->n], 0, sizeof(v->items[0]));
	return &v->items[v->n++];
}

/* Wire reading for the cheap scan of stored messages. */
static inline size_t
rd_varint(const uint8_t *p, size_t avail, uint64_t *v)
{
	uint64_t x = 0;

	for (size_t i = 0; i < avail && i < 10; i++) {
		x |= (uint64_t)(p[i] & 0x7f) << (7 * i);
		if (!(p[i] & 0x80)) {
			*v = x;
			return i + 1;
		}
	}
	return 0;
}

/* Reads a varint at *q (before end) and moves *q past it; 0 if
 * malformed. The scan's fast paths: keys and lengths of one or two
 * bytes. */
static inline int
get_varint(const uint8_t **q, const uint8_t *end, uint64_t *v)
{
	size_t n;

	if (*q < end && **q < 0x80) {
		*v = *(*q)++;
		return 1;
	}
	if (end - *q >= 2 && (*q)[1] < 0x80) {      /* lengths, seqs */
		*v = (uint64_t)((*q)[0] & 0x7f) | (uint64_t)(*q)[1] << 7;
		*q += 2;
		return 1;
	}
	if (!(n = rd_varint(*q, (size_t)(end - *q), v)))
		return 0;
	*q += n;
	return 1;
}

/* Moves *q past a field's value of wire type wt; a varint's value in *v,
 * a length-delimited one's payload at *sub (its length in *v). 0 if
 * malformed. */
static inline int
get_value(const uint8_t **q, const uint8_t *end, unsigned wt, uint64_t *v,
	  const uint8_t **sub)
{
	switch (wt) {
	case 0:
		return get_varint(q, end, v);
	case 1:
		if (end - *q < 8)
			return 0;
		*q += 8;
		return 1;
	case 5:
		if (end - *q < 4)
			return 0;
		*q += 4;
		return 1;
	case 2:
		if (!get_varint(q, end, v) || *v > (uint64_t)(end - *q))
			return 0;
		*sub = *q;
		*q += *v;
		return 1;
	default:
		return 0;
	}
}

int
histd_message_scan(const uint8_t *p, size_t len, int *role, uint32_t *flags)
{
	const uint8_t *q = p, *end = p + len;
	uint32_t f = 0;
	int r = 0;

	*role = 0;
	*flags = 0;
	while (q < end) {
		const uint8_t *sub = NULL, *b, *bend;
		uint64_t key, v = 0;

		if (!get_varint(&q, end, &key) ||
		    !get_value(&q, end, key & 7, &v, &sub))
			return HISTD_ECORRUPT;
		if (key == (2 << 3 | 0)) {
			r = (int)v;
			continue;
		}
		if (key != (3 << 3 | 2))
			continue;
		/* A ContentBlock: which of its oneof fields is set. */
		for (b = sub, bend = sub + v; b < bend;) {
			const uint8_t *s2;
			uint64_t k2, v2;

			if (!get_varint(&b, bend, &k2) ||
			    !get_value(&b, bend, k2 & 7, &v2, &s2))
				return HISTD_ECORRUPT;
			switch (k2 >> 3) {
			case 4:
				f |= HISTD_ITEM_REASONING;
				break;
			case 5:
				f |= HISTD_ITEM_CALLS;
				break;
			case 6:
				f |= HISTD_ITEM_RESULTS;
				break;
			}
		}
	}
	if (r == HISTD__V1__ROLE__ROLE_SYSTEM)
		f |= HISTD_ITEM_SYSTEM;
	*role = r;
	*flags = f;
	return 0;
}

/* A ToolCallBlock's or ToolResultBlock's fields 1 and 2 (both strings;
 * the last occurrence wins, as unpacking does). */
static int
scan_two_strings(const uint8_t *p, size_t len, const uint8_t **s1,
		 size_t *l1, const uint8_t **s2, size_t *l2)
{
	const uint8_t *q = p, *end = p + len;

	*s1 = *s2 = NULL;
	*l1 = *l2 = 0;
	while (q < end) {
		const uint8_t *sub = NULL;
		uint64_t key, v = 0;

		if (!get_varint(&q, end, &key))
			return HISTD_ECORRUPT;
		if ((key >> 3 == 1 || key >> 3 == 2) && (key & 7) != 2)
			return HISTD_ECORRUPT;
		if (!get_value(&q, end, key & 7, &v, &sub))
			return HISTD_ECORRUPT;
		if (key >> 3 == 1) {
			*s1 = sub;
			*l1 = (size_t)v;
		} else if (key >> 3 == 2) {
			*s2 = sub;
			*l2 = (size_t)v;
		}
	}
	return 0;
}

/* A NUL-terminated copy of len bytes in the view's arena. */
static char *
arena_strndup(struct host *h, const uint8_t *s, size_t len)
{
	char *p = arena_alloc(h, len + 1);

	if (p) {
		if (len)
			memcpy(p, s, len);
		p[len] = '\0';
	}
	return p;
}

/*
 * The tool blocks of a packed Message, in content order: all counted into
 * *n, the first cap of them filled into refs. Each ContentBlock's oneof is
 * its last field of 1..6, as unpacking decides.
 */
static int
tools_scan(struct host *h, const uint8_t *p, size_t len,
	   histd_view_tool *refs, size_t cap, size_t *n)
{
	const uint8_t *q = p, *end = p + len;
	size_t k = 0;
	uint32_t block = 0;

	while (q < end) {
		const uint8_t *sub = NULL, *b, *bend, *one = NULL, *s1, *s2;
		size_t one_len = 0, l1, l2;
		uint64_t key, v = 0;
		unsigned which = 0;

		if (!get_varint(&q, end, &key))
			return HISTD_ECORRUPT;
		if (key >> 3 == 3 && (key & 7) != 2)
			return HISTD_ECORRUPT;
		if (!get_value(&q, end, key & 7, &v, &sub))
			return HISTD_ECORRUPT;
		if (key >> 3 != 3)
			continue;
		for (b = sub, bend = sub + v; b < bend;) {
			const uint8_t *s3 = NULL;
			uint64_t k2, v2 = 0;

			if (!get_varint(&b, bend, &k2) ||
			    !get_value(&b, bend, k2 & 7, &v2, &s3))
				return HISTD_ECORRUPT;
			if (k2 >> 3 >= 1 && k2 >> 3 <= 6) {
				if ((k2 & 7) != 2)
					return HISTD_ECORRUPT;
				which = (unsigned)(k2 >> 3);
				one = s3;
				one_len = (size_t)v2;
			}
		}
		if (which == 5 || which == 6) {
			if (scan_two_strings(one, one_len, &s1, &l1, &s2, &l2))
				return HISTD_ECORRUPT;
			if (k < cap) {
				histd_view_tool *r = &refs[k];

				r->kind = which == 5 ? HISTD_ITEM_CALLS :
						       HISTD_ITEM_RESULTS;
				r->block = block;
				r->id = arena_strndup(h, s1, l1);
				r->name = arena_strndup(h, s2, l2);
				if (!r->id || !r->name)
					return HISTD_ENOMEM;
			}
			k++;
		}
		block++;
	}
	*n = k;
	return 0;
}

/* The refs of an unpacked message, in the arena. */
static int
tools_of_msg(struct host *h, const Histd__V1__Message *m,
	     const histd_view_tool **out, size_t *n)
{
	histd_view_tool *refs;
	size_t k = 0;

	for (size_t j = 0; j < m->n_content; j++)
		if (m->content[j]->block_case ==
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL ||
		    m->content[j]->block_case ==
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
			k++;
	*out = NULL;
	*n = 0;
	if (!k)
		return 0;
	if (!(refs = arena_alloc(h, k * sizeof(*refs))))
		return enomem();
	k = 0;
	for (size_t j = 0; j < m->n_content; j++) {
		const Histd__V1__ContentBlock *b = m->content[j];
		histd_view_tool *r = &refs[k];

		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
			r->kind = HISTD_ITEM_CALLS;
			r->id = b->tool_call->id;
			r->name = b->tool_call->name;
		} else if (b->block_case ==
			   HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
			r->kind = HISTD_ITEM_RESULTS;
			r->id = b->tool_result->tool_call_id;
			r->name = b->tool_result->tool_name;
		} else
			continue;
		r->block = (uint32_t)j;
		if (!r->id)
			r->id = "";
		if (!r->name)
			r->name = "";
		k++;
	}
	*out = refs;
	*n = k;
	return 0;
}

#if UINTPTR_MAX == UINT64_MAX
/* host_ix took padding: plugins built against the older header see the
 * same layout. */
_Static_assert(sizeof(histd_view_item) == 48,
	       "histd_view_item's layout changed: bump HISTD_PLUGIN_VERSION");
#endif

/* Tool blocks a message's first scan makes room for. */
#define TOOLS_FIRST 4

static int
tools_grow(struct host *h)
{
	size_t cap = h->tools_cap ? h->tools_cap * 2 : 32;
	struct tools_slot *t = realloc(h->tools, cap * sizeof(*t));

	if (!t)
		return enomem();
	h->tools = t;
	h->tools_cap = cap;
	return 0;
}

int
histd_view_tools(histd_view *v, size_t i, const histd_view_tool **refs,
		 size_t *n)
{
	struct host *h = v->host;
	histd_view_item *it;
	struct tools_slot *slot;
	histd_view_tool *r;
	size_t cnt;
	int rc;

	*refs = NULL;
	*n = 0;
	if (i >= v->n)
		return 0;
	it = &v->items[i];
	if (it->msg)
		return tools_of_msg(h, it->msg, refs, n);
	/* Its scan at push found no tool block (its flags are a superset of
	 * what tools_scan finds). */
	if (!it->data ||
	    !(it->flags & (HISTD_ITEM_CALLS | HISTD_ITEM_RESULTS)))
		return 0;
	/* Scanned before: the item carries its slot (with the item when it
	 * moves), checked against its bytes. */
	if (it->host_ix && it->host_ix <= h->tools_used &&
	    h->tools[it->host_ix - 1].data == it->data) {
		slot = &h->tools[it->host_ix - 1];
		*refs = slot->refs;
		*n = slot->n;
		return 0;
	}
	if (h->tools_used == h->tools_cap && tools_grow(h))
		return enomem();
	slot = &h->tools[h->tools_used];
	/* One pass for the usual few blocks, a second for more. */
	if (!(r = arena_alloc(h, TOOLS_FIRST * sizeof(*r))))
		return enomem();
	rc = tools_scan(h, it->data, it->len, r, TOOLS_FIRST, &cnt);
	if (rc == 0 && cnt > TOOLS_FIRST) {
		if (!(r = arena_alloc(h, cnt * sizeof(*r))))
			return enomem();
		rc = tools_scan(h, it->data, it->len, r, cnt, &cnt);
	}
	if (rc == HISTD_ENOMEM)
		return enomem();
	if (rc)
		goto corrupt;
	slot->data = it->data;
	slot->refs = r;
	slot->n = cnt;
	it->host_ix = (uint32_t)++h->tools_used;
	*refs = r;
	*n = cnt;
	return 0;
corrupt:
	return histd_error_set(HISTD_ECORRUPT,
		"the stored message at seq %llu does not decode",
		(unsigned long long)it->seq);
}

/* ---------------------------------------------------------------------- */
/* Masking a tool result in the stored bytes                               */

/* A field of a packed message: where it starts and ends, and (wire type
 * 2) its payload. */
struct wfield {
	const uint8_t *start, *end, *sub;
	uint64_t key, v;
};

/* Reads the field at *q (before end); 0 if malformed. */
static int
next_field(const uint8_t **q, const uint8_t *end, struct wfield *f)
{
	f->start = *q;
	f->sub = NULL;
	f->v = 0;
	if (!get_varint(q, end, &f->key) ||
	    !get_value(q, end, f->key & 7, &f->v, &f->sub))
		return 0;
	f->end = *q;
	return 1;
}

/* Tokens of a ToolResultBlock's content when every block is a text
 * block and nothing but its text: 0 and *tokens, else -1. */
static int
result_text_tokens(const uint8_t *p, uint64_t len, uint64_t *tokens)
{
	const uint8_t *q = p, *end = p + len;
	struct wfield f, b, t;

	*tokens = 0;
	while (q < end) {
		const uint8_t *bq, *tq, *text = NULL;
		uint64_t text_len = 0;
		int kind = 0;

		if (!next_field(&q, end, &f))
			return -1;
		if (f.key != (3 << 3 | 2))
			continue;        /* id, name, is_error, unknown */
		for (bq = f.sub; bq < f.sub + f.v;) {
			if (!next_field(&bq, f.sub + f.v, &b))
				return -1;
			if (b.key >> 3 >= 1 && b.key >> 3 <= 6) {
				if (b.key != (1 << 3 | 2) || kind)
					return -1;
				kind = 1;
				for (tq = b.sub; tq < b.sub + b.v;) {
					if (!next_field(&tq, b.sub + b.v, &t))
						return -1;
					if (t.key == (1 << 3 | 2)) {
						text = t.sub;
						text_len = t.v;
					} else if (t.key >> 3 == 1) {
						return -1;
					}
				}
			}
		}
		if (kind)
			*tokens += histd_tokens_text((const char *)text,
						     (size_t)text_len);
	}
	return 0;
}

int
histd_view_mask_result(histd_view *v, size_t i, uint32_t block,
		       const char *text, int *done)
{
	histd_view_item *it;
	const uint8_t *q, *end, *id = NULL, *name = NULL;
	struct wfield f, c, r = { 0 }, content = { 0 }, tok = { 0 };
	uint64_t id_len = 0, name_len = 0, old_t, new_t, is_error = 0;
	size_t text_len = strlen(text), tb_len, cb_len, tr_len, blk_len, size;
	size_t o = 0;
	uint32_t n_block = 0;
	int found = 0, which = 0;
	uint8_t *out;

	*done = 0;
	if (i >= v->n)
		return 0;
	it = &v->items[i];
	if (it->msg || !it->data)
		return 0;
	/* The message: its content block `block`, its token_estimate. */
	for (q = it->data, end = it->data + it->len; q < end;) {
		if (!next_field(&q, end, &f))
			return 0;
		if (f.key >> 3 == 8) {
			if (tok.start || f.key != (8 << 3 | 0))
				return 0;
			tok = f;
		} else if (f.key >> 3 == 3) {
			if (f.key != (3 << 3 | 2))
				return 0;
			if (n_block++ == block) {
				content = f;
				found = 1;
			}
		}
	}
	if (!found)
		return 0;
	/* The block: a tool_result and no other of the oneof's fields. */
	for (q = content.sub; q < content.sub + content.v;) {
		if (!next_field(&q, content.sub + content.v, &c))
			return 0;
		if (c.key >> 3 >= 1 && c.key >> 3 <= 6) {
			if (c.key != (6 << 3 | 2) || which)
				return 0;
			which = 6;
			r = c;
		}
	}
	if (which != 6)
		return 0;
	/* The result: what it keeps, and the tokens its content counted. */
	for (q = r.sub; q < r.sub + r.v;) {
		if (!next_field(&q, r.sub + r.v, &f))
			return 0;
		if (f.key == (1 << 3 | 2)) {
			id = f.sub;
			id_len = f.v;
		} else if (f.key == (2 << 3 | 2)) {
			name = f.sub;
			name_len = f.v;
		} else if (f.key == (4 << 3 | 0)) {
			is_error = f.v;
		} else if (f.key >> 3 >= 1 && f.key >> 3 <= 4 &&
			   f.key != (3 << 3 | 2)) {
			return 0;
		}
	}
	/* The estimate: a message of this one block is the overhead and the
	 * marker; else the stored estimate less what the result counted. */
	new_t = histd_tokens_text(text, text_len);
	if (n_block == 1) {
		new_t += HISTD_TOKENS_MESSAGE_OVERHEAD;
	} else {
		if (it->tokens == UINT32_MAX ||
		    result_text_tokens(r.sub, r.v, &old_t) || old_t > it->tokens)
			return 0;
		new_t += it->tokens - old_t;
		if (new_t > UINT32_MAX)
			new_t = UINT32_MAX;
	}

	/* Sizes, innermost first: TextBlock, ContentBlock, ToolResultBlock,
	 * the content block with its other fields, the message. */
	tb_len = text_len ? 1 + histd_wire_varint_size(text_len) + text_len : 0;
	cb_len = 1 + histd_wire_varint_size(tb_len) + tb_len;
	tr_len = (id_len ? 1 + histd_wire_varint_size(id_len) + id_len : 0) +
		 (name_len ? 1 + histd_wire_varint_size(name_len) + name_len :
			     0) +
		 1 + histd_wire_varint_size(cb_len) + cb_len +
		 (is_error ? 2 : 0);
	blk_len = content.v - (size_t)(r.end - r.start) +
		  1 + histd_wire_varint_size(tr_len) + tr_len;
	size = it->len - (size_t)(content.end - content.start) +
	       1 + histd_wire_varint_size(blk_len) + blk_len -
	       (size_t)(tok.start ? tok.end - tok.start : 0) +
	       (new_t ? 1 + histd_wire_varint_size(new_t) : 0);
	if (!(out = arena_alloc(v->host, size ? size : 1)))
		return enomem();

	/* The message's fields as stored, but the block and the estimate. */
	for (q = it->data, end = it->data + it->len; q < end;) {
		next_field(&q, end, &f);
		if (f.start == tok.start) {
			continue;
		} else if (f.start != content.start) {
			memcpy(out + o, f.start, (size_t)(f.end - f.start));
			o += (size_t)(f.end - f.start);
			continue;
		}
		o += histd_wire_put_len_key(out + o, 3, blk_len);
		/* The block's other fields as stored, the result replaced. */
		for (const uint8_t *bq = content.sub;
		     bq < content.sub + content.v;) {
			next_field(&bq, content.sub + content.v, &c);
			if (c.start != r.start) {
				memcpy(out + o, c.start,
				       (size_t)(c.end - c.start));
				o += (size_t)(c.end - c.start);
				continue;
			}
			o += histd_wire_put_len_key(out + o, 6, tr_len);
			if (id_len) {
				o += histd_wire_put_len_key(out + o, 1, id_len);
				memcpy(out + o, id, id_len);
				o += id_len;
			}
			if (name_len) {
				o += histd_wire_put_len_key(out + o, 2,
							    name_len);
				memcpy(out + o, name, name_len);
				o += name_len;
			}
			o += histd_wire_put_len_key(out + o, 3, cb_len);
			o += histd_wire_put_len_key(out + o, 1, tb_len);
			if (text_len) {
				o += histd_wire_put_len_key(out + o, 1,
							    text_len);
				memcpy(out + o, text, text_len);
				o += text_len;
			}
			if (is_error) {
				out[o++] = 4 << 3 | 0;
				out[o++] = 1;
			}
		}
	}
	if (new_t) {
		out[o++] = 8 << 3 | 0;
		o += histd_wire_put_varint(out + o, new_t);
	}
	/* The item's tool slot (same ids, same blocks) follows its bytes. */
	if (it->host_ix && it->host_ix <= ((struct host *)v->host)->tools_used &&
	    ((struct host *)v->host)->tools[it->host_ix - 1].data == it->data)
		((struct host *)v->host)->tools[it->host_ix - 1].data = out;
	it->data = out;
	it->len = o;
	it->tokens = (uint32_t)new_t;
	*done = 1;
	return 0;
}

int
histd_view_push_record(histd_view *v, uint64_t seq, uint32_t tokens,
		       const uint8_t *data, size_t len)
{
	uint32_t flags;
	int role;

	if (histd_message_scan(data, len, &role, &flags))
		return histd_error_set(HISTD_ECORRUPT,
			"the stored message at seq %llu does not decode",
			(unsigned long long)seq);
	return histd_view_push_known(v, seq, tokens, data, len, role, flags);
}

int
histd_view_push_known(histd_view *v, uint64_t seq, uint32_t tokens,
		      const uint8_t *data, size_t len, int role,
		      uint32_t flags)
{
	histd_view_item *it;

	if (!(it = push_item(v)))
		return enomem();
	it->seq = seq;
	it->tokens = tokens;
	it->flags = flags;
	it->role = role;
	it->data = data;
	it->len = len;
	return 0;
}

/* Flags of an unpacked message. */
static uint32_t
msg_flags(const Histd__V1__Message *m)
{
	uint32_t f = 0;

	for (size_t j = 0; j < m->n_content; j++)
		switch (m->content[j]->block_case) {
		case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
			f |= HISTD_ITEM_REASONING;
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
			f |= HISTD_ITEM_CALLS;
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
			f |= HISTD_ITEM_RESULTS;
			break;
		default:
			break;
		}
	if (m->role == HISTD__V1__ROLE__ROLE_SYSTEM)
		f |= HISTD_ITEM_SYSTEM;
	return f;
}

int
histd_view_push_message(histd_view *v, Histd__V1__Message *m, uint32_t flags)
{
	histd_view_item *it = push_item(v);

	if (!it)
		return enomem();
	it->seq = m->seq;
	it->msg = m;
	it->role = m->role;
	it->flags = flags | HISTD_ITEM_CHANGED | msg_flags(m);
	if (flags & HISTD_ITEM_SUMMARY)
		it->flags &= ~(uint32_t)HISTD_ITEM_SYSTEM;
	it->tokens = histd_tokens_message(m);
	m->token_estimate = it->tokens;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Safe starts                                                             */

/* What the safe-start scan needs of one message. */
struct turn_info {
	int role;
	int reasoning;                  /* holds reasoning blocks */
	const histd_view_tool *refs;    /* its tool blocks */
	size_t n_refs;
};

/*
 * Backward scan: `need` holds the tool_call ids that results in m[s..n)
 * answer and that no call in m[s..n) issued. A start s is safe when need
 * is empty and m[s] does not continue an assistant run. Sets safe[lo..n].
 */
static int
safe_scan(const struct turn_info *t, size_t n, size_t lo, unsigned char *safe,
	  int first_is_start)
{
	histd_idset need;
	int rc = 0;

	histd_idset_init(&need);
	safe[n] = 1;
	for (size_t k = n; k-- > lo;) {
		int cont;

		for (size_t j = 0; j < t[k].n_refs && !rc; j++)
			if (t[k].refs[j].kind == HISTD_ITEM_RESULTS)
				rc = histd_idset_add(&need, t[k].refs[j].id);
		for (size_t j = 0; j < t[k].n_refs && !rc; j++)
			if (t[k].refs[j].kind == HISTD_ITEM_CALLS)
				histd_idset_del(&need, t[k].refs[j].id);
		if (rc)
			break;
		/* An assistant message right after an assistant message
		 * holding reasoning is that reasoning's turn (reasoning
		 * items, then the message or calls they led to). Two plain
		 * assistant messages in a row (two agents, a streamed
		 * answer) may be cut between. */
		if (k == 0)
			cont = !first_is_start;
		else
			cont = t[k].role == HISTD__V1__ROLE__ROLE_ASSISTANT &&
			       t[k - 1].role == HISTD__V1__ROLE__ROLE_ASSISTANT &&
			       t[k - 1].reasoning;
		safe[k] = need.count == 0 && !cont;
	}
	histd_idset_free(&need);
	return rc;
}

/* The turn info of m[0..n): *t and *refs malloc'ed (the caller frees
 * both; *refs may be NULL). */
static int
msgs_turns(Histd__V1__Message *const *m, size_t n, struct turn_info **tp,
	   histd_view_tool **refsp)
{
	struct turn_info *t = calloc(n ? n : 1, sizeof(*t));
	histd_view_tool *refs = NULL;
	size_t total = 0, o = 0;

	if (!t)
		return enomem();
	for (size_t i = 0; i < n; i++)
		total += m[i]->n_content;
	if (total && !(refs = malloc(total * sizeof(*refs)))) {
		free(t);
		return enomem();
	}
	for (size_t i = 0; i < n; i++) {
		t[i].role = m[i]->role;
		t[i].refs = refs + o;
		for (size_t j = 0; j < m[i]->n_content; j++) {
			const Histd__V1__ContentBlock *b = m[i]->content[j];

			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING)
				t[i].reasoning = 1;
			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
				refs[o].kind = HISTD_ITEM_CALLS;
				refs[o++].id = b->tool_call->id;
			} else if (b->block_case ==
				   HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
				refs[o].kind = HISTD_ITEM_RESULTS;
				refs[o++].id = b->tool_result->tool_call_id;
			}
		}
		t[i].n_refs = (size_t)(refs + o - t[i].refs);
	}
	*tp = t;
	*refsp = refs;
	return 0;
}

int
histd_safe_starts_msgs(Histd__V1__Message *const *m, size_t n,
		       unsigned char *safe, int first_is_start)
{
	struct turn_info *t;
	histd_view_tool *refs;
	int rc;

	if ((rc = msgs_turns(m, n, &t, &refs)))
		return rc;
	rc = safe_scan(t, n, 0, safe, first_is_start);
	free(refs);
	free(t);
	return rc;
}

int
histd_first_open_call(Histd__V1__Message *const *m, size_t n, size_t *at)
{
	struct turn_info *t;
	histd_view_tool *refs;
	histd_idset answered;
	int rc;

	*at = n;
	if ((rc = msgs_turns(m, n, &t, &refs)))
		return rc;
	histd_idset_init(&answered);
	for (size_t k = 0; k < n && !rc; k++)
		for (size_t j = 0; j < t[k].n_refs && !rc; j++)
			if (t[k].refs[j].kind == HISTD_ITEM_RESULTS)
				rc = histd_idset_add(&answered, t[k].refs[j].id);
	for (size_t k = 0; k < n && !rc && *at == n; k++)
		for (size_t j = 0; j < t[k].n_refs; j++)
			if (t[k].refs[j].kind == HISTD_ITEM_CALLS &&
			    !histd_idset_has(&answered, t[k].refs[j].id)) {
				*at = k;
				break;
			}
	histd_idset_free(&answered);
	free(refs);
	free(t);
	return rc;
}

int
histd_safe_starts_items_from(histd_view *v, size_t from, size_t lo,
			     unsigned char *safe, int first_is_start)
{
	size_t n = v->n - from;
	struct turn_info *t;
	int rc;

	if (lo > n)
		lo = n;
	/* In the view's arena: freed with the view. */
	if (!(t = histd_view_alloc(v, (n ? n : 1) * sizeof(*t))))
		return enomem();
	for (size_t i = lo; i < n; i++) {
		histd_view_item *it = &v->items[from + i];

		t[i].role = it->role;
		t[i].reasoning = (it->flags & HISTD_ITEM_REASONING) != 0;
		/* The one before lo decides whether lo continues a turn. */
		if (i == lo && i > 0) {
			const histd_view_item *b = &v->items[from + i - 1];

			t[i - 1].role = b->role;
			t[i - 1].reasoning =
				(b->flags & HISTD_ITEM_REASONING) != 0;
		}
		if (it->flags & (HISTD_ITEM_CALLS | HISTD_ITEM_RESULTS)) {
			rc = histd_view_tools(v, from + i, &t[i].refs,
					      &t[i].n_refs);
			if (rc)
				return rc;
		}
	}
	return safe_scan(t, n, lo, safe, first_is_start);
}

int
histd_safe_starts_items(histd_view *v, size_t from, unsigned char *safe,
			int first_is_start)
{
	return histd_safe_starts_items_from(v, from, 0, safe,
					    first_is_start);
}

/* ---------------------------------------------------------------------- */
/* The fix-up                                                              */

/* Removes from item i's message the tool blocks whose partner is absent:
 * results not in `calls`, calls not in `results`. */
static int
drop_unpaired(histd_view *v, size_t i, const histd_idset *calls,
	      const histd_idset *results)
{
	histd_view_item *it = &v->items[i];
	const histd_view_tool *refs;
	Histd__V1__Message *m, *c;
	Histd__V1__ContentBlock **keep;
	size_t n = 0, n_refs;
	int rc;

	/* Most messages keep every block: decide that from the ids alone. */
	if ((rc = histd_view_tools(v, i, &refs, &n_refs)))
		return rc;
	for (n = 0; n < n_refs; n++)
		if (!histd_idset_has(refs[n].kind == HISTD_ITEM_CALLS ?
				     results : calls, refs[n].id))
			break;
	if (n == n_refs)
		return 0;
	n = 0;
	if (!(m = histd_view_message(v, i)))
		return histd_error_set(HISTD_ECORRUPT,
			"the stored message at seq %llu does not decode",
			(unsigned long long)it->seq);
	for (size_t j = 0; j < m->n_content; j++) {
		const Histd__V1__ContentBlock *b = m->content[j];

		if ((b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
		     !histd_idset_has(calls, b->tool_result->tool_call_id)) ||
		    (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
		     !histd_idset_has(results, b->tool_call->id)))
			continue;
		n++;
	}
	if (n == m->n_content)
		return 0;
	/* A shallow copy: the blocks are shared, the array is new. */
	c = histd_view_alloc(v, sizeof(*c));
	keep = histd_view_alloc(v, (n ? n : 1) * sizeof(*keep));
	if (!c || !keep)
		return enomem();
	*c = *m;
	n = 0;
	for (size_t j = 0; j < m->n_content; j++) {
		Histd__V1__ContentBlock *b = m->content[j];

		if ((b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
		     !histd_idset_has(calls, b->tool_result->tool_call_id)) ||
		    (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
		     !histd_idset_has(results, b->tool_call->id)))
			continue;
		keep[n++] = b;
	}
	c->content = keep;
	c->n_content = n;
	it->msg = c;
	it->flags = (it->flags & (HISTD_ITEM_SUMMARY)) | msg_flags(c);
	op_changed(v, i);
	return 0;
}

/* The partition's class of an item: system 0, summary 1, the rest 2. */
static int
item_class(const histd_view_item *it)
{
	return (it->flags & HISTD_ITEM_SYSTEM) ? 0 :
	       (it->flags & HISTD_ITEM_SUMMARY) ? 1 : 2;
}

/* 1 if v's items are in partition order already. */
static int
partitioned(const histd_view *v)
{
	for (size_t i = 1; i < v->n; i++)
		if (item_class(&v->items[i]) < item_class(&v->items[i - 1]))
			return 0;
	return 1;
}

int
histd_view_partition(histd_view *v)
{
	histd_view_item *tmp;
	size_t o = 0;

	/* A stable partition, made only if some item is out of that order
	 * (a system message mid-history). */
	if (partitioned(v))
		return 0;
	if (!(tmp = malloc(v->n * sizeof(*tmp))))
		return enomem();
	for (int pass = 0; pass < 3; pass++)
		for (size_t i = 0; i < v->n; i++)
			if (item_class(&v->items[i]) == pass)
				tmp[o++] = v->items[i];
	memcpy(v->items, tmp, v->n * sizeof(*tmp));
	free(tmp);
	return 0;
}

int
histd_view_last_unanswered(histd_view *v, uint64_t *seq)
{
	histd_idset calls;
	int rc = 0;

	*seq = 0;
	histd_idset_init(&calls);
	for (size_t i = 0; i < v->n && !rc; i++) {
		const histd_view_tool *refs;
		size_t n_refs;

		if (!(v->items[i].flags & HISTD_ITEM_CALLS))
			continue;
		if ((rc = histd_view_tools(v, i, &refs, &n_refs)))
			break;
		for (size_t j = 0; j < n_refs && !rc; j++)
			if (refs[j].kind == HISTD_ITEM_CALLS)
				rc = histd_idset_add(&calls, refs[j].id);
	}
	for (size_t i = 0; i < v->n && !rc; i++) {
		const histd_view_tool *refs;
		size_t n_refs;

		if (!(v->items[i].flags & HISTD_ITEM_RESULTS) ||
		    v->items[i].seq <= *seq)
			continue;
		if ((rc = histd_view_tools(v, i, &refs, &n_refs)))
			break;
		for (size_t j = 0; j < n_refs; j++)
			if (refs[j].kind == HISTD_ITEM_RESULTS &&
			    !histd_idset_has(&calls, refs[j].id)) {
				*seq = v->items[i].seq;
				break;
			}
	}
	histd_idset_free(&calls);
	return rc;
}

int
histd_view_fixup(histd_view *v)
{
	struct host *h = v->host;
	histd_idset calls, results;
	size_t n = v->n, kept = 0, i;
	int rc;

	if ((rc = histd_view_partition(v)))
		return rc;

	histd_idset_init(&calls);
	histd_idset_init(&results);
	for (size_t i = 0; i < v->n && !rc; i++) {
		const histd_view_tool *refs;
		size_t n_refs;

		if (!(v->items[i].flags & (HISTD_ITEM_CALLS | HISTD_ITEM_RESULTS)))
			continue;
		if ((rc = histd_view_tools(v, i, &refs, &n_refs)))
			break;
		for (size_t j = 0; j < n_refs && !rc; j++)
			rc = histd_idset_add(refs[j].kind == HISTD_ITEM_CALLS ?
					     &calls : &results, refs[j].id);
	}
	/* A result must come after its call: a call seen only later does not
	 * count. Calls and results are unique per session, so "present in
	 * the view" plus the append-time rule (results answer earlier calls)
	 * gives the order; the partition above moves only system messages,
	 * which carry no tool blocks. A message left empty goes; the others
	 * move down over it, in one pass. */
	for (i = 0; i < n && !rc; i++) {
		if ((v->items[i].flags & (HISTD_ITEM_CALLS | HISTD_ITEM_RESULTS)) &&
		    !(rc = drop_unpaired(v, i, &calls, &results)) &&
		    v->items[i].msg && v->items[i].msg->n_content == 0)
			continue;
		if (kept != i) {
			v->items[kept] = v->items[i];
			h->moved++;
		}
		kept++;
	}
	/* On an error the items not looked at stay, after those kept. */
	if (kept != i) {
		memmove(&v->items[kept], &v->items[i],
			(n - i) * sizeof(v->items[0]));
		h->moved += n - i;
	}
	v->n = kept + (n - i);
	histd_idset_free(&calls);
	histd_idset_free(&results);
	return rc;
}
