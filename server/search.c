/*
 * The Search RPC (see search.h).
 */
#include "search.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "embeddings.h"
#include "histd_wire.h"
#include "index/index.h"
#include "service.h"

#define DEFAULT_K 10
#define QUERY_MAX 4096
/* Reciprocal rank fusion's constant: 1 / (RRF_K + rank). */
#define RRF_K 60.0
/* Sessions listed per page when a semantic search gathers its scope. */
#define LIST_PAGE 1000

static _Atomic(const histd_search_embedder *) embedder;

void
histd_search_set_embedder(const histd_search_embedder *e)
{
	atomic_store(&embedder, e);
}

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

/* EUNAVAILABLE if the caller's deadline (0: none) has passed, else 0. */
static int
check_deadline(int64_t deadline_us)
{
	if (deadline_us && histd_mono_us() >= deadline_us)
		return histd_error_set(HISTD_EUNAVAILABLE, "the deadline passed "
				       "before the query was embedded");
	return 0;
}

int
histd_search_session_embedding(const uint8_t *config, size_t len,
			       Histd__V1__SessionConfig **cfg,
			       const char **provider, const char **model)
{
	const histd_search_embedder *e = atomic_load(&embedder);
	Histd__V1__SessionConfig *c = NULL;
	int rc;

	*cfg = NULL;
	if (config && len &&
	    (rc = histd_unpack_stored(&histd__v1__session_config__descriptor,
				      NULL, config, len, &c,
				      "the session's stored config")))
		return rc;
	*cfg = c;
	if (c && c->embeddings) {
		*provider = c->embeddings->provider;
		*model = c->embeddings->model;
	} else if (e && e->default_provider && e->default_provider[0]) {
		*provider = e->default_provider;
		*model = e->default_model ? e->default_model : "";
	} else {
		return 0;
	}
	if (!(*provider)[0])
		return 0;
	/* No model is the provider's default: one model, however a config
	 * spells it (searches rank one model by the cosine alone). */
	if (!(*model)[0] && histd_embeddings_default_model(*provider))
		*model = histd_embeddings_default_model(*provider);
	return 1;
}

/* ---------------------------------------------------------------------- */
/* The request                                                             */

static void
count_word(void *ctx, const char *tok, size_t len)
{
	(void)tok;
	(void)len;
	(*(size_t *)ctx)++;
}

