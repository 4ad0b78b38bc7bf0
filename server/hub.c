/*
 * The Subscribe hub (hub.h).
 *
 * Events. A change is packed once into a HistoryEvent that every subscriber
 * of the session shares by reference. Message and summary records are
 * already packed protobuf (a Message with its seq in front, a Summary), so
 * they are spliced into the event on the wire, never unpacked: a
 * length-delimited field is key, length, bytes, and a repeated message
 * field is that, once per element. Only SessionUpdated is built with
 * protobuf-c, from the histd_session record.
 *
 * Fan-out. histd_hub_notify runs on the driver's write path, under the
 * driver's session lock. With no subscriber anywhere it is one atomic load;
 * with subscribers elsewhere, one hash lookup under the table lock. For a
 * session with subscribers it packs the event (the records are only
 * borrowed for the call) and appends (session, event) to a FIFO; one
 * dispatcher thread takes entries in FIFO order and queues the event on
 * each subscriber, calling ops->send for those with no send in flight.
 * Measured roughly on the 2-core dev box (a 200-byte message, 100 idle
 * subscribers, fake streams completed from another thread): fanning one
 * event out takes ~20 us when send is free and ~250 us when send costs
 * 1 us (about a grpc_call_start_batch), which an inline fan-out would add
 * to every append under the driver's lock; with the dispatcher notify
 * takes 2-3 us at p50 (packing, one FIFO push, one wake-up) whatever the
 * number of subscribers, for a delivery latency of a few tens of us that
 * no streaming client notices. One dispatcher also makes per-session order
 * hold trivially: the driver calls notify in revision order per session,
 * the FIFO keeps that order, and a single thread consumes it. The FIFO is
 * bounded (FIFO_MAX): should the dispatcher fall that far behind, the
 * subscribers of a change that finds it full are ended as if they had
 * fallen behind, so that memory stays bounded and nobody sees a gap.
 *
 * A dispatcher delivers late, so a subscriber that registered after a
 * notify could receive that older event: each FIFO entry carries a ticket
 * taken under the table lock, each subscriber the ticket current when it
 * registered, and an entry goes only to subscribers registered before it
 * (exactly the ones that a synchronous fan-out would have reached).
 *
 * Subscribers. Each has a bounded queue of live changes (a change too large
 * for one event queues its first, the others chained behind it), the
 * replay events in front of it once started, at most one event in flight
 * (the transport's send), and `ended` once it may no longer be sent to
 * (finished, or its stream broken); an ended subscriber drops its queue and
 * ignores events until it is unsubscribed. One ended as too slow whose
 * client reads nothing more is aborted after a grace (cfg.end_grace_us).
 *
 * Lock order (a lock may be taken while holding those to its left only):
 *
 *     hs->lock  ->  h->table_lock  ->  s->lock  ->  transport's own locks
 *
 *   h->table_lock  the session table, per-session subscriber counts, the
 *                  list of all subscribers, tickets, the shutdown flag.
 *                  Notify holds it for a lookup only and never waits on a
 *                  fan-out: the dispatcher holds hs->lock, not this one.
 *   hs->lock       one session's subscriber list: fan-out, link, unlink.
 *   s->lock        one subscriber's queue and state; held while calling
 *                  ops->send and ops->finish, so that a finish can never
 *                  slip between the decision to send and the send. A
 *                  histd_hub_sent from another thread while send is still
 *                  on the stack waits for it on s->lock; so ops->send and
 *                  ops->finish must not call into the hub on their own
 *                  thread.
 *   h->fifo_lock   the FIFO and the dispatcher's sleep; innermost: no other
 *                  lock is taken while it is held.
 */
#include "hub.h"

#include <assert.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "google/protobuf/timestamp.pb-c.h"
#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"
#include "histd_wire.h"

/* HistoryEvent fields (histd.proto). */
enum {
	EV_SESSION_ID = 1,
	EV_REVISION = 2,
	EV_TIME = 3,
	EV_APPENDED = 10,
	EV_CLEARED = 11,
	EV_REPLACED = 12,
	EV_REDUCED = 13,
	EV_DELETED = 14,
	EV_UPDATED = 16,
	EV_PLUGIN_ERROR = 15,
};

/* ---------------------------------------------------------------------- */
/* Events                                                                  */

void
histd_event_ref(histd_event *ev)
{
	__atomic_fetch_add(&ev->refs, 1, __ATOMIC_RELAXED);
}

