/*
 * The file driver's in-memory state: tenants, sessions, their messages,
 * summaries, tool call index and idempotency keys (see internal.h).
 *
 * Both live calls (file.c) and recovery (load.c) change the state only
 * through these functions, so that a replayed log builds exactly what the
 * live calls built. Every function here runs with the driver's lock held
 * (write-held for changes).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "internal.h"

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

hf_tenant *
hf_tenant_find(hf_driver *d, const char *name, size_t len)
{
	return hf_map_get(&d->tenants, name, len);
}

hf_session *
hf_session_find(hf_driver *d, const char *tenant, size_t tlen, const char *id,
		size_t ilen)
{
	hf_tenant *t = hf_tenant_find(d, tenant, tlen);

	return t ? hf_map_get(&t->ids, id, ilen) : NULL;
}

/* Each key and value prefixed by its length: equal bytes exactly when the
 * sorted pair lists are equal. */
uint8_t *
hf_canon(const histd_kv *kv, size_t n, size_t *out_len)
{
	size_t len = 0, off = 0;
	uint8_t *buf;

	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(kv[i].key), vl = strlen(kv[i].value);

		len += histd_wire_varint_size(kl) + kl +
		       histd_wire_varint_size(vl) + vl;
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

hf_session *
hf_session_new(const histd_session *in)
{
	hf_session *s = calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->id_len = strlen(in->id);
	if (!(s->id = strdup(in->id)))
		goto fail;
	if (histd_kv_dup(&s->ckeys, in->context_keys, in->n_context_keys))
		goto fail;
	s->n_ckeys = in->n_context_keys;
	if (s->n_ckeys &&
	    !(s->canon = hf_canon(s->ckeys, s->n_ckeys, &s->canon_len)))
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
	hf_session_destroy(NULL, s);
	return NULL;
}

/* ---------------------------------------------------------------------- */
/* Mapped files                                                            */

hf_mapping *
hf_mapping_open(hf_driver *d, int fd, size_t len)
{
	hf_mapping *m = calloc(1, sizeof(*m));
	void *p;

	if (!m || !len) {
		free(m);
		return NULL;
	}
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		free(m);
		return NULL;
	}
	/* Read ahead: the load reads it all, and records keep pointing
	 * into it. */
	madvise(p, len, MADV_WILLNEED);
	m->base = p;
	m->len = len;
	m->next = d->mappings;
	d->mappings = m;
	return m;
}

static hf_mapping *
mapping_of(hf_driver *d, const void *p)
{
	for (hf_mapping *m = d->mappings; m; m = m->next)
		if ((const uint8_t *)p >= m->base && (const uint8_t *)p < m->base + m->len)
			return m;
	return NULL;
}

void
hf_mapping_sweep(hf_driver *d)
{
	hf_mapping **pp = &d->mappings;

	while (*pp) {
		hf_mapping *m = *pp;

		if (m->refs) {
			pp = &m->next;
			continue;
		}
		*pp = m->next;
		munmap(m->base, m->len);
		free(m);
	}
}

void
hf_mapping_close_all(hf_driver *d)
{
	while (d->mappings) {
		hf_mapping *m = d->mappings;

		d->mappings = m->next;
		munmap(m->base, m->len);
		free(m);
	}
}

void
hf_free_data(hf_driver *d, void *p, size_t len)
{
	hf_mapping *m;

	if (!p)
		return;
	if (d && d->compacting) {
		/* A compaction is writing these bytes out: free them after. */
		if (d->n_grave == d->cap_grave) {
			size_t cap = d->cap_grave ? d->cap_grave * 2 : 1024;
			struct hf_grave *v = realloc(d->grave, cap * sizeof(*v));

			if (!v) {
				d->grave_lost = 1;      /* leaked, never freed under it */
				return;
			}
			d->grave = v;
			d->cap_grave = cap;
		}
		d->grave[d->n_grave++] = (struct hf_grave){ p, len };
		return;
	}
	if (d && (m = mapping_of(d, p))) {
		if (--m->refs == 0)
			hf_mapping_sweep(d);
		return;
	}
	free(p);
}

void
hf_drop_messages(hf_driver *d, hf_session *s)
{
	for (size_t i = 0; i < s->n_msgs; i++)
		hf_free_data(d, s->msgs[i].data, s->msgs[i].len);
	free(s->msgs);
	s->msgs = NULL;
	s->n_msgs = s->cap_msgs = 0;
	s->token_total = s->bytes_total = 0;
	histd_vecs_clear(&s->vecs);
	s->vec_bytes = 0;
}

