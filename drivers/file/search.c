/*
 * Search in the file driver: the in-process index of drivers/index/ per
 * tenant, made by the tenant's first search from the sessions in memory
 * and kept in step by every write from then on; and the embeddings stored
 * with the messages.
 *
 * Everything here runs under the driver's lock: writes hold it
 * exclusively, so the index sees the changes in log order; a search holds
 * it shared (and exclusively only to build an index), and answers once
 * what it saw is durable, as reads do.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

static uint64_t
key_of(const hf_session *s)
{
	return (uint64_t)(uintptr_t)s;
}

void
hf_index_sync(hf_session *s)
{
	/* ENOMEM marks the index incomplete: the next search rebuilds it. */
	if (s->tenant->index)
		(void)histd_index_sync(s->tenant->index, key_of(s), s->id,
				       s->msgs, s->n_msgs);
}

void
hf_index_clear(hf_session *s)
{
	if (s->tenant->index)
		histd_index_clear(s->tenant->index, key_of(s));
}

void
hf_index_forget(hf_session *s)
{
	if (s->tenant->index)
		histd_index_forget(s->tenant->index, key_of(s));
}

/* Makes (or remakes, if incomplete) t's index; write lock held. */
static int
index_build(hf_tenant *t)
{
	int rc = 0;

	if (t->index && !histd_index_incomplete(t->index))
		return 0;
	if (t->index)
		histd_index_reset(t->index);
	else if ((rc = histd_index_new(&t->index)))
		return rc;
	for (size_t i = 0; i < t->n && rc == 0; i++)
		rc = histd_index_sync(t->index, key_of(t->sorted[i]),
				      t->sorted[i]->id, t->sorted[i]->msgs,
				      t->sorted[i]->n_msgs);
	return rc;
}

/* Answers rc once everything the search may have seen is durable. */
static int
settle_all(hf_driver *d, int rc)
{
	uint64_t lsn = hf_wal_last(d->wal);
	int w;

	pthread_rwlock_unlock(&d->lock);
	w = hf_wal_wait(d->wal, lsn, 0);
	return w ? w : rc;
}

