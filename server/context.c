/*
 * The CONTEXT view, Reduce, automatic compaction and the session TTL
 * (context.h).
 */
#include "context.h"
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compaction.h"
#include "histd_wire.h"
#include "log.h"
#include "plugin.h"
#include "tokens.h"

#define BUCKETS 16384
/* An entry idle this long (and at least the session TTL), unused and with
 * nothing queued, goes when its bucket next takes a new one: it holds
 * only caches, made again by the next use. */
#define SESS_IDLE_US (INT64_C(600) * 1000000)
/* Buckets a new entry also reaps, in turn, so that every bucket is looked
 * at while entries are made. */
#define REAP_STEP 4
#define FIRST_LOAD 32          /* messages a CONTEXT read loads first */
/* A CONTEXT last_n read loads at most this many first: the response
 * size may decide with far fewer than last_n. */
#define LAST_N_FIRST_LOAD 4096
#define PUT_ATTEMPTS 16        /* summary_put retries against appends */
#define BACKOFF_MAX_US (INT64_C(60) * 1000000)
#define SWEEP_PAGE 500
#define PIPE_CACHE 256
#define RETAIN_ATTEMPTS 4      /* retention reads racing writes, per job */
#define RETAIN_AGAIN_US 20000  /* then the job runs again this much later */

struct pipe_entry {
	struct pipe_entry *next;
	histd_pipeline *p;
	size_t len;
	uint8_t bytes[];
};

/* A system message of a session, kept by the index. */
struct sys_msg {
	uint64_t seq;
	uint32_t tokens;
	uint32_t len;
	uint8_t *data;
};

/* A session's summary as the CONTEXT view shows it, made once per stored
 * summary and shared by the reads (found under the session's sum_lock;
 * its references atomic, so a read gives its own back without a lock). */
struct sum_view {
	_Atomic int refs;
	uint8_t *rec;              /* the stored Summary's bytes */
	size_t rec_len;
	Histd__V1__Summary *sum;   /* unpacked (default allocator) */
	uint8_t *msg;              /* the summary message, packed */
	size_t msg_len;
	uint32_t tokens;           /* its estimate */
	/* The Summary the response names: the stored one without its text
	 * (the summary message carries it), packed. */
	uint8_t *meta;
	size_t meta_len;
};

/* What the context knows of one session. An entry lives while it is
 * used: a caller holds a reference (sess_find, sess_get; sess_put), or a
 * compaction is queued or runs; idle past SESS_IDLE_US, it is freed
 * (sess_get), so sessions that come and go leave nothing behind. */
struct sess {
	struct sess *next;          /* bucket chain: x->table_lock */
	char *tenant;
	char *id;
	histd_driver *d;
	atomic_int refs;            /* callers holding it */
	_Atomic int64_t used_us;    /* last taken */
	/* Under x->lock. */
	int busy;                  /* a compaction runs */
	int queued;                /* in x's queue: a check is due at due_us */
	struct sess *qnext;
	int64_t due_us;
	int retries;               /* failed attempts in a row */
	int64_t not_before;        /* backoff: no attempt before this */
	int64_t last_append_us;
	/* Its pipeline has no reducer and no retention (nothing to do after
	 * an append) as of this time; appends skip the worker until
	 * NO_REDUCER_TTL_US later, or until the session's config may have
	 * changed here. */
	int64_t no_reducer_us;
	/* Bumped whenever the session's config may have changed here: a
	 * check that read the config before does not set no_reducer_us. */
	uint64_t cfg_gen;
	/* The system index, under idx_lock. */
	pthread_mutex_t idx_lock;
	int64_t idx_created_us;
	uint64_t idx_cleared;
	uint64_t idx_scanned;      /* every seq <= this was scanned */
	struct sys_msg *sys;
	size_t n_sys, cap_sys;
	/* The newest summary seen, or NULL, under sum_lock: reads find it
	 * side by side (read lock); a new one replaces it (write lock). */
	pthread_rwlock_t sum_lock;
	struct sum_view *sumv;
	/* The last full CONTEXT read's snapshot, under sum_lock: at
	 * known_revision of the session created at known_created_us, its
	 * record's numbers (known_core: no strings, no config), its pipeline
	 * (one of x's, which live as long as x) and its summary's view (a
	 * reference; NULL for none). A read passes the pair to the driver,
	 * which leaves those out while the session is still there. The pair
	 * is also read without the lock; a read checks it again under the
	 * lock before it uses the snapshot. */
	_Atomic uint64_t known_revision;
	_Atomic int64_t known_created_us;
	histd_session known_core;
	histd_pipeline *known_pipe;
	struct sum_view *known_sv;
	/* How many messages a CONTEXT read loads first: its pipeline's
	 * newest_needed as of the last read (0: FIRST_LOAD). */
	_Atomic uint32_t load_hint;
	/* With no transform and no last_n: how many the last such read
	 * loaded when it decided (0: none), where the next one starts. */
	_Atomic uint32_t fit_hint;
	/* Tokens of the messages a summary covers (worker only). */
	uint64_t cov_to, cov_cleared, cov_tokens;
	int cov_known;
};

struct histd_context {
	histd_driver *d;
	histd_context_config cfg;
	histd_pipeline *def;
	histd_plugin_error_fn sink;
	void *sink_arg;

	pthread_mutex_t lock;
	pthread_cond_t work;       /* workers: something became due */
	pthread_cond_t idle;       /* a compaction finished */
	/* Entries, by key hash. Chains change under table_lock (written
	 * with lock held too, so that whether an entry is queued or busy
	 * cannot change while it is freed); lookups read-lock it. */
	pthread_rwlock_t table_lock;
	struct sess *table[BUCKETS];
	size_t n_entries, reap_next;     /* table_lock */
	/* Sessions with an automatic check queued, oldest first. */
	struct sess *qhead, *qtail;
	int stop;                  /* set holding lock and sweep_lock */
	/* The same, read by a sweep between sessions: stopping does not wait
	 * for a sweep's whole backlog of expired sessions. */
	atomic_int sweep_stop;
	int running;               /* compactions running now */
	pthread_t *threads;
	int n_threads;

	/* Pipelines built from session configs, by the config's bytes:
	 * read-only once built, shared by every read (plugin states are
	 * never written by hooks). At most PIPE_CACHE; past that, reads
	 * build their own. */
	pthread_mutex_t pipe_lock;
	_Atomic(struct pipe_entry *) pipes;   /* read without the lock */
	size_t n_pipes;

	/* What this context put in no_truncate_driver (NULL: nothing). */
	const char *no_truncate;

	pthread_t sweeper;
	int have_sweeper;
	pthread_mutex_t sweep_lock;
	pthread_cond_t sweep_cond;
};

/* The context of a service built without one: Reduce must still be one
 * per session at a time. No threads. */
static histd_context *fallback;
static pthread_once_t fallback_once = PTHREAD_ONCE_INIT;

/* The name of the driver the server's context serves when that driver
 * cannot delete old messages (NULL: it can, or no context exists):
 * histd_context_validate refuses retention = delete then. Process-wide
 * because validation runs without a context (context.h). */
static _Atomic(const char *) no_truncate_driver;

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

/* ---------------------------------------------------------------------- */
/* Sessions                                                                */

static uint64_t
key_hash(const char *tenant, const char *id)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = tenant; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	h = (h ^ 0xff) * 1099511628211ull;
	for (const char *p = id; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	return h;
}

/* The entry of (tenant, id), created if absent; x->lock held. NULL if out
 * of memory. */
/* How long "no reducer" is trusted: a config changed on another replica
 * is noticed within this time. */
#define NO_REDUCER_TTL_US (10 * 1000000LL)

/* The entry of (tenant, id) in chain s, or NULL; table_lock held. */
static struct sess *
chain_find(struct sess *s, const char *tenant, const char *id)
{
	while (s && (strcmp(s->tenant, tenant) || strcmp(s->id, id)))
		s = s->next;
	return s;
}

/* Takes a reference on s (table_lock held). */
static struct sess *
sess_take(struct sess *s)
{
	atomic_fetch_add(&s->refs, 1);
	atomic_store_explicit(&s->used_us, histd_mono_us(),
			      memory_order_relaxed);
	return s;
}

/* The entry of (tenant, id) with a reference (sess_put), or NULL. */
static struct sess *
sess_find(histd_context *x, const char *tenant, const char *id)
{
	struct sess *s;

	pthread_rwlock_rdlock(&x->table_lock);
	s = chain_find(x->table[key_hash(tenant, id) % BUCKETS], tenant, id);
	if (s)
		sess_take(s);
	pthread_rwlock_unlock(&x->table_lock);
	return s;
}

static void
sess_put(struct sess *s)
{
	if (s)
		atomic_fetch_sub(&s->refs, 1);
}

static void sess_free(struct sess *s);

/* Frees the entries of chain *pp nobody uses (no reference, nothing
 * queued or running) idle since before `before`; x->lock and table_lock
 * (written) held. */
static void
chain_reap(histd_context *x, struct sess **pp, int64_t before)
{
	while (*pp) {
		struct sess *s = *pp;

		if (atomic_load(&s->refs) == 0 && !s->busy && !s->queued &&
		    atomic_load_explicit(&s->used_us,
					 memory_order_relaxed) < before) {
			*pp = s->next;
			sess_free(s);
			x->n_entries--;
			continue;
		}
		pp = &s->next;
	}
}

size_t
histd_context_entries(histd_context *x)
{
	size_t n;

	if (!x)
		return 0;
	pthread_rwlock_rdlock(&x->table_lock);
	n = x->n_entries;
	pthread_rwlock_unlock(&x->table_lock);
	return n;
}

/* The entry of (tenant, id) with a reference (sess_put), made if absent;
 * x->lock held. NULL if out of memory. */
static struct sess *
sess_get(histd_context *x, histd_driver *d, const char *tenant,
	 const char *id)
{
	struct sess **b = &x->table[key_hash(tenant, id) % BUCKETS];
	int64_t idle, before;
	struct sess *s;

	if ((s = sess_find(x, tenant, id)))
		return s;
	pthread_rwlock_wrlock(&x->table_lock);
	if ((s = chain_find(*b, tenant, id))) {
		sess_take(s);
		pthread_rwlock_unlock(&x->table_lock);
		return s;
	}
	/* Only a new entry reaps: a found one (every append) costs no
	 * more than the lookup. */
	idle = x->cfg.entry_idle_us > 0 ? x->cfg.entry_idle_us : SESS_IDLE_US;
	if (x->cfg.session_ttl_us > idle)
		idle = x->cfg.session_ttl_us;
	before = histd_mono_us() - idle;
	chain_reap(x, b, before);
	for (int i = 0; i < REAP_STEP; i++) {
		chain_reap(x, &x->table[x->reap_next], before);
		x->reap_next = (x->reap_next + 1) % BUCKETS;
	}
	if (!(s = calloc(1, sizeof(*s))) || !(s->tenant = strdup(tenant)) ||
	    !(s->id = strdup(id))) {
		if (s)
			free(s->tenant);
		free(s);
		pthread_rwlock_unlock(&x->table_lock);
		return NULL;
	}
	pthread_mutex_init(&s->idx_lock, NULL);
	pthread_rwlock_init(&s->sum_lock, NULL);
	s->d = d;
	sess_take(s);
	s->next = *b;
	*b = s;
	x->n_entries++;
	pthread_rwlock_unlock(&x->table_lock);
	return s;
}

