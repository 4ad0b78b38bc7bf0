/*
 * The driver registry, the histd_driver_* wrappers, and the value helpers
 * of driver.h.
 *
 * The wrappers check what every driver would otherwise check the same way
 * (NULL pointers, empty tenant or id, unsorted pairs), so that a driver sees
 * only well-formed calls. They also pass drivers zeroed out-parameters of
 * their own and copy them to the caller only on success (and the current
 * revision on ECONFLICT): a caller's out-parameters are untouched on any
 * error even if a driver is careless. Scalar out-parameters
 * (revision, cleared_to_seq, current_revision, created) may be NULL.
 */
#include "driver.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "histd_wire.h"
#include "file/file.h"
#include "memory/memory.h"
#include "postgres/postgres.h"

/* ---------------------------------------------------------------------- */
/* Observing calls: the wrappers are the one place that times them.       */

static histd_driver_observer observer;

void
histd_driver_set_observer(histd_driver_observer fn)
{
	observer = fn;
}

/* Evaluates a callback, reporting its duration and result when an
 * observer is set. */
#define OBSERVED(op, call)                                                  \
	({                                                                  \
		histd_driver_observer obs_ = observer;                      \
		int64_t t0_ = obs_ ? histd_mono_us() : 0;                   \
		int rc_ = (call);                                           \
		if (obs_)                                                   \
			obs_(op, histd_mono_us() - t0_, rc_);               \
		rc_;                                                        \
	})

/* ---------------------------------------------------------------------- */
/* Registry                                                                */

static const struct {
	const char *name;
	histd_driver_open_fn open;
} registry[] = {
	{ "memory", histd_memory_driver_open },
	{ "file", histd_file_driver_open },
	{ "postgres", histd_postgres_driver_open },
};

#define N_DRIVERS (sizeof(registry) / sizeof(registry[0]))

/* Kept in step with `registry`, for histd_driver_names. */
static const char *const registry_names[N_DRIVERS + 1] = {
	"memory",
	"file",
	"postgres",
	NULL,
};

const char *const *
histd_driver_names(void)
{
	return registry_names;
}

