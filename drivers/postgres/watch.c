/*
 * Change notices: the hook in revision order per session, for changes made
 * here and by other replicas.
 *
 * Every write transaction sends, before COMMIT, a pg_notify line
 * "<origin> <kind> <revision> <sid>". PostgreSQL delivers notices only
 * when their transaction commits, in commit order, to every listening
 * connection. A listener thread per process holds one connection in
 * LISTEN and:
 *
 * - skips its own process's notices (the writer calls the hook itself,
 *   with the records it wrote: no read);
 * - for another replica's change to a session this process tracks, reads
 *   what changed since the revision it last delivered (ST_CATCH_UP: one
 *   statement, one snapshot) and delivers it: the messages grouped by the
 *   revision that appended them, summaries, updates; a clear or replace
 *   in the gap becomes one REPLACED (or CLEARED) event at its revision, as
 *   the Subscribe replay does; a truncate, one CLEARED with system
 *   messages kept, after the messages that outlived it. So a missed
 *   notice costs nothing but latency: the next catch-up covers it.
 * - after its connection was lost (PostgreSQL restarted, network), it
 *   reconnects, tells the pool to reconnect (generation), and catches up
 *   every tracked session whose revision moved.
 * - probes the server every second when idle: ping (health) answers from
 *   what it last saw, without waiting on a query.
 *
 * Which sessions are tracked: those this process read (a subscriber reads
 * its snapshot through read) or wrote. A notice for an untracked session
 * leaves a short-lived "ghost" with its revision, so that a read which
 * raced with the notice learns it missed something. Tracked sessions are
 * forgotten least recently used first, past WATCH_MAX and idle for
 * WATCH_IDLE_US (limits in README).
 *
 * Order: entries live in striped hash tables; the hook is always called
 * with the entry's stripe locked, and only for revision last + 1 (or a
 * catch-up's events above last). A local change that arrives early (its
 * transaction committed after another local one on the same session but
 * reached the hook first) waits in the entry's pending list.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "histd_wire.h"
#include "pg.h"

#define WATCH_STRIPES 64
/* Tracked sessions kept before idle ones are forgotten. */
#define WATCH_MAX 262144
#define WATCH_IDLE_US (10 * 60 * INT64_C(1000000))
/* A notice for an untracked session is remembered this long. */
#define GHOST_US (60 * INT64_C(1000000))
/* A local change waiting this long for earlier revisions: re-read. */
#define PENDING_US INT64_C(1000000)
/* Listener cadence: probe and housekeeping when idle; retry to connect. */
#define TICK_MS 1000
#define RETRY_MS 250
/* How long the listener's probe waits for "SELECT 1". */
#define PROBE_TIMEOUT_US INT64_C(5000000)
#define PURGE_US (60 * INT64_C(1000000))
/* Every tracked session's revision checked this often: a notice lost
 * (a writer died between its COMMIT and its notice) costs this long. */
#define SWEEP_US (10 * INT64_C(1000000))
/* Sessions checked per statement after a reconnect. */
#define RECHECK_CHUNK 1000

typedef struct pending {
	struct pending *next;
	enum histd_change_kind kind;
	uint64_t revision;
	uint64_t cleared_to_seq;
	int system_kept;
	uint64_t last_seq;
	histd_records recs;
	int has_records;
	histd_session *session;
	int64_t at_us;
} pending;

typedef struct wentry {
	int64_t sid;
	char *tenant, *id;
	int tracked;
	int deleted;
	int dirty;
	uint64_t last_rev;      /* last revision delivered */
	uint64_t last_seq;      /* every stored seq <= this was delivered */
	uint64_t cleared;       /* cleared_to_seq as delivered */
	uint64_t ghost_rev;     /* ghosts: highest revision noticed */
	int64_t touched_us;
	pending *pend;          /* by revision */
	struct wentry *hnext;
	struct wentry *prev, *next;   /* its LRU list: head newest */
	int in_tracked;         /* on the tracked list (else ghosts) */
} wentry;

typedef struct stripe {
	pthread_mutex_t mu;
	wentry **tab;
	size_t nb, count;
	/* Least recently used last: tracked sessions, and ghosts. */
	wentry lru, ghosts;     /* sentinels */
	size_t n_tracked;
} stripe;

struct pg_watch {
	stripe st[WATCH_STRIPES];
	histd_change_fn fn;
	void *ctx;
	pthread_t thread;
	int started;
	int wake[2];
	atomic_int stop;
	/* Sessions the listener must re-read. */
	pthread_mutex_t q_mu;
	int64_t *queue;
	size_t q_n, q_cap;
	atomic_int pending_entries;
	atomic_int sweep_wanted;
	atomic_int probe_wanted;
	PGconn *pg;
	/* A result of the listener's own (prepared) statements. */
	pg_conn conn;
};

/* ---------------------------------------------------------------------- */
/* Notice lines                                                            */

void
pg_notice_line(pg_buf *b, uint64_t origin, int kind, uint64_t revision,
	       int64_t sid)
{
	char line[96];
	int n = snprintf(line, sizeof(line), "%016" PRIx64 " %d %" PRIu64 " %" PRId64 "\n",
			 origin, kind, revision, sid);

	pg_buf_put(b, line, (size_t)n);
}

