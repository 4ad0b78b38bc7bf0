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

#include "plugin.h"
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
image_of_unknown_size_costs_the_default_amount(void **state)
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

/* ---------------------------------------------------------------------- */
/* Per-provider rules for images and documents                            */

/* Headers only: the estimator reads no further. */
static size_t
png(uint8_t *b, uint32_t w, uint32_t h)
{
	memset(b, 0, 33);
	memcpy(b, "\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR", 16);
	b[16] = (uint8_t)(w >> 24); b[17] = (uint8_t)(w >> 16);
	b[18] = (uint8_t)(w >> 8); b[19] = (uint8_t)w;
	b[20] = (uint8_t)(h >> 24); b[21] = (uint8_t)(h >> 16);
	b[22] = (uint8_t)(h >> 8); b[23] = (uint8_t)h;
	return 33;
}

static uint32_t
img_tokens(uint32_t w, uint32_t h, histd_tokens_provider p)
{
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;
	uint8_t b[64];

	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_DATA;
	img.data.data = b;
	img.data.len = png(b, w, h);
	img.media_type = "image/png";
	return histd_tokens_image(&img, p);
}

static void
image_size_is_read_from_png_gif_jpeg_and_webp_headers(void **state)
{
	/* GIF89a 300 x 200 */
	static const uint8_t gif[] = "GIF89a\x2c\x01\xc8\x00\x00\x00\x00";
	/* JPEG: SOI, an APP0 of 16 bytes, SOF0 with height 480, width 640 */
	static const uint8_t jpg[] =
		"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01"
		"\x00\x00\xff\xc0\x00\x11\x08\x01\xe0\x02\x80\x03";
	/* WebP lossy (VP8): 800 x 600 */
	static const uint8_t vp8[] =
		"RIFF\x00\x00\x00\x00WEBPVP8 \x00\x00\x00\x00"
		"\x00\x00\x00\x9d\x01\x2a\x20\x03\x58\x02\x00\x00";
	/* WebP lossless (VP8L): 100 x 50: bits width-1 | (height-1) << 14 */
	uint8_t vp8l[32] = "RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f";
	/* WebP extended (VP8X): 4000 x 3000, 24-bit minus one */
	static const uint8_t vp8x[] =
		"RIFF\x00\x00\x00\x00WEBPVP8X\x0a\x00\x00\x00"
		"\x00\x00\x00\x00\x9f\x0f\x00\xb7\x0b\x00";
	uint8_t p[64];
	uint32_t w = 0, h = 0, bits = 99u | 49u << 14;

	(void)state;
	vp8l[21] = (uint8_t)bits;
	vp8l[22] = (uint8_t)(bits >> 8);
	vp8l[23] = (uint8_t)(bits >> 16);
	vp8l[24] = (uint8_t)(bits >> 24);
	assert_int_equal(histd_image_size(p, png(p, 1920, 1080), &w, &h), 0);
	assert_int_equal(w, 1920);
	assert_int_equal(h, 1080);
	assert_int_equal(histd_image_size(gif, sizeof(gif) - 1, &w, &h), 0);
	assert_int_equal(w, 300);
	assert_int_equal(h, 200);
	assert_int_equal(histd_image_size(jpg, sizeof(jpg) - 1, &w, &h), 0);
	assert_int_equal(w, 640);
	assert_int_equal(h, 480);
	assert_int_equal(histd_image_size(vp8, sizeof(vp8) - 1, &w, &h), 0);
	assert_int_equal(w, 800);
	assert_int_equal(h, 600);
	assert_int_equal(histd_image_size(vp8l, 30, &w, &h), 0);
	assert_int_equal(w, 100);
	assert_int_equal(h, 50);
	assert_int_equal(histd_image_size(vp8x, sizeof(vp8x) - 1, &w, &h), 0);
	assert_int_equal(w, 4000);
	assert_int_equal(h, 3000);
}

