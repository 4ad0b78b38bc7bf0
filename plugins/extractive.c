/*
 * The extractive summarizer (compaction.h): what compaction uses offline
 * and in tests. Deterministic: no clock, no randomness, no network.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compaction.h"
#include "tokens.h"

#define LINE_MAX_CHARS 200
#define DEFAULT_MAX_TOKENS 1024

/* A growable list of lines. */
struct lines {
	char **v;
	size_t n, cap;
};

static void
lines_free(struct lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static int
lines_add(struct lines *l, char *s)
{
	if (!s)
		return HISTD_ENOMEM;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		char **v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			free(s);
			return HISTD_ENOMEM;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = s;
	return 0;
}

/* The first sentence of text, whitespace folded, cut at LINE_MAX_CHARS
 * characters (not bytes: CJK or emoji lines are as long). */
static char *
first_sentence(const char *text)
{
	char *out = malloc(4 * LINE_MAX_CHARS + 4);
	size_t o = 0, chars = 0;
	int space = 0;

	if (!out)
		return NULL;
	while (*text == ' ' || *text == '\n' || *text == '\t' || *text == '\r')
		text++;
	for (const char *p = text; *p; p++) {
		unsigned char c = (unsigned char)*p;

		if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
			space = 1;
			if (c == '\n' && p[1] == '\n')
				break;      /* a paragraph ends a sentence */
			continue;
		}
		if (space && o) {
			if (chars >= LINE_MAX_CHARS)
				break;
			out[o++] = ' ';
			chars++;
		}
		space = 0;
		/* Stop at the limit, between characters: a continuation
		 * byte belongs to the character already counted (the text
		 * is valid UTF-8, at most 4 bytes a character). */
		if ((c & 0xc0) != 0x80) {
			if (chars >= LINE_MAX_CHARS)
				break;
			chars++;
		} else if (o >= 4 * LINE_MAX_CHARS + 3) {
			break;
		}
		out[o++] = (char)c;
		if ((c == '.' || c == '!' || c == '?') &&
		    (p[1] == ' ' || p[1] == '\n' || p[1] == '\0'))
			break;
	}
	out[o] = '\0';
	return out;
}

static const char *
role_name(int role)
{
	switch (role) {
	case HISTD__V1__ROLE__ROLE_SYSTEM: return "system";
	case HISTD__V1__ROLE__ROLE_USER: return "user";
	case HISTD__V1__ROLE__ROLE_ASSISTANT: return "assistant";
	case HISTD__V1__ROLE__ROLE_TOOL: return "tool";
	default: return "message";
	}
}

static char *
fmt(const char *a, const char *b, const char *c)
{
	size_t n = strlen(a) + strlen(b) + strlen(c) + 1;
	char *s = malloc(n);

	if (s)
		snprintf(s, n, "%s%s%s", a, b, c);
	return s;
}

static const char *
first_text(Histd__V1__ContentBlock *const *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i]->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT &&
		    b[i]->text->text[0])
			return b[i]->text->text;
	return NULL;
}

static int
message_lines(struct lines *l, const Histd__V1__Message *m)
{
	const char *role = role_name(m->role);
	const char *text = first_text(m->content, m->n_content);
	char *s, *pre;
	int rc = 0;

	if (text) {
		if (!(s = first_sentence(text)))
			return HISTD_ENOMEM;
		pre = fmt(role, ": ", "");
		rc = lines_add(l, pre ? fmt(pre, s, "") : NULL);
		free(pre);
		free(s);
		if (rc)
			return rc;
	}
	for (size_t j = 0; j < m->n_content && !rc; j++) {
		const Histd__V1__ContentBlock *b = m->content[j];

		if (b->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL) {
			rc = lines_add(l, fmt(role, " called ", b->tool_call->name));
		} else if (b->block_case ==
			   HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT) {
			const Histd__V1__ToolResultBlock *r = b->tool_result;
			const char *name = r->tool_name[0] ? r->tool_name : "a tool";
			const char *t = first_text(r->content, r->n_content);

			if (r->is_error) {
				rc = lines_add(l, fmt(name, " returned an error",
						      ""));
			} else if (t) {
				if (!(s = first_sentence(t)))
					return HISTD_ENOMEM;
				pre = fmt(name, " returned: ", "");
				rc = lines_add(l, pre ? fmt(pre, s, "") : NULL);
				free(pre);
				free(s);
			} else {
				rc = lines_add(l, fmt(name, " returned", ""));
			}
		} else if (b->block_case ==
			   HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE) {
			rc = lines_add(l, fmt(role, " shared an image", ""));
		} else if (b->block_case ==
			   HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT) {
			const char *fn = b->document->filename;

			rc = lines_add(l, fmt(role, " shared a document ",
					      fn[0] ? fn : ""));
		}
	}
	return rc;
}

/* Adds the lines of a previous summary; a first line "(N earlier lines
 * omitted)" (the mark of an earlier roll) is not kept but adds N to
 * *omitted, so the count adds up over rolls. */