/* "memory, file" into buf, for the unknown-driver message. */
static void
known_names(char *buf, size_t size)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < N_DRIVERS && used < size; i++) {
		int n = snprintf(buf + used, size - used, "%s%s",
				 i ? ", " : "", registry[i].name);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

int
histd_driver_validate(const histd_driver *d)
{
	/* Every required member, in struct order, with its name for the
	 * message. Version 1 requires all of them but ping. */
	struct required {
		const char *name;
		int set;
	};
	const char *name;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	name = d->name;
	if (!name || !*name)
		return histd_error_set(HISTD_EINVALID, "driver has no name");
	if (d->version < 1 || d->version > HISTD_DRIVER_VERSION)
		return histd_error_set(HISTD_EINVALID,
				       "driver '%s': version %u is not supported (1..%u)",
				       name, d->version, HISTD_DRIVER_VERSION);

	const struct required req[] = {
		{ "session_create", d->session_create != NULL },
		{ "session_get", d->session_get != NULL },
		{ "session_resolve", d->session_resolve != NULL },
		{ "session_list", d->session_list != NULL },
		{ "session_update", d->session_update != NULL },
		{ "session_delete", d->session_delete != NULL },
		{ "session_fork", d->session_fork != NULL },
		{ "append", d->append != NULL },
		{ "read", d->read != NULL },
		{ "tool_result", d->tool_result != NULL },
		{ "clear", d->clear != NULL },
		{ "replace", d->replace != NULL },
		{ "summary_put", d->summary_put != NULL },
		{ "summary_get", d->summary_get != NULL },
		{ "set_notify", d->set_notify != NULL },
		{ "close", d->close != NULL },
	};
	for (size_t i = 0; i < sizeof(req) / sizeof(req[0]); i++)
		if (!req[i].set)
			return histd_error_set(HISTD_EINVALID,
					       "driver '%s': callback '%s' is missing",
					       name, req[i].name);
	/* Version 2 members (search, embedding_put) are optional, and not
	 * read at all in a version 1 struct, which may be shorter. A vector
	 * store without a search to query it is half a pair. */
	if (d->version >= 2 && d->embedding_put && !d->search)
		return histd_error_set(HISTD_EINVALID,
				       "driver '%s': embedding_put is set without search",
				       name);
	if (d->version >= 4 && !d->tenant_list)
		return histd_error_set(HISTD_EINVALID,
				       "driver '%s': callback 'tenant_list' is missing",
				       name);
	/* Truncating one life, without truncating at all, is half a pair:
	 * histd_driver_can_truncate would say no. */
	if (d->version >= 6 && d->truncate_life && !d->truncate)
		return histd_error_set(HISTD_EINVALID,
				       "driver '%s': truncate_life is set without truncate",
				       name);
	/* Likewise a vector store for one life without the plain one:
	 * semantic search asks for embedding_put. */
	if (d->version >= 7 && d->embedding_put_life && !d->embedding_put)
		return histd_error_set(HISTD_EINVALID,
				       "driver '%s': embedding_put_life is set without embedding_put",
				       name);
	return 0;
}

int
histd_driver_open(const char *name, const histd_driver_config *cfg,
		  histd_driver **out)
{
	histd_driver_config empty = { 0 };
	histd_driver *d = NULL;
	char known[256];
	int rc;

	if (!out)
		return histd_error_set(HISTD_EINVALID, "driver out-parameter is NULL");
	if (!name || !*name)
		return histd_error_set(HISTD_EINVALID, "driver name is empty");
	if (!cfg)
		cfg = &empty;
	for (size_t i = 0; i < N_DRIVERS; i++) {
		if (strcmp(registry[i].name, name) != 0)
			continue;
		rc = registry[i].open(cfg, &d);
		if (rc)
			return rc;
		rc = histd_driver_validate(d);
		if (rc) {
			/* close is what validation may have found missing. */
			if (d && d->close)
				d->close(d);
			return rc;
		}
		*out = d;
		return 0;
	}
	known_names(known, sizeof(known));
	return histd_error_set(HISTD_EINVALID, "unknown driver '%s' (known: %s)",
			       name, known);
}

/* ---------------------------------------------------------------------- */
/* Argument checks shared by the wrappers                                  */

static int
check_str(const char *s, const char *field)
{
	if (!s || !*s)
		return histd_error_set(HISTD_EINVALID, "%s is empty", field);
	return 0;
}

static int
check_names(histd_driver *d, const char *tenant, const char *id)
{
	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	int rc = check_str(tenant, "tenant");
	return rc ? rc : check_str(id, "session id");
}

/* Pairs must be set, sorted by key, keys unique: drivers compare and
 * canonicalize them without sorting again. */
static int
check_kv(const histd_kv *kv, size_t n, const char *field)
{
	if (n && !kv)
		return histd_error_set(HISTD_EINVALID, "%s is NULL with %zu pairs",
				       field, n);
	for (size_t i = 0; i < n; i++) {
		if (!kv[i].key || !kv[i].value)
			return histd_error_set(HISTD_EINVALID,
					       "%s[%zu] has a NULL key or value",
					       field, i);
		if (i && strcmp(kv[i - 1].key, kv[i].key) >= 0)
			return histd_error_set(HISTD_EINVALID,
					       "%s are not sorted by key with unique keys",
					       field);
	}
	return 0;
}

static int
check_bytes(const void *p, size_t len, const char *field)
{
	if (len && !p)
		return histd_error_set(HISTD_EINVALID, "%s is NULL with length %zu",
				       field, len);
	return 0;
}

/* The record fields of a session to create (create, resolve, fork). */
static int
check_session_in(const histd_session *in)
{
	int rc;

	if (!in)
		return histd_error_set(HISTD_EINVALID, "session is NULL");
	if ((rc = check_str(in->id, "session id")) ||
	    (rc = check_kv(in->context_keys, in->n_context_keys, "context_keys")) ||
	    (rc = check_kv(in->labels, in->n_labels, "labels")) ||
	    (rc = check_bytes(in->config, in->config_len, "config")))
		return rc;
	return 0;
}

static int
check_tool_refs(const histd_tool_ref *r, size_t n, size_t msg, const char *kind)
{
	if (n && !r)
		return histd_error_set(HISTD_EINVALID,
				       "messages[%zu] tool %s refs are NULL", msg, kind);
	for (size_t i = 0; i < n; i++)
		if (!r[i].id || !*r[i].id)
			return histd_error_set(HISTD_EINVALID,
					       "messages[%zu].content[%u].%s is empty",
					       msg, r[i].block, kind);
	return 0;
}

/* A batch for append (min 1 message) or replace (min 0). Records carry
 * their length as uint32 with up to 11 bytes of seq in front. */
static int
check_batch(const histd_append *a, size_t min)
{
	int rc;

	if (!a)
		return histd_error_set(HISTD_EINVALID, "append is NULL");
	if (a->n_msgs < min)
		return histd_error_set(HISTD_EINVALID, "messages is empty");
	if (a->n_msgs && !a->msgs)
		return histd_error_set(HISTD_EINVALID, "messages is NULL with %zu messages",
				       a->n_msgs);
	for (size_t i = 0; i < a->n_msgs; i++) {
		const histd_msg_in *m = &a->msgs[i];

		/* Zero bytes is a valid (all-default) Message: whether it is
		 * acceptable is the server's call, not storage's. */
		if (m->len && !m->data)
			return histd_error_set(HISTD_EINVALID,
					       "messages[%zu] is NULL with length %zu",
					       i, m->len);
		if (m->len > UINT32_MAX - 1 - HISTD_WIRE_VARINT_MAX)
			return histd_error_set(HISTD_EINVALID, "messages[%zu] is too large", i);
		if ((rc = check_tool_refs(m->calls, m->n_calls, i, "tool_call.id")) ||
		    (rc = check_tool_refs(m->results, m->n_results, i,
					  "tool_result.tool_call_id")))
			return rc;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Wrappers                                                                */

int
histd_driver_session_create(histd_driver *d, const histd_session *in,
			    histd_session **out)
{
	histd_session *s = NULL;
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if ((rc = check_session_in(in)) || (rc = check_str(in->tenant, "tenant")))
		return rc;
	if (!out)
		return histd_error_set(HISTD_EINVALID, "session out-parameter is NULL");
	rc = OBSERVED("session_create", d->session_create(d, in, &s));
	if (rc == 0)
		*out = s;
	return rc;
}

int
histd_driver_session_get(histd_driver *d, const char *tenant, const char *id,
			 histd_session **out)
{
	histd_session *s = NULL;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	if (!out)
		return histd_error_set(HISTD_EINVALID, "session out-parameter is NULL");
	rc = OBSERVED("session_get", d->session_get(d, tenant, id, &s));
	if (rc == 0)
		*out = s;
	return rc;
}

int
histd_driver_session_resolve(histd_driver *d, const histd_session *in,
			     histd_session **out, int *created)
{
	histd_session *s = NULL;
	int c = 0, rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if ((rc = check_session_in(in)) || (rc = check_str(in->tenant, "tenant")))
		return rc;
	if (!in->n_context_keys)
		return histd_error_set(HISTD_EINVALID, "context_keys is empty");
	if (!out)
		return histd_error_set(HISTD_EINVALID, "session out-parameter is NULL");
	rc = OBSERVED("session_resolve", d->session_resolve(d, in, &s, &c));
	if (rc == 0) {
		*out = s;
		if (created)
			*created = c;
	}
	return rc;
}

int
histd_driver_session_list(histd_driver *d, const histd_list *q,
			  histd_session_list *out)
{
	histd_session_list l = { 0 };
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if (!q || !out)
		return histd_error_set(HISTD_EINVALID, "list query or result is NULL");
	if ((rc = check_str(q->tenant, "tenant")) ||
	    (rc = check_kv(q->labels, q->n_labels, "labels")))
		return rc;
	if (q->limit < 1)
		return histd_error_set(HISTD_EINVALID, "limit must be at least 1");
	rc = OBSERVED("session_list", d->session_list(d, q, &l));
	if (rc == 0)
		*out = l;
	return rc;
}

int
histd_driver_session_update(histd_driver *d, const char *tenant,
			    const char *id, uint64_t expected_revision,
			    const histd_kv *labels, size_t n_labels,
			    const uint8_t *config, size_t config_len,
			    int64_t now_us, histd_session **out,
			    uint64_t *current_revision)
{
	histd_session *s = NULL;
	uint64_t cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	/* labels == NULL means "keep them", so only check a given list. */
	if (labels && (rc = check_kv(labels, n_labels, "labels")))
		return rc;
	if (!out)
		return histd_error_set(HISTD_EINVALID, "session out-parameter is NULL");
	rc = OBSERVED("session_update",
		      d->session_update(d, tenant, id, expected_revision, labels,
			       labels ? n_labels : 0, config,
			       config ? config_len : 0, now_us, &s, &cur));
	if (rc == 0)
		*out = s;
	else if (rc == HISTD_ECONFLICT && current_revision)
		*current_revision = cur;
	return rc;
}

int
histd_driver_session_delete(histd_driver *d, const char *tenant,
			    const char *id, uint64_t expected_revision,
			    uint64_t *current_revision)
{
	uint64_t cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	rc = OBSERVED("session_delete",
		      d->session_delete(d, tenant, id, expected_revision, &cur));
	if (rc == HISTD_ECONFLICT && current_revision)
		*current_revision = cur;
	return rc;
}

int
histd_driver_session_delete_life(histd_driver *d, const char *tenant,
				 const char *id, uint64_t expected_revision,
				 uint64_t incarnation,
				 uint64_t *current_revision)
{
	uint64_t cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	if (d->version < 5 || !d->session_delete_life)
		return histd_driver_session_delete(d, tenant, id,
						   expected_revision,
						   current_revision);
	rc = OBSERVED("session_delete",
		      d->session_delete_life(d, tenant, id, expected_revision,
					     incarnation, &cur));
	if (rc == HISTD_ECONFLICT && current_revision)
		*current_revision = cur;
	return rc;
}

int
histd_driver_session_fork(histd_driver *d, const char *tenant,
			  const char *source_id, uint64_t up_to_seq,
			  const histd_session *in, histd_session **out)
{
	return histd_driver_session_fork_life(d, tenant, source_id, 0,
					      up_to_seq, in, out);
}

int
histd_driver_session_fork_life(histd_driver *d, const char *tenant,
			       const char *source_id,
			       uint64_t source_incarnation,
			       uint64_t up_to_seq, const histd_session *in,
			       histd_session **out)
{
	histd_session *s = NULL;
	int rc;

	if ((rc = check_names(d, tenant, source_id)) || (rc = check_session_in(in)))
		return rc;
	/* The fork lives in the caller's tenant, like its source. */
	if (in->tenant && strcmp(in->tenant, tenant) != 0)
		return histd_error_set(HISTD_EINVALID,
				       "a session cannot be forked into another tenant");
	if (!out)
		return histd_error_set(HISTD_EINVALID, "session out-parameter is NULL");
	/* Without session_fork_life, whatever life is there. */
	if (source_incarnation && d->version >= 6 && d->session_fork_life)
		rc = OBSERVED("session_fork",
			      d->session_fork_life(d, tenant, source_id,
						   source_incarnation,
						   up_to_seq, in, &s));
	else
		rc = OBSERVED("session_fork",
			      d->session_fork(d, tenant, source_id, up_to_seq,
					      in, &s));
	if (rc == 0)
		*out = s;
	return rc;
}

/*
 * An append answered later (HISTD_PENDING, HISTD_DEFERRED) is observed
 * when its answer comes, with that answer: the wrapper puts its own
 * callbacks between the driver and the caller's.
 */
typedef struct observed_append {
	histd_driver_observer obs;
	int64_t t0;
	histd_durable_fn on_durable;
	void *durable_ctx;
	histd_result_fn on_result;
	void *result_ctx;
} observed_append;

static void
observed_durable(void *ctx, int rc, const char *msg)
{
	observed_append *o = ctx;
	histd_durable_fn fn = o->on_durable;
	void *fn_ctx = o->durable_ctx;

	o->obs("append", histd_mono_us() - o->t0, rc);
	free(o);
	fn(fn_ctx, rc, msg);
}

static void
observed_result(void *ctx, int rc, const histd_append_result *res,
		const char *msg)
{
	observed_append *o = ctx;
	histd_result_fn fn = o->on_result;
	void *fn_ctx = o->result_ctx;

	o->obs("append", histd_mono_us() - o->t0, rc);
	free(o);
	fn(fn_ctx, rc, res, msg);
}

/* d->append, observed; for one answered later, when the answer comes. */
static int
append_observed(histd_driver *d, const histd_append *a,
		histd_append_result *r)
{
	histd_driver_observer obs = observer;
	histd_append w;
	observed_append *o;
	int rc;

	if (!obs || (!a->on_durable && !a->on_result) ||
	    !(o = malloc(sizeof(*o))))
		return OBSERVED("append", d->append(d, a, r));
	*o = (observed_append){ .obs = obs, .t0 = histd_mono_us(),
				.on_durable = a->on_durable,
				.durable_ctx = a->durable_ctx,
				.on_result = a->on_result,
				.result_ctx = a->result_ctx };
	w = *a;
	w.on_durable = a->on_durable ? observed_durable : NULL;
	w.durable_ctx = o;
	w.on_result = a->on_result ? observed_result : NULL;
	w.result_ctx = o;
	rc = d->append(d, &w, r);
	/* Answered later: o is the callback's now, maybe already freed. */
	if ((rc == HISTD_PENDING && a->on_durable) ||
	    (rc == HISTD_DEFERRED && a->on_result))
		return rc;
	obs("append", histd_mono_us() - o->t0, rc);
	free(o);
	return rc;
}

int
histd_driver_append(histd_driver *d, const histd_append *a,
		    histd_append_result *res)
{
	histd_append_result r = { 0 };
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if ((rc = check_batch(a, 1)) ||
	    (rc = check_names(d, a->tenant, a->session_id)))
		return rc;
	if (a->idempotency_key && *a->idempotency_key && !a->request_hash)
		return histd_error_set(HISTD_EINVALID,
				       "idempotency_key is set without a request hash");
	if (!res)
		return histd_error_set(HISTD_EINVALID, "append result is NULL");
	rc = append_observed(d, a, &r);
	if (rc == HISTD_DEFERRED)
		/* The answer goes to on_result; a driver that defers without
		 * one would leave the append unanswered. */
		return a->on_result ? rc : histd_error_set(HISTD_EINTERNAL,
			"the driver deferred an append without on_result");
	if (rc == 0 || (rc == HISTD_PENDING && a->on_durable))
		*res = r;
	else if (rc == HISTD_ECONFLICT)
		res->current_revision = r.current_revision;
	return rc;
}

/* *out: the life of the session under the id now; else session_get's
 * error. */
static int
life_now(histd_driver *d, const char *tenant, const char *id, uint64_t *out)
{
	histd_session *now = NULL;
	int rc = OBSERVED("session_get", d->session_get(d, tenant, id, &now));

	if (rc == 0)
		*out = now->incarnation;
	histd_session_free(now);
	return rc;
}

/* 0 if the session under q's id is still the life `incarnation`;
 * ECONFLICT if it was made again since; its session_get's error. */
static int
same_life(histd_driver *d, const histd_read *q, uint64_t incarnation)
{
	uint64_t now = 0;
	int rc = life_now(d, q->tenant, q->session_id, &now);

	if (rc == 0 && now != incarnation)
		rc = histd_error_set(HISTD_ECONFLICT, "session %s changed while "
				     "it was read; read again", q->session_id);
	return rc;
}

int
histd_driver_read(histd_driver *d, const histd_read *q, histd_read_result *res)
{
	histd_read_result r = { 0 };
	histd_read capped;
	int rc;

	if (!q || !res)
		return histd_error_set(HISTD_EINVALID, "read query or result is NULL");
	if ((rc = check_names(d, q->tenant, q->session_id)))
		return rc;
	/* No seq passes INT64_MAX (PostgreSQL keeps them as bigint, where a
	 * larger after_seq would wrap negative and match every message). */
	if (q->after_seq > INT64_MAX) {
		capped = *q;
		capped.after_seq = INT64_MAX;
		q = &capped;
	}
	rc = OBSERVED("read", d->read(d, q, &r));
	if (rc == 0 && q->want_summary && !r.summary_read && !r.known) {
		histd_record_free(r.summary);
		r.summary = NULL;
		rc = OBSERVED("summary_get", d->summary_get(d, q->tenant,
				q->session_id, &r.summary));
		r.summary_read = rc == 0;
		/* Read apart from the messages: of their session only if it
		 * was not deleted and made again under the id in between (a
		 * newer summary of the same life is a state it had). Else
		 * ECONFLICT: the caller reads again. */
		if (rc == 0 && r.session)
			rc = same_life(d, q, r.session->incarnation);
	}
	if (rc == 0)
		*res = r;
	else
		histd_read_result_clear(&r);
	return rc;
}

int
histd_driver_tool_result(histd_driver *d, const char *tenant, const char *id,
			 const char *call_id, histd_record **out)
{
	histd_record *r = NULL;
	int rc;

	if ((rc = check_names(d, tenant, id)) ||
	    (rc = check_str(call_id, "tool_call_id")))
		return rc;
	if (!out)
		return histd_error_set(HISTD_EINVALID, "record out-parameter is NULL");
	rc = OBSERVED("tool_result",
		      d->tool_result(d, tenant, id, call_id, &r));
	if (rc == 0)
		*out = r;
	return rc;
}

int
histd_driver_clear(histd_driver *d, const char *tenant, const char *id,
		   uint64_t expected_revision, uint64_t *revision,
		   uint64_t *cleared_to_seq, uint64_t *current_revision)
{
	uint64_t rev = 0, cleared = 0, cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	rc = OBSERVED("clear", d->clear(d, tenant, id, expected_revision, &rev,
					&cleared, &cur));
	if (rc == 0) {
		if (revision)
			*revision = rev;
		if (cleared_to_seq)
			*cleared_to_seq = cleared;
	} else if (rc == HISTD_ECONFLICT && current_revision) {
		*current_revision = cur;
	}
	return rc;
}

int
histd_driver_replace(histd_driver *d, const histd_append *a,
		     histd_append_result *res, uint64_t *cleared_to_seq)
{
	histd_append_result r = { 0 };
	uint64_t cleared = 0;
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if ((rc = check_batch(a, 0)) ||
	    (rc = check_names(d, a->tenant, a->session_id)))
		return rc;
	if (!res)
		return histd_error_set(HISTD_EINVALID, "replace result is NULL");
	rc = OBSERVED("replace", d->replace(d, a, &r, &cleared));
	if (rc == 0) {
		*res = r;
		if (cleared_to_seq)
			*cleared_to_seq = cleared;
	} else if (rc == HISTD_ECONFLICT) {
		res->current_revision = r.current_revision;
	}
	return rc;
}

int
histd_driver_summary_put(histd_driver *d, const char *tenant, const char *id,
			 uint64_t expected_revision,
			 const histd_record *summary, uint64_t *revision,
			 uint64_t *current_revision)
{
	return histd_driver_summary_put_life(d, tenant, id, expected_revision,
					     0, summary, revision,
					     current_revision);
}

int
histd_driver_summary_put_life(histd_driver *d, const char *tenant,
			      const char *id, uint64_t expected_revision,
			      uint64_t incarnation,
			      const histd_record *summary, uint64_t *revision,
			      uint64_t *current_revision)
{
	uint64_t rev = 0, cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	if (!summary)
		return histd_error_set(HISTD_EINVALID, "summary is NULL");
	if ((rc = check_bytes(summary->data, summary->len, "summary")))
		return rc;
	/* Without summary_put_life, by revision alone. */
	if (incarnation && d->version >= 6 && d->summary_put_life)
		rc = OBSERVED("summary_put",
			      d->summary_put_life(d, tenant, id,
						  expected_revision,
						  incarnation, summary, &rev,
						  &cur));
	else
		rc = OBSERVED("summary_put",
			      d->summary_put(d, tenant, id, expected_revision,
					     summary, &rev, &cur));
	if (rc == 0) {
		if (revision)
			*revision = rev;
	} else if (rc == HISTD_ECONFLICT && current_revision) {
		*current_revision = cur;
	}
	return rc;
}

int
histd_driver_summary_get(histd_driver *d, const char *tenant, const char *id,
			 histd_record **out)
{
	histd_record *r = NULL;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	if (!out)
		return histd_error_set(HISTD_EINVALID, "record out-parameter is NULL");
	rc = OBSERVED("summary_get", d->summary_get(d, tenant, id, &r));
	if (rc == 0)
		*out = r;       /* NULL when the session has no summary */
	return rc;
}

void
histd_driver_set_notify(histd_driver *d, histd_change_fn fn, void *ctx)
{
	if (d)
		d->set_notify(d, fn, ctx);
}

int
histd_driver_ping(histd_driver *d)
{
	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	/* Optional: a driver without ping is always reachable. */
	return d->ping ? OBSERVED("ping", d->ping(d)) : 0;
}

int
histd_driver_can_search(const histd_driver *d)
{
	return d && d->version >= 2 && d->search != NULL;
}

int
histd_driver_can_embed(const histd_driver *d)
{
	return histd_driver_can_search(d) && d->embedding_put != NULL;
}

int
histd_driver_can_truncate(const histd_driver *d)
{
	return d && d->version >= 3 && d->truncate != NULL;
}

/* A search query every driver can take as it is. */
static int
check_search(const histd_search_query *q)
{
	int rc;

	if ((rc = check_str(q->tenant, "tenant")) ||
	    (rc = check_kv(q->labels, q->n_labels, "label_selector")))
		return rc;
	if (q->n_session_ids && !q->session_ids)
		return histd_error_set(HISTD_EINVALID,
				       "session ids are NULL with %zu ids",
				       q->n_session_ids);
	for (size_t i = 0; i < q->n_session_ids; i++)
		if ((rc = check_str(q->session_ids[i], "session id")))
			return rc;
	if (q->k < 1 || q->k > HISTD_SEARCH_K_MAX)
		return histd_error_set(HISTD_EINVALID, "k must be 1..%d",
				       HISTD_SEARCH_K_MAX);
	switch (q->mode) {
	case HISTD_SEARCH_LEXICAL:
		return check_str(q->text, "query");
	case HISTD_SEARCH_SEMANTIC:
		if (!q->vector || q->dim == 0)
			return histd_error_set(HISTD_EINVALID,
					       "the query vector is empty");
		return check_str(q->model, "embedding model");
	}
	return histd_error_set(HISTD_EINVALID, "unknown search mode %d",
			       (int)q->mode);
}

int
histd_driver_search(histd_driver *d, const histd_search_query *q,
		    histd_search_result *out)
{
	histd_search_result r = { 0 };
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if (!q || !out)
		return histd_error_set(HISTD_EINVALID, "search query or result is NULL");
	if ((rc = check_search(q)))
		return rc;
	if (!histd_driver_can_search(d))
		return histd_error_set(HISTD_EUNIMPL, "the driver cannot search");
	rc = OBSERVED("search", d->search(d, q, &r));
	if (rc == 0)
		*out = r;
	else
		histd_search_result_clear(&r);
	return rc;
}

int
histd_driver_embedding_put(histd_driver *d, const char *tenant,
			   const char *id, uint64_t seq, const char *model,
			   const float *v, uint32_t dim)
{
	return histd_driver_embedding_put_life(d, tenant, id, 0, seq, model, v,
					       dim);
}

/* 0 if the session under the id is the life `incarnation`; ENOTFOUND if
 * it is another one or gone, as the *_life callbacks answer;
 * session_get's other errors. */
static int
is_life(histd_driver *d, const char *tenant, const char *id,
	uint64_t incarnation)
{
	uint64_t now = 0;
	int rc = life_now(d, tenant, id, &now);

	if (rc == 0 && now != incarnation)
		rc = histd_error_set(HISTD_ENOTFOUND, "session not found "
				     "(it was deleted and created again)");
	return rc;
}

int
histd_driver_embedding_put_life(histd_driver *d, const char *tenant,
				const char *id, uint64_t incarnation,
				uint64_t seq, const char *model,
				const float *v, uint32_t dim)
{
	int rc;

	if ((rc = check_names(d, tenant, id)) ||
	    (rc = check_str(model, "embedding model")))
		return rc;
	if (!v || dim == 0)
		return histd_error_set(HISTD_EINVALID, "the embedding is empty");
	{
		/* As the drivers normalize it (histd_vec_normalize): a vector
		 * they cannot is the caller's, not a lack of memory. */
		double sq = 0;

		for (uint32_t i = 0; i < dim; i++)
			sq += (double)v[i] * v[i];
		if (!(sq > 0) || !isfinite(sq))
			return histd_error_set(HISTD_EINVALID, "the embedding is "
					       "a zero vector or not finite");
	}
	if (seq == 0)
		return histd_error_set(HISTD_EINVALID, "seq must be at least 1");
	if (d->version < 2 || !d->embedding_put)
		return histd_error_set(HISTD_EUNIMPL,
				       "the driver cannot store embeddings");
	if (incarnation && d->version >= 7 && d->embedding_put_life)
		return OBSERVED("embedding_put",
				d->embedding_put_life(d, tenant, id,
						      incarnation, seq, model,
						      v, dim));
	/* Without embedding_put_life, the life is checked first: a delete
	 * and create of the id between the two calls goes unseen. */
	if (incarnation && (rc = is_life(d, tenant, id, incarnation)))
		return rc;
	return OBSERVED("embedding_put",
			d->embedding_put(d, tenant, id, seq, model, v, dim));
}

int
histd_driver_truncate(histd_driver *d, const char *tenant, const char *id,
		      uint64_t up_to_seq, uint64_t expected_revision,
		      uint64_t *revision, uint64_t *current_revision)
{
	return histd_driver_truncate_life(d, tenant, id, up_to_seq,
					  expected_revision, 0, revision,
					  current_revision);
}

int
histd_driver_truncate_life(histd_driver *d, const char *tenant,
			   const char *id, uint64_t up_to_seq,
			   uint64_t expected_revision, uint64_t incarnation,
			   uint64_t *revision, uint64_t *current_revision)
{
	uint64_t rev = 0, cur = 0;
	int rc;

	if ((rc = check_names(d, tenant, id)))
		return rc;
	if (up_to_seq == 0)
		return histd_error_set(HISTD_EINVALID, "up_to_seq must be at least 1");
	if (!histd_driver_can_truncate(d))
		return histd_error_set(HISTD_EUNIMPL,
				       "the driver cannot delete old messages");
	/* Without truncate_life, by revision alone. */
	if (incarnation && d->version >= 6 && d->truncate_life)
		rc = OBSERVED("truncate",
			      d->truncate_life(d, tenant, id, up_to_seq,
					       expected_revision, incarnation,
					       &rev, &cur));
	else
		rc = OBSERVED("truncate",
			      d->truncate(d, tenant, id, up_to_seq,
					  expected_revision, &rev, &cur));
	if (rc == 0 && revision)
		*revision = rev;
	else if (rc == HISTD_ECONFLICT && current_revision)
		*current_revision = cur;
	return rc;
}

int
histd_driver_can_list_tenants(const histd_driver *d)
{
	return d && d->version >= 4 && d->tenant_list != NULL;
}

int
histd_driver_tenant_list(histd_driver *d, const char *after, uint32_t limit,
			 histd_tenant_list *out)
{
	histd_tenant_list l = { 0 };
	int rc;

	if (!d)
		return histd_error_set(HISTD_EINVALID, "driver is NULL");
	if (!out)
		return histd_error_set(HISTD_EINVALID, "tenant list is NULL");
	if (limit < 1)
		return histd_error_set(HISTD_EINVALID, "limit must be at least 1");
	if (!histd_driver_can_list_tenants(d))
		return histd_error_set(HISTD_EUNIMPL,
				       "the driver cannot list its tenants");
	rc = OBSERVED("tenant_list",
		      d->tenant_list(d, after && *after ? after : NULL, limit,
				     &l));
	if (rc == 0)
		*out = l;
	else
		histd_tenant_list_free(&l);
	return rc;
}

void
histd_driver_close(histd_driver *d)
{
	if (d)
		d->close(d);
}

/* ---------------------------------------------------------------------- */
/* Value helpers                                                           */

void
histd_kv_free(histd_kv *kv, size_t n)
{
	if (!kv)
		return;
	for (size_t i = 0; i < n; i++) {
		free(kv[i].key);
		free(kv[i].value);
	}
	free(kv);
}

int
histd_kv_dup(histd_kv **out, const histd_kv *in, size_t n)
{
	histd_kv *kv;

	if (n == 0) {
		*out = NULL;
		return 0;
	}
	kv = calloc(n, sizeof(*kv));
	if (!kv)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		kv[i].key = strdup(in[i].key);
		kv[i].value = strdup(in[i].value);
		if (!kv[i].key || !kv[i].value) {
			histd_kv_free(kv, i + 1);
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		}
	}
	*out = kv;
	return 0;
}

int
histd_kv_equal(const histd_kv *a, size_t na, const histd_kv *b, size_t nb)
{
	if (na != nb)
		return 0;
	for (size_t i = 0; i < na; i++)
		if (strcmp(a[i].key, b[i].key) != 0 ||
		    strcmp(a[i].value, b[i].value) != 0)
			return 0;
	return 1;
}

int
histd_kv_contains(const histd_kv *set, size_t nset, const histd_kv *sub,
		  size_t nsub)
{
	size_t i = 0;

	/* Both sorted: one merge walk. */
	for (size_t j = 0; j < nsub; j++) {
		int c = 1;

		while (i < nset && (c = strcmp(set[i].key, sub[j].key)) < 0)
			i++;
		if (i == nset || c != 0 || strcmp(set[i].value, sub[j].value) != 0)
			return 0;
		i++;
	}
	return 1;
}

void
histd_session_free(histd_session *s)
{
	if (!s)
		return;
	free(s->tenant);
	free(s->id);
	histd_kv_free(s->context_keys, s->n_context_keys);
	histd_kv_free(s->labels, s->n_labels);
	free(s->config);
	free(s);
}

uint64_t
histd_incarnation_next(void)
{
	static atomic_uint_fast64_t last;

	return (uint64_t)atomic_fetch_add(&last, 1) + 1;
}

histd_session *
histd_session_dup(const histd_session *s)
{
	histd_session *c;

	if (!s)
		return NULL;
	c = malloc(sizeof(*c));
	if (!c)
		return NULL;
	*c = *s;
	c->tenant = NULL;
	c->id = NULL;
	c->context_keys = c->labels = NULL;
	c->n_context_keys = c->n_labels = 0;
	c->config = NULL;
	c->config_len = 0;
	if (s->tenant && !(c->tenant = strdup(s->tenant)))
		goto fail;
	if (s->id && !(c->id = strdup(s->id)))
		goto fail;
	if (histd_kv_dup(&c->context_keys, s->context_keys, s->n_context_keys))
		goto fail;
	c->n_context_keys = s->n_context_keys;
	if (histd_kv_dup(&c->labels, s->labels, s->n_labels))
		goto fail;
	c->n_labels = s->n_labels;
	if (s->config && s->config_len) {
		if (!(c->config = malloc(s->config_len)))
			goto fail;
		memcpy(c->config, s->config, s->config_len);
		c->config_len = s->config_len;
	}
	return c;
fail:
	histd_session_free(c);
	return NULL;
}

void
histd_session_list_free(histd_session_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n; i++)
		histd_session_free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
	l->has_more = 0;
}

void
histd_tenant_list_free(histd_tenant_list *l)
{
	if (!l)
		return;
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
	l->has_more = 0;
	l->cap = 0;
}

int
histd_tenant_list_offer(histd_tenant_list *l, const char *after,
			uint32_t limit, const char *name)
{
	size_t lo = 0, hi = l->n;
	char *copy;

	if (after && *after && strcmp(name, after) <= 0)
		return 0;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (strcmp(l->v[mid], name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo >= limit) {
		l->has_more = 1;
		return 0;
	}
	if (l->n == l->cap && l->n < limit) {
		size_t cap = l->cap ? l->cap * 2 : 16;
		char **v;

		if (cap > limit)
			cap = limit;
		if (!(v = realloc(l->v, cap * sizeof(*v))))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		l->v = v;
		l->cap = cap;
	}
	if (!(copy = strdup(name)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (l->n == limit) {
		free(l->v[--l->n]);
		l->has_more = 1;
	}
	memmove(l->v + lo + 1, l->v + lo, (l->n - lo) * sizeof(*l->v));
	l->v[lo] = copy;
	l->n++;
	return 0;
}

/* A block of record bytes; blocks are linked newest first from l->mem. */
struct rec_block {
	struct rec_block *next;
	size_t used, cap;
	_Alignas(16) uint8_t data[];
};

#define REC_BLOCK_MIN 16384

/* Room for n records in l->v. */
static int
records_grow(histd_records *l, size_t n)
{
	histd_record *v;

	if (n <= l->cap)
		return 0;
	if (!(v = realloc(l->v, n * sizeof(*v))))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	l->v = v;
	l->cap = n;
	return 0;
}

int
histd_records_add(histd_records *l, uint64_t seq, uint32_t token_estimate,
		  const uint8_t *data, size_t len)
{
	struct rec_block *b = l->mem;
	uint8_t *copy;
	int rc;

	if (len > UINT32_MAX)
		return histd_error_set(HISTD_EINVALID, "record is too large");
	if (l->n == l->cap && (rc = records_grow(l, l->cap ? l->cap * 2 : 8)))
		return rc;
	/* Framed: behind the key and length, in the one buffer. */
	if (l->wire && l->wire_n == l->n &&
	    l->wire_cap - l->wire_len >= len + 1 + 2 * HISTD_WIRE_VARINT_MAX) {
		l->wire_len += histd_wire_put_len_key(l->wire + l->wire_len,
						      l->wire_field, len);
		copy = l->wire + l->wire_len;
		l->wire_len += len;
		l->wire_n++;
		goto copied;
	}
	/* Copies share blocks: a read of many records makes a few
	 * allocations, not one per record. */
	if (!b || b->cap - b->used < len) {
		size_t cap = len > REC_BLOCK_MIN ? len : REC_BLOCK_MIN;

		b = malloc(sizeof(*b) + cap);
		if (!b)
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		b->next = l->mem;
		b->used = 0;
		b->cap = cap;
		l->mem = b;
	}
	copy = b->data + b->used;
	b->used += len;
copied:
	if (len)
		memcpy(copy, data, len);
	l->v[l->n++] = (histd_record){
		.seq = seq,
		.token_estimate = token_estimate,
		.len = (uint32_t)len,
		.data = copy,
	};
	return 0;
}

int
histd_records_frame(histd_records *l, uint32_t field, size_t n, size_t bytes,
		    size_t slack)
{
	size_t cap = bytes + n * (1 + 2 * HISTD_WIRE_VARINT_MAX) + slack;
	int rc;

	if ((rc = records_grow(l, l->n + n)))
		return rc;
	/* Only a list that starts empty is framed whole. */
	if (l->n || l->wire)
		return 0;
	if (!(l->wire = malloc(cap ? cap : 1)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	l->wire_cap = cap;
	l->wire_len = 0;
	l->wire_n = 0;
	l->wire_field = field;
	return 0;
}

int
histd_records_reserve(histd_records *l, const histd_read *q,
		      const histd_record *src, size_t n)
{
	size_t bytes = 0;

	if (!q->frame_field)
		return records_grow(l, l->n + n);
	for (size_t i = 0; i < n; i++)
		bytes += src[i].len;
	return histd_records_frame(l, q->frame_field, n, bytes,
				   q->frame_slack);
}

int
histd_read_budget(const histd_read *q, const histd_record *v, size_t *from,
		  size_t *to)
{
	uint64_t size = 0;
	size_t k;

	if (!q->max_bytes || *to - *from <= 1)
		return 0;
	for (k = 0; k < *to - *from; k++) {
		const histd_record *r = q->last_n ? &v[*to - 1 - k]
						  : &v[*from + k];
		uint64_t one = 1 + histd_wire_varint_size(r->len) + r->len;

		if (k > 0 && size + one > q->max_bytes)
			break;
		size += one;
	}
	if (k == *to - *from)
		return 0;
	if (q->last_n)
		*from = *to - k;
	else
		*to = *from + k;
	return 1;
}

int
histd_read_known(const histd_read *q, uint64_t revision, int64_t created_us)
{
	return q->known_revision && q->known_revision == revision &&
	       q->known_created_us == created_us;
}

uint8_t *
histd_records_take_wire(histd_records *l, size_t slack, size_t *len)
{
	uint8_t *w = l->wire;

	if (!w || l->wire_n != l->n || l->wire_cap - l->wire_len < slack)
		return NULL;
	*len = l->wire_len;
	l->wire = NULL;
	l->wire_len = l->wire_cap = l->wire_n = 0;
	return w;
}

void
histd_records_clear(histd_records *l)
{
	if (!l)
		return;
	free(l->wire);
	l->wire = NULL;
	l->wire_len = l->wire_cap = l->wire_n = 0;
	while (l->mem) {
		struct rec_block *b = l->mem;

		l->mem = b->next;
		free(b);
	}
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}

histd_record *
histd_record_new(uint64_t seq, uint32_t token_estimate, const uint8_t *data,
		 size_t len)
{
	histd_record *r;

	if (len > UINT32_MAX)
		return NULL;
	/* One block: the bytes follow the struct, freed with it. */
	r = malloc(sizeof(*r) + (len ? len : 1));
	if (!r)
		return NULL;
	r->seq = seq;
	r->token_estimate = token_estimate;
	r->len = (uint32_t)len;
	r->data = (uint8_t *)(r + 1);
	if (len)
		memcpy(r->data, data, len);
	return r;
}

void
histd_record_free(histd_record *r)
{
	free(r);
}

void
histd_read_result_clear(histd_read_result *r)
{
	if (!r)
		return;
	histd_records_clear(&r->records);
	histd_session_free(r->session);
	histd_record_free(r->summary);
	memset(r, 0, sizeof(*r));
}

void
histd_search_result_clear(histd_search_result *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n; i++)
		free(r->hits[i].session_id);
	free(r->hits);
	histd_records_clear(&r->records);
	memset(r, 0, sizeof(*r));
}

int
histd_search_result_add(histd_search_result *r, const char *session_id,
			double score, uint64_t seq, uint32_t token_estimate,
			const uint8_t *data, size_t len)
{
	histd_search_hit *v = r->hits;
	char *id;

	/* hits grows with records; both by one here. */
	if ((r->n & (r->n - 1)) == 0 || r->n < 4) {
		size_t cap = r->n < 4 ? 4 : r->n * 2;

		if (!(v = realloc(r->hits, cap * sizeof(*v))))
			return histd_error_set(HISTD_ENOMEM, "out of memory");
		r->hits = v;
	}
	if (!(id = strdup(session_id)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if (histd_records_add(&r->records, seq, token_estimate, data, len)) {
		free(id);
		return HISTD_ENOMEM;
	}
	r->hits[r->n++] = (histd_search_hit){ .session_id = id, .score = score };
	return 0;
}
