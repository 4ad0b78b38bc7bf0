/*
 * The token estimator: one module every room of histd uses (the service
 * at append, the pipeline's budgets, stats), so that every number histd
 * reports comes from the same rule.
 *
 * It is a heuristic, not a tokenizer: it never loads a vocabulary, runs in
 * one pass over the bytes, and errs on the side of counting more. Per
 * provider rules (a real tokenizer, image tile formulas) may refine it
 * later behind the same two functions; until then these numbers are what
 * every budget is measured in.
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
 * and N CJK characters are N tokens.
 *
 * A message (histd_tokens_message) is HISTD_TOKENS_MESSAGE_OVERHEAD (role
 * and separators) plus the sum over its content blocks:
 *   - text:        the text
 *   - image:       HISTD_TOKENS_IMAGE, whatever its size or source
 *   - document:    with data: its length / 4 rounded up, at least 1 and at
 *                  most HISTD_TOKENS_DOCUMENT_MAX; by url (size unknown):
 *                  HISTD_TOKENS_DOCUMENT_URL
 *   - reasoning:   its text plus its summary (signature and encrypted data
 *                  are opaque and not counted)
 *   - tool_call:   its name plus its arguments
 *   - tool_result: its content blocks, counted by these same rules
 * Author, metadata and provider_state are not sent to a model as content
 * and are not counted. The sum saturates at UINT32_MAX.
 *
 * Both functions are pure and thread-safe.
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

/* The estimate for len bytes of (normally UTF-8) text; s may hold any
 * bytes, including NUL. s may be NULL when len is 0. */
uint32_t histd_tokens_text(const char *s, size_t len);

/* The estimate for a whole message, by the rules above. Only the content
 * is read: seq and token_estimate are ignored. m must not be NULL. */
uint32_t histd_tokens_message(const Histd__V1__Message *m);

/* The estimate for content blocks alone (no message overhead), by the
 * same rules: what a tool result's content costs. */
uint32_t histd_tokens_blocks(Histd__V1__ContentBlock *const *blocks, size_t n);

#endif