/* ---------------------------------------------------------------------- */
/* Entries                                                                 */

static stripe *
stripe_of(struct pg_watch *w, int64_t sid)
{
	uint64_t h = (uint64_t)sid * 0x9e3779b97f4a7c15ull;

	return &w->st[(h >> 32) % WATCH_STRIPES];
}

static size_t
bucket(const stripe *s, int64_t sid)
{
	uint64_t h = (uint64_t)sid * 0xff51afd7ed558ccdull;

	return (size_t)(h >> 17) & (s->nb - 1);
}

static wentry *
find(stripe *s, int64_t sid)
{
	for (wentry *e = s->tab[bucket(s, sid)]; e; e = e->hnext)
		if (e->sid == sid)
			return e;
	return NULL;
}

static void
lru_unlink(stripe *s, wentry *e)
{
	e->prev->next = e->next;
	e->next->prev = e->prev;
	if (e->in_tracked)
		s->n_tracked--;
}

/* To the front of the list its kind belongs to. */
static void
lru_front(stripe *s, wentry *e)
{
	wentry *head = e->tracked ? &s->lru : &s->ghosts;

	e->in_tracked = e->tracked;
	if (e->in_tracked)
		s->n_tracked++;
	e->next = head->next;
	e->prev = head;
	head->next->prev = e;
	head->next = e;
}

static void
touch(stripe *s, wentry *e)
{
	e->touched_us = histd_mono_us();
	lru_unlink(s, e);
	lru_front(s, e);
}

static void
grow_table(stripe *s)
{
	size_t nb = s->nb * 2;
	wentry **tab = calloc(nb, sizeof(*tab));

	if (!tab)
		return;         /* longer chains, still correct */
	for (size_t i = 0; i < s->nb; i++) {
		wentry *e = s->tab[i], *next;

		for (; e; e = next) {
			size_t b;

			next = e->hnext;
			s->nb = nb;
			b = bucket(s, e->sid);
			s->nb = nb / 2;
			e->hnext = tab[b];
			tab[b] = e;
		}
	}
	free(s->tab);
	s->tab = tab;
	s->nb = nb;
}

static wentry *
create(stripe *s, int64_t sid, const char *tenant, const char *id)
{
	wentry *e = calloc(1, sizeof(*e));
	size_t b;

	if (!e)
		return NULL;
	e->sid = sid;
	if (tenant && !(e->tenant = strdup(tenant))) {
		free(e);
		return NULL;
	}
	if (id && !(e->id = strdup(id))) {
		free(e->tenant);
		free(e);
		return NULL;
	}
	if (s->count >= s->nb)
		grow_table(s);
	b = bucket(s, sid);
	e->hnext = s->tab[b];
	s->tab[b] = e;
	s->count++;
	e->touched_us = histd_mono_us();
	lru_front(s, e);
	return e;
}

static void
pending_free(pending *p)
{
	histd_records_clear(&p->recs);
	histd_session_free(p->session);
	free(p);
}

static void
destroy(struct pg_watch *w, stripe *s, wentry *e)
{
	wentry **pp = &s->tab[bucket(s, e->sid)];

	while (*pp != e)
		pp = &(*pp)->hnext;
	*pp = e->hnext;
	lru_unlink(s, e);
	s->count--;
	if (e->pend)
		atomic_fetch_sub(&w->pending_entries, 1);
	while (e->pend) {
		pending *p = e->pend;

		e->pend = p->next;
		pending_free(p);
	}
	free(e->tenant);
	free(e->id);
	free(e);
}

/* Names for an entry that had none (a ghost seen first, then a write). */
static void
name(wentry *e, const char *tenant, const char *id)
{
	if (!e->tenant && tenant)
		e->tenant = strdup(tenant);
	if (!e->id && id)
		e->id = strdup(id);
}

static void
queue_dirty(struct pg_watch *w, wentry *e)
{
	if (e->dirty)
		return;
	e->dirty = 1;
	pthread_mutex_lock(&w->q_mu);
	if (w->q_n == w->q_cap) {
		size_t cap = w->q_cap ? w->q_cap * 2 : 64;
		int64_t *q = realloc(w->queue, cap * sizeof(*q));

		if (!q) {
			/* The sweep will find it: not dirty, or it never
			 * would queue it again. */
			pthread_mutex_unlock(&w->q_mu);
			e->dirty = 0;
			atomic_store(&w->sweep_wanted, 1);
			return;
		}
		w->queue = q;
		w->q_cap = cap;
	}
	w->queue[w->q_n++] = e->sid;
	pthread_mutex_unlock(&w->q_mu);
}

static void
kick(struct pg_watch *w)
{
	char c = 1;
	ssize_t n = write(w->wake[1], &c, 1);

	(void)n;                /* a full pipe is awake already */
}

/* ---------------------------------------------------------------------- */
/* Delivery (stripe locked)                                                */

