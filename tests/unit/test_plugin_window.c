/*
 * The window plugin (plugins/window.c): its retention option (how it is
 * parsed and validated, what the host reads of it,
 * histd_window_retention_delete, and that it never changes the view), and
 * what dropping the oldest messages costs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_wire.h"
#include "plugin.h"

/* The window state of a one-plugin pipeline parsed from spec. */
static void *
window_state(const histd_pipeline *p)
{
	void *state = NULL;

	assert_int_equal(histd_pipeline_len(p), 1);
	assert_ptr_equal(histd_pipeline_plugin(p, 0, &state),
			 &histd_plugin_window);
	return state;
}

/* What histd_window_retention_delete says of spec's window. */
static int
retention_of(const char *spec)
{
	histd_pipeline *p = NULL;
	int del;

	if (histd_pipeline_parse(spec, "default-pipeline", &p))
		fail_msg("%s: %s", spec, histd_error_message());
	del = histd_window_retention_delete(window_state(p));
	histd_pipeline_free(p);
	return del;
}

static void
retention_is_view_unless_delete_is_asked_for(void **state)
{
	(void)state;
	assert_int_equal(retention_of("window:max_messages=5"), 0);
	assert_int_equal(retention_of("window:max_messages=5,retention=view"),
			 0);
	assert_int_equal(retention_of("window:max_messages=5,retention=delete"),
			 1);
	assert_int_equal(retention_of("window:retention=delete,max_tokens=900"),
			 1);
	assert_int_equal(histd_window_retention_delete(NULL), 0);
}

/* Validates a SessionConfig of one window with the given options
 * (NULL-terminated key, value pairs), as CreateSession does. */
static int
validate_window(const char *const *kv)
{
	Histd__V1__PluginConfig__OptionsEntry e[4], *ep[4];
	Histd__V1__PluginConfig pc = HISTD__V1__PLUGIN_CONFIG__INIT, *pcs = &pc;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	size_t n = 0;

	for (; kv[2 * n]; n++) {
		histd__v1__plugin_config__options_entry__init(&e[n]);
		e[n].key = (char *)kv[2 * n];
		e[n].value = (char *)kv[2 * n + 1];
		ep[n] = &e[n];
	}
	pc.name = "window";
	pc.options = ep;
	pc.n_options = n;
	pl.plugins = &pcs;
	pl.n_plugins = 1;
	c.pipeline = &pl;
	return histd_pipeline_validate(&c, "config");
}

static void
retention_other_than_view_or_delete_is_invalid_naming_the_option(void **state)
{
	static const char *const keep[] = { "max_messages", "5", "retention",
					     "keep", NULL };
	static const char *const upper[] = { "max_messages", "5", "retention",
					      "DELETE", NULL };
	static const char *const empty[] = { "max_messages", "5", "retention",
					      "", NULL };
	static const char *const alone[] = { "retention", "delete", NULL };
	static const char *const ok[] = { "max_tokens", "100", "retention",
					   "delete", NULL };

	(void)state;
	assert_int_equal(validate_window(keep), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options.retention must be view "
		"or delete");
	assert_int_equal(validate_window(upper), HISTD_EINVALID);
	assert_int_equal(validate_window(empty), HISTD_EINVALID);
	/* Retention bounds nothing by itself. */
	assert_int_equal(validate_window(alone), HISTD_EINVALID);
	assert_string_equal(histd_error_message(),
		"config.pipeline.plugins[0].options: max_messages or "
		"max_tokens is required (above 0; 0 means no limit)");
	assert_int_equal(validate_window(ok), 0);
}

/* ---------------------------------------------------------------------- */
/* The transform is the same with either retention                         */

#define N_MSGS 12

/* Packed messages with their seqs in front: a system prompt, then user
 * and assistant turns with a tool call answered in the next message. */
static size_t
transcript(uint8_t **data, size_t *len)
{
	for (size_t i = 0; i < N_MSGS; i++) {
		Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
		Histd__V1__ContentBlock b = HISTD__V1__CONTENT_BLOCK__INIT,
					*bp = &b, inner =
					HISTD__V1__CONTENT_BLOCK__INIT,
					*ip = &inner;
		Histd__V1__TextBlock t = HISTD__V1__TEXT_BLOCK__INIT;
		Histd__V1__ToolCallBlock tc = HISTD__V1__TOOL_CALL_BLOCK__INIT;
		Histd__V1__ToolResultBlock tr =
			HISTD__V1__TOOL_RESULT_BLOCK__INIT;
		char text[32], id[16];
		uint8_t *packed;
		size_t n;

		snprintf(text, sizeof(text), "message %zu", i);
		snprintf(id, sizeof(id), "call-%zu", i / 4);
		t.text = text;
		b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
		b.text = &t;
		if (i == 0) {
			m.role = HISTD__V1__ROLE__ROLE_SYSTEM;
		} else if (i % 4 == 1) {
			m.role = HISTD__V1__ROLE__ROLE_USER;
		} else if (i % 4 == 2) {
			m.role = HISTD__V1__ROLE__ROLE_ASSISTANT;
			tc.id = id;
			tc.name = "lookup";
			tc.arguments = "{}";
			b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
			b.tool_call = &tc;
		} else if (i % 4 == 3) {
			m.role = HISTD__V1__ROLE__ROLE_TOOL;
			inner.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
			inner.text = &t;
			tr.tool_call_id = id;
			tr.tool_name = "lookup";
			tr.content = &ip;
			tr.n_content = 1;
			b.block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
			b.tool_result = &tr;
		} else {
			m.role = HISTD__V1__ROLE__ROLE_ASSISTANT;
		}
		m.content = &bp;
		m.n_content = 1;
		n = histd__v1__message__get_packed_size(&m);
		packed = malloc(n);
		assert_non_null(packed);
		histd__v1__message__pack(&m, packed);
		data[i] = histd_wire_with_seq(i + 1, packed, n, &len[i]);
		assert_non_null(data[i]);
		free(packed);
	}
	return N_MSGS;
}

