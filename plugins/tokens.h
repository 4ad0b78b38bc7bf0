/*
 * The token estimator: one module every room of histd uses (the service
 * at append, the pipeline's budgets, stats), so that every number histd
 * reports comes from the same rules.
 *
 * It is a heuristic, not a tokenizer: it never loads a vocabulary, runs in
 * one pass over the bytes, and errs on the side of counting more.
 *
 * Text (histd_tokens_text) is counted in quarter tokens, then rounded up:
 *   - an ASCII byte                                   1/4 token
 *   - a CJK character (CJK ideographs and their       1 token
 *     extensions, compatibility ideographs, CJK
 *     symbols and punctuation, Hiragana, Katakana,
 *     Hangul, fullwidth and halfwidth forms)
 *   - any other well-formed non-ASCII character       1/2 token
 *     (accented Latin, Cyrillic, Greek, emoji, ...)
 *   - a byte that is not part of well-formed UTF-8    1 token
 *     (tokenizers fall back to one token per byte)
 * The result is at least 1 for non-empty text and 0 for empty text, and
 * saturates at UINT32_MAX. So "abcd" is 1 token, 400 ASCII bytes are 100,
 * and N CJK characters are N tokens. Text counts the same for every
 * provider.
 *
 * A message is HISTD_TOKENS_MESSAGE_OVERHEAD (role and separators) plus
 * the sum over its content blocks:
 *   - text:        the text
 *   - image:       by the provider's rule (below)
 *   - document:    by the provider's rule (below)
 *   - reasoning:   its text plus its summary (signature and encrypted data
 *                  are opaque and not counted)
 *   - tool_call:   its name plus its arguments
 *   - tool_result: its content blocks, counted by these same rules
 * Author, metadata and provider_state are not sent to a model as content
 * and are not counted. The sum saturates at UINT32_MAX.
 *
 * Images. With data, the width and height are read from the header of a
 * PNG, JPEG, GIF or WebP (histd_image_size; the media type is not
 * trusted, the bytes are). Each provider's documented rule, for W x H:
 *   ANTHROPIC  scaled down (aspect kept) until the long side is at most
 *              1568 px, then ceil(W*H / 750), at most 1600
 *   OPENAI     (high detail, what "auto" picks for most images) scaled
 *              down to fit 2048 x 2048, then down until the short side is
 *              at most 768; 85 + 170 per 512 x 512 tile
 *   GEMINI     258 when both sides are at most 384 px; else 258 per
 *              768 x 768 tile
 *   MISTRAL    scaled down until the long side is at most 1024, then one
 *              token per 16 x 16 patch: ceil(W/16) * ceil(H/16)
 *   DEFAULT    the largest of the four: the stored estimate never
 *              undercounts an image for any of these providers
 * An image by URL, or whose header is not one of those formats, costs
 * what a 1024 x 1024 image costs under the provider's rule (ANTHROPIC
 * 1399, OPENAI 765, GEMINI 1032, MISTRAL 4096) and, for DEFAULT,
 * HISTD_TOKENS_IMAGE (the sizes are unknown: a typical figure, not the
 * maximum, so that image links do not swamp a budget).
 *
 * Documents. A PDF with data (media type application/pdf, or bytes that
 * start "%PDF-") costs pages x a per-page cost, the pages read from the
 * file (the largest /Count of its page tree, else the number of /Type
 * /Page objects): ANTHROPIC 3000 (its documented 1,500 to 3,000 per page
 * of text, plus the page image), OPENAI 1500 (a page image at high detail,
 * 765, plus its text), GEMINI 258 (its documented cost per page), MISTRAL
 * 1500, DEFAULT 3000 (the largest). A PDF whose pages cannot be found, and
 * any other document with data, costs its length / 4 rounded up, at least
 * 1. A document by URL (size unknown) costs HISTD_TOKENS_DOCUMENT_URL. A
 * document never costs more than HISTD_TOKENS_DOCUMENT_MAX.
 *
 * histd_tokens_message is the DEFAULT rule: what histd stores at append,
 * keeps in session totals and uses for budgets unless a plugin is told the
 * provider (the window plugin's provider= option). The _for functions give
 * a provider's figure where the provider is known.
 *
 * Every function is pure and thread-safe.
 */
