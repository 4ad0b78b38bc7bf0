/*
 * The embedding worker (see embedder.h).
 */
#include "embedder.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "histd_wire.h"
#include "index/index.h"
#include "log.h"
#include "metrics.h"

#define PROVIDERS_MAX 8
#define RETRY_MAX_US (60 * 1000000LL)
/* Sessions whose embedded-to mark is remembered; past it, the table is
 * forgotten at once (the cost: backfills that re-embed). */
#define MARKS_MAX 200000
#define DROP_LOG_EVERY_US (60 * 1000000LL)

typedef struct job {
	struct job *next;
	char *tenant, *id;
	uint64_t life;          /* the session's incarnation */
	uint64_t first, last;   /* backfill: from the mark to the last seq */
	int backfill;
	int stale;              /* the session is another life now */
	uint32_t attempts;
	int64_t not_before_us;
} job;

/* Per session: every message with seq <= mark has its vector (or is
 * gone). emb: "provider\x1fmodel" the mark is for. none: the session has
 * no usable embeddings (its appends are not queued until it changes).
 * life: the session's incarnation the mark is of (0: none yet). A later
 * life of the id always has a greater incarnation (driver.h). */
typedef struct mark {
	struct mark *next;
	char *key;              /* tenant \x1f id */
	uint64_t life;
	char *emb;
	uint64_t mark;
	int backfill_queued;
	int none;
} mark;

typedef struct client_slot {
	const char *name;
	histd_embeddings *c;    /* NULL: no API key */
} client_slot;

