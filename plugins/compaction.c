/*
 * compaction: a rolling summary of the messages before the recent tail.
 *
 * reduce picks how many of the oldest messages after the previous summary
 * to cover, always at a safe start (plugin.h) so that the verbatim tail
 * splits no tool call from its results and no assistant turn, never past
 * a tool call whose result has not come yet (histd_first_open_call: the
 * result, appended later, would lose its call), and never
 * into the newest keep_recent messages: the most recent tail stays
 * verbatim even when a Reduce bound asks for more (then the bound is met
 * as far as that allows). The summarizer gets the previous summary to
 * merge with (rolling) and the covered messages.
 *
 * Bounds (a Reduce call's; none: the plugin's own policy, "summarize all
 * but the tail"):
 *   max_tokens   the CONTEXT view (system messages + a summary of at most
 *                max_summary_tokens + the tail) fits this many tokens
 *   max_entries  the CONTEXT view holds at most this many messages
 *   older_than   every message older than this many seconds is covered
 *
 * after_append asks for a reduce when any auto_reduce_when condition
 * holds on the totals after the summary.
 *
 * Options:
 *   summarizer          "extractive" (default) or a provider summarizer
 *   keep_recent         messages kept verbatim, 0..1,000,000 (default 10)
 *   max_summary_tokens  1..100,000; absent: the summarizer's own (a
 *                       provider's --<p>-max-output-tokens, else 1024).
 *                       The bound applied is passed on in histd_reduce,
 *                       so the host cuts a longer text
 *   auto_reduce_when    conditions joined by '|' or spaces, any of
 *                       tokens>=N  messages>=N  age>=SECONDS
 *                       (after the newest summary; a '|' needs a
 *                       condition on each side); absent: never
 *   timeout_ms          a summarizer call's limit, 0..600,000 (0: its own)
 *   prompt              instructions for an LLM summarizer
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compaction.h"
#include "opts.h"
#include "tokens.h"

#define DEFAULT_KEEP 10
#define DEFAULT_SUMMARY_TOKENS 1024

struct compaction {
	char *summarizer;
	char *prompt;
	uint64_t keep;
	uint64_t max_summary_tokens;
	uint64_t timeout_ms;
	/* auto_reduce_when; 0: that condition is not used */
	uint64_t when_tokens, when_messages, when_age_s;
};

/* ---------------------------------------------------------------------- */
/* Summarizers by name                                                     */

static pthread_mutex_t source_lock = PTHREAD_MUTEX_INITIALIZER;
static histd_summarizer_source source;
static int have_source;

void
histd_compaction_set_source(const histd_summarizer_source *src)
{
	pthread_mutex_lock(&source_lock);
	have_source = src != NULL;
	if (src)
		source = *src;
	pthread_mutex_unlock(&source_lock);
}

static int
get_source(histd_summarizer_source *out)
{
	int have;

	pthread_mutex_lock(&source_lock);
	have = have_source;
	if (have)
		*out = source;
	pthread_mutex_unlock(&source_lock);
	return have;
}

int
histd_summarizer_exists(const char *name)
{
	histd_summarizer_source s;

	if (!strcmp(name, "extractive"))
		return 1;
	return get_source(&s) && s.exists && s.exists(s.arg, name);
}

int
histd_summarizer_open_named(const char *name, histd_summarizer **out)
{
	histd_summarizer_source s;

	if (!strcmp(name, "extractive"))
		return histd_extractive_new(out);
	if (get_source(&s) && s.exists && s.exists(s.arg, name) && s.open)
		return s.open(s.arg, name, out);
	return histd_error_set(HISTD_EINVALID, "unknown summarizer");
}

/* ---------------------------------------------------------------------- */
/* Options                                                                 */

static void
c_release(void *state)
{
	struct compaction *c = state;

	if (!c)
		return;
	free(c->summarizer);
	free(c->prompt);
	free(c);
}

