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

uint64_t
histd_tokens_text_quarters(const char *s, size_t len)
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
	return q;
}

uint32_t
histd_tokens_text(const char *s, size_t len)
{
	return quarters_to_tokens(histd_tokens_text_quarters(s, len), len);
}

size_t
histd_tokens_text_fit(const char *s, size_t len, uint64_t max)
{
	const unsigned char *p = (const unsigned char *)s;
	uint64_t q = 0, cap = max > UINT64_MAX / 4 ? UINT64_MAX : max * 4;
	size_t i = 0;

	while (i < len) {
		uint32_t cp, add;
		size_t n = 1;

		if (p[i] < 0x80) {
			add = Q_ASCII;
		} else if ((n = utf8_decode(p + i, len - i, &cp)) == 0) {
			add = Q_INVALID;
			n = 1;
		} else {
			add = is_cjk(cp) ? Q_CJK : Q_OTHER;
		}
		/* ceil(q / 4) <= max  <=>  q <= 4 * max */
		if (q + add > cap)
			break;
		q += add;
		i += n;
	}
	return i;
}

static uint64_t
str_tokens(const char *s)
{
	return s ? histd_tokens_text(s, strlen(s)) : 0;
}

/* ---------------------------------------------------------------------- */
/* Image headers                                                          */

