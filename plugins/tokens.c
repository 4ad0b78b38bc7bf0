#include "tokens.h"

#include <string.h>

/* Quarter tokens per unit of text (see tokens.h). */
#define Q_ASCII 1u
#define Q_CJK 4u
#define Q_OTHER 2u
#define Q_INVALID 4u

/*
 * Decodes one well-formed UTF-8 sequence (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF) at p. Returns its length and sets
 * *cp, or 0 when p does not start one.
 */
static size_t
utf8_decode(const unsigned char *p, size_t avail, uint32_t *cp)
{
	unsigned char c = p[0];
	unsigned char lo = 0x80, hi = 0xbf;
	size_t n;
	uint32_t v;

	if (c >= 0xc2 && c <= 0xdf) {
		n = 2;
		v = c & 0x1f;
	} else if (c >= 0xe0 && c <= 0xef) {
		n = 3;
		v = c & 0x0f;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		n = 4;
		v = c & 0x07;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	} else {
		return 0;
	}
	if (avail < n || p[1] < lo || p[1] > hi)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if (i > 1 && (p[i] & 0xc0) != 0x80)
			return 0;
		v = (v << 6) | (p[i] & 0x3f);
	}
	*cp = v;
	return n;
}

/* The scripts a tokenizer spends about one token per character on. */
static int
is_cjk(uint32_t cp)
{
	return (cp >= 0x1100 && cp <= 0x11ff) ||   /* Hangul Jamo */
	       (cp >= 0x2e80 && cp <= 0x2fdf) ||   /* CJK radicals */
	       (cp >= 0x3000 && cp <= 0x303f) ||   /* CJK symbols, punctuation */
	       (cp >= 0x3040 && cp <= 0x30ff) ||   /* Hiragana, Katakana */
	       (cp >= 0x3100 && cp <= 0x31ff) ||   /* Bopomofo, Kanbun, ... */
	       (cp >= 0x3400 && cp <= 0x4dbf) ||   /* CJK extension A */
	       (cp >= 0x4e00 && cp <= 0x9fff) ||   /* CJK unified ideographs */
	       (cp >= 0xac00 && cp <= 0xd7af) ||   /* Hangul syllables */
	       (cp >= 0xf900 && cp <= 0xfaff) ||   /* CJK compatibility */
	       (cp >= 0xff00 && cp <= 0xffef) ||   /* full/halfwidth forms */
	       (cp >= 0x20000 && cp <= 0x3ffff);   /* CJK extensions B.. */
}

static uint32_t
quarters_to_tokens(uint64_t q, size_t len)
{
	uint64_t t = (q + 3) / 4;

	if (t == 0 && len > 0)
		t = 1;
	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

uint32_t
histd_tokens_text(const char *s, size_t len)
{
	const unsigned char *p = (const unsigned char *)s;
	uint64_t q = 0;
	size_t i = 0;

	while (i < len) {
		uint32_t cp;
		size_t n;

		/* Most text is ASCII: take it eight bytes at a time. */
		while (len - i >= 8) {
			uint64_t w;

			memcpy(&w, p + i, 8);
			if (w & UINT64_C(0x8080808080808080))
				break;
			q += 8 * Q_ASCII;
			i += 8;
		}
		if (i == len)
			break;
		if (p[i] < 0x80) {
			q += Q_ASCII;
			i++;
			continue;
		}
		n = utf8_decode(p + i, len - i, &cp);
		if (n == 0) {
			q += Q_INVALID;
			i++;
			continue;
		}
		q += is_cjk(cp) ? Q_CJK : Q_OTHER;
		i += n;
	}
	return quarters_to_tokens(q, len);
}

static uint64_t
str_tokens(const char *s)
{
	return s ? histd_tokens_text(s, strlen(s)) : 0;
}

static uint64_t
document_tokens(const Histd__V1__DocumentBlock *d)
{
	uint64_t t;

	if (d->source_case != HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA)
		return HISTD_TOKENS_DOCUMENT_URL;
	t = ((uint64_t)d->data.len + 3) / 4;
	if (t == 0)
		t = 1;
	return t > HISTD_TOKENS_DOCUMENT_MAX ? HISTD_TOKENS_DOCUMENT_MAX : t;
}

static uint64_t
blocks_tokens(Histd__V1__ContentBlock *const *blocks, size_t n)
{
	uint64_t t = 0;

	for (size_t i = 0; i < n; i++) {
		const Histd__V1__ContentBlock *b = blocks[i];

		switch (b->block_case) {
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
			t += str_tokens(b->text->text);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
			t += HISTD_TOKENS_IMAGE;
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
			t += document_tokens(b->document);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
			t += str_tokens(b->reasoning->text);
			t += str_tokens(b->reasoning->summary);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
			t += str_tokens(b->tool_call->name);
			t += str_tokens(b->tool_call->arguments);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
			t += blocks_tokens(b->tool_result->content,
					   b->tool_result->n_content);
			break;
		default:
			break;
		}
		/* Each term is at most UINT32_MAX; stop adding once the
		 * answer is saturated anyway. */
		if (t >= UINT32_MAX)
			return UINT32_MAX;
	}
	return t;
}

uint32_t
histd_tokens_message(const Histd__V1__Message *m)
{
	uint64_t t = HISTD_TOKENS_MESSAGE_OVERHEAD +
		     blocks_tokens(m->content, m->n_content);

	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

uint32_t
histd_tokens_blocks(Histd__V1__ContentBlock *const *blocks, size_t n)
{
	uint64_t t = blocks_tokens(blocks, n);

	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}
