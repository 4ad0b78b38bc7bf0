/*
 * The context pipeline's plugins (plugins/) against hand-built
 * transcripts, including the failures users hit in other libraries:
 * trimming that orphans a tool result, masking that lets excluded tools
 * use the recent slots, and a loaded shared-object plugin.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "alloc_hook.h"
#include "compaction.h"
#include "histd/v1/histd.pb-c.h"
#include "plugin.h"
#include "tokens.h"

/* ---------------------------------------------------------------------- */
/* Building transcripts                                                    */

#define MAXM 64

/* One transcript: packed messages (seq in front) kept alive for views. */
struct tx {
	uint8_t *data[MAXM];
	size_t len[MAXM];
	uint32_t tokens[MAXM];
	size_t n;
};

static void
tx_free(struct tx *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->data[i]);
	t->n = 0;
}

/* Adds a message: role and blocks given as kind strings:
 *   "t:<text>"  text
 *   "c:<id>:<name>"  tool call
 *   "r:<id>:<name>:<text>"  tool result
 *   "z:<text>"  reasoning */
static void
tx_add(struct tx *t, Histd__V1__Role role, ...)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock *blocks[8], cb[8];
	Histd__V1__TextBlock tb[8], inner_tb[8];
	Histd__V1__ContentBlock inner[8], *innerp[8];
	Histd__V1__ToolCallBlock tc[8];
	Histd__V1__ToolResultBlock tr[8];
	Histd__V1__ReasoningBlock rb[8];
	char buf[8][256];
	const char *spec;
	size_t n = 0;
	va_list ap;

	va_start(ap, role);
	while ((spec = va_arg(ap, const char *))) {
		char *f1, *f2, *f3;

		histd__v1__content_block__init(&cb[n]);
		snprintf(buf[n], sizeof(buf[n]), "%s", spec + 2);
		f1 = buf[n];
		switch (spec[0]) {
		case 't':
			histd__v1__text_block__init(&tb[n]);
			tb[n].text = f1;
			cb[n].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
			cb[n].text = &tb[n];
			break;
		case 'z':
			histd__v1__reasoning_block__init(&rb[n]);
			rb[n].text = f1;
			cb[n].block_case =
				HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
			cb[n].reasoning = &rb[n];
			break;
		case 'c':
			f2 = strchr(f1, ':');
			*f2++ = '\0';
			histd__v1__tool_call_block__init(&tc[n]);
			tc[n].id = f1;
			tc[n].name = f2;
			tc[n].arguments = "{}";
			cb[n].block_case =
				HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
			cb[n].tool_call = &tc[n];
			break;
		case 'r':
			f2 = strchr(f1, ':');
			*f2++ = '\0';
			f3 = strchr(f2, ':');
			*f3++ = '\0';
			histd__v1__tool_result_block__init(&tr[n]);
			tr[n].tool_call_id = f1;
			tr[n].tool_name = f2;
			histd__v1__text_block__init(&inner_tb[n]);
			inner_tb[n].text = f3;
			histd__v1__content_block__init(&inner[n]);
			inner[n].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
			inner[n].text = &inner_tb[n];
			innerp[n] = &inner[n];
			tr[n].content = &innerp[n];
			tr[n].n_content = 1;
			cb[n].block_case =
				HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
			cb[n].tool_result = &tr[n];
			break;
		default:
			fail();
		}
		blocks[n] = &cb[n];
		n++;
	}
	va_end(ap);
	m.role = role;
	m.content = blocks;
	m.n_content = n;
	m.seq = t->n + 1;
	m.token_estimate = histd_tokens_message(&m);
	t->tokens[t->n] = m.token_estimate;
	t->len[t->n] = histd__v1__message__get_packed_size(&m);
	t->data[t->n] = malloc(t->len[t->n]);
	histd__v1__message__pack(&m, t->data[t->n]);
	t->n++;
}

#define SYS HISTD__V1__ROLE__ROLE_SYSTEM
#define USER HISTD__V1__ROLE__ROLE_USER
#define ASST HISTD__V1__ROLE__ROLE_ASSISTANT
#define TOOL HISTD__V1__ROLE__ROLE_TOOL

static histd_view *
tx_view(const struct tx *t)
{
	histd_view *v = histd_view_new();

	assert_non_null(v);
	for (size_t i = 0; i < t->n; i++)
		assert_int_equal(histd_view_push_record(v, i + 1, t->tokens[i],
				 t->data[i], t->len[i]), 0);
	v->complete = 1;
	return v;
}

static histd_pipeline *
parse(const char *spec)
{
	histd_pipeline *p = NULL;
	int rc = histd_pipeline_parse(spec, "test", &p);

	if (rc)
		fprintf(stderr, "parse: %s\n", histd_error_message());
	assert_int_equal(rc, 0);
	return p;
}

/* Every tool_result has its call in the view, and every call its
 * results; system messages come first; returns the items' seqs joined. */
static void
assert_valid(histd_view *v)
{
	int seen_other = 0;

	for (size_t i = 0; i < v->n; i++) {
		Histd__V1__Message *m = histd_view_message(v, i);

		assert_non_null(m);
		if (m->role == SYS)
			assert_false(seen_other);
		else
			seen_other = 1;
		for (size_t j = 0; j < m->n_content; j++) {
			const Histd__V1__ContentBlock *b = m->content[j];
			const char *want = NULL;
			int found = 0;

			if (b->block_case ==
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				want = b->tool_result->tool_call_id;
			else if (b->block_case ==
				 HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL)
				want = b->tool_call->id;
			if (!want)
				continue;
			for (size_t k = 0; k < v->n && !found; k++) {
				Histd__V1__Message *o = histd_view_message(v, k);

				for (size_t q = 0; q < o->n_content; q++) {
					const Histd__V1__ContentBlock *c =
						o->content[q];

					if (b->block_case ==
					    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
					    c->block_case ==
					    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
					    !strcmp(c->tool_call->id, want) && k < i)
						found = 1;
					if (b->block_case ==
					    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL &&
					    c->block_case ==
					    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT &&
					    !strcmp(c->tool_result->tool_call_id,
						    want) && k > i)
						found = 1;
				}
			}
			if (!found)
				fprintf(stderr, "unpaired %s at item %zu\n",
					want, i);
			assert_true(found);
		}
	}
}

static void
seqs(histd_view *v, char *out, size_t cap)
{
	size_t o = 0;

	out[0] = '\0';
	for (size_t i = 0; i < v->n && o + 8 < cap; i++)
		o += (size_t)snprintf(out + o, cap - o, "%s%llu", i ? "," : "",
				      (unsigned long long)v->items[i].seq);
}

/* The agent loop most transcripts look like. */
static void
agent_loop(struct tx *t)
{
	tx_add(t, SYS, "t:You are a coding agent.", NULL);           /* 1 */
	tx_add(t, USER, "t:Fix the failing test.", NULL);            /* 2 */
	tx_add(t, ASST, "z:look first", "c:c1:read_file", NULL);     /* 3 */
	tx_add(t, TOOL, "r:c1:read_file:contents of a.c", NULL);     /* 4 */
	tx_add(t, ASST, "c:c2:grep", "c:c3:read_file", NULL);        /* 5 */
	tx_add(t, TOOL, "r:c2:grep:a.c:12", NULL);                   /* 6 */
	tx_add(t, TOOL, "r:c3:read_file:contents of b.c", NULL);     /* 7 */
	tx_add(t, ASST, "t:The bug is in b.c.", NULL);               /* 8 */
	tx_add(t, USER, "t:Go ahead.", NULL);                        /* 9 */
	tx_add(t, ASST, "c:c4:write_file", NULL);                    /* 10 */
	tx_add(t, TOOL, "r:c4:write_file:ok", NULL);                 /* 11 */
}

/* ---------------------------------------------------------------------- */
/* window                                                                  */

static void
window_never_orphans_a_tool_result(void **state)
{
	struct tx t = { 0 };
	char got[256];
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	/* The last 5 would start at seq 7, the result of c3, whose call is
	 * at 5: the window starts later, at a safe start (seq 8). */
	p = parse("window:max_messages=5");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "1,8,9,10,11");
	assert_valid(v);
	histd_view_free(v);
	histd_pipeline_free(p);

	/* Every size keeps the view valid. */
	for (int n = 1; n <= 12; n++) {
		char spec[64];

		snprintf(spec, sizeof(spec), "window:max_messages=%d", n);
		p = parse(spec);
		v = tx_view(&t);
		assert_int_equal(histd_pipeline_transform(p, v), 0);
		assert_true(v->n - 1 <= (size_t)n);
		assert_int_equal(v->items[0].seq, 1);
		assert_valid(v);
		histd_view_free(v);
		histd_pipeline_free(p);
	}
	tx_free(&t);
}

