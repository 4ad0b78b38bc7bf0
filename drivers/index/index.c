/*
 * The in-process full-text index (see index.h): tokens, the text of a
 * packed Message, BM25 postings, and the embedding vectors of the
 * in-process drivers.
 */
#include "index.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <wctype.h>

#define BM25_K1 1.2
#define BM25_B 0.75
#define QUERY_TERMS_MAX 32
/* Rewrite the postings once the dead outnumber the live, and at least this
 * many are dead (a small index is cheap to carry). */
#define COMPACT_MIN_DEAD 1024

static int
enomem(void)
{
	return histd_error_set(HISTD_ENOMEM, "out of memory");
}

/* ---------------------------------------------------------------------- */
/* Tokens                                                                  */

/* Decodes one UTF-8 code point at p (n bytes left); returns its length, or
 * 1 with *cp = 0xFFFD for a malformed byte. */
static size_t
utf8_next(const unsigned char *p, size_t n, uint32_t *cp)
{
	uint32_t c = p[0];
	size_t len, i;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xC2 && c <= 0xDF) {
		len = 2;
		c &= 0x1F;
	} else if (c >= 0xE0 && c <= 0xEF) {
		len = 3;
		c &= 0x0F;
	} else if (c >= 0xF0 && c <= 0xF4) {
		len = 4;
		c &= 0x07;
	} else {
		*cp = 0xFFFD;
		return 1;
	}
	if (len > n) {
		*cp = 0xFFFD;
		return 1;
	}
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xC0) != 0x80) {
			*cp = 0xFFFD;
			return 1;
		}
		c = (c << 6) | (p[i] & 0x3F);
	}
	/* Overlong forms and surrogates are not letters either. */
	if ((len == 3 && c < 0x800) || (len == 4 && (c < 0x10000 || c > 0x10FFFF)) ||
	    (c >= 0xD800 && c <= 0xDFFF)) {
		*cp = 0xFFFD;
		return 1;
	}
	*cp = c;
	return len;
}

/* Unicode's letters, digits and combining marks, as glibc's built-in
 * C.UTF-8 locale classes them (whatever locale the process runs in). */
static locale_t utf8_ctype;
static wctype_t combining;
static pthread_once_t utf8_once = PTHREAD_ONCE_INIT;

static void
utf8_ctype_open(void)
{
	utf8_ctype = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
	if (utf8_ctype)
		combining = wctype_l("combining", utf8_ctype);
}

/* A letter or digit of any script, or a combining mark (an accent, a
 * vowel sign, a virama: part of its word); not punctuation, symbols
 * (currency, arrows, mathematical signs), emoji or spaces. */
static int
is_word(uint32_t c)
{
	if (c < 0x80)
		return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
		       (c >= 'A' && c <= 'Z');
	/* Marks that go with symbols and emoji, not letters: variation
	 * selectors, the combining marks for symbols (a keycap). */
	if (c == 0xFFFD || c == 0xFEFF || (c >= 0xFE00 && c <= 0xFE0F) ||
	    (c >= 0xE0100 && c <= 0xE01EF) || (c >= 0x20D0 && c <= 0x20FF))
		return 0;
	pthread_once(&utf8_once, utf8_ctype_open);
	if (utf8_ctype)
		return iswalnum_l((wint_t)c, utf8_ctype) ||
		       (combining && iswctype_l((wint_t)c, combining, utf8_ctype));
	/* No C.UTF-8 (a libc without it): everything past Latin-1's
	 * symbols but the punctuation and symbol blocks. */
	if (c <= 0xBF || c == 0xD7 || c == 0xF7)
		return 0;
	return !((c >= 0x2000 && c <= 0x2BFF) || (c >= 0x3000 && c <= 0x303F) ||
		 (c >= 0xFF01 && c <= 0xFF0F) || (c >= 0x1F000 && c <= 0x1FAFF));
}

static uint32_t
lower(uint32_t c)
{
	if (c >= 'A' && c <= 'Z')
		return c + 32;
	if (c < 0xC0)
		return c;
	if (c <= 0xDE && c != 0xD7)
		return c + 0x20;
	if (c >= 0x391 && c <= 0x3AB && c != 0x3A2)
		return c + 0x20;            /* also Ϊ Ϋ */
	/* Greek capitals with tonos, and final sigma as sigma: a word
	 * written in capitals ("ΣΊΣΥΦΟΣ") is the word in small letters
	 * ("σίσυφος"). */
	if (c == 0x386)
		return 0x3AC;
	if (c >= 0x388 && c <= 0x38A)
		return c + 0x25;
	if (c == 0x38C)
		return 0x3CC;
	if (c == 0x38E || c == 0x38F)
		return c + 0x3F;
	if (c == 0x3C2)
		return 0x3C3;
	if (c >= 0x410 && c <= 0x42F)
		return c + 0x20;
	if (c >= 0x400 && c <= 0x40F)
		return c + 0x50;
	return c;
}

