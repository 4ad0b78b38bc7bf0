/*
 * window: the last N messages, or as many of the newest messages as fit
 * a token budget (or both: the tighter wins).
 *
 * System messages and the summary message are always kept and do not
 * count toward max_messages; their tokens do count toward max_tokens (the
 * budget is what the model receives). The view starts only at a safe
 * start (plugin.h): the window moves its start later rather than keep a
 * tool_result without its tool_call or cut an assistant turn, so it never
 * exceeds its bounds; when not even the newest turn fits, only system and
 * summary messages are left.
 *
 * Options:
 *   max_messages (alias max_length)  1..10,000,000; 0 or absent: no limit
 *   max_tokens                        1..2^32-1;   0 or absent: no limit
 *   provider                          measure max_tokens by that
 *                                     provider's image and document rules
 *                                     (tokens.h: anthropic; openai and
 *                                     its formats openai_chat and
 *                                     openai_responses, one rule; gemini
 *                                     or google; mistral); absent or
 *                                     default: the stored estimates.
 *                                     Costs an unpack of each message the
 *                                     budget walks.
 *   retention                         view (default): the bounds are a
 *                                     view, nothing is deleted; delete:
 *                                     after appends the server deletes
 *                                     the non-system messages older than
 *                                     the window's start (server/
 *                                     context.c). The transform is the
 *                                     same either way.
 * At least one of max_messages and max_tokens is required.
 */
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "plugin.h"
#include "tokens.h"

struct window {
	uint64_t max_messages;
	uint64_t max_tokens;
	histd_tokens_provider provider;
	int retention_delete;
};

static int
w_configure(const histd_plugin_opt *o, size_t n, void **state, char *err,
	    size_t cap)
{
	struct window w = { 0 }, *s;
	int rc;

	for (size_t i = 0; i < n; i++) {
		if (!strcmp(o[i].key, "max_messages") ||
		    !strcmp(o[i].key, "max_length"))
			rc = histd_opt_uint(&o[i], 10000000, &w.max_messages,
					    err, cap);
		else if (!strcmp(o[i].key, "max_tokens"))
			rc = histd_opt_uint(&o[i], UINT32_MAX, &w.max_tokens,
					    err, cap);
		else if (!strcmp(o[i].key, "provider")) {
			rc = 0;
			if (histd_tokens_provider_parse(o[i].value,
							&w.provider)) {
				snprintf(err, cap, "options.provider must be "
					 "anthropic, openai, openai_chat, "
					 "openai_responses, gemini, google, "
					 "mistral or default");
				rc = HISTD_EINVALID;
			}
		} else if (!strcmp(o[i].key, "retention")) {
			rc = 0;
			if (!strcmp(o[i].value, "delete")) {
				w.retention_delete = 1;
			} else if (!strcmp(o[i].value, "view")) {
				w.retention_delete = 0;
			} else {
				snprintf(err, cap, "options.retention must be "
					 "view or delete");
				rc = HISTD_EINVALID;
			}
		} else
			rc = histd_opt_unknown(&o[i], "window", err, cap);
		if (rc)
			return rc;
	}
	if (!w.max_messages && !w.max_tokens) {
		snprintf(err, cap, "options: max_messages or max_tokens is "
			 "required (above 0; 0 means no limit)");
		return HISTD_EINVALID;
	}
	if (!(s = malloc(sizeof(*s))))
		return HISTD_ENOMEM;
	*s = w;
	*state = s;
	return 0;
}

static void
w_release(void *state)
{
	free(state);
}

static int
pinned(const histd_view_item *it)
{
	return (it->flags & (HISTD_ITEM_SYSTEM | HISTD_ITEM_SUMMARY)) != 0;
}

/* Item i's cost under the window's rules: the stored estimate, or the
 * provider's (text counts the same, images and documents may not). */
static uint64_t
item_tokens(const struct window *w, histd_view *v, size_t i)
{
	const Histd__V1__Message *m;

	if (w->provider == HISTD_TOKENS_DEFAULT)
		return v->items[i].tokens;
	m = v->ops->message(v, i);
	return m ? histd_tokens_message_for(m, w->provider)
		 : v->items[i].tokens;
}

static int
w_transform(void *state, histd_view *v)
{
	const struct window *w = state;
	size_t from = 0, m, s0, s;
	uint64_t pinned_tokens = 0, sum = 0;
	unsigned char *safe;
	int rc;

	while (from < v->n && pinned(&v->items[from]))
		pinned_tokens += item_tokens(w, v, from++);
	m = v->n - from;

	/* s0: the earliest start the bounds allow. */
	s0 = 0;
	if (w->max_messages && m > w->max_messages)
		s0 = m - (size_t)w->max_messages;
	if (w->max_tokens) {
		uint64_t avail = w->max_tokens > pinned_tokens ?
				 w->max_tokens - pinned_tokens : 0;
		size_t k = m;

		uint64_t t;

		while (k > 0 &&
		       sum + (t = item_tokens(w, v, from + k - 1)) <= avail) {
			sum += t;
			k--;
		}
		if (k > s0)
			s0 = k;
	}
	/* Everything loaded fits: older messages might too. */
	if (s0 == 0 && !v->complete)
		return HISTD_PLUGIN_MORE;

	if (!(safe = malloc(m + 1)))
		return HISTD_ENOMEM;
	/* Only starts from s0 on can be chosen: the scan stops there. */
	rc = histd_safe_starts_items_from(v, from, s0, safe, v->complete);
	if (rc) {
		free(safe);
		return rc;
	}
	for (s = s0; s < m && !safe[s]; s++)
		;
	free(safe);
	/* Drop the messages before the start, at once: items from..from+m
	 * are none of them pinned (the pinned ones lead the view). */
	histd_view_remove_range(v, from, s);
	v->bounded = 1;
	return 0;
}

int
histd_window_retention_delete(const void *state)
{
	const struct window *w = state;

	return w && w->retention_delete;
}

/* With max_messages alone the window needs the newest max_messages + 1:
 * one more than it keeps tells it older messages exist. A token budget
 * gives no bound. */
static uint32_t
w_newest_needed(void *state)
{
	const struct window *w = state;

	if (w->max_tokens || w->max_messages >= UINT32_MAX)
		return 0;
	return (uint32_t)w->max_messages + 1;
}

const histd_plugin histd_plugin_window = {
	.version = HISTD_PLUGIN_VERSION,
	.name = "window",
	.configure = w_configure,
	.release = w_release,
	.transform = w_transform,
	.newest_needed = w_newest_needed,
};
