/*
 * The memory driver (see memory.h and the contract in driver.h).
 *
 * Layout: the driver holds a map of tenants; a tenant holds its sessions by
 * id (hash table, for lookups), by canonical context keys (hash table, for
 * uniqueness and resolve) and in id order (a treap, for paginated lists). A
 * session holds its messages in one seq-sorted array of histd_record, each
 * pointing at one malloc'ed block (the packed Message with its seq in
 * front), so reads by seq are a binary search and reads of the last n are
 * O(n), whatever the session's length.
 *
 * Locking, in this order only: a session's mutex, then the driver's lock.
 * - m->lock (rwlock, writers preferred) guards the tenants, their maps and
 *   treaps, and the treap links in sessions. Lookups hold it shared just
 *   long enough to take a reference on a session.
 * - s->mu guards everything mutable in a session. The change hook is called
 *   with it held, right after the change, so that a session's changes are
 *   reported in revision order.
 * - Delete and fork hold s->mu and then take the lock exclusively, so they
 *   check and act atomically. Nobody ever waits for a session's mutex while
 *   holding m->lock, so this cannot deadlock.
 * A session lives while it has references: one from the maps, one per
 * thread using it. Delete takes it out of the maps and marks it deleted
 * under s->mu; threads that found it before see the mark and answer
 * ENOTFOUND.
 */
#include "memory.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "index/index.h"

/* Expired idempotency keys freed per append at most, to bound the time one
 * append spends on them; each append adds at most one key, so the backlog
 * still drains. */
#define IDEM_PURGE_MAX 64
/* Sessions examined per pass of a label-filtered list. */
#define LIST_SCAN_BATCH 256
#define LIST_MAX_BATCH 1024

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static int
not_found(void)
{
	return histd_error_set(HISTD_ENOTFOUND, "session not found");
}

/* ---------------------------------------------------------------------- */
/* Hash table: open addressing, linear probing, backward-shift deletion    */
/* (no tombstones). Values are pointers to structs that hold their own     */
/* key; the table asks for it through `key`.                               */

typedef const char *(*htab_key_fn)(const void *v, size_t *len);

typedef struct hslot {
	uint64_t h;
	void *v;                /* NULL: empty */
} hslot;

typedef struct htab {
	hslot *slots;           /* NULL until the first insert */
	size_t mask;            /* capacity - 1; capacity a power of two */
	size_t n;
	uint64_t seed;          /* per driver, so ids cannot be chosen to collide */
	htab_key_fn key;
} htab;

/* FNV-1a with a seed, then a 64-bit finalizer: probing uses the low bits,
 * which plain FNV mixes poorly. */
static uint64_t
hash_bytes(uint64_t seed, const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 0xcbf29ce484222325ULL ^ seed;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

static void
htab_init(htab *t, htab_key_fn key, uint64_t seed)
{
	*t = (htab){ .seed = seed, .key = key };
}

static void
htab_free(htab *t)
{
	free(t->slots);
	t->slots = NULL;
	t->mask = 0;
	t->n = 0;
}

static void *
htab_find(const htab *t, const void *key, size_t len)
{
	uint64_t h;

	if (!t->n)
		return NULL;
	h = hash_bytes(t->seed, key, len);
	for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
		const hslot *sl = &t->slots[i];
		size_t klen;
		const char *k;

		if (!sl->v)
			return NULL;
		if (sl->h != h)
			continue;
		k = t->key(sl->v, &klen);
		if (klen == len && memcmp(k, key, len) == 0)
			return sl->v;
	}
}

/* Makes room for n entries at a load of at most 3/4, so that htab_put
 * cannot fail afterwards. */
static int
htab_reserve(htab *t, size_t n)
{
	size_t cap = t->slots ? t->mask + 1 : 0, ncap;
	hslot *ns;

	if (n * 4 <= cap * 3)
		return 0;
	ncap = cap ? cap : 8;
	while (n * 4 > ncap * 3)
		ncap *= 2;
	ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return enomem();
	for (size_t i = 0; i < cap; i++) {
		size_t j;

		if (!t->slots[i].v)
			continue;
		for (j = t->slots[i].h & (ncap - 1); ns[j].v; j = (j + 1) & (ncap - 1))
			;
		ns[j] = t->slots[i];
	}
	free(t->slots);
	t->slots = ns;
	t->mask = ncap - 1;
	return 0;
}

/* Inserts v, whose key is not in the table; room must be reserved. */
static void
htab_put(htab *t, void *v)
{
	size_t len;
	const char *k = t->key(v, &len);
	uint64_t h = hash_bytes(t->seed, k, len);
	size_t i;

	for (i = h & t->mask; t->slots[i].v; i = (i + 1) & t->mask)
		;
	t->slots[i] = (hslot){ .h = h, .v = v };
	t->n++;
}

static int
htab_insert(htab *t, void *v)
{
	int rc = htab_reserve(t, t->n + 1);

	if (rc == 0)
		htab_put(t, v);
	return rc;
}

/* Removes the entry with this key; returns its value or NULL. */
static void *
htab_del(htab *t, const void *key, size_t len)
{
	uint64_t h;
	size_t i;
	void *v = NULL;

	if (!t->n)
		return NULL;
	h = hash_bytes(t->seed, key, len);
	for (i = h & t->mask; t->slots[i].v; i = (i + 1) & t->mask) {
		size_t klen;
		const char *k;

		if (t->slots[i].h != h)
			continue;
		k = t->key(t->slots[i].v, &klen);
		if (klen == len && memcmp(k, key, len) == 0) {
			v = t->slots[i].v;
			break;
		}
	}
	if (!v)
		return NULL;
	/* Shift back every following entry of the run whose home slot is
	 * not in (i, j], so lookups never meet a hole before their entry. */
	for (size_t j = i;;) {
		size_t home;

		j = (j + 1) & t->mask;
		if (!t->slots[j].v)
			break;
		home = t->slots[j].h & t->mask;
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		t->slots[i] = t->slots[j];
		i = j;
	}
	t->slots[i] = (hslot){ 0 };
	t->n--;
	return v;
}

/* ---------------------------------------------------------------------- */
/* Data                                                                    */

/* A tool call of a session: who issued it, who answered it. */
typedef struct mem_tool {
	uint64_t call_seq;
	uint64_t result_seq;    /* 0 while the call is open */
	uint32_t len;
	char id[];
} mem_tool;

/* A remembered idempotency key, in a FIFO by insertion for expiry. */
typedef struct mem_idem {
	struct mem_idem *prev, *next;
	int64_t expires_us;
	uint64_t first_seq, last_seq, revision;
	uint8_t hash[HISTD_HASH_LEN];
	uint32_t len;
	char key[];
} mem_idem;

typedef struct mem_tenant mem_tenant;

typedef struct mem_session {
	pthread_mutex_t mu;
	atomic_uint refs;
	int deleted;                    /* under mu */

	/* Set at creation, then read-only until the last reference goes. */
	char *id;
	size_t id_len;
	histd_kv *ckeys;
	size_t n_ckeys;
	uint8_t *canon;                 /* context keys, canonical; NULL if none */
	size_t canon_len;
	uint64_t prio;                  /* treap priority */
	uint64_t incarnation;           /* histd_session's */

	/* Treap links; under the driver's lock. */
	struct mem_session *left, *right;
	/* Set when it enters the maps, under the driver's lock; tenants
	 * live until the driver closes. */
	mem_tenant *tenant;

	/* Everything below: under mu. */
	histd_kv *labels;
	size_t n_labels;
	uint8_t *config;
	size_t config_len;
	int64_t created_at_us, updated_at_us;
	int64_t active_at_us;           /* histd_session's */
	uint64_t revision, last_seq, cleared_to_seq;
	uint64_t token_total, bytes_total;

	histd_record *msgs;             /* seq order; data: one block each */
	size_t n_msgs, cap_msgs;

	histd_record *sums;             /* in put order */
	size_t n_sums, cap_sums;
	size_t best_sum;                /* summary_get's answer, if n_sums */

	htab tools;                     /* call id -> mem_tool */
	htab idem;                      /* key -> mem_idem */
	mem_idem *idem_head, *idem_tail;
	histd_vecs vecs;                /* embeddings, seq order */
} mem_session;

struct mem_tenant {
	char *name;
	size_t len;
	htab ids;                       /* id -> session */
	htab ctx;                       /* canonical context keys -> session */
	mem_session *root;              /* treap by id */
	/* The tenant's search index, made by its first search (so a server
	 * that never searches pays nothing) and kept up to date from then on
	 * by every change, under the session's mutex (index.h). Published
	 * under the driver's lock together with the list of sessions it
	 * starts from; read without it. */
	_Atomic(histd_index *) index;
};

typedef struct mem_driver {
	histd_driver base;              /* first: the driver casts down */
	pthread_rwlock_t lock;
	htab tenants;                   /* name -> mem_tenant */
	uint64_t seed;
	histd_change_fn notify;
	void *notify_ctx;
	pthread_mutex_t build_mu;       /* one index build at a time */
	/* histd_driver_config's limits (0: none); read-only after open. */
	uint64_t max_sessions, max_msgs, max_bytes;
} mem_driver;

static const char *
tenant_key(const void *v, size_t *len)
{
	const mem_tenant *t = v;

	*len = t->len;
	return t->name;
}

static const char *
session_id_key(const void *v, size_t *len)
{
	const mem_session *s = v;

	*len = s->id_len;
	return s->id;
}

static const char *
session_canon_key(const void *v, size_t *len)
{
	const mem_session *s = v;

	*len = s->canon_len;
	return (const char *)s->canon;
}

static const char *
tool_key(const void *v, size_t *len)
{
	const mem_tool *t = v;

	*len = t->len;
	return t->id;
}

