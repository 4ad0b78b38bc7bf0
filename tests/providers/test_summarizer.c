/*
 * Provider summarizers against the stub provider: each sends its
 * provider's request (path, auth header, model, output size) and reads
 * text, model and usage from that provider's answer; malformed answers and
 * rate limits map to the codes summarizer.h promises.
 */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "provider_summarizer.h"
#include "stub_provider.h"

static const struct {
	const char *provider, *path, *auth_header, *auth_value, *model,
		*max_key;
} cases[] = {
	{ "anthropic", "/v1/messages", "x-api-key", "k-1", "claude-stub",
	  "max_tokens" },
	{ "openai", "/v1/chat/completions", "Authorization", "Bearer k-1",
	  "chat-stub", "max_completion_tokens" },
	{ "openai_responses", "/v1/responses", "Authorization", "Bearer k-1",
	  "responses-stub", "max_output_tokens" },
	{ "gemini", "/v1beta/models/m1:generateContent", "x-goog-api-key",
	  "k-1", "gemini-stub", NULL },
	{ "mistral", "/v1/chat/completions", "Authorization", "Bearer k-1",
	  "chat-stub", "max_tokens" },
};

static Histd__V1__Message *
text_message(Histd__V1__Role role, const char *text)
{
	static Histd__V1__Message m[4];
	static Histd__V1__ContentBlock b[4], *bp[4];
	static Histd__V1__TextBlock t[4];
	static int n;
	int i = n++ % 4;

	histd__v1__message__init(&m[i]);
	histd__v1__content_block__init(&b[i]);
	histd__v1__text_block__init(&t[i]);
	t[i].text = (char *)text;
	b[i].block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b[i].text = &t[i];
	bp[i] = &b[i];
	m[i].role = role;
	m[i].n_content = 1;
	m[i].content = &bp[i];
	return &m[i];
}

static histd_summarizer *
open_sized(stub *s, const char *provider, uint32_t retries,
	   uint32_t max_output_tokens);

static histd_summarizer *
open_on(stub *s, const char *provider, uint32_t retries)
{
	return open_sized(s, provider, retries, 333);
}

static histd_summarizer *
open_sized(stub *s, const char *provider, uint32_t retries,
	   uint32_t max_output_tokens)
{
	histd_http_config hc;
	histd_provider_options o = { 0 };
	histd_summarizer *sum;

	histd_http_config_default(&hc);
	hc.max_retries = retries;
	hc.backoff_base_ms = 5;
	o.provider = provider;
	o.model = "m1";
	o.base_url = stub_url(s);
	o.api_key = "k-1";
	o.max_output_tokens = max_output_tokens;
	o.http_config = &hc;
	assert_int_equal(histd_provider_summarizer_open(&o, &sum), 0);
	return sum;
}

static void
every_provider_summarizes_in_its_wire_format(void **state)
{
	Histd__V1__Message *msgs[2];
	stub *s = stub_start();

	(void)state;
	assert_non_null(s);
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "plan a trip");
	msgs[1] = text_message(HISTD__V1__ROLE__ROLE_ASSISTANT, "to Lyon");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		histd_summary_request req = { .previous = "PREVIOUS",
					      .messages = msgs,
					      .n_messages = 2 };
		histd_summary_result res = { 0 };
		histd_summarizer *sum = open_on(s, cases[i].provider, 0);
		char *path, *auth, *body;
		json_t *j;

		assert_int_equal(sum->summarize(sum, &req, &res), 0);
		assert_string_equal(res.text, "stub summary");
		assert_string_equal(res.model, cases[i].model);
		assert_int_equal(res.input_tokens, 11);
		assert_int_equal(res.output_tokens, 7);
		path = stub_last_path(s);
		assert_string_equal(path, cases[i].path);
		auth = stub_last_header(s, cases[i].auth_header);
		assert_non_null(auth);
		assert_string_equal(auth, cases[i].auth_value);
		body = stub_last_body(s);
		assert_non_null(strstr(body, "PREVIOUS"));
		assert_non_null(strstr(body, "to Lyon"));
		j = json_loads(body, 0, NULL);
		assert_non_null(j);
		if (cases[i].max_key) {
			assert_string_equal(json_string_value(
				json_object_get(j, "model")), "m1");
			assert_int_equal(json_integer_value(json_object_get(
				j, cases[i].max_key)), 333);
		} else {
			assert_int_equal(json_integer_value(json_object_get(
				json_object_get(j, "generationConfig"),
				"maxOutputTokens")), 333);
		}
		json_decref(j);
		free(path);
		free(auth);
		free(body);
		histd_summary_result_clear(&res);
		sum->free(sum);
	}
	stub_stop(s);
}

