/*
 * masking: older tool results replaced by a marker naming their
 * tool_call_id, so that a long agent loop does not resend every file it
 * read. The original stays in storage; GetToolResult returns it.
 *
 * Walking from the newest result to the oldest, a result is a candidate
 * when its tool passes include_tools/exclude_tools and its content is at
 * least min_tokens_to_mask tokens. The newest keep_recent_results
 * candidates stay; older candidates are masked. A result that is no
 * candidate (an excluded tool, a small result) is never masked and takes
 * no recent slot: slots are for what masking would otherwise remove.
 *
 * The tool of a result is its tool_name, or else the name of the
 * tool_call it answers when that call is in the view.
 *
 * Options:
 *   keep_recent_results  0..1,000,000 (default 3)
 *   include_tools        only these tools' results are masked
 *   exclude_tools        these tools' results are never masked
 *                        (lists separated by ',', '|' or spaces; giving
 *                        both is INVALID_ARGUMENT)
 *   min_tokens_to_mask   0..2^32 (default 0)
 *
 * The marker is a text block:
 *   "[tool result masked: tool_call_id=<id>; GetToolResult returns it]"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "plugin.h"
#include "tokens.h"

#define MAX_TOOLS 256

struct masking {
	uint64_t keep;
	uint64_t min_tokens;
	int include;            /* 1: tools lists include; 0: exclude */
	size_t n_tools;         /* 0 with include 0: mask any tool */
	char **tools;
};

static void
m_release(void *state)
{
	struct masking *m = state;

	if (!m)
		return;
	for (size_t i = 0; i < m->n_tools; i++)
		free(m->tools[i]);
	free(m->tools);
	free(m);
}

static int
parse_tools(struct masking *m, const histd_plugin_opt *o, char *err,
	    size_t cap)
{
	const char *p = o->value;

	while (*p) {
		size_t n = strcspn(p, ",| ");

		if (n) {
			char **t;

			if (m->n_tools == MAX_TOOLS) {
				snprintf(err, cap, "options.%s names more than "
					 "%d tools", o->key, MAX_TOOLS);
				return HISTD_EINVALID;
			}
			t = realloc(m->tools, (m->n_tools + 1) * sizeof(*t));
			if (!t)
				return HISTD_ENOMEM;
			m->tools = t;
			if (!(t[m->n_tools] = strndup(p, n)))
				return HISTD_ENOMEM;
			m->n_tools++;
		}
		p += n;
		if (*p)
			p++;
	}
	return 0;
}

static int
m_configure(const histd_plugin_opt *o, size_t n, void **state, char *err,
	    size_t cap)
{
	struct masking *m = calloc(1, sizeof(*m));
	int have_incl = 0, have_excl = 0, rc = 0;

	if (!m)
		return HISTD_ENOMEM;
	m->keep = 3;
	for (size_t i = 0; i < n && !rc; i++) {
		if (!strcmp(o[i].key, "keep_recent_results"))
			rc = histd_opt_uint(&o[i], 1000000, &m->keep, err, cap);
		else if (!strcmp(o[i].key, "min_tokens_to_mask"))
			rc = histd_opt_uint(&o[i], UINT32_MAX, &m->min_tokens,
					    err, cap);
		else if (!strcmp(o[i].key, "include_tools"))
			have_incl = 1;
		else if (!strcmp(o[i].key, "exclude_tools"))
			have_excl = 1;
		else
			rc = histd_opt_unknown(&o[i], "masking", err, cap);
	}
	if (!rc && have_incl && have_excl) {
		snprintf(err, cap, "options: include_tools and exclude_tools "
			 "cannot both be given");
		rc = HISTD_EINVALID;
	}
	m->include = have_incl;
	for (size_t i = 0; i < n && !rc; i++)
		if (!strcmp(o[i].key, "include_tools") ||
		    !strcmp(o[i].key, "exclude_tools"))
			rc = parse_tools(m, &o[i], err, cap);
	if (rc) {
		m_release(m);
		return rc;
	}
	*state = m;
	return 0;
}

static int
listed(const struct masking *m, const char *tool)
{
	for (size_t i = 0; i < m->n_tools; i++)
		if (!strcmp(m->tools[i], tool))
			return 1;
	return 0;
}

/* The name of the call `id` answers, from the view's tool calls (read
 * by histd_view_tools: no unpacking; a message that does not decode is
 * passed over). */
static const char *
call_name(histd_view *v, const char *id)
{
	for (size_t i = 0; i < v->n; i++) {
		const histd_view_tool *refs;
		size_t n;

		if (!(v->items[i].flags & HISTD_ITEM_CALLS) ||
		    histd_view_tools(v, i, &refs, &n))
			continue;
		for (size_t j = 0; j < n; j++)
			if (refs[j].kind == HISTD_ITEM_CALLS &&
			    !strcmp(refs[j].id, id))
				return refs[j].name;
	}
	return "";
}

