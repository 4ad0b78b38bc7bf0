/*
 * Small helpers on the protobuf wire format, for the hot paths where
 * histd splices packed messages instead of unpacking and packing them.
 *
 * A stored message is the packed Histd__V1__Message with its seq (field 1)
 * first: the server packs a message with seq 0 (so proto3 omits the field)
 * and the driver puts the seq in front. Parsers accept fields in any order,
 * and field 1 first is the canonical order anyway.
 */
#ifndef HISTD_WIRE_H
#define HISTD_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Longest varint (a uint64). */
#define HISTD_WIRE_VARINT_MAX 10

/* Writes v as a varint into out; returns the bytes written (1..10). */
size_t histd_wire_put_varint(uint8_t *out, uint64_t v);

/* Bytes a varint of v takes. */
size_t histd_wire_varint_size(uint64_t v);

/* Writes the key and length of a length-delimited field (wire type 2);
 * returns the bytes written (at most 2 * HISTD_WIRE_VARINT_MAX). */
size_t histd_wire_put_len_key(uint8_t *out, uint32_t field, uint64_t len);

/* Writes the seq field (field 1, varint) of a Message; returns the bytes
 * written (at most 1 + HISTD_WIRE_VARINT_MAX). */
size_t histd_wire_put_seq(uint8_t *out, uint64_t seq);

/* Returns a malloc'ed copy of a packed Message (packed with seq 0) with the
 * seq field in front, and its length in *out_len; NULL if out of memory.
 * The caller frees it with free(). */
uint8_t *histd_wire_with_seq(uint64_t seq, const uint8_t *data, size_t len,
			     size_t *out_len);

/* Microseconds since the Unix epoch (CLOCK_REALTIME). */
int64_t histd_now_us(void);

/* Microseconds of CLOCK_MONOTONIC, for intervals. */
int64_t histd_mono_us(void);

/*
 * Unpacks stored bytes as a message of d into *out, through alloc (NULL:
 * malloc and free, as protobuf-c's default). protobuf-c answers NULL both
 * for bytes that do not decode and when memory runs out; this tells them
 * apart: 0, ENOMEM, or ECORRUPT "<what> does not decode" (what: a printf
 * format and its arguments).
 */
int histd_unpack_stored(const ProtobufCMessageDescriptor *d,
			ProtobufCAllocator *alloc, const uint8_t *data,
			size_t len, void *out, const char *what, ...)
	__attribute__((format(printf, 6, 7)));

#endif