static const char *
idem_key(const void *v, size_t *len)
{
	const mem_idem *e = v;

	*len = e->len;
	return e->key;
}

/* ---------------------------------------------------------------------- */
/* Session data                                                            */

/* First index whose seq is > seq. */
static size_t
first_after(const histd_record *v, size_t n, uint64_t seq)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid].seq <= seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void
drop_messages(mem_session *s)
{
	histd_vecs_clear(&s->vecs);
	for (size_t i = 0; i < s->n_msgs; i++)
		free(s->msgs[i].data);
	free(s->msgs);
	s->msgs = NULL;
	s->n_msgs = s->cap_msgs = 0;
	s->token_total = s->bytes_total = 0;
}

static void
drop_summaries(mem_session *s)
{
	for (size_t i = 0; i < s->n_sums; i++)
		free(s->sums[i].data);
	free(s->sums);
	s->sums = NULL;
	s->n_sums = s->cap_sums = s->best_sum = 0;
}

static void
drop_tools(htab *tools)
{
	for (size_t i = 0; tools->slots && i <= tools->mask; i++)
		free(tools->slots[i].v);
	htab_free(tools);
}

static void
drop_idem(mem_session *s)
{
	mem_idem *e = s->idem_head;

	while (e) {
		mem_idem *next = e->next;

		free(e);
		e = next;
	}
	s->idem_head = s->idem_tail = NULL;
	htab_free(&s->idem);
}

/* Everything but what a lookup in flight may still read (id, mu, refs). */
static void
drop_data(mem_session *s)
{
	drop_messages(s);
	drop_summaries(s);
	drop_tools(&s->tools);
	drop_idem(s);
	histd_kv_free(s->labels, s->n_labels);
	s->labels = NULL;
	s->n_labels = 0;
	free(s->config);
	s->config = NULL;
	s->config_len = 0;
}

static void
session_destroy(mem_session *s)
{
	drop_data(s);
	histd_kv_free(s->ckeys, s->n_ckeys);
	free(s->canon);
	free(s->id);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static void
session_unref(mem_session *s)
{
	if (atomic_fetch_sub(&s->refs, 1) == 1)
		session_destroy(s);
}

/* Context keys as bytes that are equal exactly when the sorted pair lists
 * are: each key and value prefixed by its length, so no separator can be
 * confused with the text. */
static uint8_t *
canon_make(const histd_kv *kv, size_t n, size_t *out_len)
{
	size_t len = 0, off = 0;
	uint8_t *buf;

	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(kv[i].key), vl = strlen(kv[i].value);

		len += histd_wire_varint_size(kl) + kl + histd_wire_varint_size(vl) + vl;
	}
	buf = malloc(len ? len : 1);
	if (!buf)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(kv[i].key), vl = strlen(kv[i].value);

		off += histd_wire_put_varint(buf + off, kl);
		memcpy(buf + off, kv[i].key, kl);
		off += kl;
		off += histd_wire_put_varint(buf + off, vl);
		memcpy(buf + off, kv[i].value, vl);
		off += vl;
	}
	*out_len = len;
	return buf;
}

/* A new session from the record fields of `in`, at revision 1, with one
 * reference (the maps'). NULL if out of memory. */
static mem_session *
session_new(mem_driver *m, const histd_session *in)
{
	mem_session *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	if (pthread_mutex_init(&s->mu, NULL) != 0) {
		free(s);
		return NULL;
	}
	atomic_init(&s->refs, 1);
	htab_init(&s->tools, tool_key, m->seed);
	htab_init(&s->idem, idem_key, m->seed);
	s->id_len = strlen(in->id);
	if (!(s->id = strdup(in->id)))
		goto fail;
	s->prio = hash_bytes(m->seed ^ 0x9e3779b97f4a7c15ULL, s->id, s->id_len);
	if (histd_kv_dup(&s->ckeys, in->context_keys, in->n_context_keys))
		goto fail;
	s->n_ckeys = in->n_context_keys;
	if (s->n_ckeys &&
	    !(s->canon = canon_make(s->ckeys, s->n_ckeys, &s->canon_len)))
		goto fail;
	if (histd_kv_dup(&s->labels, in->labels, in->n_labels))
		goto fail;
	s->n_labels = in->n_labels;
	if (in->config_len) {
		if (!(s->config = malloc(in->config_len)))
			goto fail;
		memcpy(s->config, in->config, in->config_len);
		s->config_len = in->config_len;
	}
	s->created_at_us = s->updated_at_us = in->created_at_us;
	s->active_at_us = in->created_at_us;
	s->revision = 1;
	s->incarnation = histd_incarnation_next();
	return s;
fail:
	session_destroy(s);
	return NULL;
}

/* The caller's copy of a session's record; NULL if out of memory. */
static histd_session *
session_export(const mem_session *s, const char *tenant)
{
	histd_session *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	if (!(o->tenant = strdup(tenant)) || !(o->id = strdup(s->id)))
		goto fail;
	if (histd_kv_dup(&o->context_keys, s->ckeys, s->n_ckeys))
		goto fail;
	o->n_context_keys = s->n_ckeys;
	if (histd_kv_dup(&o->labels, s->labels, s->n_labels))
		goto fail;
	o->n_labels = s->n_labels;
	if (s->config_len) {
		if (!(o->config = malloc(s->config_len)))
			goto fail;
		memcpy(o->config, s->config, s->config_len);
		o->config_len = s->config_len;
	}
	o->created_at_us = s->created_at_us;
	o->updated_at_us = s->updated_at_us;
	o->active_at_us = s->active_at_us;
	o->incarnation = s->incarnation;
	o->revision = s->revision;
	o->last_seq = s->last_seq;
	o->cleared_to_seq = s->cleared_to_seq;
	o->message_count = s->n_msgs;
	o->token_total = s->token_total;
	o->bytes_total = s->bytes_total;
	o->first_seq = s->n_msgs ? s->msgs[0].seq : 0;
	o->summary_count = s->n_sums;
	return o;
fail:
	histd_session_free(o);
	return NULL;
}

/* ENOTFOUND when s is not the life `incarnation` (0: any). */
static int
check_life(const mem_session *s, uint64_t incarnation)
{
	if (incarnation && s->incarnation != incarnation)
		return histd_error_set(HISTD_ENOTFOUND, "session not found "
				       "(it was deleted and created again)");
	return 0;
}

static int
check_revision(const mem_session *s, uint64_t expected, uint64_t *current)
{
	if (expected == 0 || expected == s->revision)
		return 0;
	*current = s->revision;
	return histd_error_set(HISTD_ECONFLICT,
			       "expected_revision %llu does not match the session's revision %llu",
			       (unsigned long long)expected,
			       (unsigned long long)s->revision);
}

/* ELIMIT if a session would hold n messages of `bytes` record bytes. */
static int
check_size(const mem_driver *m, uint64_t n, uint64_t bytes)
{
	if (m->max_msgs && n > m->max_msgs)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %llu messages; the limit is %llu",
				       (unsigned long long)n,
				       (unsigned long long)m->max_msgs);
	if (m->max_bytes && bytes > m->max_bytes)
		return histd_error_set(HISTD_ELIMIT,
				       "the session would hold %llu bytes; the limit is %llu",
				       (unsigned long long)bytes,
				       (unsigned long long)m->max_bytes);
	return 0;
}

/* Record bytes of a batch as it would be stored (seq in front). */
static uint64_t
batch_bytes(const histd_append *a, uint64_t first_seq)
{
	uint64_t b = 0;

	for (size_t i = 0; i < a->n_msgs; i++)
		b += histd_wire_varint_size(first_seq + i) + 1 + a->msgs[i].len;
	return b;
}

/* A session's key in its tenant's search index: its life, never used
 * again in the process. Not its address: a search that holds no reference
 * could take a session freed and made again at the same address for the
 * one its hit came from. */
static uint64_t
index_key(const mem_session *s)
{
	return s->incarnation;
}

/* Keeps the tenant's search index (if it has one yet) in step with a
 * change, under the session's mutex like the change itself. */
static void
index_change(const mem_session *s, enum histd_change_kind kind)
{
	histd_index *ix = s->tenant ? atomic_load(&s->tenant->index) : NULL;
	uint64_t key = index_key(s);

	if (!ix)
		return;
	switch (kind) {
	case HISTD_CHANGE_REPLACED:
	case HISTD_CHANGE_CLEARED:
		histd_index_clear(ix, key);
		if (kind == HISTD_CHANGE_CLEARED)
			break;
		/* fall through */
	case HISTD_CHANGE_APPENDED:
		/* ENOMEM marks the index incomplete: the next search
		 * rebuilds it. */
		(void)histd_index_sync(ix, key, s->id, s->msgs, s->n_msgs);
		break;
	case HISTD_CHANGE_DELETED:
		histd_index_forget(ix, key);
		break;
	default:
		break;
	}
}

static void
notify(mem_driver *m, const mem_session *s, const char *tenant,
       enum histd_change_kind kind, const histd_record *records, size_t n,
       const histd_session *rec)
{
	histd_change c = {
		.kind = kind,
		.tenant = tenant,
		.session_id = s->id,
		.revision = s->revision,
		.cleared_to_seq = s->cleared_to_seq,
		.records = records,
		.n_records = n,
		.session = rec,
		.incarnation = s->incarnation,
	};

	index_change(s, kind);
	if (m->notify)
		m->notify(m->notify_ctx, &c);
}

/* Grows the message array to hold n, by half again at least, so appends
 * are amortized O(1) with at most a third of the array unused. */
static int
msgs_reserve(mem_session *s, size_t n)
{
	size_t cap;
	histd_record *v;

	if (n <= s->cap_msgs)
		return 0;
	cap = s->cap_msgs + s->cap_msgs / 2 + 4;
	if (cap < n)
		cap = n;
	v = realloc(s->msgs, cap * sizeof(*v));
	if (!v)
		return enomem();
	s->msgs = v;
	s->cap_msgs = cap;
	return 0;
}