/* The marker that stands for the result of call `id`. */
static char *
marker(histd_view *v, const char *id)
{
	size_t len = strlen(id) + 80;
	char *text = v->ops->alloc(v, len);

	if (text)
		snprintf(text, len, "[tool result masked: tool_call_id=%s; "
			 "GetToolResult returns it]", id);
	return text;
}

/* Replaces block b's tool result by the marker. */
static int
mask_block(histd_view *v, Histd__V1__ContentBlock *b)
{
	static const Histd__V1__ToolResultBlock tr_init =
		HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	static const Histd__V1__ContentBlock cb_init =
		HISTD__V1__CONTENT_BLOCK__INIT;
	static const Histd__V1__TextBlock tb_init = HISTD__V1__TEXT_BLOCK__INIT;
	const Histd__V1__ToolResultBlock *old = b->tool_result;
	Histd__V1__ToolResultBlock *tr = v->ops->alloc(v, sizeof(*tr));
	Histd__V1__ContentBlock *cb = v->ops->alloc(v, sizeof(*cb));
	Histd__V1__ContentBlock **arr = v->ops->alloc(v, sizeof(*arr));
	Histd__V1__TextBlock *tb = v->ops->alloc(v, sizeof(*tb));
	char *text = marker(v, old->tool_call_id);

	if (!tr || !cb || !arr || !tb || !text)
		return HISTD_ENOMEM;
	*tb = tb_init;
	tb->text = text;
	*cb = cb_init;
	cb->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	cb->text = tb;
	arr[0] = cb;
	*tr = tr_init;
	tr->tool_call_id = old->tool_call_id;
	tr->tool_name = old->tool_name;
	tr->is_error = old->is_error;
	tr->content = arr;
	tr->n_content = 1;
	b->tool_result = tr;
	return 0;
}

/* 1 if block b of msg is a tool result. */
static int
valid_result(const Histd__V1__Message *msg, uint32_t b)
{
	return b < msg->n_content && msg->content[b]->block_case ==
	       HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
}

/* Item i's message unpacked, if its block b is a tool result; else NULL
 * (the bytes do not hold what histd_view_tools read from them). */
static Histd__V1__Message *
unpacked(histd_view *v, size_t i, uint32_t b)
{
	Histd__V1__Message *msg = v->ops->message(v, i);

	return msg && valid_result(msg, b) ? msg : NULL;
}

/*
 * The candidates are found from the tool ids and names alone
 * (histd_view_tools); a message is unpacked only to measure its results
 * (min_tokens_to_mask) or to mask one.
 */
static int
m_transform(void *state, histd_view *v)
{
	const struct masking *m = state;
	uint64_t kept = 0;

	for (size_t i = v->n; i-- > 0;) {
		Histd__V1__Message *msg = NULL;
		const histd_view_tool *refs;
		size_t n_refs;
		int changed = 0, rc;

		if (!(v->items[i].flags & HISTD_ITEM_RESULTS))
			continue;
		if ((rc = histd_view_tools(v, i, &refs, &n_refs)))
			return rc;
		for (size_t j = n_refs; j-- > 0;) {
			const char *tool;

			if (refs[j].kind != HISTD_ITEM_RESULTS)
				continue;
			tool = refs[j].name[0] ? refs[j].name :
			       call_name(v, refs[j].id);
			if (m->include ? !listed(m, tool) : listed(m, tool))
				continue;
			if (m->min_tokens) {
				const Histd__V1__ToolResultBlock *tr;

				/* Measured unpacked, once per message; refs
				 * stay valid (arena). */
				if (!msg)
					msg = v->ops->message(v, i);
				if (!msg || !valid_result(msg, refs[j].block))
					return HISTD_ECORRUPT;
				tr = msg->content[refs[j].block]->tool_result;
				if (histd_tokens_blocks(tr->content,
							tr->n_content) <
				    m->min_tokens)
					continue;
			}
			if (kept < m->keep) {
				kept++;
				continue;
			}
			if (!msg) {
				/* In the bytes, when they are plain enough
				 * (histd_view_mask_result); else unpacked. */
				const char *text = marker(v, refs[j].id);
				int done;

				if (!text)
					return HISTD_ENOMEM;
				if ((rc = histd_view_mask_result(v, i,
						refs[j].block, text, &done)))
					return rc;
				if (done)
					continue;
				if (!(msg = unpacked(v, i, refs[j].block)))
					return HISTD_ECORRUPT;
			} else if (!valid_result(msg, refs[j].block)) {
				return HISTD_ECORRUPT;
			}
			if ((rc = mask_block(v, msg->content[refs[j].block])))
				return rc;
			changed = 1;
		}
		if (changed)
			v->ops->changed(v, i);
	}
	return 0;
}

const histd_plugin histd_plugin_masking = {
	.version = HISTD_PLUGIN_VERSION,
	.name = "masking",
	.configure = m_configure,
	.release = m_release,
	.transform = m_transform,
};