static void
sys_clear(struct sess *s)
{
	for (size_t i = 0; i < s->n_sys; i++)
		free(s->sys[i].data);
	s->n_sys = 0;
}

static void
sum_view_unref(struct sum_view *sv)
{
	if (!sv || atomic_fetch_sub(&sv->refs, 1) > 1)
		return;
	if (sv->sum)
		histd__v1__summary__free_unpacked(sv->sum, NULL);
	free(sv->rec);
	free(sv->msg);
	free(sv->meta);
	free(sv);
}

static void
sess_free(struct sess *s)
{
	sum_view_unref(s->sumv);
	sum_view_unref(s->known_sv);
	sys_clear(s);
	free(s->sys);
	pthread_mutex_destroy(&s->idx_lock);
	pthread_rwlock_destroy(&s->sum_lock);
	free(s->tenant);
	free(s->id);
	free(s);
}

/* ---------------------------------------------------------------------- */
/* Small helpers                                                           */

/*
 * The session's pipeline: its config's, or the default. *out is borrowed
 * (the default, or a cached one) when *owned is 0; else the caller frees
 * it.
 */
static int
session_pipeline(histd_context *x, const histd_session *s,
		 histd_pipeline **out, int *owned)
{
	Histd__V1__SessionConfig *c;
	struct pipe_entry *e;
	int rc;

	*owned = 0;
	*out = NULL;
	if (!s->config_len) {
		*out = x->def;
		return 0;
	}
	/* Entries are immutable once published, freed with the context. */
	for (e = x->pipes; e; e = e->next)
		if (e->len == s->config_len &&
		    !memcmp(e->bytes, s->config, e->len))
			break;
	if (e) {
		*out = e->p;
		return 0;
	}
	if ((rc = histd_unpack_stored(&histd__v1__session_config__descriptor,
				      NULL, s->config, s->config_len, &c,
				      "the stored config of the session")))
		return rc;
	if (!c->pipeline) {
		histd__v1__session_config__free_unpacked(c, NULL);
		*out = x->def;
		return 0;
	}
	rc = histd_pipeline_build(c, "config", x->def, out);
	histd__v1__session_config__free_unpacked(c, NULL);
	if (rc)
		return rc;
	*owned = 1;
	pthread_mutex_lock(&x->pipe_lock);
	if (x->n_pipes < PIPE_CACHE &&
	    (e = malloc(sizeof(*e) + s->config_len))) {
		e->p = *out;
		e->len = s->config_len;
		memcpy(e->bytes, s->config, s->config_len);
		e->next = x->pipes;
		x->pipes = e;
		x->n_pipes++;
		*owned = 0;
	}
	pthread_mutex_unlock(&x->pipe_lock);
	return 0;
}

/* The stored summary rec, unpacked into *out: 0, ENOMEM or ECORRUPT. */
static int
summary_unpack(const histd_record *rec, Histd__V1__Summary **out)
{
	return histd_unpack_stored(&histd__v1__summary__descriptor, NULL,
				   rec->data, rec->len, out,
				   "the stored summary");
}

static void
ts_set(Google__Protobuf__Timestamp *ts, int64_t us)
{
	int64_t sec = us / 1000000, rem = us % 1000000;

	if (rem < 0) {
		rem += 1000000;
		sec--;
	}
	ts->seconds = sec;
	ts->nanos = (int32_t)(rem * 1000);
}

/* ---------------------------------------------------------------------- */
/* The system index                                                        */

/* Brings s's index up to `upto` (inclusive) for the session record sr.
 * s->idx_lock held. Each scan reads the session's record too: one of
 * another life (deleted and created again under the id) or cleared since
 * sr answers ECONFLICT, leaving the index empty, rather than mix what
 * sr's read loaded with system messages it never held. */
static int
index_update(struct sess *s, histd_driver *d, const char *tenant,
	     const histd_session *sr, uint64_t upto)
{
	histd_read q = { .tenant = tenant, .session_id = s->id,
			 .want_session = 1 };
	histd_read_result res = { 0 };
	int rc = 0;

	/* Rebuilt after a clear, replace or truncate, or when its oldest
	 * entry is no longer stored. It scans from seq 0: a truncate
	 * (retention) keeps the system messages at or below cleared_to_seq,
	 * and a read after 0 starts at the oldest stored message anyway. */
	if (s->idx_created_us != sr->created_at_us ||
	    s->idx_cleared != sr->cleared_to_seq ||
	    s->idx_scanned > sr->last_seq ||
	    (s->n_sys && (!sr->first_seq || sr->first_seq > s->sys[0].seq))) {
		sys_clear(s);
		s->idx_created_us = sr->created_at_us;
		s->idx_cleared = sr->cleared_to_seq;
		s->idx_scanned = 0;
	}
	while (s->idx_scanned < upto && !rc) {
		uint64_t want = upto - s->idx_scanned;

		q.after_seq = s->idx_scanned;
		q.limit = want > 4096 ? 4096 : (uint32_t)want;
		if ((rc = histd_driver_read(d, &q, &res)))
			break;
		if (res.session &&
		    (res.session->incarnation != sr->incarnation ||
		     res.session->cleared_to_seq != sr->cleared_to_seq)) {
			histd_read_result_clear(&res);
			sys_clear(s);
			s->idx_created_us = 0;
			s->idx_scanned = 0;
			rc = histd_error_set(HISTD_ECONFLICT, "session %s changed "
					     "while it was read; read again",
					     s->id);
			break;
		}
		for (size_t i = 0; i < res.records.n && !rc; i++) {
			const histd_record *r = &res.records.v[i];
			uint32_t flags;
			int role;

			if (r->seq > upto) {
				/* Nothing stored in between (a truncate
				 * leaves gaps): scanned. */
				s->idx_scanned = upto;
				break;
			}
			if (histd_message_scan(r->data, r->len, &role, &flags)) {
				rc = histd_error_set(HISTD_ECORRUPT,
					"the stored message at seq %" PRIu64
					" does not decode", r->seq);
				break;
			}
			if (role == HISTD__V1__ROLE__ROLE_SYSTEM) {
				struct sys_msg *m;

				if (s->n_sys == s->cap_sys) {
					size_t cap = s->cap_sys ? s->cap_sys * 2 : 4;

					m = realloc(s->sys, cap * sizeof(*m));
					if (!m) {
						rc = enomem();
						break;
					}
					s->sys = m;
					s->cap_sys = cap;
				}
				m = &s->sys[s->n_sys];
				if (!(m->data = malloc(r->len ? r->len : 1))) {
					rc = enomem();
					break;
				}
				memcpy(m->data, r->data, r->len);
				m->len = r->len;
				m->seq = r->seq;
				m->tokens = r->token_estimate;
				s->n_sys++;
			}
			s->idx_scanned = r->seq;
		}
		if (!rc && (res.records.n == 0 || !res.has_more))
			s->idx_scanned = upto;   /* nothing more stored */
		histd_read_result_clear(&res);
	}
	return rc;
}

/* ---------------------------------------------------------------------- */
/* The CONTEXT view                                                        */

/* The packed size of each of v's items (a changed one's message is
 * measured), in v's arena; NULL if out of memory. */
static size_t *
item_sizes(histd_view *v)
{
	size_t *plen = histd_view_alloc(v, (v->n ? v->n : 1) * sizeof(*plen));

	for (size_t i = 0; plen && i < v->n; i++) {
		histd_view_item *it = &v->items[i];

		plen[i] = (it->flags & HISTD_ITEM_CHANGED) ?
			  histd__v1__message__get_packed_size(it->msg) :
			  it->len;
	}
	return plen;
}

/* Packs the view into a GetMessagesResponse. sv: the summary applied, or
 * NULL; plen: item_sizes(v). */
static int
view_pack(histd_view *v, const struct sum_view *sv, uint64_t revision,
	  const size_t *plen, uint8_t **out, size_t *len)
{
	size_t size = 0, o = 0;
	uint64_t tokens = 0;
	uint8_t *buf;

	for (size_t i = 0; i < v->n; i++) {
		size += 1 + histd_wire_varint_size(plen[i]) + plen[i];
		tokens += v->items[i].tokens;
	}
	if (sv)
		size += 1 + histd_wire_varint_size(sv->meta_len) + sv->meta_len;
	size += 2 * (1 + HISTD_WIRE_VARINT_MAX);
	if (!(buf = malloc(size)))
		return enomem();
	for (size_t i = 0; i < v->n; i++) {
		histd_view_item *it = &v->items[i];

		o += histd_wire_put_len_key(buf + o, 1, plen[i]);
		if (it->flags & HISTD_ITEM_CHANGED)
			o += histd__v1__message__pack(it->msg, buf + o);
		else {
			memcpy(buf + o, it->data, it->len);
			o += it->len;
		}
	}
	if (revision) {
		buf[o++] = 3 << 3;
		o += histd_wire_put_varint(buf + o, revision);
	}
	if (sv) {
		o += histd_wire_put_len_key(buf + o, 4, sv->meta_len);
		memcpy(buf + o, sv->meta, sv->meta_len);
		o += sv->meta_len;
	}
	if (tokens) {
		buf[o++] = 5 << 3;
		o += histd_wire_put_varint(buf + o, tokens);
	}
	*out = buf;
	*len = o;
	return 0;
}

/* The summary message of the view: role user, one text block. */
static Histd__V1__Message *
summary_message(histd_view *v, const Histd__V1__Summary *sum)
{
	static const Histd__V1__Message mi = HISTD__V1__MESSAGE__INIT;
	static const Histd__V1__ContentBlock bi = HISTD__V1__CONTENT_BLOCK__INIT;
	static const Histd__V1__TextBlock ti = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__Message *m = histd_view_alloc(v, sizeof(*m));
	Histd__V1__ContentBlock *b = histd_view_alloc(v, sizeof(*b));
	Histd__V1__ContentBlock **arr = histd_view_alloc(v, sizeof(*arr));
	Histd__V1__TextBlock *t = histd_view_alloc(v, sizeof(*t));
	size_t n = strlen(HISTD_SUMMARY_PREFIX) + strlen(sum->text) + 2;
	char *text = histd_view_alloc(v, n);

	if (!m || !b || !arr || !t || !text)
		return NULL;
	snprintf(text, n, "%s%s]", HISTD_SUMMARY_PREFIX, sum->text);
	*t = ti;
	t->text = text;
	*b = bi;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = t;
	arr[0] = b;
	*m = mi;
	m->role = HISTD__V1__ROLE__ROLE_USER;
	m->content = arr;
	m->n_content = 1;
	m->author = "histd";
	if (sum->created_at) {
		Google__Protobuf__Timestamp *ts = histd_view_alloc(v, sizeof(*ts));

		if (!ts)
			return NULL;
		google__protobuf__timestamp__init(ts);
		*ts = *sum->created_at;
		m->created_at = ts;
	}
	return m;
}

/* The window plugin's largest max_messages. */
#define WINDOW_MAX_MESSAGES 10000000u

/* A pipeline of one window for a request's last_n. RAW takes any last_n,
 * so CONTEXT does too: above the window's limit it counts as the limit
 * (10,000,000 messages). */