/* Builds the stored records of a batch into dst (room for a->n_msgs):
 * each one block, the seq in front of the bytes. */
static int
records_make(histd_record *dst, const histd_append *a, uint64_t first_seq)
{
	for (size_t i = 0; i < a->n_msgs; i++) {
		size_t len;
		uint8_t *blk = histd_wire_with_seq(first_seq + i, a->msgs[i].data,
						   a->msgs[i].len, &len);

		if (!blk) {
			while (i--)
				free(dst[i].data);
			return enomem();
		}
		dst[i] = (histd_record){
			.seq = first_seq + i,
			.token_estimate = a->msgs[i].token_estimate,
			.len = (uint32_t)len,
			.data = blk,
		};
	}
	return 0;
}

/* Appends a copy of a summary record, and keeps the index of summary_get's
 * answer: the largest covers_to_seq, the newest put on a tie. */
static int
sums_add(mem_session *s, const histd_record *r)
{
	uint8_t *copy;

	if (s->n_sums == s->cap_sums) {
		size_t cap = s->cap_sums ? s->cap_sums * 2 : 2;
		histd_record *v = realloc(s->sums, cap * sizeof(*v));

		if (!v)
			return enomem();
		s->sums = v;
		s->cap_sums = cap;
	}
	if (!(copy = malloc(r->len ? r->len : 1)))
		return enomem();
	if (r->len)
		memcpy(copy, r->data, r->len);
	s->sums[s->n_sums] = (histd_record){
		.seq = r->seq,
		.token_estimate = r->token_estimate,
		.len = r->len,
		.data = copy,
	};
	if (s->n_sums == 0 || r->seq >= s->sums[s->best_sum].seq)
		s->best_sum = s->n_sums;
	s->n_sums++;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Tool call references of a batch                                         */
/*                                                                         */
/* Checked in full before anything changes, with every entry the batch     */
/* adds allocated up front, so that the commit cannot fail.                */

typedef struct stage_ref {
	const char *id;
	size_t len;
	uint64_t call_seq;      /* a call of the batch: its message's seq */
	uint64_t result_seq;    /* the batch message answering it, or 0 */
	mem_tool *old;          /* an answer to an earlier call: that call */
	mem_tool *fresh;        /* a call of the batch: its entry to insert */
} stage_ref;

typedef struct stage {
	stage_ref *refs;
	size_t n;
	size_t n_fresh;
	htab map;               /* id -> stage_ref */
} stage;

static const char *
stage_key(const void *v, size_t *len)
{
	const stage_ref *r = v;

	*len = r->len;
	return r->id;
}

static void
stage_free(stage *st)
{
	for (size_t i = 0; i < st->n; i++)
		free(st->refs[i].fresh);
	free(st->refs);
	htab_free(&st->map);
}

/* Checks the batch's tool references against `tools` (NULL: an empty
 * index, for replace), as driver.h says for append. */
static int
stage_tools(stage *st, const htab *tools, const histd_append *a,
	    uint64_t first_seq, uint64_t seed)
{
	size_t total = 0;
	int rc;

	htab_init(&st->map, stage_key, seed);
	for (size_t i = 0; i < a->n_msgs; i++)
		total += a->msgs[i].n_calls + a->msgs[i].n_results;
	if (!total)
		return 0;
	st->refs = calloc(total, sizeof(*st->refs));
	if (!st->refs)
		return enomem();
	if ((rc = htab_reserve(&st->map, total)))
		return rc;

	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *msg = &a->msgs[i];
		uint64_t seq = first_seq + i;

		/* Results first: a call of this same message must not count
		 * as issued earlier. */
		for (size_t j = 0; j < msg->n_results; j++) {
			const char *id = msg->results[j].id;
			size_t len = strlen(id);
			stage_ref *r = htab_find(&st->map, id, len);
			mem_tool *old = NULL;

			if (r) {
				/* Only an open call of an earlier batch message. */
				if (!r->fresh || r->result_seq || r->call_seq >= seq)
					goto not_open;
				r->result_seq = seq;
				continue;
			}
			old = tools ? htab_find(tools, id, len) : NULL;
			if (!old || old->result_seq)
				goto not_open;
			r = &st->refs[st->n++];
			*r = (stage_ref){ .id = id, .len = len, .result_seq = seq,
					  .old = old };
			htab_put(&st->map, r);
			continue;
not_open:
			return histd_error_set(HISTD_EINVALID,
					       "messages[%zu].content[%u].tool_result.tool_call_id does not answer an open tool call",
					       i, msg->results[j].block);
		}
		for (size_t j = 0; j < msg->n_calls; j++) {
			const char *id = msg->calls[j].id;
			size_t len = strlen(id);
			stage_ref *r;
			mem_tool *t;

			if (htab_find(&st->map, id, len) ||
			    (tools && htab_find(tools, id, len)))
				return histd_error_set(HISTD_EINVALID,
						       "messages[%zu].content[%u].tool_call.id is already used in this session",
						       i, msg->calls[j].block);
			if (len > UINT32_MAX || !(t = malloc(sizeof(*t) + len + 1)))
				return enomem();
			t->call_seq = seq;
			t->result_seq = 0;
			t->len = (uint32_t)len;
			memcpy(t->id, id, len + 1);
			r = &st->refs[st->n++];
			*r = (stage_ref){ .id = id, .len = len, .call_seq = seq,
					  .fresh = t };
			htab_put(&st->map, r);
			st->n_fresh++;
		}
	}
	return 0;
}

/* Applies a checked batch to `tools`, which has room for st->n_fresh
 * more entries. */
static void
stage_commit(stage *st, htab *tools)
{
	for (size_t i = 0; i < st->n; i++) {
		stage_ref *r = &st->refs[i];

		if (r->old) {
			r->old->result_seq = r->result_seq;
		} else {
			r->fresh->result_seq = r->result_seq;
			htab_put(tools, r->fresh);
			r->fresh = NULL;        /* the index owns it now */
		}
	}
}

/* ---------------------------------------------------------------------- */
/* Idempotency keys                                                        */

static void
idem_unlink(mem_session *s, mem_idem *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		s->idem_head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		s->idem_tail = e->prev;
	e->prev = e->next = NULL;
}

static void
idem_push(mem_session *s, mem_idem *e)
{
	e->prev = s->idem_tail;
	e->next = NULL;
	if (s->idem_tail)
		s->idem_tail->next = e;
	else
		s->idem_head = e;
	s->idem_tail = e;
}

/* Frees keys expired at now_us from the front of the FIFO. Keys live for
 * the same TTL, so insertion order is nearly expiry order; one that
 * outlives its neighbours only delays their purge, and lookups check the
 * expiry anyway. */
static void
idem_purge(mem_session *s, int64_t now_us)
{
	for (int i = 0; i < IDEM_PURGE_MAX && s->idem_head &&
			s->idem_head->expires_us <= now_us; i++) {
		mem_idem *e = s->idem_head;

		idem_unlink(s, e);
		htab_del(&s->idem, e->key, e->len);
		free(e);
	}
}

/* ---------------------------------------------------------------------- */
/* Tenants and the id-ordered treap (under the driver's lock)              */

static mem_tenant *
tenant_find(mem_driver *m, const char *name)
{
	return htab_find(&m->tenants, name, strlen(name));
}

static mem_session *
session_find(mem_driver *m, const char *tenant, const char *id)
{
	mem_tenant *t = tenant_find(m, tenant);

	return t ? htab_find(&t->ids, id, strlen(id)) : NULL;
}

static mem_session *
treap_rotate_right(mem_session *r)
{
	mem_session *l = r->left;

	r->left = l->right;
	l->right = r;
	return l;
}

static mem_session *
treap_rotate_left(mem_session *r)
{
	mem_session *x = r->right;

	r->right = x->left;
	x->left = r;
	return x;
}

static mem_session *
treap_insert(mem_session *root, mem_session *s)
{
	if (!root)
		return s;
	if (strcmp(s->id, root->id) < 0) {
		root->left = treap_insert(root->left, s);
		if (root->left->prio > root->prio)
			root = treap_rotate_right(root);
	} else {
		root->right = treap_insert(root->right, s);
		if (root->right->prio > root->prio)
			root = treap_rotate_left(root);
	}
	return root;
}

/* Joins two treaps, every id of a below every id of b. */
static mem_session *
treap_merge(mem_session *a, mem_session *b)
{
	if (!a)
		return b;
	if (!b)
		return a;
	if (a->prio > b->prio) {
		a->right = treap_merge(a->right, b);
		return a;
	}
	b->left = treap_merge(a, b->left);
	return b;
}

static mem_session *
treap_remove(mem_session *root, mem_session *s)
{
	if (!root)
		return NULL;
	if (root == s) {
		mem_session *j = treap_merge(s->left, s->right);

		s->left = s->right = NULL;
		return j;
	}
	if (strcmp(s->id, root->id) < 0)
		root->left = treap_remove(root->left, s);
	else
		root->right = treap_remove(root->right, s);
	return root;
}

/* Collects up to max sessions with id > after (NULL: all) in id order:
 * O(depth + collected). */
static void
treap_after(mem_session *n, const char *after, mem_session **v, size_t max,
	    size_t *cnt)
{
	while (n && *cnt < max) {
		if (after && strcmp(n->id, after) <= 0) {
			n = n->right;
			continue;
		}
		treap_after(n->left, after, v, max, cnt);
		if (*cnt < max)
			v[(*cnt)++] = n;
		/* Everything to the right is above n, hence above after. */
		n = n->right;
		after = NULL;
	}
}

