#include "histd_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "histd_error.h"

size_t
histd_wire_put_varint(uint8_t *out, uint64_t v)
{
	size_t n = 0;

	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

size_t
histd_wire_varint_size(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

size_t
histd_wire_put_len_key(uint8_t *out, uint32_t field, uint64_t len)
{
	size_t n = histd_wire_put_varint(out, ((uint64_t)field << 3) | 2);

	return n + histd_wire_put_varint(out + n, len);
}

size_t
histd_wire_put_seq(uint8_t *out, uint64_t seq)
{
	out[0] = (1 << 3) | 0; /* field 1, varint */
	return 1 + histd_wire_put_varint(out + 1, seq);
}

uint8_t *
histd_wire_with_seq(uint64_t seq, const uint8_t *data, size_t len,
		    size_t *out_len)
{
	uint8_t head[1 + HISTD_WIRE_VARINT_MAX];
	size_t hn = histd_wire_put_seq(head, seq);
	uint8_t *buf = malloc(hn + len ? hn + len : 1);

	if (!buf)
		return NULL;
	memcpy(buf, head, hn);
	if (len)
		memcpy(buf + hn, data, len);
	*out_len = hn + len;
	return buf;
}

int64_t
histd_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
histd_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The allocator of histd_unpack_stored: `inner`'s, noting a failure. */
struct noting {
	ProtobufCAllocator *inner;
	int oom;
};

static void *
noting_alloc(void *data, size_t size)
{
	struct noting *n = data;
	void *p = n->inner ? n->inner->alloc(n->inner->allocator_data, size)
			   : malloc(size);

	if (!p)
		n->oom = 1;
	return p;
}

static void
noting_free(void *data, void *p)
{
	struct noting *n = data;

	if (n->inner)
		n->inner->free(n->inner->allocator_data, p);
	else
		free(p);
}

int
histd_unpack_stored(const ProtobufCMessageDescriptor *d,
		    ProtobufCAllocator *alloc, const uint8_t *data,
		    size_t len, void *out, const char *what, ...)
{
	struct noting n = { alloc, 0 };
	ProtobufCAllocator a = { noting_alloc, noting_free, &n };
	ProtobufCMessage *m = protobuf_c_message_unpack(d, &a, len, data);
	char name[160];
	va_list ap;

	*(ProtobufCMessage **)out = m;
	if (m)
		return 0;
	if (n.oom)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	va_start(ap, what);
	vsnprintf(name, sizeof(name), what, ap);
	va_end(ap);
	return histd_error_set(HISTD_ECORRUPT, "%s does not decode", name);
}
