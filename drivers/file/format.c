/*
 * The file driver's record format and hash table (see internal.h).
 *
 * Checksums are zlib's crc32 over the frame's length field and body, so a
 * damaged length is caught like damaged data.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <zlib.h>

#include "histd_wire.h"
#include "internal.h"

/* ---------------------------------------------------------------------- */
/* Encoding                                                                */

int
hf_buf_reserve(hf_buf *b, size_t more)
{
	size_t cap;
	uint8_t *p;

	if (b->oom)
		return -1;
	if (b->len + more <= b->cap)
		return 0;
	cap = b->cap ? b->cap : 4096;
	while (cap < b->len + more)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = 1;
		return -1;
	}
	b->p = p;
	b->cap = cap;
	return 0;
}

void
hf_buf_free(hf_buf *b)
{
	free(b->p);
	*b = (hf_buf){ 0 };
}

void
hf_put_u8(hf_buf *b, uint8_t v)
{
	if (hf_buf_reserve(b, 1) == 0)
		b->p[b->len++] = v;
}

void
hf_put_varint(hf_buf *b, uint64_t v)
{
	if (hf_buf_reserve(b, HISTD_WIRE_VARINT_MAX) == 0)
		b->len += histd_wire_put_varint(b->p + b->len, v);
}

void
hf_put_raw(hf_buf *b, const void *p, size_t n)
{
	if (n && hf_buf_reserve(b, n) == 0) {
		memcpy(b->p + b->len, p, n);
		b->len += n;
	}
}

void
hf_put_bytes(hf_buf *b, const void *p, size_t n)
{
	hf_put_varint(b, n);
	hf_put_raw(b, p, n);
}

void
hf_put_str(hf_buf *b, const char *s)
{
	hf_put_bytes(b, s, s ? strlen(s) : 0);
}

void
hf_put_kv(hf_buf *b, const histd_kv *kv, size_t n)
{
	hf_put_varint(b, n);
	for (size_t i = 0; i < n; i++) {
		hf_put_str(b, kv[i].key);
		hf_put_str(b, kv[i].value);
	}
}

static void
put_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint32_t
get_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

size_t
hf_frame_begin(hf_buf *b, uint8_t type)
{
	size_t start = b->len;

	if (hf_buf_reserve(b, HF_FRAME_HEADER + 1) == 0) {
		memset(b->p + b->len, 0, HF_FRAME_HEADER);
		b->len += HF_FRAME_HEADER;
		b->p[b->len++] = type;
	}
	return start;
}

static uint32_t
frame_crc(const uint8_t *lenp, const uint8_t *body, uint32_t len)
{
	uLong c = crc32(0L, Z_NULL, 0);

	c = crc32(c, lenp, 4);
	c = crc32(c, body, len);
	return (uint32_t)c;
}

void
hf_frame_end(hf_buf *b, size_t start)
{
	uint8_t *f;
	size_t len;

	if (b->oom)
		return;
	f = b->p + start;
	len = b->len - start - HF_FRAME_HEADER;
	if (len > HF_FRAME_MAX)
		return;         /* the caller refuses the record */
	put_le32(f, (uint32_t)len);
	put_le32(f + 4, frame_crc(f, f + HF_FRAME_HEADER, (uint32_t)len));
}

/* ---------------------------------------------------------------------- */
/* Decoding                                                                */

uint8_t
hf_get_u8(hf_rd *r)
{
	if (r->bad || r->p >= r->end) {
		r->bad = 1;
		return 0;
	}
	return *r->p++;
}

uint64_t
hf_get_varint(hf_rd *r)
{
	uint64_t v = 0;

	for (unsigned shift = 0; shift < 64; shift += 7) {
		uint8_t c;

		if (r->bad || r->p >= r->end)
			break;
		c = *r->p++;
		v |= (uint64_t)(c & 0x7f) << shift;
		if (!(c & 0x80))
			return v;
	}
	r->bad = 1;
	return 0;
}

const uint8_t *
hf_get_bytes(hf_rd *r, size_t *len)
{
	uint64_t n = hf_get_varint(r);
	const uint8_t *p;

	if (r->bad || n > (uint64_t)(r->end - r->p)) {
		r->bad = 1;
		*len = 0;
		return NULL;
	}
	p = r->p;
	r->p += n;
	*len = (size_t)n;
	return p;
}