static size_t
utf8_put(char *out, uint32_t c)
{
	if (c < 0x80) {
		out[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		out[0] = (char)(0xC0 | (c >> 6));
		out[1] = (char)(0x80 | (c & 0x3F));
		return 2;
	}
	if (c < 0x10000) {
		out[0] = (char)(0xE0 | (c >> 12));
		out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
		out[2] = (char)(0x80 | (c & 0x3F));
		return 3;
	}
	out[0] = (char)(0xF0 | (c >> 18));
	out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
	out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
	out[3] = (char)(0x80 | (c & 0x3F));
	return 4;
}

void
histd_index_tokens(const char *text, size_t len,
		   void (*fn)(void *ctx, const char *tok, size_t len),
		   void *ctx)
{
	const unsigned char *p = (const unsigned char *)text;
	char tok[HISTD_INDEX_TOKEN_MAX + 4];
	size_t i = 0, tl = 0;
	int in = 0;

	while (i < len) {
		uint32_t c;

		/* ASCII fast path: most text is. */
		if (p[i] < 0x80) {
			c = p[i++];
		} else {
			i += utf8_next(p + i, len - i, &c);
		}
		if (is_word(c)) {
			char enc[4];
			size_t el = utf8_put(enc, lower(c));

			in = 1;
			/* Cut at the limit, on a code point boundary. */
			if (tl + el <= HISTD_INDEX_TOKEN_MAX) {
				memcpy(tok + tl, enc, el);
				tl += el;
			}
			continue;
		}
		if (in) {
			tok[tl] = '\0';
			fn(ctx, tok, tl);
			tl = 0;
			in = 0;
		}
	}
	if (in) {
		tok[tl] = '\0';
		fn(ctx, tok, tl);
	}
}

/* ---------------------------------------------------------------------- */
/* The text of a packed Message                                            */

typedef struct wire {
	const uint8_t *p, *end;
} wire;

static int
wire_varint(wire *w, uint64_t *v)
{
	uint64_t x = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		uint8_t b;

		if (w->p >= w->end)
			return -1;
		b = *w->p++;
		x |= (uint64_t)(b & 0x7F) << shift;
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -1;
}

/* The next field: its number and wire type; for LEN fields, the bytes. */
static int
wire_field(wire *w, uint32_t *field, const uint8_t **data, size_t *len,
	   uint64_t *varint)
{
	uint64_t key, v;

	if (wire_varint(w, &key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX)
		return -1;
	*field = (uint32_t)(key >> 3);
	*data = NULL;
	*len = 0;
	switch (key & 7) {
	case 0:
		return wire_varint(w, varint);
	case 1:
		if (w->end - w->p < 8)
			return -1;
		w->p += 8;
		return 0;
	case 2:
		if (wire_varint(w, &v) || v > (uint64_t)(w->end - w->p))
			return -1;
		*data = w->p;
		*len = (size_t)v;
		w->p += v;
		return 0;
	case 5:
		if (w->end - w->p < 4)
			return -1;
		w->p += 4;
		return 0;
	}
	return -1;
}

typedef void (*text_fn)(void *ctx, const char *text, size_t len, int is_tool);

/* The string fields `want` (a bit per field number) of a message. */
static int
strings_of(const uint8_t *p, size_t n, uint32_t want, int is_tool, text_fn fn,
	   void *ctx)
{
	wire w = { p, p + n };

	while (w.p < w.end) {
		const uint8_t *d;
		size_t len;
		uint32_t f;
		uint64_t v;

		if (wire_field(&w, &f, &d, &len, &v))
			return -1;
		if (d && f < 32 && (want & (1u << f)) && len)
			fn(ctx, (const char *)d, len, is_tool);
	}
	return 0;
}

/* A ContentBlock: text (1), reasoning (4: text 1, summary 2), tool_call
 * (5: name 2, arguments 3), tool_result (6: content 3, text blocks only,
 * as tool text). depth 1: inside a tool result. */
static int
block_text(const uint8_t *p, size_t n, int depth, text_fn fn, void *ctx)
{
	wire w = { p, p + n };

	while (w.p < w.end) {
		const uint8_t *d;
		size_t len;
		uint32_t f;
		uint64_t v;
		int rc = 0;

		if (wire_field(&w, &f, &d, &len, &v))
			return -1;
		if (!d)
			continue;
		if (f == 1)
			rc = strings_of(d, len, 1u << 1, depth > 0, fn, ctx);
		else if (depth == 0 && f == 4)
			rc = strings_of(d, len, (1u << 1) | (1u << 2), 0, fn, ctx);
		else if (depth == 0 && f == 5)
			rc = strings_of(d, len, (1u << 2) | (1u << 3), 0, fn, ctx);
		else if (depth == 0 && f == 6) {
			wire r = { d, d + len };

			while (r.p < r.end && rc == 0) {
				const uint8_t *bd;
				size_t bl;
				uint32_t bf;

				if (wire_field(&r, &bf, &bd, &bl, &v))
					return -1;
				if (bf == 3 && bd)
					rc = block_text(bd, bl, 1, fn, ctx);
			}
		}
		if (rc)
			return rc;
	}
	return 0;
}

int
histd_index_message_text(const uint8_t *data, size_t len, uint32_t *role,
			 text_fn fn, void *ctx)
{
	wire w = { data, data + len };

	*role = 0;
	while (w.p < w.end) {
		const uint8_t *d;
		size_t n;
		uint32_t f;
		uint64_t v = 0;

		if (wire_field(&w, &f, &d, &n, &v))
			return -1;
		if (f == 2 && !d)
			*role = v > 31 ? 0 : (uint32_t)v;
		else if (f == 3 && d && block_text(d, n, 0, fn, ctx))
			return -1;
	}
	return 0;
}

uint32_t
histd_index_message_role(const uint8_t *data, size_t len)
{
	wire w = { data, data + len };

	while (w.p < w.end) {
		const uint8_t *d;
		size_t n;
		uint32_t f;
		uint64_t v = 0;

		if (wire_field(&w, &f, &d, &n, &v))
			return 0;
		if (f == 2 && !d)
			return v > 31 ? 0 : (uint32_t)v;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* The index                                                               */

typedef struct ix_term {
	uint32_t len;
	uint32_t last;          /* last document + 1 (deltas start from 0) */
	uint8_t *post;
	uint32_t post_len, post_cap;
	char text[];
} ix_term;

typedef struct tslot {
	uint64_t h;
	ix_term *t;             /* NULL: empty */
} tslot;

typedef struct ix_doc {
	uint64_t seq;
	uint32_t sess;
	uint32_t len_main, len_tool;
	uint8_t role;
	uint8_t dead;
} ix_doc;

typedef struct ix_sess {
	uint64_t key;
	char *id;               /* NULL: forgotten */
	uint64_t synced;        /* the last seq indexed */
	uint64_t newest;        /* the newest stored seq; 0: none */
	uint32_t *docs;
	uint32_t n_docs, cap_docs;
} ix_sess;

typedef struct kslot {
	uint64_t key;
	uint32_t sess_plus1;    /* 0: empty */
} kslot;

struct histd_index {
	pthread_rwlock_t lock;
	tslot *terms;
	size_t tmask, n_terms;
	size_t term_bytes;
	ix_doc *docs;
	uint32_t n_docs, cap_docs, n_dead;
	ix_sess *sess;
	uint32_t n_sess, cap_sess;
	kslot *keys;
	size_t kmask, n_keys;
	/* Over live documents: how many have main text, any text, and the
	 * sums of their lengths (BM25's N and average length). */
	uint64_t n_main, n_all, sum_main, sum_all;
	int incomplete;
};

static uint64_t
hash_str(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n; i++) {
		h ^= (uint8_t)s[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 32;
	return h;
}

static uint64_t
hash_u64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ULL;
	x ^= x >> 33;
	return x;
}

int
histd_index_new(histd_index **out)
{
	histd_index *ix = calloc(1, sizeof(*ix));

	if (!ix)
		return enomem();
	if (pthread_rwlock_init(&ix->lock, NULL) != 0) {
		free(ix);
		return enomem();
	}
	*out = ix;
	return 0;
}

static void
drop_all(histd_index *ix)
{
	for (size_t i = 0; ix->terms && i <= ix->tmask; i++)
		if (ix->terms[i].t) {
			free(ix->terms[i].t->post);
			free(ix->terms[i].t);
		}
	free(ix->terms);
	for (uint32_t i = 0; i < ix->n_sess; i++) {
		free(ix->sess[i].id);
		free(ix->sess[i].docs);
	}
	free(ix->sess);
	free(ix->docs);
	free(ix->keys);
	ix->terms = NULL;
	ix->tmask = ix->n_terms = ix->term_bytes = 0;
	ix->docs = NULL;
	ix->n_docs = ix->cap_docs = ix->n_dead = 0;
	ix->sess = NULL;
	ix->n_sess = ix->cap_sess = 0;
	ix->keys = NULL;
	ix->kmask = ix->n_keys = 0;
	ix->n_main = ix->n_all = ix->sum_main = ix->sum_all = 0;
	ix->incomplete = 0;
}

void
histd_index_free(histd_index *ix)
{
	if (!ix)
		return;
	drop_all(ix);
	pthread_rwlock_destroy(&ix->lock);
	free(ix);
}

void
histd_index_reset(histd_index *ix)
{
	pthread_rwlock_wrlock(&ix->lock);
	drop_all(ix);
	pthread_rwlock_unlock(&ix->lock);
}

int
histd_index_incomplete(histd_index *ix)
{
	int v;

	pthread_rwlock_rdlock(&ix->lock);
	v = ix->incomplete;
	pthread_rwlock_unlock(&ix->lock);
	return v;
}

size_t
histd_index_bytes(histd_index *ix)
{
	size_t b;

	pthread_rwlock_rdlock(&ix->lock);
	b = sizeof(*ix) + ix->term_bytes +
	    (ix->tmask + (ix->terms ? 1 : 0)) * sizeof(tslot) +
	    ix->cap_docs * sizeof(ix_doc) + ix->cap_sess * sizeof(ix_sess) +
	    (ix->kmask + (ix->keys ? 1 : 0)) * sizeof(kslot);
	for (uint32_t i = 0; i < ix->n_sess; i++)
		b += ix->sess[i].cap_docs * sizeof(uint32_t) +
		     (ix->sess[i].id ? strlen(ix->sess[i].id) + 1 : 0);
	pthread_rwlock_unlock(&ix->lock);
	return b;
}

/* --- sessions by key --- */

static ix_sess *
sess_find(histd_index *ix, uint64_t key)
{
	if (!ix->n_keys)
		return NULL;
	for (size_t i = hash_u64(key) & ix->kmask;; i = (i + 1) & ix->kmask) {
		if (!ix->keys[i].sess_plus1)
			return NULL;
		if (ix->keys[i].key == key)
			return &ix->sess[ix->keys[i].sess_plus1 - 1];
	}
}

/* Removes key (of session si) from the key table: backward-shift
 * deletion, so lookups need no tombstones. */
static void
keys_del(histd_index *ix, uint64_t key, uint32_t si)
{
	size_t i, j;

	for (i = hash_u64(key) & ix->kmask; ix->keys[i].sess_plus1 != si + 1;
	     i = (i + 1) & ix->kmask)
		;
	for (j = (i + 1) & ix->kmask; ix->keys[j].sess_plus1;
	     j = (j + 1) & ix->kmask) {
		size_t home = hash_u64(ix->keys[j].key) & ix->kmask;

		/* j's entry may move to i if its home is not in (i, j]. */
		if (((j - home) & ix->kmask) >= ((j - i) & ix->kmask)) {
			ix->keys[i] = ix->keys[j];
			i = j;
		}
	}
	ix->keys[i] = (kslot){ 0 };
	ix->n_keys--;
}

/* Makes ks (cap zeroed slots, a power of two) the key table, filled from
 * the sessions. */
static void
keys_fill(histd_index *ix, kslot *ks, size_t cap)
{
	free(ix->keys);
	ix->keys = ks;
	ix->kmask = cap - 1;
	ix->n_keys = 0;
	for (uint32_t s = 0; s < ix->n_sess; s++) {
		size_t i;

		if (!ix->sess[s].id)
			continue;
		for (i = hash_u64(ix->sess[s].key) & ix->kmask; ks[i].sess_plus1;
		     i = (i + 1) & ix->kmask)
			;
		ks[i] = (kslot){ .key = ix->sess[s].key, .sess_plus1 = s + 1 };
		ix->n_keys++;
	}
}

static int
keys_rebuild(histd_index *ix, size_t cap)
{
	kslot *ks = calloc(cap, sizeof(*ks));

	if (!ks)
		return enomem();
	keys_fill(ix, ks, cap);
	return 0;
}

static ix_sess *
sess_add(histd_index *ix, uint64_t key, const char *id)
{
	size_t cap = ix->keys ? ix->kmask + 1 : 0;
	char *copy;

	if (ix->n_sess == ix->cap_sess) {
		uint32_t nc = ix->cap_sess ? ix->cap_sess * 2 : 8;
		ix_sess *v = realloc(ix->sess, nc * sizeof(*v));

		if (!v)
			return NULL;
		ix->sess = v;
		ix->cap_sess = nc;
	}
	if ((ix->n_keys + 1) * 4 > cap * 3) {
		size_t nc = cap ? cap * 2 : 16;

		if (keys_rebuild(ix, nc))
			return NULL;
	}
	if (!(copy = strdup(id)))
		return NULL;
	ix->sess[ix->n_sess] = (ix_sess){ .key = key, .id = copy };
	{
		size_t i;

		for (i = hash_u64(key) & ix->kmask; ix->keys[i].sess_plus1;
		     i = (i + 1) & ix->kmask)
			;
		ix->keys[i] = (kslot){ .key = key, .sess_plus1 = ix->n_sess + 1 };
		ix->n_keys++;
	}
	return &ix->sess[ix->n_sess++];
}

/* --- terms --- */

static ix_term *
term_find(const histd_index *ix, const char *s, size_t n, uint64_t h)
{
	if (!ix->n_terms)
		return NULL;
	for (size_t i = h & ix->tmask;; i = (i + 1) & ix->tmask) {
		ix_term *t = ix->terms[i].t;

		if (!t)
			return NULL;
		if (ix->terms[i].h == h && t->len == n && memcmp(t->text, s, n) == 0)
			return t;
	}
}

static int
terms_grow(histd_index *ix)
{
	size_t cap = ix->terms ? ix->tmask + 1 : 0, nc = cap ? cap * 2 : 1024;
	tslot *ns;

	if ((ix->n_terms + 1) * 4 <= cap * 3)
		return 0;
	if (!(ns = calloc(nc, sizeof(*ns))))
		return enomem();
	for (size_t i = 0; i < cap; i++) {
		size_t j;

		if (!ix->terms[i].t)
			continue;
		for (j = ix->terms[i].h & (nc - 1); ns[j].t; j = (j + 1) & (nc - 1))
			;
		ns[j] = ix->terms[i];
	}
	free(ix->terms);
	ix->terms = ns;
	ix->tmask = nc - 1;
	return 0;
}

static ix_term *
term_get(histd_index *ix, const char *s, size_t n)
{
	uint64_t h = hash_str(s, n);
	ix_term *t = term_find(ix, s, n, h);
	size_t i;

	if (t)
		return t;
	if (terms_grow(ix) || !(t = calloc(1, sizeof(*t) + n + 1)))
		return NULL;
	t->len = (uint32_t)n;
	memcpy(t->text, s, n);
	for (i = h & ix->tmask; ix->terms[i].t; i = (i + 1) & ix->tmask)
		;
	ix->terms[i] = (tslot){ .h = h, .t = t };
	ix->n_terms++;
	ix->term_bytes += sizeof(*t) + n + 1;
	return t;
}

static size_t
put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

static uint64_t
get_varint(const uint8_t **p)
{
	uint64_t v = 0;
	int shift = 0;

	while (**p & 0x80) {
		v |= (uint64_t)(**p & 0x7F) << shift;
		shift += 7;
		(*p)++;
	}
	v |= (uint64_t)**p << shift;
	(*p)++;
	return v;
}

/* Appends a posting (doc, tf_main, tf_tool) to t. */
static int
posting_add(histd_index *ix, ix_term *t, uint32_t doc, uint32_t tf_main,
	    uint32_t tf_tool)
{
	uint8_t buf[3 * 10];
	size_t n = 0;

	n += put_varint(buf + n, (uint64_t)doc + 1 - t->last);
	n += put_varint(buf + n, ((uint64_t)tf_main << 1) | (tf_tool != 0));
	if (tf_tool)
		n += put_varint(buf + n, tf_tool);
	if (t->post_len + n > t->post_cap) {
		uint32_t nc = t->post_cap ? t->post_cap + t->post_cap / 2 : 8;
		uint8_t *p;

		if (nc < t->post_len + n)
			nc = (uint32_t)(t->post_len + n);
		if (!(p = realloc(t->post, nc)))
			return enomem();
		ix->term_bytes += nc - t->post_cap;
		t->post = p;
		t->post_cap = nc;
	}
	memcpy(t->post + t->post_len, buf, n);
	t->post_len += (uint32_t)n;
	t->last = doc + 1;
	return 0;
}

/* --- documents --- */

/* The tokens of one message, gathered to count them per term. */
typedef struct tokbuf {
	char *chars;
	size_t n_chars, cap_chars;
	struct tok { uint32_t off, len; uint8_t tool; } *v;
	size_t n, cap;
	int is_tool;
	int oom;
	uint32_t len_main, len_tool;
} tokbuf;

static void
tok_collect(void *ctx, const char *tok, size_t len)
{
	tokbuf *b = ctx;

	if (b->oom)
		return;
	if (b->n == b->cap) {
		size_t nc = b->cap ? b->cap * 2 : 64;
		struct tok *v = realloc(b->v, nc * sizeof(*v));

		if (!v) {
			b->oom = 1;
			return;
		}
		b->v = v;
		b->cap = nc;
	}
	if (b->n_chars + len > b->cap_chars) {
		size_t nc = b->cap_chars ? b->cap_chars * 2 : 512;
		char *c;

		while (nc < b->n_chars + len)
			nc *= 2;
		if (!(c = realloc(b->chars, nc))) {
			b->oom = 1;
			return;
		}
		b->chars = c;
		b->cap_chars = nc;
	}
	memcpy(b->chars + b->n_chars, tok, len);
	b->v[b->n++] = (struct tok){ (uint32_t)b->n_chars, (uint32_t)len,
				     (uint8_t)b->is_tool };
	b->n_chars += len;
	if (b->is_tool)
		b->len_tool++;
	else
		b->len_main++;
}

static void
text_collect(void *ctx, const char *text, size_t len, int is_tool)
{
	tokbuf *b = ctx;

	b->is_tool = is_tool;
	histd_index_tokens(text, len, tok_collect, b);
}

static int
tok_cmp(const void *a, const void *b, void *chars)
{
	const struct tok *x = a, *y = b;
	const char *c0 = chars;
	uint32_t n = x->len < y->len ? x->len : y->len;
	int c = memcmp(c0 + x->off, c0 + y->off, n);

	return c ? c : (int)x->len - (int)y->len;
}

/* Indexes one record as a new document of session s. */
static int
doc_add(histd_index *ix, uint32_t sess, const histd_record *r, tokbuf *b)
{
	ix_sess *s = &ix->sess[sess];
	uint32_t doc, role;
	const uint8_t *data = r->data;

	b->n = b->n_chars = 0;
	b->len_main = b->len_tool = 0;
	b->oom = 0;
	/* A record that does not parse indexes what came before it. */
	(void)histd_index_message_text(data, r->len, &role, text_collect, b);
	if (b->oom)
		return enomem();
	if (ix->n_docs == UINT32_MAX - 1)
		return histd_error_set(HISTD_ELIMIT, "the search index is full");
	if (ix->n_docs == ix->cap_docs) {
		uint32_t nc = ix->cap_docs ? ix->cap_docs + ix->cap_docs / 2 : 64;
		ix_doc *v = realloc(ix->docs, nc * sizeof(*v));

		if (!v)
			return enomem();
		ix->docs = v;
		ix->cap_docs = nc;
	}
	if (s->n_docs == s->cap_docs) {
		uint32_t nc = s->cap_docs ? s->cap_docs * 2 : 8;
		uint32_t *v = realloc(s->docs, nc * sizeof(*v));

		if (!v)
			return enomem();
		s->docs = v;
		s->cap_docs = nc;
	}
	doc = ix->n_docs++;
	ix->docs[doc] = (ix_doc){
		.seq = r->seq, .sess = sess, .len_main = b->len_main,
		.len_tool = b->len_tool, .role = (uint8_t)role,
	};
	s->docs[s->n_docs++] = doc;
	if (b->len_main) {
		ix->n_main++;
		ix->sum_main += b->len_main;
	}
	if (b->len_main + b->len_tool) {
		ix->n_all++;
		ix->sum_all += b->len_main + b->len_tool;
	}
	/* Count per distinct token: sort, then runs. */
	qsort_r(b->v, b->n, sizeof(*b->v), tok_cmp, b->chars);
	for (size_t i = 0; i < b->n;) {
		size_t j = i;
		uint32_t tm = 0, tt = 0;
		ix_term *t;

		while (j < b->n && b->v[j].len == b->v[i].len &&
		       memcmp(b->chars + b->v[j].off, b->chars + b->v[i].off,
			      b->v[i].len) == 0) {
			if (b->v[j].tool)
				tt++;
			else
				tm++;
			j++;
		}
		if (!(t = term_get(ix, b->chars + b->v[i].off, b->v[i].len)) ||
		    posting_add(ix, t, doc, tm, tt))
			return enomem();
		i = j;
	}
	return 0;
}

static void
doc_kill(histd_index *ix, uint32_t doc)
{
	ix_doc *d = &ix->docs[doc];

	if (d->dead)
		return;
	d->dead = 1;
	ix->n_dead++;
	if (d->len_main) {
		ix->n_main--;
		ix->sum_main -= d->len_main;
	}
	if (d->len_main + d->len_tool) {
		ix->n_all--;
		ix->sum_all -= d->len_main + d->len_tool;
	}
}

/* Rewrites every posting list without dead documents, renumbering the
 * live ones in order (so deltas stay positive), and drops forgotten
 * sessions and empty terms. On ENOMEM nothing changed. */
static int
compact(histd_index *ix)
{
	uint32_t *map = malloc((ix->n_docs ? ix->n_docs : 1) * sizeof(*map));
	uint32_t *smap = malloc((ix->n_sess ? ix->n_sess : 1) * sizeof(*smap));
	/* The key table names sessions by number: it is remade at the end,
	 * so it is allocated before anything changes. */
	size_t kcap = ix->kmask + 1 ? ix->kmask + 1 : 16;
	kslot *ks = calloc(kcap, sizeof(*ks));
	uint32_t nd = 0, ns = 0;

	if (!map || !smap || !ks) {
		free(map);
		free(smap);
		free(ks);
		return enomem();
	}
	/* Sessions first (live ones keep their order), then documents. */
	for (uint32_t s = 0; s < ix->n_sess; s++)
		smap[s] = ix->sess[s].id ? ns++ : UINT32_MAX;
	for (uint32_t d = 0; d < ix->n_docs; d++)
		map[d] = ix->docs[d].dead || smap[ix->docs[d].sess] == UINT32_MAX
				 ? UINT32_MAX : nd++;
	/* Postings: rewritten in place (never longer: deltas only shrink). */
	for (size_t i = 0; ix->terms && i <= ix->tmask; i++) {
		ix_term *t = ix->terms[i].t;
		const uint8_t *p, *end;
		uint32_t doc = 0, out = 0, last = 0;

		if (!t)
			continue;
		p = t->post;
		end = t->post + t->post_len;
		while (p < end) {
			uint64_t delta = get_varint(&p), tf = get_varint(&p);
			uint64_t tt = (tf & 1) ? get_varint(&p) : 0;
			uint8_t buf[30];
			size_t n = 0;

			doc += (uint32_t)delta;     /* doc + 1 */
			if (map[doc - 1] == UINT32_MAX)
				continue;
			n += put_varint(buf + n, (uint64_t)map[doc - 1] + 1 - last);
			n += put_varint(buf + n, tf);
			if (tf & 1)
				n += put_varint(buf + n, tt);
			memcpy(t->post + out, buf, n);
			out += (uint32_t)n;
			last = map[doc - 1] + 1;
		}
		t->post_len = out;
		t->last = last;
	}
	/* Documents. */
	for (uint32_t d = 0; d < ix->n_docs; d++)
		if (map[d] != UINT32_MAX) {
			ix->docs[map[d]] = ix->docs[d];
			ix->docs[map[d]].sess = smap[ix->docs[d].sess];
		}
	ix->n_docs = nd;
	ix->n_dead = 0;
	/* Sessions, and their document lists. */
	for (uint32_t s = 0; s < ix->n_sess; s++) {
		ix_sess *x = &ix->sess[s];
		uint32_t k = 0;

		if (smap[s] == UINT32_MAX) {
			free(x->docs);
			continue;
		}
		for (uint32_t j = 0; j < x->n_docs; j++)
			if (map[x->docs[j]] != UINT32_MAX)
				x->docs[k++] = map[x->docs[j]];
		x->n_docs = k;
		ix->sess[smap[s]] = *x;
	}
	ix->n_sess = ns;
	free(map);
	free(smap);
	/* Terms left without postings go; the table is rebuilt to drop
	 * them (open addressing has no cheap delete here). */
	{
		size_t cap = ix->tmask + 1;
		tslot *old = ix->terms;

		if (old) {
			tslot *nt = calloc(cap, sizeof(*nt));

			if (nt) {
				ix->n_terms = 0;
				for (size_t i = 0; i < cap; i++) {
					ix_term *t = old[i].t;
					size_t j;

					if (!t)
						continue;
					if (!t->post_len) {
						ix->term_bytes -= sizeof(*t) + t->len + 1 +
								  t->post_cap;
						free(t->post);
						free(t);
						continue;
					}
					for (j = old[i].h & ix->tmask; nt[j].t;
					     j = (j + 1) & ix->tmask)
						;
					nt[j] = old[i];
					ix->n_terms++;
				}
				free(old);
				ix->terms = nt;
			}
		}
	}
	keys_fill(ix, ks, kcap);
	return 0;
}

/* A word's count in one text of a message, as scored: at most 256, as
 * PostgreSQL keeps at most 256 positions of a word per tsvector, so that
 * every driver ranks alike. */
static uint64_t
tf_cap(uint64_t n)
{
	return n > 256 ? 256 : n;
}

static void
maybe_compact(histd_index *ix)
{
	if (ix->n_dead >= COMPACT_MIN_DEAD && ix->n_dead > ix->n_docs - ix->n_dead)
		(void)compact(ix);      /* ENOMEM: stays correct, only larger */
}

int
histd_index_sync(histd_index *ix, uint64_t key, const char *id,
		 const histd_record *recs, size_t n)
{
	tokbuf b = { 0 };
	ix_sess *s;
	uint32_t si;
	size_t lo = 0, hi = n;
	int rc = 0;

	pthread_rwlock_wrlock(&ix->lock);
	if (!(s = sess_find(ix, key)) && !(s = sess_add(ix, key, id))) {
		ix->incomplete = 1;
		pthread_rwlock_unlock(&ix->lock);
		return enomem();
	}
	si = (uint32_t)(s - ix->sess);
	/* The first record above what this session had indexed. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (recs[mid].seq <= s->synced)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < n && rc == 0; i++)
		rc = doc_add(ix, si, &recs[i], &b);
	s = &ix->sess[si];
	if (n && recs[n - 1].seq > s->synced)
		s->synced = recs[n - 1].seq;
	s->newest = n ? recs[n - 1].seq : 0;
	if (rc)
		ix->incomplete = 1;
	pthread_rwlock_unlock(&ix->lock);
	free(b.chars);
	free(b.v);
	return rc;
}

void
histd_index_clear(histd_index *ix, uint64_t key)
{
	ix_sess *s;

	pthread_rwlock_wrlock(&ix->lock);
	if ((s = sess_find(ix, key))) {
		for (uint32_t i = 0; i < s->n_docs; i++)
			doc_kill(ix, s->docs[i]);
		s->n_docs = 0;
		s->newest = 0;
		maybe_compact(ix);
	}
	pthread_rwlock_unlock(&ix->lock);
}

void
histd_index_forget(histd_index *ix, uint64_t key)
{
	ix_sess *s;

	pthread_rwlock_wrlock(&ix->lock);
	if ((s = sess_find(ix, key))) {
		uint32_t si = (uint32_t)(s - ix->sess);

		for (uint32_t i = 0; i < s->n_docs; i++)
			doc_kill(ix, s->docs[i]);
		s->n_docs = 0;
		free(s->id);
		s->id = NULL;
		s->newest = 0;
		keys_del(ix, key, si);
		maybe_compact(ix);
	}
	pthread_rwlock_unlock(&ix->lock);
}

/* ---------------------------------------------------------------------- */
/* Search                                                                  */

/* Whether a is a better hit than b: higher score, then smaller id, then
 * smaller seq. */
static int
better(const histd_index_hit *a, const histd_index_hit *b)
{
	int c;

	if (a->score != b->score)
		return a->score > b->score;
	c = strcmp(a->id, b->id);
	if (c)
		return c < 0;
	return a->seq < b->seq;
}

/* A min-heap of the k best: the root is the worst kept. */
static void
heap_down(histd_index_hit *v, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, w = i;

		if (l < n && better(&v[w], &v[l]))
			w = l;
		if (r < n && better(&v[w], &v[r]))
			w = r;
		if (w == i)
			return;
		histd_index_hit t = v[i];
		v[i] = v[w];
		v[w] = t;
		i = w;
	}
}

static void
heap_up(histd_index_hit *v, size_t i)
{
	while (i) {
		size_t p = (i - 1) / 2;

		if (!better(&v[p], &v[i]))
			return;
		histd_index_hit t = v[i];
		v[i] = v[p];
		v[p] = t;
		i = p;
	}
}

int
histd_topk_init(histd_topk *t, size_t k)
{
	t->n = 0;
	t->k = k;
	t->v = malloc((k ? k : 1) * sizeof(*t->v));
	return t->v ? 0 : enomem();
}

void
histd_topk_add(histd_topk *t, uint64_t key, const char *id, uint64_t seq,
	       double score)
{
	histd_index_hit h = { .key = key, .id = id, .seq = seq, .score = score };

	if (!t->k)
		return;
	if (t->n < t->k) {
		t->v[t->n] = h;
		heap_up(t->v, t->n++);
	} else if (better(&h, &t->v[0])) {
		t->v[0] = h;
		heap_down(t->v, t->n, 0);
	}
}

static int
hit_cmp(const void *a, const void *b)
{
	return better(a, b) ? -1 : better(b, a) ? 1 : 0;
}

void
histd_topk_finish(histd_topk *t)
{
	qsort(t->v, t->n, sizeof(*t->v), hit_cmp);
}

void
histd_topk_free(histd_topk *t)
{
	free(t->v);
	t->v = NULL;
	t->n = t->k = 0;
}

/* The distinct tokens of the query. */
typedef struct qterms {
	char tok[QUERY_TERMS_MAX][HISTD_INDEX_TOKEN_MAX + 1];
	size_t len[QUERY_TERMS_MAX];
	size_t n;
} qterms;

static void
q_collect(void *ctx, const char *tok, size_t len)
{
	qterms *q = ctx;

	if (q->n == QUERY_TERMS_MAX)
		return;
	for (size_t i = 0; i < q->n; i++)
		if (q->len[i] == len && memcmp(q->tok[i], tok, len) == 0)
			return;
	memcpy(q->tok[q->n], tok, len + 1);
	q->len[q->n++] = len;
}

int
histd_index_search(histd_index *ix, const histd_search_query *q,
		   histd_index_scope_fn scope, void *scope_ctx,
		   histd_index_hit **hits, size_t *n_hits)
{
	const int tool = q->include_tool_results;
	qterms qt;
	double *acc = NULL;     /* double, as PostgreSQL scores: equal ranks */
	uint32_t *touched = NULL, n_touched = 0;
	uint32_t *tmp_doc = NULL;
	float *tmp_tf = NULL;
	uint8_t *in = NULL;
	histd_topk top = { 0 };
	double n_docs, avgdl;
	int rc = 0;

	*hits = NULL;
	*n_hits = 0;
	qt.n = 0;
	histd_index_tokens(q->text, strlen(q->text), q_collect, &qt);
	if (!qt.n)
		return histd_error_set(HISTD_EINVALID,
				       "query has no word to search for");
	if ((rc = histd_topk_init(&top, q->k)))
		return rc;
	pthread_rwlock_rdlock(&ix->lock);
	n_docs = (double)(tool ? ix->n_all : ix->n_main);
	if (n_docs == 0 || ix->n_docs == 0)
		goto done;
	avgdl = (double)(tool ? ix->sum_all : ix->sum_main) / n_docs;
	acc = calloc(ix->n_docs, sizeof(*acc));
	touched = malloc(ix->n_docs * sizeof(*touched));
	tmp_doc = malloc(ix->n_docs * sizeof(*tmp_doc));
	tmp_tf = malloc(ix->n_docs * sizeof(*tmp_tf));
	in = malloc(ix->n_sess ? ix->n_sess : 1);
	if (!acc || !touched || !tmp_doc || !tmp_tf || !in) {
		rc = enomem();
		goto done;
	}
	/* The scope, once per session. */
	for (uint32_t s = 0; s < ix->n_sess; s++)
		in[s] = ix->sess[s].id &&
			(!scope || scope(scope_ctx, ix->sess[s].key, ix->sess[s].id));

	for (size_t i = 0; i < qt.n; i++) {
		ix_term *t = term_find(ix, qt.tok[i], qt.len[i],
				       hash_str(qt.tok[i], qt.len[i]));
		const uint8_t *p, *end;
		uint32_t doc = 0, df = 0, m = 0;
		double idf;

		if (!t)
			continue;
		p = t->post;
		end = t->post + t->post_len;
		/* One pass: df over every live document (the corpus
		 * statistic), candidates only from the scope. */
		while (p < end) {
			uint64_t delta = get_varint(&p), tf = get_varint(&p);
			uint64_t tt = (tf & 1) ? get_varint(&p) : 0;
			uint64_t f = tf_cap(tf >> 1) + (tool ? tf_cap(tt) : 0);
			const ix_doc *d;

			doc += (uint32_t)delta;
			d = &ix->docs[doc - 1];
			if (d->dead || f == 0)
				continue;
			df++;
			if (!in[d->sess])
				continue;
			if (q->roles && !(q->roles & (1u << d->role)))
				continue;
			if (q->exclude_newest && d->seq == ix->sess[d->sess].newest)
				continue;
			tmp_doc[m] = doc - 1;
			tmp_tf[m++] = (float)f;
		}
		if (!m)
			continue;
		idf = log(1.0 + ((double)n_docs - df + 0.5) / (df + 0.5));
		for (uint32_t j = 0; j < m; j++) {
			const ix_doc *d = &ix->docs[tmp_doc[j]];
			double dl = (double)d->len_main + (tool ? d->len_tool : 0);
			double tf = tmp_tf[j];
			double s = idf * tf * (BM25_K1 + 1) /
				   (tf + BM25_K1 * (1 - BM25_B + BM25_B * dl / avgdl));

			if (acc[tmp_doc[j]] == 0)
				touched[n_touched++] = tmp_doc[j];
			/* Never 0 once touched, so a document is listed once. */
			acc[tmp_doc[j]] += s > 1e-9 ? s : 1e-9;
		}
	}
	for (uint32_t j = 0; j < n_touched; j++) {
		const ix_doc *d = &ix->docs[touched[j]];
		const ix_sess *s = &ix->sess[d->sess];

		histd_topk_add(&top, s->key, s->id, d->seq, acc[touched[j]]);
	}
	histd_topk_finish(&top);
	/* The ids are the index's: copied before the lock goes. */
	for (size_t j = 0; j < top.n; j++)
		if (!(top.v[j].id = strdup(top.v[j].id))) {
			for (size_t x = 0; x < j; x++)
				free((char *)top.v[x].id);
			rc = enomem();
			goto done;
		}
	*hits = top.v;
	*n_hits = top.n;
	top.v = NULL;
done:
	pthread_rwlock_unlock(&ix->lock);
	histd_topk_free(&top);
	free(acc);
	free(touched);
	free(tmp_doc);
	free(tmp_tf);
	free(in);
	return rc;
}

void
histd_index_hits_free(histd_index_hit *hits, size_t n)
{
	for (size_t i = 0; hits && i < n; i++)
		free((char *)hits[i].id);
	free(hits);
}

/* ---------------------------------------------------------------------- */
/* Vectors                                                                 */

int
histd_vec_normalize(float *v, uint32_t dim)
{
	double s = 0;

	for (uint32_t i = 0; i < dim; i++)
		s += (double)v[i] * v[i];
	if (!(s > 0) || !isfinite(s))
		return -1;
	s = 1.0 / sqrt(s);
	for (uint32_t i = 0; i < dim; i++)
		v[i] = (float)(v[i] * s);
	return 0;
}

histd_vec *
histd_vec_new(uint64_t seq, uint8_t role, const char *model, const float *v,
	      uint32_t dim)
{
	size_t ml = strlen(model) + 1;
	histd_vec *x = malloc(sizeof(*x) + (size_t)dim * sizeof(float) + ml);

	if (!x)
		return NULL;
	x->seq = seq;
	x->dim = dim;
	x->role = role;
	memcpy(x->v, v, (size_t)dim * sizeof(float));
	x->model = (char *)(x->v + dim);
	memcpy(x->model, model, ml);
	if (histd_vec_normalize(x->v, dim)) {
		free(x);
		return NULL;
	}
	return x;
}

int
histd_vecs_put(histd_vecs *s, histd_vec *x)
{
	size_t lo = 0, hi = s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid]->seq < x->seq)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->n && s->v[lo]->seq == x->seq) {
		free(s->v[lo]);
		s->v[lo] = x;
		return 0;
	}
	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 8;
		histd_vec **v = realloc(s->v, nc * sizeof(*v));

		if (!v)
			return enomem();
		s->v = v;
		s->cap = nc;
	}
	memmove(s->v + lo + 1, s->v + lo, (s->n - lo) * sizeof(*s->v));
	s->v[lo] = x;
	s->n++;
	return 0;
}