static int
check_request(const Histd__V1__SearchRequest *r, histd_search_query *q)
{
	size_t words = 0;
	int rc;

	if (!r->query[0])
		return histd_error_set(HISTD_EINVALID, "query is required");
	if (strlen(r->query) > QUERY_MAX)
		return histd_error_set(HISTD_EINVALID,
				       "query is longer than %d bytes", QUERY_MAX);
	/* Here, not only in the drivers: also when nothing is in scope. */
	histd_index_tokens(r->query, strlen(r->query), count_word, &words);
	if (!words)
		return histd_error_set(HISTD_EINVALID,
				       "query has no word to search for");
	if (r->session_id[0] &&
	    (rc = histd_check_session_id(r->session_id, "session_id")))
		return rc;
	if (r->k > HISTD_SEARCH_K_MAX)
		return histd_error_set(HISTD_EINVALID, "k must be 0..%d",
				       HISTD_SEARCH_K_MAX);
	q->k = r->k ? r->k : DEFAULT_K;
	q->roles = 0;
	for (size_t i = 0; i < r->n_roles; i++) {
		if (r->roles[i] < HISTD__V1__ROLE__ROLE_SYSTEM ||
		    r->roles[i] > HISTD__V1__ROLE__ROLE_TOOL)
			return histd_error_set(HISTD_EINVALID,
					       "roles[%zu] is not a role", i);
		q->roles |= 1u << r->roles[i];
	}
	switch (r->mode) {
	case HISTD__V1__SEARCH_MODE__SEARCH_MODE_UNSPECIFIED:
	case HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL:
	case HISTD__V1__SEARCH_MODE__SEARCH_MODE_SEMANTIC:
	case HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID:
		break;
	default:
		return histd_error_set(HISTD_EINVALID, "mode is not a search mode");
	}
	q->include_tool_results = r->include_tool_results;
	q->exclude_newest = r->exclude_newest;
	q->text = r->query;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Rankings and their fusion                                               */

/* One ranked list of hits, as a driver answered it. */
typedef struct ranking {
	histd_search_result r;
} ranking;

/* A fused hit: the first result that had it lends the record. */
typedef struct fused {
	const char *session_id;
	const histd_record *rec;
	double score;
} fused;

static int
fused_cmp(const void *a, const void *b)
{
	const fused *x = a, *y = b;
	int c;

	if (x->score != y->score)
		return x->score < y->score ? 1 : -1;
	if ((c = strcmp(x->session_id, y->session_id)))
		return c;
	return x->rec->seq < y->rec->seq ? -1 : x->rec->seq > y->rec->seq;
}

/* The hits of one ranking as they are, or of several fused by reciprocal
 * rank: *out malloc'ed, best first, at most k. */
static int
fuse(const ranking *v, size_t n, uint32_t k, fused **out, size_t *n_out)
{
	size_t total = 0, m = 0;
	fused *f;

	for (size_t i = 0; i < n; i++)
		total += v[i].r.n;
	if (!(f = malloc((total ? total : 1) * sizeof(*f))))
		return enomem();
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < v[i].r.n; j++) {
			const char *id = v[i].r.hits[j].session_id;
			const histd_record *rec = &v[i].r.records.v[j];
			double s = n == 1 ? v[i].r.hits[j].score
					  : 1.0 / (RRF_K + (double)(j + 1));
			size_t x;

			for (x = 0; x < m; x++)
				if (f[x].rec->seq == rec->seq &&
				    strcmp(f[x].session_id, id) == 0)
					break;
			if (x < m) {
				f[x].score += s;
			} else {
				f[m++] = (fused){ .session_id = id, .rec = rec,
						  .score = s };
			}
		}
	qsort(f, m, sizeof(*f), fused_cmp);
	*out = f;
	*n_out = m < k ? m : k;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Semantic scope                                                          */

typedef struct sess_emb {
	char *id;
	char *provider;         /* NULL: no embeddings */
	char *model;
	uint64_t last_seq;
	uint64_t life;          /* histd_session.incarnation */
} sess_emb;

typedef struct scope {
	sess_emb *v;
	size_t n, cap;
} scope;

static void
scope_free(scope *s)
{
	for (size_t i = 0; i < s->n; i++) {
		free(s->v[i].id);
		free(s->v[i].provider);
		free(s->v[i].model);
	}
	free(s->v);
}

static int
scope_add(scope *s, const histd_session *x)
{
	Histd__V1__SessionConfig *cfg = NULL;
	const char *prov = NULL, *model = NULL;
	sess_emb e = { 0 };
	int has;

	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 16;
		sess_emb *v = realloc(s->v, nc * sizeof(*v));

		if (!v)
			return enomem();
		s->v = v;
		s->cap = nc;
	}
	/* 0 may still set prov: to "", for a session that opts out. */
	has = histd_search_session_embedding(x->config, x->config_len, &cfg,
					     &prov, &model);
	if (has < 0)
		return has;
	if (has) {
		e.provider = strdup(prov);
		e.model = strdup(model);
	}
	if (cfg)
		histd__v1__session_config__free_unpacked(cfg, NULL);
	e.id = strdup(x->id);
	e.last_seq = x->last_seq;
	e.life = x->incarnation;
	if (!e.id || (has && (!e.provider || !e.model))) {
		free(e.id);
		free(e.provider);
		free(e.model);
		return enomem();
	}
	s->v[s->n++] = e;
	return 0;
}

/* Every session in scope with its embedding configuration. */
static int
scope_gather(histd_driver *d, const char *tenant, const histd_search_query *q,
	     const histd_session *one, scope *out)
{
	char after[256] = "";
	int rc;

	if (one)
		return scope_add(out, one);
	for (;;) {
		histd_list l = {
			.tenant = tenant, .after_id = after, .limit = LIST_PAGE,
			.labels = q->labels, .n_labels = q->n_labels,
		};
		histd_session_list sl = { 0 };

		if ((rc = histd_driver_session_list(d, &l, &sl)))
			return rc;
		for (size_t i = 0; i < sl.n && rc == 0; i++)
			rc = scope_add(out, sl.v[i]);
		if (rc == 0 && sl.has_more && sl.n) {
			strncpy(after, sl.v[sl.n - 1]->id, sizeof(after) - 1);
		} else {
			histd_session_list_free(&sl);
			return rc;
		}
		histd_session_list_free(&sl);
	}
}