/* An output size past INT_MAX (the option is 32 bits unsigned) goes out
 * as that number, not wrapped negative. */
static void
large_output_sizes_are_sent_as_they_are(void **state)
{
	Histd__V1__Message *msgs[1];
	stub *s = stub_start();

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		histd_summary_request req = { .messages = msgs,
					      .n_messages = 1 };
		histd_summary_result res = { 0 };
		histd_summarizer *sum = open_sized(s, cases[i].provider, 0,
						   3000000000u);
		char *body;
		json_t *j, *v;

		assert_int_equal(sum->summarize(sum, &req, &res), 0);
		body = stub_last_body(s);
		assert_non_null(j = json_loads(body, 0, NULL));
		v = cases[i].max_key ? json_object_get(j, cases[i].max_key)
			: json_object_get(json_object_get(j,
				"generationConfig"), "maxOutputTokens");
		assert_true(json_integer_value(v) == 3000000000LL);
		json_decref(j);
		free(body);
		histd_summary_result_clear(&res);
		sum->free(sum);
	}
	stub_stop(s);
}

static void
malformed_answers_are_eunavailable(void **state)
{
	static const char *const bodies[] = {
		"{not json", "[]", "{}", "{\"content\":5}",
		"{\"choices\":[{\"message\":{\"content\":7}}]}",
		"{\"output\":[{\"type\":\"message\",\"content\":[]}]}",
		"{\"candidates\":[]}",
	};
	Histd__V1__Message *msgs[1];
	stub *s = stub_start();

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		histd_summarizer *sum = open_on(s, cases[i].provider, 0);

		for (size_t k = 0; k < sizeof(bodies) / sizeof(bodies[0]);
		     k++) {
			histd_summary_request req = { .messages = msgs,
						      .n_messages = 1 };
			histd_summary_result res = { 0 };

			stub_push(s, (stub_reply){ 200, -1, 0, bodies[k] });
			assert_int_equal(sum->summarize(sum, &req, &res),
					 HISTD_EUNAVAILABLE);
			assert_null(res.text);
			/* The message names the provider. */
			assert_ptr_equal(strstr(histd_error_message(),
						cases[i].provider),
					 histd_error_message());
		}
		sum->free(sum);
	}
	stub_stop(s);
}

/* An answer in the right shape with no text (Anthropic thinking blocks
 * alone, an empty Chat message, Gemini thoughts alone, a Responses message
 * with no output text) fails as README says: UNAVAILABLE, "the summarizer
 * returned an empty summary", named with its provider. */
static void
an_answer_without_text_is_an_empty_summary(void **state)
{
	static const char *const bodies[] = {
		"{\"content\":[{\"type\":\"thinking\",\"thinking\":\"hm\","
		"\"signature\":\"s\"}],\"model\":\"m1\"}",
		"{\"choices\":[{\"message\":{\"role\":\"assistant\","
		"\"content\":\"\"}}],\"model\":\"m1\"}",
		"{\"output\":[{\"type\":\"reasoning\",\"summary\":[]}],"
		"\"model\":\"m1\"}",
		"{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"hm\","
		"\"thought\":true}]}}]}",
		"{\"choices\":[{\"message\":{\"role\":\"assistant\","
		"\"content\":\"\"}}],\"model\":\"m1\"}",
	};
	Histd__V1__Message *msgs[1];
	stub *s = stub_start();

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		histd_summarizer *sum = open_on(s, cases[i].provider, 0);
		histd_summary_request req = { .messages = msgs, .n_messages = 1 };
		histd_summary_result res = { 0 };

		stub_push(s, (stub_reply){ 200, -1, 0, bodies[i] });
		assert_int_equal(sum->summarize(sum, &req, &res),
				 HISTD_EUNAVAILABLE);
		assert_null(res.text);
		assert_ptr_equal(strstr(histd_error_message(), cases[i].provider),
				 histd_error_message());
		assert_non_null(strstr(histd_error_message(),
				       ": the summarizer returned an empty summary"));
		sum->free(sum);
	}
	stub_stop(s);
}