static int
parse_when(struct compaction *c, const char *v, char *err, size_t cap)
{
	const char *p = v;
	int any = 0, after_cond = 0;

	while (*p) {
		size_t n = strcspn(p, "| ");
		char cond[64];
		const char *num;
		uint64_t *dst = NULL, x;
		char *end;

		if (*p == ' ') {
			p++;
			continue;
		}
		if (*p == '|') {
			/* A '|' joins two conditions: none may be empty. */
			if (!after_cond)
				goto empty;
			after_cond = 0;
			p++;
			continue;
		}
		after_cond = 1;
		if (n >= sizeof(cond))
			goto bad;
		memcpy(cond, p, n);
		cond[n] = '\0';
		p += n;
		if (!strncmp(cond, "tokens>=", 8)) {
			dst = &c->when_tokens;
			num = cond + 8;
		} else if (!strncmp(cond, "messages>=", 10)) {
			dst = &c->when_messages;
			num = cond + 10;
		} else if (!strncmp(cond, "age>=", 5)) {
			dst = &c->when_age_s;
			num = cond + 5;
		} else {
			goto bad;
		}
		if (*num < '0' || *num > '9')
			goto bad;
		x = strtoull(num, &end, 10);
		if (*end || x == 0 || x > UINT32_MAX * 1000ull)
			goto bad;
		*dst = x;
		any = 1;
	}
	if (any && !after_cond)
		goto empty;     /* a '|' at the end */
	if (any)
		return 0;
bad:
	snprintf(err, cap, "options.auto_reduce_when must be conditions "
		 "tokens>=N, messages>=N or age>=SECONDS (N > 0) joined by "
		 "'|'");
	return HISTD_EINVALID;
empty:
	snprintf(err, cap, "options.auto_reduce_when has an empty condition: "
		 "'|' must join two conditions");
	return HISTD_EINVALID;
}