static void
image_size_refuses_unknown_and_cut_short_headers(void **state)
{
	uint8_t p[64];
	uint32_t w = 7, h = 7;

	(void)state;
	png(p, 100, 100);
	assert_int_equal(histd_image_size(p, 20, &w, &h), -1);
	assert_int_equal(histd_image_size((const uint8_t *)"hello world", 11,
					  &w, &h), -1);
	/* A JPEG whose scan starts before any frame header. */
	assert_int_equal(histd_image_size(
		(const uint8_t *)"\xff\xd8\xff\xda\x00\x02\x00\x00", 8, &w, &h),
		-1);
	/* A JPEG segment length running past the end. */
	assert_int_equal(histd_image_size(
		(const uint8_t *)"\xff\xd8\xff\xe0\xff\xff\x00\x00", 8, &w, &h),
		-1);
	assert_int_equal(histd_image_size(p, png(p, 0, 10), &w, &h), -1);
	assert_int_equal(histd_image_size(NULL, 0, &w, &h), -1);
	assert_int_equal(w, 7);
	assert_int_equal(h, 7);
}

static void
anthropic_images_are_area_over_750_with_the_long_side_capped(void **state)
{
	(void)state;
	/* 1000 x 1000 / 750 = 1333.3 */
	assert_int_equal(img_tokens(1000, 1000, HISTD_TOKENS_ANTHROPIC), 1334);
	/* 200 x 200 / 750 = 53.3 */
	assert_int_equal(img_tokens(200, 200, HISTD_TOKENS_ANTHROPIC), 54);
	/* 3136 x 1568 scales to 1568 x 784: 1639.2, at most 1600 */
	assert_int_equal(img_tokens(3136, 1568, HISTD_TOKENS_ANTHROPIC), 1600);
	/* 4000 x 400 scales to 1568 x 156: 326.1 */
	assert_int_equal(img_tokens(4000, 400, HISTD_TOKENS_ANTHROPIC), 327);
}

static void
openai_images_are_85_plus_170_per_512_tile_after_scaling(void **state)
{
	(void)state;
	/* OpenAI's documented examples: 1024 x 1024 -> 768 x 768, 4 tiles */
	assert_int_equal(img_tokens(1024, 1024, HISTD_TOKENS_OPENAI), 765);
	/* 2048 x 4096 -> 1024 x 2048 -> 768 x 1536, 6 tiles */
	assert_int_equal(img_tokens(2048, 4096, HISTD_TOKENS_OPENAI), 1105);
	/* small: one tile */
	assert_int_equal(img_tokens(300, 200, HISTD_TOKENS_OPENAI), 255);
}

static void
gemini_images_are_258_per_768_tile_and_258_when_small(void **state)
{
	(void)state;
	assert_int_equal(img_tokens(384, 384, HISTD_TOKENS_GEMINI), 258);
	assert_int_equal(img_tokens(385, 100, HISTD_TOKENS_GEMINI), 258);
	assert_int_equal(img_tokens(1024, 1024, HISTD_TOKENS_GEMINI), 1032);
	assert_int_equal(img_tokens(1920, 1080, HISTD_TOKENS_GEMINI),
			 258 * 3 * 2);
}

static void
mistral_images_are_16px_patches_with_the_long_side_at_most_1024(void **state)
{
	(void)state;
	/* Mistral's documented example: 720 x 512 ~ 1440 */
	assert_int_equal(img_tokens(720, 512, HISTD_TOKENS_MISTRAL), 45 * 32);
	/* 1436 x 962 -> 1024 x 686: 64 x 43 */
	assert_int_equal(img_tokens(1436, 962, HISTD_TOKENS_MISTRAL), 64 * 43);
	assert_int_equal(img_tokens(4096, 4096, HISTD_TOKENS_MISTRAL), 4096);
}

static void
the_default_image_rule_is_the_largest_provider_rule(void **state)
{
	static const uint32_t sizes[][2] = {
		{ 16, 16 }, { 200, 200 }, { 384, 384 }, { 720, 512 },
		{ 1024, 1024 }, { 1920, 1080 }, { 4000, 3000 }, { 8000, 100 },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t w = sizes[i][0], h = sizes[i][1], d, m = 0;

		d = img_tokens(w, h, HISTD_TOKENS_DEFAULT);
		for (int p = HISTD_TOKENS_ANTHROPIC; p <= HISTD_TOKENS_MISTRAL;
		     p++) {
			uint32_t x = img_tokens(w, h, (histd_tokens_provider)p);

			assert_true(d >= x);
			if (x > m)
				m = x;
		}
		assert_int_equal(d, m);
	}
}

