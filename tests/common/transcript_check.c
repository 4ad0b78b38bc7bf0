#include "transcript_check.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

const char *
tc_text_of(const Histd__V1__Message *m)
{
	if (m->n_content && m->content[0]->block_case ==
	    HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT)
		return m->content[0]->text->text;
	return "";
}

/* 1 if a message of g in [from, to) has a first block of `kind` naming
 * id (a call's id, a result's tool_call_id). */
static int
has_block(const Histd__V1__GetMessagesResponse *g, size_t from, size_t to,
	  Histd__V1__ContentBlock__BlockCase kind, const char *id)
{
	for (size_t q = from; q < to; q++) {
		const Histd__V1__ContentBlock *c = g->messages[q]->content[0];

		if (c->block_case != kind)
			continue;
		if (kind == HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL ?
		    !strcmp(c->tool_call->id, id) :
		    !strcmp(c->tool_result->tool_call_id, id))
			return 1;
	}
	return 0;
}

void
tc_assert_pairs_whole(const Histd__V1__GetMessagesResponse *g)
{
	const Histd__V1__ContentBlock__BlockCase call =
		HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	const Histd__V1__ContentBlock__BlockCase result =
		HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;

	for (size_t k = 0; k < g->n_messages; k++) {
		const Histd__V1__ContentBlock *b = g->messages[k]->content[0];
		unsigned long long seq = g->messages[k]->seq;

		if (b->block_case == result &&
		    !has_block(g, 0, k, call, b->tool_result->tool_call_id))
			fail_msg("seq %llu: a tool result without its call", seq);
		if (b->block_case == call &&
		    !has_block(g, k + 1, g->n_messages, result,
			       b->tool_call->id))
			fail_msg("seq %llu: a tool call without its result", seq);
	}
}