static int
last_n_window(uint32_t n, histd_pipeline **out)
{
	char spec[64];

	if (n > WINDOW_MAX_MESSAGES)
		n = WINDOW_MAX_MESSAGES;
	snprintf(spec, sizeof(spec), "window:max_messages=%" PRIu32, n);
	return histd_pipeline_parse(spec, "last_n", out);
}

/* 1 if some plugin of p has a transform. */
static int
has_transform(const histd_pipeline *p)
{
	for (size_t i = 0; i < histd_pipeline_len(p); i++)
		if (histd_pipeline_plugin(p, i, NULL)->transform)
			return 1;
	return 0;
}

/*
 * Whether v, the fixed-up view of the newest messages loaded with no
 * transform run, gives the last_n window what the whole session's view
 * would. The fix-up treats a loaded message alike in both unless it
 * holds a result whose call v lacks (older than the load, or covered:
 * unanswered is the newest such seq, 0 for none), and the window of
 * last_n looks only at the newest last_n messages and the one before
 * them. So more than last_n messages newer than that one decide it.
 */
static int
tail_decides(const histd_view *v, uint64_t unanswered, uint32_t last_n)
{
	size_t newer = 0, n = last_n < WINDOW_MAX_MESSAGES ? last_n :
			       WINDOW_MAX_MESSAGES;

	for (size_t i = v->n; i-- > 0 && newer <= n;) {
		const histd_view_item *it = &v->items[i];

		if (it->flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY))
			break;
		if (it->seq <= unanswered)
			break;
		newer++;
	}
	return newer > n;
}

/* A message's size in a response: field key, length, bytes. */
static size_t
framed_size(size_t len)
{
	return len + 1 + histd_wire_varint_size(len);
}

/* Drops the oldest non-system, non-summary items until the packed view
 * fits max bytes (estimated from item sizes), then fixes up again. v is
 * fixed up already: its pinned items lead, and the dropped ones are the
 * run after them, removed at once. */
static int
fit_bytes(histd_view *v, size_t max, size_t **plen)
{
	size_t total = 0, from = 0, k = 0;
	int rc;

	for (size_t j = 0; j < v->n; j++)
		total += framed_size((*plen)[j]);
	if (total + 64 <= max)
		return 0;
	while (from < v->n &&
	       (v->items[from].flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY)))
		from++;
	/* At least the newest message stays. */
	while (total + 64 > max && v->n - (from + k) > 1) {
		total -= framed_size((*plen)[from + k]);
		k++;
	}
	histd_view_remove_range(v, from, k);
	if ((rc = histd_view_fixup(v)))
		return rc;
	/* The fix-up may change or drop items: measured again. */
	return (*plen = item_sizes(v)) ? 0 : enomem();
}

/*
 * Whether v, the fixed-up view of the newest messages loaded with no
 * transform run (unanswered as for tail_decides; plen: item_sizes), gives
 * fit_bytes what the whole session's view would. fit_bytes keeps the
 * leading system and summary items and the newest others that fit after
 * them. When the newest messages that both views hold alike pass max
 * bytes on their own, the one where they pass it and all older ones are
 * dropped in either view, and what stays is the same.
 */
static int
bytes_decide(const histd_view *v, const size_t *plen, uint64_t unanswered,
	     size_t max)
{
	size_t total = 0, from = 0;

	while (from < v->n &&
	       (v->items[from].flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY)))
		total += framed_size(plen[from++]);
	for (size_t i = v->n; i-- > from;) {
		const histd_view_item *it = &v->items[i];

		if ((it->flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY)) ||
		    it->seq <= unanswered)
			return 0;
		total += framed_size(plen[i]);
		if (total + 64 > max)
			return 1;
	}
	return 0;
}

/* How many of the newest messages look enough for max bytes, going by
 * the res loaded (0: no guess). */
static uint32_t
bytes_guess(const histd_read_result *res, size_t max)
{
	uint64_t bytes = 0, want;

	for (size_t i = 0; i < res->records.n; i++)
		bytes += framed_size(res->records.v[i].len);
	if (!bytes)
		return 0;
	want = (uint64_t)res->records.n * max / bytes;
	want += want / 4 + 1;
	return want < UINT32_MAX ? (uint32_t)want : UINT32_MAX;
}

/*
 * The view of the stored summary rec: the session's cached one when rec
 * is the same bytes, else made now (built in v's arena, then packed) and
 * cached in its place. *out holds a reference (sum_view_unref).
 */
static int
summary_view(struct sess *s, histd_view *v, const histd_record *rec,
	     struct sum_view **out)
{
	struct sum_view *sv, *old;
	Histd__V1__Message *m;
	int rc;

	pthread_rwlock_rdlock(&s->sum_lock);
	sv = s->sumv;
	if (sv && sv->rec_len == rec->len &&
	    !memcmp(sv->rec, rec->data, rec->len)) {
		atomic_fetch_add(&sv->refs, 1);
		pthread_rwlock_unlock(&s->sum_lock);
		*out = sv;
		return 0;
	}
	pthread_rwlock_unlock(&s->sum_lock);

	if (!(sv = calloc(1, sizeof(*sv))))
		return enomem();
	sv->refs = 1;
	if ((rc = summary_unpack(rec, &sv->sum))) {
		sum_view_unref(sv);
		return rc;
	}
	if (!(m = summary_message(v, sv->sum)) ||
	    !(sv->rec = malloc(rec->len ? rec->len : 1))) {
		sum_view_unref(sv);
		return enomem();
	}
	memcpy(sv->rec, rec->data, rec->len);
	sv->rec_len = rec->len;
	sv->tokens = histd_tokens_message(m);
	m->token_estimate = sv->tokens;
	sv->msg_len = histd__v1__message__get_packed_size(m);
	if (!(sv->msg = malloc(sv->msg_len ? sv->msg_len : 1))) {
		sum_view_unref(sv);
		return enomem();
	}
	histd__v1__message__pack(m, sv->msg);
	{
		Histd__V1__Summary meta = *sv->sum;

		meta.text = "";
		sv->meta_len = histd__v1__summary__get_packed_size(&meta);
		if (!(sv->meta = malloc(sv->meta_len ? sv->meta_len : 1))) {
			sum_view_unref(sv);
			return enomem();
		}
		histd__v1__summary__pack(&meta, sv->meta);
	}

	atomic_fetch_add(&sv->refs, 1);
	pthread_rwlock_wrlock(&s->sum_lock);
	old = s->sumv;
	s->sumv = sv;
	pthread_rwlock_unlock(&s->sum_lock);
	sum_view_unref(old);
	*out = sv;
	return 0;
}

/*
 * Fills v as a read of the newest `load` messages (res, of session record
 * sr) shows them: the system messages older than what was loaded (from the
 * index, also those at or below cleared_to_seq that retention kept), the
 * summary message (sv, NULL for none), then the loaded messages not
 * covered by the summary or a clear (system messages always stay).
 * *n_older: how many system messages came from the index.
 */
static int
view_fill(struct sess *s, histd_driver *d, const char *tenant,
	  const histd_session *sr, const histd_read_result *res,
	  const struct sum_view *sv, uint32_t load, histd_view *v,
	  size_t *n_older)
{
	uint64_t first_loaded = res->records.n ? res->records.v[0].seq :
						 res->last_seq + 1;
	uint64_t lower = res->cleared_to_seq;
	int rc = 0;

	if (sv && sv->sum->covers_to_seq > lower)
		lower = sv->sum->covers_to_seq;
	*n_older = 0;
	v->now_us = histd_now_us();
	v->summary = sv ? sv->sum : NULL;
	if (first_loaded > res->cleared_to_seq + 1 ||
	    (sr->first_seq && sr->first_seq < first_loaded)) {
		pthread_mutex_lock(&s->idx_lock);
		rc = index_update(s, d, tenant, sr, first_loaded - 1);
		for (size_t i = 0; i < s->n_sys && !rc; i++) {
			struct sys_msg *m = &s->sys[i];
			uint8_t *copy;

			if (m->seq >= first_loaded)
				break;
			if (!(copy = histd_view_alloc(v, m->len ? m->len : 1))) {
				rc = enomem();
				break;
			}
			memcpy(copy, m->data, m->len);
			rc = histd_view_push_record(v, m->seq, m->tokens, copy,
						    m->len);
			(*n_older)++;
		}
		pthread_mutex_unlock(&s->idx_lock);
		if (rc)
			return rc;
	}
	if (sv) {
		/* The packed summary message stands as its stored bytes: a
		 * user message of one text block (summary_message). */
		if ((rc = histd_view_push_known(v, 0, sv->tokens, sv->msg,
				sv->msg_len, HISTD__V1__ROLE__ROLE_USER,
				HISTD_ITEM_SUMMARY)))
			return rc;
	}
	for (size_t i = 0; i < res->records.n; i++) {
		const histd_record *rec = &res->records.v[i];
		size_t before = v->n;

		if ((rc = histd_view_push_record(v, rec->seq,
				rec->token_estimate, rec->data, rec->len)))
			return rc;
		/* Covered by the summary: only system messages stay. */
		if (rec->seq <= lower &&
		    !(v->items[before].flags & HISTD_ITEM_SYSTEM))
			v->n--;
	}
	v->complete = res->records.n < load || first_loaded <= lower + 1;
	/* A system message among the loaded ones goes first, as one older
	 * from the index does: transforms count on it (the window keeps
	 * and counts system messages apart), and the view must not depend
	 * on how much was loaded. */
	return histd_view_partition(v);
}

/* Keeps what a full read of s at `revision` (session record sr) found,
 * for the next reads at that revision: p only if it is one of x's. */
static void
known_note(struct sess *s, uint64_t revision, const histd_session *sr,
	   histd_pipeline *p, struct sum_view *sv)
{
	histd_session core = *sr;
	struct sum_view *old;

	core.tenant = core.id = NULL;
	core.context_keys = core.labels = NULL;
	core.n_context_keys = core.n_labels = 0;
	core.config = NULL;
	core.config_len = 0;
	if (sv)
		atomic_fetch_add(&sv->refs, 1);
	pthread_rwlock_wrlock(&s->sum_lock);
	old = s->known_sv;
	s->known_sv = sv;
	s->known_core = core;
	s->known_pipe = p;
	atomic_store(&s->known_revision, revision);
	atomic_store(&s->known_created_us, sr->created_at_us);
	pthread_rwlock_unlock(&s->sum_lock);
	sum_view_unref(old);
}

/* The snapshot of s if it is still the one at (revision, created_us):
 * *core, *p and *sv (a reference) set, 1; else 0. */
static int
known_take(struct sess *s, uint64_t revision, int64_t created_us,
	   histd_session *core, histd_pipeline **p, struct sum_view **sv)
{
	int ok;

	pthread_rwlock_rdlock(&s->sum_lock);
	ok = atomic_load(&s->known_revision) == revision &&
	     atomic_load(&s->known_created_us) == created_us;
	if (ok) {
		*core = s->known_core;
		*p = s->known_pipe;
		if ((*sv = s->known_sv))
			atomic_fetch_add(&(*sv)->refs, 1);
	}
	pthread_rwlock_unlock(&s->sum_lock);
	return ok;
}

/* One attempt at the view with the newest `load` messages. *sp: the
 * session's entry if known, else NULL; set here once the read succeeded.
 * HISTD_PLUGIN_MORE: load more, *want of them if that is not 0. */