static void
deliver(struct pg_watch *w, wentry *e, const histd_change *c, uint64_t last_seq)
{
	if (w->fn) {
		histd_change life = *c;

		/* The sid: a session created again under its id gets
		 * another (pg_row_session). */
		life.incarnation = (uint64_t)e->sid;
		w->fn(w->ctx, &life);
	}
	e->last_rev = c->revision;
	if (last_seq > e->last_seq)
		e->last_seq = last_seq;
	if (c->kind == HISTD_CHANGE_CLEARED || c->kind == HISTD_CHANGE_REPLACED) {
		e->cleared = c->cleared_to_seq;
		if (c->cleared_to_seq > e->last_seq)
			e->last_seq = c->cleared_to_seq;
	}
	if (c->kind == HISTD_CHANGE_DELETED)
		e->deleted = 1;
}

static void
deliver_pending(struct pg_watch *w, wentry *e, pending *p)
{
	histd_change c = {
		.kind = p->kind, .tenant = e->tenant, .session_id = e->id,
		.revision = p->revision, .cleared_to_seq = p->cleared_to_seq,
		.records = p->has_records ? (p->recs.n ? p->recs.v
					     : (const histd_record *)p)
					  : NULL,
		.n_records = p->recs.n, .session = p->session,
		.system_kept = p->system_kept,
	};

	deliver(w, e, &c, p->last_seq);
}

/* Delivers the waiting changes that are now next; drops those a
 * catch-up delivered already. */
static void
drain(struct pg_watch *w, wentry *e)
{
	int had = e->pend != NULL;

	while (e->pend && !e->deleted) {
		pending *p = e->pend;

		if (p->revision > e->last_rev + 1)
			break;
		e->pend = p->next;
		if (p->revision == e->last_rev + 1)
			deliver_pending(w, e, p);
		pending_free(p);
	}
	while (e->deleted && e->pend) {
		pending *p = e->pend;

		e->pend = p->next;
		pending_free(p);
	}
	if (had && !e->pend)
		atomic_fetch_sub(&w->pending_entries, 1);
}

static int
hold(struct pg_watch *w, wentry *e, const histd_change *c, uint64_t last_seq)
{
	pending *p = calloc(1, sizeof(*p)), **pp;

	if (!p)
		return -1;
	p->kind = c->kind;
	p->revision = c->revision;
	p->cleared_to_seq = c->cleared_to_seq;
	p->system_kept = c->system_kept;
	p->last_seq = last_seq;
	p->at_us = histd_mono_us();
	p->has_records = c->records != NULL;
	for (size_t i = 0; i < c->n_records; i++)
		if (histd_records_add(&p->recs, c->records[i].seq,
				      c->records[i].token_estimate,
				      c->records[i].data, c->records[i].len)) {
			pending_free(p);
			return -1;
		}
	if (c->session && !(p->session = histd_session_dup(c->session))) {
		pending_free(p);
		return -1;
	}
	if (!e->pend)
		atomic_fetch_add(&w->pending_entries, 1);
	for (pp = &e->pend; *pp && (*pp)->revision < p->revision; pp = &(*pp)->next)
		;
	p->next = *pp;
	*pp = p;
	return 0;
}

void
pg_watch_local(pg_driver *d, int64_t sid, const histd_change *c,
	       uint64_t last_seq)
{
	struct pg_watch *w = d->watch;
	stripe *s = stripe_of(w, sid);
	wentry *e;

	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (!e) {
		e = create(s, sid, c->tenant, c->session_id);
		if (!e) {
			/* No memory to order it: deliver it as it is. */
			histd_change life = *c;

			life.incarnation = (uint64_t)sid;
			if (w->fn)
				w->fn(w->ctx, &life);
			pthread_mutex_unlock(&s->mu);
			return;
		}
		e->tracked = 1;
		e->last_rev = c->revision - 1;
	} else if (!e->tracked) {
		/* Another replica changed it lately; nobody here read it. */
		name(e, c->tenant, c->session_id);
		e->tracked = 1;
		e->last_rev = c->revision - 1;
		if (e->ghost_rev > c->revision) {
			queue_dirty(w, e);
			kick(w);
		}
	}
	touch(s, e);
	if (e->deleted || c->revision <= e->last_rev) {
		pthread_mutex_unlock(&s->mu);
		return;
	}
	if (c->revision == e->last_rev + 1) {
		deliver(w, e, c, last_seq);
		drain(w, e);
	} else if (hold(w, e, c, last_seq) != 0) {
		queue_dirty(w, e);
		kick(w);
	}
	pthread_mutex_unlock(&s->mu);
}

void
pg_watch_unknown(pg_driver *d, int64_t sid, const char *tenant, const char *id)
{
	struct pg_watch *w = d->watch;
	stripe *s = stripe_of(w, sid);
	wentry *e;

	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (e && e->tracked) {
		name(e, tenant, id);
		queue_dirty(w, e);
	}
	pthread_mutex_unlock(&s->mu);
	kick(w);
}