static int
c_configure(const histd_plugin_opt *o, size_t n, void **state, char *err,
	    size_t cap)
{
	struct compaction *c = calloc(1, sizeof(*c));
	int rc = 0;

	if (!c)
		return HISTD_ENOMEM;
	c->keep = DEFAULT_KEEP;
	/* max_summary_tokens stays 0 unless set: the summarizer's own. */
	for (size_t i = 0; i < n && !rc; i++) {
		if (!strcmp(o[i].key, "summarizer")) {
			if (!histd_summarizer_exists(o[i].value)) {
				snprintf(err, cap, "options.summarizer names "
					 "no known summarizer");
				rc = HISTD_EINVALID;
			} else if (!(c->summarizer = strdup(o[i].value))) {
				rc = HISTD_ENOMEM;
			}
		} else if (!strcmp(o[i].key, "prompt")) {
			if (!(c->prompt = strdup(o[i].value)))
				rc = HISTD_ENOMEM;
		} else if (!strcmp(o[i].key, "keep_recent")) {
			rc = histd_opt_uint(&o[i], 1000000, &c->keep, err, cap);
		} else if (!strcmp(o[i].key, "max_summary_tokens")) {
			rc = histd_opt_uint(&o[i], 100000,
					    &c->max_summary_tokens, err, cap);
			if (rc || c->max_summary_tokens == 0) {
				snprintf(err, cap, "options.max_summary_tokens "
					 "must be a whole number from 1 to "
					 "100000");
				rc = HISTD_EINVALID;
			}
		} else if (!strcmp(o[i].key, "timeout_ms")) {
			rc = histd_opt_uint(&o[i], 600000, &c->timeout_ms, err,
					    cap);
		} else if (!strcmp(o[i].key, "auto_reduce_when")) {
			rc = parse_when(c, o[i].value, err, cap);
		} else {
			rc = histd_opt_unknown(&o[i], "compaction", err, cap);
		}
	}
	if (!rc && !c->summarizer && !(c->summarizer = strdup("extractive")))
		rc = HISTD_ENOMEM;
	if (rc) {
		c_release(c);
		return rc;
	}
	*state = c;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Hooks                                                                   */

static int
c_after_append(void *state, const histd_session_totals *t)
{
	const struct compaction *c = state;

	if (c->when_tokens && t->tokens_after_summary >= c->when_tokens)
		return 1;
	if (c->when_messages && t->messages_after_summary >= c->when_messages)
		return 1;
	if (c->when_age_s && t->oldest_after_summary_us > 0 &&
	    t->now_us - t->oldest_after_summary_us >=
	    (int64_t)c->when_age_s * 1000000)
		return 1;
	return 0;
}

static int64_t
created_us(const Histd__V1__Message *m)
{
	if (!m->created_at)
		return 0;
	return m->created_at->seconds * 1000000 + m->created_at->nanos / 1000;
}

/* How many of the oldest messages the bounds (or the policy) want
 * covered. */
static size_t
wanted_cut(const struct compaction *c, const histd_reduce *r)
{
	size_t n = r->n_messages, cut = 0;
	int bounded = 0;

	if (r->max_entries) {
		/* system + summary + tail <= max_entries */
		uint64_t fixed = (uint64_t)r->system_count + 1;
		uint64_t tail = r->max_entries > fixed ?
				r->max_entries - fixed : 0;

		bounded = 1;
		if (n > tail && n - tail > cut)
			cut = n - (size_t)tail;
	}
	if (r->max_tokens) {
		/* Unset: the budget assumes the default summary size. The
		 * summary message costs its text plus what wraps it (as the
		 * host counts it: overhead, prefix, closing bracket). */
		uint64_t fixed = r->system_tokens + (c->max_summary_tokens ?
			c->max_summary_tokens : DEFAULT_SUMMARY_TOKENS) +
			HISTD_TOKENS_MESSAGE_OVERHEAD +
			histd_tokens_text(HISTD_SUMMARY_PREFIX,
					  strlen(HISTD_SUMMARY_PREFIX)) + 1;
		uint64_t avail = r->max_tokens > fixed ? r->max_tokens - fixed : 0;
		uint64_t sum = 0;
		size_t k = n;

		bounded = 1;
		while (k > 0 && sum + r->messages[k - 1]->token_estimate <= avail)
			sum += r->messages[--k]->token_estimate;
		if (k > cut)
			cut = k;
	}
	if (r->older_than_s) {
		/* older_than_seconds comes from the request: any uint64.
		 * Saturated, an age past INT64_MAX us covers nothing
		 * (now_us >= 0, so the subtraction cannot overflow). */
		int64_t age = r->older_than_s > (uint64_t)INT64_MAX / 1000000 ?
			      INT64_MAX : (int64_t)r->older_than_s * 1000000;
		int64_t limit = r->now_us - age;
		size_t k = 0;

		bounded = 1;
		while (k < n && created_us(r->messages[k]) < limit)
			k++;
		if (k > cut)
			cut = k;
	}
	if (!bounded)
		cut = n;
	return cut;
}

static int
c_reduce(void *state, histd_reduce *r)
{
	const struct compaction *c = state;
	size_t n = r->n_messages, cut, limit, open;
	unsigned char *safe;
	histd_summarizer *s = NULL;
	histd_summary_request req = { 0 };
	histd_summary_result res = { 0 };
	int rc;

	r->n_covered = 0;
	if (n == 0)
		return 0;
	cut = wanted_cut(c, r);
	limit = n > c->keep ? n - (size_t)c->keep : 0;
	if (cut > limit)
		cut = limit;
	/* Never cover a call whose result has not come yet. */
	if ((rc = histd_first_open_call(r->messages, n, &open)))
		return rc;
	if (cut > open)
		cut = open;
	if (!(safe = malloc(n + 1)))
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	if ((rc = histd_safe_starts_msgs(r->messages, n, safe, 1))) {
		free(safe);
		return rc;
	}
	/* Cover less rather than split a turn or eat into the tail. */
	while (cut > 0 && !safe[cut])
		cut--;
	free(safe);
	if (cut == 0)
		return 0;

	if ((rc = histd_summarizer_open_named(c->summarizer, &s)))
		return rc;
	req.previous = r->previous && r->previous->text[0] ?
		       r->previous->text : NULL;
	req.messages = r->messages;
	req.n_messages = cut;
	req.prompt = c->prompt;
	req.max_output_tokens = (uint32_t)c->max_summary_tokens;
	/* A max_tokens bound planned room for the default summary size:
	 * ask for that, not a larger --<p>-max-output-tokens. */
	if (!req.max_output_tokens && r->max_tokens)
		req.max_output_tokens = DEFAULT_SUMMARY_TOKENS;
	req.timeout_ms = (uint32_t)c->timeout_ms;
	rc = s->summarize(s, &req, &res);
	s->free(s);
	if (rc)
		return rc;
	r->n_covered = cut;
	r->text = res.text;
	r->model = res.model;
	r->input_tokens = res.input_tokens;
	r->output_tokens = res.output_tokens;
	/* The bound the summarizer applied: the session's, else its own. */
	r->max_summary_tokens = res.max_output_tokens ? res.max_output_tokens
			      : (uint32_t)c->max_summary_tokens;
	return 0;
}

const histd_plugin histd_plugin_compaction = {
	.version = HISTD_PLUGIN_VERSION,
	.name = "compaction",
	.configure = c_configure,
	.release = c_release,
	.after_append = c_after_append,
	.reduce = c_reduce,
};