static int
context_once(histd_context *x, histd_driver *d, const char *tenant,
	     const Histd__V1__GetMessagesRequest *r, size_t max_bytes,
	     uint32_t load, struct sess **sp, uint8_t **out, size_t *len,
	     uint32_t *want)
{
	histd_read q = { .tenant = tenant, .session_id = r->session_id,
			 .last_n = load, .want_session = 1,
			 .want_summary = 1 };
	histd_read_result res = { 0 };
	histd_session core;
	const histd_session *sr;
	const Histd__V1__Summary *sum = NULL;
	struct sum_view *sv = NULL;
	histd_pipeline *p = NULL, *extra = NULL;
	histd_view *v = NULL;
	struct sess *s = *sp;
	size_t n_older, *plen;
	uint64_t unanswered = 0;
	int rc, owned = 0, plain, partial, decided;

	/* What the last full read of this revision found is not read
	 * again (known_revision). */
	if (s) {
		q.known_revision = atomic_load(&s->known_revision);
		q.known_created_us = atomic_load(&s->known_created_us);
	}
	if ((rc = histd_driver_read(d, &q, &res)))
		return rc;
	if (res.known && !known_take(s, q.known_revision, q.known_created_us,
				     &core, &p, &sv)) {
		/* Another read replaced the snapshot meanwhile. */
		histd_read_result_clear(&res);
		q.known_revision = 0;
		if ((rc = histd_driver_read(d, &q, &res)))
			return rc;
	}
	sr = res.known ? &core : res.session;
	if (!res.known &&
	    (rc = session_pipeline(x, res.session, &p, &owned)))
		goto out;
	if (!(v = histd_view_new())) {
		rc = enomem();
		goto out;
	}
	if (!s) {
		pthread_mutex_lock(&x->lock);
		s = sess_get(x, d, tenant, r->session_id);
		pthread_mutex_unlock(&x->lock);
		if (!s) {
			rc = enomem();
			goto out;
		}
		*sp = s;
	}
	/* Written only when it changes: every read of the session shares
	 * this cache line. */
	{
		uint32_t hint = histd_pipeline_newest_needed(p);

		if (atomic_load_explicit(&s->load_hint, memory_order_relaxed) !=
		    hint)
			atomic_store_explicit(&s->load_hint, hint,
					      memory_order_relaxed);
	}
	if (!res.known) {
		if (res.summary &&
		    (rc = summary_view(s, v, res.summary, &sv)))
			goto out;
		if (!owned)
			known_note(s, res.revision, res.session, p, sv);
	}
	sum = sv ? sv->sum : NULL;
	/* A summary from before a clear or replace covers nothing left. */
	if (sum && sum->covers_to_seq <= res.cleared_to_seq) {
		sum_view_unref(sv);
		sv = NULL;
		sum = NULL;
	}
	if ((rc = view_fill(s, d, tenant, sr, &res, sum ? sv : NULL,
			     load, v, &n_older)))
		goto out;
	/* Without transforms the view is every message, fixed up; last_n
	 * then keeps its tail, and max_bytes the newest that fit. The newest
	 * messages loaded may decide both (tail_decides, bytes_decide): then
	 * they are not read past. */
	plain = !has_transform(p);
	partial = plain && !v->complete;
	if (partial) {
		if ((rc = histd_view_last_unanswered(v, &unanswered)))
			goto out;
		v->bounded = 1;     /* last_n or max_bytes chooses below */
	}

	rc = histd_pipeline_transform(p, v);
	if (rc == HISTD_PLUGIN_MORE) {
		/* The caller loads more; *out stays unset. */
		goto out;
	}
	if (rc)
		goto out;
	decided = !partial ||
		  (r->last_n && tail_decides(v, unanswered, r->last_n));
	if (r->last_n) {
		if ((rc = last_n_window(r->last_n, &extra)))
			goto out;
		v->complete = 1;
		if ((rc = histd_pipeline_transform(extra, v)))
			goto out;
	}
	if (!(plen = item_sizes(v))) {
		rc = enomem();
		goto out;
	}
	if (!decided && !bytes_decide(v, plen, unanswered, max_bytes)) {
		*want = bytes_guess(&res, max_bytes);
		rc = HISTD_PLUGIN_MORE;
		goto out;
	}
	if ((rc = fit_bytes(v, max_bytes, &plen)))
		goto out;
	rc = view_pack(v, sum ? sv : NULL, res.revision, plen, out, len);
	/* Where the next such read starts (written only when it changes). */
	if (!rc && !r->last_n &&
	    atomic_load_explicit(&s->fit_hint, memory_order_relaxed) !=
	    (plain ? load : 0))
		atomic_store_explicit(&s->fit_hint, plain ? load : 0,
				      memory_order_relaxed);
out:
	histd_view_free(v);
	if (owned)
		histd_pipeline_free(p);
	histd_pipeline_free(extra);
	if (sv)
		sum_view_unref(sv);
	histd_read_result_clear(&res);
	return rc;
}

static void
make_fallback(void)
{
	histd_context *x = calloc(1, sizeof(*x));

	if (!x)
		return;
	pthread_mutex_init(&x->lock, NULL);
	pthread_rwlock_init(&x->table_lock, NULL);
	pthread_cond_init(&x->work, NULL);
	pthread_cond_init(&x->idle, NULL);
	pthread_mutex_init(&x->sweep_lock, NULL);
	pthread_cond_init(&x->sweep_cond, NULL);
	pthread_mutex_init(&x->pipe_lock, NULL);
	fallback = x;
}

static histd_context *
ctx_or_fallback(histd_context *x)
{
	if (x)
		return x;
	pthread_once(&fallback_once, make_fallback);
	return fallback;
}

/*
 * The next pass's load after one of `load` said more: 8 times as many
 * (the last pass everything), or fewer if that looks enough: want, what
 * the response size seems to need, or last_n + 1, what last_n needs when
 * nothing older is waited for.
 */
static uint32_t
next_load(uint32_t load, uint32_t want, uint32_t last_n)
{
	uint32_t next = load > UINT32_MAX / 8 ? UINT32_MAX : load * 8;

	if (want > load && want < next)
		next = want;
	if (last_n && last_n < UINT32_MAX && last_n + 1 > load &&
	    last_n + 1 < next)
		next = last_n + 1;
	return next;
}

int
histd_context_get_messages(histd_context *x, histd_driver *d,
			   const char *tenant,
			   const Histd__V1__GetMessagesRequest *r,
			   size_t max_response_bytes, uint8_t **out,
			   size_t *len)
{
	uint32_t load = FIRST_LOAD, hint;
	struct sess *s;
	int rc;

	if (!(x = ctx_or_fallback(x)))
		return enomem();
	/* The pipeline's hint as of the last read: a stale one (the config
	 * changed since) costs at most a second pass. Entries are made by
	 * reads that succeed, never for a session that does not exist. */
	s = sess_find(x, tenant, r->session_id);
	if (s && atomic_load_explicit(&s->load_hint, memory_order_relaxed))
		load = atomic_load_explicit(&s->load_hint,
					    memory_order_relaxed);
	if (s && !r->last_n &&
	    (hint = atomic_load_explicit(&s->fit_hint,
					 memory_order_relaxed)) > load)
		load = hint;
	/* One more than last_n says where its window may start; the
	 * response size may say it with fewer. */
	if (r->last_n >= load) {
		uint32_t n = r->last_n < LAST_N_FIRST_LOAD ? r->last_n + 1 :
							     LAST_N_FIRST_LOAD;

		if (n > load)
			load = n;
	}
	*out = NULL;
	for (int conflicts = 0;;) {
		uint32_t want = 0;

		rc = context_once(x, d, tenant, r, max_response_bytes, load,
				  &s, out, len, &want);
		/* The session changed between the view's reads: again, from
		 * the start (a few times; then the caller hears of it). */
		if (rc == HISTD_ECONFLICT && ++conflicts < 4)
			continue;
		if (rc != HISTD_PLUGIN_MORE)
			break;
		load = next_load(load, want, r->last_n);
	}
	sess_put(s);
	return rc;
}

/* The first window of p with retention = delete, or -1. */
static int
retention_window(const histd_pipeline *p)
{
	for (size_t i = 0; i < histd_pipeline_len(p); i++) {
		void *state = NULL;
		const histd_plugin *pl = histd_pipeline_plugin(p, i, &state);

		if (pl == &histd_plugin_window &&
		    histd_window_retention_delete(state))
			return (int)i;
	}
	return -1;
}

/* `code` naming the plugin when p (the pipeline of config `field`, or the
 * default pipeline with field NULL) asks for retention = delete and the
 * driver `name` cannot delete old messages; else 0. */
static int
check_retention(const histd_pipeline *p, const char *field,
		const char *name, int code)
{
	int wi = retention_window(p);

	if (wi < 0 || !name)
		return 0;
	if (!field)
		return histd_error_set(code,
			"default-pipeline: plugin %d (window) has retention="
			"delete, which needs a storage driver that can delete "
			"old messages; the %s driver cannot", wi + 1, name);
	return histd_error_set(code,
		"%s.pipeline.plugins[%d].options.retention: delete needs a "
		"storage driver that can delete old messages; the %s driver "
		"cannot", field, wi, name);
}