void
pg_watch_seen(pg_driver *d, int64_t sid, const char *tenant, const char *id,
	      uint64_t revision, uint64_t last_seq, uint64_t cleared_to_seq)
{
	struct pg_watch *w = d->watch;
	stripe *s = stripe_of(w, sid);
	wentry *e;
	int wake = 0;

	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (!e) {
		e = create(s, sid, tenant, id);
		if (e) {
			e->tracked = 1;
			e->last_rev = revision;
			e->last_seq = last_seq;
			e->cleared = cleared_to_seq;
		}
	} else if (!e->tracked) {
		/* A notice beat this read: did the read see that change? */
		name(e, tenant, id);
		e->tracked = 1;
		e->last_rev = revision;
		e->last_seq = last_seq;
		e->cleared = cleared_to_seq;
		if (e->ghost_rev > revision) {
			queue_dirty(w, e);
			wake = 1;
		}
	}
	if (e)
		touch(s, e);
	pthread_mutex_unlock(&s->mu);
	if (wake)
		kick(w);
}

void
pg_watch_sweep(pg_driver *d)
{
	atomic_store(&d->watch->sweep_wanted, 1);
	kick(d->watch);
}

void
pg_watch_probe(pg_driver *d)
{
	if (d->watch && !atomic_exchange(&d->watch->probe_wanted, 1))
		kick(d->watch);
}

void
pg_watch_kick(pg_driver *d)
{
	if (d->watch)
		kick(d->watch);
}

void
pg_watch_set_notify(pg_driver *d, histd_change_fn fn, void *ctx)
{
	struct pg_watch *w = d->watch;

	for (int i = 0; i < WATCH_STRIPES; i++)
		pthread_mutex_lock(&w->st[i].mu);
	w->fn = fn;
	w->ctx = ctx;
	for (int i = WATCH_STRIPES; i-- > 0;)
		pthread_mutex_unlock(&w->st[i].mu);
}

/* ---------------------------------------------------------------------- */
/* Catch-up (listener thread)                                              */

typedef struct event {
	enum histd_change_kind kind;
	uint64_t revision;
	uint64_t cleared_to_seq;
	uint64_t last_seq;
	size_t first, n;        /* records in the catch-up's list */
	int summary;            /* records from the summary list */
	int system_kept;        /* CLEARED by a truncate */
} event;

/* Appends e to the list; 0 or -1 (out of memory). */
static int
event_add(event **ev, size_t *n, const event *e)
{
	event *ne = realloc(*ev, (*n + 1) * sizeof(*ne));

	if (!ne)
		return -1;
	*ev = ne;
	ne[(*n)++] = *e;
	return 0;
}

static int
event_cmp(const void *a, const void *b)
{
	const event *x = a, *y = b;

	return x->revision < y->revision ? -1 : x->revision > y->revision;
}

/* Reads what changed in session `sid` since it was last delivered, and
 * delivers it. Returns 0, or EUNAVAILABLE (connection trouble). */