/* Adds s to the tenant's maps (creating the tenant), with the write lock
 * held. EEXISTS if its id or context keys are taken. */
static int
tenant_insert(mem_driver *m, const char *tenant, mem_session *s)
{
	mem_tenant *t = tenant_find(m, tenant);
	int rc;

	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t || !(t->name = strdup(tenant))) {
			free(t);
			return enomem();
		}
		t->len = strlen(tenant);
		htab_init(&t->ids, session_id_key, m->seed);
		htab_init(&t->ctx, session_canon_key, m->seed);
		if ((rc = htab_insert(&m->tenants, t))) {
			free(t->name);
			free(t);
			return rc;
		}
	}
	if (htab_find(&t->ids, s->id, s->id_len))
		return histd_error_set(HISTD_EEXISTS, "session id already exists");
	if (s->canon && htab_find(&t->ctx, s->canon, s->canon_len))
		return histd_error_set(HISTD_EEXISTS,
				       "another session has the same context_keys");
	if (m->max_sessions && t->ids.n >= m->max_sessions)
		return histd_error_set(HISTD_ELIMIT,
				       "the tenant has %zu sessions; the limit is %llu",
				       t->ids.n,
				       (unsigned long long)m->max_sessions);
	if ((rc = htab_reserve(&t->ids, t->ids.n + 1)) ||
	    (s->canon && (rc = htab_reserve(&t->ctx, t->ctx.n + 1))))
		return rc;
	htab_put(&t->ids, s);
	if (s->canon)
		htab_put(&t->ctx, s);
	t->root = treap_insert(t->root, s);
	s->tenant = t;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Finding a session for an operation                                      */

/* A reference on the live-or-not session, or NULL. */
static mem_session *
session_ref(mem_driver *m, const char *tenant, const char *id)
{
	mem_session *s;

	pthread_rwlock_rdlock(&m->lock);
	s = session_find(m, tenant, id);
	if (s)
		atomic_fetch_add(&s->refs, 1);
	pthread_rwlock_unlock(&m->lock);
	return s;
}

/* The session, referenced and locked; ENOTFOUND. */
static int
session_open(mem_driver *m, const char *tenant, const char *id,
	     mem_session **out)
{
	mem_session *s = session_ref(m, tenant, id);

	if (!s)
		return not_found();
	pthread_mutex_lock(&s->mu);
	if (s->deleted) {
		pthread_mutex_unlock(&s->mu);
		session_unref(s);
		return not_found();
	}
	*out = s;
	return 0;
}

static void
session_close(mem_session *s)
{
	pthread_mutex_unlock(&s->mu);
	session_unref(s);
}

/* ---------------------------------------------------------------------- */
/* Sessions                                                                */

static int
mem_session_create(histd_driver *d, const histd_session *in,
		   histd_session **out)
{
	mem_driver *m = (mem_driver *)d;
	mem_session *s = session_new(m, in);
	histd_session *rec;
	int rc;

	/* Everything is built before the lock, which is held only to
	 * check and insert. */
	if (!s)
		return enomem();
	if (!(rec = session_export(s, in->tenant))) {
		session_destroy(s);
		return enomem();
	}
	pthread_rwlock_wrlock(&m->lock);
	rc = tenant_insert(m, in->tenant, s);
	pthread_rwlock_unlock(&m->lock);
	if (rc) {
		session_destroy(s);
		histd_session_free(rec);
		return rc;
	}
	*out = rec;
	return 0;
}

static int
mem_session_get(histd_driver *d, const char *tenant, const char *id,
		histd_session **out)
{
	mem_session *s;
	histd_session *rec;
	int rc;

	if ((rc = session_open((mem_driver *)d, tenant, id, &s)))
		return rc;
	rec = session_export(s, tenant);
	session_close(s);
	if (!rec)
		return enomem();
	*out = rec;
	return 0;
}

static int
mem_session_resolve(histd_driver *d, const histd_session *in,
		    histd_session **out, int *created)
{
	mem_driver *m = (mem_driver *)d;
	mem_session *fresh = NULL, *s;
	histd_session *rec = NULL, *fresh_rec = NULL;
	uint8_t *canon;
	size_t canon_len;
	int rc = 0, made = 0;

	canon = canon_make(in->context_keys, in->n_context_keys, &canon_len);
	if (!canon)
		return enomem();
	for (;;) {
		mem_tenant *t;

		/* The common case: the session exists. */
		pthread_rwlock_rdlock(&m->lock);
		t = tenant_find(m, in->tenant);
		s = t ? htab_find(&t->ctx, canon, canon_len) : NULL;
		if (s)
			atomic_fetch_add(&s->refs, 1);
		pthread_rwlock_unlock(&m->lock);
		if (s) {
			pthread_mutex_lock(&s->mu);
			if (!s->deleted && !(rec = session_export(s, in->tenant)))
				rc = enomem();
			pthread_mutex_unlock(&s->mu);
			session_unref(s);
			if (rec || rc)
				break;
			continue;       /* deleted meanwhile: look again */
		}
		/* Built once, outside the lock, as create does. */
		if (!fresh && (!(fresh = session_new(m, in)) ||
			       !(fresh_rec = session_export(fresh, in->tenant)))) {
			rc = enomem();
			break;
		}
		/* Check again and create under the write lock, so that two
		 * resolves of the same keys create one session. */
		pthread_rwlock_wrlock(&m->lock);
		t = tenant_find(m, in->tenant);
		if (t && htab_find(&t->ctx, canon, canon_len)) {
			pthread_rwlock_unlock(&m->lock);
			continue;
		}
		rc = tenant_insert(m, in->tenant, fresh);
		pthread_rwlock_unlock(&m->lock);
		if (rc == 0) {
			fresh = NULL;   /* the maps own it */
			rec = fresh_rec;
			fresh_rec = NULL;
			made = 1;
		}
		break;
	}
	free(canon);
	if (fresh)
		session_destroy(fresh);
	histd_session_free(fresh_rec);
	if (rc)
		return rc;
	*created = made;
	*out = rec;
	return 0;
}

/* Appends the caller's copy of s to the list. */
static int
list_add(histd_session_list *l, size_t *cap, const mem_session *s,
	 const char *tenant)
{
	histd_session *rec;

	if (l->n == *cap) {
		size_t ncap = *cap ? *cap * 2 : 16;
		histd_session **v = realloc(l->v, ncap * sizeof(*v));

		if (!v)
			return enomem();
		l->v = v;
		*cap = ncap;
	}
	if (!(rec = session_export(s, tenant)))
		return enomem();
	l->v[l->n++] = rec;
	return 0;
}

static int
mem_session_list(histd_driver *d, const histd_list *q, histd_session_list *out)
{
	mem_driver *m = (mem_driver *)d;
	size_t batch = q->n_labels ? LIST_SCAN_BATCH : (size_t)q->limit + 1;
	mem_session **cand, *cursor_ref = NULL;
	const char *cursor = q->after_id && *q->after_id ? q->after_id : NULL;
	histd_session_list l = { 0 };
	size_t cap = 0;
	int rc = 0, done = 0;

	if (batch > LIST_MAX_BATCH)
		batch = LIST_MAX_BATCH;
	cand = malloc(batch * sizeof(*cand));
	if (!cand)
		return enomem();
	/* Candidates are taken in id order under the lock, then examined
	 * each under its own mutex with the lock released (the lock order
	 * forbids the other way round). A reference on the last candidate
	 * keeps its id alive as the cursor of the next pass. */
	while (!done) {
		mem_tenant *t;
		size_t k = 0;

		pthread_rwlock_rdlock(&m->lock);
		t = tenant_find(m, q->tenant);
		if (t)
			treap_after(t->root, cursor, cand, batch, &k);
		for (size_t i = 0; i < k; i++)
			atomic_fetch_add(&cand[i]->refs, 1);
		pthread_rwlock_unlock(&m->lock);
		if (k < batch)
			done = 1;

		for (size_t i = 0; i < k && rc == 0 && !l.has_more; i++) {
			mem_session *s = cand[i];

			pthread_mutex_lock(&s->mu);
			if (!s->deleted &&
			    histd_kv_contains(s->labels, s->n_labels, q->labels,
					      q->n_labels)) {
				if (l.n == q->limit)
					l.has_more = 1;
				else
					rc = list_add(&l, &cap, s, q->tenant);
			}
			pthread_mutex_unlock(&s->mu);
		}
		if (rc || l.has_more)
			done = 1;
		if (cursor_ref)
			session_unref(cursor_ref);
		cursor_ref = NULL;
		if (k) {
			cursor_ref = cand[k - 1];
			cursor = cursor_ref->id;
			for (size_t i = 0; i + 1 < k; i++)
				session_unref(cand[i]);
		}
	}
	if (cursor_ref)
		session_unref(cursor_ref);
	free(cand);
	if (rc) {
		histd_session_list_free(&l);
		return rc;
	}
	*out = l;
	return 0;
}

/* Tenants stay in the map once made: those with no session left are
 * skipped. One pass over the map per page. */
static int
mem_tenant_list(histd_driver *d, const char *after, uint32_t limit,
		histd_tenant_list *out)
{
	mem_driver *m = (mem_driver *)d;
	histd_tenant_list l = { 0 };
	int rc = 0;

	pthread_rwlock_rdlock(&m->lock);
	for (size_t i = 0; m->tenants.slots && i <= m->tenants.mask && !rc;
	     i++) {
		const mem_tenant *t = m->tenants.slots[i].v;

		if (t && t->ids.n)
			rc = histd_tenant_list_offer(&l, after, limit, t->name);
	}
	pthread_rwlock_unlock(&m->lock);
	if (rc) {
		histd_tenant_list_free(&l);
		return rc;
	}
	*out = l;
	return 0;
}

