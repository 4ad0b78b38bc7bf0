/*
 * The token estimator's documented properties (plugins/tokens.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tokens.h"

static uint32_t
t(const char *s)
{
	return histd_tokens_text(s, strlen(s));
}

static void
empty_text_is_zero_tokens(void **state)
{
	(void)state;
	assert_int_equal(histd_tokens_text("", 0), 0);
	assert_int_equal(histd_tokens_text(NULL, 0), 0);
}

static void
non_empty_text_is_at_least_one_token(void **state)
{
	(void)state;
	assert_int_equal(t("a"), 1);
	assert_int_equal(t(" "), 1);
	assert_int_equal(histd_tokens_text("\0", 1), 1);
}

static void
ascii_is_four_bytes_per_token_rounded_up(void **state)
{
	char buf[401];

	(void)state;
	assert_int_equal(t("abcd"), 1);
	assert_int_equal(t("abcde"), 2);
	assert_int_equal(t("abcdefgh"), 2);
	memset(buf, 'x', 400);
	buf[400] = '\0';
	assert_int_equal(t(buf), 100);
	assert_int_equal(histd_tokens_text(buf, 399), 100);
	assert_int_equal(histd_tokens_text(buf, 397), 100);
	assert_int_equal(histd_tokens_text(buf, 396), 99);
}

static void
cjk_is_one_token_per_character(void **state)
{
	(void)state;
	/* 日本語のテキスト: kanji, hiragana, katakana. */
	assert_int_equal(t("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e"), 3);
	assert_int_equal(t("\xe3\x81\xae"), 1);
	assert_int_equal(t("\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88"), 4);
	/* Hangul syllables: 한국어 */
	assert_int_equal(t("\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4"), 3);
	/* CJK extension B (4-byte UTF-8): U+20000 */
	assert_int_equal(t("\xf0\xa0\x80\x80"), 1);
}

static void
other_non_ascii_is_half_a_token_per_character(void **state)
{
	(void)state;
	/* é (U+00E9) x 4 = 2 tokens; Cyrillic "привет" = 6 chars = 3. */
	assert_int_equal(t("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9"), 2);
	assert_int_equal(t("\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82"), 3);
	/* One emoji (U+1F600) alone: half a token, rounded up to 1. */
	assert_int_equal(t("\xf0\x9f\x98\x80"), 1);
	assert_int_equal(t("\xf0\x9f\x98\x80\xf0\x9f\x98\x80"), 1);
}

static void
malformed_utf8_is_one_token_per_byte(void **state)
{
	(void)state;
	assert_int_equal(t("\xff\xfe\xfd"), 3);
	/* A truncated sequence, an overlong form, a surrogate. */
	assert_int_equal(t("\xe6\x97"), 2);
	assert_int_equal(t("\xc0\xaf"), 2);
	assert_int_equal(t("\xed\xa0\x80"), 3);
}

static void
text_estimate_is_subadditive_and_monotonic(void **state)
{
	const char *parts[] = {
		"hello ", "world", "\xe6\x97\xa5\xe6\x9c\xac", "\xc3\xa9",
		"\xff", "a much longer sentence of plain text", "",
	};
	size_t n = sizeof(parts) / sizeof(parts[0]);
	char buf[256];

	(void)state;
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < n; j++) {
			uint32_t a = t(parts[i]), b = t(parts[j]), ab;

			snprintf(buf, sizeof(buf), "%s%s", parts[i], parts[j]);
			ab = t(buf);
			assert_true(ab <= a + b);
			assert_true(ab >= a && ab >= b);
		}
	}
}

/* ---------------------------------------------------------------------- */
/* Messages                                                                */

static Histd__V1__TextBlock text_blocks[8];
static Histd__V1__ContentBlock blocks[8];
static Histd__V1__ContentBlock *block_ptrs[8];
static size_t n_blocks;

static Histd__V1__ContentBlock *
new_block(void)
{
	Histd__V1__ContentBlock init = HISTD__V1__CONTENT_BLOCK__INIT;

	assert_true(n_blocks < 8);
	blocks[n_blocks] = init;
	return &blocks[n_blocks++];
}

static Histd__V1__ContentBlock *
text_block(const char *s)
{
	Histd__V1__TextBlock init = HISTD__V1__TEXT_BLOCK__INIT;
	Histd__V1__ContentBlock *b = new_block();

	text_blocks[n_blocks - 1] = init;
	text_blocks[n_blocks - 1].text = (char *)s;
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = &text_blocks[n_blocks - 1];
	return b;
}

static uint32_t
msg_tokens(size_t n, Histd__V1__ContentBlock **content)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;

	m.role = HISTD__V1__ROLE__ROLE_ASSISTANT;
	m.n_content = n;
	m.content = content;
	return histd_tokens_message(&m);
}

static int
reset(void **state)
{
	(void)state;
	n_blocks = 0;
	return 0;
}