struct histd_embedder {
	histd_driver *d;
	histd_embedder_config cfg;
	histd_search_embedder search;
	client_slot clients[PROVIDERS_MAX];
	size_t n_clients, n_usable;
	char *default_provider, *default_model;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	job *head, *tail;       /* ready, FIFO */
	job *delayed;           /* retries, unordered (few) */
	size_t waiting;
	int stopping;
	pthread_t *threads;
	int n_threads;
	mark **marks;
	size_t n_marks, n_buckets;
	int64_t last_drop_log_us;
	histd_embedder_stats st;
};

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static histd_embeddings *
client_of(histd_embedder *e, const char *provider)
{
	for (size_t i = 0; i < e->n_clients; i++)
		if (strcmp(e->clients[i].name, provider) == 0)
			return e->clients[i].c;
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Marks (under mu)                                                        */

static uint64_t
hash_str(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ULL;
	return h;
}

/* The hash of "tenant\x1fid", without building it. */
static uint64_t
hash_key(const char *tenant, const char *id)
{
	uint64_t h = hash_str(1469598103934665603ULL, tenant);

	return hash_str((h ^ 0x1f) * 1099511628211ULL, id);
}

static int
key_eq(const char *key, const char *tenant, const char *id)
{
	size_t tl = strlen(tenant);

	return strncmp(key, tenant, tl) == 0 && key[tl] == '\x1f' &&
	       strcmp(key + tl + 1, id) == 0;
}

static char *
mark_key(const char *tenant, const char *id)
{
	char *k;

	return asprintf(&k, "%s\x1f%s", tenant, id) < 0 ? NULL : k;
}

static void
marks_clear(histd_embedder *e)
{
	for (size_t i = 0; i < e->n_buckets; i++)
		for (mark *m = e->marks[i], *n; m; m = n) {
			n = m->next;
			free(m->key);
			free(m->emb);
			free(m);
		}
	if (e->marks)
		memset(e->marks, 0, e->n_buckets * sizeof(*e->marks));
	e->n_marks = 0;
}

static mark *
mark_find(histd_embedder *e, const char *tenant, const char *id, int create)
{
	size_t b = hash_key(tenant, id) & (e->n_buckets - 1);
	mark *m;

	for (m = e->marks[b]; m; m = m->next)
		if (key_eq(m->key, tenant, id))
			return m;
	if (!create)
		return NULL;
	if (e->n_marks >= MARKS_MAX) {
		marks_clear(e);
		b = hash_key(tenant, id) & (e->n_buckets - 1);
	}
	if (!(m = calloc(1, sizeof(*m))) || !(m->key = mark_key(tenant, id))) {
		free(m);
		return NULL;
	}
	m->next = e->marks[b];
	e->marks[b] = m;
	e->n_marks++;
	return m;
}

static void
mark_drop(histd_embedder *e, const char *tenant, const char *id)
{
	size_t b = hash_key(tenant, id) & (e->n_buckets - 1);

	for (mark **p = &e->marks[b]; *p; p = &(*p)->next)
		if (key_eq((*p)->key, tenant, id)) {
			mark *m = *p;

			*p = m->next;
			free(m->key);
			free(m->emb);
			free(m);
			e->n_marks--;
			return;
		}
}

/* m as the mark of the session's life `life`, nothing embedded yet. */
static void
mark_reset(mark *m, uint64_t life)
{
	m->life = life;
	m->mark = 0;
	m->none = 0;
	m->backfill_queued = 0;
	free(m->emb);
	m->emb = NULL;
}

/* The mark of j's life: m, reset first if it is of an earlier life; NULL
 * if it is of a later one (j is late). */
static mark *
mark_for(mark *m, const job *j)
{
	if (!m || m->life == j->life)
		return m;
	if (m->life > j->life)
		return NULL;
	mark_reset(m, j->life);
	return m;
}

/* ---------------------------------------------------------------------- */
/* The queue (under mu)                                                    */

static void
job_free(job *j)
{
	if (j) {
		free(j->tenant);
		free(j->id);
		free(j);
	}
}

static void
push_ready(histd_embedder *e, job *j)
{
	j->next = NULL;
	if (e->tail)
		e->tail->next = j;
	else
		e->head = j;
	e->tail = j;
}

static void
count_drop(histd_embedder *e)
{
	int64_t now = histd_mono_us();

	e->st.dropped++;
	histd_metrics_counter_add("histd_embedding_jobs_dropped_total",
				  "embedding jobs refused because the queue was full",
				  "", 1);
	if (now - e->last_drop_log_us >= DROP_LOG_EVERY_US) {
		e->last_drop_log_us = now;
		histd_log(HISTD_LOG_WARN, "embedding queue full: jobs dropped, "
			  "a semantic search will backfill them", NULL);
	}
}

/* Queues a job for messages first..last of the session's life `life`
 * (backfill: the mark onwards). */
static void
enqueue(histd_embedder *e, const char *tenant, const char *id, uint64_t life,
	uint64_t first, uint64_t last, int backfill)
{
	job *j;

	if (e->stopping)
		return;
	/* An append right after another to the same session: one job. */
	if (!backfill && e->tail && !e->tail->backfill && !e->tail->attempts &&
	    e->tail->life == life &&
	    e->tail->last + 1 == first && strcmp(e->tail->id, id) == 0 &&
	    strcmp(e->tail->tenant, tenant) == 0) {
		e->tail->last = last;
		return;
	}
	if (e->waiting >= e->cfg.queue_max) {
		count_drop(e);
		return;
	}
	if (!(j = calloc(1, sizeof(*j))) || !(j->tenant = strdup(tenant)) ||
	    !(j->id = strdup(id))) {
		job_free(j);
		count_drop(e);
		return;
	}
	j->life = life;
	j->first = first;
	j->last = last;
	j->backfill = backfill;
	push_ready(e, j);
	e->waiting++;
	e->st.queued++;
	pthread_cond_signal(&e->cv);
}

/* The next job ready to run, waiting for one; NULL when stopping. */
static job *
take(histd_embedder *e)
{
	for (;;) {
		int64_t now, next = 0;
		job **p;

		if (e->stopping)
			return NULL;
		now = histd_mono_us();
		for (p = &e->delayed; *p;) {
			job *j = *p;

			if (j->not_before_us <= now) {
				*p = j->next;
				push_ready(e, j);
				continue;
			}
			if (!next || j->not_before_us < next)
				next = j->not_before_us;
			p = &j->next;
		}
		if (e->head) {
			job *j = e->head;

			e->head = j->next;
			if (!e->head)
				e->tail = NULL;
			e->waiting--;
			return j;
		}
		if (next) {
			struct timespec ts;
			int64_t wait = next - now;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += (time_t)(wait / 1000000);
			ts.tv_nsec += (long)(wait % 1000000) * 1000;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&e->cv, &e->mu, &ts);
		} else {
			pthread_cond_wait(&e->cv, &e->mu);
		}
	}
}