static int
mem_session_update(histd_driver *d, const char *tenant, const char *id,
		   uint64_t expected_revision, const histd_kv *labels,
		   size_t n_labels, const uint8_t *config, size_t config_len,
		   int64_t now_us, histd_session **out,
		   uint64_t *current_revision)
{
	mem_driver *m = (mem_driver *)d;
	histd_kv *new_labels = NULL, *rec_labels = NULL;
	uint8_t *new_config = NULL, *rec_config = NULL;
	histd_session *rec = NULL;
	mem_session *s;
	int rc;

	if ((rc = session_open(m, tenant, id, &s)))
		return rc;
	if ((rc = check_revision(s, expected_revision, current_revision)))
		goto out;
	/* Two copies of each new value (the session's and the caller's
	 * record), all made before anything changes. */
	rc = HISTD_ENOMEM;
	if (labels && (histd_kv_dup(&new_labels, labels, n_labels) ||
		       histd_kv_dup(&rec_labels, labels, n_labels)))
		goto out;
	if (config && config_len &&
	    (!(new_config = malloc(config_len)) || !(rec_config = malloc(config_len))))
		goto out;
	if (!(rec = session_export(s, tenant)))
		goto out;
	rc = 0;

	if (labels) {
		histd_kv_free(s->labels, s->n_labels);
		s->labels = new_labels;
		s->n_labels = n_labels;
		new_labels = NULL;
		histd_kv_free(rec->labels, rec->n_labels);
		rec->labels = rec_labels;
		rec->n_labels = n_labels;
		rec_labels = NULL;
	}
	if (config) {
		if (config_len) {
			memcpy(new_config, config, config_len);
			memcpy(rec_config, config, config_len);
		}
		free(s->config);
		s->config = new_config;
		s->config_len = config_len;
		new_config = NULL;
		free(rec->config);
		rec->config = rec_config;
		rec->config_len = config_len;
		rec_config = NULL;
	}
	s->updated_at_us = rec->updated_at_us = now_us;
	s->active_at_us = rec->active_at_us = now_us;
	rec->revision = ++s->revision;
	notify(m, s, tenant, HISTD_CHANGE_UPDATED, NULL, 0, rec);
	*out = rec;
	rec = NULL;
out:
	if (rc == HISTD_ENOMEM)
		enomem();
	histd_kv_free(new_labels, n_labels);
	histd_kv_free(rec_labels, n_labels);
	free(new_config);
	free(rec_config);
	histd_session_free(rec);
	session_close(s);
	return rc;
}

static int
mem_session_delete_life(histd_driver *d, const char *tenant, const char *id,
			uint64_t expected_revision, uint64_t incarnation,
			uint64_t *current_revision)
{
	mem_driver *m = (mem_driver *)d;
	mem_tenant *t;
	mem_session *s;
	int rc;

	if ((rc = session_open(m, tenant, id, &s)))
		return rc;
	if ((rc = check_life(s, incarnation)) ||
	    (rc = check_revision(s, expected_revision, current_revision))) {
		session_close(s);
		return rc;
	}
	pthread_rwlock_wrlock(&m->lock);
	t = tenant_find(m, tenant);
	htab_del(&t->ids, s->id, s->id_len);
	if (s->canon)
		htab_del(&t->ctx, s->canon, s->canon_len);
	t->root = treap_remove(t->root, s);
	pthread_rwlock_unlock(&m->lock);
	atomic_fetch_sub(&s->refs, 1);  /* the maps'; ours keeps it alive */

	/* Free the data now: whoever still holds a reference sees
	 * `deleted` before touching anything. The deletion is reported as
	 * one more revision, so that a subscriber whose snapshot saw the
	 * last write still gets it. */
	s->deleted = 1;
	s->revision++;
	drop_data(s);
	notify(m, s, tenant, HISTD_CHANGE_DELETED, NULL, 0, NULL);
	session_close(s);
	return 0;
}

static int
mem_session_delete(histd_driver *d, const char *tenant, const char *id,
		   uint64_t expected_revision, uint64_t *current_revision)
{
	return mem_session_delete_life(d, tenant, id, expected_revision, 0,
				       current_revision);
}

static int
mem_session_fork_life(histd_driver *d, const char *tenant,
		      const char *source_id, uint64_t source_incarnation,
		      uint64_t up_to_seq, const histd_session *in,
		      histd_session **out)
{
	mem_driver *m = (mem_driver *)d;
	mem_session *src, *f;
	histd_session *rec = NULL;
	uint64_t last;
	size_t k;
	int rc;

	if (!(f = session_new(m, in)))
		return enomem();
	if ((rc = session_open(m, tenant, source_id, &src))) {
		session_destroy(f);
		return rc;
	}
	if ((rc = check_life(src, source_incarnation)))
		goto out;
	/* Fail early, before copying, if the id is taken; checked again
	 * when inserting. */
	pthread_rwlock_rdlock(&m->lock);
	if (session_find(m, tenant, f->id))
		rc = histd_error_set(HISTD_EEXISTS, "session id already exists");
	pthread_rwlock_unlock(&m->lock);
	if (rc)
		goto out;

	rc = HISTD_ENOMEM;
	last = up_to_seq && up_to_seq < src->last_seq ? up_to_seq : src->last_seq;
	free(f->config);
	f->config = NULL;
	f->config_len = 0;
	if (src->config_len) {
		if (!(f->config = malloc(src->config_len)))
			goto out;
		memcpy(f->config, src->config, src->config_len);
		f->config_len = src->config_len;
	}
	k = first_after(src->msgs, src->n_msgs, last);
	{
		uint64_t bytes = 0;

		for (size_t i = 0; i < k; i++)
			bytes += src->msgs[i].len;
		if ((rc = check_size(m, k, bytes)))
			goto out;
		rc = HISTD_ENOMEM;
	}
	if (msgs_reserve(f, k))
		goto out;
	for (; f->n_msgs < k; f->n_msgs++) {
		const histd_record *r = &src->msgs[f->n_msgs];
		histd_record *c = &f->msgs[f->n_msgs];

		if (!(c->data = malloc(r->len ? r->len : 1)))
			goto out;
		memcpy(c->data, r->data, r->len);
		c->seq = r->seq;
		c->token_estimate = r->token_estimate;
		c->len = r->len;
		f->token_total += r->token_estimate;
		f->bytes_total += r->len;
	}
	/* In put order, so ties resolve as in the source. */
	for (size_t i = 0; i < src->n_sums; i++)
		if ((!up_to_seq || src->sums[i].seq <= up_to_seq) &&
		    sums_add(f, &src->sums[i]))
			goto out;
	/* The tool call state of the copied messages: calls they issued,
	 * answered only if the answer was copied too. */
	if (htab_reserve(&f->tools, src->tools.n))
		goto out;
	for (size_t i = 0; src->tools.slots && i <= src->tools.mask; i++) {
		const mem_tool *t = src->tools.slots[i].v;
		mem_tool *c;

		if (!t || t->call_seq > last)
			continue;
		if (!(c = malloc(sizeof(*c) + t->len + 1)))
			goto out;
		memcpy(c, t, sizeof(*c) + t->len + 1);
		if (c->result_seq > last)
			c->result_seq = 0;
		htab_put(&f->tools, c);
	}
	if (histd_vecs_copy(&f->vecs, &src->vecs, last))
		goto out;
	f->last_seq = last;
	f->cleared_to_seq = src->cleared_to_seq < last ? src->cleared_to_seq : last;
	if (!(rec = session_export(f, tenant)))
		goto out;

	/* Inserted while the source is still locked, so the fork is the
	 * source as it is at the moment the fork appears; and with its own
	 * mutex held, so that nobody changes it before it is indexed. The
	 * indexing (every copied message tokenized) is outside the driver's
	 * lock, which every call of every tenant takes: an index build that
	 * lists the fork meanwhile syncs it after this, adding nothing. */
	pthread_mutex_lock(&f->mu);
	pthread_rwlock_wrlock(&m->lock);
	rc = tenant_insert(m, tenant, f);
	pthread_rwlock_unlock(&m->lock);
	if (rc == 0)
		index_change(f, HISTD_CHANGE_APPENDED);
	pthread_mutex_unlock(&f->mu);
	if (rc == 0) {
		f = NULL;
		*out = rec;
		rec = NULL;
	}
out:
	if (rc == HISTD_ENOMEM)
		enomem();
	session_close(src);
	if (f)
		session_destroy(f);
	histd_session_free(rec);
	return rc;
}

static int
mem_session_fork(histd_driver *d, const char *tenant, const char *source_id,
		 uint64_t up_to_seq, const histd_session *in,
		 histd_session **out)
{
	return mem_session_fork_life(d, tenant, source_id, 0, up_to_seq, in,
				     out);
}

/* ---------------------------------------------------------------------- */
/* Messages                                                                */