static int
previous_lines(struct lines *l, const char *prev, size_t *omitted)
{
	int first = 1, rc = 0;

	while (*prev && !rc) {
		size_t n = strcspn(prev, "\n");
		char mark[64];
		size_t k;

		if (first && n < sizeof(mark) &&
		    sscanf(prev, "(%zu earlier lines omitted)", &k) == 1 &&
		    (size_t)snprintf(mark, sizeof(mark), "(%zu earlier lines "
				     "omitted)", k) == n &&
		    !memcmp(mark, prev, n))
			*omitted += k;
		else if (n)
			rc = lines_add(l, strndup(prev, n));
		first = 0;
		prev += n;
		if (*prev == '\n')
			prev++;
	}
	return rc;
}

static uint64_t
quarters(const char *s)
{
	return histd_tokens_text_quarters(s, strlen(s));
}

/*
 * Picks what fits max tokens: the newest lines from l->v[*from] on, and
 * the mark of the omitted ones first (*mark, "" for none; a budget too
 * small for the mark and a line drops the mark). Counted exactly: the
 * text is the lines joined by '\n', whose quarters add up (tokens.h).
 * *cut > 0 when even the newest line does not fit: keep its first *cut
 * bytes (a UTF-8 boundary).
 */
static void
fit_lines(const struct lines *l, size_t omitted, uint64_t max, size_t *from,
	  char *mark, size_t cap, size_t *cut)
{
	uint64_t budget = max * 4, used = 0, mq;
	size_t k = l->n;

	*cut = 0;
	*from = 0;
	mark[0] = '\0';
	if (l->n == 0)
		return;
	/* Everything, when nothing was omitted before and it fits. */
	for (size_t i = 0; i < l->n; i++)
		used += quarters(l->v[i]) + (i > 0);
	if (!omitted && used <= budget)
		return;
	/* The mark for the most that could be omitted: its width is an
	 * upper bound on the final one's. */
	snprintf(mark, cap, "(%zu earlier lines omitted)", omitted + l->n);
	mq = quarters(mark) + 1;
	if (mq + 4 > budget) {
		mark[0] = '\0';    /* no room for the mark and a line */
		mq = 0;
	}
	used = mq;
	while (k > 0) {
		uint64_t q = quarters(l->v[k - 1]) + (k < l->n);

		if (used + q > budget)
			break;
		used += q;
		k--;
	}
	if (k == l->n) {
		/* Not even the newest line: its beginning. */
		const char *s = l->v[l->n - 1];

		k = l->n - 1;
		/* At least one character: budget - mq >= 4. */
		*cut = histd_tokens_text_fit(s, strlen(s),
					     (budget - mq) / 4);
	}
	*from = k;
	if (mq)
		snprintf(mark, cap, "(%zu earlier lines omitted)", omitted + k);
}

static int
ex_summarize(histd_summarizer *self, const histd_summary_request *req,
	     histd_summary_result *out)
{
	uint32_t max = req->max_output_tokens ? req->max_output_tokens :
		       DEFAULT_MAX_TOKENS;
	struct lines l = { 0 };
	size_t omitted = 0, from, cut, total = 0, len;
	char *text, *p, mark[64];
	int rc = 0;

	(void)self;
	if (req->previous)
		rc = previous_lines(&l, req->previous, &omitted);
	for (size_t i = 0; i < req->n_messages && !rc; i++)
		rc = message_lines(&l, req->messages[i]);
	/* Messages without text (reasoning alone): say so, never nothing. */
	if (!rc && !l.n && req->n_messages) {
		char *s = malloc(64);

		if (s)
			snprintf(s, 64, "(%zu messages without text)",
				 req->n_messages);
		rc = lines_add(&l, s);
	}
	if (rc) {
		lines_free(&l);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	fit_lines(&l, omitted, max, &from, mark, sizeof(mark), &cut);
	total = strlen(mark) + 1;
	for (size_t i = from; i < l.n; i++)
		total += strlen(l.v[i]) + 1;
	if (!(text = malloc(total + 1))) {
		lines_free(&l);
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	p = text;
	if (mark[0]) {
		len = strlen(mark);
		memcpy(p, mark, len);
		p += len;
		*p++ = '\n';
	}
	for (size_t i = from; i < l.n; i++) {
		len = cut && i == l.n - 1 ? cut : strlen(l.v[i]);
		memcpy(p, l.v[i], len);
		p += len;
		*p++ = '\n';
	}
	while (p > text && p[-1] == '\n')
		p--;
	*p = '\0';
	lines_free(&l);
	memset(out, 0, sizeof(*out));
	out->text = text;
	out->model = strdup("extractive");
	out->max_output_tokens = max;
	if (!out->model) {
		free(text);
		out->text = NULL;
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	}
	return 0;
}

static void
ex_free(histd_summarizer *s)
{
	free(s);
}

int
histd_extractive_new(histd_summarizer **out)
{
	histd_summarizer *s = calloc(1, sizeof(*s));

	if (!s)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	s->version = HISTD_SUMMARIZER_VERSION;
	s->name = "extractive";
	s->summarize = ex_summarize;
	s->free = ex_free;
	*out = s;
	return 0;
}