static void
window_keeps_a_call_with_all_its_parallel_results(void **state)
{
	struct tx t = { 0 };
	char got[256];
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	/* 6 from the end starts at seq 6: the first of two results of the
	 * call at 5. Starting there would orphan both; starting at 5 would
	 * exceed 6; so the window starts at 8. */
	p = parse("window:max_messages=6");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "1,8,9,10,11");
	histd_view_free(v);
	histd_pipeline_free(p);

	p = parse("window:max_messages=7");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "1,5,6,7,8,9,10,11");
	assert_valid(v);
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
window_by_tokens_fits_the_budget_with_system_counted(void **state)
{
	struct tx t = { 0 };
	histd_pipeline *p;
	histd_view *v;
	uint64_t budget, sum = 0;

	(void)state;
	agent_loop(&t);
	/* System + the last 3 messages' tokens: exactly what fits. */
	budget = t.tokens[0] + t.tokens[8] + t.tokens[9] + t.tokens[10];
	{
		char spec[64];

		snprintf(spec, sizeof(spec), "window:max_tokens=%llu",
			 (unsigned long long)budget);
		p = parse(spec);
	}
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	for (size_t i = 0; i < v->n; i++)
		sum += v->items[i].tokens;
	assert_true(sum <= budget);
	assert_int_equal(v->n, 4);
	assert_int_equal(v->items[0].seq, 1);
	assert_int_equal(v->items[1].seq, 9);
	assert_valid(v);
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
window_does_not_cut_reasoning_from_its_turn(void **state)
{
	struct tx t = { 0 };
	char got[256];
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	tx_add(&t, USER, "t:Why?", NULL);                         /* 1 */
	tx_add(&t, ASST, "z:thinking about it", NULL);            /* 2 */
	tx_add(&t, ASST, "t:Because.", NULL);                     /* 3 */
	/* The last 1 would be the answer without its reasoning item. */
	p = parse("window:max_messages=2");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "2,3");
	histd_view_free(v);
	histd_pipeline_free(p);
	p = parse("window:max_messages=1");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	assert_int_equal(v->n, 0);
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

/* Two plain assistant messages in a row (two agents, a streamed answer)
 * are two messages: the window may start at the second, and does not
 * drop both for want of the first. */
static void
window_starts_between_plain_assistant_messages(void **state)
{
	struct tx t = { 0 };
	char got[256];
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	tx_add(&t, SYS, "t:You are helpful.", NULL);              /* 1 */
	tx_add(&t, USER, "t:Tell me two things.", NULL);          /* 2 */
	tx_add(&t, ASST, "t:First thing.", NULL);                 /* 3 */
	tx_add(&t, ASST, "t:Second thing.", NULL);                /* 4 */
	p = parse("window:max_messages=1");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "1,4");
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
window_asks_for_more_when_the_view_is_incomplete(void **state)
{
	struct tx t = { 0 };
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	p = parse("window:max_messages=50");
	v = tx_view(&t);
	v->complete = 0;
	assert_int_equal(histd_pipeline_transform(p, v), HISTD_PLUGIN_MORE);
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

/* ---------------------------------------------------------------------- */
/* masking                                                                 */

static int
masked(histd_view *v, uint64_t seq, const char *call_id)
{
	for (size_t i = 0; i < v->n; i++) {
		Histd__V1__Message *m;

		if (v->items[i].seq != seq)
			continue;
		m = histd_view_message(v, i);
		for (size_t j = 0; j < m->n_content; j++) {
			const Histd__V1__ToolResultBlock *r;

			if (m->content[j]->block_case !=
			    HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT)
				continue;
			r = m->content[j]->tool_result;
			if (strcmp(r->tool_call_id, call_id))
				continue;
			return strstr(r->content[0]->text->text,
				      "[tool result masked: tool_call_id=") &&
			       strstr(r->content[0]->text->text, call_id);
		}
	}
	fail_msg("no result %s at seq %llu", call_id, (unsigned long long)seq);
	return 0;
}

static void
masking_excluded_tools_take_no_recent_slot(void **state)
{
	struct tx t = { 0 };
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	/* Results, newest first: c4 write_file, c3 read_file, c2 grep,
	 * c1 read_file. With grep excluded and one recent slot, c4 takes the
	 * slot; the excluded grep result must not push anything out. */
	p = parse("masking:keep_recent_results=2,exclude_tools=grep");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	assert_false(masked(v, 11, "c4"));
	assert_false(masked(v, 7, "c3"));
	assert_false(masked(v, 6, "c2"));   /* excluded: never masked */
	assert_true(masked(v, 4, "c1"));
	assert_valid(v);
	histd_view_free(v);
	histd_pipeline_free(p);

	/* include_tools: only read_file results are candidates. */
	p = parse("masking:keep_recent_results=1,include_tools=read_file");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	assert_false(masked(v, 11, "c4"));
	assert_false(masked(v, 7, "c3"));
	assert_false(masked(v, 6, "c2"));
	assert_true(masked(v, 4, "c1"));
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
masking_small_results_take_no_slot_and_stay(void **state)
{
	struct tx t = { 0 };
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	/* "ok" (c4) and "a.c:12" (c2) are below 3 tokens. */
	p = parse("masking:keep_recent_results=1,min_tokens_to_mask=3");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	assert_false(masked(v, 11, "c4"));
	assert_false(masked(v, 7, "c3"));
	assert_false(masked(v, 6, "c2"));
	assert_true(masked(v, 4, "c1"));
	/* The masked message is re-estimated, and smaller. */
	for (size_t i = 0; i < v->n; i++)
		if (v->items[i].seq == 4) {
			assert_true(v->items[i].flags & HISTD_ITEM_CHANGED);
			assert_int_equal(v->items[i].tokens,
				histd_tokens_message(v->items[i].msg));
		}
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

/* Out of memory in a pipeline: each allocation of the transform fails in
 * turn (alloc_hook.h), among them the view's arena, which masking needs
 * to unpack the results it measures. The answer is ENOMEM, never
 * ECORRUPT: a message that could not be unpacked for want of memory is
 * not corrupt. Results large enough that the arena takes more memory. */
static void
a_pipeline_out_of_memory_is_enomem_not_corrupt(void **state)
{
	struct tx t = { 0 };
	char calls[8][16], results[8][256];
	histd_pipeline *p;
	long k;

	(void)state;
	if (!ALLOC_HOOK)
		skip();
	tx_add(&t, USER, "t:Read every file.", NULL);
	for (int round = 0; round < 14; round++) {
		for (int j = 0; j < 8; j++) {
			snprintf(calls[j], sizeof(calls[j]), "c:r%dc%d:read",
				 round, j);
			snprintf(results[j], sizeof(results[j]),
				 "r:r%dc%d:read:%.*s", round, j, 200,
				 "lorem ipsum dolor sit amet consectetur "
				 "adipiscing elit sed do eiusmod tempor "
				 "incididunt ut labore et dolore magna aliqua "
				 "ut enim ad minim veniam quis nostrud "
				 "exercitation ullamco laboris nisi ut aliquip");
		}
		tx_add(&t, ASST, calls[0], calls[1], calls[2], calls[3],
		       calls[4], calls[5], calls[6], calls[7], NULL);
		tx_add(&t, TOOL, results[0], results[1], results[2],
		       results[3], results[4], results[5], results[6],
		       results[7], NULL);
	}
	p = parse("masking:keep_recent_results=1,min_tokens_to_mask=3");
	for (k = 0;; k++) {
		histd_view *v = tx_view(&t);
		int rc;

		alloc_hook_start(k);
		rc = histd_pipeline_transform(p, v);
		alloc_hook_stop();
		histd_view_free(v);
		if (!alloc_hook_failed()) {
			assert_int_equal(rc, 0);
			break;
		}
		if (rc != HISTD_ENOMEM)
			fail_msg("allocation %ld failed: %s, not ENOMEM", k,
				 histd_error_name(rc));
	}
	assert_true(k > 0);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
masking_never_changes_the_stored_bytes(void **state)
{
	struct tx t = { 0 };
	uint8_t *copy[MAXM];
	histd_pipeline *p;
	histd_view *v;

	(void)state;
	agent_loop(&t);
	for (size_t i = 0; i < t.n; i++) {
		copy[i] = malloc(t.len[i]);
		memcpy(copy[i], t.data[i], t.len[i]);
	}
	p = parse("masking:keep_recent_results=0;window:max_messages=3");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	for (size_t i = 0; i < t.n; i++) {
		assert_memory_equal(copy[i], t.data[i], t.len[i]);
		free(copy[i]);
	}
	histd_view_free(v);
	histd_pipeline_free(p);
	tx_free(&t);
}

/*
 * A freed view is kept for the thread's next one. The next view must start
 * empty, and must not answer the tool blocks of a message from what the
 * previous view read at the same address (a read buffer is often reused).
 */
static void
a_reused_view_starts_empty_and_reads_tools_afresh(void **state)
{
	struct tx a = { 0 }, b = { 0 };
	const histd_view_tool *refs;
	histd_view *v;
	uint8_t *buf;
	size_t n, cap;

	(void)state;
	tx_add(&a, ASST, "c:call_a:first", NULL);
	tx_add(&b, ASST, "c:call_b:other", NULL);
	tx_add(&b, TOOL, "r:call_b:other:done", NULL);
	cap = a.len[0] > b.len[0] ? a.len[0] : b.len[0];
	buf = malloc(cap);
	assert_non_null(buf);

	memcpy(buf, a.data[0], a.len[0]);
	v = histd_view_new();
	assert_non_null(v);
	assert_int_equal(histd_view_push_record(v, 1, 1, buf, a.len[0]), 0);
	v->complete = 1;
	v->bounded = 1;
	assert_int_equal(histd_view_tools(v, 0, &refs, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(refs[0].id, "call_a");
	histd_view_free(v);

	memcpy(buf, b.data[0], b.len[0]);
	v = histd_view_new();
	assert_non_null(v);
	assert_int_equal(v->n, 0);
	assert_int_equal(v->complete, 0);
	assert_int_equal(v->bounded, 0);
	assert_null(v->summary);
	assert_int_equal(histd_view_push_record(v, 1, 1, buf, b.len[0]), 0);
	assert_int_equal(histd_view_push_record(v, 2, 1, b.data[1], b.len[1]),
			 0);
	assert_int_equal(v->n, 2);
	assert_int_equal(histd_view_tools(v, 0, &refs, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(refs[0].id, "call_b");
	assert_string_equal(refs[0].name, "other");
	assert_int_equal(histd_view_tools(v, 1, &refs, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(refs[0].kind, HISTD_ITEM_RESULTS);
	histd_view_free(v);

	free(buf);
	tx_free(&a);
	tx_free(&b);
}

/* A message with more tool blocks than the first scan makes room for
 * gives all of them, in content order. */
static void
a_message_with_many_tool_calls_gives_them_all(void **state)
{
	struct tx t = { 0 };
	const histd_view_tool *refs;
	histd_view *v;
	size_t n;

	(void)state;
	tx_add(&t, ASST, "t:working", "c:c1:a", "c:c2:b", "c:c3:c", "c:c4:d",
	       "c:c5:e", "c:c6:f", NULL);
	v = tx_view(&t);
	assert_int_equal(histd_view_tools(v, 0, &refs, &n), 0);
	assert_int_equal(n, 6);
	for (size_t i = 0; i < n; i++) {
		char id[24];

		snprintf(id, sizeof(id), "c%zu", i + 1);
		assert_string_equal(refs[i].id, id);
		assert_int_equal(refs[i].block, i + 1);
		assert_int_equal(refs[i].kind, HISTD_ITEM_CALLS);
	}
	histd_view_free(v);
	tx_free(&t);
}

/*
 * histd_view_mask_result against what unpacking, replacing the result and
 * packing gives (the masking plugin's other path): the same message once
 * both are unpacked and packed canonically, and the estimate
 * histd_tokens_message gives. Shapes: parallel results (one masked, the
 * other kept), is_error, a block and a message with provider_state,
 * author and metadata; a result holding an image is left to the unpacking
 * path (*done 0, nothing changed).
 */
static uint8_t *
pack_msg(Histd__V1__Message *m, size_t *len)
{
	uint8_t *b;

	m->token_estimate = histd_tokens_message(m);
	*len = histd__v1__message__get_packed_size(m);
	b = malloc(*len);
	assert_non_null(b);
	histd__v1__message__pack(m, b);
	return b;
}

static void
expect_wire_mask_equals_unpacked(const uint8_t *data, size_t len,
				 uint32_t block, const char *text)
{
	Histd__V1__Message *want, *got;
	Histd__V1__ToolResultBlock tr = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	Histd__V1__ContentBlock cb = HISTD__V1__CONTENT_BLOCK__INIT, *cbp = &cb;
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ToolResultBlock *old;
	uint8_t *a, *b;
	size_t la, lb;
	histd_view *v;
	int done = 0;

	v = histd_view_new();
	assert_non_null(v);
	assert_int_equal(histd_view_push_record(v, 9, 0, data, len), 0);
	want = histd__v1__message__unpack(NULL, len, data);
	assert_non_null(want);
	v->items[0].tokens = want->token_estimate;
	assert_int_equal(histd_view_mask_result(v, 0, block, text, &done), 0);
	assert_int_equal(done, 1);
	assert_ptr_not_equal(v->items[0].data, data);

	/* The other path, by hand. */
	old = want->content[block]->tool_result;
	tb.text = (char *)text;
	cb.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	cb.text = &tb;
	tr.tool_call_id = old->tool_call_id;
	tr.tool_name = old->tool_name;
	tr.is_error = old->is_error;
	tr.content = &cbp;
	tr.n_content = 1;
	want->content[block]->tool_result = &tr;
	want->token_estimate = histd_tokens_message(want);
	assert_int_equal(v->items[0].tokens, want->token_estimate);

	got = histd__v1__message__unpack(NULL, v->items[0].len,
					 v->items[0].data);
	assert_non_null(got);
	la = histd__v1__message__get_packed_size(want);
	lb = histd__v1__message__get_packed_size(got);
	assert_int_equal(la, lb);
	a = malloc(la);
	b = malloc(lb);
	histd__v1__message__pack(want, a);
	histd__v1__message__pack(got, b);
	assert_memory_equal(a, b, la);
	free(a);
	free(b);
	want->content[block]->tool_result = old;
	histd__v1__message__free_unpacked(want, NULL);
	histd__v1__message__free_unpacked(got, NULL);
	histd_view_free(v);
}

static void
wire_masking_gives_what_unpacking_gives(void **state)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock cb[3], *cbp[3], inner[3], *innerp[3];
	Histd__V1__ToolResultBlock tr[3];
	Histd__V1__TextBlock tb[3];
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;
	Histd__V1__ContentBlock__ProviderStateEntry ps =
		HISTD__V1__CONTENT_BLOCK__PROVIDER_STATE_ENTRY__INIT, *psp = &ps;
	Histd__V1__Message__MetadataEntry md =
		HISTD__V1__MESSAGE__METADATA_ENTRY__INIT, *mdp = &md;
	const char *texts[3] = { "first result, long enough to count",
				 "second: \xc3\xa9t\xc3\xa9 and more",
				 "third" };
	const char *ids[3] = { "call_a", "call_b", "call_c" };
	histd_view *v;
	uint8_t *data;
	size_t len;
	int done = 1;

	(void)state;
	for (int k = 0; k < 3; k++) {
		histd__v1__content_block__init(&cb[k]);
		histd__v1__content_block__init(&inner[k]);
		histd__v1__tool_result_block__init(&tr[k]);
		histd__v1__text_block__init(&tb[k]);
		tb[k].text = (char *)texts[k];
		inner[k].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		inner[k].text = &tb[k];
		innerp[k] = &inner[k];
		tr[k].tool_call_id = (char *)ids[k];
		tr[k].tool_name = k == 2 ? "" : "read_file";
		tr[k].content = &innerp[k];
		tr[k].n_content = 1;
		cb[k].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
		cb[k].tool_result = &tr[k];
		cbp[k] = &cb[k];
	}
	tr[1].is_error = 1;
	ps.key = "openai";
	ps.value.data = (uint8_t *)"opaque";
	ps.value.len = 6;
	cb[1].provider_state = &psp;
	cb[1].n_provider_state = 1;
	md.key = "k";
	md.value = "v";
	m.role = HISTD__V1__ROLE__ROLE_TOOL;
	m.seq = 9;
	m.author = "agent";
	m.metadata = &mdp;
	m.n_metadata = 1;
	m.content = cbp;
	m.n_content = 3;
	data = pack_msg(&m, &len);
	for (uint32_t b = 0; b < 3; b++)
		expect_wire_mask_equals_unpacked(data, len, b,
			"[tool result masked: tool_call_id=x; GetToolResult "
			"returns it]");
	/* An empty marker and a result whose estimate was 0. */
	expect_wire_mask_equals_unpacked(data, len, 2, "");
	free(data);

	/* A result holding an image: alone in its message, masked (the
	 * estimate is the overhead and the marker); beside another block,
	 * not read here, and nothing changed. */
	img.media_type = "image/png";
	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	img.url = "https://example.com/a.png";
	inner[0].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	inner[0].image = &img;
	m.n_content = 1;
	data = pack_msg(&m, &len);
	expect_wire_mask_equals_unpacked(data, len, 0, "masked");
	free(data);
	m.n_content = 2;
	data = pack_msg(&m, &len);
	v = histd_view_new();
	assert_int_equal(histd_view_push_record(v, 9, m.token_estimate, data,
						len), 0);
	assert_int_equal(histd_view_mask_result(v, 0, 0, "masked", &done), 0);
	assert_int_equal(done, 0);
	assert_ptr_equal(v->items[0].data, data);
	assert_int_equal(v->items[0].len, len);
	/* A block past the last: the same. */
	assert_int_equal(histd_view_mask_result(v, 0, 2, "masked", &done), 0);
	assert_int_equal(done, 0);
	assert_ptr_equal(v->items[0].data, data);
	histd_view_free(v);
	free(data);
}

/* ---------------------------------------------------------------------- */
/* Validation                                                              */

static int
validate(const char *name, const char *k1, const char *v1, const char *k2,
	 const char *v2)
{
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT;
	Histd__V1__PluginConfig *pcs[1] = { &pc };
	Histd__V1__PluginConfig__OptionsEntry e[2], *ep[2];
	size_t n = 0;

	if (k1) {
		histd__v1__plugin_config__options_entry__init(&e[n]);
		e[n].key = (char *)k1;
		e[n].value = (char *)v1;
		ep[n] = &e[n];
		n++;
	}
	if (k2) {
		histd__v1__plugin_config__options_entry__init(&e[n]);
		e[n].key = (char *)k2;
		e[n].value = (char *)v2;
		ep[n] = &e[n];
		n++;
	}
	pc.name = (char *)name;
	pc.options = ep;
	pc.n_options = n;
	pl.plugins = pcs;
	pl.n_plugins = 1;
	c.pipeline = &pl;
	return histd_pipeline_validate(&c, "config");
}

static void
unknown_plugins_and_bad_options_are_invalid_argument(void **state)
{
	(void)state;
	assert_int_equal(validate("no_such_plugin", NULL, NULL, NULL, NULL),
			 HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].name: unknown plugin");
	assert_int_equal(validate("masking", "include_tools", "a",
				  "exclude_tools", "b"), HISTD_EINVALID);
	assert_non_null(strstr(histd_error_message(),
			       "config.pipeline.plugins[0].options"));
	assert_int_equal(validate("window", "max_tokens", "lots", NULL, NULL),
			 HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options.max_tokens must be a "
		"whole number from 0 to 4294967295");
	assert_int_equal(validate("window", "colour", "red", NULL, NULL),
			 HISTD_EINVALID);
	assert_int_equal(validate("window", NULL, NULL, NULL, NULL),
			 HISTD_EINVALID);
	assert_int_equal(validate("compaction", "summarizer", "nobody", NULL,
				  NULL), HISTD_EINVALID);
	assert_int_equal(validate("compaction", "auto_reduce_when",
				  "tokens>=abc", NULL, NULL), HISTD_EINVALID);
	assert_int_equal(validate("", NULL, NULL, NULL, NULL), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
			    "config.pipeline.plugins[0].name is required");
	/* Digits only: no white space or sign before them, which strtoull
	 * would take. */
	assert_int_equal(validate("window", "max_messages", "\t5", NULL, NULL),
			 HISTD_EINVALID);
	assert_int_equal(validate("window", "max_tokens", "\n7", NULL, NULL),
			 HISTD_EINVALID);
	assert_int_equal(validate("masking", "keep_recent_results", "\r2",
				  NULL, NULL), HISTD_EINVALID);
	assert_int_equal(validate("compaction", "auto_reduce_when",
				  "tokens>=\t100", NULL, NULL), HISTD_EINVALID);
	assert_int_equal(validate("compaction", "keep_recent", "+3", NULL,
				  NULL), HISTD_EINVALID);

	assert_int_equal(validate("window", "max_messages", "20", NULL, NULL),
			 0);
	assert_int_equal(validate("masking", "keep_recent_results", "2",
				  "exclude_tools", "grep|ls"), 0);
	assert_int_equal(validate("compaction", "auto_reduce_when",
				  "tokens>=1000|messages>=50", "summarizer",
				  "extractive"), 0);
}

static void
auto_reduce_when_refuses_a_dangling_bar(void **state)
{
	static const char *const dangling[] = {
		"tokens>=1000|", "|tokens>=1000", "tokens>=1000||messages>=5",
		"tokens>=1000 | ", "|", " | " };

	(void)state;
	for (size_t i = 0; i < sizeof(dangling) / sizeof(dangling[0]); i++) {
		assert_int_equal(validate("compaction", "auto_reduce_when",
					  dangling[i], NULL, NULL),
				 HISTD_EINVALID);
		assert_string_equal(histd_error_message(),
			"config.pipeline.plugins[0].options.auto_reduce_when "
			"has an empty condition: '|' must join two "
			"conditions");
	}
	assert_int_equal(validate("compaction", "auto_reduce_when",
				  "tokens>=1000 | messages>=5", NULL, NULL), 0);
	assert_int_equal(validate("compaction", "auto_reduce_when",
				  "tokens>=1000 age>=60", NULL, NULL), 0);
}

/* The message states the range there is: 1 to 100000. */
static void
max_summary_tokens_is_refused_stating_its_range(void **state)
{
	(void)state;
	assert_int_equal(validate("compaction", "max_summary_tokens", "0",
				  NULL, NULL), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options.max_summary_tokens must "
		"be a whole number from 1 to 100000");
	assert_int_equal(validate("compaction", "max_summary_tokens",
				  "100001", NULL, NULL), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options.max_summary_tokens must "
		"be a whole number from 1 to 100000");
	assert_int_equal(validate("compaction", "max_summary_tokens", "1",
				  NULL, NULL), 0);
	assert_int_equal(validate("compaction", "max_summary_tokens",
				  "100000", NULL, NULL), 0);
}

/* window's provider takes the names the token estimator knows (README):
 * OpenAI's two formats share OpenAI's rules. */
static void
window_provider_takes_the_estimator_names(void **state)
{
	static const char *const ok[] = {
		"anthropic", "openai", "openai_chat", "openai_responses",
		"gemini", "google", "mistral", "default" };

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		assert_int_equal(validate("window", "max_tokens", "1000",
					  "provider", ok[i]), 0);
	assert_int_equal(validate("window", "max_tokens", "1000", "provider",
				  "claude"), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options.provider must be "
		"anthropic, openai, openai_chat, openai_responses, gemini, "
		"google, mistral or default");
}

/* ---------------------------------------------------------------------- */
/* compaction and the extractive summarizer                                */

static void
unpack_all(const struct tx *t, Histd__V1__Message **m)
{
	for (size_t i = 0; i < t->n; i++) {
		m[i] = histd__v1__message__unpack(NULL, t->len[i], t->data[i]);
		assert_non_null(m[i]);
	}
}

static void
compaction_covers_up_to_a_safe_start_and_keeps_the_tail(void **state)
{
	struct tx t = { 0 };
	Histd__V1__Message *m[MAXM];
	histd_pipeline *p = parse("compaction:keep_recent=5");
	const histd_plugin *pl;
	histd_reduce r = { 0 };
	void *st;

	(void)state;
	agent_loop(&t);
	unpack_all(&t, m);
	pl = histd_pipeline_plugin(p, 0, &st);
	/* Without the system message (the host leaves it out). */
	r.messages = m + 1;
	r.n_messages = t.n - 1;
	assert_int_equal(pl->reduce(st, &r), 0);
	/* 10 messages, keep 5: a cut at 5 would start the tail at seq 7, a
	 * result whose call is at 5; the cut moves back to seq 5. */
	assert_int_equal(r.n_covered, 3);
	assert_non_null(r.text);
	assert_string_equal(r.model, "extractive");
	assert_non_null(strstr(r.text, "user: Fix the failing test."));
	assert_non_null(strstr(r.text, "assistant called read_file"));
	assert_null(strstr(r.text, "look first"));   /* reasoning left out */
	free(r.text);
	free(r.model);
	for (size_t i = 0; i < t.n; i++)
		histd__v1__message__free_unpacked(m[i], NULL);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
extractive_summary_is_deterministic_and_rolls(void **state)
{
	struct tx t = { 0 };
	Histd__V1__Message *m[MAXM];
	histd_summarizer *s;
	histd_summary_request req = { 0 };
	histd_summary_result a = { 0 }, b = { 0 };

	(void)state;
	agent_loop(&t);
	unpack_all(&t, m);
	assert_int_equal(histd_extractive_new(&s), 0);
	req.messages = m;
	req.n_messages = 4;
	req.previous = "Earlier: the user asked for a fix.";
	assert_int_equal(s->summarize(s, &req, &a), 0);
	assert_int_equal(s->summarize(s, &req, &b), 0);
	assert_string_equal(a.text, b.text);
	/* The previous summary comes first, merged with the new lines. */
	assert_memory_equal(a.text, "Earlier: the user asked for a fix.", 34);
	assert_non_null(strstr(a.text, "read_file returned: contents of a.c"));
	free(a.text);
	free(a.model);
	free(b.text);
	free(b.model);
	/* A budget: the newest lines stay, the count of dropped ones is
	 * said, and the text fits it: "(11 earlier lines omitted)\n
	 * write_file returned: ok" is 50 quarter tokens, 13 tokens. */
	req.previous = NULL;
	req.n_messages = t.n;
	req.max_output_tokens = 13;
	assert_int_equal(s->summarize(s, &req, &a), 0);
	assert_string_equal(a.text, "(11 earlier lines omitted)\n"
			    "write_file returned: ok");
	assert_true(histd_tokens_text(a.text, strlen(a.text)) <= 13);
	free(a.text);
	free(a.model);
	s->free(s);
	for (size_t i = 0; i < t.n; i++)
		histd__v1__message__free_unpacked(m[i], NULL);
	tx_free(&t);
}

/* Rolling: each compaction folds the previous summary in; the text stays
 * within max_output_tokens every time, the newest lines stay, and the
 * count of omitted lines adds up over the rolls. */
static void
extractive_rolling_summaries_stay_within_max_output_tokens(void **state)
{
	histd_summarizer *s;
	histd_summary_request req = { 0 };
	histd_summary_result r = { 0 };
	char *prev = NULL;
	size_t omitted = 0, total = 0;

	(void)state;
	assert_int_equal(histd_extractive_new(&s), 0);
	for (int round = 0; round < 8; round++) {
		struct tx t = { 0 };
		Histd__V1__Message *m[MAXM];
		char text[10][64], newest[80];
		size_t k = 0, n;

		for (int i = 0; i < 10; i++) {
			snprintf(text[i], sizeof(text[i]),
				 "t:Round %d message %d is here.", round, i);
			tx_add(&t, i % 2 ? ASST : USER, text[i], NULL);
		}
		unpack_all(&t, m);
		req.previous = prev;
		req.messages = m;
		req.n_messages = t.n;
		req.max_output_tokens = 20;
		assert_int_equal(s->summarize(s, &req, &r), 0);
		n = strlen(r.text);
		assert_true(histd_tokens_text(r.text, n) <= 20);
		snprintf(newest, sizeof(newest),
			 "assistant: Round %d message 9 is here.", round);
		assert_non_null(strstr(r.text, newest));
		total += 10;
		/* Every line is the mark or a message's: what is not shown
		 * is counted. */
		assert_int_equal(sscanf(r.text, "(%zu earlier lines omitted)",
					&k), 1);
		n = 0;
		for (const char *p = r.text; (p = strchr(p, '\n')); p++)
			n++;
		assert_int_equal(k + n, total);
		assert_true(k >= omitted);
		omitted = k;
		free(prev);
		prev = r.text;
		free(r.model);
		for (size_t i = 0; i < t.n; i++)
			histd__v1__message__free_unpacked(m[i], NULL);
		tx_free(&t);
	}
	free(prev);
	s->free(s);
}

/* A line is at most 200 characters, not bytes: 200 ideographs of a
 * longer CJK message. */
static void
extractive_lines_are_200_characters(void **state)
{
	Histd__V1__Message msg = HISTD__V1__MESSAGE__INIT, *m = &msg;
	Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT, *bp = &b;
	Histd__V1__TextBlock tb = HISTD__V1__TEXT_BLOCK__INIT;
	histd_summarizer *s;
	histd_summary_request req = { 0 };
	histd_summary_result r = { 0 };
	char cjk[3 * 300 + 1];

	(void)state;
	for (int i = 0; i < 300; i++)
		memcpy(cjk + 3 * i, "\xe6\xbc\xa2", 3);   /* U+6F22 */
	cjk[sizeof(cjk) - 1] = '\0';
	tb.text = cjk;
	b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b.text = &tb;
	msg.role = USER;
	msg.content = &bp;
	msg.n_content = 1;
	assert_int_equal(histd_extractive_new(&s), 0);
	req.messages = &m;
	req.n_messages = 1;
	req.max_output_tokens = 4000;
	assert_int_equal(s->summarize(s, &req, &r), 0);
	assert_memory_equal(r.text, "user: ", 6);
	assert_int_equal(strlen(r.text) - 6, 3 * 200);
	free(r.text);
	free(r.model);
	s->free(s);
}

/* A line that alone does not fit is cut on a UTF-8 boundary; a previous
 * summary (one long line from a provider) is dropped before new lines. */
static void
extractive_cuts_a_line_too_long_on_a_utf8_boundary(void **state)
{
	struct tx t = { 0 };
	Histd__V1__Message *m[MAXM];
	histd_summarizer *s;
	histd_summary_request req = { 0 };
	histd_summary_result r = { 0 };
	char cjk[2 + 3 * 80 + 1] = "t:", prev[4001];
	size_t n;

	(void)state;
	for (int i = 0; i < 80; i++)
		memcpy(cjk + 2 + 3 * i, "\xe4\xb8\xad", 3);   /* U+4E2D */
	cjk[sizeof(cjk) - 1] = '\0';
	tx_add(&t, USER, cjk, NULL);
	unpack_all(&t, m);
	memset(prev, 'p', sizeof(prev) - 1);
	prev[sizeof(prev) - 1] = '\0';
	assert_int_equal(histd_extractive_new(&s), 0);
	req.previous = prev;
	req.messages = m;
	req.n_messages = 1;
	req.max_output_tokens = 30;
	assert_int_equal(s->summarize(s, &req, &r), 0);
	n = strlen(r.text);
	assert_true(histd_tokens_text(r.text, n) <= 30);
	/* The mark (26 characters and a newline: 7 tokens), then "user: "
	 * (6 characters) and as many whole ideographs as fit. */
	assert_memory_equal(r.text, "(1 earlier lines omitted)\nuser: ", 32);
	assert_int_equal((n - 32) % 3, 0);
	assert_true(n - 32 >= 3 * 20);
	assert_memory_equal(r.text + 32, cjk + 2, n - 32);
	free(r.text);
	free(r.model);

	/* Messages that give no line (reasoning alone): never empty. */
	tx_free(&t);
	histd__v1__message__free_unpacked(m[0], NULL);
	tx_add(&t, ASST, "z:thinking only", NULL);
	unpack_all(&t, m);
	req.previous = NULL;
	assert_int_equal(s->summarize(s, &req, &r), 0);
	assert_string_equal(r.text, "(1 messages without text)");
	free(r.text);
	free(r.model);
	histd__v1__message__free_unpacked(m[0], NULL);
	tx_free(&t);
	s->free(s);
}

/* The cut to a token budget never splits a character and fits it. */
static void
text_fit_cuts_between_characters(void **state)
{
	/* a (1/4), e-acute (1/2), U+4E2D (1), an invalid byte (1). */
	static const char x[] = "a\xc3\xa9\xe4\xb8\xad\xff" "abcd";

	(void)state;
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 0), 0);
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 1), 3);
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 2), 6);
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 3), 8);
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 4), 11);
	assert_int_equal(histd_tokens_text_fit(x, strlen(x), 100), 11);
	assert_int_equal(histd_tokens_text_quarters(x, strlen(x)),
			 1 + 2 + 4 + 4 + 4);
}

/* How many of m[0..n) a reduce of the pipeline's first plugin covers. */
static size_t
covered(const histd_pipeline *p, Histd__V1__Message **m, size_t n,
	uint32_t max_entries)
{
	histd_reduce r = { 0 };
	void *st;
	const histd_plugin *pl = histd_pipeline_plugin(p, 0, &st);

	r.messages = m;
	r.n_messages = n;
	r.max_entries = max_entries;
	assert_int_equal(pl->reduce(st, &r), 0);
	free(r.text);
	free(r.model);
	return r.n_covered;
}

/* A tool call whose result has not come is never covered: the cut stops
 * before its message, whatever the bounds ask. */
static void
compaction_never_covers_a_call_waiting_for_its_result(void **state)
{
	struct tx t = { 0 };
	Histd__V1__Message *m[MAXM];
	histd_pipeline *p = parse("compaction:keep_recent=0");
	size_t open;

	(void)state;
	tx_add(&t, USER, "t:Build and test.", NULL);            /* 0 */
	tx_add(&t, ASST, "c:b1:build", NULL);                   /* 1 */
	tx_add(&t, TOOL, "r:b1:build:ok", NULL);                /* 2 */
	tx_add(&t, ASST, "t:Built. Now the tests.", NULL);      /* 3 */
	tx_add(&t, USER, "t:Go on.", NULL);                     /* 4 */
	tx_add(&t, ASST, "c:t1:test", "c:t2:lint", NULL);       /* 5 */
	tx_add(&t, TOOL, "r:t1:test:passed", NULL);             /* 6 */
	tx_add(&t, USER, "t:Meanwhile, a question.", NULL);     /* 7 */
	tx_add(&t, ASST, "t:Ask.", NULL);                       /* 8 */
	unpack_all(&t, m);
	assert_int_equal(histd_first_open_call(m, t.n, &open), 0);
	assert_int_equal(open, 5);     /* t2 has no result */
	assert_int_equal(histd_first_open_call(m, 5, &open), 0);
	assert_int_equal(open, 5);     /* none open */
	assert_int_equal(histd_first_open_call(m, 2, &open), 0);
	assert_int_equal(open, 1);     /* b1's result is not in m[0..2) */

	/* The policy (everything but the tail) and a bound that asks for
	 * everything stop at t2's message. */
	assert_int_equal(covered(p, m, t.n, 0), 5);
	assert_int_equal(covered(p, m, t.n, 1), 5);
	/* The call alone, just made: only the user before it. */
	assert_int_equal(covered(p, m, 2, 0), 1);
	for (size_t i = 0; i < t.n; i++)
		histd__v1__message__free_unpacked(m[i], NULL);
	histd_pipeline_free(p);
	tx_free(&t);
}

static void
auto_reduce_when_fires_on_any_condition(void **state)
{
	histd_pipeline *p = parse(
		"compaction:auto_reduce_when=tokens>=100|messages>=10");
	histd_session_totals tt = { 0 };

	(void)state;
	tt.tokens_after_summary = 99;
	tt.messages_after_summary = 9;
	assert_int_equal(histd_pipeline_after_append(p, &tt), 0);
	tt.messages_after_summary = 10;
	assert_int_equal(histd_pipeline_after_append(p, &tt), 1);
	tt.messages_after_summary = 0;
	tt.tokens_after_summary = 100;
	assert_int_equal(histd_pipeline_after_append(p, &tt), 1);
	histd_pipeline_free(p);
	p = parse("compaction");
	assert_int_equal(histd_pipeline_after_append(p, &tt), 0);
	histd_pipeline_free(p);
}

/* ---------------------------------------------------------------------- */
/* Pipelines and loaded plugins                                            */

static void
pipeline_specs_parse_and_refuse_unknown_names(void **state)
{
	histd_pipeline *p = NULL;

	(void)state;
	p = parse("compaction:keep_recent=4 ; masking:keep_recent_results=1,"
		  "exclude_tools=grep|ls;window:max_tokens=1000");
	assert_int_equal(histd_pipeline_len(p), 3);
	assert_string_equal(histd_pipeline_plugin(p, 2, NULL)->name, "window");
	assert_int_equal(histd_pipeline_reducer(p), 0);
	histd_pipeline_free(p);
	p = parse("");
	assert_int_equal(histd_pipeline_len(p), 0);
	histd_pipeline_free(p);
	assert_int_equal(histd_pipeline_parse("window:max_messages", "x", &p),
			 HISTD_EINVALID);
	assert_int_equal(histd_pipeline_parse("nope", "x", &p), HISTD_EINVALID);
}

/* Version 1 of the struct ends before newest_needed: a plugin of that
 * version is never asked, whatever lies past its struct. */
static uint32_t
hint_1000(void *state)
{
	(void)state;
	return 1000;
}

static int
v1_configure(const histd_plugin_opt *o, size_t n, void **state, char *err,
	     size_t cap)
{
	(void)o;
	(void)n;
	(void)state;
	(void)err;
	(void)cap;
	return 0;
}

static void
v1_release(void *state)
{
	(void)state;
}

static int
v1_transform(void *state, histd_view *v)
{
	(void)state;
	(void)v;
	return 0;
}

static void
the_load_hint_is_the_largest_window_by_messages(void **state)
{
	static const histd_plugin v1 = {
		.version = 1, .name = "old_v1", .configure = v1_configure,
		.release = v1_release, .transform = v1_transform,
		.newest_needed = hint_1000 };
	histd_pipeline *p;

	(void)state;
	p = parse("masking;window:max_messages=20");
	assert_int_equal(histd_pipeline_newest_needed(p), 21);
	histd_pipeline_free(p);
	p = parse("window:max_messages=5;window:max_messages=40");
	assert_int_equal(histd_pipeline_newest_needed(p), 41);
	histd_pipeline_free(p);
	/* A token budget bounds nothing by count; nor does masking. */
	p = parse("window:max_tokens=1000");
	assert_int_equal(histd_pipeline_newest_needed(p), 0);
	histd_pipeline_free(p);
	p = parse("masking");
	assert_int_equal(histd_pipeline_newest_needed(p), 0);
	histd_pipeline_free(p);
	assert_int_equal(histd_pipeline_newest_needed(NULL), 0);
	assert_int_equal(histd_plugin_register(&v1), 0);
	p = parse("old_v1;window:max_messages=3");
	assert_int_equal(histd_pipeline_newest_needed(p), 4);
	histd_pipeline_free(p);
}

static void
registry_refuses_a_plugin_without_hooks_or_with_a_bad_version(void **state)
{
	static const histd_plugin none = {
		.version = HISTD_PLUGIN_VERSION, .name = "no_hooks" };
	static const histd_plugin future = {
		.version = HISTD_PLUGIN_VERSION + 1, .name = "future" };

	(void)state;
	assert_int_equal(histd_plugin_register(&none), HISTD_EINVALID);
	assert_int_equal(histd_plugin_register(&future), HISTD_EINVALID);
	assert_int_equal(histd_plugin_register(&histd_plugin_window),
			 HISTD_EEXISTS);
}

/* v1_configure's, with a state (static: nothing to free). */
static int
static_state_configure(const histd_plugin_opt *o, size_t n, void **state,
		       char *err, size_t cap)
{
	static int mine;

	*state = &mine;
	return v1_configure(o, n, NULL, err, cap);
}

/* plugin.h: release is required with a non-NULL state only. A plugin
 * without state registers and runs without one; one that makes a state
 * it cannot release is refused when a pipeline names it, not called. */
static void
release_is_needed_only_by_a_plugin_that_makes_a_state(void **state)
{
	static const histd_plugin stateless = {
		.version = HISTD_PLUGIN_VERSION, .name = "no_state",
		.configure = v1_configure, .transform = v1_transform };
	static const histd_plugin leaky = {
		.version = HISTD_PLUGIN_VERSION, .name = "state_no_release",
		.configure = static_state_configure,
		.transform = v1_transform };
	histd_pipeline *p = NULL;

	(void)state;
	assert_int_equal(histd_plugin_register(&stateless), 0);
	p = parse("no_state;window:max_messages=3");
	assert_int_equal(histd_pipeline_newest_needed(p), 4);
	histd_pipeline_free(p);
	assert_int_equal(histd_plugin_register(&leaky), 0);
	p = NULL;
	assert_int_equal(histd_pipeline_parse("state_no_release", "test", &p),
			 HISTD_EINTERNAL);
	assert_null(p);
	assert_non_null(strstr(histd_error_message(), "no release hook"));
}

static void
a_shared_object_plugin_loads_and_runs_like_a_built_in_one(void **state)
{
	const char *path = getenv("HISTD_EXAMPLE_PLUGIN");
	static char exe[4096];
	struct tx t = { 0 };
	histd_pipeline *p;
	histd_view *v;
	char got[64];

	(void)state;
	if (!path) {
		/* build/tests/unit/<test> -> build/plugins/examples/ */
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 64);

		assert_true(n > 0);
		exe[n] = '\0';
		*strrchr(exe, '/') = '\0';
		strcat(exe, "/../../plugins/examples/histd_plugin_hide_author.so");
		path = exe;
	}
	assert_int_equal(histd_plugin_load("/nonexistent/x.so"),
			 HISTD_EINVALID);
	if (histd_plugin_load(path))
		fail_msg("load %s: %s", path, histd_error_message());
	assert_non_null(histd_plugin_find("hide_author"));
	/* The same object again: the name is taken. */
	assert_int_equal(histd_plugin_load(path), HISTD_EEXISTS);

	tx_add(&t, USER, "t:one", NULL);
	tx_add(&t, USER, "t:two", NULL);
	tx_add(&t, USER, "t:three", NULL);
	{
		/* Message 2 written by "debug". */
		Histd__V1__Message *m = histd__v1__message__unpack(NULL,
			t.len[1], t.data[1]);

		m->author = "debug";
		free(t.data[1]);
		t.len[1] = histd__v1__message__get_packed_size(m);
		t.data[1] = malloc(t.len[1]);
		histd__v1__message__pack(m, t.data[1]);
		m->author = NULL;
		histd__v1__message__free_unpacked(m, NULL);
	}
	p = parse("hide_author:authors=tracer|debug;window:max_messages=5");
	v = tx_view(&t);
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	seqs(v, got, sizeof(got));
	assert_string_equal(got, "1,3");
	histd_view_free(v);
	histd_pipeline_free(p);
	assert_int_equal(histd_pipeline_parse("hide_author", "x", &p),
			 HISTD_EINVALID);
	tx_free(&t);
}