static void
url_images_cost_a_1024_square_per_provider_and_the_default_amount(void **state)
{
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;

	(void)state;
	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_URL;
	img.url = "https://example.com/cat.png";
	assert_int_equal(histd_tokens_image(&img, HISTD_TOKENS_DEFAULT),
			 HISTD_TOKENS_IMAGE);
	assert_int_equal(histd_tokens_image(&img, HISTD_TOKENS_ANTHROPIC),
			 1399);
	assert_int_equal(histd_tokens_image(&img, HISTD_TOKENS_OPENAI), 765);
	assert_int_equal(histd_tokens_image(&img, HISTD_TOKENS_GEMINI), 1032);
	assert_int_equal(histd_tokens_image(&img, HISTD_TOKENS_MISTRAL), 4096);
}

/* A minimal PDF text with a page tree of n pages (no xref: the estimator
 * does not need one). */
static char *
pdf_text(int n, int with_count)
{
	size_t cap = 256 + (size_t)n * 64;
	char *s = malloc(cap);
	size_t len;

	assert_non_null(s);
	len = (size_t)snprintf(s, cap, "%%PDF-1.7\n1 0 obj << /Type /Catalog "
			       "/Pages 2 0 R >> endobj\n2 0 obj << /Type "
			       "/Pages ");
	if (with_count)
		len += (size_t)snprintf(s + len, cap - len, "/Count %d ", n);
	len += (size_t)snprintf(s + len, cap - len, ">> endobj\n");
	for (int i = 0; i < n; i++)
		len += (size_t)snprintf(s + len, cap - len, "%d 0 obj << /Type"
					"/Page /Parent 2 0 R >> endobj\n",
					i + 3);
	return s;
}

static void
pdf_pages_come_from_the_page_tree_or_the_page_objects(void **state)
{
	char *a = pdf_text(7, 1), *b = pdf_text(5, 0);

	(void)state;
	assert_int_equal(histd_pdf_pages((uint8_t *)a, strlen(a)), 7);
	assert_int_equal(histd_pdf_pages((uint8_t *)b, strlen(b)), 5);
	assert_int_equal(histd_pdf_pages((const uint8_t *)"%PDF-1.4 junk", 13),
			 0);
	free(a);
	free(b);
}

static void
pdfs_cost_pages_times_the_providers_page_cost(void **state)
{
	Histd__V1__DocumentBlock d = HISTD__V1__DOCUMENT_BLOCK__INIT;
	char *pdf = pdf_text(4, 1);

	(void)state;
	d.source_case = HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA;
	d.data.data = (uint8_t *)pdf;
	d.data.len = strlen(pdf);
	d.media_type = "application/pdf";
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_DEFAULT),
			 4 * HISTD_TOKENS_PDF_PAGE);
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_ANTHROPIC),
			 4 * 3000);
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_OPENAI),
			 4 * 1500);
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_GEMINI),
			 4 * 258);
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_MISTRAL),
			 4 * 1500);
	/* The bytes say PDF even when the media type does not. */
	d.media_type = "application/octet-stream";
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_GEMINI),
			 4 * 258);
	/* Plain text: a quarter of its bytes, for every provider. */
	d.media_type = "text/plain";
	d.data.data = (uint8_t *)"abcdefgh";
	d.data.len = 8;
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_GEMINI), 2);
	assert_int_equal(histd_tokens_document(&d, HISTD_TOKENS_DEFAULT), 2);
	free(pdf);
}