/* ---------------------------------------------------------------------- */
/* The text of a message                                                   */

typedef struct tbuf {
	char *p;
	size_t len, max;
	int has_word;
} tbuf;

static void
text_piece(void *ctx, const char *text, size_t len, int is_tool)
{
	tbuf *t = ctx;
	size_t room;

	/* Tool results stay out, as they do of default lexical search. */
	if (is_tool || !len || t->len >= t->max)
		return;
	if (t->len)
		t->p[t->len++] = '\n';
	room = t->max - t->len;
	if (len > room) {
		len = room;
		/* Cut before a continuation byte: whole characters only. */
		while (len && ((unsigned char)text[len] & 0xc0) == 0x80)
			len--;
	}
	memcpy(t->p + t->len, text, len);
	t->len += len;
	for (size_t i = 0; i < len && !t->has_word; i++)
		if ((unsigned char)text[i] > ' ')
			t->has_word = 1;
}

/* The text to embed of a stored record: malloc'ed, or NULL when it has
 * none (images only, a tool result, ...) or memory ran out. */
static char *
record_text(const histd_record *r, uint32_t max)
{
	tbuf t = { .max = max };
	uint32_t role;

	if (!(t.p = malloc((size_t)max + 2)))
		return NULL;
	(void)histd_index_message_text(r->data, r->len, &role, text_piece, &t);
	if (!t.has_word) {
		free(t.p);
		return NULL;
	}
	t.p[t.len] = '\0';
	return t.p;
}

/* ---------------------------------------------------------------------- */
/* A job                                                                   */

typedef struct embed_target {
	const char *provider;
	const char *model;      /* effective: never "" */
	histd_embeddings *client;
} embed_target;

/* Counts one call to an embedding endpoint. */
static void
count_call(const char *provider, int rc)
{
	char labels[128];

	snprintf(labels, sizeof(labels), "provider=\"%s\",kind=\"embed\","
		 "result=\"%s\"", provider ? provider : "",
		 rc ? histd_error_name(rc) : "OK");
	histd_metrics_counter_add("histd_provider_calls_total",
				  "Calls to LLM providers by provider, kind and "
				  "result.", labels, 1);
}

/* 0 with j->stale set when the session is no longer the life j is for
 * (deleted, perhaps created again under its id with other messages at
 * the same seqs); else 0, or the error reading it. */
static int
check_life(histd_embedder *e, job *j)
{
	histd_session *s = NULL;
	int rc = histd_driver_session_get(e->d, j->tenant, j->id, &s);

	if (rc == HISTD_ENOTFOUND || (rc == 0 && s->incarnation != j->life))
		j->stale = 1;
	histd_session_free(s);
	return rc == HISTD_ENOTFOUND ? 0 : rc;
}

/* Embeds and stores texts[0..n) of seqs[]: 0 (j->stale: the session is
 * another life now, which took none of them) or the provider's or the
 * driver's error. */
static int
embed_batch(histd_embedder *e, job *j, const embed_target *t,
	    char **texts, const uint64_t *seqs, size_t n)
{
	float *v = NULL;
	uint32_t dim = 0;
	int rc;

	rc = histd_embeddings_embed(t->client, t->model,
				    (const char *const *)texts, n, 0, &v, &dim);
	count_call(t->provider, rc);
	if (rc)
		return rc;
	/* The texts were read before the provider's answer: if the
	 * session was deleted meanwhile (and perhaps made again, with other
	 * messages under these seqs), its vectors go nowhere. The driver
	 * stores each only into the life j read, in the same step. */
	for (size_t i = 0; i < n; i++) {
		rc = histd_driver_embedding_put_life(e->d, j->tenant, j->id,
						     j->life, seqs[i], t->model,
						     v + i * dim, dim);
		if (rc == 0) {
			pthread_mutex_lock(&e->mu);
			e->st.embedded++;
			pthread_mutex_unlock(&e->mu);
		} else if (rc == HISTD_ENOTFOUND) {
			/* Another life or gone: the job is stale, nothing
			 * more of it is stored. Else only this message was
			 * cleared meanwhile. */
			if ((rc = check_life(e, j)) || j->stale) {
				free(v);
				return rc;
			}
		} else if (rc != HISTD_EINVALID) {
			/* EINVALID: a zero vector, nothing to store. */
			free(v);
			return rc;
		}
	}
	histd_metrics_counter_add("histd_embedding_vectors_total",
				  "message embeddings computed and stored", "",
				  n);
	free(v);
	return 0;
}