/* Usage counts below zero are the provider's error: 0, not 2^32 - 1;
 * counts past 32 bits saturate. */
static void
usage_counts_are_clamped(void **state)
{
	static const char *const bodies[] = {
		/* anthropic */
		"{\"model\":\"x\",\"content\":[{\"type\":\"text\","
		"\"text\":\"s\"}],\"usage\":{\"input_tokens\":%s,"
		"\"output_tokens\":%s}}",
		/* openai (chat) */
		"{\"model\":\"x\",\"choices\":[{\"message\":{\"content\":"
		"\"s\"}}],\"usage\":{\"prompt_tokens\":%s,"
		"\"completion_tokens\":%s}}",
		/* openai_responses */
		"{\"model\":\"x\",\"output\":[{\"type\":\"message\","
		"\"content\":[{\"type\":\"output_text\",\"text\":\"s\"}]}],"
		"\"usage\":{\"input_tokens\":%s,\"output_tokens\":%s}}",
		/* gemini */
		"{\"modelVersion\":\"x\",\"candidates\":[{\"content\":"
		"{\"parts\":[{\"text\":\"s\"}]}}],\"usageMetadata\":"
		"{\"promptTokenCount\":%s,\"candidatesTokenCount\":%s}}",
		/* mistral */
		"{\"model\":\"x\",\"choices\":[{\"message\":{\"content\":"
		"\"s\"}}],\"usage\":{\"prompt_tokens\":%s,"
		"\"completion_tokens\":%s}}",
	};
	static const struct {
		const char *in, *out;
		uint32_t want_in, want_out;
	} counts[] = {
		{ "-1", "-7", 0, 0 },
		{ "-9223372036854775808", "5", 0, 5 },
		{ "4294967296", "99999999999", UINT32_MAX, UINT32_MAX },
		{ "12.5", "\"3\"", 0, 0 },
	};
	Histd__V1__Message *msgs[1];
	stub *s = stub_start();
	char body[512];

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		histd_summarizer *sum = open_on(s, cases[i].provider, 0);

		for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]);
		     k++) {
			histd_summary_request req = { .messages = msgs,
						      .n_messages = 1 };
			histd_summary_result res = { 0 };

			snprintf(body, sizeof(body), bodies[i], counts[k].in,
				 counts[k].out);
			stub_push(s, (stub_reply){ 200, -1, 0, body });
			assert_int_equal(sum->summarize(sum, &req, &res), 0);
			assert_int_equal(res.input_tokens, counts[k].want_in);
			assert_int_equal(res.output_tokens,
					 counts[k].want_out);
			histd_summary_result_clear(&res);
		}
		sum->free(sum);
	}
	stub_stop(s);
}

static void
rate_limits_and_refusals_map_to_codes(void **state)
{
	Histd__V1__Message *msgs[1];
	histd_summary_request req = { .n_messages = 1 };
	histd_summary_result res = { 0 };
	stub *s = stub_start();
	histd_summarizer *sum = open_on(s, "anthropic", 1);

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	req.messages = msgs;
	stub_push(s, (stub_reply){ 429, 0, 0, "{}" });
	stub_push(s, (stub_reply){ 429, 0, 0, "{}" });
	assert_int_equal(sum->summarize(sum, &req, &res), HISTD_ELIMIT);
	assert_non_null(strstr(histd_error_message(), "anthropic: "));
	stub_push(s, (stub_reply){ 400, -1, 0, "{\"type\":\"error\",\"error\""
				   ":{\"message\":\"max_tokens: too big\"}}" });
	assert_int_equal(sum->summarize(sum, &req, &res),
			 HISTD_EPRECONDITION);
	assert_string_equal(histd_error_message(), "anthropic refused histd's "
			    "request (HTTP 400): max_tokens: too big");
	stub_push(s, (stub_reply){ 529, -1, 0, "{}" });
	assert_int_equal(sum->summarize(sum, &req, &res), 0);
	histd_summary_result_clear(&res);
	sum->free(sum);
	stub_stop(s);
}