/* ---------------------------------------------------------------------- */
/* The RPC                                                                 */

typedef struct plan {
	ranking *rk;
	size_t n_rk;
	int semantic_used;
	char **fallback;        /* borrowed from the scope */
	size_t n_fallback;
} plan;

static int
plan_search(histd_driver *d, const histd_search_query *q, plan *p)
{
	ranking *rk = realloc(p->rk, (p->n_rk + 1) * sizeof(*rk));
	int rc;

	if (!rk)
		return enomem();
	p->rk = rk;
	memset(&rk[p->n_rk], 0, sizeof(rk[p->n_rk]));
	if ((rc = histd_driver_search(d, q, &rk[p->n_rk].r)))
		return rc;
	p->n_rk++;
	return 0;
}

/* The semantic rankings of the scope's sessions, group by group, and the
 * sessions that fall back (in p->fallback). */
static int
semantic(histd_driver *d, const histd_search_query *base, int64_t deadline_us,
	 scope *sc, plan *p)
{
	const histd_search_embedder *e = atomic_load(&embedder);
	size_t room = sc->n ? sc->n : 1;
	const char **ids = malloc(room * sizeof(*ids));
	char *done = calloc(room, 1);
	int rc = 0;

	/* p->fallback is the caller's to free, whatever happens here. */
	p->fallback = malloc(room * sizeof(*p->fallback));
	if (!ids || !done || !p->fallback)
		rc = enomem();
	for (size_t i = 0; i < sc->n && rc == 0; i++) {
		histd_search_query q = *base;
		const char *model_out = NULL;
		float *v = NULL;
		uint32_t dim = 0;
		size_t n = 0;

		if (done[i])
			continue;
		if (!sc->v[i].provider || !e || !histd_driver_can_embed(d)) {
			p->fallback[p->n_fallback++] = sc->v[i].id;
			done[i] = 1;
			continue;
		}
		/* The group of sessions sharing i's provider and model. */
		for (size_t j = i; j < sc->n; j++)
			if (!done[j] && sc->v[j].provider &&
			    strcmp(sc->v[j].provider, sc->v[i].provider) == 0 &&
			    strcmp(sc->v[j].model, sc->v[i].model) == 0) {
				ids[n++] = sc->v[j].id;
				done[j] = 1;
				/* Messages stored before the session asked for
				 * embeddings, or dropped from a full queue,
				 * get their vectors now, off this call. */
				if (e->backfill)
					e->backfill(e->ctx, base->tenant,
						    sc->v[j].id, sc->v[j].last_seq,
						    sc->v[j].life);
			}
		/* A caller that has gone is not worth a provider call (and
		 * one that went during it, not worth a fallback search). */
		if ((rc = check_deadline(deadline_us)))
			break;
		rc = e->embed(e->ctx, sc->v[i].provider, sc->v[i].model,
			      base->text, deadline_us, &v, &dim, &model_out);
		if (rc && rc != HISTD_ENOMEM && check_deadline(deadline_us)) {
			rc = HISTD_EUNAVAILABLE;        /* its message set */
		} else if (rc == HISTD_EUNAVAILABLE || rc == HISTD_EINVALID ||
			   rc == HISTD_EPRECONDITION || rc == HISTD_ELIMIT) {
			/* The provider cannot be reached, refused histd's key
			 * or request, or is rate limiting it: these sessions
			 * are searched by their words. */
			for (size_t j = 0; j < n; j++)
				p->fallback[p->n_fallback++] = (char *)ids[j];
			rc = 0;
		} else if (rc == 0) {
			q.mode = HISTD_SEARCH_SEMANTIC;
			q.vector = v;
			q.dim = dim;
			q.model = model_out && model_out[0] ? model_out
							    : sc->v[i].model;
			q.session_ids = ids;
			q.n_session_ids = n;
			q.labels = NULL;
			q.n_labels = 0;
			if ((rc = plan_search(d, &q, p)) == 0)
				p->semantic_used = 1;
		}
		/* NULL unless embed succeeded; freed on every path anyway. */
		free(v);
	}
	free(ids);
	free(done);
	return rc;
}