void
hf_drop_summaries(hf_driver *d, hf_session *s)
{
	for (size_t i = 0; i < s->n_sums; i++)
		hf_free_data(d, s->sums[i].data, s->sums[i].len);
	free(s->sums);
	s->sums = NULL;
	s->n_sums = s->cap_sums = s->best_sum = s->sum_bytes = 0;
}

void
hf_drop_tools(hf_map *tools)
{
	for (size_t i = 0; tools->s && i <= tools->mask; i++)
		free(tools->s[i].v);
	hf_map_free(tools);
}

void
hf_drop_idem(hf_map *idem)
{
	hf_drop_tools(idem);    /* the same: one malloc per entry */
}

void
hf_session_destroy(hf_driver *d, hf_session *s)
{
	if (!s)
		return;
	hf_drop_messages(d, s);
	hf_drop_summaries(d, s);
	hf_drop_tools(&s->tools);
	hf_drop_idem(&s->idem);
	histd_kv_free(s->ckeys, s->n_ckeys);
	histd_kv_free(s->labels, s->n_labels);
	free(s->canon);
	free(s->config);
	free(s->id);
	free(s);
}

/* Index in t->sorted where id is or would go. */
static size_t
sorted_pos(const hf_tenant *t, const char *id)
{
	size_t lo = 0, hi = t->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(t->sorted[mid]->id, id) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int
hf_session_insert(hf_driver *d, const char *tenant, size_t tlen, hf_session *s)
{
	hf_tenant *t = hf_tenant_find(d, tenant, tlen);
	size_t pos;
	int rc;

	if (t && hf_map_get(&t->ids, s->id, s->id_len))
		return histd_error_set(HISTD_EEXISTS, "session id already exists");
	if (t && s->canon && hf_map_get(&t->ctx, s->canon, s->canon_len))
		return histd_error_set(HISTD_EEXISTS,
				       "another session has the same context_keys");
	if (!t) {
		if ((rc = hf_map_reserve(&d->tenants, d->tenants.n + 1)))
			return rc;
		if (!(t = calloc(1, sizeof(*t))) || !(t->name = malloc(tlen + 1))) {
			free(t);
			return enomem();
		}
		memcpy(t->name, tenant, tlen);
		t->name[tlen] = '\0';
		t->len = tlen;
		hf_map_put(&d->tenants, t->name, t->len, t);
	}
	if ((rc = hf_map_reserve(&t->ids, t->ids.n + 1)) ||
	    (s->canon && (rc = hf_map_reserve(&t->ctx, t->ctx.n + 1))))
		return rc;
	if (t->n == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		hf_session **v = realloc(t->sorted, cap * sizeof(*v));

		if (!v)
			return enomem();
		t->sorted = v;
		t->cap = cap;
	}
	pos = sorted_pos(t, s->id);
	memmove(t->sorted + pos + 1, t->sorted + pos,
		(t->n - pos) * sizeof(*t->sorted));
	t->sorted[pos] = s;
	t->n++;
	hf_map_put(&t->ids, s->id, s->id_len, s);
	if (s->canon)
		hf_map_put(&t->ctx, s->canon, s->canon_len, s);
	s->tenant = t;
	hf_session_account(d, s);
	return 0;
}

void
hf_session_remove(hf_driver *d, hf_session *s)
{
	hf_tenant *t = s->tenant;
	size_t pos = sorted_pos(t, s->id);

	hf_map_del(&t->ids, s->id, s->id_len);
	if (s->canon)
		hf_map_del(&t->ctx, s->canon, s->canon_len);
	if (pos < t->n && t->sorted[pos] == s) {
		memmove(t->sorted + pos, t->sorted + pos + 1,
			(t->n - pos - 1) * sizeof(*t->sorted));
		t->n--;
	}
	d->live_bytes -= s->live;
	s->live = 0;
}

histd_session *
hf_session_export(const hf_session *s)
{
	histd_session *o = calloc(1, sizeof(*o));

	if (!o)
		return NULL;
	if (!(o->tenant = strdup(s->tenant->name)) || !(o->id = strdup(s->id)))
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

static uint64_t
kv_bytes(const histd_kv *kv, size_t n)
{
	uint64_t b = 10;

	for (size_t i = 0; i < n; i++)
		b += strlen(kv[i].key) + strlen(kv[i].value) + 20;
	return b;
}

void
hf_session_account(hf_driver *d, hf_session *s)
{
	uint64_t live;

	/* An upper bound of the session's frames in a snapshot (every
	 * varint at its longest), so that a fresh snapshot never looks like
	 * garbage and compaction cannot repeat itself. */
	if (!s->meta_bytes)
		s->meta_bytes = 144 + s->tenant->len + s->id_len +
				kv_bytes(s->ckeys, s->n_ckeys) +
				kv_bytes(s->labels, s->n_labels) + s->config_len;
	live = s->meta_bytes +
	       40 * (uint64_t)s->n_msgs + s->bytes_total +
	       40 * (uint64_t)s->n_sums + s->sum_bytes +
	       40 * (uint64_t)s->tools.n + s->tool_bytes +
	       100 * (uint64_t)s->idem.n + s->idem_bytes +
	       s->vec_bytes;
	d->live_bytes += live - s->live;
	s->live = live;
}

size_t
hf_first_after(const histd_record *v, size_t n, uint64_t seq)
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

int
hf_msgs_reserve(hf_session *s, size_t n)
{
	size_t cap;
	histd_record *v;

	if (n <= s->cap_msgs)
		return 0;
	/* By half again: amortized O(1) appends, at most a third unused. */
	cap = s->cap_msgs + s->cap_msgs / 2 + 4;
	if (cap < n)
		cap = n;
	if (cap > SIZE_MAX / sizeof(*v))
		return enomem();
	v = realloc(s->msgs, cap * sizeof(*v));
	if (!v)
		return enomem();
	s->msgs = v;
	s->cap_msgs = cap;
	return 0;
}

int
hf_sums_reserve(hf_session *s, size_t n)
{
	size_t cap;
	histd_record *v;

	if (n <= s->cap_sums)
		return 0;
	cap = s->cap_sums ? s->cap_sums * 2 : 2;
	if (cap < n)
		cap = n;
	if (cap > SIZE_MAX / sizeof(*v))
		return enomem();
	v = realloc(s->sums, cap * sizeof(*v));
	if (!v)
		return enomem();
	s->sums = v;
	s->cap_sums = cap;
	return 0;
}

int
hf_check_revision(const hf_session *s, uint64_t expected, uint64_t *current)
{
	if (expected == 0 || expected == s->revision)
		return 0;
	*current = s->revision;
	return histd_error_set(HISTD_ECONFLICT,
			       "expected_revision %llu does not match the session's revision %llu",
			       (unsigned long long)expected,
			       (unsigned long long)s->revision);
}

/* ---------------------------------------------------------------------- */
/* Batches of messages                                                     */

void
hf_batch_free(hf_driver *d, hf_batch *b)
{
	for (size_t i = 0; i < b->k && b->recs; i++)
		hf_free_data(d, b->recs[i].data, b->recs[i].len);
	if (!b->borrowed)
		free(b->recs);
	for (size_t i = 0; i < b->n_refs; i++)
		free(b->refs[i].fresh);
	free(b->refs);
	hf_map_free(&b->staged);
	hf_map_free(&b->new_tools);
	*b = (hf_batch){ 0 };
}

int
hf_batch_prepare(hf_batch *b, hf_session *s, histd_record *recs, size_t k,
		 const hf_msgrefs *refs, int replace)
{
	const hf_map *tools = replace ? NULL : &s->tools;
	size_t total = 0;
	int rc;

	*b = (hf_batch){ .k = 0, .first_seq = s->last_seq + 1,
			 .replace = replace };
	for (size_t i = 0; i < k; i++)
		total += refs[i].n_calls + refs[i].n_results;
	if (total) {
		if (!(b->refs = calloc(total, sizeof(*b->refs))))
			return enomem();
		if ((rc = hf_map_reserve(&b->staged, total)))
			goto fail;
	}
	for (size_t i = 0; i < k; i++) {
		uint64_t seq = b->first_seq + i;

		/* Results first: a call of the same message is not "issued
		 * earlier". */
		for (size_t j = 0; j < refs[i].n_results; j++) {
			const hf_ref *ref = &refs[i].results[j];
			hf_stage_ref *r = hf_map_get(&b->staged, ref->id, ref->len);
			hf_tool *old;

			if (r) {
				if (!r->fresh || r->result_seq || r->call_seq >= seq)
					goto not_open;
				r->result_seq = seq;
				continue;
			}
			old = tools ? hf_map_get(tools, ref->id, ref->len) : NULL;
			if (!old || old->result_seq)
				goto not_open;
			r = &b->refs[b->n_refs++];
			*r = (hf_stage_ref){ .id = ref->id, .len = ref->len,
					     .result_seq = seq, .old = old };
			hf_map_put(&b->staged, r->id, r->len, r);
			continue;
not_open:
			rc = histd_error_set(HISTD_EINVALID,
					     "messages[%zu].content[%u].tool_result.tool_call_id does not answer an open tool call",
					     i, ref->block);
			goto fail;
		}
		for (size_t j = 0; j < refs[i].n_calls; j++) {
			const hf_ref *ref = &refs[i].calls[j];
			hf_stage_ref *r;
			hf_tool *t;

			if (hf_map_get(&b->staged, ref->id, ref->len) ||
			    (tools && hf_map_get(tools, ref->id, ref->len))) {
				rc = histd_error_set(HISTD_EINVALID,
						     "messages[%zu].content[%u].tool_call.id is already used in this session",
						     i, ref->block);
				goto fail;
			}
			if (ref->len > UINT32_MAX ||
			    !(t = malloc(sizeof(*t) + ref->len + 1))) {
				rc = enomem();
				goto fail;
			}
			t->call_seq = seq;
			t->result_seq = 0;
			t->len = (uint32_t)ref->len;
			memcpy(t->id, ref->id, ref->len);
			t->id[ref->len] = '\0';
			r = &b->refs[b->n_refs++];
			/* Keyed by the entry's own copy: ref->id may be a
			 * caller's string or bytes of a log file. */
			*r = (hf_stage_ref){ .id = t->id, .len = ref->len,
					     .call_seq = seq, .fresh = t };
			hf_map_put(&b->staged, r->id, r->len, r);
			b->n_fresh++;
		}
	}
	if (replace)
		rc = hf_map_reserve(&b->new_tools, b->n_fresh);
	else
		rc = hf_map_reserve(&s->tools, s->tools.n + b->n_fresh);
	if (rc || (!replace && (rc = hf_msgs_reserve(s, s->n_msgs + k))))
		goto fail;
	b->recs = recs;
	b->k = k;
	return 0;
fail:
	hf_batch_free(NULL, b);
	return rc;
}

void
hf_batch_apply(hf_driver *d, hf_batch *b, hf_session *s, int64_t at)
{
	hf_map *tools = &s->tools;

	if (b->replace) {
		hf_drop_messages(d, s);
		hf_drop_summaries(d, s);
		hf_drop_tools(&s->tools);
		s->tool_bytes = 0;
		s->tools = b->new_tools;
		b->new_tools = (hf_map){ 0 };
		s->msgs = b->recs;
		s->n_msgs = s->cap_msgs = b->k;
		s->cleared_to_seq = s->last_seq;
	} else {
		memcpy(s->msgs + s->n_msgs, b->recs, b->k * sizeof(*b->recs));
		s->n_msgs += b->k;
		if (!b->borrowed)
			free(b->recs);
	}
	b->recs = NULL;
	for (size_t i = s->n_msgs - b->k; i < s->n_msgs; i++) {
		s->token_total += s->msgs[i].token_estimate;
		s->bytes_total += s->msgs[i].len;
	}
	for (size_t i = 0; i < b->n_refs; i++) {
		hf_stage_ref *r = &b->refs[i];

		if (r->old) {
			r->old->result_seq = r->result_seq;
		} else {
			r->fresh->result_seq = r->result_seq;
			hf_map_put(tools, r->fresh->id, r->fresh->len, r->fresh);
			s->tool_bytes += r->fresh->len;
			r->fresh = NULL;
		}
	}
	s->last_seq += b->k;
	s->revision++;
	s->active_at_us = at;
	b->k = 0;
	hf_batch_free(d, b);
}

/* ---------------------------------------------------------------------- */
/* Changes shared by live calls and replay                                 */

void
hf_apply_clear(hf_driver *d, hf_session *s, int64_t at)
{
	hf_drop_messages(d, s);
	hf_drop_summaries(d, s);
	hf_drop_tools(&s->tools);
	s->tool_bytes = 0;
	s->cleared_to_seq = s->last_seq;
	s->revision++;
	s->active_at_us = at;
}

int
hf_is_system(const histd_record *r)
{
	return histd_index_message_role(r->data, r->len) ==
	       HISTD__V1__ROLE__ROLE_SYSTEM;
}

int
hf_truncate_deletes(const hf_session *s, uint64_t up_to)
{
	for (size_t i = 0; i < s->n_msgs && s->msgs[i].seq <= up_to; i++)
		if (!hf_is_system(&s->msgs[i]))
			return 1;
	return 0;
}

/* Whether a message with this seq (>= 1) is stored. */
static int
stored(const hf_session *s, uint64_t seq)
{
	size_t i = hf_first_after(s->msgs, s->n_msgs, seq - 1);

	return i < s->n_msgs && s->msgs[i].seq == seq;
}

void
hf_apply_truncate(hf_driver *d, hf_session *s, uint64_t up_to, void **victims,
		  int64_t at)
{
	size_t k = hf_first_after(s->msgs, s->n_msgs, up_to), w = 0, nv = 0;

	for (size_t i = 0; i < k; i++) {
		if (hf_is_system(&s->msgs[i])) {
			s->msgs[w++] = s->msgs[i];
			continue;
		}
		s->token_total -= s->msgs[i].token_estimate;
		s->bytes_total -= s->msgs[i].len;
		hf_free_data(d, s->msgs[i].data, s->msgs[i].len);
	}
	memmove(s->msgs + w, s->msgs + k, (s->n_msgs - k) * sizeof(*s->msgs));
	s->n_msgs -= k - w;

	s->vec_bytes = 0;
	w = 0;
	for (size_t i = 0; i < s->vecs.n; i++) {
		histd_vec *x = s->vecs.v[i];

		if (x->seq <= up_to && !stored(s, x->seq)) {
			free(x);
			continue;
		}
		s->vecs.v[w++] = x;
		s->vec_bytes += HF_VEC_FRAME(x->dim, strlen(x->model));
	}
	s->vecs.n = w;

	/* Collected first: deleting while walking the table would move
	 * entries past the cursor. */
	for (size_t i = 0; s->tools.s && i <= s->tools.mask; i++) {
		hf_tool *t = s->tools.s[i].v;

		if (t && t->call_seq <= up_to && !stored(s, t->call_seq))
			victims[nv++] = t;
	}
	for (size_t i = 0; i < nv; i++) {
		hf_tool *t = victims[i];

		hf_map_del(&s->tools, t->id, t->len);
		s->tool_bytes -= t->len;
		free(t);
	}

	w = 0;
	for (size_t i = 0; i < s->n_sums; i++) {
		if (s->sums[i].seq <= up_to) {
			s->sum_bytes -= s->sums[i].len;
			hf_free_data(d, s->sums[i].data, s->sums[i].len);
		} else {
			s->sums[w++] = s->sums[i];
		}
	}
	s->n_sums = w;
	s->best_sum = 0;
	for (size_t i = 1; i < s->n_sums; i++)
		if (s->sums[i].seq >= s->sums[s->best_sum].seq)
			s->best_sum = i;
	if (up_to > s->cleared_to_seq)
		s->cleared_to_seq = up_to;
	s->revision++;
	s->active_at_us = at;
}

void
hf_apply_summary(hf_session *s, const histd_record *r, int64_t at)
{
	s->sums[s->n_sums] = *r;
	/* >=: the newest put wins a tie. */
	if (s->n_sums == 0 || r->seq >= s->sums[s->best_sum].seq)
		s->best_sum = s->n_sums;
	s->n_sums++;
	s->sum_bytes += r->len;
	s->revision++;
	s->active_at_us = at;
}

void
hf_apply_update(hf_session *s, histd_kv *labels, size_t n_labels,
		int has_labels, uint8_t *config, size_t config_len,
		int has_config, int64_t now_us)
{
	if (has_labels) {
		histd_kv_free(s->labels, s->n_labels);
		s->labels = labels;
		s->n_labels = n_labels;
	}
	if (has_config) {
		free(s->config);
		s->config = config;
		s->config_len = config_len;
	}
	s->updated_at_us = s->active_at_us = now_us;
	s->revision++;
	s->meta_bytes = 0;
}

hf_session *
hf_fork_build(const hf_session *src, uint64_t up_to_seq,
	      const histd_session *in)
{
	hf_session *f = hf_session_new(in);
	uint64_t last;
	size_t k;

	if (!f)
		return NULL;
	last = up_to_seq && up_to_seq < src->last_seq ? up_to_seq : src->last_seq;
	free(f->config);
	f->config = NULL;
	f->config_len = 0;
	if (src->config_len) {
		if (!(f->config = malloc(src->config_len)))
			goto fail;
		memcpy(f->config, src->config, src->config_len);
		f->config_len = src->config_len;
	}
	k = hf_first_after(src->msgs, src->n_msgs, last);
	if (hf_msgs_reserve(f, k))
		goto fail;
	for (; f->n_msgs < k; f->n_msgs++) {
		const histd_record *r = &src->msgs[f->n_msgs];
		histd_record *c = &f->msgs[f->n_msgs];

		if (!(c->data = malloc(r->len)))
			goto fail;
		memcpy(c->data, r->data, r->len);
		c->seq = r->seq;
		c->token_estimate = r->token_estimate;
		c->len = r->len;
		f->token_total += r->token_estimate;
		f->bytes_total += r->len;
	}
	for (size_t i = 0; i < src->n_sums; i++) {
		const histd_record *r = &src->sums[i];
		histd_record c = *r;

		if (up_to_seq && r->seq > up_to_seq)
			continue;
		if (hf_sums_reserve(f, f->n_sums + 1) ||
		    !(c.data = malloc(r->len ? r->len : 1)))
			goto fail;
		memcpy(c.data, r->data, r->len);
		hf_apply_summary(f, &c, f->active_at_us);
	}
	f->revision = 1;        /* hf_apply_summary counted the copies */
	/* The tool calls the copied messages issued, answered only if the
	 * answer was copied too. */
	if (hf_map_reserve(&f->tools, src->tools.n))
		goto fail;
	for (size_t i = 0; src->tools.s && i <= src->tools.mask; i++) {
		const hf_tool *t = src->tools.s[i].v;
		hf_tool *c;

		if (!t || t->call_seq > last)
			continue;
		if (!(c = malloc(sizeof(*c) + t->len + 1)))
			goto fail;
		memcpy(c, t, sizeof(*c) + t->len + 1);
		if (c->result_seq > last)
			c->result_seq = 0;
		hf_map_put(&f->tools, c->id, c->len, c);
		f->tool_bytes += c->len;
	}
	/* Embeddings go with the messages they belong to. */
	if (histd_vecs_copy(&f->vecs, &src->vecs, last))
		goto fail;
	for (size_t i = 0; i < f->vecs.n; i++)
		f->vec_bytes += HF_VEC_FRAME(f->vecs.v[i]->dim,
					     strlen(f->vecs.v[i]->model));
	f->last_seq = last;
	f->cleared_to_seq = src->cleared_to_seq < last ? src->cleared_to_seq : last;
	return f;
fail:
	hf_session_destroy(NULL, f);
	return NULL;
}

hf_idem *
hf_idem_new(const char *key, size_t len)
{
	hf_idem *e;

	if (len > UINT32_MAX || !(e = calloc(1, sizeof(*e) + len + 1)))
		return NULL;
	e->len = (uint32_t)len;
	memcpy(e->key, key, len);
	e->key[len] = '\0';
	return e;
}

void
hf_apply_idem(hf_session *s, hf_idem *old, hf_idem *fresh,
	      const uint8_t *hash, int64_t expires_us, uint64_t first_seq,
	      uint64_t lsn)
{
	hf_idem *e = old ? old : fresh;

	if (!old) {
		hf_map_put(&s->idem, e->key, e->len, e);
		s->idem_bytes += e->len;
	}
	memcpy(e->hash, hash, HISTD_HASH_LEN);
	e->expires_us = expires_us;
	e->first_seq = first_seq;
	e->last_seq = s->last_seq;
	e->revision = s->revision;
	e->lsn = lsn;
}

void
hf_idem_purge(hf_session *s, int64_t now_us)
{
	/* A sweep when the table doubled since the last: amortized O(1) per
	 * key added. Expired keys are invisible anyway (lookups check). */
	if (s->idem.n < 64 || s->idem.n < 2 * s->idem_swept)
		return;
	for (size_t i = 0; s->idem.s && i <= s->idem.mask;) {
		hf_idem *e = s->idem.s[i].v;

		if (e && e->expires_us <= now_us) {
			/* Deletion may shift a later entry into slot i. */
			hf_map_del(&s->idem, e->key, e->len);
			s->idem_bytes -= e->len;
			free(e);
			continue;
		}
		i++;
	}
	s->idem_swept = s->idem.n;
}