void
hf_get_raw(hf_rd *r, void *out, size_t n)
{
	if (r->bad || n > (size_t)(r->end - r->p)) {
		r->bad = 1;
		memset(out, 0, n);
		return;
	}
	memcpy(out, r->p, n);
	r->p += n;
}

char *
hf_get_strdup(hf_rd *r, int *oom)
{
	size_t n;
	const uint8_t *p = hf_get_bytes(r, &n);
	char *s;

	if (!p)
		return NULL;
	if (memchr(p, 0, n)) {
		r->bad = 1;
		return NULL;
	}
	s = malloc(n + 1);
	if (!s) {
		*oom = 1;
		return NULL;
	}
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

int
hf_get_kv(hf_rd *r, histd_kv **out, size_t *n)
{
	uint64_t cnt = hf_get_varint(r);
	histd_kv *kv;
	int oom = 0;

	*out = NULL;
	*n = 0;
	if (r->bad || cnt > (uint64_t)(r->end - r->p) / 2) {
		r->bad = 1;
		return HISTD_ECORRUPT;
	}
	if (!cnt)
		return 0;
	kv = calloc((size_t)cnt, sizeof(*kv));
	if (!kv)
		return HISTD_ENOMEM;
	for (size_t i = 0; i < cnt; i++) {
		kv[i].key = hf_get_strdup(r, &oom);
		kv[i].value = hf_get_strdup(r, &oom);
		if (!kv[i].key || !kv[i].value) {
			histd_kv_free(kv, i + 1);
			return oom ? HISTD_ENOMEM : HISTD_ECORRUPT;
		}
		/* Sorted and unique, as every caller of a driver gives them. */
		if (i && strcmp(kv[i - 1].key, kv[i].key) >= 0) {
			histd_kv_free(kv, i + 1);
			r->bad = 1;
			return HISTD_ECORRUPT;
		}
	}
	*out = kv;
	*n = (size_t)cnt;
	return 0;
}

enum hf_frame_status
hf_frame_check(const uint8_t *p, size_t avail, uint32_t *body_len)
{
	uint32_t len;

	if (avail < HF_FRAME_HEADER)
		return HF_FRAME_SHORT;
	len = get_le32(p);
	if (len == 0 || len > HF_FRAME_MAX)
		return HF_FRAME_BAD;
	if ((size_t)len > avail - HF_FRAME_HEADER)
		return HF_FRAME_SHORT;
	if (frame_crc(p, p + HF_FRAME_HEADER, len) != get_le32(p + 4))
		return HF_FRAME_BAD;
	*body_len = len;
	return HF_FRAME_OK;
}

static int
known_type(uint8_t t)
{
	return (t >= HF_T_FILE && t <= HF_T_TRUNCATE) ||
	       (t >= HF_T_S_SESSION && t <= HF_T_S_END);
}

int
hf_all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return 0;
	return 1;
}

/* Valid frames from p on, one after the other, up to the end of the
 * records: the end of the file, zeros to it (space the writer prepared),
 * a frame of a known type that the end cut short (a torn write; cut
 * before its type byte, it cannot be told from other bytes), or a frame
 * torn inside the prepared zeros: its length fits, part of it was never
 * written (so its checksum fails), and only zeros follow it. */
static int
chain_to_end(const uint8_t *p, size_t avail)
{
	while (avail) {
		uint32_t len;

		switch (hf_frame_check(p, avail, &len)) {
		case HF_FRAME_OK:
			p += HF_FRAME_HEADER + (size_t)len;
			avail -= HF_FRAME_HEADER + (size_t)len;
			break;
		case HF_FRAME_SHORT:
			return hf_all_zero(p, avail) || (avail > HF_FRAME_HEADER &&
						   known_type(p[HF_FRAME_HEADER]));
		default:
			return hf_all_zero(p, avail) ||
			       hf_frame_torn_in_zeros(p, avail);
		}
	}
	return 1;
}

int
hf_frame_torn_in_zeros(const uint8_t *p, size_t avail)
{
	uint32_t len;
	size_t end;

	if (avail < HF_FRAME_HEADER)
		return 0;
	len = get_le32(p);
	if (len == 0 || len > HF_FRAME_MAX)
		return 0;
	end = HF_FRAME_HEADER + (size_t)len;
	return end <= avail && hf_all_zero(p + end, avail - end);
}