void
histd_vecs_clear(histd_vecs *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
	s->v = NULL;
	s->n = s->cap = 0;
}

int
histd_vecs_copy(histd_vecs *dst, const histd_vecs *src, uint64_t up_to)
{
	for (size_t i = 0; i < src->n && src->v[i]->seq <= up_to; i++) {
		const histd_vec *x = src->v[i];
		size_t sz = sizeof(*x) + (size_t)x->dim * sizeof(float) +
			    strlen(x->model) + 1;
		histd_vec *c = malloc(sz);

		/* Filled before the put, which orders by c->seq. */
		if (c) {
			memcpy(c, x, sz);
			c->model = (char *)(c->v + c->dim);
		}
		if (!c || histd_vecs_put(dst, c)) {
			free(c);
			histd_vecs_clear(dst);
			return enomem();
		}
	}
	return 0;
}

size_t
histd_vecs_bytes(const histd_vecs *s)
{
	size_t b = s->cap * sizeof(*s->v);

	for (size_t i = 0; i < s->n; i++)
		b += sizeof(*s->v[i]) + s->v[i]->dim * sizeof(float) +
		     strlen(s->v[i]->model) + 1;
	return b;
}

double
histd_vec_cosine(const histd_vec *x, const float *q)
{
	double s = 0;

	for (uint32_t i = 0; i < x->dim; i++)
		s += (double)x->v[i] * q[i];
	return s;
}

void
histd_vecs_search(const histd_vecs *s, histd_topk *t, uint64_t key,
		  const char *id, const char *model, uint32_t dim,
		  const float *qn, uint32_t roles, uint64_t skip_seq)
{
	for (size_t i = 0; i < s->n; i++) {
		const histd_vec *x = s->v[i];
		double score;

		if (x->dim != dim || strcmp(x->model, model) != 0)
			continue;
		if (roles && !(roles & (1u << x->role)))
			continue;
		if (skip_seq && x->seq == skip_seq)
			continue;
		/* Orthogonal or opposite to the query: not a match. */
		if ((score = histd_vec_cosine(x, qn)) > 0)
			histd_topk_add(t, key, id, x->seq, score);
	}
}
