/*
 * gRPC server reflection (grpc.reflection.v1 and v1alpha, one wire
 * format), so that grpcurl, grpcui and Postman work without a .proto file.
 *
 * The descriptors served are the descriptor set built from our .proto
 * files and their imports at build time and embedded in the binary
 * (proto/embed.cmake). Answered: list_services, file_by_filename,
 * file_containing_symbol (with transitive dependencies); the rest gets an
 * error_response NOT_FOUND / UNIMPLEMENTED inside the stream.
 */
#ifndef HISTD_REFLECTION_H
#define HISTD_REFLECTION_H

#include <stddef.h>
#include <stdint.h>

typedef struct histd_reflection histd_reflection;

/* Indexes the embedded descriptor set. 0, or ENOMEM / EINTERNAL. */
int histd_reflection_new(histd_reflection **out);
void histd_reflection_free(histd_reflection *r);

/*
 * Answers one packed ServerReflectionRequest with a packed
 * ServerReflectionResponse (*out malloc'ed, the caller frees). Returns 0, or
 * EINVALID if the request does not decode (the stream then ends with
 * INVALID_ARGUMENT). Thread-safe.
 */
int histd_reflection_answer(histd_reflection *r, const uint8_t *req,
			    size_t len, uint8_t **out, size_t *out_len);

#endif
