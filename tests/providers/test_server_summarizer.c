/*
 * Compaction through the provider summarizers, end to end: the real histd
 * binary, configured with every provider's base URL pointing at the stub
 * provider (stub_provider.h), and sessions whose compaction plugin names
 * a provider summarizer. Reduce must store the stub's text, model and
 * usage on the Summary; a provider failure must leave history unchanged
 * and reach a subscriber as a plugin_error event; a provider that is not
 * configured must fail with a message naming what to set.
 *
 * argv[1] is the histd binary (the integration harness, harness.h).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "harness.h"
#include "stub_provider.h"

static stub *provider;
static histd_proc *server;
static histd_client *client;

static int
setup(void **state)
{
	const char *url;

	(void)state;
	if (!(provider = stub_start()))
		return -1;
	url = stub_url(provider);
	/* The keys only have to exist; the stub never checks them. */
	setenv("ANTHROPIC_API_KEY", "test-anthropic-key", 1);
	setenv("OPENAI_API_KEY", "test-openai-key", 1);
	setenv("GEMINI_API_KEY", "test-gemini-key", 1);
	setenv("MISTRAL_API_KEY", "test-mistral-key", 1);
	{
		const char *extra[] = {
			"--anthropic-base-url", url,
			"--anthropic-model", "claude-test",
			"--openai-base-url", url,
			"--openai-model", "gpt-test",
			"--gemini-base-url", url,
			"--gemini-model", "gemini-test",
			"--mistral-base-url", url,
			"--mistral-model", "mistral-test",
			/* Reaches the request unless a session sets its
			 * own max_summary_tokens. */
			"--anthropic-max-output-tokens", "333",
			"--openai-max-output-tokens", "444",
			/* A 500 fails the call at once: no retries. */
			"--summarizer-max-retries", "0",
			"--shutdown-grace", "1",
			/* Naming a provider summarizer: checked at start, so
			 * the summarizers must be known by then. */
			"--default-pipeline",
			"compaction:summarizer=anthropic,auto_reduce_when="
			"tokens>=150000;window:max_tokens=180000",
			NULL };

		if (harness_start(&server, extra))
			return -1;
	}
	client = harness_client(server);
	return 0;
}

static int
teardown(void **state)
{
	int rc;

	(void)state;
	histd_client_close(client);
	client = NULL;
	rc = harness_stop(server);
	server = NULL;
	stub_stop(provider);
	provider = NULL;
	return rc;
}

static void create_with(tarena *a, const char *id, const char *summarizer,
			const char *max_summary_tokens);

/* A session whose pipeline is compaction with the given summarizer,
 * keeping the last 2 messages verbatim. */
static void
create(tarena *a, const char *id, const char *summarizer)
{
	create_with(a, id, summarizer, NULL);
}