/* The seqs the pipeline spec leaves in a complete view of the transcript;
 * returns how many. */
static size_t
view_seqs(const char *spec, uint8_t **data, size_t *len, size_t n,
	  uint64_t *seqs)
{
	histd_pipeline *p = NULL;
	histd_view *v = histd_view_new();
	size_t k;

	assert_non_null(v);
	assert_int_equal(histd_pipeline_parse(spec, "spec", &p), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(histd_view_push_record(v, i + 1, 10, data[i],
							len[i]), 0);
	v->complete = 1;
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	for (k = 0; k < v->n; k++)
		seqs[k] = v->items[k].seq;
	histd_view_free(v);
	histd_pipeline_free(p);
	return k;
}

static void
retention_delete_shows_the_same_view_as_retention_view(void **state)
{
	static const char *const bounds[] = {
		"max_messages=1", "max_messages=4", "max_messages=5",
		"max_messages=7", "max_tokens=35", "max_tokens=60",
	};
	uint8_t *data[N_MSGS];
	size_t len[N_MSGS], n = transcript(data, len);

	(void)state;
	for (size_t b = 0; b < sizeof(bounds) / sizeof(bounds[0]); b++) {
		uint64_t a[N_MSGS], d[N_MSGS];
		char sa[64], sd[64];
		size_t na, nd;

		snprintf(sa, sizeof(sa), "window:%s,retention=view", bounds[b]);
		snprintf(sd, sizeof(sd), "window:%s,retention=delete",
			 bounds[b]);
		na = view_seqs(sa, data, len, n, a);
		nd = view_seqs(sd, data, len, n, d);
		assert_int_equal(na, nd);
		assert_memory_equal(a, d, na * sizeof(a[0]));
		/* The system prompt is always first. */
		assert_int_equal(a[0], 1);
	}
	for (size_t i = 0; i < n; i++)
		free(data[i]);
}

#define LONG_VIEW 20000

/* A window of 10 over 20,000 messages drops the 19,990 oldest with one
 * move of the 10 it keeps, not one move of the rest per message dropped
 * (about 2 * 10^8 items): removals cost what the view holds. */
static void
window_drops_the_oldest_at_once(void **state)
{
	histd_pipeline *p = NULL;
	histd_view *v = histd_view_new();
	uint8_t *data[N_MSGS];
	size_t len[N_MSGS], n = transcript(data, len);

	(void)state;
	assert_non_null(v);
	assert_int_equal(histd_pipeline_parse("window:max_messages=10", "spec",
					      &p), 0);
	/* The transcript's system prompt, then its first user message again
	 * and again. */
	assert_int_equal(histd_view_push_record(v, 1, 10, data[0], len[0]), 0);
	for (uint64_t seq = 2; seq <= LONG_VIEW + 1; seq++)
		assert_int_equal(histd_view_push_record(v, seq, 10, data[1],
							len[1]), 0);
	v->complete = 1;
	assert_int_equal(histd_pipeline_transform(p, v), 0);
	assert_int_equal(v->n, 11);
	assert_int_equal(v->items[0].seq, 1);
	assert_int_equal(v->items[1].seq, LONG_VIEW + 1 - 9);
	assert_int_equal(v->items[10].seq, LONG_VIEW + 1);
	if (histd_view_moved(v) > 10)
		fail_msg("the window moved %zu items", histd_view_moved(v));
	histd_view_free(v);
	histd_pipeline_free(p);
	for (size_t i = 0; i < n; i++)
		free(data[i]);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(retention_is_view_unless_delete_is_asked_for),
		cmocka_unit_test(
			retention_other_than_view_or_delete_is_invalid_naming_the_option),
		cmocka_unit_test(
			retention_delete_shows_the_same_view_as_retention_view),
		cmocka_unit_test(window_drops_the_oldest_at_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