static int
mem_append(histd_driver *d, const histd_append *a, histd_append_result *res)
{
	mem_driver *m = (mem_driver *)d;
	const char *key = a->idempotency_key;
	size_t klen = key ? strlen(key) : 0, k = a->n_msgs, old_n;
	mem_idem *e = NULL, *fresh_e = NULL;
	stage st = { 0 };
	mem_session *s;
	uint64_t first;
	int rc;

	if ((rc = session_open(m, a->tenant, a->session_id, &s)))
		return rc;
	idem_purge(s, a->now_us);
	if (klen && (e = htab_find(&s->idem, key, klen)) &&
	    e->expires_us > a->now_us) {
		if (memcmp(e->hash, a->request_hash, HISTD_HASH_LEN) != 0) {
			rc = histd_error_set(HISTD_EPRECONDITION,
					     "idempotency_key was used with a different request");
			goto out;
		}
		res->first_seq = e->first_seq;
		res->last_seq = e->last_seq;
		res->revision = e->revision;
		res->replayed = 1;
		goto out;
	}
	/* e, if set, is an expired key: it is renewed in place below. */
	if ((rc = check_revision(s, a->expected_revision, &res->current_revision)))
		goto out;
	first = s->last_seq + 1;
	if ((rc = stage_tools(&st, &s->tools, a, first, m->seed)) ||
	    (rc = check_size(m, s->n_msgs + k,
			     s->bytes_total + batch_bytes(a, first))) ||
	    (rc = htab_reserve(&s->tools, s->tools.n + st.n_fresh)) ||
	    (rc = msgs_reserve(s, s->n_msgs + k)))
		goto out;
	if (klen && !e) {
		if (klen > UINT32_MAX ||
		    !(fresh_e = calloc(1, sizeof(*fresh_e) + klen + 1))) {
			rc = enomem();
			goto out;
		}
		fresh_e->len = (uint32_t)klen;
		memcpy(fresh_e->key, key, klen + 1);
		if ((rc = htab_reserve(&s->idem, s->idem.n + 1)))
			goto out;
	}
	if ((rc = records_make(s->msgs + s->n_msgs, a, first)))
		goto out;

	/* Commit: nothing below can fail. */
	old_n = s->n_msgs;
	for (size_t i = old_n; i < old_n + k; i++) {
		s->token_total += s->msgs[i].token_estimate;
		s->bytes_total += s->msgs[i].len;
	}
	s->n_msgs += k;
	stage_commit(&st, &s->tools);
	s->last_seq += k;
	s->revision++;
	s->active_at_us = a->now_us;
	if (klen) {
		if (e) {
			idem_unlink(s, e);
		} else {
			e = fresh_e;
			fresh_e = NULL;
			htab_put(&s->idem, e);
		}
		memcpy(e->hash, a->request_hash, HISTD_HASH_LEN);
		e->first_seq = first;
		e->last_seq = s->last_seq;
		e->revision = s->revision;
		e->expires_us = a->idem_expires_us;
		idem_push(s, e);
	}
	notify(m, s, a->tenant, HISTD_CHANGE_APPENDED, s->msgs + old_n, k, NULL);
	res->first_seq = first;
	res->last_seq = s->last_seq;
	res->revision = s->revision;
	res->replayed = 0;
out:
	stage_free(&st);
	free(fresh_e);
	session_close(s);
	return rc;
}

void (*_Atomic histd_memory_read_test_hook)(const histd_read *q);

static int
mem_read(histd_driver *d, const histd_read *q, histd_read_result *res)
{
	void (*hook)(const histd_read *) = histd_memory_read_test_hook;
	mem_session *s;
	size_t from, to;
	int rc, budget_cut;

	if (hook)
		hook(q);
	if ((rc = session_open((mem_driver *)d, q->tenant, q->session_id, &s)))
		return rc;
	if (q->last_n) {
		from = s->n_msgs > q->last_n ? s->n_msgs - q->last_n : 0;
		to = s->n_msgs;
	} else {
		from = first_after(s->msgs, s->n_msgs, q->after_seq);
		to = q->limit && s->n_msgs - from > q->limit ? from + q->limit
							      : s->n_msgs;
	}
	budget_cut = histd_read_budget(q, s->msgs, &from, &to);
	if ((rc = histd_records_reserve(&res->records, q,
					to > from ? s->msgs + from : NULL,
					to - from)))
		goto out;
	for (size_t i = from; i < to; i++) {
		const histd_record *r = &s->msgs[i];

		if ((rc = histd_records_add(&res->records, r->seq, r->token_estimate,
					    r->data, r->len)))
			goto out;
	}
	if (histd_read_known(q, s->revision, s->created_at_us)) {
		res->known = 1;
	} else if (q->want_session &&
		   !(res->session = session_export(s, q->tenant))) {
		rc = enomem();
		goto out;
	}
	if (q->want_summary && s->n_sums && !res->known) {
		const histd_record *r = &s->sums[s->best_sum];

		if (!(res->summary = histd_record_new(r->seq, r->token_estimate,
						      r->data, r->len))) {
			rc = enomem();
			goto out;
		}
	}
	res->summary_read = q->want_summary != 0;
	res->revision = s->revision;
	res->last_seq = s->last_seq;
	res->cleared_to_seq = s->cleared_to_seq;
	res->has_more = to < s->n_msgs || budget_cut;
out:
	session_close(s);
	if (rc)
		histd_read_result_clear(res);
	return rc;
}

static int
mem_tool_result(histd_driver *d, const char *tenant, const char *id,
		const char *call_id, histd_record **out)
{
	const mem_tool *t;
	mem_session *s;
	size_t i;
	int rc;

	if ((rc = session_open((mem_driver *)d, tenant, id, &s)))
		return rc;
	t = htab_find(&s->tools, call_id, strlen(call_id));
	if (!t || !t->result_seq) {
		rc = histd_error_set(HISTD_ENOTFOUND,
				     "no stored tool result answers tool_call_id");
		goto out;
	}
	i = first_after(s->msgs, s->n_msgs, t->result_seq - 1);
	if (i == s->n_msgs || s->msgs[i].seq != t->result_seq) {
		rc = histd_error_set(HISTD_ENOTFOUND,
				     "no stored tool result answers tool_call_id");
		goto out;
	}
	if (!(*out = histd_record_new(s->msgs[i].seq, s->msgs[i].token_estimate,
				      s->msgs[i].data, s->msgs[i].len)))
		rc = enomem();
out:
	session_close(s);
	return rc;
}

static int
mem_clear(histd_driver *d, const char *tenant, const char *id,
	  uint64_t expected_revision, uint64_t *revision,
	  uint64_t *cleared_to_seq, uint64_t *current_revision)
{
	mem_driver *m = (mem_driver *)d;
	mem_session *s;
	int rc;

	if ((rc = session_open(m, tenant, id, &s)))
		return rc;
	if ((rc = check_revision(s, expected_revision, current_revision)))
		goto out;
	drop_messages(s);
	drop_summaries(s);
	drop_tools(&s->tools);
	s->cleared_to_seq = s->last_seq;
	s->revision++;
	s->active_at_us = histd_now_us();
	notify(m, s, tenant, HISTD_CHANGE_CLEARED, NULL, 0, NULL);
	*revision = s->revision;
	*cleared_to_seq = s->cleared_to_seq;
out:
	session_close(s);
	return rc;
}

static int
mem_replace(histd_driver *d, const histd_append *a, histd_append_result *res,
	    uint64_t *cleared_to_seq)
{
	mem_driver *m = (mem_driver *)d;
	size_t k = a->n_msgs;
	histd_record *v = NULL;
	stage st = { 0 };
	htab tools;
	mem_session *s;
	uint64_t first;
	int rc;

	htab_init(&tools, tool_key, m->seed);
	if ((rc = session_open(m, a->tenant, a->session_id, &s)))
		return rc;
	if ((rc = check_revision(s, a->expected_revision, &res->current_revision)))
		goto out;
	/* The new messages, checked against an empty index, all in new
	 * storage: the old is dropped only once nothing can fail. */
	first = s->last_seq + 1;
	if ((rc = stage_tools(&st, NULL, a, first, m->seed)) ||
	    (rc = check_size(m, k, batch_bytes(a, first))) ||
	    (rc = htab_reserve(&tools, st.n_fresh)))
		goto out;
	if (k && !(v = malloc(k * sizeof(*v)))) {
		rc = enomem();
		goto out;
	}
	if ((rc = records_make(v, a, first)))
		goto out;

	drop_messages(s);
	drop_summaries(s);
	drop_tools(&s->tools);
	s->msgs = v;
	s->n_msgs = s->cap_msgs = k;
	v = NULL;
	for (size_t i = 0; i < k; i++) {
		s->token_total += s->msgs[i].token_estimate;
		s->bytes_total += s->msgs[i].len;
	}
	s->tools = tools;
	htab_init(&tools, tool_key, m->seed);
	stage_commit(&st, &s->tools);
	s->cleared_to_seq = s->last_seq;
	s->last_seq += k;
	s->revision++;
	s->active_at_us = a->now_us;
	notify(m, s, a->tenant, HISTD_CHANGE_REPLACED, s->msgs, k, NULL);
	res->first_seq = k ? first : 0;
	res->last_seq = k ? s->last_seq : 0;
	res->revision = s->revision;
	res->replayed = 0;
	*cleared_to_seq = s->cleared_to_seq;
out:
	free(v);
	htab_free(&tools);
	stage_free(&st);
	session_close(s);
	return rc;
}

/* Whether a stored message is a system message (truncate keeps those). A
 * message that does not parse is not one: truncate deletes it. */
static int
is_system(const histd_record *r)
{
	return histd_index_message_role(r->data, r->len) ==
	       HISTD__V1__ROLE__ROLE_SYSTEM;
}

/* Whether a non-system message is stored at or below up_to. */
static int
deletes_something(const mem_session *s, uint64_t up_to)
{
	for (size_t i = 0; i < s->n_msgs && s->msgs[i].seq <= up_to; i++)
		if (!is_system(&s->msgs[i]))
			return 1;
	return 0;
}

/* Whether a message with this seq is still stored. */
static int
stored(const mem_session *s, uint64_t seq)
{
	size_t i = first_after(s->msgs, s->n_msgs, seq - 1);

	return i < s->n_msgs && s->msgs[i].seq == seq;
}

/* Drops the non-system messages with seq <= up_to, their vectors, the
 * tool calls they issued, and the summaries with covers_to_seq <= up_to.
 * System messages stay where they are. Cannot fail. */
