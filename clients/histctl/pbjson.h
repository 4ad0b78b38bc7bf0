/*
 * protobuf-c messages <-> JSON (jansson), driven by the message descriptors.
 *
 * The mapping is proto3's JSON mapping with the proto field names
 * (session_id, not sessionId) on output:
 *   - 64-bit integers are strings, 32-bit ones numbers;
 *   - enums are their value names ("ROLE_USER");
 *   - bytes are base64;
 *   - map fields are objects; google.protobuf.Timestamp is an RFC 3339
 *     string in UTC;
 *   - fields at their default value are left out (empty strings, 0,
 *     empty repeated fields, unset messages), except a set oneof member.
 *
 * Input is more forgiving, so that people can write it by hand: field names
 * in snake_case or lowerCamelCase; integers as numbers or strings; an enum
 * as its full name, its number, or the part after the prefix in any case
 * ("user", "assistant", "openai-chat" for FORMAT_OPENAI_CHAT).
 *
 * Not thread-specific; no global state.
 */
#ifndef HISTCTL_PBJSON_H
#define HISTCTL_PBJSON_H

#include <stddef.h>

#include <jansson.h>
#include <protobuf-c/protobuf-c.h>

/* A new JSON object for msg (a new reference, the caller's), or NULL when
 * out of memory. msg is borrowed. */
json_t *histctl_pb_to_json(const ProtobufCMessage *msg);

/*
 * Decodes json as a message of type desc. Returns 0 with *out set: a
 * message allocated with protobuf-c's default allocator, the caller's, freed
 * with protobuf_c_message_free_unpacked(*out, NULL). On failure returns -1,
 * *out is NULL and err (of size errlen) holds one line naming the field
 * path ("messages[0].role: unknown value \"robot\"").
 */
int histctl_pb_from_json(const ProtobufCMessageDescriptor *desc,
			 const json_t *json, ProtobufCMessage **out,
			 char *err, size_t errlen);

/* The value of enum desc that text names, with the same forgiving rules as
 * the decoder. Returns 0 with *value set, or -1 if text names none. */
int histctl_enum_parse(const ProtobufCEnumDescriptor *desc, const char *text,
		       int *value);

/* The short lower-case name of an enum value: "user" for ROLE_USER (the
 * part after the prefix every value shares), or the full name if the
 * value has no such prefix; "?" for an unknown value. Written into buf. */
const char *histctl_enum_short(const ProtobufCEnumDescriptor *desc, int value,
			       char *buf, size_t buflen);

#endif