int
histd_context_validate(const Histd__V1__SessionConfig *c, const char *field)
{
	const char *name = atomic_load(&no_truncate_driver);
	histd_pipeline *p = NULL;
	int rc;

	if ((rc = histd_pipeline_validate(c, field)) || !name || !c ||
	    !c->pipeline)
		return rc;
	if ((rc = histd_pipeline_build(c, field, NULL, &p)))
		return rc;
	rc = check_retention(p, field, name, HISTD_EPRECONDITION);
	histd_pipeline_free(p);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Compaction                                                              */

struct bounds {
	uint64_t max_tokens;
	uint32_t max_entries;
	uint64_t older_than_s;
};

/* The tokens of the system messages the view keeps, and their count. */
static int
system_totals(histd_context *x, histd_driver *d, const char *tenant,
	      const char *id, const histd_session *sr, uint64_t *tokens,
	      uint32_t *count)
{
	struct sess *s;
	int rc;

	pthread_mutex_lock(&x->lock);
	s = sess_get(x, d, tenant, id);
	pthread_mutex_unlock(&x->lock);
	if (!s)
		return enomem();
	pthread_mutex_lock(&s->idx_lock);
	rc = index_update(s, d, tenant, sr, sr->last_seq);
	*tokens = 0;
	*count = 0;
	for (size_t i = 0; !rc && i < s->n_sys; i++) {
		*tokens += s->sys[i].tokens;
		(*count)++;
	}
	pthread_mutex_unlock(&s->idx_lock);
	sess_put(s);
	return rc;
}

/*
 * Whether covering m[0..cut) of the messages after the previous summary is
 * a safe cut (plugin.h, histd_reduce): the kept messages hold the calls of
 * their results, no assistant turn is cut, and no covered call waits for
 * its result (which, appended later, would lose its call in the CONTEXT
 * view). The built-in compaction cuts so; the host checks every reducer,
 * since a summary is for good.
 */
static int
check_cut(Histd__V1__Message *const *m, size_t n, size_t cut,
	  const char *plugin)
{
	unsigned char *safe = malloc(n + 1);
	size_t open = n;
	int rc;

	if (!safe)
		return enomem();
	rc = histd_safe_starts_msgs(m, n, safe, 1);
	if (!rc)
		rc = histd_first_open_call(m, n, &open);
	if (!rc && (!safe[cut] || cut > open))
		rc = histd_error_set(HISTD_EINTERNAL, "the %s plugin's summary "
				     "would split a tool call from its result "
				     "or an assistant turn", plugin);
	free(safe);
	return rc;
}

static int
blank(const char *s)
{
	for (; *s; s++)
		if (*s != ' ' && *s != '\n' && *s != '\t' && *s != '\r')
			return 0;
	return 1;
}

/*
 * The summary text a reducer made, as it is stored: an empty one (or only
 * white space) is refused, EUNAVAILABLE like a provider answer without
 * text (a later attempt may do better); one above the reducer's
 * max_summary_tokens is cut to fit on a UTF-8 boundary, with one log line.
 */
static int
check_summary(histd_reduce *red, const char *id, const char *plugin)
{
	size_t len = red->text ? strlen(red->text) : 0;
	uint32_t tokens = histd_tokens_text(red->text, len);
	char before[16], after[16], max[16];

	if (red->max_summary_tokens && tokens > red->max_summary_tokens) {
		len = histd_tokens_text_fit(red->text, len,
					    red->max_summary_tokens);
		red->text[len] = '\0';
		snprintf(before, sizeof(before), "%" PRIu32, tokens);
		snprintf(after, sizeof(after), "%" PRIu32,
			 histd_tokens_text(red->text, len));
		snprintf(max, sizeof(max), "%" PRIu32, red->max_summary_tokens);
		histd_log(HISTD_LOG_WARN, "summary cut to max_summary_tokens",
			  "session", id, "plugin", plugin, "tokens", before,
			  "kept_tokens", after, "max_summary_tokens", max, NULL);
	}
	if (!red->text || blank(red->text))
		return histd_error_set(HISTD_EUNAVAILABLE, "the summarizer "
				       "returned an empty summary");
	return 0;
}

/*
 * Compacts one session now. *summary_out (may be NULL) gets the stored
 * Summary (caller frees with histd__v1__summary__free_unpacked), NULL when
 * nothing needed compaction; *revision the session's revision after.
 * *plugin_name names the plugin for error reports, *life the session
 * life it read (0: none).
 */
static int
compact(histd_context *x, histd_driver *d, const char *tenant,
	const char *id, const struct bounds *bd,
	Histd__V1__Summary **summary_out, uint64_t *revision,
	const char **plugin_name, uint64_t *life)
{
	histd_session *sr = NULL, *now = NULL;
	histd_record *prevrec = NULL, *rec = NULL;
	Histd__V1__Summary *prev = NULL, out = HISTD__V1__SUMMARY__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	histd_pipeline *p = NULL, *fallback_p = NULL;
	histd_read q = { .tenant = tenant, .session_id = id };
	histd_read_result res = { 0 };
	Histd__V1__Message **msgs = NULL;
	size_t n_msgs = 0, n_all = 0;
	histd_reduce red = { 0 };
	const histd_plugin *pl;
	void *state;
	uint64_t lower, cur = 0;
	uint8_t *packed = NULL;
	size_t plen;
	int idx, rc, owned = 0;

	*plugin_name = "compaction";
	*life = 0;
	if (summary_out)
		*summary_out = NULL;
	if ((rc = histd_driver_session_get(d, tenant, id, &sr)))
		return rc;
	*revision = sr->revision;
	*life = sr->incarnation;
	if ((rc = session_pipeline(x, sr, &p, &owned)))
		goto out;
	idx = histd_pipeline_reducer(p);
	if (idx < 0) {
		if ((rc = histd_pipeline_parse("compaction", "compaction",
					       &fallback_p)))
			goto out;
		pl = histd_pipeline_plugin(fallback_p, 0, &state);
	} else {
		pl = histd_pipeline_plugin(p, (size_t)idx, &state);
	}
	*plugin_name = pl->name;
	if ((rc = histd_driver_summary_get(d, tenant, id, &prevrec)))
		goto out;
	if (prevrec && (rc = summary_unpack(prevrec, &prev)))
		goto out;
	if (prev && prev->covers_to_seq <= sr->cleared_to_seq) {
		histd__v1__summary__free_unpacked(prev, NULL);
		prev = NULL;
	}
	lower = sr->cleared_to_seq;
	if (prev && prev->covers_to_seq > lower)
		lower = prev->covers_to_seq;
	if ((rc = system_totals(x, d, tenant, id, sr, &red.system_tokens,
				&red.system_count)))
		goto out;

	/* Every message after the previous summary, at one instant. */
	q.after_seq = lower;
	q.limit = 0;
	if ((rc = histd_driver_read(d, &q, &res)))
		goto out;
	if (res.records.n &&
	    !(msgs = calloc(res.records.n, sizeof(*msgs)))) {
		rc = enomem();
		goto out;
	}
	for (size_t i = 0; i < res.records.n; i++) {
		const histd_record *r = &res.records.v[i];
		Histd__V1__Message *m;

		if ((rc = histd_unpack_stored(&histd__v1__message__descriptor,
					      NULL, r->data, r->len, &m,
					      "the stored message at seq %"
					      PRIu64, r->seq)))
			goto out;
		/* msgs[0..n_all) owns every message; system ones are moved
		 * past the others so that the reducer sees none. */
		msgs[n_all++] = m;
	}
	/* Non-system messages first, in seq order (the reducer sees only
	 * those: system messages stay verbatim), then the system ones. */
	{
		Histd__V1__Message **tmp = calloc(n_all ? n_all : 1,
						  sizeof(*tmp));
		size_t k = 0;

		if (!tmp) {
			rc = enomem();
			goto out;
		}
		if (n_all)      /* msgs is NULL then: memcpy wants a pointer */
			memcpy(tmp, msgs, n_all * sizeof(*tmp));
		for (int pass = 0; pass < 2; pass++)
			for (size_t i = 0; i < n_all; i++)
				if ((tmp[i]->role ==
				     HISTD__V1__ROLE__ROLE_SYSTEM) == pass)
					msgs[k++] = tmp[i];
		for (size_t i = 0; i < n_all; i++)
			if (tmp[i]->role != HISTD__V1__ROLE__ROLE_SYSTEM)
				n_msgs++;
		free(tmp);
	}

	red.messages = msgs;
	red.n_messages = n_msgs;
	red.previous = prev;
	red.max_tokens = bd->max_tokens;
	red.max_entries = bd->max_entries;
	red.older_than_s = bd->older_than_s;
	red.now_us = histd_now_us();
	if ((rc = pl->reduce(state, &red)))
		goto out;
	if (red.n_covered == 0 || red.n_covered > n_msgs)
		goto out;
	if ((rc = check_cut(msgs, n_msgs, red.n_covered, pl->name)) ||
	    (rc = check_summary(&red, id, pl->name)))
		goto out;

	out.covers_from_seq = prev && prev->covers_from_seq ?
			      prev->covers_from_seq : msgs[0]->seq;
	out.covers_to_seq = msgs[red.n_covered - 1]->seq;
	out.text = red.text ? red.text : "";
	out.model = red.model ? red.model : "";
	ts_set(&ts, red.now_us);
	out.created_at = &ts;
	out.input_tokens = red.input_tokens;
	out.output_tokens = red.output_tokens;
	out.token_estimate = HISTD_TOKENS_MESSAGE_OVERHEAD +
		histd_tokens_text(HISTD_SUMMARY_PREFIX,
				  strlen(HISTD_SUMMARY_PREFIX)) +
		histd_tokens_text(out.text, strlen(out.text)) + 1;
	plen = histd__v1__summary__get_packed_size(&out);
	if (!(packed = malloc(plen ? plen : 1))) {
		rc = enomem();
		goto out;
	}
	histd__v1__summary__pack(&out, packed);
	if (!(rec = histd_record_new(out.covers_to_seq, out.token_estimate,
				     packed, plen))) {
		rc = enomem();
		goto out;
	}
	/* Put at the current revision. Appends meanwhile only add seqs
	 * after the covered range: retry. A clear or replace meanwhile
	 * removed what the summary covers, and so did a delete: a session
	 * created again under the id (another life) is another
	 * conversation. Drop it. The put is of the life read first: one
	 * created again between the check and the put, even at the same
	 * revision, answers ENOTFOUND, and the check runs again. */
	for (int attempt = 0;; attempt++) {
		histd_session_free(now);
		now = NULL;
		if ((rc = histd_driver_session_get(d, tenant, id, &now)))
			goto out;
		if (now->cleared_to_seq != sr->cleared_to_seq ||
		    now->incarnation != sr->incarnation) {
			*revision = now->revision;
			goto out;    /* nothing stored; no summary */
		}
		rc = histd_driver_summary_put_life(d, tenant, id,
						   now->revision,
						   sr->incarnation, rec,
						   revision, &cur);
		if ((rc != HISTD_ECONFLICT && rc != HISTD_ENOTFOUND) ||
		    attempt + 1 >= PUT_ATTEMPTS)
			break;
	}
	if (rc)
		goto out;
	histd_metrics_counter_add("histd_compactions_total",
				  "Compactions by result.", "result=\"ok\"", 1);
	if (summary_out) {
		*summary_out = histd__v1__summary__unpack(NULL, plen, packed);
		if (!*summary_out)
			rc = enomem();
	}
	pthread_mutex_lock(&x->lock);
	{
		struct sess *s = sess_get(x, d, tenant, id);

		if (s)
			s->cov_known = 0;
		sess_put(s);
	}
	pthread_mutex_unlock(&x->lock);
out:
	free(red.text);
	free(red.model);
	free(packed);
	histd_record_free(rec);
	for (size_t i = 0; i < n_all; i++)
		if (msgs[i])
			histd__v1__message__free_unpacked(msgs[i], NULL);
	free(msgs);
	histd_read_result_clear(&res);
	if (prev)
		histd__v1__summary__free_unpacked(prev, NULL);
	histd_record_free(prevrec);
	if (owned)
		histd_pipeline_free(p);
	histd_pipeline_free(fallback_p);
	histd_session_free(sr);
	histd_session_free(now);
	return rc;
}

/* Reports a failed compaction or retention (what) of the session's life
 * `life` (0: unknown) to the sink: one line, no content. */
static void
report_what(histd_context *x, histd_driver *d, const char *tenant,
	    const char *id, uint64_t life, const char *what,
	    const char *plugin, int rc, int will_retry)
{
	histd_session *sr = NULL;
	histd_plugin_error_fn fn;
	void *arg;
	char msg[320], line[64];

	snprintf(msg, sizeof(msg), "%s failed (%s): %s", what,
		 histd_error_name(rc), histd_error_message());
	snprintf(line, sizeof(line), "%s failed", what);
	if (!strcmp(what, "compaction"))
		histd_metrics_counter_add("histd_compactions_total",
					  "Compactions by result.",
					  "result=\"failed\"", 1);
	histd_log(HISTD_LOG_WARN, line, "session", id,
		  "plugin", plugin, "error", msg, NULL);
	pthread_mutex_lock(&x->lock);
	fn = x->sink;
	arg = x->sink_arg;
	pthread_mutex_unlock(&x->lock);
	if (!fn)
		return;
	/* The event carries the session's current revision. The session
	 * deleted and created again meanwhile is another conversation: its
	 * subscribers are not told of the old one's failure. */
	if (histd_driver_session_get(d, tenant, id, &sr))
		return;
	if (!life || life == sr->incarnation)
		fn(arg, tenant, id, sr->revision, sr->incarnation, plugin, msg,
		   will_retry);
	histd_session_free(sr);
}

/* Marks the session busy, waiting for a running compaction. */
static struct sess *
acquire(histd_context *x, histd_driver *d, const char *tenant,
	const char *id)
{
	struct sess *s;

	pthread_mutex_lock(&x->lock);
	s = sess_get(x, d, tenant, id);
	if (s) {
		while (s->busy)
			pthread_cond_wait(&x->idle, &x->lock);
		s->busy = 1;
		x->running++;
	}
	pthread_mutex_unlock(&x->lock);
	return s;
}

static void
release_sess(histd_context *x, struct sess *s)
{
	pthread_mutex_lock(&x->lock);
	s->busy = 0;
	x->running--;
	pthread_cond_broadcast(&x->idle);
	pthread_cond_broadcast(&x->work);
	sess_put(s);
	pthread_mutex_unlock(&x->lock);
}

int
histd_context_reduce(histd_context *x, histd_driver *d, const char *tenant,
		     const Histd__V1__ReduceRequest *r, uint8_t **out,
		     size_t *len)
{
	Histd__V1__ReduceResponse resp = HISTD__V1__REDUCE_RESPONSE__INIT;
	struct bounds bd = { r->max_tokens, r->max_entries,
			     r->older_than_seconds };
	Histd__V1__Summary *sum = NULL;
	const char *plugin = "compaction";
	uint64_t revision = 0, life = 0;
	struct sess *s;
	int rc;

	if (!(x = ctx_or_fallback(x)))
		return enomem();
	if (!(s = acquire(x, d, tenant, r->session_id)))
		return enomem();
	rc = compact(x, d, tenant, r->session_id, &bd, &sum, &revision,
		     &plugin, &life);
	release_sess(x, s);
	if (rc) {
		if (rc != HISTD_ENOTFOUND && rc != HISTD_EINVALID)
			report_what(x, d, tenant, r->session_id, life,
				    "compaction", plugin, rc, 0);
		return rc;
	}
	resp.summary = sum;
	resp.revision = revision;
	*len = histd__v1__reduce_response__get_packed_size(&resp);
	*out = malloc(*len ? *len : 1);
	if (!*out)
		rc = enomem();
	else
		histd__v1__reduce_response__pack(&resp, *out);
	if (sum)
		histd__v1__summary__free_unpacked(sum, NULL);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Automatic compaction                                                    */

static void
enqueue(histd_context *x, struct sess *s, int64_t due_us)
{
	s->queued = 1;
	s->due_us = due_us;
	s->qnext = NULL;
	if (x->qtail)
		x->qtail->qnext = s;
	else
		x->qhead = s;
	x->qtail = s;
}

void
histd_context_after_append(histd_context *x, histd_driver *d,
			   const char *tenant, const char *session_id)
{
	struct sess *s;

	if (!x || !x->n_threads)
		return;
	pthread_mutex_lock(&x->lock);
	s = sess_get(x, d, tenant, session_id);
	if (s) {
		s->last_append_us = histd_now_us();
		/* Most sessions never compact: no wake-up, no session read. */
		if (!s->no_reducer_us ||
		    s->last_append_us - s->no_reducer_us >= NO_REDUCER_TTL_US) {
			s->no_reducer_us = 0;
			if (!s->queued) {
				enqueue(x, s, s->not_before);
				pthread_cond_signal(&x->work);
			}
		}
		/* Queued, it stays (chain_reap); x->lock is held. */
		sess_put(s);
	}
	pthread_mutex_unlock(&x->lock);
}

void
histd_context_config_changed(histd_context *x, const char *tenant,
			     const char *session_id)
{
	struct sess *s;

	if (!x)
		return;
	pthread_mutex_lock(&x->lock);
	pthread_rwlock_rdlock(&x->table_lock);
	s = chain_find(x->table[key_hash(tenant, session_id) % BUCKETS],
		       tenant, session_id);
	if (s) {
		s->no_reducer_us = 0;
		s->cfg_gen++;
	}
	pthread_rwlock_unlock(&x->table_lock);
	pthread_mutex_unlock(&x->lock);
}

/* The tokens of the messages up to `to` (a summary's covers_to_seq),
 * cached per session. Worker only. */
static int
covered_tokens(histd_context *x, struct sess *s, histd_driver *d,
	       const char *tenant, const histd_session *sr, uint64_t to,
	       uint64_t *out)
{
	histd_read q = { .tenant = tenant, .session_id = s->id };
	histd_read_result res = { 0 };
	uint64_t sum = 0;
	int rc = 0;

	(void)x;
	if (s->cov_known && s->cov_to == to && s->cov_cleared == sr->cleared_to_seq) {
		*out = s->cov_tokens;
		return 0;
	}
	/* From the oldest stored message: system messages retention kept at
	 * or below cleared_to_seq are covered too. */
	q.after_seq = 0;
	while (q.after_seq < to) {
		q.limit = 4096;
		if ((rc = histd_driver_read(d, &q, &res)))
			return rc;
		for (size_t i = 0; i < res.records.n; i++) {
			if (res.records.v[i].seq > to)
				break;
			sum += res.records.v[i].token_estimate;
		}
		if (res.records.n == 0) {
			histd_read_result_clear(&res);
			break;
		}
		q.after_seq = res.records.v[res.records.n - 1].seq;
		histd_read_result_clear(&res);
	}
	s->cov_known = 1;
	s->cov_to = to;
	s->cov_cleared = sr->cleared_to_seq;
	s->cov_tokens = sum;
	*out = sum;
	return 0;
}

/* Whether the session's pipeline asks for a compaction now (*want), and
 * whether it has a window with retention = delete (*retain). */
static int
wants_reduce(histd_context *x, struct sess *s, int *want, int *retain)
{
	histd_session *sr = NULL;
	histd_pipeline *p = NULL;
	histd_record *sumrec = NULL;
	Histd__V1__Summary *sum = NULL;
	histd_session_totals t = { 0 };
	histd_read q = { .tenant = s->tenant, .session_id = s->id };
	histd_read_result res = { 0 };
	uint64_t to = 0, cov = 0, gen;
	int rc, owned = 0;

	*want = 0;
	*retain = 0;
	pthread_mutex_lock(&x->lock);
	gen = s->cfg_gen;
	pthread_mutex_unlock(&x->lock);
	if ((rc = histd_driver_session_get(s->d, s->tenant, s->id, &sr)))
		return rc;
	if ((rc = session_pipeline(x, sr, &p, &owned)))
		goto out;
	*retain = retention_window(p) >= 0;
	if (histd_pipeline_reducer(p) < 0) {
		/* No compaction, no auto_reduce_when, no retention: remember
		 * it. */
		if (!*retain) {
			pthread_mutex_lock(&x->lock);
			if (s->cfg_gen == gen)
				s->no_reducer_us = histd_now_us();
			pthread_mutex_unlock(&x->lock);
		}
		goto out;
	}
	if ((rc = histd_driver_summary_get(s->d, s->tenant, s->id, &sumrec)))
		goto out;
	if (sumrec && (rc = summary_unpack(sumrec, &sum)))
		goto out;
	if (sum)
		to = sum->covers_to_seq;
	if (to < sr->cleared_to_seq)
		to = sr->cleared_to_seq;
	if ((rc = covered_tokens(x, s, s->d, s->tenant, sr, to, &cov)))
		goto out;
	t.message_count = sr->message_count;
	t.token_total = sr->token_total;
	t.last_seq = sr->last_seq;
	t.first_seq = sr->first_seq;
	t.messages_after_summary = sr->last_seq > to ? sr->last_seq - to : 0;
	if (t.messages_after_summary > sr->message_count)
		t.messages_after_summary = sr->message_count;
	t.tokens_after_summary = sr->token_total > cov ?
				 sr->token_total - cov : 0;
	t.now_us = histd_now_us();
	q.after_seq = to;
	q.limit = 1;
	if ((rc = histd_driver_read(s->d, &q, &res)))
		goto out;
	if (res.records.n) {
		Histd__V1__Message *m = histd__v1__message__unpack(NULL,
			res.records.v[0].len, res.records.v[0].data);

		if (m && m->created_at)
			t.oldest_after_summary_us =
				m->created_at->seconds * 1000000 +
				m->created_at->nanos / 1000;
		if (m)
			histd__v1__message__free_unpacked(m, NULL);
	}
	*want = histd_pipeline_after_append(p, &t);
out:
	histd_read_result_clear(&res);
	if (sum)
		histd__v1__summary__free_unpacked(sum, NULL);
	histd_record_free(sumrec);
	if (owned)
		histd_pipeline_free(p);
	histd_session_free(sr);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Retention                                                               */

/* 1 in *open if rec (a stored message) holds a tool call whose result is
 * not stored (yet). */
static int
has_open_call(struct sess *s, const histd_record *rec, int *open)
{
	Histd__V1__Message *m;
	uint32_t flags;
	int role, rc = 0;

	*open = 0;
	if (histd_message_scan(rec->data, rec->len, &role, &flags))
		goto corrupt;
	if (!(flags & HISTD_ITEM_CALLS) || role == HISTD__V1__ROLE__ROLE_SYSTEM)
		return 0;
	if ((rc = histd_unpack_stored(&histd__v1__message__descriptor, NULL,
				      rec->data, rec->len, &m,
				      "the stored message at seq %" PRIu64,
				      rec->seq)))
		return rc;
	for (size_t j = 0; j < m->n_content && !rc && !*open; j++) {
		histd_record *r = NULL;

		if (m->content[j]->block_case !=
		    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL)
			continue;
		rc = histd_driver_tool_result(s->d, s->tenant, s->id,
					      m->content[j]->tool_call->id, &r);
		if (rc == HISTD_ENOTFOUND) {
			*open = 1;
			rc = 0;
		}
		histd_record_free(r);
	}
	histd__v1__message__free_unpacked(m, NULL);
	return rc;
corrupt:
	return histd_error_set(HISTD_ECORRUPT, "the stored message at seq %"
			       PRIu64 " does not decode", rec->seq);
}

/*
 * Lowers *cut below the first message in (after, *cut] that holds a tool
 * call whose result is not stored yet: deleted, the call would be
 * forgotten, and its result refused when it comes. Reads at revision rev
 * (ECONFLICT when a write came in between; a result stored since then
 * changed the revision too, so the truncate at rev fails and retention
 * looks again).
 */
static int
keep_open_calls(struct sess *s, uint64_t after, uint64_t rev, uint64_t *cut)
{
	histd_read q = { .tenant = s->tenant, .session_id = s->id,
			 .after_seq = after, .limit = 256 };
	histd_read_result res = { 0 };
	int rc = 0, open = 0;

	while (!rc && !open && q.after_seq < *cut) {
		if ((rc = histd_driver_read(s->d, &q, &res)))
			break;
		if (res.revision != rev)
			rc = histd_error_set(HISTD_ECONFLICT, "the session "
					     "changed during retention");
		for (size_t i = 0; !rc && !open && i < res.records.n; i++) {
			const histd_record *r = &res.records.v[i];

			if (r->seq > *cut)
				break;
			if (!(rc = has_open_call(s, r, &open)) && open)
				*cut = r->seq - 1;
		}
		if (res.records.n == 0 || !res.has_more)
			break;
		q.after_seq = res.records.v[res.records.n - 1].seq;
		histd_read_result_clear(&res);
	}
	histd_read_result_clear(&res);
	return rc;
}

/*
 * What retention deletes now, for the session record sr that p (whose
 * window wi has retention = delete) was built from: *up_to is the seq to
 * truncate to, 0 when nothing would go.
 *
 * The window's start is the seq of the first non-system message it keeps
 * in a view built from the RAW tail as the CONTEXT view builds its own
 * (the system messages, the summary message, the newest `load` messages
 * after the summary), with the transforms of p up to the window run on it
 * in order, as they run for the CONTEXT view: so the start is that view's.
 * up_to is start - 1, at most the summary's covers_to_seq - 1 so that the
 * summary stays, and below the first message holding a tool call whose
 * result is not stored yet (keep_open_calls); 0 when the window keeps no
 * message (the newest stays, whatever its size) or when only system
 * messages are stored at or below.
 * Everything is read at one instant, sr's revision: ECONFLICT when a write
 * came in between. HISTD_PLUGIN_MORE: load more.
 */
static int
window_cut(struct sess *s, const histd_session *sr, const histd_pipeline *p,
	   size_t wi, uint32_t load, uint64_t *up_to)
{
	histd_read q = { .tenant = s->tenant, .session_id = s->id,
			 .last_n = load, .want_summary = 1 };
	histd_read_result res = { 0 };
	const Histd__V1__Summary *sum = NULL;
	struct sum_view *sv = NULL;
	histd_view *v = NULL;
	uint64_t first_loaded, start = 0, cut;
	size_t older_sys = 0;
	int rc;

	*up_to = 0;
	if ((rc = histd_driver_read(s->d, &q, &res)))
		goto out;
	if (res.revision != sr->revision) {
		rc = histd_error_set(HISTD_ECONFLICT,
				     "the session changed during retention");
		goto out;
	}
	if (!(v = histd_view_new())) {
		rc = enomem();
		goto out;
	}
	if (res.summary) {
		if ((rc = summary_view(s, v, res.summary, &sv)))
			goto out;
		/* One from before a clear or replace covers nothing left. */
		if (sv->sum->covers_to_seq > res.cleared_to_seq)
			sum = sv->sum;
	}
	if ((rc = view_fill(s, s->d, s->tenant, sr, &res, sum ? sv : NULL,
			     load, v, &older_sys)))
		goto out;
	first_loaded = res.records.n ? res.records.v[0].seq : res.last_seq + 1;

	/* The transforms before the window change what it measures (masked
	 * results cost fewer tokens); those after it do not move its start,
	 * and neither does the fix-up. */
	for (size_t i = 0; i <= wi; i++) {
		void *state = NULL;
		const histd_plugin *pl = histd_pipeline_plugin(p, i, &state);

		if (!pl->transform)
			continue;
		rc = pl->transform(state, v);
		if (rc == HISTD_PLUGIN_MORE && v->complete)
			rc = 0;     /* nothing older exists */
		if (rc)
			goto out;
	}
	for (size_t i = 0; i < v->n; i++)
		if (!(v->items[i].flags &
		      (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY))) {
			start = v->items[i].seq;
			break;
		}
	if (!start)
		goto out;
	cut = start - 1;
	if (sum && cut >= sum->covers_to_seq)
		cut = sum->covers_to_seq - 1;
	if ((rc = keep_open_calls(s, sr->cleared_to_seq, sr->revision, &cut)))
		goto out;
	if (cut <= sr->cleared_to_seq)
		goto out;
	/* Only when a non-system message is stored at or below the cut: one
	 * loaded, or one older than what was loaded (the stored messages
	 * older than the load are more than the system ones among them). */
	for (size_t i = 0; i < res.records.n; i++) {
		const histd_record *rec = &res.records.v[i];
		uint32_t flags;
		int role;

		if (rec->seq > cut)
			break;
		if (histd_message_scan(rec->data, rec->len, &role, &flags) ||
		    role != HISTD__V1__ROLE__ROLE_SYSTEM) {
			*up_to = cut;
			goto out;
		}
	}
	if (first_loaded > 1 && cut >= first_loaded - 1 &&
	    sr->message_count > res.records.n + older_sys)
		*up_to = cut;
	else if (cut && cut < first_loaded - 1 && cut > sr->cleared_to_seq &&
		 sr->first_seq && sr->first_seq <= cut)
		*up_to = cut;   /* not all read: the driver decides */
out:
	histd_view_free(v);
	if (sv)
		sum_view_unref(sv);
	histd_read_result_clear(&res);
	return rc;
}

/*
 * Retention after appends (context.h): deletes with truncate the
 * non-system messages older than where the session's retention window
 * starts, never the newest summary's covers_to_seq or above, and only when
 * that deletes something. It truncates at the revision and life it read,
 * so an append, clear or summary in between, or a delete (even if the id
 * was created again and written up to that revision), makes it read
 * again (up to RETAIN_ATTEMPTS times, then *again = 1: the worker runs it
 * later), never delete what it did not see. *life: the session life it
 * last read (0: none). Worker only, with s busy.
 */
static int
retain(histd_context *x, struct sess *s, int *again, uint64_t *life)
{
	histd_session *sr = NULL;
	histd_pipeline *p = NULL;
	uint64_t up_to = 0, rev = 0, cur = 0;
	uint32_t load = FIRST_LOAD;
	int rc = 0, owned = 0, wi;

	*again = 0;
	for (int attempt = 0; attempt < RETAIN_ATTEMPTS; attempt++) {
		if (owned)
			histd_pipeline_free(p);
		p = NULL;
		owned = 0;
		histd_session_free(sr);
		sr = NULL;
		if ((rc = histd_driver_session_get(s->d, s->tenant, s->id, &sr)))
			goto out;
		*life = sr->incarnation;
		if ((rc = session_pipeline(x, sr, &p, &owned)))
			goto out;
		if ((wi = retention_window(p)) < 0)
			goto out;       /* the config changed meanwhile */
		while ((rc = window_cut(s, sr, p, (size_t)wi, load,
					&up_to)) == HISTD_PLUGIN_MORE)
			load = load > UINT32_MAX / 8 ? UINT32_MAX : load * 8;
		if (rc == HISTD_ECONFLICT)
			continue;
		if (rc || !up_to)
			goto out;
		/* At the revision and life read: ENOTFOUND when the session
		 * was deleted and maybe created again since (another life
		 * starts again at revision 1): read again. */
		rc = histd_driver_truncate_life(s->d, s->tenant, s->id, up_to,
						sr->revision, sr->incarnation,
						&rev, &cur);
		if (rc != HISTD_ECONFLICT && rc != HISTD_ENOTFOUND)
			goto out;
	}
	/* Still racing writes: later, rather than now. */
	rc = 0;
	*again = 1;
out:
	if (owned)
		histd_pipeline_free(p);
	histd_session_free(sr);
	return rc;
}

static int
retryable(int rc)
{
	return rc == HISTD_EUNAVAILABLE || rc == HISTD_ELIMIT ||
	       rc == HISTD_ECONFLICT || rc == HISTD_ENOMEM ||
	       rc == HISTD_EINTERNAL;
}

/* Takes the first due session that is not busy off the queue; x->lock
 * held. *wait_us: how long until the next one is due (-1: none). */
static struct sess *
next_due(histd_context *x, int64_t now, int64_t *wait_us)
{
	struct sess *prev = NULL;

	*wait_us = -1;
	for (struct sess *s = x->qhead; s; prev = s, s = s->qnext) {
		if (s->busy)
			continue;
		if (s->due_us <= now) {
			if (prev)
				prev->qnext = s->qnext;
			else
				x->qhead = s->qnext;
			if (x->qtail == s)
				x->qtail = prev;
			s->qnext = NULL;
			s->queued = 0;
			return s;
		}
		if (*wait_us < 0 || s->due_us - now < *wait_us)
			*wait_us = s->due_us - now;
	}
	if (x->qhead && *wait_us < 0)
		*wait_us = 100000;   /* only busy ones: look again soon */
	return NULL;
}

static void *
worker_main(void *arg)
{
	histd_context *x = arg;

	pthread_mutex_lock(&x->lock);
	while (!x->stop) {
		int64_t wait_us, now = histd_now_us();
		struct sess *s = next_due(x, now, &wait_us);
		const char *plugin = "compaction", *what = "compaction";
		struct bounds bd = { 0 };
		uint64_t rev = 0, life = 0;
		int want = 0, keep = 0, soon = 0, rc, retries;

		if (!s) {
			if (wait_us < 0) {
				pthread_cond_wait(&x->work, &x->lock);
			} else {
				struct timespec ts;
				int64_t until;

				clock_gettime(CLOCK_REALTIME, &ts);
				until = (int64_t)ts.tv_sec * 1000000 +
					ts.tv_nsec / 1000 + wait_us;
				ts.tv_sec = until / 1000000;
				ts.tv_nsec = (long)(until % 1000000) * 1000;
				pthread_cond_timedwait(&x->work, &x->lock, &ts);
			}
			continue;
		}
		s->busy = 1;
		x->running++;
		retries = s->retries;
		pthread_mutex_unlock(&x->lock);

		rc = wants_reduce(x, s, &want, &keep);
		if (!rc && want)
			rc = compact(x, s->d, s->tenant, s->id, &bd, NULL, &rev,
				     &plugin, &life);
		/* Retention after compaction, so that what is due for a
		 * summary gets one first; a failed compaction keeps the
		 * messages until a later job succeeds. */
		if (!rc && keep) {
			plugin = "window";
			what = "retention";
			rc = retain(x, s, &soon, &life);
		}

		pthread_mutex_lock(&x->lock);
		s->busy = 0;
		x->running--;
		if (soon && !s->queued)
			enqueue(x, s, histd_now_us() + RETAIN_AGAIN_US);
		if (rc == HISTD_ENOTFOUND) {
			s->retries = 0;     /* the session is gone */
			s->not_before = 0;
		} else if (rc) {
			int again = retryable(rc) &&
				    retries < x->cfg.max_retries && !x->stop;
			int64_t back = x->cfg.retry_base_us;
			char tenant[256], id[256];
			/* s may be freed once x->lock is let go (not busy,
			 * maybe not queued): what the report needs is copied. */
			histd_driver *sd = s->d;

			snprintf(tenant, sizeof(tenant), "%s", s->tenant);
			snprintf(id, sizeof(id), "%s", s->id);
			for (int i = 0; i < retries && back < BACKOFF_MAX_US; i++)
				back *= 2;
			if (back > BACKOFF_MAX_US || !again)
				back = BACKOFF_MAX_US;
			/* Even without a retry, the next append waits out
			 * the backoff before trying again. */
			s->retries = retries + 1;
			s->not_before = histd_now_us() + back;
			if (s->queued) {
				if (s->due_us < s->not_before)
					s->due_us = s->not_before;
			} else if (again) {
				enqueue(x, s, s->not_before);
			}
			pthread_mutex_unlock(&x->lock);
			report_what(x, sd, tenant, id, life, what, plugin,
				    rc, again);
			pthread_mutex_lock(&x->lock);
		} else {
			s->retries = 0;
			s->not_before = 0;
		}
		pthread_cond_broadcast(&x->idle);
	}
	pthread_mutex_unlock(&x->lock);
	return NULL;
}

int
histd_context_wait_idle(histd_context *x, int timeout_ms)
{
	int64_t end = histd_mono_us() + (int64_t)timeout_ms * 1000;

	if (!x)
		return 0;
	for (;;) {
		int busy = 0;

		pthread_mutex_lock(&x->lock);
		busy = x->running > 0 || x->qhead != NULL;
		pthread_mutex_unlock(&x->lock);
		if (!busy)
			return 0;
		if (histd_mono_us() > end)
			return -1;
		{
			struct timespec ts = { 0, 5 * 1000 * 1000 };

			nanosleep(&ts, NULL);
		}
	}
}

/* ---------------------------------------------------------------------- */
/* TTL                                                                     */

/* The newest activity of a session: the time storage keeps of its last
 * change (active_at), or, where that is unknown (0: stored before the
 * driver kept it), updated_at and its newest message's created_at, read
 * back; and an append this process saw. */
static int64_t
last_activity(histd_context *x, const histd_session *sr)
{
	histd_read q = { .tenant = sr->tenant, .session_id = sr->id,
			 .last_n = 1 };
	histd_read_result res = { 0 };
	int64_t t = sr->updated_at_us;
	struct sess *s;

	if (sr->created_at_us > t)
		t = sr->created_at_us;
	if (sr->active_at_us > 0) {
		if (sr->active_at_us > t)
			t = sr->active_at_us;
	} else if (!histd_driver_read(x->d, &q, &res) && res.records.n) {
		Histd__V1__Message *m = histd__v1__message__unpack(NULL,
			res.records.v[0].len, res.records.v[0].data);

		if (m && m->created_at) {
			int64_t c = m->created_at->seconds * 1000000 +
				    m->created_at->nanos / 1000;

			if (c > t)
				t = c;
		}
		if (m)
			histd__v1__message__free_unpacked(m, NULL);
	}
	histd_read_result_clear(&res);
	pthread_mutex_lock(&x->lock);
	pthread_rwlock_rdlock(&x->table_lock);
	s = chain_find(x->table[key_hash(sr->tenant, sr->id) % BUCKETS],
		       sr->tenant, sr->id);
	if (s) {
		if (s->last_append_us > t)
			t = s->last_append_us;
		if (s->busy || s->queued)
			t = INT64_MAX;   /* in use: not idle */
	}
	pthread_rwlock_unlock(&x->table_lock);
	pthread_mutex_unlock(&x->lock);
	return t;
}

/* Deletes the tenant's sessions idle since before cutoff; how many. */
static int
sweep_tenant(histd_context *x, const char *tenant, int64_t cutoff)
{
	histd_list q = { .tenant = tenant, .limit = SWEEP_PAGE };
	char *after = NULL;
	int deleted = 0, more;

	do {
		histd_session_list l = { 0 };

		q.after_id = after;
		if (histd_driver_session_list(x->d, &q, &l))
			break;
		for (size_t i = 0; i < l.n && !atomic_load(&x->sweep_stop); i++) {
			const histd_session *sr = l.v[i];
			uint64_t cur;

			if (last_activity(x, sr) >= cutoff)
				continue;
			/* At the revision and life it saw: a session
			 * written, or deleted and created again, since is
			 * not the idle one. */
			if (!histd_driver_session_delete_life(x->d, sr->tenant,
							      sr->id,
							      sr->revision,
							      sr->incarnation,
							      &cur)) {
				deleted++;
				histd_log(HISTD_LOG_INFO, "session expired",
					  "session", sr->id, NULL);
			}
		}
		more = l.has_more && l.n && !atomic_load(&x->sweep_stop);
		free(after);
		after = more ? strdup(l.v[l.n - 1]->id) : NULL;
		histd_session_list_free(&l);
	} while (more && after);
	free(after);
	return deleted;
}

/* Every tenant the storage holds sessions of, as the driver lists them:
 * those from before a restart, and other replicas', too. */
int
histd_context_sweep(histd_context *x)
{
	char *after = NULL;
	int deleted = 0, more;
	int64_t cutoff;

	if (!x || x->cfg.session_ttl_us <= 0)
		return 0;
	cutoff = histd_now_us() - x->cfg.session_ttl_us;
	do {
		histd_tenant_list tl = { 0 };
		int rc = histd_driver_tenant_list(x->d, after, SWEEP_PAGE, &tl);

		if (rc) {
			histd_log(HISTD_LOG_WARN, "session TTL sweep stopped; "
				  "the next one starts over", "error",
				  histd_error_message(), NULL);
			break;
		}
		for (size_t i = 0; i < tl.n && !atomic_load(&x->sweep_stop); i++)
			deleted += sweep_tenant(x, tl.v[i], cutoff);
		more = tl.has_more && tl.n && !atomic_load(&x->sweep_stop);
		free(after);
		after = more ? strdup(tl.v[tl.n - 1]) : NULL;
		histd_tenant_list_free(&tl);
	} while (more && after);
	free(after);
	return deleted;
}

static void *
sweeper_main(void *arg)
{
	histd_context *x = arg;

	pthread_mutex_lock(&x->sweep_lock);
	while (!x->stop) {
		struct timespec ts;
		int64_t until;

		clock_gettime(CLOCK_REALTIME, &ts);
		until = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 +
			x->cfg.sweep_interval_us;
		ts.tv_sec = until / 1000000;
		ts.tv_nsec = (long)(until % 1000000) * 1000;
		pthread_cond_timedwait(&x->sweep_cond, &x->sweep_lock, &ts);
		if (x->stop)
			break;
		pthread_mutex_unlock(&x->sweep_lock);
		histd_context_sweep(x);
		pthread_mutex_lock(&x->sweep_lock);
	}
	pthread_mutex_unlock(&x->sweep_lock);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Lifecycle                                                               */

int
histd_context_new(histd_context **out, histd_driver *d,
		  const histd_context_config *cfg)
{
	histd_context *x;
	int rc;

	*out = NULL;
	if (!d)
		return histd_error_set(HISTD_EINVALID,
				       "the context needs a driver");
	if (cfg && cfg->plugin_paths && *cfg->plugin_paths &&
	    (rc = histd_plugin_load_list(cfg->plugin_paths)))
		return rc;
	if (!(x = calloc(1, sizeof(*x))))
		return enomem();
	x->d = d;
	if (cfg)
		x->cfg = *cfg;
	x->cfg.default_pipeline = NULL;
	x->cfg.plugin_paths = NULL;
	if (x->cfg.workers <= 0)
		x->cfg.workers = 1;
	if (x->cfg.max_retries < 0)
		x->cfg.max_retries = 0;
	if (x->cfg.retry_base_us <= 0)
		x->cfg.retry_base_us = 1000000;
	if (x->cfg.sweep_interval_us <= 0)
		x->cfg.sweep_interval_us = INT64_C(60) * 1000000;
	pthread_mutex_init(&x->lock, NULL);
	pthread_rwlock_init(&x->table_lock, NULL);
	pthread_cond_init(&x->work, NULL);
	pthread_cond_init(&x->idle, NULL);
	pthread_mutex_init(&x->sweep_lock, NULL);
	pthread_cond_init(&x->sweep_cond, NULL);
	pthread_mutex_init(&x->pipe_lock, NULL);
	if (cfg && (rc = histd_pipeline_parse(cfg->default_pipeline,
					      "default-pipeline", &x->def))) {
		histd_context_free(x);
		return rc;
	}
	if (!histd_driver_can_truncate(d) &&
	    (rc = check_retention(x->def, NULL, d->name, HISTD_EINVALID))) {
		histd_context_free(x);
		return rc;
	}
	if (x->cfg.session_ttl_us > 0 && !histd_driver_can_list_tenants(d)) {
		histd_context_free(x);
		return histd_error_set(HISTD_EINVALID,
			"session-ttl needs a storage driver that lists its "
			"tenants; the %s driver cannot", d->name);
	}
	if (!histd_driver_can_truncate(d)) {
		x->no_truncate = d->name;
		atomic_store(&no_truncate_driver, d->name);
	}
	x->threads = calloc((size_t)x->cfg.workers, sizeof(pthread_t));
	if (!x->threads) {
		histd_context_free(x);
		return enomem();
	}
	for (int i = 0; i < x->cfg.workers; i++) {
		if (pthread_create(&x->threads[i], NULL, worker_main, x)) {
			histd_context_free(x);
			return histd_error_set(HISTD_EINTERNAL,
				"cannot start a compaction thread");
		}
		x->n_threads++;
	}
	if (x->cfg.session_ttl_us > 0) {
		if (pthread_create(&x->sweeper, NULL, sweeper_main, x)) {
			histd_context_free(x);
			return histd_error_set(HISTD_EINTERNAL,
				"cannot start the session TTL sweeper");
		}
		x->have_sweeper = 1;
	}
	*out = x;
	return 0;
}

void
histd_context_set_error_sink(histd_context *x, histd_plugin_error_fn fn,
			     void *arg)
{
	pthread_mutex_lock(&x->lock);
	x->sink = fn;
	x->sink_arg = arg;
	pthread_mutex_unlock(&x->lock);
}

void
histd_context_free(histd_context *x)
{
	if (!x)
		return;
	if (x->no_truncate) {
		const char *name = x->no_truncate;

		atomic_compare_exchange_strong(&no_truncate_driver, &name, NULL);
	}
	/* Workers read stop under lock, the sweeper under sweep_lock. */
	pthread_mutex_lock(&x->lock);
	pthread_mutex_lock(&x->sweep_lock);
	x->stop = 1;
	atomic_store(&x->sweep_stop, 1);
	pthread_cond_broadcast(&x->sweep_cond);
	pthread_mutex_unlock(&x->sweep_lock);
	pthread_cond_broadcast(&x->work);
	pthread_mutex_unlock(&x->lock);
	for (int i = 0; i < x->n_threads; i++)
		pthread_join(x->threads[i], NULL);
	if (x->have_sweeper)
		pthread_join(x->sweeper, NULL);
	/* A Reduce call still running holds a session: wait for it. */
	pthread_mutex_lock(&x->lock);
	while (x->running > 0)
		pthread_cond_wait(&x->idle, &x->lock);
	pthread_mutex_unlock(&x->lock);
	for (size_t b = 0; b < BUCKETS; b++)
		while (x->table[b]) {
			struct sess *s = x->table[b];

			x->table[b] = s->next;
			sess_free(s);
		}
	free(x->threads);
	while (x->pipes) {
		struct pipe_entry *e = x->pipes;

		x->pipes = e->next;
		histd_pipeline_free(e->p);
		free(e);
	}
	pthread_mutex_destroy(&x->pipe_lock);
	histd_pipeline_free(x->def);
	pthread_mutex_destroy(&x->lock);
	pthread_rwlock_destroy(&x->table_lock);
	pthread_cond_destroy(&x->work);
	pthread_cond_destroy(&x->idle);
	pthread_mutex_destroy(&x->sweep_lock);
	pthread_cond_destroy(&x->sweep_cond);
	free(x);
}