static void
drop_up_to(mem_session *s, uint64_t up_to, mem_tool **victims)
{
	size_t k = first_after(s->msgs, s->n_msgs, up_to), w = 0, nv = 0;

	for (size_t i = 0; i < k; i++) {
		if (is_system(&s->msgs[i])) {
			s->msgs[w++] = s->msgs[i];
			continue;
		}
		s->token_total -= s->msgs[i].token_estimate;
		s->bytes_total -= s->msgs[i].len;
		free(s->msgs[i].data);
	}
	memmove(s->msgs + w, s->msgs + k, (s->n_msgs - k) * sizeof(*s->msgs));
	s->n_msgs -= k - w;

	w = 0;
	for (size_t i = 0; i < s->vecs.n; i++) {
		if (s->vecs.v[i]->seq <= up_to && !stored(s, s->vecs.v[i]->seq))
			free(s->vecs.v[i]);
		else
			s->vecs.v[w++] = s->vecs.v[i];
	}
	s->vecs.n = w;

	/* Deleting from the table while walking it would shift entries
	 * past the cursor: collect first, then delete. */
	for (size_t i = 0; s->tools.slots && i <= s->tools.mask; i++) {
		mem_tool *t = s->tools.slots[i].v;

		if (t && t->call_seq <= up_to && !stored(s, t->call_seq))
			victims[nv++] = t;
	}
	for (size_t i = 0; i < nv; i++) {
		htab_del(&s->tools, victims[i]->id, victims[i]->len);
		free(victims[i]);
	}

	w = 0;
	for (size_t i = 0; i < s->n_sums; i++) {
		if (s->sums[i].seq <= up_to)
			free(s->sums[i].data);
		else
			s->sums[w++] = s->sums[i];
	}
	s->n_sums = w;
	s->best_sum = 0;
	for (size_t i = 1; i < s->n_sums; i++)
		if (s->sums[i].seq >= s->sums[s->best_sum].seq)
			s->best_sum = i;
}

static int
mem_truncate_life(histd_driver *d, const char *tenant, const char *id,
		  uint64_t up_to_seq, uint64_t expected_revision,
		  uint64_t incarnation, uint64_t *revision,
		  uint64_t *current_revision)
{
	mem_driver *m = (mem_driver *)d;
	mem_tool **victims = NULL;
	histd_index *ix;
	mem_session *s;
	int rc;

	if ((rc = session_open(m, tenant, id, &s)))
		return rc;
	if ((rc = check_life(s, incarnation)) ||
	    (rc = check_revision(s, expected_revision, current_revision)))
		goto out;
	if (!deletes_something(s, up_to_seq)) {
		*revision = s->revision;
		goto out;
	}
	/* Nothing stored is above last_seq: cleared_to_seq never passes it. */
	if (up_to_seq > s->last_seq)
		up_to_seq = s->last_seq;
	if (!(victims = malloc((s->tools.n ? s->tools.n : 1) * sizeof(*victims)))) {
		rc = enomem();
		goto out;
	}
	drop_up_to(s, up_to_seq, victims);
	if (up_to_seq > s->cleared_to_seq)
		s->cleared_to_seq = up_to_seq;
	s->revision++;
	s->active_at_us = histd_now_us();
	/* The index forgets the session and reads what is left again: its
	 * documents can only be dropped wholesale. */
	ix = s->tenant ? atomic_load(&s->tenant->index) : NULL;
	if (ix) {
		histd_index_forget(ix, index_key(s));
		(void)histd_index_sync(ix, index_key(s), s->id,
				       s->msgs, s->n_msgs);
	}
	if (m->notify) {
		histd_change c = {
			.kind = HISTD_CHANGE_CLEARED,
			.tenant = tenant,
			.session_id = s->id,
			.revision = s->revision,
			.cleared_to_seq = up_to_seq,
			.system_kept = 1,
			.incarnation = s->incarnation,
		};

		m->notify(m->notify_ctx, &c);
	}
	*revision = s->revision;
out:
	free(victims);
	session_close(s);
	return rc;
}

static int
mem_truncate(histd_driver *d, const char *tenant, const char *id,
	     uint64_t up_to_seq, uint64_t expected_revision,
	     uint64_t *revision, uint64_t *current_revision)
{
	return mem_truncate_life(d, tenant, id, up_to_seq, expected_revision, 0,
				 revision, current_revision);
}

/* ---------------------------------------------------------------------- */
/* Summaries                                                               */

static int
mem_summary_put_life(histd_driver *d, const char *tenant, const char *id,
		     uint64_t expected_revision, uint64_t incarnation,
		     const histd_record *summary, uint64_t *revision,
		     uint64_t *current_revision)
{
	mem_driver *m = (mem_driver *)d;
	mem_session *s;
	int rc;

	if ((rc = session_open(m, tenant, id, &s)))
		return rc;
	if ((rc = check_life(s, incarnation)) ||
	    (rc = check_revision(s, expected_revision, current_revision)) ||
	    (rc = sums_add(s, summary)))
		goto out;
	s->revision++;
	s->active_at_us = histd_now_us();
	notify(m, s, tenant, HISTD_CHANGE_SUMMARY, &s->sums[s->n_sums - 1], 1,
	       NULL);
	*revision = s->revision;
out:
	session_close(s);
	return rc;
}

static int
mem_summary_put(histd_driver *d, const char *tenant, const char *id,
		uint64_t expected_revision, const histd_record *summary,
		uint64_t *revision, uint64_t *current_revision)
{
	return mem_summary_put_life(d, tenant, id, expected_revision, 0,
				    summary, revision, current_revision);
}