/*
 * Runs j. 0: done (or nothing to do); else the error that stopped it, with
 * j->first moved past what was stored, for a retry.
 */
static int
run_job(histd_embedder *e, job *j, char **emb_out, int *none)
{
	Histd__V1__SessionConfig *cfg = NULL;
	const char *prov = NULL, *model = NULL;
	histd_session *s = NULL;
	embed_target t = { 0 };
	char **texts = NULL;
	uint64_t *seqs = NULL, after, last = 0;
	int rc, has;

	if ((rc = histd_driver_session_get(e->d, j->tenant, j->id, &s))) {
		if (rc == HISTD_ENOTFOUND)
			j->stale = 1;
		return rc == HISTD_ENOTFOUND ? 0 : rc;
	}
	/* Queued for a life deleted since: the messages now under these
	 * seqs are another conversation's, queued on their own. */
	if (j->life && s->incarnation != j->life) {
		j->stale = 1;
		histd_session_free(s);
		return 0;
	}
	j->life = s->incarnation;
	if ((has = histd_search_session_embedding(s->config, s->config_len,
						  &cfg, &prov, &model)) < 0) {
		rc = has;
		goto out;
	}
	if (!has || !(t.client = client_of(e, prov))) {
		/* No embeddings for this session, or a provider without a
		 * key: searched lexically. */
		*none = 1;
		rc = 0;
		goto out;
	}
	t.provider = prov;
	t.model = model && *model ? model : histd_embeddings_default_model(prov);
	if (asprintf(emb_out, "%s\x1f%s", t.provider, t.model) < 0)
		*emb_out = NULL;
	last = j->backfill || j->last > s->last_seq ? s->last_seq : j->last;
	after = j->first ? j->first - 1 : 0;
	if (after < s->cleared_to_seq)
		after = s->cleared_to_seq;
	if (!(texts = calloc(e->cfg.batch, sizeof(*texts))) ||
	    !(seqs = calloc(e->cfg.batch, sizeof(*seqs)))) {
		rc = enomem();
		goto out;
	}
	while (after < last && rc == 0 && !j->stale) {
		histd_read q = { .tenant = j->tenant, .session_id = j->id,
				 .after_seq = after, .limit = e->cfg.batch };
		histd_read_result res = { 0 };
		size_t n = 0;

		if ((rc = histd_driver_read(e->d, &q, &res))) {
			if (rc == HISTD_ENOTFOUND)
				rc = 0;
			break;
		}
		for (size_t i = 0; i < res.records.n; i++) {
			const histd_record *r = &res.records.v[i];

			if (r->seq > last)
				break;
			if ((texts[n] = record_text(r, e->cfg.max_text_bytes)))
				seqs[n++] = r->seq;
		}
		if (n)
			rc = embed_batch(e, j, &t, texts, seqs, n);
		for (size_t i = 0; i < n; i++) {
			free(texts[i]);
			texts[i] = NULL;
		}
		if (rc == 0 && res.records.n)
			after = res.records.v[res.records.n - 1].seq;
		if (rc == 0 && (!res.records.n || !res.has_more))
			after = last;
		histd_read_result_clear(&res);
		if (rc)
			j->first = after + 1;
	}
out:
	free(texts);
	free(seqs);
	if (cfg)
		histd__v1__session_config__free_unpacked(cfg, NULL);
	histd_session_free(s);
	if (rc == 0 && t.client && !j->stale)
		j->last = last;
	else if (rc == 0)
		j->last = 0;    /* nothing embedded: the mark stays */
	return rc;
}

static int
retryable(int rc)
{
	return rc == HISTD_EUNAVAILABLE || rc == HISTD_ELIMIT;
}

/*
 * Messages that another job embedded while j waited (a search's backfill
 * queued behind the appends, or ahead of them) are not sent to the
 * provider again: j starts past the mark. A message never changes under
 * its seq (a Replace stores new seqs), so the mark's vectors are current.
 * 1: nothing is left of j (a backfill still runs, to end its turn).
 * Under mu.
 */