/* Freeing an event drops its reference on the next part of its change. */
void
histd_event_unref(histd_event *ev)
{
	histd_event *next;

	while (ev && __atomic_sub_fetch(&ev->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		next = ev->next_part;
		free(ev);
		ev = next;
	}
}

static size_t
key_size(uint32_t field)
{
	return histd_wire_varint_size((uint64_t)field << 3);
}

/* A length-delimited field: key, length, payload. */
static size_t
len_field_size(uint32_t field, size_t len)
{
	return key_size(field) + histd_wire_varint_size(len) + len;
}

/* A varint field; proto3 leaves out zero. */
static size_t
varint_field_size(uint32_t field, uint64_t v)
{
	return v ? key_size(field) + histd_wire_varint_size(v) : 0;
}

static size_t
put_varint_field(uint8_t *p, uint32_t field, uint64_t v)
{
	size_t n;

	if (!v)
		return 0;
	n = histd_wire_put_varint(p, (uint64_t)field << 3);
	return n + histd_wire_put_varint(p + n, v);
}

/* Microseconds to Timestamp seconds and nanos (nanos always >= 0). */
static void
us_split(int64_t us, int64_t *sec, int32_t *nanos)
{
	int64_t s = us / 1000000, r = us % 1000000;

	if (r < 0) {
		r += 1000000;
		s--;
	}
	*sec = s;
	*nanos = (int32_t)(r * 1000);
}

/*
 * What goes inside the event's oneof field: each record as field 1 (the
 * repeated messages, or the one summary or session), then up to two
 * optional varint fields (cleared_to_seq; system_kept).
 */
struct ev_body {
	uint32_t field;               /* EV_APPENDED .. EV_UPDATED */
	const histd_record *recs;
	size_t n_recs;
	uint32_t num_field;           /* 0: none */
	uint64_t num;
	uint32_t num2_field;          /* 0: none */
	uint64_t num2;
};

static histd_event *
event_build(const char *session_id, uint64_t revision,
	    enum histd_change_kind kind, uint64_t last_seq,
	    const struct ev_body *b)
{
	size_t sid_len = session_id ? strlen(session_id) : 0;
	size_t inner = 0, ts_len, total, i;
	int64_t sec;
	int32_t nanos;
	histd_event *ev;
	uint8_t *p;

	us_split(histd_now_us(), &sec, &nanos);
	ts_len = varint_field_size(1, (uint64_t)sec) +
		 varint_field_size(2, (uint64_t)(int64_t)nanos);
	for (i = 0; i < b->n_recs; i++)
		inner += len_field_size(1, b->recs[i].len);
	if (b->num_field)
		inner += varint_field_size(b->num_field, b->num);
	if (b->num2_field)
		inner += varint_field_size(b->num2_field, b->num2);
	total = (sid_len ? len_field_size(EV_SESSION_ID, sid_len) : 0) +
		varint_field_size(EV_REVISION, revision) +
		len_field_size(EV_TIME, ts_len) +
		len_field_size(b->field, inner);

	ev = malloc(sizeof(*ev) + total);
	if (!ev)
		return NULL;
	ev->refs = 1;
	ev->kind = kind;
	ev->revision = revision;
	ev->last_seq = last_seq;
	ev->cleared_to_seq = 0;
	ev->next_part = NULL;
	ev->incarnation = 0;    /* histd_hub_notify sets a change's */
	ev->len = total;

	p = ev->data;
	if (sid_len) {
		p += histd_wire_put_len_key(p, EV_SESSION_ID, sid_len);
		memcpy(p, session_id, sid_len);
		p += sid_len;
	}
	p += put_varint_field(p, EV_REVISION, revision);
	p += histd_wire_put_len_key(p, EV_TIME, ts_len);
	p += put_varint_field(p, 1, (uint64_t)sec);
	p += put_varint_field(p, 2, (uint64_t)(int64_t)nanos);
	p += histd_wire_put_len_key(p, b->field, inner);
	for (i = 0; i < b->n_recs; i++) {
		p += histd_wire_put_len_key(p, 1, b->recs[i].len);
		if (b->recs[i].len)
			memcpy(p, b->recs[i].data, b->recs[i].len);
		p += b->recs[i].len;
	}
	if (b->num_field)
		p += put_varint_field(p, b->num_field, b->num);
	if (b->num2_field)
		p += put_varint_field(p, b->num2_field, b->num2);
	assert(p == ev->data + total);
	return ev;
}

/* An event whose oneof field (plugin_error) holds `body` as its bytes. */
static histd_event *
event_build_raw(const char *session_id, uint64_t revision,
		const uint8_t *body, size_t body_len)
{
	size_t sid_len = session_id ? strlen(session_id) : 0, ts_len, total;
	int64_t sec;
	int32_t nanos;
	histd_event *ev;
	uint8_t *p;

	us_split(histd_now_us(), &sec, &nanos);
	ts_len = varint_field_size(1, (uint64_t)sec) +
		 varint_field_size(2, (uint64_t)(int64_t)nanos);
	total = (sid_len ? len_field_size(EV_SESSION_ID, sid_len) : 0) +
		varint_field_size(EV_REVISION, revision) +
		len_field_size(EV_TIME, ts_len) +
		len_field_size(EV_PLUGIN_ERROR, body_len);
	if (!(ev = malloc(sizeof(*ev) + total)))
		return NULL;
	ev->refs = 1;
	ev->kind = (enum histd_change_kind)HISTD_EVENT_PLUGIN_ERROR;
	ev->revision = revision;
	ev->last_seq = 0;
	ev->cleared_to_seq = 0;
	ev->next_part = NULL;
	ev->incarnation = 0;    /* the publisher sets the error's */
	ev->len = total;
	p = ev->data;
	if (sid_len) {
		p += histd_wire_put_len_key(p, EV_SESSION_ID, sid_len);
		memcpy(p, session_id, sid_len);
		p += sid_len;
	}
	p += put_varint_field(p, EV_REVISION, revision);
	p += histd_wire_put_len_key(p, EV_TIME, ts_len);
	p += put_varint_field(p, 1, (uint64_t)sec);
	p += put_varint_field(p, 2, (uint64_t)(int64_t)nanos);
	p += histd_wire_put_len_key(p, EV_PLUGIN_ERROR, body_len);
	memcpy(p, body, body_len);
	p += body_len;
	assert(p == ev->data + total);
	return ev;
}

static uint64_t
records_max_seq(const histd_record *r, size_t n)
{
	uint64_t m = 0;
	size_t i;

	for (i = 0; i < n; i++)
		if (r[i].seq > m)
			m = r[i].seq;
	return m;
}

/* A SessionReplaced accounts for every seq up to cleared_to_seq and holds
 * the messages after it. */
static histd_event *
event_replaced(const char *session_id, uint64_t revision,
	       const histd_record *recs, size_t n, uint64_t cleared_to_seq)
{
	struct ev_body b = {
		.field = EV_REPLACED, .recs = recs, .n_recs = n,
		.num_field = 2, .num = cleared_to_seq,
	};
	uint64_t last = records_max_seq(recs, n);
	histd_event *ev;

	ev = event_build(session_id, revision, HISTD_CHANGE_REPLACED,
			 last > cleared_to_seq ? last : cleared_to_seq, &b);
	if (ev)
		ev->cleared_to_seq = cleared_to_seq;
	return ev;
}

static histd_event *
event_appended(const char *session_id, uint64_t revision,
	       const histd_record *recs, size_t n)
{
	struct ev_body b = { .field = EV_APPENDED, .recs = recs, .n_recs = n };

	return event_build(session_id, revision, HISTD_CHANGE_APPENDED,
			   records_max_seq(recs, n), &b);
}

/*
 * Packs a Histd__V1__Session from a histd_session into malloc'ed bytes.
 * The map entries are built in one allocation: pointer arrays first, then
 * the entries themselves.
 */
static uint8_t *
session_pack(const histd_session *s, size_t *len_out)
{
	Histd__V1__Session ps = HISTD__V1__SESSION__INIT;
	Histd__V1__SessionStats st = HISTD__V1__SESSION_STATS__INIT;
	Google__Protobuf__Timestamp ca = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Google__Protobuf__Timestamp ua = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	Histd__V1__SessionConfig *cfg = NULL;
	Histd__V1__Session__ContextKeysEntry *ck;
	Histd__V1__Session__LabelsEntry *lb;
	size_t nck = s->n_context_keys, nlb = s->n_labels, i, len;
	void **mem;
	uint8_t *buf = NULL;

	mem = malloc((nck + nlb) * sizeof(void *) + nck * sizeof(*ck) +
		     nlb * sizeof(*lb) + 1);
	if (!mem)
		return NULL;
	ps.context_keys = (Histd__V1__Session__ContextKeysEntry **)mem;
	ps.labels = (Histd__V1__Session__LabelsEntry **)(mem + nck);
	ck = (Histd__V1__Session__ContextKeysEntry *)(mem + nck + nlb);
	lb = (Histd__V1__Session__LabelsEntry *)(ck + nck);
	for (i = 0; i < nck; i++) {
		Histd__V1__Session__ContextKeysEntry e =
			HISTD__V1__SESSION__CONTEXT_KEYS_ENTRY__INIT;

		e.key = s->context_keys[i].key;
		e.value = s->context_keys[i].value;
		ck[i] = e;
		ps.context_keys[i] = &ck[i];
	}
	for (i = 0; i < nlb; i++) {
		Histd__V1__Session__LabelsEntry e =
			HISTD__V1__SESSION__LABELS_ENTRY__INIT;

		e.key = s->labels[i].key;
		e.value = s->labels[i].value;
		lb[i] = e;
		ps.labels[i] = &lb[i];
	}
	ps.n_context_keys = nck;
	ps.n_labels = nlb;
	ps.id = s->id ? s->id : "";

	if (s->config) {
		cfg = histd__v1__session_config__unpack(NULL, s->config_len,
							s->config);
		if (!cfg)
			goto out;
		ps.config = cfg;
	}
	us_split(s->created_at_us, &ca.seconds, &ca.nanos);
	us_split(s->updated_at_us, &ua.seconds, &ua.nanos);
	ps.created_at = &ca;
	ps.updated_at = &ua;
	ps.revision = s->revision;
	st.message_count = s->message_count;
	st.token_estimate = s->token_total;
	st.bytes = s->bytes_total;
	st.last_seq = s->last_seq;
	st.first_seq = s->first_seq;
	st.summary_count = s->summary_count;
	ps.stats = &st;

	len = histd__v1__session__get_packed_size(&ps);
	buf = malloc(len ? len : 1);
	if (buf) {
		histd__v1__session__pack(&ps, buf);
		*len_out = len;
	}
out:
	if (cfg)
		histd__v1__session_config__free_unpacked(cfg, NULL);
	free(mem);
	return buf;
}

/* Whether the driver left out records a change of this kind needs (a
 * change another replica made). An empty replace may come with no array. */
static int
change_lacks_records(const histd_change *c)
{
	switch (c->kind) {
	case HISTD_CHANGE_APPENDED:
		return !c->records || c->n_records == 0;
	case HISTD_CHANGE_REPLACED:
		return !c->records && c->n_records > 0;
	case HISTD_CHANGE_SUMMARY:
		return !c->records || c->n_records != 1;
	case HISTD_CHANGE_UPDATED:
		return !c->session;
	default:
		return 0;
	}
}

histd_event *
histd_event_from_change(const histd_change *c)
{
	struct ev_body b = { 0 };
	const char *sid = c->session_id;
	histd_event *ev;
	histd_record rec;
	uint8_t *buf;
	size_t len = 0;

	if (change_lacks_records(c))
		return NULL;
	switch (c->kind) {
	case HISTD_CHANGE_APPENDED:
		return event_appended(sid, c->revision, c->records,
				      c->n_records);
	case HISTD_CHANGE_CLEARED:
		b.field = EV_CLEARED;
		b.num_field = 1;
		b.num = c->cleared_to_seq;
		/* SessionCleared.system_kept: a truncate kept them. */
		b.num2_field = 2;
		b.num2 = c->system_kept ? 1 : 0;
		ev = event_build(sid, c->revision, c->kind,
				 c->cleared_to_seq, &b);
		if (ev)
			ev->cleared_to_seq = c->cleared_to_seq;
		return ev;
	case HISTD_CHANGE_REPLACED:
		return event_replaced(sid, c->revision, c->records,
				      c->n_records, c->cleared_to_seq);
	case HISTD_CHANGE_SUMMARY:
		b.field = EV_REDUCED;
		b.recs = c->records;
		b.n_recs = 1;
		return event_build(sid, c->revision, c->kind, 0, &b);
	case HISTD_CHANGE_DELETED:
		b.field = EV_DELETED;
		return event_build(sid, c->revision, c->kind, 0, &b);
	case HISTD_CHANGE_UPDATED:
		buf = session_pack(c->session, &len);
		if (!buf)
			return NULL;
		memset(&rec, 0, sizeof(rec));
		rec.data = buf;
		rec.len = (uint32_t)len;
		b.field = EV_UPDATED;
		b.recs = &rec;
		b.n_recs = 1;
		ev = event_build(sid, c->revision, c->kind, 0, &b);
		free(buf);
		return ev;
	}
	return NULL;
}

/* Room in a replay event for everything but its messages: the session id
 * (at most 128 characters), revision, time and the oneof's own framing. */
#define REPLAY_EVENT_OVERHEAD 512

/* How many of the n records from v fit one replay event: at most chunk,
 * at most max_bytes of event (0: no byte bound), and at least one. */
static size_t
replay_take(const histd_record *v, size_t n, size_t chunk, size_t max_bytes)
{
	size_t k, bytes = REPLAY_EVENT_OVERHEAD;

	for (k = 0; k < n && k < chunk; k++) {
		bytes += len_field_size(1, v[k].len);
		if (max_bytes && k > 0 && bytes > max_bytes)
			break;
	}
	return k ? k : 1;
}

int
histd_event_replay(const char *session_id, uint64_t revision,
		   const histd_records *records, int replaced,
		   uint64_t cleared_to_seq, size_t chunk, size_t max_bytes,
		   histd_event ***out, size_t *n_out)
{
	const histd_record *v = records ? records->v : NULL;
	size_t n = records ? records->n : 0, count = 0, cap, from, k;
	histd_event **evs;

	*out = NULL;
	*n_out = 0;
	if (!replaced && n == 0)
		return 0;
	if (chunk == 0)
		chunk = n ? n : 1;
	/* The replaced event is bounded by bytes only: it holds as many as
	 * fit, and appended events at the same revision hold the rest. */
	cap = n + 1;
	evs = calloc(cap, sizeof(*evs));
	if (!evs)
		goto nomem;
	for (from = 0; from < n || (replaced && count == 0); from += k) {
		k = n - from ? replay_take(v + from, n - from,
					  count == 0 && replaced ? n : chunk,
					  max_bytes) : 0;
		if (count == 0 && replaced)
			evs[count] = event_replaced(session_id, revision,
						    v + from, k,
						    cleared_to_seq);
		else
			evs[count] = event_appended(session_id, revision,
						    v + from, k);
		if (!evs[count]) {
			while (count--)
				histd_event_unref(evs[count]);
			free(evs);
			goto nomem;
		}
		count++;
	}
	*out = evs;
	*n_out = count;
	return 0;
nomem:
	return histd_error_set(HISTD_ENOMEM,
			       "out of memory building replay events");
}

/* ---------------------------------------------------------------------- */
/* The hub                                                                 */

/* The subscribers of one (tenant, session id). */
struct hub_session {
	struct hub_session *next;     /* hash chain; table lock */
	uint64_t hash;
	int refs;                     /* atomic: the table while in it, each
	                               * subscriber, each FIFO entry */
	int in_table;                 /* table lock */
	size_t n_subs;                /* table lock */
	size_t n_ended;               /* atomic: of those, ended ones */
	pthread_mutex_t lock;
	histd_sub *subs;              /* lock */
	/* FIFO entries of this session not yet fanned out, and the lowest
	 * cleared_to_seq among them (0: none removed messages; kept until
	 * the count is 0 again): a stream ended before they reach it must
	 * resume at or below it. h->fifo_lock. */
	size_t queued;
	uint64_t queued_cleared;
	size_t key_len;
	char key[];                   /* tenant '\0' session id */
};

struct histd_sub {
	histd_hub *h;
	struct hub_session *hs;
	histd_sub *prev, *next;       /* hs->subs; hs->lock */
	histd_sub *all_prev, *all_next; /* h->all; table lock */
	uint64_t since;               /* ticket at registration */
	histd_sub_ops ops;
	void *stream;

	pthread_mutex_t lock;         /* all below */
	histd_event **live;           /* ring of live events */
	size_t live_cap, live_head, live_n;
	histd_event *live_part;       /* the next part of the live change
	                               * being sent (own reference) */
	histd_event **replay;         /* replay events not yet sent */
	size_t replay_n, replay_pos;
	int replay_more;              /* more replay to come (ops.more) */
	int replay_asked;             /* ops.more called, not answered */
	histd_event *in_flight;
	uint64_t snapshot_rev;
	uint64_t incarnation;         /* the snapshot's session life; 0:
	                               * unknown, or not started */
	uint64_t delivered_seq;       /* highest last_seq sent ok, or the
	                               * after_seq it started from */
	uint64_t sent_rev;            /* highest revision handed to send */
	uint64_t known_rev;           /* highest revision of a change queued
	                               * here, or of the snapshot */
	int started;
	int ended;                    /* finished or broken: send no more */
	int deleted_queued;
	/* Ended as too slow with a send in flight (its status waits for it),
	 * since ended_us (histd_mono_us); end_resume: the seq its status
	 * names. Counted in h->n_lingering. */
	int lingering;
	int64_t ended_us;
	uint64_t end_resume;
};

struct fifo_entry {
	struct hub_session *hs;
	histd_event *ev;
	uint64_t ticket;
};

struct histd_hub {
	histd_hub_config cfg;
	atomic_size_t n_subs;         /* notify's fast path reads it unlocked */

	pthread_mutex_t table_lock;
	struct hub_session **buckets;
	size_t n_buckets;             /* a power of two */
	size_t n_sessions;
	histd_sub *all;
	uint64_t ticket;
	int shutdown;

	pthread_mutex_t fifo_lock;
	pthread_cond_t fifo_cond;
	struct fifo_entry *fifo;      /* ring */
	size_t fifo_cap, fifo_head, fifo_n;
	int stop;
	pthread_t dispatcher;
	/* Streams ended as too slow whose status waits on a send; the
	 * dispatcher aborts those that wait longer than cfg.end_grace_us. */
	atomic_size_t n_lingering;
	int64_t next_reap_us;         /* fifo_lock */
};

#define INITIAL_BUCKETS 64
/* Changes waiting for the dispatcher, in all sessions. */
#define FIFO_MAX 65536

static uint64_t
key_hash(const char *tenant, const char *sid)
{
	uint64_t x = 1469598103934665603ULL;
	const unsigned char *p;

	for (p = (const unsigned char *)tenant; *p; p++)
		x = (x ^ *p) * 1099511628211ULL;
	x *= 1099511628211ULL; /* the '\0' between them */
	for (p = (const unsigned char *)sid; *p; p++)
		x = (x ^ *p) * 1099511628211ULL;
	return x;
}

/* With the table lock. */
static struct hub_session *
table_find(histd_hub *h, const char *tenant, const char *sid, uint64_t hash)
{
	size_t tl = strlen(tenant), sl = strlen(sid);
	struct hub_session *hs;

	for (hs = h->buckets[hash & (h->n_buckets - 1)]; hs; hs = hs->next)
		if (hs->hash == hash && hs->key_len == tl + 1 + sl &&
		    memcmp(hs->key, tenant, tl + 1) == 0 &&
		    memcmp(hs->key + tl + 1, sid, sl) == 0)
			return hs;
	return NULL;
}

/* With the table lock. A failed grow only makes chains longer. */
static void
table_grow(histd_hub *h)
{
	size_t nb = h->n_buckets * 2, i;
	struct hub_session **b = calloc(nb, sizeof(*b));

	if (!b)
		return;
	for (i = 0; i < h->n_buckets; i++) {
		struct hub_session *hs = h->buckets[i], *next;

		for (; hs; hs = next) {
			next = hs->next;
			hs->next = b[hs->hash & (nb - 1)];
			b[hs->hash & (nb - 1)] = hs;
		}
	}
	free(h->buckets);
	h->buckets = b;
	h->n_buckets = nb;
}

/* With the table lock. */
static void
table_remove(histd_hub *h, struct hub_session *hs)
{
	struct hub_session **pp = &h->buckets[hs->hash & (h->n_buckets - 1)];

	while (*pp != hs)
		pp = &(*pp)->next;
	*pp = hs->next;
	hs->next = NULL;
	hs->in_table = 0;
	h->n_sessions--;
}

static void
hs_ref(struct hub_session *hs)
{
	__atomic_fetch_add(&hs->refs, 1, __ATOMIC_RELAXED);
}

/* Once out of the table nobody can find a session to take a new reference,
 * so the last unref frees it without a lock. */
static void
hs_unref(struct hub_session *hs)
{
	if (__atomic_sub_fetch(&hs->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		pthread_mutex_destroy(&hs->lock);
		free(hs);
	}
}

/* With the table lock: a new session in the table, holding the table's
 * reference. */
static struct hub_session *
table_insert(histd_hub *h, const char *tenant, const char *sid,
	     uint64_t hash)
{
	size_t tl = strlen(tenant), sl = strlen(sid);
	struct hub_session *hs = calloc(1, sizeof(*hs) + tl + 1 + sl + 1);
	size_t b;

	if (!hs)
		return NULL;
	if (pthread_mutex_init(&hs->lock, NULL) != 0) {
		free(hs);
		return NULL;
	}
	memcpy(hs->key, tenant, tl + 1);
	memcpy(hs->key + tl + 1, sid, sl + 1);
	hs->key_len = tl + 1 + sl;
	hs->hash = hash;
	hs->refs = 1;
	hs->in_table = 1;
	if (h->n_sessions >= h->n_buckets)
		table_grow(h);
	b = hash & (h->n_buckets - 1);
	hs->next = h->buckets[b];
	h->buckets[b] = hs;
	h->n_sessions++;
	return hs;
}

/* ---------------------------------------------------------------------- */
/* One subscriber; every function here runs with s->lock held.             */

static histd_event *
live_at(histd_sub *s, size_t i)
{
	return s->live[(s->live_head + i) % s->live_cap];
}

static void
sub_drop_queue(histd_sub *s)
{
	size_t i;

	for (i = 0; i < s->live_n; i++)
		histd_event_unref(live_at(s, i));
	free(s->live);
	s->live = NULL;
	s->live_cap = s->live_head = s->live_n = 0;
	histd_event_unref(s->live_part);
	s->live_part = NULL;
	for (i = s->replay_pos; i < s->replay_n; i++)
		histd_event_unref(s->replay[i]);
	free(s->replay);
	s->replay = NULL;
	s->replay_n = s->replay_pos = 0;
}

/* The stream cannot send any more: stop, without a status. */
static void
sub_break(histd_sub *s)
{
	if (!s->ended)
		__atomic_fetch_add(&s->hs->n_ended, 1, __ATOMIC_RELAXED);
	s->ended = 1;
	sub_drop_queue(s);
}

static void
sub_linger_stop(histd_sub *s)
{
	if (s->lingering) {
		s->lingering = 0;
		atomic_fetch_sub(&s->h->n_lingering, 1);
	}
}

/* s was ended as too slow and its status waits for the send in flight:
 * the dispatcher aborts it if that send takes longer than the grace. */
static void
sub_linger(histd_sub *s, uint64_t resume)
{
	histd_hub *h = s->h;

	s->lingering = 1;
	s->ended_us = histd_mono_us();
	s->end_resume = resume;
	if (atomic_fetch_add(&h->n_lingering, 1) == 0) {
		/* The dispatcher may sleep with no time limit. */
		pthread_mutex_lock(&h->fifo_lock);
		pthread_cond_signal(&h->fifo_cond);
		pthread_mutex_unlock(&h->fifo_lock);
	}
}

/* Lowers *resume to cleared_to_seq, the seq up to which a change removed
 * messages (0: none), if below. */
static void
resume_below_removal(uint64_t *resume, uint64_t cleared_to_seq)
{
	if (cleared_to_seq && cleared_to_seq < *resume)
		*resume = cleared_to_seq;
}

/* Ends the stream with a status, once. lost_cleared_to_seq: that of a
 * change that cannot be queued (0: none); it bounds the resume seq, like
 * those of the queued events the stream drops. */
static void
sub_end(histd_sub *s, int err, const char *msg, uint64_t lost_cleared_to_seq)
{
	uint64_t resume = s->delivered_seq;
	size_t i;

	if (s->ended)
		return;
	/* The status goes out after the send in flight: the client has that
	 * event too when it reads the status (if the send fails, the stream
	 * is broken and no status arrives at all). */
	if (s->in_flight && s->in_flight->last_seq > resume)
		resume = s->in_flight->last_seq;
	/* A clear or truncate (retention) the client never gets removed seqs
	 * it holds: resuming at or below its cleared_to_seq makes the replay a
	 * replaced event that says so. Resuming above it, the client would
	 * keep them. */
	for (i = s->replay_pos; i < s->replay_n; i++)
		resume_below_removal(&resume, s->replay[i]->cleared_to_seq);
	for (i = 0; i < s->live_n; i++)
		resume_below_removal(&resume, live_at(s, i)->cleared_to_seq);
	resume_below_removal(&resume, lost_cleared_to_seq);
	sub_break(s);
	s->ops.finish(s->stream, err, msg, resume);
	if (err == HISTD_ELIMIT && s->in_flight && s->ops.abort &&
	    s->h->cfg.end_grace_us > 0)
		sub_linger(s, resume);
}

/*
 * A plugin error carries the revision its reporter read, which a change
 * committed meanwhile may already have passed (or a snapshot, for an error
 * queued before the replay). History is unchanged by the failure, so it is
 * just as true at the later revision: a copy of ev at `revision`, with one
 * reference; NULL if out of memory (the error then goes out as it came).
 */
static histd_event *
event_restamped(const histd_event *ev, uint64_t revision)
{
	Histd__V1__HistoryEvent *e;
	histd_event *out = NULL;
	size_t len;

	e = histd__v1__history_event__unpack(NULL, ev->len, ev->data);
	if (!e)
		return NULL;
	e->revision = revision;
	len = histd__v1__history_event__get_packed_size(e);
	if ((out = malloc(sizeof(*out) + len))) {
		out->refs = 1;
		out->kind = ev->kind;
		out->revision = revision;
		out->last_seq = ev->last_seq;
		out->cleared_to_seq = ev->cleared_to_seq;
		out->next_part = NULL;
		out->incarnation = ev->incarnation;
		out->len = histd__v1__history_event__pack(e, out->data);
	}
	histd__v1__history_event__free_unpacked(e, NULL);
	return out;
}

/* Starts the next send if the subscriber may send and nothing is in
 * flight: replay events first, then live ones. */
static void
sub_pump(histd_sub *s)
{
	histd_event *ev;

	if (!s->started || s->ended || s->in_flight)
		return;
	if (s->replay_pos < s->replay_n) {
		ev = s->replay[s->replay_pos];
		s->replay[s->replay_pos++] = NULL;
	} else if (s->replay_more) {
		/* Live events wait for the rest of the replay. */
		if (!s->replay_asked) {
			s->replay_asked = 1;
			if (!s->ops.more || s->ops.more(s->stream) != 0)
				sub_break(s);
		}
		return;
	} else if (s->live_part || s->live_n) {
		/* The rest of a change that came in parts goes before the
		 * next change. */
		if (s->live_part) {
			ev = s->live_part;
		} else {
			ev = s->live[s->live_head];
			s->live_head = (s->live_head + 1) % s->live_cap;
			s->live_n--;
		}
		s->live_part = ev->next_part;
		if (s->live_part)
			histd_event_ref(s->live_part);
	} else {
		return;
	}
	/* Events go out in revision order, plugin errors too. */
	if ((int)ev->kind == HISTD_EVENT_PLUGIN_ERROR &&
	    ev->revision < s->sent_rev) {
		histd_event *later = event_restamped(ev, s->sent_rev);

		if (later) {
			histd_event_unref(ev);
			ev = later;
		}
	}
	if (ev->revision > s->sent_rev)
		s->sent_rev = ev->revision;
	s->in_flight = ev;
	if (s->ops.send(s->stream, ev) != 0) {
		s->in_flight = NULL;
		histd_event_unref(ev);
		sub_break(s);
	}
}

static int
sub_live_reserve(histd_sub *s)
{
	size_t cap, i;
	histd_event **v;

	if (s->live_n < s->live_cap)
		return 0;
	cap = s->live_cap ? s->live_cap * 2 : 8;
	if (cap > s->h->cfg.queue_max)
		cap = s->h->cfg.queue_max;
	v = malloc(cap * sizeof(*v));
	if (!v)
		return -1;
	for (i = 0; i < s->live_n; i++)
		v[i] = live_at(s, i);
	free(s->live);
	s->live = v;
	s->live_cap = cap;
	s->live_head = 0;
	return 0;
}

/* Whether a change to life `life` of the session (0: unknown) is to
 * another life than the one s follows (s->lock held). */
static int
other_life(const histd_sub *s, uint64_t life)
{
	return s->incarnation && life && life != s->incarnation;
}

static void
sub_live(histd_sub *s, histd_event *ev)
{
	char msg[128];

	/* Before the start, a deleted event may be another life's (its
	 * notice late): the start sorts them out. */
	if (s->ended || (s->started && s->deleted_queued) ||
	    other_life(s, ev->incarnation))
		return;
	/* The snapshot already holds it (the dispatcher may run late). A
	 * plugin error is no change: a snapshot never holds it. */
	if (s->started && ev->revision <= s->snapshot_rev &&
	    (int)ev->kind != HISTD_EVENT_PLUGIN_ERROR)
		return;
	if (s->live_n >= s->h->cfg.queue_max) {
		snprintf(msg, sizeof(msg), "subscriber fell behind: more than "
			 "%zu changes queued", s->h->cfg.queue_max);
		sub_end(s, HISTD_ELIMIT, msg, ev->cleared_to_seq);
		return;
	}
	if (sub_live_reserve(s) != 0) {
		sub_end(s, HISTD_ELIMIT, "out of memory queuing an event for "
			"the subscriber", ev->cleared_to_seq);
		return;
	}
	/* A plugin error carries the revision its reporter read, which a
	 * change not notified yet may have made (the postgres driver hands a
	 * change on after others can read it). Stamped at the last change
	 * this stream was given, it cannot go out before that change; and
	 * history is unchanged by the failure, so it is just as true there.
	 * (sub_pump restamps it up to what was sent, if lower.) */
	if ((int)ev->kind == HISTD_EVENT_PLUGIN_ERROR &&
	    ev->revision > s->known_rev) {
		histd_event *earlier = event_restamped(ev, s->known_rev);

		if (earlier)
			ev = earlier;   /* its one reference is the queue's */
		else
			histd_event_ref(ev);
	} else {
		if ((int)ev->kind != HISTD_EVENT_PLUGIN_ERROR &&
		    ev->revision > s->known_rev)
			s->known_rev = ev->revision;
		histd_event_ref(ev);
	}
	s->live[(s->live_head + s->live_n) % s->live_cap] = ev;
	s->live_n++;
	if (ev->kind == HISTD_CHANGE_DELETED)
		s->deleted_queued = 1;
	sub_pump(s);
}

/* ---------------------------------------------------------------------- */
/* Notify and the dispatcher                                               */

/* Delivers one FIFO entry to the session's subscribers that registered
 * before it was notified. */
static void
fan_out(struct fifo_entry *e)
{
	histd_sub *s;

	pthread_mutex_lock(&e->hs->lock);
	for (s = e->hs->subs; s; s = s->next) {
		if (s->since >= e->ticket)
			continue;
		pthread_mutex_lock(&s->lock);
		sub_live(s, e->ev);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&e->hs->lock);
}

/* Aborts the streams ended as too slow whose status has waited on a send
 * for the grace. */
static void
reap_lingering(histd_hub *h, int64_t now)
{
	char msg[200];
	histd_sub *s;

	pthread_mutex_lock(&h->table_lock);
	for (s = h->all; s && atomic_load(&h->n_lingering); s = s->all_next) {
		pthread_mutex_lock(&s->lock);
		if (s->lingering && now - s->ended_us >= h->cfg.end_grace_us) {
			uint64_t resume = s->end_resume;

			/* The event in flight never reached the client. */
			if (s->delivered_seq < resume)
				resume = s->delivered_seq;
			resume_below_removal(&resume,
					     s->in_flight->cleared_to_seq);
			sub_linger_stop(s);
			snprintf(msg, sizeof(msg), "subscriber fell behind, then "
				 "read nothing for %" PRId64 " s: stream "
				 "cancelled; subscribe again with after_seq %"
				 PRIu64, h->cfg.end_grace_us / 1000000, resume);
			s->ops.abort(s->stream, msg);
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&h->table_lock);
}

/* With fifo_lock: reaps lingering streams if it is time (dropping the lock
 * meanwhile); how long the dispatcher may sleep: -1 without limit. */
static int64_t
dispatch_reap(histd_hub *h)
{
	int64_t now, step = h->cfg.end_grace_us < 1000000 ?
			    h->cfg.end_grace_us : 1000000;

	if (!atomic_load(&h->n_lingering))
		return -1;
	now = histd_mono_us();
	if (now >= h->next_reap_us) {
		pthread_mutex_unlock(&h->fifo_lock);
		reap_lingering(h, now);
		pthread_mutex_lock(&h->fifo_lock);
		h->next_reap_us = now + step;
	}
	return h->next_reap_us - now;
}

/* With fifo_lock: waits for a notify, or wait_us at most (-1: no limit). */
static void
dispatch_sleep(histd_hub *h, int64_t wait_us)
{
	struct timespec ts;

	if (wait_us < 0) {
		pthread_cond_wait(&h->fifo_cond, &h->fifo_lock);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += wait_us / 1000000;
	ts.tv_nsec += (wait_us % 1000000) * 1000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_cond_timedwait(&h->fifo_cond, &h->fifo_lock, &ts);
}

static void *
dispatch_main(void *arg)
{
	histd_hub *h = arg;
	struct fifo_entry e;
	int64_t wait_us;

	pthread_mutex_lock(&h->fifo_lock);
	for (;;) {
		wait_us = dispatch_reap(h);
		if (h->fifo_n == 0 && !h->stop) {
			dispatch_sleep(h, wait_us);
			continue;
		}
		if (h->fifo_n == 0)
			break;
		e = h->fifo[h->fifo_head];
		h->fifo_head = (h->fifo_head + 1) % h->fifo_cap;
		h->fifo_n--;
		pthread_mutex_unlock(&h->fifo_lock);

		fan_out(&e);
		histd_event_unref(e.ev);

		pthread_mutex_lock(&h->fifo_lock);
		if (--e.hs->queued == 0)
			e.hs->queued_cleared = 0;
		/* Not under fifo_lock: the last reference takes the table's. */
		pthread_mutex_unlock(&h->fifo_lock);
		hs_unref(e.hs);
		pthread_mutex_lock(&h->fifo_lock);
	}
	pthread_mutex_unlock(&h->fifo_lock);
	return NULL;
}

/* Hands (hs, ev) with their references to the dispatcher; 0, or an error
 * message (nothing taken). */
static const char *
fifo_push(histd_hub *h, struct hub_session *hs, histd_event *ev,
	  uint64_t ticket)
{
	struct fifo_entry *e;

	pthread_mutex_lock(&h->fifo_lock);
	if (h->fifo_n >= FIFO_MAX) {
		pthread_mutex_unlock(&h->fifo_lock);
		return "subscriber fell behind: the server's event queue "
		       "is full";
	}
	if (h->fifo_n == h->fifo_cap) {
		size_t cap = h->fifo_cap ? h->fifo_cap * 2 : 64, i;
		struct fifo_entry *v = malloc(cap * sizeof(*v));

		if (!v) {
			pthread_mutex_unlock(&h->fifo_lock);
			return "out of memory queuing a subscriber event; "
			       "resubscribe to read it";
		}
		for (i = 0; i < h->fifo_n; i++)
			v[i] = h->fifo[(h->fifo_head + i) % h->fifo_cap];
		free(h->fifo);
		h->fifo = v;
		h->fifo_cap = cap;
		h->fifo_head = 0;
	}
	e = &h->fifo[(h->fifo_head + h->fifo_n) % h->fifo_cap];
	e->hs = hs;
	e->ev = ev;
	e->ticket = ticket;
	hs->queued++;
	resume_below_removal(&hs->queued_cleared, ev->cleared_to_seq);
	if (!hs->queued_cleared)
		hs->queued_cleared = ev->cleared_to_seq;
	/* The dispatcher sleeps only on an empty FIFO. */
	if (h->fifo_n++ == 0)
		pthread_cond_signal(&h->fifo_cond);
	pthread_mutex_unlock(&h->fifo_lock);
	return NULL;
}

/* The event for `ticket` cannot be delivered: end the subscribers it was
 * for, so that none of them sees a gap. They resume from the last seq they
 * received (or the change's cleared_to_seq, if it removed messages below
 * that) and read the rest from storage. */
static void
end_for_ticket(histd_hub *h, struct hub_session *hs, uint64_t ticket,
	       const char *msg, uint64_t cleared_to_seq, uint64_t incarnation)
{
	histd_sub *s;

	pthread_mutex_lock(&hs->lock);
	/* A clear, replace or truncate still in the FIFO (or being fanned
	 * out, waiting for hs->lock) will not reach the streams ended here:
	 * they resume at or below it too. */
	pthread_mutex_lock(&h->fifo_lock);
	resume_below_removal(&cleared_to_seq, hs->queued_cleared);
	if (!cleared_to_seq)
		cleared_to_seq = hs->queued_cleared;
	pthread_mutex_unlock(&h->fifo_lock);
	for (s = hs->subs; s; s = s->next) {
		if (s->since >= ticket)
			continue;
		pthread_mutex_lock(&s->lock);
		if (!other_life(s, incarnation))
			sub_end(s, HISTD_ELIMIT, msg, cleared_to_seq);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&hs->lock);
}

/* The seq up to which a change removed messages; 0 if it removed none. */
static uint64_t
change_cleared_to(const histd_change *c)
{
	return c->kind == HISTD_CHANGE_CLEARED ||
	       c->kind == HISTD_CHANGE_REPLACED ? c->cleared_to_seq : 0;
}

/* Whether an appended or replaced change makes an event larger than the
 * configured bound. */
static int
change_is_split(const histd_hub *h, const histd_change *c)
{
	size_t bytes = REPLAY_EVENT_OVERHEAD, i;

	if (!h->cfg.max_event_bytes || c->n_records < 2 ||
	    (c->kind != HISTD_CHANGE_APPENDED &&
	     c->kind != HISTD_CHANGE_REPLACED))
		return 0;
	for (i = 0; i < c->n_records; i++)
		bytes += len_field_size(1, c->records[i].len);
	return bytes > h->cfg.max_event_bytes;
}

/* A change too large for one event, as the events of a replay at its
 * revision chained behind the first (next_part): one FIFO entry, so that
 * nothing comes between the parts, and one place in each subscriber's
 * queue. NULL if out of memory. */
static histd_event *
event_split(const histd_hub *h, const histd_change *c)
{
	histd_records recs = {
		.v = (histd_record *)c->records, .n = c->n_records,
		.cap = c->n_records,
	};
	histd_event **evs = NULL, *ev = NULL;
	size_t n = 0, i;

	if (histd_event_replay(c->session_id, c->revision, &recs,
			       c->kind == HISTD_CHANGE_REPLACED,
			       c->cleared_to_seq, 0, h->cfg.max_event_bytes,
			       &evs, &n) != 0)
		return NULL;
	for (i = n; i > 1; i--)
		evs[i - 2]->next_part = evs[i - 1];
	if (n)
		ev = evs[0];
	free(evs);
	return ev;
}

void
histd_hub_notify(void *hub, const histd_change *c)
{
	histd_hub *h = hub;
	const char *tenant, *sid, *err;
	struct hub_session *hs;
	histd_event *ev;
	uint64_t hash, ticket;

	if (!h || !c || atomic_load(&h->n_subs) == 0)
		return;
	tenant = c->tenant ? c->tenant : "";
	sid = c->session_id ? c->session_id : "";
	hash = key_hash(tenant, sid);

	pthread_mutex_lock(&h->table_lock);
	hs = h->shutdown ? NULL : table_find(h, tenant, sid, hash);
	if (!hs || hs->n_subs == 0) {
		pthread_mutex_unlock(&h->table_lock);
		return;
	}
	hs_ref(hs);
	ticket = ++h->ticket;
	pthread_mutex_unlock(&h->table_lock);

	if (change_lacks_records(c)) {
		end_for_ticket(h, hs, ticket, "a change arrived without its "
			       "messages; resubscribe to read them",
			       change_cleared_to(c), c->incarnation);
		hs_unref(hs);
		return;
	}
	ev = change_is_split(h, c) ? event_split(h, c) :
				     histd_event_from_change(c);
	for (histd_event *part = ev; part; part = part->next_part)
		part->incarnation = c->incarnation;
	if (!ev)
		err = "out of memory building a subscriber event; resubscribe "
		      "to read it";
	else if (!(err = fifo_push(h, hs, ev, ticket)))
		return;
	end_for_ticket(h, hs, ticket, err, change_cleared_to(c),
		       c->incarnation);
	histd_event_unref(ev);
	hs_unref(hs);
}

void
histd_hub_publish_plugin_error(void *hub, const char *tenant,
			       const char *session_id, uint64_t revision,
			       uint64_t incarnation, const char *plugin,
			       const char *message, int will_retry)
{
	Histd__V1__PluginError pe = HISTD__V1__PLUGIN_ERROR__INIT;
	histd_hub *h = hub;
	struct hub_session *hs;
	histd_event *ev;
	uint64_t hash, ticket;
	const char *err;
	uint8_t *buf;
	size_t len;

	if (!h || !tenant || !session_id || atomic_load(&h->n_subs) == 0)
		return;
	hash = key_hash(tenant, session_id);
	pthread_mutex_lock(&h->table_lock);
	hs = h->shutdown ? NULL : table_find(h, tenant, session_id, hash);
	if (!hs || hs->n_subs == 0) {
		pthread_mutex_unlock(&h->table_lock);
		return;
	}
	hs_ref(hs);
	ticket = ++h->ticket;
	pthread_mutex_unlock(&h->table_lock);

	pe.plugin = (char *)(plugin ? plugin : "");
	pe.message = (char *)(message ? message : "");
	pe.will_retry = will_retry != 0;
	len = histd__v1__plugin_error__get_packed_size(&pe);
	ev = NULL;
	if ((buf = malloc(len ? len : 1))) {
		histd__v1__plugin_error__pack(&pe, buf);
		ev = event_build_raw(session_id, revision, buf, len);
		free(buf);
	}
	if (ev)
		ev->incarnation = incarnation;
	if (ev && !(err = fifo_push(h, hs, ev, ticket)))
		return;
	histd_event_unref(ev);
	hs_unref(hs);
}

/* ---------------------------------------------------------------------- */
/* Lifecycle                                                               */

int
histd_hub_new(histd_hub **out, const histd_hub_config *cfg)
{
	histd_hub *h;
	sigset_t all, old;
	int rc;

	if (!out || !cfg)
		return histd_error_set(HISTD_EINVALID, "hub config is required");
	if (cfg->queue_max == 0)
		return histd_error_set(HISTD_EINVALID,
				       "subscriber queue size must be > 0");
	h = calloc(1, sizeof(*h));
	if (!h)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	h->cfg = *cfg;
	atomic_init(&h->n_subs, 0);
	atomic_init(&h->n_lingering, 0);
	h->n_buckets = INITIAL_BUCKETS;
	h->buckets = calloc(h->n_buckets, sizeof(*h->buckets));
	if (!h->buckets) {
		free(h);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	pthread_mutex_init(&h->table_lock, NULL);
	pthread_mutex_init(&h->fifo_lock, NULL);
	pthread_cond_init(&h->fifo_cond, NULL);

	/* Signals belong to the threads that wait for them, not to ours. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&h->dispatcher, NULL, dispatch_main, h);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&h->fifo_cond);
		pthread_mutex_destroy(&h->fifo_lock);
		pthread_mutex_destroy(&h->table_lock);
		free(h->buckets);
		free(h);
		return histd_error_set(HISTD_ENOMEM,
				       "cannot start the hub's dispatcher thread");
	}
	*out = h;
	return 0;
}

void
histd_hub_free(histd_hub *h)
{
	size_t i;

	if (!h)
		return;
	/* The dispatcher drains the FIFO before it stops. */
	pthread_mutex_lock(&h->fifo_lock);
	h->stop = 1;
	pthread_cond_signal(&h->fifo_cond);
	pthread_mutex_unlock(&h->fifo_lock);
	pthread_join(h->dispatcher, NULL);

	/* Every subscriber is gone, so is every session but stragglers of a
	 * caller that broke the contract; free those that are empty. */
	for (i = 0; i < h->n_buckets; i++) {
		struct hub_session *hs = h->buckets[i], *next;

		for (; hs; hs = next) {
			next = hs->next;
			hs->in_table = 0;
			if (hs->n_subs == 0)
				hs_unref(hs);
		}
	}
	free(h->buckets);
	free(h->fifo);
	pthread_cond_destroy(&h->fifo_cond);
	pthread_mutex_destroy(&h->fifo_lock);
	pthread_mutex_destroy(&h->table_lock);
	free(h);
}

/* With hs->lock and the table lock: whether s may join hs; 0 or an error
 * with its message. */
static int
admit(histd_hub *h, struct hub_session *hs)
{
	if (h->shutdown)
		return histd_error_set(HISTD_EUNAVAILABLE,
				       "server is shutting down");
	if (h->cfg.max_subscribers &&
	    atomic_load(&h->n_subs) >= h->cfg.max_subscribers)
		return histd_error_set(HISTD_ELIMIT, "too many subscribers: "
				       "the server allows %zu",
				       h->cfg.max_subscribers);
	/* An ended stream that waits for its client to read its status
	 * leaves its place to a new one (its client's, often). */
	if (h->cfg.max_per_session &&
	    hs->n_subs - __atomic_load_n(&hs->n_ended, __ATOMIC_RELAXED) >=
	    h->cfg.max_per_session)
		return histd_error_set(HISTD_ELIMIT, "too many subscribers to "
				       "this session: at most %zu",
				       h->cfg.max_per_session);
	return 0;
}

int
histd_hub_subscribe(histd_hub *h, const char *tenant, const char *session_id,
		    uint64_t after_seq, const histd_sub_ops *ops, void *stream,
		    histd_sub **out)
{
	struct hub_session *hs;
	histd_sub *s;
	uint64_t hash;
	int rc, drop_table_ref;

	if (!h || !ops || !ops->send || !ops->finish || !out)
		return histd_error_set(HISTD_EINVALID,
				       "subscriber stream callbacks are required");
	if (!session_id || !*session_id)
		return histd_error_set(HISTD_EINVALID,
				       "session_id is required");
	if (!tenant)
		tenant = "";
	hash = key_hash(tenant, session_id);
	s = calloc(1, sizeof(*s));
	if (!s || pthread_mutex_init(&s->lock, NULL) != 0) {
		free(s);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	s->h = h;
	s->ops = *ops;
	s->stream = stream;
	s->delivered_seq = after_seq;

	/*
	 * Find or create the session and take a reference, then lock it
	 * before the table (the lock order) and check it is still in the
	 * table: its last subscriber may have left in between.
	 */
	for (;;) {
		pthread_mutex_lock(&h->table_lock);
		if (h->shutdown) {
			pthread_mutex_unlock(&h->table_lock);
			rc = histd_error_set(HISTD_EUNAVAILABLE,
					     "server is shutting down");
			goto fail;
		}
		hs = table_find(h, tenant, session_id, hash);
		if (!hs)
			hs = table_insert(h, tenant, session_id, hash);
		if (!hs) {
			pthread_mutex_unlock(&h->table_lock);
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto fail;
		}
		hs_ref(hs);
		pthread_mutex_unlock(&h->table_lock);

		pthread_mutex_lock(&hs->lock);
		pthread_mutex_lock(&h->table_lock);
		if (hs->in_table)
			break;
		pthread_mutex_unlock(&h->table_lock);
		pthread_mutex_unlock(&hs->lock);
		hs_unref(hs);
	}

	rc = admit(h, hs);
	if (rc != 0) {
		drop_table_ref = 0;
		if (hs->n_subs == 0) {
			table_remove(h, hs);
			drop_table_ref = 1;
		}
		pthread_mutex_unlock(&h->table_lock);
		pthread_mutex_unlock(&hs->lock);
		if (drop_table_ref)
			hs_unref(hs);
		hs_unref(hs);
		goto fail;
	}
	/* Events notified from here on (tickets > since) are ours; the
	 * dispatcher cannot fan out to hs before we link (we hold hs->lock). */
	s->since = h->ticket;
	s->hs = hs;
	hs->n_subs++;
	atomic_fetch_add(&h->n_subs, 1);
	s->all_next = h->all;
	if (h->all)
		h->all->all_prev = s;
	h->all = s;
	pthread_mutex_unlock(&h->table_lock);
	s->next = hs->subs;
	if (hs->subs)
		hs->subs->prev = s;
	hs->subs = s;
	pthread_mutex_unlock(&hs->lock);
	*out = s;
	return 0;

fail:
	pthread_mutex_destroy(&s->lock);
	free(s);
	return rc;
}

void
histd_hub_start(histd_sub *s, histd_event **replay, size_t n,
		uint64_t snapshot_revision)
{
	histd_hub_start_replay(s, replay, n, snapshot_revision, 0, 0);
}

/* With s->lock: takes over n replay events as those to send next (the
 * previous ones are all sent); 0, or -1 out of memory (ended). */
static int
sub_set_replay(histd_sub *s, histd_event **replay, size_t n)
{
	size_t i;

	free(s->replay);
	s->replay = NULL;
	s->replay_n = s->replay_pos = 0;
	if (!n)
		return 0;
	s->replay = malloc(n * sizeof(*s->replay));
	if (!s->replay) {
		for (i = 0; i < n; i++)
			histd_event_unref(replay[i]);
		sub_end(s, HISTD_ELIMIT, "out of memory queuing replay events",
			0);
		return -1;
	}
	memcpy(s->replay, replay, n * sizeof(*s->replay));
	s->replay_n = n;
	return 0;
}

void
histd_hub_replay_more(histd_sub *s, histd_event **replay, size_t n, int more)
{
	size_t i;

	pthread_mutex_lock(&s->lock);
	s->replay_asked = 0;
	if (s->ended) {
		pthread_mutex_unlock(&s->lock);
		for (i = 0; i < n; i++)
			histd_event_unref(replay[i]);
		return;
	}
	s->replay_more = more;
	if (sub_set_replay(s, replay, n) == 0)
		sub_pump(s);
	pthread_mutex_unlock(&s->lock);
}

void
histd_hub_start_replay(histd_sub *s, histd_event **replay, size_t n,
		       uint64_t snapshot_revision, uint64_t incarnation,
		       int more)
{
	size_t i, kept;

	pthread_mutex_lock(&s->lock);
	if (s->started || s->ended) {
		s->started = 1;
		pthread_mutex_unlock(&s->lock);
		for (i = 0; i < n; i++)
			histd_event_unref(replay[i]);
		return;
	}
	s->started = 1;
	s->snapshot_rev = snapshot_revision;
	s->incarnation = incarnation;
	/* The stream stands at the snapshot even if the replay is empty: a
	 * plugin error reported below it goes out at it. */
	if (snapshot_revision > s->sent_rev)
		s->sent_rev = snapshot_revision;
	if (snapshot_revision > s->known_rev)
		s->known_rev = snapshot_revision;

	/* Live events the snapshot already holds go, and so do changes to
	 * another life of the session and whatever follows a deletion. */
	kept = 0;
	s->deleted_queued = 0;
	for (i = 0; i < s->live_n; i++) {
		histd_event *ev = live_at(s, i);

		if ((ev->revision <= snapshot_revision &&
		     (int)ev->kind != HISTD_EVENT_PLUGIN_ERROR) ||
		    other_life(s, ev->incarnation) || s->deleted_queued) {
			histd_event_unref(ev);
			continue;
		}
		if (ev->kind == HISTD_CHANGE_DELETED)
			s->deleted_queued = 1;
		s->live[(s->live_head + kept++) % s->live_cap] = ev;
	}
	s->live_n = kept;

	s->replay_more = more;
	if (sub_set_replay(s, replay, n) == 0)
		sub_pump(s);
	pthread_mutex_unlock(&s->lock);
}

void
histd_hub_sent(histd_sub *s, int ok)
{
	histd_event *ev;

	pthread_mutex_lock(&s->lock);
	ev = s->in_flight;
	s->in_flight = NULL;
	if (ev) {
		sub_linger_stop(s);
		if (!ok) {
			sub_break(s);
		} else {
			if (ev->last_seq > s->delivered_seq)
				s->delivered_seq = ev->last_seq;
			if (ev->kind == HISTD_CHANGE_DELETED)
				sub_end(s, 0, "session was deleted", 0);
			else
				sub_pump(s);
		}
	}
	pthread_mutex_unlock(&s->lock);
	histd_event_unref(ev);
}

void
histd_hub_unsubscribe(histd_sub *s)
{
	histd_hub *h;
	struct hub_session *hs;
	int drop_table_ref = 0;

	if (!s)
		return;
	h = s->h;
	hs = s->hs;
	pthread_mutex_lock(&hs->lock);
	pthread_mutex_lock(&h->table_lock);
	if (s->all_prev)
		s->all_prev->all_next = s->all_next;
	else
		h->all = s->all_next;
	if (s->all_next)
		s->all_next->all_prev = s->all_prev;
	hs->n_subs--;
	atomic_fetch_sub(&h->n_subs, 1);
	if (hs->n_subs == 0 && hs->in_table) {
		table_remove(h, hs);
		drop_table_ref = 1;
	}
	pthread_mutex_unlock(&h->table_lock);
	if (s->prev)
		s->prev->next = s->next;
	else
		hs->subs = s->next;
	if (s->next)
		s->next->prev = s->prev;
	pthread_mutex_lock(&s->lock);
	if (s->ended)
		__atomic_fetch_sub(&hs->n_ended, 1, __ATOMIC_RELAXED);
	sub_linger_stop(s);
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&hs->lock);
	if (drop_table_ref)
		hs_unref(hs);
	hs_unref(hs);

	/* Unreachable now: no hub path can find s any more. */
	pthread_mutex_lock(&s->lock);
	sub_drop_queue(s);
	histd_event_unref(s->in_flight);
	s->in_flight = NULL;
	pthread_mutex_unlock(&s->lock);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

void
histd_hub_shutdown(histd_hub *h)
{
	histd_sub *s;

	if (!h)
		return;
	pthread_mutex_lock(&h->table_lock);
	h->shutdown = 1;
	for (s = h->all; s; s = s->all_next) {
		pthread_mutex_lock(&s->lock);
		sub_end(s, HISTD_EUNAVAILABLE, "server is shutting down", 0);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&h->table_lock);
}

size_t
histd_hub_count(histd_hub *h)
{
	return h ? atomic_load(&h->n_subs) : 0;
}