int
hf_frame_find(const uint8_t *p, size_t avail)
{
	for (size_t o = 0; o + HF_FRAME_HEADER < avail; o++) {
		uint32_t len;

		/* The type byte first: it rules out most offsets before any
		 * checksum is computed. */
		if (!known_type(p[o + HF_FRAME_HEADER]))
			continue;
		if (hf_frame_check(p + o, avail - o, &len) == HF_FRAME_OK &&
		    chain_to_end(p + o + HF_FRAME_HEADER + len,
				 avail - o - HF_FRAME_HEADER - len))
			return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------------- */
/* Hash table                                                              */

static uint64_t hash_seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void
seed_init(void)
{
	struct timespec ts;

	/* Per process, so that ids cannot be chosen to collide. */
	if (getrandom(&hash_seed, sizeof(hash_seed), GRND_NONBLOCK) ==
	    (ssize_t)sizeof(hash_seed))
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	hash_seed = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ULL;
}

/* FNV-1a from a seed, then a finalizer that mixes the high bits into the
 * low ones probing uses. */
static uint64_t
hash_key(const void *k, size_t n)
{
	const uint8_t *b = k;
	uint64_t h;

	pthread_once(&seed_once, seed_init);
	h = 0xcbf29ce484222325ULL ^ hash_seed;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 32;
	h *= 0xd6e8feb86659fd93ULL;
	h ^= h >> 32;
	return h;
}

void *
hf_map_get(const hf_map *m, const void *k, size_t klen)
{
	uint64_t h;

	if (!m->n)
		return NULL;
	h = hash_key(k, klen);
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		const hf_slot *sl = &m->s[i];

		if (!sl->v)
			return NULL;
		if (sl->h == h && sl->klen == klen && memcmp(sl->k, k, klen) == 0)
			return sl->v;
	}
}

int
hf_map_reserve(hf_map *m, size_t n)
{
	size_t cap = m->s ? m->mask + 1 : 0, ncap;
	hf_slot *ns;

	/* At most 3/4 full. */
	if (n * 4 <= cap * 3)
		return 0;
	ncap = cap ? cap * 2 : 8;
	while (n * 4 > ncap * 3)
		ncap *= 2;
	ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	for (size_t i = 0; i < cap; i++) {
		size_t j;

		if (!m->s[i].v)
			continue;
		for (j = m->s[i].h & (ncap - 1); ns[j].v; j = (j + 1) & (ncap - 1))
			;
		ns[j] = m->s[i];
	}
	free(m->s);
	m->s = ns;
	m->mask = ncap - 1;
	return 0;
}

void
hf_map_put(hf_map *m, const void *k, size_t klen, void *v)
{
	uint64_t h = hash_key(k, klen);
	size_t i;

	for (i = h & m->mask; m->s[i].v; i = (i + 1) & m->mask)
		;
	m->s[i] = (hf_slot){ .h = h, .k = k, .klen = klen, .v = v };
	m->n++;
}

void *
hf_map_del(hf_map *m, const void *k, size_t klen)
{
	uint64_t h;
	size_t i;
	void *v;

	if (!m->n)
		return NULL;
	h = hash_key(k, klen);
	for (i = h & m->mask;; i = (i + 1) & m->mask) {
		if (!m->s[i].v)
			return NULL;
		if (m->s[i].h == h && m->s[i].klen == klen &&
		    memcmp(m->s[i].k, k, klen) == 0)
			break;
	}
	v = m->s[i].v;
	/* Moves back each later entry of the run that may sit in the hole:
	 * those whose home slot is not between the hole and themselves. */
	for (size_t j = i;;) {
		size_t home;

		j = (j + 1) & m->mask;
		if (!m->s[j].v)
			break;
		home = m->s[j].h & m->mask;
		if (i <= j ? (i < home && home <= j) : (i < home || home <= j))
			continue;
		m->s[i] = m->s[j];
		i = j;
	}
	m->s[i] = (hf_slot){ 0 };
	m->n--;
	return v;
}

void
hf_map_free(hf_map *m)
{
	free(m->s);
	*m = (hf_map){ 0 };
}