/* The fix-up drops 20,000 results whose calls are not in the view in one
 * pass: each item it keeps moves once at most, not every later item once
 * per message dropped (about 2 * 10^8 moves). */
static void
fixup_drops_unanswered_results_in_one_pass(void **state)
{
	struct tx t = { 0 };
	histd_view *v = histd_view_new();
	uint64_t seq = 1;

	(void)state;
	assert_non_null(v);
	tx_add(&t, TOOL, "r:gone:lookup:its text", NULL);
	tx_add(&t, USER, "t:Still here.", NULL);
	for (int i = 0; i < 20000; i++) {
		assert_int_equal(histd_view_push_record(v, seq++, t.tokens[0],
				 t.data[0], t.len[0]), 0);
		if (i % 1000 == 999)
			assert_int_equal(histd_view_push_record(v, seq++,
					 t.tokens[1], t.data[1], t.len[1]), 0);
	}
	assert_int_equal(histd_view_fixup(v), 0);
	assert_int_equal(v->n, 20);
	for (size_t i = 0; i < v->n; i++)
		assert_int_equal(v->items[i].seq, (i + 1) * 1001);
	if (histd_view_moved(v) > v->n)
		fail_msg("the fix-up moved %zu items", histd_view_moved(v));
	histd_view_free(v);
	tx_free(&t);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(window_never_orphans_a_tool_result),
		cmocka_unit_test(fixup_drops_unanswered_results_in_one_pass),
		cmocka_unit_test(
			window_keeps_a_call_with_all_its_parallel_results),
		cmocka_unit_test(
			window_by_tokens_fits_the_budget_with_system_counted),
		cmocka_unit_test(window_does_not_cut_reasoning_from_its_turn),
		cmocka_unit_test(window_starts_between_plain_assistant_messages),
		cmocka_unit_test(
			window_asks_for_more_when_the_view_is_incomplete),
		cmocka_unit_test(masking_excluded_tools_take_no_recent_slot),
		cmocka_unit_test(masking_small_results_take_no_slot_and_stay),
		cmocka_unit_test(a_pipeline_out_of_memory_is_enomem_not_corrupt),
		cmocka_unit_test(masking_never_changes_the_stored_bytes),
		cmocka_unit_test(
			a_reused_view_starts_empty_and_reads_tools_afresh),
		cmocka_unit_test(a_message_with_many_tool_calls_gives_them_all),
		cmocka_unit_test(wire_masking_gives_what_unpacking_gives),
		cmocka_unit_test(
			unknown_plugins_and_bad_options_are_invalid_argument),
		cmocka_unit_test(
			compaction_covers_up_to_a_safe_start_and_keeps_the_tail),
		cmocka_unit_test(extractive_summary_is_deterministic_and_rolls),
		cmocka_unit_test(
			extractive_rolling_summaries_stay_within_max_output_tokens),
		cmocka_unit_test(
			extractive_cuts_a_line_too_long_on_a_utf8_boundary),
		cmocka_unit_test(extractive_lines_are_200_characters),
		cmocka_unit_test(text_fit_cuts_between_characters),
		cmocka_unit_test(
			compaction_never_covers_a_call_waiting_for_its_result),
		cmocka_unit_test(auto_reduce_when_refuses_a_dangling_bar),
		cmocka_unit_test(
			max_summary_tokens_is_refused_stating_its_range),
		cmocka_unit_test(window_provider_takes_the_estimator_names),
		cmocka_unit_test(auto_reduce_when_fires_on_any_condition),
		cmocka_unit_test(pipeline_specs_parse_and_refuse_unknown_names),
		cmocka_unit_test(the_load_hint_is_the_largest_window_by_messages),
		cmocka_unit_test(
			registry_refuses_a_plugin_without_hooks_or_with_a_bad_version),
		cmocka_unit_test(
			release_is_needed_only_by_a_plugin_that_makes_a_state),
		cmocka_unit_test(
			a_shared_object_plugin_loads_and_runs_like_a_built_in_one),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