static int
skip_embedded(histd_embedder *e, job *j)
{
	mark *m = mark_find(e, j->tenant, j->id, 0);

	if (!m || m->life != j->life || m->mark < j->first)
		return 0;
	j->first = m->mark + 1;
	return !j->backfill && j->first > j->last;
}

static void *
worker_main(void *arg)
{
	histd_embedder *e = arg;

	pthread_mutex_lock(&e->mu);
	for (;;) {
		job *j = take(e);
		char *emb = NULL;
		uint64_t first;
		int rc, none = 0;

		if (!j)
			break;
		if (skip_embedded(e, j)) {
			job_free(j);
			continue;
		}
		first = j->first;
		pthread_mutex_unlock(&e->mu);
		rc = run_job(e, j, &emb, &none);
		pthread_mutex_lock(&e->mu);
		if (j->stale) {
			/* Nothing of it was stored; a later life's mark is
			 * not its own. */
			mark *m = mark_find(e, j->tenant, j->id, 0);

			if (m && m->life == j->life && j->backfill)
				m->backfill_queued = 0;
		} else if (j->backfill || rc == 0) {
			mark *m = mark_for(mark_find(e, j->tenant, j->id,
						     rc == 0 && (j->last || none)),
					   j);

			if (m && j->backfill)
				m->backfill_queued = 0;
			/* Its next appends are not queued, until its config
			 * changes (UPDATED drops the mark). */
			if (m && none)
				m->none = 1;
			/* The mark moves over a contiguous run only. */
			if (m && rc == 0 && j->last &&
			    (j->backfill || first <= m->mark + 1) && j->last > m->mark)
				m->mark = j->last;
			if (m && emb && (!m->emb || strcmp(m->emb, emb))) {
				free(m->emb);
				m->emb = emb;
				emb = NULL;
			}
		}
		free(emb);
		if (rc && retryable(rc) && j->attempts < e->cfg.retries &&
		    !e->stopping) {
			int64_t wait = e->cfg.retry_base_us << j->attempts;

			if (wait > RETRY_MAX_US || wait <= 0)
				wait = RETRY_MAX_US;
			/* Full jitter: retries of many jobs do not align. */
			wait = wait / 2 + (int64_t)(rand() % (int)(wait / 2 + 1));
			j->attempts++;
			j->not_before_us = histd_mono_us() + wait;
			j->next = e->delayed;
			e->delayed = j;
			e->waiting++;
			e->st.retried++;
			if (j->backfill) {
				mark *m = mark_find(e, j->tenant, j->id, 0);

				if (m)
					m->backfill_queued = 1;
			}
			continue;
		}
		if (rc) {
			e->st.failed++;
			histd_metrics_counter_add("histd_embedding_jobs_failed_total",
						  "embedding jobs given up after errors",
						  "", 1);
			histd_log(HISTD_LOG_WARN, "embedding failed; a semantic "
				  "search will retry", "error",
				  histd_error_message(), NULL);
		}
		job_free(j);
	}
	pthread_mutex_unlock(&e->mu);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Hooks                                                                   */

void
histd_embedder_notify(void *arg, const histd_change *c)
{
	histd_embedder *e = arg;
	mark *m;

	if (!e || !e->n_usable)
		return;
	switch (c->kind) {
	case HISTD_CHANGE_APPENDED:
	case HISTD_CHANGE_REPLACED:
		/* A change from another replica carries no records: the
		 * backfill of a later search covers it. */
		if (!c->records || !c->n_records)
			return;
		pthread_mutex_lock(&e->mu);
		m = mark_find(e, c->tenant, c->session_id, 0);
		if (!m || !m->none || m->life != c->incarnation)
			enqueue(e, c->tenant, c->session_id, c->incarnation,
				c->records[0].seq,
				c->records[c->n_records - 1].seq, 0);
		pthread_mutex_unlock(&e->mu);
		return;
	case HISTD_CHANGE_DELETED:
		/* The id may be created again, starting at seq 1. */
		pthread_mutex_lock(&e->mu);
		mark_drop(e, c->tenant, c->session_id);
		pthread_mutex_unlock(&e->mu);
		return;
	case HISTD_CHANGE_UPDATED: {
		Histd__V1__SessionConfig *cfg = NULL;
		const char *prov = "", *model = "";
		char *emb = NULL;
		int has;

		if (!c->session)
			return;
		/* A config that cannot be read now (memory) leaves emb NULL:
		 * the mark goes, and the next search or append decides. */
		has = histd_search_session_embedding(c->session->config,
						     c->session->config_len,
						     &cfg, &prov, &model);
		if (has > 0) {
			const char *m = *model ? model
					       : histd_embeddings_default_model(prov);

			if (asprintf(&emb, "%s\x1f%s", prov, m ? m : "") < 0)
				emb = NULL;
		}
		if (cfg)
			histd__v1__session_config__free_unpacked(cfg, NULL);
		pthread_mutex_lock(&e->mu);
		/* Another model: every vector is to be computed again; a
		 * session that had none may have some now. */
		if ((m = mark_find(e, c->tenant, c->session_id, 0)) &&
		    (m->none || (m->emb && (!emb || strcmp(m->emb, emb) != 0))))
			mark_drop(e, c->tenant, c->session_id);
		pthread_mutex_unlock(&e->mu);
		free(emb);
		return;
	}
	default:
		return;
	}
}

static void
s_backfill(void *ctx, const char *tenant, const char *id, uint64_t last_seq,
	   uint64_t life)
{
	histd_embedder *e = ctx;
	const job of = { .life = life };
	mark *m;

	pthread_mutex_lock(&e->mu);
	/* A search that read an earlier life than the mark's asks nothing. */
	m = mark_for(mark_find(e, tenant, id, 1), &of);
	if (m && !m->none && m->mark < last_seq && !m->backfill_queued &&
	    !e->stopping && e->waiting < e->cfg.queue_max) {
		m->backfill_queued = 1;
		enqueue(e, tenant, id, life, m->mark + 1, last_seq, 1);
	}
	pthread_mutex_unlock(&e->mu);
}

static int
s_embed(void *ctx, const char *provider, const char *model, const char *text,
	int64_t deadline_us, float **v, uint32_t *dim, const char **model_out)
{
	histd_embedder *e = ctx;
	histd_embeddings *c = client_of(e, provider);
	uint32_t timeout_ms = 0;
	const char *m;
	char *cut = NULL;
	int rc;

	if (!c)
		return histd_error_set(HISTD_EUNAVAILABLE, "embedding provider %s "
				       "is not configured", provider);
	if (deadline_us) {
		/* The caller's time left, rounded up; the client takes the
		 * smaller of it and --embedding-timeout-ms. */
		int64_t left = deadline_us - histd_mono_us();

		if (left <= 0)
			return histd_error_set(HISTD_EUNAVAILABLE, "the caller's "
					       "deadline passed before the "
					       "query was embedded");
		left = (left + 999) / 1000;
		timeout_ms = left < UINT32_MAX ? (uint32_t)left : UINT32_MAX;
	}
	m = model && *model ? model : histd_embeddings_default_model(provider);
	if (strlen(text) > e->cfg.max_text_bytes) {
		size_t len = e->cfg.max_text_bytes;

		while (len && ((unsigned char)text[len] & 0xc0) == 0x80)
			len--;
		if (!(cut = strndup(text, len)))
			return enomem();
		text = cut;
	}
	rc = histd_embeddings_embed(c, m, &text, 1, timeout_ms, v, dim);
	count_call(provider, rc);
	free(cut);
	/* A vector of zeros (or of numbers beyond a float) compares with
	 * nothing: the provider's fault, not the caller's query, so the
	 * sessions fall back to words as for any other bad answer. */
	if (rc == 0 && histd_vec_normalize(*v, *dim)) {
		free(*v);
		*v = NULL;
		return histd_error_set(HISTD_EUNAVAILABLE, "embedding answer: "
				       "the query vector is zero or not finite");
	}
	if (rc == 0)
		*model_out = m;
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Life                                                                    */

const histd_search_embedder *
histd_embedder_search(histd_embedder *e)
{
	return &e->search;
}

void
histd_embedder_get_stats(histd_embedder *e, histd_embedder_stats *out)
{
	pthread_mutex_lock(&e->mu);
	*out = e->st;
	out->waiting = e->waiting;
	pthread_mutex_unlock(&e->mu);
}

void
histd_embedder_stop(histd_embedder *e)
{
	if (!e)
		return;
	pthread_mutex_lock(&e->mu);
	e->stopping = 1;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->mu);
	for (int i = 0; i < e->n_threads; i++)
		pthread_join(e->threads[i], NULL);
	e->n_threads = 0;
	pthread_mutex_lock(&e->mu);
	for (job *j = e->head, *n; j; j = n) {
		n = j->next;
		job_free(j);
	}
	for (job *j = e->delayed, *n; j; j = n) {
		n = j->next;
		job_free(j);
	}
	e->head = e->tail = e->delayed = NULL;
	e->waiting = 0;
	pthread_mutex_unlock(&e->mu);
}

void
histd_embedder_free(histd_embedder *e)
{
	if (!e)
		return;
	histd_embedder_stop(e);
	for (size_t i = 0; i < e->n_clients; i++)
		histd_embeddings_free(e->clients[i].c);
	marks_clear(e);
	free(e->marks);
	free(e->threads);
	free(e->default_provider);
	free(e->default_model);
	pthread_mutex_destroy(&e->mu);
	pthread_cond_destroy(&e->cv);
	free(e);
}

int
histd_embedder_new(histd_embedder **out, histd_driver *d,
		   const histd_embedder_config *cfg, histd_http *http,
		   const histd_embedder_provider *providers, size_t n)
{
	const char *dp = cfg->provider ? cfg->provider : "";
	histd_embedder *e;
	int rc;

	if (*dp && !histd_embeddings_known(dp))
		return histd_error_set(HISTD_EINVALID, "embedding-provider must "
				       "be openai, gemini or mistral");
	if (cfg->workers < 1 || !cfg->queue_max || !cfg->batch ||
	    cfg->batch > HISTD_EMBED_BATCH_MAX || cfg->max_text_bytes < 16)
		return histd_error_set(HISTD_EINVALID, "embedding-workers, "
				       "embedding-queue must be at least 1, "
				       "embedding-batch 1..%d, embedding-max-text-"
				       "bytes at least 16", HISTD_EMBED_BATCH_MAX);
	if (n > PROVIDERS_MAX)
		n = PROVIDERS_MAX;
	if (!(e = calloc(1, sizeof(*e))))
		return enomem();
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->d = d;
	e->cfg = *cfg;
	e->cfg.provider = e->cfg.model = NULL;
	e->n_buckets = 4096;
	e->default_provider = strdup(dp);
	e->default_model = strdup(cfg->model ? cfg->model : "");
	if (!(e->marks = calloc(e->n_buckets, sizeof(*e->marks))) ||
	    !e->default_provider || !e->default_model) {
		histd_embedder_free(e);
		return enomem();
	}
	for (size_t i = 0; i < n; i++) {
		histd_embeddings_options o = {
			.provider = providers[i].name,
			.base_url = providers[i].base_url,
			.api_key_env = providers[i].api_key_env,
			.timeout_ms = cfg->timeout_ms,
			.http = http,
		};
		client_slot *sl = &e->clients[e->n_clients++];

		sl->name = providers[i].name;
		rc = histd_embeddings_open(&o, &sl->c);
		if (rc == 0) {
			e->n_usable++;
			continue;
		}
		if (*dp && strcmp(dp, providers[i].name) == 0) {
			/* The default provider must work: say what to set. */
			histd_embedder_free(e);
			return rc;
		}
		histd_error_clear();
	}
	e->search = (histd_search_embedder){
		.embed = s_embed,
		.default_provider = e->default_provider,
		.default_model = e->default_model,
		.ctx = e,
		.backfill = s_backfill,
	};
	if (!(e->threads = calloc((size_t)cfg->workers, sizeof(*e->threads)))) {
		histd_embedder_free(e);
		return enomem();
	}
	for (int i = 0; i < cfg->workers; i++) {
		if ((rc = pthread_create(&e->threads[i], NULL, worker_main, e))) {
			histd_embedder_free(e);
			return histd_error_set(HISTD_EUNAVAILABLE, "cannot start an "
					       "embedding worker: %s", strerror(rc));
		}
		e->n_threads++;
	}
	*out = e;
	return 0;
}