#ifndef HISTD_TOKENS_H
#define HISTD_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#include "histd/v1/histd.pb-c.h"

#define HISTD_TOKENS_MESSAGE_OVERHEAD 4u
#define HISTD_TOKENS_IMAGE 1000u
#define HISTD_TOKENS_DOCUMENT_URL 1500u
#define HISTD_TOKENS_DOCUMENT_MAX 100000u

/* The DEFAULT cost of one PDF page (see above). */
#define HISTD_TOKENS_PDF_PAGE 3000u

typedef enum histd_tokens_provider {
	HISTD_TOKENS_DEFAULT = 0,   /* the stored estimate */
	HISTD_TOKENS_ANTHROPIC = 1,
	HISTD_TOKENS_OPENAI = 2,    /* Chat Completions and Responses */
	HISTD_TOKENS_GEMINI = 3,
	HISTD_TOKENS_MISTRAL = 4,
} histd_tokens_provider;

/* The rules of a provider or format name: "default", "anthropic",
 * "openai", "openai_chat", "openai_responses", "gemini", "google",
 * "mistral". 0, or -1 for an unknown name (*out untouched). */
int histd_tokens_provider_parse(const char *name, histd_tokens_provider *out);

/* The estimate for len bytes of (normally UTF-8) text; s may hold any
 * bytes, including NUL. s may be NULL when len is 0. */
uint32_t histd_tokens_text(const char *s, size_t len);

/* The same count before rounding, in quarter tokens (0 for empty text).
 * Quarters add up: texts joined at ASCII bytes count as the sum of their
 * parts and those bytes, and histd_tokens_text is ceil(quarters / 4), at
 * least 1 for non-empty text. */
uint64_t histd_tokens_text_quarters(const char *s, size_t len);

/* The length of the longest prefix of s[0..len) whose estimate is at most
 * max and that ends between characters (a well-formed UTF-8 sequence is
 * never split; a byte that is not part of one is a character of its own):
 * what a text cut to max tokens keeps. len when the whole text fits; 0
 * when max is 0. */
size_t histd_tokens_text_fit(const char *s, size_t len, uint64_t max);

/* The estimate for a whole message, by the rules above. Only the content
 * is read: seq and token_estimate are ignored. m must not be NULL. */
uint32_t histd_tokens_message(const Histd__V1__Message *m);

/* The estimate for content blocks alone (no message overhead), by the
 * same rules: what a tool result's content costs. */
uint32_t histd_tokens_blocks(Histd__V1__ContentBlock *const *blocks, size_t n);

/* The same, by a provider's rules (DEFAULT: histd_tokens_message). */
uint32_t histd_tokens_message_for(const Histd__V1__Message *m,
				  histd_tokens_provider p);
uint32_t histd_tokens_blocks_for(Histd__V1__ContentBlock *const *blocks,
				 size_t n, histd_tokens_provider p);

/* One image's or document's cost by a provider's rules. */
uint32_t histd_tokens_image(const Histd__V1__ImageBlock *img,
			    histd_tokens_provider p);
uint32_t histd_tokens_document(const Histd__V1__DocumentBlock *d,
			       histd_tokens_provider p);

/* Width and height in pixels from the header of a PNG, JPEG, GIF or WebP
 * (VP8, VP8L, VP8X); 0, or -1 when the bytes are none of these or are cut
 * short. Reads only the header (a JPEG up to its frame marker). */
int histd_image_size(const uint8_t *data, size_t len, uint32_t *w,
		     uint32_t *h);

/* Pages of a PDF, read as the documentation above says; 0 if none found. */
uint32_t histd_pdf_pages(const uint8_t *data, size_t len);

#endif