/* The provider refusing histd's key is the server's fault, not the
 * caller's credentials: EPRECONDITION naming the provider, the status
 * and the variable the key came from, never the key. */
static void
a_refused_key_names_provider_status_and_variable(void **state)
{
	static const long statuses[] = { 401, 403 };
	Histd__V1__Message *msgs[1];
	histd_summary_request req = { .n_messages = 1 };
	histd_summary_result res = { 0 };
	histd_provider_options o = { .provider = "openai_responses",
				     .model = "m1",
				     .api_key_env = "HISTD_TEST_REFUSED_KEY" };
	histd_summarizer *sum;
	stub *s = stub_start();
	char want[160];

	(void)state;
	msgs[0] = text_message(HISTD__V1__ROLE__ROLE_USER, "hello");
	req.messages = msgs;
	setenv("HISTD_TEST_REFUSED_KEY", "sk-refused-1234", 1);
	o.base_url = stub_url(s);
	assert_int_equal(histd_provider_summarizer_open(&o, &sum), 0);
	for (size_t i = 0; i < 2; i++) {
		stub_push(s, (stub_reply){ (int)statuses[i], -1, 0,
			"{\"error\":{\"message\":\"Incorrect API key "
			"provided: sk-refused-1234\"}}" });
		assert_int_equal(sum->summarize(sum, &req, &res),
				 HISTD_EPRECONDITION);
		snprintf(want, sizeof(want), "openai_responses refused histd's "
			 "API key (HTTP %ld): check the key in "
			 "HISTD_TEST_REFUSED_KEY", statuses[i]);
		assert_string_equal(histd_error_message(), want);
		assert_null(res.text);
	}
	/* Not retried. */
	assert_int_equal(stub_requests(s), 2);
	sum->free(sum);
	stub_stop(s);
	unsetenv("HISTD_TEST_REFUSED_KEY");
}

static void
missing_key_names_the_variable(void **state)
{
	histd_provider_options o = { .provider = "mistral", .model = "m",
				     .api_key_env = "HISTD_TEST_NO_SUCH_KEY" };
	histd_summarizer *sum;

	(void)state;
	unsetenv("HISTD_TEST_NO_SUCH_KEY");
	assert_int_equal(histd_provider_summarizer_open(&o, &sum),
			 HISTD_EINVALID);
	assert_non_null(strstr(histd_error_message(),
			       "HISTD_TEST_NO_SUCH_KEY is not set"));
	o.provider = "nope";
	assert_int_equal(histd_provider_summarizer_open(&o, &sum),
			 HISTD_EINVALID);
	setenv("HISTD_TEST_KEY", "from-env", 1);
	o.provider = "gemini";
	o.api_key_env = "HISTD_TEST_KEY";
	assert_int_equal(histd_provider_summarizer_open(&o, &sum), 0);
	sum->free(sum);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(every_provider_summarizes_in_its_wire_format),
		cmocka_unit_test(large_output_sizes_are_sent_as_they_are),
		cmocka_unit_test(malformed_answers_are_eunavailable),
		cmocka_unit_test(an_answer_without_text_is_an_empty_summary),
		cmocka_unit_test(usage_counts_are_clamped),
		cmocka_unit_test(rate_limits_and_refusals_map_to_codes),
		cmocka_unit_test(
			a_refused_key_names_provider_status_and_variable),
		cmocka_unit_test(missing_key_names_the_variable),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