static uint32_t
be16(const uint8_t *p)
{
	return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t
be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

static uint32_t
le16(const uint8_t *p)
{
	return (uint32_t)p[1] << 8 | p[0];
}

static uint32_t
le24(const uint8_t *p)
{
	return (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* JPEG: walk the segments to the first start-of-frame marker (C0..CF but
 * C4 DHT, C8 JPG, CC DAC), whose payload holds height then width. */
static int
jpeg_size(const uint8_t *d, size_t len, uint32_t *w, uint32_t *h)
{
	size_t i = 2;

	while (i + 4 <= len) {
		uint8_t mk;

		if (d[i] != 0xff)
			return -1;
		mk = d[i + 1];
		if (mk == 0xff) {           /* fill byte */
			i++;
			continue;
		}
		if (mk == 0xd8 || mk == 0x01 || (mk >= 0xd0 && mk <= 0xd7)) {
			i += 2;             /* no length */
			continue;
		}
		if (mk == 0xd9 || mk == 0xda)
			return -1;          /* end or scan before a frame */
		if (mk >= 0xc0 && mk <= 0xcf && mk != 0xc4 && mk != 0xc8 &&
		    mk != 0xcc) {
			if (i + 9 > len)
				return -1;
			*h = be16(d + i + 5);
			*w = be16(d + i + 7);
			return 0;
		}
		if (be16(d + i + 2) < 2)
			return -1;
		i += 2 + be16(d + i + 2);
	}
	return -1;
}

int
histd_image_size(const uint8_t *d, size_t len, uint32_t *w, uint32_t *h)
{
	uint32_t x = 0, y = 0;

	if (!d)
		return -1;
	if (len >= 24 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8) &&
	    !memcmp(d + 12, "IHDR", 4)) {
		x = be32(d + 16);
		y = be32(d + 20);
	} else if (len >= 10 && (!memcmp(d, "GIF87a", 6) ||
				 !memcmp(d, "GIF89a", 6))) {
		x = le16(d + 6);
		y = le16(d + 8);
	} else if (len >= 4 && d[0] == 0xff && d[1] == 0xd8 && d[2] == 0xff) {
		if (jpeg_size(d, len, &x, &y))
			return -1;
	} else if (len >= 30 && !memcmp(d, "RIFF", 4) &&
		   !memcmp(d + 8, "WEBP", 4)) {
		if (!memcmp(d + 12, "VP8 ", 4) && d[23] == 0x9d &&
		    d[24] == 0x01 && d[25] == 0x2a) {
			x = le16(d + 26) & 0x3fff;
			y = le16(d + 28) & 0x3fff;
		} else if (!memcmp(d + 12, "VP8L", 4) && d[20] == 0x2f) {
			uint32_t b = (uint32_t)d[21] | (uint32_t)d[22] << 8 |
				     (uint32_t)d[23] << 16 |
				     (uint32_t)d[24] << 24;

			x = (b & 0x3fff) + 1;
			y = ((b >> 14) & 0x3fff) + 1;
		} else if (!memcmp(d + 12, "VP8X", 4)) {
			x = le24(d + 24) + 1;
			y = le24(d + 27) + 1;
		} else {
			return -1;
		}
	} else {
		return -1;
	}
	if (x == 0 || y == 0)
		return -1;
	*w = x;
	*h = y;
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Image and document rules (tokens.h)                                    */

static uint64_t
ceil_div(uint64_t a, uint64_t b)
{
	return (a + b - 1) / b;
}

/* Scales w x h down (aspect kept, never up) so that its long side is at
 * most max_long. */
static void
fit_long(uint64_t *w, uint64_t *h, uint64_t max_long)
{
	uint64_t l = *w > *h ? *w : *h;

	if (l <= max_long)
		return;
	*w = *w * max_long / l;
	*h = *h * max_long / l;
	if (*w == 0)
		*w = 1;
	if (*h == 0)
		*h = 1;
}

static uint64_t
image_rule(histd_tokens_provider p, uint64_t w, uint64_t h)
{
	uint64_t t, s;

	switch (p) {
	case HISTD_TOKENS_ANTHROPIC:
		fit_long(&w, &h, 1568);
		t = ceil_div(w * h, 750);
		return t > 1600 ? 1600 : t;
	case HISTD_TOKENS_OPENAI:
		fit_long(&w, &h, 2048);
		s = w < h ? w : h;
		if (s > 768) {
			w = w * 768 / s;
			h = h * 768 / s;
		}
		return 85 + 170 * ceil_div(w, 512) * ceil_div(h, 512);
	case HISTD_TOKENS_GEMINI:
		if (w <= 384 && h <= 384)
			return 258;
		return 258 * ceil_div(w, 768) * ceil_div(h, 768);
	case HISTD_TOKENS_MISTRAL:
		fit_long(&w, &h, 1024);
		return ceil_div(w, 16) * ceil_div(h, 16);
	case HISTD_TOKENS_DEFAULT:
	default: {
		uint64_t m = 0;

		for (int q = HISTD_TOKENS_ANTHROPIC;
		     q <= HISTD_TOKENS_MISTRAL; q++) {
			t = image_rule((histd_tokens_provider)q, w, h);
			if (t > m)
				m = t;
		}
		return m;
	}
	}
}

uint32_t
histd_tokens_image(const Histd__V1__ImageBlock *img, histd_tokens_provider p)
{
	uint32_t w, h;

	if (img->source_case == HISTD__V1__IMAGE_BLOCK__SOURCE_DATA &&
	    histd_image_size(img->data.data, img->data.len, &w, &h) == 0) {
		uint64_t t = image_rule(p, w, h);

		return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
	}
	/* Size unknown. */
	if (p == HISTD_TOKENS_DEFAULT)
		return HISTD_TOKENS_IMAGE;
	return (uint32_t)image_rule(p, 1024, 1024);
}

/* Finds needle in d[from..len); returns its offset or len. */
static size_t
find(const uint8_t *d, size_t len, size_t from, const char *needle)
{
	size_t n = strlen(needle);

	for (size_t i = from; i + n <= len; i++) {
		const uint8_t *q = memchr(d + i, needle[0], len - i);

		if (!q)
			return len;
		i = (size_t)(q - d);
		if (i + n > len)
			return len;
		if (!memcmp(q, needle, n))
			return i;
	}
	return len;
}

static int
pdf_space(uint8_t c)
{
	return c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\f' ||
	       c == 0;
}

uint32_t
histd_pdf_pages(const uint8_t *d, size_t len)
{
	uint64_t count = 0, objects = 0;
	size_t i;

	if (!d)
		return 0;
	/* The page tree's root holds /Count <all pages>; other /Count keys
	 * (outlines, intermediate nodes) are smaller or negative. */
	for (i = find(d, len, 0, "/Count"); i < len;
	     i = find(d, len, i + 1, "/Count")) {
		size_t j = i + 6;
		uint64_t v = 0;
		int digits = 0;

		while (j < len && pdf_space(d[j]))
			j++;
		while (j < len && d[j] >= '0' && d[j] <= '9' && digits < 9) {
			v = v * 10 + (uint64_t)(d[j++] - '0');
			digits++;
		}
		if (digits && v > count)
			count = v;
	}
	if (count)
		return count > UINT32_MAX ? UINT32_MAX : (uint32_t)count;
	/* No readable page tree (compressed object streams hide it): count
	 * the page objects that are visible. */
	for (i = find(d, len, 0, "/Type"); i < len;
	     i = find(d, len, i + 1, "/Type")) {
		size_t j = i + 5;

		while (j < len && pdf_space(d[j]))
			j++;
		if (j + 5 <= len && !memcmp(d + j, "/Page", 5) &&
		    (j + 5 == len || d[j + 5] != 's'))
			objects++;
	}
	return objects > UINT32_MAX ? UINT32_MAX : (uint32_t)objects;
}

static uint64_t
pdf_page_cost(histd_tokens_provider p)
{
	switch (p) {
	case HISTD_TOKENS_ANTHROPIC: return 3000;
	case HISTD_TOKENS_OPENAI: return 1500;
	case HISTD_TOKENS_GEMINI: return 258;
	case HISTD_TOKENS_MISTRAL: return 1500;
	default: return HISTD_TOKENS_PDF_PAGE;
	}
}

static int
is_pdf(const Histd__V1__DocumentBlock *d)
{
	return (d->media_type && !strcmp(d->media_type, "application/pdf")) ||
	       (d->data.len >= 5 && !memcmp(d->data.data, "%PDF-", 5));
}

uint32_t
histd_tokens_document(const Histd__V1__DocumentBlock *d,
		      histd_tokens_provider p)
{
	uint64_t t = 0;

	if (d->source_case != HISTD__V1__DOCUMENT_BLOCK__SOURCE_DATA)
		return HISTD_TOKENS_DOCUMENT_URL;
	if (is_pdf(d))
		t = (uint64_t)histd_pdf_pages(d->data.data, d->data.len) *
		    pdf_page_cost(p);
	if (t == 0)
		t = ((uint64_t)d->data.len + 3) / 4;
	if (t == 0)
		t = 1;
	return t > HISTD_TOKENS_DOCUMENT_MAX ? HISTD_TOKENS_DOCUMENT_MAX
					     : (uint32_t)t;
}

int
histd_tokens_provider_parse(const char *name, histd_tokens_provider *out)
{
	static const struct {
		const char *name;
		histd_tokens_provider p;
	} names[] = {
		{ "default", HISTD_TOKENS_DEFAULT },
		{ "anthropic", HISTD_TOKENS_ANTHROPIC },
		{ "openai", HISTD_TOKENS_OPENAI },
		{ "openai_chat", HISTD_TOKENS_OPENAI },
		{ "openai_responses", HISTD_TOKENS_OPENAI },
		{ "gemini", HISTD_TOKENS_GEMINI },
		{ "google", HISTD_TOKENS_GEMINI },
		{ "mistral", HISTD_TOKENS_MISTRAL },
	};

	for (size_t i = 0; name && i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(name, names[i].name)) {
			*out = names[i].p;
			return 0;
		}
	return -1;
}

static uint64_t
blocks_tokens(Histd__V1__ContentBlock *const *blocks, size_t n,
	      histd_tokens_provider p)
{
	uint64_t t = 0;

	for (size_t i = 0; i < n; i++) {
		const Histd__V1__ContentBlock *b = blocks[i];

		switch (b->block_case) {
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
			t += str_tokens(b->text->text);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
			t += histd_tokens_image(b->image, p);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
			t += histd_tokens_document(b->document, p);
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
					   b->tool_result->n_content, p);
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
histd_tokens_message_for(const Histd__V1__Message *m, histd_tokens_provider p)
{
	uint64_t t = HISTD_TOKENS_MESSAGE_OVERHEAD +
		     blocks_tokens(m->content, m->n_content, p);

	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

uint32_t
histd_tokens_blocks_for(Histd__V1__ContentBlock *const *blocks, size_t n,
			histd_tokens_provider p)
{
	uint64_t t = blocks_tokens(blocks, n, p);

	return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

uint32_t
histd_tokens_message(const Histd__V1__Message *m)
{
	return histd_tokens_message_for(m, HISTD_TOKENS_DEFAULT);
}

uint32_t
histd_tokens_blocks(Histd__V1__ContentBlock *const *blocks, size_t n)
{
	return histd_tokens_blocks_for(blocks, n, HISTD_TOKENS_DEFAULT);
}