static void
message_is_overhead_plus_its_blocks(void **state)
{
	(void)state;
	block_ptrs[0] = text_block("abcdefgh");          /* 2 */
	block_ptrs[1] = text_block("\xe6\x97\xa5");      /* 1 */
	assert_int_equal(msg_tokens(0, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD);
	assert_int_equal(msg_tokens(2, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 3);
}

static void
image_costs_a_fixed_amount_whatever_its_size(void **state)
{
	Histd__V1__ImageBlock small = HISTD__V1__IMAGE_BLOCK__INIT;
	Histd__V1__ImageBlock big = HISTD__V1__IMAGE_BLOCK__INIT;
	static uint8_t data[100000];
	Histd__V1__ContentBlock *b;

	(void)state;
	small.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	small.url = "https://example.com/a.png";
	big.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_DATA;
	big.data.data = data;
	big.data.len = sizeof(data);
	big.media_type = "image/png";
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = &small;
	block_ptrs[0] = b;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + HISTD_TOKENS_IMAGE);
	b->image = &big;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + HISTD_TOKENS_IMAGE);
}

static void
document_is_a_quarter_of_its_bytes_capped_or_fixed_by_url(void **state)
{
	Histd__V1__DocumentBlock d = HISTD__V1__DOCUMENT_BLOCK__INIT;
	Histd__V1__ContentBlock *b;
	uint8_t *big = calloc(1, 4u * HISTD_TOKENS_DOCUMENT_MAX + 8);

	(void)state;
	assert_non_null(big);
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT;
	b->document = &d;
	block_ptrs[0] = b;
	d.source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
	d.data.data = big;
	d.data.len = 401;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 101);
	d.data.len = 4u * HISTD_TOKENS_DOCUMENT_MAX + 8;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD +
			 HISTD_TOKENS_DOCUMENT_MAX);
	d.source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_URL;
	d.url = "https://example.com/a.pdf";
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD +
			 HISTD_TOKENS_DOCUMENT_URL);
	free(big);
}

static void
reasoning_counts_text_and_summary_not_opaque_data(void **state)
{
	Histd__V1__ReasoningBlock r = HISTD__V1__REASONING_BLOCK__INIT;
	static uint8_t enc[4000];
	Histd__V1__ContentBlock *b;

	(void)state;
	r.text = "abcdefgh";          /* 2 */
	r.summary = "abcd";           /* 1 */
	r.signature = "a-long-signature-that-is-not-counted";
	r.encrypted_data.data = enc;
	r.encrypted_data.len = sizeof(enc);
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING;
	b->reasoning = &r;
	block_ptrs[0] = b;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 3);
}

static void
tool_call_counts_name_and_arguments(void **state)
{
	Histd__V1__ToolCallBlock c = HISTD__V1__TOOL_CALL_BLOCK__INIT;
	Histd__V1__ContentBlock *b;

	(void)state;
	c.id = "call_0123456789_not_counted";
	c.name = "get_weather";              /* 11 bytes: 3 */
	c.arguments = "{\"city\":\"Paris\"}"; /* 16 bytes: 4 */
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b->tool_call = &c;
	block_ptrs[0] = b;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 7);
}

static void
tool_result_counts_its_content_recursively(void **state)
{
	Histd__V1__ToolResultBlock r = HISTD__V1__TOOL_RESULT_BLOCK__INIT;
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;
	Histd__V1__ContentBlock *inner[2], *b;

	(void)state;
	inner[0] = text_block("abcdefghijkl");   /* 3 */
	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	img.url = "https://example.com/x.png";
	inner[1] = new_block();
	inner[1]->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	inner[1]->image = &img;
	r.tool_call_id = "call_1";
	r.tool_name = "screenshot";
	r.n_content = 2;
	r.content = inner;
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b->tool_result = &r;
	block_ptrs[0] = b;
	assert_int_equal(msg_tokens(1, block_ptrs),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 3 + HISTD_TOKENS_IMAGE);
}

static void
message_estimate_ignores_seq_and_given_estimate(void **state)
{
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	uint32_t a;

	(void)state;
	block_ptrs[0] = text_block("some words here");
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.n_content = 1;
	m.content = block_ptrs;
	a = histd_tokens_message(&m);
	m.seq = 99;
	m.token_estimate = 123456;
	m.author = "planner-with-a-long-name";
	assert_int_equal(histd_tokens_message(&m), a);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(empty_text_is_zero_tokens),
		cmocka_unit_test(non_empty_text_is_at_least_one_token),
		cmocka_unit_test(ascii_is_four_bytes_per_token_rounded_up),
		cmocka_unit_test(cjk_is_one_token_per_character),
		cmocka_unit_test(other_non_ascii_is_half_a_token_per_character),
		cmocka_unit_test(malformed_utf8_is_one_token_per_byte),
		cmocka_unit_test(text_estimate_is_subadditive_and_monotonic),
		cmocka_unit_test_setup(message_is_overhead_plus_its_blocks, reset),
		cmocka_unit_test_setup(image_costs_a_fixed_amount_whatever_its_size,
				       reset),
		cmocka_unit_test_setup(
			document_is_a_quarter_of_its_bytes_capped_or_fixed_by_url,
			reset),
		cmocka_unit_test_setup(
			reasoning_counts_text_and_summary_not_opaque_data, reset),
		cmocka_unit_test_setup(tool_call_counts_name_and_arguments,
				       reset),
		cmocka_unit_test_setup(tool_result_counts_its_content_recursively,
				       reset),
		cmocka_unit_test_setup(
			message_estimate_ignores_seq_and_given_estimate, reset),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