static int
respond(const plan *p, const histd_search_query *q, Histd__V1__SearchMode mode,
	ProtobufCAllocator *alloc, uint8_t **out, size_t *out_len)
{
	Histd__V1__SearchResponse resp = HISTD__V1__SEARCH_RESPONSE__INIT;
	Histd__V1__SearchHit *hv = NULL, **hp = NULL;
	Histd__V1__Message **msgs = NULL;
	fused *f = NULL;
	size_t n = 0;
	int rc;

	if ((rc = fuse(p->rk, p->n_rk, q->k, &f, &n)))
		return rc;
	if (n && (!(hv = calloc(n, sizeof(*hv))) || !(hp = calloc(n, sizeof(*hp))) ||
		  !(msgs = calloc(n, sizeof(*msgs))))) {
		rc = enomem();
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		Histd__V1__SearchHit init = HISTD__V1__SEARCH_HIT__INIT;

		/* Unpacked into the call's arena, freed with the call. */
		if ((rc = histd_unpack_stored(&histd__v1__message__descriptor,
					      alloc, f[i].rec->data,
					      f[i].rec->len, &msgs[i],
					      "the stored message at seq %"
					      PRIu64, f[i].rec->seq)))
			goto out;
		hv[i] = init;
		hv[i].session_id = (char *)f[i].session_id;
		hv[i].seq = f[i].rec->seq;
		hv[i].score = f[i].score;
		hv[i].message = msgs[i];
		hp[i] = &hv[i];
	}
	resp.n_hits = n;
	resp.hits = hp;
	resp.mode = mode;
	resp.n_lexical_fallback_sessions = p->n_fallback;
	resp.lexical_fallback_sessions = p->fallback;
	*out_len = histd__v1__search_response__get_packed_size(&resp);
	if (!(*out = malloc(*out_len ? *out_len : 1))) {
		rc = enomem();
		goto out;
	}
	histd__v1__search_response__pack(&resp, *out);
out:
	free(f);
	free(hv);
	free(hp);
	free(msgs);
	return rc;
}

int
histd_search_rpc(histd_driver *d, const char *tenant,
		 const Histd__V1__SearchRequest *r, int64_t deadline_us,
		 ProtobufCAllocator *alloc, uint8_t **out, size_t *out_len)
{
	histd_search_query q = { .tenant = tenant, .mode = HISTD_SEARCH_LEXICAL };
	Histd__V1__SearchMode mode = r->mode;
	const char *one_id[1];
	histd_session *one = NULL;
	histd_kv *labels = NULL;
	scope sc = { 0 };
	plan p = { 0 };
	int rc;

	if ((rc = check_request(r, &q)) || (rc = histd_kv_collect(
			(ProtobufCMessage *const *)r->label_selector,
			r->n_label_selector, "label_selector", &labels,
			&q.n_labels)))
		return rc;
	q.labels = labels;
	if (r->session_id[0]) {
		/* An unknown session is NOT_FOUND, as everywhere else. */
		if ((rc = histd_driver_session_get(d, tenant, r->session_id, &one)))
			goto out;
		one_id[0] = r->session_id;
		q.session_ids = one_id;
		q.n_session_ids = 1;
		q.labels = NULL;
		q.n_labels = 0;
	}
	if (mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_UNSPECIFIED)
		mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL;

	if (mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL) {
		rc = plan_search(d, &q, &p);
	} else {
		if ((rc = scope_gather(d, tenant, &q, one, &sc)) ||
		    (rc = semantic(d, &q, deadline_us, &sc, &p)))
			goto out;
		if (mode == HISTD__V1__SEARCH_MODE__SEARCH_MODE_HYBRID) {
			/* Words over the whole scope, fallbacks included. */
			rc = plan_search(d, &q, &p);
		} else if (p.n_fallback) {
			histd_search_query fq = q;

			fq.session_ids = (const char *const *)p.fallback;
			fq.n_session_ids = p.n_fallback;
			fq.labels = NULL;
			fq.n_labels = 0;
			rc = plan_search(d, &fq, &p);
		}
		/* Nothing was searched by meaning: say what was done. */
		if (!p.semantic_used)
			mode = HISTD__V1__SEARCH_MODE__SEARCH_MODE_LEXICAL;
	}
	if (rc == 0)
		rc = respond(&p, &q, mode, alloc, out, out_len);
out:
	for (size_t i = 0; i < p.n_rk; i++)
		histd_search_result_clear(&p.rk[i].r);
	free(p.rk);
	free(p.fallback);
	scope_free(&sc);
	histd_session_free(one);
	free(labels);
	return rc;
}