static void
the_stored_estimate_is_the_default_rule_and_text_is_provider_blind(
	void **state)
{
	Histd__V1__ImageBlock img = HISTD__V1__IMAGE_BLOCK__INIT;
	Histd__V1__Message m = HISTD__V1__MESSAGE__INIT;
	Histd__V1__ContentBlock *b;
	uint8_t p[64];

	(void)state;
	img.source_case = HISTD__V1__IMAGE_BLOCK__SOURCE_DATA;
	img.data.data = p;
	img.data.len = png(p, 720, 512);
	img.media_type = "image/png";
	block_ptrs[0] = text_block("abcdefgh");         /* 2 */
	b = new_block();
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE;
	b->image = &img;
	block_ptrs[1] = b;
	m.role = HISTD__V1__ROLE__ROLE_USER;
	m.n_content = 2;
	m.content = block_ptrs;
	assert_int_equal(histd_tokens_message(&m),
			 histd_tokens_message_for(&m, HISTD_TOKENS_DEFAULT));
	assert_int_equal(histd_tokens_message(&m),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 2 + 45 * 32);
	assert_int_equal(histd_tokens_message_for(&m, HISTD_TOKENS_GEMINI),
			 HISTD_TOKENS_MESSAGE_OVERHEAD + 2 + 258);
	m.n_content = 1;
	for (int q = HISTD_TOKENS_DEFAULT; q <= HISTD_TOKENS_MISTRAL; q++)
		assert_int_equal(histd_tokens_message_for(
					 &m, (histd_tokens_provider)q),
				 HISTD_TOKENS_MESSAGE_OVERHEAD + 2);
}

static void
provider_names_parse_and_unknown_ones_do_not(void **state)
{
	histd_tokens_provider p = HISTD_TOKENS_DEFAULT;

	(void)state;
	assert_int_equal(histd_tokens_provider_parse("openai_responses", &p), 0);
	assert_int_equal(p, HISTD_TOKENS_OPENAI);
	assert_int_equal(histd_tokens_provider_parse("google", &p), 0);
	assert_int_equal(p, HISTD_TOKENS_GEMINI);
	assert_int_equal(histd_tokens_provider_parse("claude", &p), -1);
	assert_int_equal(p, HISTD_TOKENS_GEMINI);
	assert_int_equal(histd_tokens_provider_parse(NULL, &p), -1);
}

static void
window_takes_a_provider_option_and_refuses_unknown_ones(void **state)
{
	histd_plugin_opt ok[] = { { "max_tokens", "1000" },
				  { "provider", "gemini" } };
	histd_plugin_opt bad[] = { { "max_tokens", "1000" },
				   { "provider", "claude" } };
	void *st = NULL;
	char err[128] = "";

	(void)state;
	assert_int_equal(histd_plugin_window.configure(ok, 2, &st, err,
						       sizeof(err)), 0);
	histd_plugin_window.release(st);
	st = NULL;
	assert_int_equal(histd_plugin_window.configure(bad, 2, &st, err,
						       sizeof(err)),
			 HISTD_EINVALID);
	assert_null(st);
	assert_non_null(strstr(err, "options.provider"));
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
		cmocka_unit_test_setup(image_of_unknown_size_costs_the_default_amount,
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
		cmocka_unit_test(
			image_size_is_read_from_png_gif_jpeg_and_webp_headers),
		cmocka_unit_test(
			image_size_refuses_unknown_and_cut_short_headers),
		cmocka_unit_test(
			anthropic_images_are_area_over_750_with_the_long_side_capped),
		cmocka_unit_test(
			openai_images_are_85_plus_170_per_512_tile_after_scaling),
		cmocka_unit_test(
			gemini_images_are_258_per_768_tile_and_258_when_small),
		cmocka_unit_test(
			mistral_images_are_16px_patches_with_the_long_side_at_most_1024),
		cmocka_unit_test(the_default_image_rule_is_the_largest_provider_rule),
		cmocka_unit_test(
			url_images_cost_a_1024_square_per_provider_and_the_default_amount),
		cmocka_unit_test(
			pdf_pages_come_from_the_page_tree_or_the_page_objects),
		cmocka_unit_test(pdfs_cost_pages_times_the_providers_page_cost),
		cmocka_unit_test_setup(
			the_stored_estimate_is_the_default_rule_and_text_is_provider_blind,
			reset),
		cmocka_unit_test(provider_names_parse_and_unknown_ones_do_not),
		cmocka_unit_test(
			window_takes_a_provider_option_and_refuses_unknown_ones),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