/* The sessions of the query's scope (read lock held): *v malloc'ed. */
static int
scope_sessions(hf_driver *d, hf_tenant *t, const histd_search_query *q,
	       hf_session ***out, size_t *n)
{
	size_t cap = q->n_session_ids ? q->n_session_ids : t->n, k = 0;
	hf_session **v = malloc((cap ? cap : 1) * sizeof(*v));

	if (!v)
		return enomem();
	if (q->n_session_ids) {
		for (size_t i = 0; i < q->n_session_ids; i++) {
			hf_session *s = hf_session_find(d, t->name, t->len,
							q->session_ids[i],
							strlen(q->session_ids[i]));
			size_t j;

			for (j = 0; s && j < k && v[j] != s; j++)
				;
			if (s && j == k)
				v[k++] = s;
		}
	} else {
		for (size_t i = 0; i < t->n; i++)
			if (histd_kv_contains(t->sorted[i]->labels,
					      t->sorted[i]->n_labels, q->labels,
					      q->n_labels))
				v[k++] = t->sorted[i];
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

/* Adds the stored message (s, seq) to out if it is there. */
static int
hit_add(const hf_session *s, uint64_t seq, double score,
	histd_search_result *out)
{
	size_t i = hf_first_after(s->msgs, s->n_msgs, seq - 1);

	if (i == s->n_msgs || s->msgs[i].seq != seq)
		return 0;
	return histd_search_result_add(out, s->id, score, seq,
				       s->msgs[i].token_estimate,
				       s->msgs[i].data, s->msgs[i].len);
}

static int
search_lexical(hf_driver *d, hf_tenant *t, const histd_search_query *q,
	       histd_search_result *out)
{
	int scoped = q->n_session_ids || q->n_labels;
	histd_index_hit *hits = NULL;
	hf_session **v = NULL;
	key_set ks = { 0 };
	size_t n = 0, nv = 0;
	int rc;

	if (scoped) {
		if ((rc = scope_sessions(d, t, q, &v, &nv)))
			return rc;
		if (!nv)
			goto out;
		if (!(ks.v = malloc(nv * sizeof(*ks.v)))) {
			rc = enomem();
			goto out;
		}
		for (size_t i = 0; i < nv; i++)
			ks.v[ks.n++] = key_of(v[i]);
		qsort(ks.v, ks.n, sizeof(*ks.v), key_cmp);
	}
	if ((rc = histd_index_search(t->index, q, scoped ? in_key_set : NULL,
				     &ks, &hits, &n)))
		goto out;
	/* The lock was held throughout: every hit's session is the one the
	 * index names. */
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = hit_add((const hf_session *)(uintptr_t)hits[i].key,
			     hits[i].seq, hits[i].score, out);
out:
	histd_index_hits_free(hits, n);
	free(ks.v);
	free(v);
	return rc;
}

static int
search_semantic(hf_driver *d, hf_tenant *t, const histd_search_query *q,
		histd_search_result *out)
{
	hf_session **v = NULL;
	histd_topk top = { 0 };
	size_t nv = 0;
	float *qn;
	int rc;

	if (!(qn = malloc(q->dim * sizeof(*qn))))
		return enomem();
	memcpy(qn, q->vector, q->dim * sizeof(*qn));
	if (histd_vec_normalize(qn, q->dim)) {
		free(qn);
		return histd_error_set(HISTD_EINVALID, "the query vector is zero");
	}
	if ((rc = scope_sessions(d, t, q, &v, &nv)) ||
	    (rc = histd_topk_init(&top, q->k)))
		goto out;
	for (size_t i = 0; i < nv; i++)
		histd_vecs_search(&v[i]->vecs, &top, key_of(v[i]), v[i]->id,
				  q->model, q->dim, qn, q->roles,
				  q->exclude_newest && v[i]->n_msgs
					  ? v[i]->msgs[v[i]->n_msgs - 1].seq : 0);
	histd_topk_finish(&top);
	for (size_t i = 0; i < top.n && rc == 0; i++)
		rc = hit_add((const hf_session *)(uintptr_t)top.v[i].key,
			     top.v[i].seq, top.v[i].score, out);
out:
	histd_topk_free(&top);
	free(v);
	free(qn);
	return rc;
}

/* ---------------------------------------------------------------------- */
/* Embeddings                                                              */

int
hf_vecs_reserve(hf_session *s)
{
	size_t cap;
	histd_vec **v;

	if (s->vecs.n < s->vecs.cap)
		return 0;
	cap = s->vecs.cap ? s->vecs.cap * 2 : 8;
	if (!(v = realloc(s->vecs.v, cap * sizeof(*v))))
		return enomem();
	s->vecs.v = v;
	s->vecs.cap = cap;
	return 0;
}

void
hf_vec_put(hf_session *s, histd_vec *x)
{
	size_t lo = 0, hi = s->vecs.n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->vecs.v[mid]->seq < x->seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->vecs.n && s->vecs.v[lo]->seq == x->seq) {
		histd_vec *old = s->vecs.v[lo];

		s->vec_bytes -= HF_VEC_FRAME(old->dim, strlen(old->model));
		free(old);
		s->vecs.v[lo] = x;
	} else {
		/* Room was reserved: this cannot fail. */
		(void)histd_vecs_put(&s->vecs, x);
	}
	s->vec_bytes += HF_VEC_FRAME(x->dim, strlen(x->model));
}

void
hf_put_vec(hf_buf *b, const histd_vec *x)
{
	hf_put_varint(b, x->seq);
	hf_put_str(b, x->model);
	hf_put_varint(b, x->dim);
	/* Host order (little-endian on every platform histd runs on), as
	 * the rest of the format's fixed-width fields. */
	hf_put_raw(b, x->v, (size_t)x->dim * sizeof(float));
}

int
hf_get_vec(hf_rd *rd, const hf_session *s, histd_vec **out)
{
	uint64_t seq = hf_get_varint(rd), dim;
	size_t ml, i;
	const uint8_t *m = hf_get_bytes(rd, &ml);
	char *model;
	float *v;

	*out = NULL;
	dim = hf_get_varint(rd);
	if (rd->bad || !m || memchr(m, 0, ml) || dim == 0 || dim > 65536 ||
	    (uint64_t)(rd->end - rd->p) != dim * sizeof(float))
		return HISTD_ECORRUPT;
	i = hf_first_after(s->msgs, s->n_msgs, seq - 1);
	if (i == s->n_msgs || s->msgs[i].seq != seq)
		return 0;       /* the message went: so does its vector */
	if (!(model = strndup((const char *)m, ml)) ||
	    !(v = malloc(dim * sizeof(float)))) {
		free(model);
		return HISTD_ENOMEM;
	}
	memcpy(v, rd->p, dim * sizeof(float));
	rd->p = rd->end;
	*out = histd_vec_new(seq, (uint8_t)histd_index_message_role(s->msgs[i].data,
								   s->msgs[i].len),
			     model, v, (uint32_t)dim);
	free(model);
	free(v);
	/* A zero vector is never stored: NULL is out of memory. */
	return *out ? 0 : HISTD_ENOMEM;
}

int
hf_search(histd_driver *dd, const histd_search_query *q,
	  histd_search_result *out)
{
	hf_driver *d = (hf_driver *)dd;
	hf_tenant *t;
	int rc;

	if (hf_wal_failed(d->wal))
		return HISTD_EUNAVAILABLE;
	pthread_rwlock_rdlock(&d->lock);
	t = hf_tenant_find(d, q->tenant, strlen(q->tenant));
	if (!t)
		return settle_all(d, 0);
	if (q->mode == HISTD_SEARCH_LEXICAL &&
	    (!t->index || histd_index_incomplete(t->index))) {
		/* The first search of the tenant builds its index, under
		 * the write lock so that no write slips past it. */
		pthread_rwlock_unlock(&d->lock);
		pthread_rwlock_wrlock(&d->lock);
		t = hf_tenant_find(d, q->tenant, strlen(q->tenant));
		rc = index_build(t);
		pthread_rwlock_unlock(&d->lock);
		if (rc)
			return rc;
		pthread_rwlock_rdlock(&d->lock);
		t = hf_tenant_find(d, q->tenant, strlen(q->tenant));
	}
	rc = q->mode == HISTD_SEARCH_SEMANTIC ? search_semantic(d, t, q, out)
					      : search_lexical(d, t, q, out);
	return settle_all(d, rc);
}