static int
mem_summary_get(histd_driver *d, const char *tenant, const char *id,
		histd_record **out)
{
	const histd_record *r;
	mem_session *s;
	int rc;

	if ((rc = session_open((mem_driver *)d, tenant, id, &s)))
		return rc;
	*out = NULL;
	if (s->n_sums) {
		r = &s->sums[s->best_sum];
		if (!(*out = histd_record_new(r->seq, r->token_estimate, r->data,
					      r->len)))
			rc = enomem();
	}
	session_close(s);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Search                                                                  */

/* References on every session of a tenant (under the driver's lock, held
 * by the caller), in id order. */
static int
tenant_sessions(mem_tenant *t, mem_session ***out, size_t *n)
{
	size_t cnt = t ? t->ids.n : 0, k = 0;
	mem_session **v = malloc((cnt ? cnt : 1) * sizeof(*v));

	if (!v)
		return enomem();
	if (t)
		treap_after(t->root, NULL, v, cnt, &k);
	for (size_t i = 0; i < k; i++)
		atomic_fetch_add(&v[i]->refs, 1);
	*out = v;
	*n = k;
	return 0;
}

static void
sessions_unref(mem_session **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		session_unref(v[i]);
	free(v);
}

/* The tenant's index, built by the first search (or rebuilt after an
 * allocation failure left it incomplete); NULL (and 0) for a tenant that
 * has no session yet. */
static int
tenant_index(mem_driver *m, const char *tenant, histd_index **out)
{
	mem_session **v = NULL;
	histd_index *ix, *fresh = NULL;
	mem_tenant *t;
	size_t n = 0;
	int rc = 0;

	pthread_rwlock_rdlock(&m->lock);
	t = tenant_find(m, tenant);
	ix = t ? atomic_load(&t->index) : NULL;
	pthread_rwlock_unlock(&m->lock);
	*out = ix;
	if (!t || (ix && !histd_index_incomplete(ix)))
		return 0;

	pthread_mutex_lock(&m->build_mu);
	ix = atomic_load(&t->index);
	if (ix && !histd_index_incomplete(ix))
		goto done;
	if (!ix && (rc = histd_index_new(&fresh)))
		goto done;
	/* Emptied or published with the list of sessions to read: a session
	 * created after this is indexed by its own changes, one listed here
	 * by the sync below; sync only adds what the index lacks, so a
	 * session changed meanwhile is not indexed twice. Without the list,
	 * nothing changes: an index stays incomplete, or unpublished. */
	pthread_rwlock_wrlock(&m->lock);
	rc = tenant_sessions(t, &v, &n);
	if (rc == 0 && ix)
		histd_index_reset(ix);
	else if (rc == 0)
		atomic_store(&t->index, ix = fresh);
	pthread_rwlock_unlock(&m->lock);
	if (rc) {
		histd_index_free(fresh);
		goto done;
	}
	for (size_t i = 0; i < n && rc == 0; i++) {
		mem_session *s = v[i];

		pthread_mutex_lock(&s->mu);
		if (!s->deleted)
			rc = histd_index_sync(ix, index_key(s), s->id,
					      s->msgs, s->n_msgs);
		pthread_mutex_unlock(&s->mu);
	}
	if (v)
		sessions_unref(v, n);
done:
	pthread_mutex_unlock(&m->build_mu);
	*out = ix;
	return rc;
}

/* The sessions a query names (session ids or labels; whole tenant: all),
 * referenced. */
static int
scope_sessions(mem_driver *m, const histd_search_query *q, mem_session ***out,
	       size_t *n)
{
	mem_session **v;
	size_t k = 0;
	int rc;

	if (q->n_session_ids) {
		if (!(v = malloc(q->n_session_ids * sizeof(*v))))
			return enomem();
		for (size_t i = 0; i < q->n_session_ids; i++) {
			mem_session *s = session_ref(m, q->tenant, q->session_ids[i]);
			size_t j;

			/* A repeated id is one session. */
			for (j = 0; s && j < k && v[j] != s; j++)
				;
			if (s && j < k)
				session_unref(s);
			else if (s)
				v[k++] = s;
		}
		*out = v;
		*n = k;
		return 0;
	}
	pthread_rwlock_rdlock(&m->lock);
	rc = tenant_sessions(tenant_find(m, q->tenant), &v, &k);
	pthread_rwlock_unlock(&m->lock);
	if (rc)
		return rc;
	if (q->n_labels) {
		size_t w = 0;

		for (size_t i = 0; i < k; i++) {
			mem_session *s = v[i];
			int keep;

			pthread_mutex_lock(&s->mu);
			keep = !s->deleted &&
			       histd_kv_contains(s->labels, s->n_labels, q->labels,
						 q->n_labels);
			pthread_mutex_unlock(&s->mu);
			if (keep)
				v[w++] = s;
			else
				session_unref(s);
		}
		k = w;
	}
	*out = v;
	*n = k;
	return 0;
}

static int
key_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

typedef struct key_set {
	uint64_t *v;
	size_t n;
} key_set;

static int
in_key_set(void *ctx, uint64_t key, const char *id)
{
	const key_set *ks = ctx;

	(void)id;
	return bsearch(&key, ks->v, ks->n, sizeof(*ks->v), key_cmp) != NULL;
}

/* Adds the stored message (key's session, seq) to out, if it is still
 * there. */
static int
hit_add(mem_session *s, const histd_index_hit *h, histd_search_result *out)
{
	int rc = 0;
	size_t i;

	pthread_mutex_lock(&s->mu);
	i = first_after(s->msgs, s->n_msgs, h->seq - 1);
	if (!s->deleted && i < s->n_msgs && s->msgs[i].seq == h->seq)
		rc = histd_search_result_add(out, s->id, h->score, h->seq,
					     s->msgs[i].token_estimate,
					     s->msgs[i].data, s->msgs[i].len);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static int
search_lexical(mem_driver *m, const histd_search_query *q,
	       histd_search_result *out)
{
	histd_index_hit *hits = NULL;
	mem_session **v = NULL;
	key_set ks = { 0 };
	histd_index *ix;
	size_t n = 0, nv = 0;
	int scoped = q->n_session_ids || q->n_labels;
	int rc;

	if ((rc = tenant_index(m, q->tenant, &ix)) || !ix)
		return rc;
	if (scoped) {
		if ((rc = scope_sessions(m, q, &v, &nv)))
			return rc;
		if (!nv)
			goto out;
		if (!(ks.v = malloc(nv * sizeof(*ks.v)))) {
			rc = enomem();
			goto out;
		}
		for (size_t i = 0; i < nv; i++)
			ks.v[ks.n++] = index_key(v[i]);
		qsort(ks.v, ks.n, sizeof(*ks.v), key_cmp);
	}
	if ((rc = histd_index_search(ix, q, scoped ? in_key_set : NULL, &ks,
				     &hits, &n)))
		goto out;
	for (size_t i = 0; i < n && rc == 0; i++) {
		mem_session *s = session_ref(m, q->tenant, hits[i].id);

		/* The same session the index saw, not one made again under
		 * its id since (which may even be at the same address). */
		if (!s)
			continue;
		if (index_key(s) == hits[i].key)
			rc = hit_add(s, &hits[i], out);
		session_unref(s);
	}
out:
	histd_index_hits_free(hits, n);
	free(ks.v);
	if (v)
		sessions_unref(v, nv);
	return rc;
}

static int
search_semantic(mem_driver *m, const histd_search_query *q,
		histd_search_result *out)
{
	mem_session **v = NULL;
	histd_topk top = { 0 };
	float *qn;
	size_t nv = 0;
	int rc;

	if (!(qn = malloc(q->dim * sizeof(*qn))))
		return enomem();
	memcpy(qn, q->vector, q->dim * sizeof(*qn));
	if (histd_vec_normalize(qn, q->dim)) {
		free(qn);
		return histd_error_set(HISTD_EINVALID, "the query vector is zero");
	}
	if ((rc = scope_sessions(m, q, &v, &nv)) ||
	    (rc = histd_topk_init(&top, q->k)))
		goto out;
	for (size_t i = 0; i < nv; i++) {
		mem_session *s = v[i];

		pthread_mutex_lock(&s->mu);
		if (!s->deleted)
			histd_vecs_search(&s->vecs, &top, (uint64_t)(uintptr_t)s,
					  s->id, q->model, q->dim, qn, q->roles,
					  q->exclude_newest && s->n_msgs
						  ? s->msgs[s->n_msgs - 1].seq : 0);
		pthread_mutex_unlock(&s->mu);
	}
	histd_topk_finish(&top);
	/* The sessions are still referenced: their ids and keys are valid. */
	for (size_t i = 0; i < top.n && rc == 0; i++)
		rc = hit_add((mem_session *)(uintptr_t)top.v[i].key, &top.v[i], out);
out:
	histd_topk_free(&top);
	if (v)
		sessions_unref(v, nv);
	free(qn);
	return rc;
}

static int
mem_search(histd_driver *d, const histd_search_query *q,
	   histd_search_result *out)
{
	mem_driver *m = (mem_driver *)d;

	return q->mode == HISTD_SEARCH_SEMANTIC ? search_semantic(m, q, out)
						: search_lexical(m, q, out);
}

static int
mem_embedding_put_life(histd_driver *d, const char *tenant, const char *id,
		       uint64_t incarnation, uint64_t seq, const char *model,
		       const float *v, uint32_t dim)
{
	mem_session *s;
	histd_vec *x;
	size_t i;
	int rc;

	if ((rc = session_open((mem_driver *)d, tenant, id, &s)))
		return rc;
	if ((rc = check_life(s, incarnation)))
		goto out;
	i = first_after(s->msgs, s->n_msgs, seq - 1);
	if (i == s->n_msgs || s->msgs[i].seq != seq) {
		rc = histd_error_set(HISTD_ENOTFOUND, "no stored message has seq %llu",
				     (unsigned long long)seq);
		goto out;
	}
	x = histd_vec_new(seq, (uint8_t)histd_index_message_role(s->msgs[i].data,
								 s->msgs[i].len),
			  model, v, dim);
	if (!x) {
		/* The wrapper refused a vector that cannot be normalized. */
		rc = enomem();
		goto out;
	}
	if ((rc = histd_vecs_put(&s->vecs, x)))
		free(x);
out:
	session_close(s);
	return rc;
}

static int
mem_embedding_put(histd_driver *d, const char *tenant, const char *id,
		  uint64_t seq, const char *model, const float *v, uint32_t dim)
{
	return mem_embedding_put_life(d, tenant, id, 0, seq, model, v, dim);
}

/* ---------------------------------------------------------------------- */
/* The driver                                                              */

static void
mem_set_notify(histd_driver *d, histd_change_fn fn, void *ctx)
{
	mem_driver *m = (mem_driver *)d;

	/* Set before any write (driver.h), so no lock: the threads that
	 * write later are started after it. */
	m->notify = fn;
	m->notify_ctx = ctx;
}

static void
mem_close(histd_driver *d)
{
	mem_driver *m = (mem_driver *)d;

	for (size_t i = 0; m->tenants.slots && i <= m->tenants.mask; i++) {
		mem_tenant *t = m->tenants.slots[i].v;

		if (!t)
			continue;
		for (size_t j = 0; t->ids.slots && j <= t->ids.mask; j++)
			if (t->ids.slots[j].v)
				session_destroy(t->ids.slots[j].v);
		htab_free(&t->ids);
		htab_free(&t->ctx);
		histd_index_free(atomic_load(&t->index));
		free(t->name);
		free(t);
	}
	htab_free(&m->tenants);
	pthread_rwlock_destroy(&m->lock);
	pthread_mutex_destroy(&m->build_mu);
	free(m);
}

static uint64_t
random_seed(void)
{
	uint64_t seed;
	struct timespec ts;

	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) == (ssize_t)sizeof(seed))
		return seed;
	/* No entropy yet (early boot): still differs per process. */
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL ^ (uint64_t)(uintptr_t)&seed;
}

int
histd_memory_driver_open(const histd_driver_config *cfg, histd_driver **out)
{
	pthread_rwlockattr_t attr;
	mem_driver *m;
	int rc;

	m = calloc(1, sizeof(*m));
	if (!m)
		return enomem();
	if (cfg) {
		m->max_sessions = cfg->max_sessions_per_tenant;
		m->max_msgs = cfg->max_session_messages;
		m->max_bytes = cfg->max_session_bytes;
	}
	m->base = (histd_driver){
		.version = HISTD_DRIVER_VERSION,
		.name = "memory",
		.session_create = mem_session_create,
		.session_get = mem_session_get,
		.session_resolve = mem_session_resolve,
		.session_list = mem_session_list,
		.session_update = mem_session_update,
		.session_delete = mem_session_delete,
		.session_fork = mem_session_fork,
		.append = mem_append,
		.read = mem_read,
		.tool_result = mem_tool_result,
		.clear = mem_clear,
		.replace = mem_replace,
		.summary_put = mem_summary_put,
		.summary_get = mem_summary_get,
		.set_notify = mem_set_notify,
		.ping = NULL,           /* always reachable: the default */
		.close = mem_close,
		.search = mem_search,
		.embedding_put = mem_embedding_put,
		.truncate = mem_truncate,
		.tenant_list = mem_tenant_list,
		.session_delete_life = mem_session_delete_life,
		.truncate_life = mem_truncate_life,
		.summary_put_life = mem_summary_put_life,
		.session_fork_life = mem_session_fork_life,
		.embedding_put_life = mem_embedding_put_life,
	};
	m->seed = random_seed();
	htab_init(&m->tenants, tenant_key, m->seed);
	pthread_mutex_init(&m->build_mu, NULL);
	/* Writers preferred: creates and deletes must not starve behind a
	 * steady stream of lookups, which hold the lock only briefly. */
	if (pthread_rwlockattr_init(&attr) != 0) {
		free(m);
		return enomem();
	}
	pthread_rwlockattr_setkind_np(&attr,
				      PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	rc = pthread_rwlock_init(&m->lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	if (rc != 0) {
		free(m);
		return enomem();
	}
	*out = &m->base;
	return 0;
}