/* The same, with max_summary_tokens when not NULL. */
static void
create_with(tarena *a, const char *id, const char *summarizer,
	    const char *max_summary_tokens)
{
	Histd__V1__CreateSessionRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__SessionConfig *c = ta_alloc(a, sizeof(*c));
	Histd__V1__Pipeline *pl = ta_alloc(a, sizeof(*pl));
	Histd__V1__PluginConfig *pc = ta_alloc(a, sizeof(*pc));
	Histd__V1__PluginConfig **pcs = ta_alloc(a, sizeof(*pcs));
	void **opts = ta_alloc(a, 3 * sizeof(void *));
	Histd__V1__Session *out = NULL;
	histd_status st;

	histd__v1__create_session_request__init(r);
	histd__v1__session_config__init(c);
	histd__v1__pipeline__init(pl);
	histd__v1__plugin_config__init(pc);
	r->session_id = ta_strdup(a, id);
	pc->name = "compaction";
	opts[0] = tm_entry(a, &histd__v1__plugin_config__options_entry__descriptor,
			   "summarizer", summarizer);
	opts[1] = tm_entry(a, &histd__v1__plugin_config__options_entry__descriptor,
			   "keep_recent", "2");
	pc->options = (Histd__V1__PluginConfig__OptionsEntry **)opts;
	pc->n_options = 2;
	if (max_summary_tokens)
		opts[pc->n_options++] = tm_entry(a,
			&histd__v1__plugin_config__options_entry__descriptor,
			"max_summary_tokens", max_summary_tokens);
	pcs[0] = pc;
	pl->plugins = pcs;
	pl->n_plugins = 1;
	c->pipeline = pl;
	r->config = c;
	histd_status_init(&st);
	t_call(client, "CreateSession", r, &histd__v1__session__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

static void
append(tarena *a, const char *id, Histd__V1__Message *m)
{
	Histd__V1__AppendRequest *r = ta_alloc(a, sizeof(*r));
	Histd__V1__Message **mm = ta_alloc(a, sizeof(*mm));
	Histd__V1__AppendResponse *out = NULL;
	histd_status st;

	histd__v1__append_request__init(r);
	r->session_id = ta_strdup(a, id);
	mm[0] = m;
	r->messages = mm;
	r->n_messages = 1;
	histd_status_init(&st);
	t_call(client, "Append", r, &histd__v1__append_response__descriptor,
	       &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_client_message_free((ProtobufCMessage *)out);
	histd_status_reset(&st);
}

/* A system message, then three turns with a tool call each: 13 messages. */
static void
fill(tarena *a, const char *id)
{
	append(a, id, tm_text(a, HISTD__V1__ROLE__ROLE_SYSTEM, "Be brief."));
	for (int i = 0; i < 3; i++) {
		char *call = ta_printf(a, "call_%d", i);

		append(a, id, tm_text(a, HISTD__V1__ROLE__ROLE_USER,
				      ta_printf(a, "Look up item %d.", i)));
		append(a, id, tm_tool_call(a, call, "lookup",
					   ta_printf(a, "{\"item\":%d}", i)));
		append(a, id, tm_tool_result(a, call, "lookup", "found it"));
		append(a, id, tm_text(a, HISTD__V1__ROLE__ROLE_ASSISTANT,
				      ta_printf(a, "Item %d is there.", i)));
	}
}

/* Reduce with no bounds; the status code, *out the response when OK. */
static grpc_status_code
reduce(const char *id, Histd__V1__ReduceResponse **out, char **details)
{
	Histd__V1__ReduceRequest r;
	histd_status st;
	grpc_status_code code;

	histd__v1__reduce_request__init(&r);
	r.session_id = (char *)id;
	*out = NULL;
	histd_status_init(&st);
	t_call(client, "Reduce", &r, &histd__v1__reduce_response__descriptor,
	       out, &st);
	code = st.code;
	if (details)
		*details = strdup(st.details ? st.details : "");
	histd_status_reset(&st);
	return code;
}

/* One Reduce through a summarizer; checks what the stub answered ended
 * up on the Summary, and that the request went to the format's path. */
static void
reduce_through(const char *summarizer, const char *path, const char *model)
{
	tarena *a = ta_new();
	char *id = ta_printf(a, "sum-%s", summarizer);
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *g;
	Histd__V1__GetMessagesRequest *gr = ta_alloc(a, sizeof(*gr));
	histd_status st;
	char *last;

	create(a, id, summarizer);
	fill(a, id);
	assert_int_equal(reduce(id, &rr, NULL), GRPC_STATUS_OK);
	assert_non_null(rr->summary);
	assert_string_equal(rr->summary->text, "stub summary");
	assert_string_equal(rr->summary->model, model);
	assert_int_equal(rr->summary->input_tokens, 11);
	assert_int_equal(rr->summary->output_tokens, 7);
	/* The tail (the last turn's result and answer) stays verbatim. */
	assert_true(rr->summary->covers_to_seq >= 2);
	assert_true(rr->summary->covers_to_seq <= 11);
	last = stub_last_path(provider);
	assert_non_null(last);
	assert_memory_equal(last, path, strlen(path));
	free(last);
	histd_client_message_free((ProtobufCMessage *)rr);

	/* The CONTEXT view starts with the summary. */
	histd__v1__get_messages_request__init(gr);
	gr->session_id = id;
	gr->view = HISTD__V1__VIEW__VIEW_CONTEXT;
	g = NULL;
	histd_status_init(&st);
	t_call(client, "GetMessages", gr,
	       &histd__v1__get_messages_response__descriptor, &g, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	assert_non_null(g->summary);
	assert_string_equal(g->summary->model, model);
	assert_string_equal(tm_first_text(g->messages[0]), "Be brief.");
	assert_string_equal(tm_first_text(g->messages[1]),
			    "[Earlier conversation summary: stub summary]");
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

static void
anthropic_reduce_records_the_stub_summary_model_and_usage(void **state)
{
	(void)state;
	reduce_through("anthropic", "/v1/messages", "claude-stub");
}

static void
openai_chat_reduce_records_the_stub_summary_model_and_usage(void **state)
{
	(void)state;
	reduce_through("openai_chat", "/v1/chat/completions", "chat-stub");
}

static void
openai_responses_reduce_records_the_stub_summary_model_and_usage(void **state)
{
	(void)state;
	reduce_through("openai_responses", "/v1/responses", "responses-stub");
}

static void
gemini_reduce_records_the_stub_summary_model_and_usage(void **state)
{
	(void)state;
	reduce_through("gemini", "/v1beta/models/gemini-test:generateContent",
		       "gemini-stub");
}

static void
mistral_reduce_records_the_stub_summary_model_and_usage(void **state)
{
	(void)state;
	reduce_through("mistral", "/v1/chat/completions", "chat-stub");
}

static void
a_provider_500_leaves_history_unchanged_and_reports_plugin_error(void **state)
{
	tarena *a = ta_new();
	Histd__V1__ReduceResponse *rr;
	Histd__V1__GetMessagesResponse *raw;
	Histd__V1__Session *before, *after;
	Histd__V1__HistoryEvent *ev;
	histd_client_stream *s;
	stub_reply fail = { .status = 500, .retry_after = -1,
			    .body = "{\"error\":{\"message\":\"overloaded\"}}" };
	int res, got_error = 0;

	(void)state;
	create(a, "fail1", "anthropic");
	fill(a, "fail1");
	before = t_get_session(client, "fail1");
	s = t_subscribe(client, "fail1", 13);
	stub_push(provider, fail);
	assert_int_equal(reduce("fail1", &rr, NULL), GRPC_STATUS_UNAVAILABLE);
	histd_client_message_free((ProtobufCMessage *)rr);
	while ((ev = t_next_event(s, 10000, &res))) {
		if (ev->event_case ==
		    HISTD__V1__HISTORY_EVENT__EVENT_PLUGIN_ERROR) {
			assert_string_equal(ev->plugin_error->plugin,
					    "compaction");
			assert_true(ev->plugin_error->message[0] != '\0');
			/* Never the conversation text. */
			assert_null(strstr(ev->plugin_error->message, "item"));
			got_error = 1;
		}
		assert_int_not_equal(ev->event_case,
				     HISTD__V1__HISTORY_EVENT__EVENT_REDUCED);
		histd_client_message_free((ProtobufCMessage *)ev);
		if (got_error)
			break;
	}
	assert_true(got_error);
	histd_client_stream_cancel(s);
	histd_client_stream_close(s);

	after = t_get_session(client, "fail1");
	assert_int_equal(after->revision, before->revision);
	raw = t_get_raw(client, "fail1", 0, 100);
	assert_int_equal(raw->n_messages, 13);
	assert_null(raw->summary);
	histd_client_message_free((ProtobufCMessage *)raw);
	histd_client_message_free((ProtobufCMessage *)before);
	histd_client_message_free((ProtobufCMessage *)after);

	/* The provider is back: the same session compacts. */
	assert_int_equal(reduce("fail1", &rr, NULL), GRPC_STATUS_OK);
	assert_string_equal(rr->summary->model, "claude-stub");
	histd_client_message_free((ProtobufCMessage *)rr);
	ta_free(a);
}

/* A provider refusing histd's own key or request is the server's
 * failure, not the caller's: FAILED_PRECONDITION naming the provider and
 * its status (never UNAUTHENTICATED or INVALID_ARGUMENT); a 429 stays
 * RESOURCE_EXHAUSTED. */
static void
provider_refusals_are_failed_precondition(void **state)
{
	static const struct {
		int status;
		const char *body;
		grpc_status_code code;
		const char *want;
	} cases[] = {
		{ 401, "{\"error\":{\"message\":\"Incorrect API key\"}}",
		  GRPC_STATUS_FAILED_PRECONDITION,
		  "openai_chat refused histd's API key (HTTP 401): check the "
		  "key in OPENAI_API_KEY" },
		{ 403, "{}", GRPC_STATUS_FAILED_PRECONDITION,
		  "openai_chat refused histd's API key (HTTP 403): check the "
		  "key in OPENAI_API_KEY" },
		{ 400, "{\"error\":{\"message\":\"max_completion_tokens is "
		  "too large\"}}", GRPC_STATUS_FAILED_PRECONDITION,
		  "openai_chat refused histd's request (HTTP 400): "
		  "max_completion_tokens is too large" },
		{ 404, "{\"error\":{\"message\":\"The model does not "
		  "exist\"}}", GRPC_STATUS_FAILED_PRECONDITION,
		  "openai_chat refused histd's request (HTTP 404): The model "
		  "does not exist" },
		{ 429, "{}", GRPC_STATUS_RESOURCE_EXHAUSTED,
		  "openai_chat: provider answered 429 (rate limited)" },
	};
	tarena *a = ta_new();

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Histd__V1__ReduceResponse *rr;
		char *id = ta_printf(a, "refused-%d", cases[i].status);
		char *details = NULL;

		create(a, id, "openai_chat");
		fill(a, id);
		stub_push(provider, (stub_reply){ .status = cases[i].status,
						  .retry_after = -1,
						  .body = cases[i].body });
		assert_int_equal(reduce(id, &rr, &details), cases[i].code);
		histd_client_message_free((ProtobufCMessage *)rr);
		assert_non_null(strstr(details, cases[i].want));
		assert_null(strstr(details, "test-openai-key"));
		free(details);
	}
	ta_free(a);
}

/* The output size a Reduce asks the provider for, from the body the stub
 * received last. */
static long long
last_max_tokens(const char *key)
{
	char *body = stub_last_body(provider);
	json_t *j = json_loads(body, 0, NULL), *v;
	long long n;

	assert_non_null(j);
	v = strcmp(key, "maxOutputTokens") ? json_object_get(j, key)
		: json_object_get(json_object_get(j, "generationConfig"), key);
	assert_true(json_is_integer(v));
	n = json_integer_value(v);
	json_decref(j);
	free(body);
	return n;
}

/* The output size: a session's max_summary_tokens, else the provider's
 * --<p>-max-output-tokens, else 1024. */
static void
max_output_tokens_precedence(void **state)
{
	static const struct {
		const char *summarizer, *session, *key;
		long long want;
	} cases[] = {
		{ "anthropic", NULL, "max_tokens", 333 },
		{ "anthropic", "55", "max_tokens", 55 },
		{ "openai_chat", NULL, "max_completion_tokens", 444 },
		{ "openai_responses", NULL, "max_output_tokens", 444 },
		{ "openai_responses", "66", "max_output_tokens", 66 },
		{ "gemini", NULL, "maxOutputTokens", 1024 },
		{ "mistral", "77", "max_tokens", 77 },
	};
	tarena *a = ta_new();

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Histd__V1__ReduceResponse *rr;
		char *id = ta_printf(a, "maxout-%zu", i);

		create_with(a, id, cases[i].summarizer, cases[i].session);
		fill(a, id);
		assert_int_equal(reduce(id, &rr, NULL), GRPC_STATUS_OK);
		histd_client_message_free((ProtobufCMessage *)rr);
		assert_int_equal(last_max_tokens(cases[i].key), cases[i].want);
	}
	ta_free(a);
}

/* Without a session max_summary_tokens: a Reduce bounded by max_tokens
 * asks for the 1024 tokens it planned room for, not the flag's 333; and
 * a provider answer far past what was asked is cut, but only above twice
 * that (the provider counts its own tokens). */
static void
provider_summaries_keep_to_what_was_planned(void **state)
{
	tarena *a = ta_new();
	Histd__V1__ReduceRequest r;
	Histd__V1__ReduceResponse *rr = NULL;
	histd_status st;
	size_t words = 4000, len;
	char *body, *text = malloc(words * 5 + 1);

	(void)state;
	assert_non_null(text);
	for (size_t i = 0; i < words; i++)
		memcpy(text + i * 5, "word ", 5);
	text[words * 5 - 1] = '\0';
	body = ta_printf(a, "{\"id\":\"msg_long\",\"type\":\"message\","
			 "\"role\":\"assistant\",\"model\":\"claude-stub\","
			 "\"content\":[{\"type\":\"text\",\"text\":\"%s\"}],"
			 "\"stop_reason\":\"end_turn\",\"usage\":"
			 "{\"input_tokens\":11,\"output_tokens\":4000}}", text);
	free(text);

	create(a, "planned", "anthropic");
	fill(a, "planned");
	stub_push(provider, (stub_reply){ .retry_after = -1, .body = body });
	histd__v1__reduce_request__init(&r);
	r.session_id = "planned";
	/* Small: the plan must cover messages to fit. */
	r.max_tokens = 1100;
	histd_status_init(&st);
	t_call(client, "Reduce", &r, &histd__v1__reduce_response__descriptor,
	       &rr, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	assert_int_equal(last_max_tokens("max_tokens"), 1024);
	assert_non_null(rr->summary);
	len = strlen(rr->summary->text);
	/* Cut (20,000 bytes came), and not to the 1024 tokens asked for
	 * (about 4 bytes each): to twice that. */
	if (len >= words * 5 - 1 || len <= 1024 * 4)
		fail_msg("summary of %zu bytes", len);
	histd_client_message_free((ProtobufCMessage *)rr);
	ta_free(a);
}

static void
an_unconfigured_provider_fails_naming_its_key_variable(void **state)
{
	tarena *a = ta_new();
	Histd__V1__ReduceResponse *rr;
	histd_proc *bare;
	histd_client *saved = client;
	char *details = NULL;
	/* No model: not configured. The key variable is unset on purpose,
	 * and start-up must not mind. */
	const char *extra[] = { "--gemini-api-key-env",
				"HISTD_TEST_UNSET_GEMINI_KEY", NULL };

	(void)state;
	unsetenv("HISTD_TEST_UNSET_GEMINI_KEY");
	assert_int_equal(harness_start(&bare, extra), 0);
	client = harness_client(bare);
	create(a, "bare1", "gemini");
	fill(a, "bare1");
	assert_int_equal(reduce("bare1", &rr, &details),
			 GRPC_STATUS_FAILED_PRECONDITION);
	histd_client_message_free((ProtobufCMessage *)rr);
	assert_non_null(strstr(details, "gemini-model"));
	assert_non_null(strstr(details, "HISTD_TEST_UNSET_GEMINI_KEY"));
	free(details);
	histd_client_close(client);
	client = saved;
	assert_int_equal(harness_stop(bare), 0);
	ta_free(a);
}

static void
the_server_log_never_holds_an_api_key(void **state)
{
	char path[256], buf[4096];
	FILE *f;
	size_t n;

	(void)state;
	snprintf(path, sizeof(path), "%s/histd.log", server->dir);
	assert_non_null(f = fopen(path, "r"));
	/* Keys are short and the log small: scan it in overlapping reads. */
	while ((n = fread(buf, 1, sizeof(buf) - 1, f)) > 0) {
		buf[n] = '\0';
		assert_null(strstr(buf, "test-anthropic-key"));
		assert_null(strstr(buf, "test-openai-key"));
		assert_null(strstr(buf, "test-gemini-key"));
		assert_null(strstr(buf, "test-mistral-key"));
		if (n == sizeof(buf) - 1)
			fseek(f, -32, SEEK_CUR);
		else
			break;
	}
	fclose(f);
}

static void *
reduce_thread(void *arg)
{
	Histd__V1__ReduceResponse *rr = NULL;

	*(grpc_status_code *)arg = reduce("slow", &rr, NULL);
	histd_client_message_free((ProtobufCMessage *)rr);
	return NULL;
}

/* A Reduce with a deadline hours away runs (the deadline's conversion
 * once overflowed 32 bits past 35 minutes and read as passed). */
static void
a_reduce_with_a_distant_deadline_runs(void **state)
{
	static const int hours[] = { 1, 2, 24 * 20 };
	tarena *a = ta_new();
	Histd__V1__ReduceRequest r;

	(void)state;
	for (size_t i = 0; i < sizeof(hours) / sizeof(hours[0]); i++) {
		char *id = ta_printf(a, "far%zu", i);
		ProtobufCMessage *out = NULL;
		histd_status st;

		create(a, id, "extractive");
		fill(a, id);
		histd__v1__reduce_request__init(&r);
		r.session_id = id;
		histd_status_init(&st);
		histd_client_unary(client, "/histd.v1.HistoryService/Reduce",
				   &r.base, &histd__v1__reduce_response__descriptor,
				   hours[i] * 3600 * 1000, NULL, &out, &st);
		assert_status(&st, GRPC_STATUS_OK);
		histd_status_reset(&st);
		histd_client_message_free(out);
	}
	ta_free(a);
}

struct stuck_reduce {
	const char *id;
	grpc_status_code code;
	pthread_t th;
};

static void *
stuck_reduce_thread(void *arg)
{
	struct stuck_reduce *r = arg;
	Histd__V1__ReduceResponse *rr = NULL;

	r->code = reduce(r->id, &rr, NULL);
	histd_client_message_free((ProtobufCMessage *)rr);
	return NULL;
}

/* A session deleted and created again under its id while a Reduce waits
 * on the provider: the old conversation's summary is not stored on the
 * new one (whose messages reach past what it covers), and the new
 * session's CONTEXT view keeps every message of its own. */
static void
a_reduce_does_not_summarize_into_a_session_created_again(void **state)
{
	tarena *a = ta_new();
	struct stuck_reduce r = { .id = "reborn" };
	Histd__V1__DeleteSessionRequest *d = ta_alloc(a, sizeof(*d));
	Histd__V1__GetMessagesRequest *gr = ta_alloc(a, sizeof(*gr));
	Histd__V1__GetMessagesResponse *g = NULL;
	ProtobufCMessage *out = NULL;
	histd_status st;
	unsigned before;

	(void)state;
	create(a, r.id, "anthropic");
	fill(a, r.id);
	before = stub_requests(provider);
	/* Long enough for the delete, the create and 13 appends. */
	stub_push(provider, (stub_reply){ .retry_after = -1, .delay_ms = 3000 });
	assert_int_equal(pthread_create(&r.th, NULL, stuck_reduce_thread, &r),
			 0);
	for (int i = 0; i < 400 && stub_requests(provider) < before + 1; i++)
		usleep(50 * 1000);
	assert_true(stub_requests(provider) >= before + 1);

	histd__v1__delete_session_request__init(d);
	d->session_id = (char *)r.id;
	histd_status_init(&st);
	t_call(client, "DeleteSession", d,
	       &histd__v1__delete_session_response__descriptor, &out, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free(out);
	create(a, r.id, "anthropic");
	fill(a, r.id);
	pthread_join(r.th, NULL);
	assert_int_equal(r.code, GRPC_STATUS_OK);

	histd__v1__get_messages_request__init(gr);
	gr->session_id = (char *)r.id;
	gr->view = HISTD__V1__VIEW__VIEW_CONTEXT;
	histd_status_init(&st);
	t_call(client, "GetMessages", gr,
	       &histd__v1__get_messages_response__descriptor, &g, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	assert_null(g->summary);
	assert_int_equal(g->n_messages, 13);
	assert_string_equal(tm_first_text(g->messages[0]), "Be brief.");
	histd_client_message_free((ProtobufCMessage *)g);
	ta_free(a);
}

/* More Reduce calls stuck on a provider than histd has queue threads:
 * every other call is still answered, because a call that waits on a
 * provider runs on a provider-call thread. On SIGTERM the stuck ones end
 * UNAVAILABLE after the grace. */
static void
reduces_stuck_on_a_provider_hold_no_queue_thread(void **state)
{
	enum { STUCK = 3 };
	const char *url = stub_url(provider);
	const char *extra[] = { "--threads", "2",
				"--anthropic-base-url", url,
				"--anthropic-model", "claude-test",
				"--summarizer-max-retries", "0",
				"--shutdown-grace", "1", NULL };
	tarena *a = ta_new();
	struct stuck_reduce r[STUCK];
	Histd__V1__GetSessionRequest *gs = ta_alloc(a, sizeof(*gs));
	Histd__V1__Session *sess = NULL;
	histd_client *saved = client;
	histd_proc *narrow;
	histd_status st;
	unsigned before;
	int i, status;

	(void)state;
	assert_int_equal(harness_start(&narrow, extra), 0);
	client = harness_client(narrow);
	for (i = 0; i < STUCK; i++) {
		r[i].id = ta_printf(a, "stuck%d", i);
		create(a, r[i].id, "anthropic");
		fill(a, r[i].id);
	}
	before = stub_requests(provider);
	for (i = 0; i < STUCK; i++)
		stub_push(provider, (stub_reply){ .retry_after = -1,
						  .delay_ms = 60000 });
	for (i = 0; i < STUCK; i++)
		assert_int_equal(pthread_create(&r[i].th, NULL,
						stuck_reduce_thread, &r[i]), 0);
	/* Both queue threads would be taken by now without the fix. */
	for (i = 0; i < 400 && stub_requests(provider) < before + 2; i++)
		usleep(50 * 1000);
	assert_true(stub_requests(provider) >= before + 2);

	histd__v1__get_session_request__init(gs);
	gs->session_id = (char *)r[0].id;
	histd_status_init(&st);
	t_call(client, "GetSession", gs, &histd__v1__session__descriptor,
	       &sess, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	histd_client_message_free((ProtobufCMessage *)sess);
	append(a, r[1].id, tm_text(a, HISTD__V1__ROLE__ROLE_USER,
				   "Still there?"));
	/* The third Reduce was not held behind the first two either. */
	for (i = 0; i < 400 && stub_requests(provider) < before + STUCK; i++)
		usleep(50 * 1000);
	assert_int_equal(stub_requests(provider), before + STUCK);

	status = harness_signal_wait(narrow, SIGTERM, 30000);
	for (i = 0; i < STUCK; i++)
		pthread_join(r[i].th, NULL);
	if (status != 0)
		harness_dump_log(narrow);
	assert_int_equal(status, 0);
	for (i = 0; i < STUCK; i++)
		assert_int_equal(r[i].code, GRPC_STATUS_UNAVAILABLE);
	harness_free(narrow);
	histd_client_close(client);
	client = saved;
	ta_free(a);
}

/* SIGTERM while a Reduce waits on a provider that would take a minute:
 * the call gets its grace (1 s here), then the provider call is
 * abandoned and histd exits 0, long before the provider would answer.
 * Runs last: it stops the server. */
static void
shutdown_abandons_a_provider_call_after_the_grace(void **state)
{
	tarena *a = ta_new();
	grpc_status_code code = GRPC_STATUS_OK;
	unsigned before;
	pthread_t th;
	int status;

	(void)state;
	create(a, "slow", "anthropic");
	fill(a, "slow");
	before = stub_requests(provider);
	stub_push(provider, (stub_reply){ .retry_after = -1, .delay_ms = 60000 });
	assert_int_equal(pthread_create(&th, NULL, reduce_thread, &code), 0);
	for (int i = 0; i < 200 && stub_requests(provider) == before; i++)
		usleep(50 * 1000);
	assert_true(stub_requests(provider) > before);
	status = harness_signal_wait(server, SIGTERM, 30000);
	pthread_join(th, NULL);
	if (status != 0)
		harness_dump_log(server);
	assert_int_equal(status, 0);
	assert_int_equal(code, GRPC_STATUS_UNAVAILABLE);
	harness_free(server);
	server = NULL;
	ta_free(a);
}

int
main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(
			anthropic_reduce_records_the_stub_summary_model_and_usage),
		cmocka_unit_test(
			openai_chat_reduce_records_the_stub_summary_model_and_usage),
		cmocka_unit_test(
			openai_responses_reduce_records_the_stub_summary_model_and_usage),
		cmocka_unit_test(
			gemini_reduce_records_the_stub_summary_model_and_usage),
		cmocka_unit_test(
			mistral_reduce_records_the_stub_summary_model_and_usage),
		cmocka_unit_test(
			a_provider_500_leaves_history_unchanged_and_reports_plugin_error),
		cmocka_unit_test(provider_refusals_are_failed_precondition),
		cmocka_unit_test(max_output_tokens_precedence),
		cmocka_unit_test(provider_summaries_keep_to_what_was_planned),
		cmocka_unit_test(
			an_unconfigured_provider_fails_naming_its_key_variable),
		cmocka_unit_test(the_server_log_never_holds_an_api_key),
		cmocka_unit_test(a_reduce_with_a_distant_deadline_runs),
		cmocka_unit_test(
			a_reduce_does_not_summarize_into_a_session_created_again),
		cmocka_unit_test(
			reduces_stuck_on_a_provider_hold_no_queue_thread),
		cmocka_unit_test(shutdown_abandons_a_provider_call_after_the_grace),
	};

	if (harness_init(argc, argv))
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