static int
catch_up(pg_driver *d, int64_t sid)
{
	struct pg_watch *w = d->watch;
	stripe *s = stripe_of(w, sid);
	wentry *e;
	uint64_t L, Q;
	pg_params p = { 0 };
	PGresult *r = NULL, *sr = NULL;
	histd_records msgs = { 0 }, sums = { 0 };
	uint64_t *msg_rev = NULL;
	event *ev = NULL;
	size_t n_ev = 0;
	histd_session *session = NULL;
	int found = 0, rc;
	uint64_t R = 0, last_seq = 0, cleared = 0, clear_rev = 0, meta_rev = 0;
	uint64_t trunc_rev = 0;

	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (!e || !e->tracked || e->deleted) {
		if (e)
			e->dirty = 0;
		pthread_mutex_unlock(&s->mu);
		return 0;
	}
	L = e->last_rev;
	Q = e->last_seq;
	/* Taken: a request made while the statement runs (a notice, an
	 * unanswered COMMIT) may be newer than its snapshot, and queues the
	 * session again. */
	e->dirty = 0;
	pthread_mutex_unlock(&s->mu);

	pg_p_i64(&p, sid);
	pg_p_i64(&p, (int64_t)Q);
	pg_p_i64(&p, (int64_t)L);
	if ((rc = pg_exec(d, &w->conn, ST_CATCH_UP, &p, &r, NULL)))
		return rc;
	for (int i = 0; i < PQntuples(r); i++) {
		int k = pg_r_i32(r, i, 0);
		size_t len;
		const char *data;

		if (k == 0) {
			found = 1;
			R = (uint64_t)pg_r_i64(r, i, 1);
			last_seq = (uint64_t)pg_r_i64(r, i, 2);
			cleared = (uint64_t)pg_r_i64(r, i, 3);
			clear_rev = (uint64_t)pg_r_i64(r, i, 4);
			meta_rev = (uint64_t)pg_r_i64(r, i, 5);
			trunc_rev = (uint64_t)pg_r_i64(r, i, 8);
			continue;
		}
		data = pg_r_str(r, i, 7, &len);
		if (k == 1) {
			uint64_t *nr = realloc(msg_rev, (msgs.n + 1) * sizeof(*nr));

			if (!nr)
				goto oom;
			msg_rev = nr;
			msg_rev[msgs.n] = (uint64_t)pg_r_i64(r, i, 1);
			if (pg_records_add_msg(&msgs, (uint64_t)pg_r_i64(r, i, 2),
					       (uint32_t)pg_r_i32(r, i, 6), data, len))
				goto oom;
		} else {
			if (event_add(&ev, &n_ev, &(event){
				.kind = HISTD_CHANGE_SUMMARY,
				.revision = (uint64_t)pg_r_i64(r, i, 1),
				.first = sums.n, .n = 1, .summary = 1,
			}))
				goto oom;
			if (histd_records_add(&sums, (uint64_t)pg_r_i64(r, i, 2),
					      (uint32_t)pg_r_i32(r, i, 6),
					      (const uint8_t *)data, len))
				goto oom;
		}
	}
	PQclear(r);
	r = NULL;

	if (found) {
		uint64_t floor = L;
		/* By its revision alone: a clear of a session holding nothing
		 * leaves cleared_to_seq where it was, and is a change all
		 * the same. */
		int cleared_since = clear_rev > L;
		/* A truncate after any clear or replace of the gap. */
		int truncated_since = trunc_rev > L && trunc_rev > clear_rev;

		if (cleared_since && truncated_since) {
			/* A clear or replace, then a truncate: the session holds
			 * only messages stored since the clear (all seq > Q),
			 * some of them system messages at or below
			 * cleared_to_seq. One REPLACED at the truncate, with
			 * those stored by then (a prefix: seqs and revisions
			 * grow together), says exactly that. */
			size_t n = 0;

			while (n < msgs.n && msg_rev[n] <= trunc_rev)
				n++;
			if (event_add(&ev, &n_ev, &(event){
				.kind = HISTD_CHANGE_REPLACED,
				.revision = trunc_rev, .cleared_to_seq = cleared,
				.first = 0, .n = n,
				.last_seq = n && msgs.v[n - 1].seq > cleared
					    ? msgs.v[n - 1].seq : cleared,
			}))
				goto oom;
			floor = trunc_rev;
		} else if (cleared_since) {
			/* A clear or replace in the gap: the session now holds
			 * its messages and what came after. */
			size_t first = msgs.n, n = 0;

			for (size_t i = 0; i < msgs.n; i++)
				if (msg_rev[i] == clear_rev) {
					if (first == msgs.n)
						first = i;
					n++;
				}
			if (event_add(&ev, &n_ev, &(event){
				.kind = n ? HISTD_CHANGE_REPLACED : HISTD_CHANGE_CLEARED,
				.revision = clear_rev, .cleared_to_seq = cleared,
				.first = n ? first : 0, .n = n,
				.last_seq = n ? msgs.v[first + n - 1].seq : cleared,
			}))
				goto oom;
			floor = clear_rev;
		} else if (truncated_since) {
			/* Truncates in the gap: the messages that outlived them
			 * at the revisions that appended them (below), and one
			 * CLEARED at the last, keeping system messages. */
			if (event_add(&ev, &n_ev, &(event){
				.kind = HISTD_CHANGE_CLEARED, .revision = trunc_rev,
				.cleared_to_seq = cleared, .last_seq = cleared,
				.system_kept = 1,
			}))
				goto oom;
		}
		for (size_t i = 0; i < msgs.n;) {
			size_t j = i;

			while (j < msgs.n && msg_rev[j] == msg_rev[i])
				j++;
			if (msg_rev[i] > floor &&
			    event_add(&ev, &n_ev, &(event){
					.kind = HISTD_CHANGE_APPENDED,
					.revision = msg_rev[i], .first = i, .n = j - i,
					.last_seq = msgs.v[j - 1].seq,
				}))
				goto oom;
			i = j;
		}
		/* Summaries and the session's record are delivered whatever
		 * clear or truncate came after them: the rows read are those
		 * still stored (a clear deletes every summary, a truncate
		 * those it covers), and a clear or truncate leaves labels and
		 * config as they were. */
		if (meta_rev > L) {
			pg_params sp = { 0 };

			pg_p_i64(&sp, sid);
			if ((rc = pg_exec(d, &w->conn, ST_SESSION_GET_SID, &sp, &sr, NULL)))
				goto out;
			if (PQntuples(sr) == 1 &&
			    pg_row_session(sr, 0, 0, &session, NULL) == 0 &&
			    event_add(&ev, &n_ev, &(event){
					.kind = HISTD_CHANGE_UPDATED,
					.revision = meta_rev,
				}))
				goto oom;
		}
		if (n_ev > 1)
			qsort(ev, n_ev, sizeof(*ev), event_cmp);
	}

	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (e && e->tracked && !e->deleted) {
		for (size_t i = 0; found && i < n_ev; i++) {
			const event *x = &ev[i];
			histd_records *src = x->summary ? &sums : &msgs;
			histd_change c = {
				.kind = x->kind, .tenant = e->tenant, .session_id = e->id,
				.revision = x->revision,
				.cleared_to_seq = x->cleared_to_seq ? x->cleared_to_seq
								    : e->cleared,
				.session = x->kind == HISTD_CHANGE_UPDATED ? session : NULL,
				.system_kept = x->system_kept,
			};

			if (x->revision <= e->last_rev)
				continue;
			if (x->kind == HISTD_CHANGE_APPENDED ||
			    x->kind == HISTD_CHANGE_REPLACED ||
			    x->kind == HISTD_CHANGE_SUMMARY) {
				c.records = x->n ? &src->v[x->first]
						 : (const histd_record *)&c;
				c.n_records = x->n;
			}
			deliver(w, e, &c, x->summary ? 0 : x->last_seq);
		}
		if (!found) {
			histd_change c = {
				.kind = HISTD_CHANGE_DELETED, .tenant = e->tenant,
				.session_id = e->id, .revision = e->last_rev + 1,
				.cleared_to_seq = e->cleared,
			};

			deliver(w, e, &c, 0);
		} else {
			if (R > e->last_rev)
				e->last_rev = R;
			if (last_seq > e->last_seq)
				e->last_seq = last_seq;
			/* A local clear delivered while the statement ran is
			 * newer than its snapshot: cleared_to_seq only grows. */
			if (cleared > e->cleared)
				e->cleared = cleared;
		}
		drain(w, e);
	}
	pthread_mutex_unlock(&s->mu);
	rc = 0;
	goto out;
oom:
	rc = histd_error_set(HISTD_ENOMEM, "out of memory");
out:
	PQclear(r);
	PQclear(sr);
	histd_records_clear(&msgs);
	histd_records_clear(&sums);
	histd_session_free(session);
	free(msg_rev);
	free(ev);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* The listener thread                                                     */

/* A notice from another process: mark the session for catch-up. */
static void
on_notice(struct pg_watch *w, uint64_t origin, uint64_t mine, uint64_t rev,
	  int64_t sid)
{
	stripe *s;
	wentry *e;

	if (origin == mine)
		return;
	s = stripe_of(w, sid);
	pthread_mutex_lock(&s->mu);
	e = find(s, sid);
	if (!e) {
		e = create(s, sid, NULL, NULL);
		if (e)
			e->ghost_rev = rev;
	} else if (!e->tracked) {
		if (rev > e->ghost_rev)
			e->ghost_rev = rev;
		touch(s, e);
	} else if (!e->deleted && rev > e->last_rev) {
		queue_dirty(w, e);
	}
	pthread_mutex_unlock(&s->mu);
}

static void
parse_notices(pg_driver *d, PGconn *pg)
{
	PGnotify *n;

	while ((n = PQnotifies(pg)) != NULL) {
		const char *p = n->extra;

		while (p && *p) {
			uint64_t origin, rev;
			int64_t sid;
			int kind, used = 0;

			if (sscanf(p, "%" SCNx64 " %d %" SCNu64 " %" SCNd64 "%n",
				   &origin, &kind, &rev, &sid, &used) == 4)
				on_notice(d->watch, origin, d->origin, rev, sid);
			p = strchr(p, '\n');
			if (p)
				p++;
		}
		PQfreemem(n);
	}
}

/* Every tracked session, for the sweep after a reconnect. */
static int64_t *
tracked_sids(struct pg_watch *w, size_t *n_out)
{
	int64_t *v = NULL;
	size_t n = 0, cap = 0;

	for (int i = 0; i < WATCH_STRIPES; i++) {
		stripe *s = &w->st[i];

		pthread_mutex_lock(&s->mu);
		for (wentry *e = s->lru.next; e != &s->lru; e = e->next) {
			if (!e->tracked || e->deleted)
				continue;
			if (n == cap) {
				size_t nc = cap ? cap * 2 : 256;
				int64_t *nv = realloc(v, nc * sizeof(*nv));

				if (!nv)
					break;
				v = nv;
				cap = nc;
			}
			v[n++] = e->sid;
		}
		pthread_mutex_unlock(&s->mu);
	}
	*n_out = n;
	return v;
}

/* After the listener was disconnected: which tracked sessions moved?
 * Those are re-read. */
static int
sweep(pg_driver *d)
{
	struct pg_watch *w = d->watch;
	size_t n;
	int64_t *sids = tracked_sids(w, &n);
	int rc = 0;

	for (size_t off = 0; off < n && rc == 0; off += RECHECK_CHUNK) {
		size_t m = n - off < RECHECK_CHUNK ? n - off : RECHECK_CHUNK;
		pg_array arr;
		pg_params p = { 0 };
		PGresult *r;

		pg_arr_init(&arr, PG_OID_INT8);
		for (size_t i = 0; i < m; i++)
			pg_arr_i64(&arr, sids[off + i]);
		if (pg_arr_finish(&arr)) {
			pg_arr_free(&arr);
			break;
		}
		pg_p_array(&p, &arr);
		rc = pg_exec(d, &w->conn, ST_WATCH_REVISIONS, &p, &r, NULL);
		pg_arr_free(&arr);
		if (rc)
			break;
		for (int i = 0; i < PQntuples(r); i++) {
			int64_t sid = pg_r_i64(r, i, 0);
			int gone = pg_r_null(r, i, 1);
			uint64_t rev = (uint64_t)pg_r_i64(r, i, 1);
			stripe *s = stripe_of(w, sid);
			wentry *e;

			pthread_mutex_lock(&s->mu);
			e = find(s, sid);
			if (e && e->tracked && !e->deleted && (gone || rev > e->last_rev))
				queue_dirty(w, e);
			pthread_mutex_unlock(&s->mu);
		}
		PQclear(r);
	}
	free(sids);
	return rc;
}

/* Re-reads every queued session. */
static int
run_queue(pg_driver *d)
{
	struct pg_watch *w = d->watch;

	for (;;) {
		int64_t *q;
		size_t n;
		int rc = 0;

		pthread_mutex_lock(&w->q_mu);
		q = w->queue;
		n = w->q_n;
		w->queue = NULL;
		w->q_n = w->q_cap = 0;
		pthread_mutex_unlock(&w->q_mu);
		if (!n) {
			free(q);
			return 0;
		}
		for (size_t i = 0; i < n; i++) {
			if (rc == 0)
				rc = catch_up(d, q[i]);
			if (rc) {
				/* Keep it for after the reconnect (the failed one
				 * was taken; the rest were not tried). */
				stripe *s = stripe_of(w, q[i]);
				wentry *e;

				pthread_mutex_lock(&s->mu);
				e = find(s, q[i]);
				if (e && e->tracked && !e->deleted) {
					e->dirty = 0;
					queue_dirty(w, e);
				}
				pthread_mutex_unlock(&s->mu);
			}
		}
		free(q);
		if (rc)
			return rc;
	}
}

/* Once a second: local changes stuck behind a missing revision, ghosts
 * past their time, idle sessions past the limit. */
static void
housekeeping(struct pg_watch *w)
{
	int64_t now = histd_mono_us();
	int scan_pending = atomic_load(&w->pending_entries) > 0;

	for (int i = 0; i < WATCH_STRIPES; i++) {
		stripe *s = &w->st[i];

		pthread_mutex_lock(&s->mu);
		if (scan_pending)
			for (wentry *e = s->lru.next; e != &s->lru; e = e->next)
				if (e->pend && now - e->pend->at_us > PENDING_US)
					queue_dirty(w, e);
		/* Ghosts live a minute. */
		while (s->ghosts.prev != &s->ghosts &&
		       now - s->ghosts.prev->touched_us > GHOST_US)
			destroy(w, s, s->ghosts.prev);
		/* Tracked sessions, idle ones first, past the limit; the
		 * tombstones of deleted sessions once idle. */
		while (s->lru.prev != &s->lru) {
			wentry *e = s->lru.prev;

			if (e->dirty || e->pend || now - e->touched_us <= WATCH_IDLE_US)
				break;
			if (!e->deleted && s->n_tracked <= WATCH_MAX / WATCH_STRIPES)
				break;
			destroy(w, s, e);
		}
		pthread_mutex_unlock(&s->mu);
	}
}

static int
wait_wake(struct pg_watch *w, int fd, int timeout_ms)
{
	struct pollfd pf[2] = {
		{ .fd = w->wake[0], .events = POLLIN },
		{ .fd = fd, .events = POLLIN },
	};
	int n = poll(pf, fd >= 0 ? 2 : 1, timeout_ms);

	if (n > 0 && (pf[0].revents & POLLIN)) {
		char buf[64];

		while (read(w->wake[0], buf, sizeof(buf)) > 0)
			;
	}
	return n;
}

/* Whether sessions wait in the queue for a catch-up. */
static int
queued(struct pg_watch *w)
{
	size_t n;

	pthread_mutex_lock(&w->q_mu);
	n = w->q_n;
	pthread_mutex_unlock(&w->q_mu);
	return n != 0;
}

static int
listen_on(pg_driver *d)
{
	struct pg_watch *w = d->watch;
	int rc;

	if ((rc = pg_connect(d, &w->pg, 1)))
		return rc;
	w->conn.pg = w->pg;
	/* Named apart from the pool in pg_stat_activity. */
	rc = pg_simple(d, w->pg, "SET application_name = 'histd listener';"
		       " LISTEN " PG_CHANNEL, pg_deadline(d));
	if (rc) {
		PQfinish(w->pg);
		w->pg = w->conn.pg = NULL;
	}
	return rc;
}

static void
drop(struct pg_watch *w)
{
	if (w->pg)
		PQfinish(w->pg);
	w->pg = w->conn.pg = NULL;
}

/* The server answers a trivial query within PROBE_TIMEOUT_US (or the
 * statements' limit, if shorter): a server that stops answering (stopped,
 * its host gone) is down for health before a statement gives up. */
static int
probe(pg_driver *d, struct pg_watch *w)
{
	int64_t deadline = pg_deadline(d);
	int64_t soon = histd_mono_us() + PROBE_TIMEOUT_US;

	return pg_simple(d, w->pg, "SELECT 1",
			 deadline < soon ? deadline : soon) == 0;
}

/* The listener's connection broke: reconnect at once (the loop does). */
static void
lost(struct pg_watch *w, int *was_connected)
{
	drop(w);
	*was_connected = 0;
}

static void *
listener(void *arg)
{
	pg_driver *d = arg;
	struct pg_watch *w = d->watch;
	int64_t last_tick = histd_mono_us(), last_purge = histd_mono_us();
	int64_t last_sweep = histd_mono_us();
	int was_connected = 1;   /* open() connected: nothing missed yet */
	int failed = 0;          /* the last catch-ups failed */

	while (!atomic_load(&w->stop)) {
		int64_t now;
		int rq, tick;

		if (!w->pg) {
			/* Only a failed connect says the server is down: a lost
			 * listener alone (killed, idle timeout) does not. */
			if (listen_on(d) != 0) {
				atomic_store(&d->db_up, 0);
				wait_wake(w, -1, RETRY_MS);
				continue;
			}
			if (!was_connected) {
				/* Pooled connections may talk to a server that
				 * restarted since: they reconnect at next use. */
				atomic_fetch_add(&d->gen, 1);
				was_connected = 1;
			}
			atomic_store(&d->db_up, 1);
			/* Whatever happened while we did not listen. */
			if (sweep(d) != 0) {
				lost(w, &was_connected);
				continue;
			}
		}
		/* Notices libpq read during the last queries (catch-ups,
		 * probe, sweep): the socket will not wake the poll for them.
		 * Sessions they queued are read at once; but catch-ups that
		 * just failed wait for the tick, not a busy loop. */
		parse_notices(d, w->pg);
		wait_wake(w, PQsocket(w->pg),
			  !failed && queued(w) ? 0 : TICK_MS);
		if (atomic_load(&w->stop))
			break;
		if (!PQconsumeInput(w->pg) || PQstatus(w->pg) != CONNECTION_OK) {
			lost(w, &was_connected);
			continue;
		}
		parse_notices(d, w->pg);
		if (atomic_exchange(&w->sweep_wanted, 0) && sweep(d) != 0) {
			if (PQstatus(w->pg) != CONNECTION_OK) {
				atomic_store(&w->sweep_wanted, 1);
				lost(w, &was_connected);
				continue;
			}
			/* A statement that failed (a timeout, no memory): again
			 * at the next tick, not at every wake-up. */
			last_sweep = histd_mono_us() - SWEEP_US;
		}
		if ((rq = run_queue(d)) != 0 && PQstatus(w->pg) != CONNECTION_OK) {
			lost(w, &was_connected);
			continue;
		}
		failed = rq != 0;
		now = histd_mono_us();
		tick = now - last_tick >= TICK_MS * INT64_C(1000);
		if (tick)
			last_tick = now;
		/* Once a second, or at once for a committer whose batches
		 * stalled (pg_watch_probe). */
		if (tick || atomic_exchange(&w->probe_wanted, 0)) {
			if (!probe(d, w)) {
				lost(w, &was_connected);
				continue;
			}
			/* Answering: up again if a call's timeout said down. */
			atomic_store(&d->probed_us, histd_mono_us());
			atomic_store(&d->db_up, 1);
		}
		if (tick) {
			/* Notices that arrived during the probe are parsed
			 * before the next wait. */
			housekeeping(w);
			if (now - last_sweep >= SWEEP_US) {
				last_sweep = now;
				atomic_store(&w->sweep_wanted, 1);
			}
			if (now - last_purge >= PURGE_US) {
				pg_params p = { 0 };

				last_purge = now;
				pg_p_ts(&p, histd_now_us());
				pg_exec(d, &w->conn, ST_PURGE_IDEM, &p, NULL, NULL);
			}
		}
	}
	drop(w);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Start and stop                                                          */

int
pg_watch_start(pg_driver *d)
{
	struct pg_watch *w = calloc(1, sizeof(*w));

	if (!w)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	w->wake[0] = w->wake[1] = -1;
	for (int i = 0; i < WATCH_STRIPES; i++) {
		stripe *s = &w->st[i];

		pthread_mutex_init(&s->mu, NULL);
		s->nb = 64;
		s->tab = calloc(s->nb, sizeof(*s->tab));
		s->lru.next = s->lru.prev = &s->lru;
		s->ghosts.next = s->ghosts.prev = &s->ghosts;
		if (!s->tab) {
			d->watch = w;
			pg_watch_stop(d);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
	}
	pthread_mutex_init(&w->q_mu, NULL);
	d->watch = w;
	if (pipe2(w->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
		pg_watch_stop(d);
		return histd_error_set(HISTD_EINTERNAL, "pipe: %s", strerror(errno));
	}
	/* Listening before open returns: every change committed after open
	 * is seen. */
	if (listen_on(d) != 0) {
		int rc = HISTD_EUNAVAILABLE;

		pg_watch_stop(d);
		return rc;
	}
	if (pthread_create(&w->thread, NULL, listener, d) != 0) {
		pg_watch_stop(d);
		return histd_error_set(HISTD_EINTERNAL, "cannot start the listener");
	}
	w->started = 1;
	return 0;
}

void
pg_watch_stop(pg_driver *d)
{
	struct pg_watch *w = d->watch;

	if (!w)
		return;
	if (w->started) {
		atomic_store(&w->stop, 1);
		kick(w);
		pthread_join(w->thread, NULL);
	}
	drop(w);
	for (int i = 0; i < WATCH_STRIPES; i++) {
		stripe *s = &w->st[i];

		if (s->tab) {
			while (s->lru.next != &s->lru)
				destroy(w, s, s->lru.next);
			while (s->ghosts.next != &s->ghosts)
				destroy(w, s, s->ghosts.next);
			free(s->tab);
		}
		pthread_mutex_destroy(&s->mu);
	}
	pthread_mutex_destroy(&w->q_mu);
	free(w->queue);
	if (w->wake[0] >= 0) {
		close(w->wake[0]);
		close(w->wake[1]);
	}
	free(w);
	d->watch = NULL;
}
