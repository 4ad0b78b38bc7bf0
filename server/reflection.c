#include "reflection.h"

#include <grpc/status.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google/protobuf/descriptor.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "histd_error.h"

extern const unsigned char histd_descriptor_set[];
extern const size_t histd_descriptor_set_len;

/* What a client may call here: the services list_services names. */
static const char *const served[] = {
	"histd.v1.HistoryService",
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
};
#define N_SERVED (sizeof(served) / sizeof(served[0]))

struct file {
	const char *name;
	uint8_t *bytes;           /* the packed FileDescriptorProto */
	size_t len;
	size_t *deps;             /* indexes of the files it imports */
	size_t n_deps;
};

struct symbol {
	char *name;               /* fully qualified, no leading dot */
	size_t file;
};

struct histd_reflection {
	Google__Protobuf__FileDescriptorSet *set;
	struct file *files;
	size_t n_files;
	struct symbol *syms;
	size_t n_syms, cap_syms;
};

static int
add_symbol(histd_reflection *r, const char *scope, const char *name,
	   size_t file)
{
	size_t len = strlen(scope) + strlen(name) + 2;
	char *full = malloc(len);

	if (!full)
		return HISTD_ENOMEM;
	if (*scope)
		snprintf(full, len, "%s.%s", scope, name);
	else
		snprintf(full, len, "%s", name);
	if (r->n_syms == r->cap_syms) {
		size_t cap = r->cap_syms ? r->cap_syms * 2 : 64;
		struct symbol *v = realloc(r->syms, cap * sizeof(*v));

		if (!v) {
			free(full);
			return HISTD_ENOMEM;
		}
		r->syms = v;
		r->cap_syms = cap;
	}
	r->syms[r->n_syms++] = (struct symbol){ full, file };
	return 0;
}

static int
add_message(histd_reflection *r, const char *scope,
	    const Google__Protobuf__DescriptorProto *m, size_t file)
{
	char *inner;
	size_t len;
	int rc;

	if ((rc = add_symbol(r, scope, m->name, file)))
		return rc;
	len = strlen(scope) + strlen(m->name) + 2;
	if (!(inner = malloc(len)))
		return HISTD_ENOMEM;
	snprintf(inner, len, "%s%s%s", scope, *scope ? "." : "", m->name);
	for (size_t i = 0; i < m->n_nested_type && !rc; i++)
		rc = add_message(r, inner, m->nested_type[i], file);
	for (size_t i = 0; i < m->n_enum_type && !rc; i++)
		rc = add_symbol(r, inner, m->enum_type[i]->name, file);
	free(inner);
	return rc;
}

static int
sym_cmp(const void *a, const void *b)
{
	return strcmp(((const struct symbol *)a)->name,
		      ((const struct symbol *)b)->name);
}

static int
find_file(const histd_reflection *r, const char *name, size_t *out)
{
	for (size_t i = 0; i < r->n_files; i++)
		if (strcmp(r->files[i].name, name) == 0) {
			*out = i;
			return 1;
		}
	return 0;
}

static int
index_file(histd_reflection *r, size_t i)
{
	const Google__Protobuf__FileDescriptorProto *f = r->set->file[i];
	const char *pkg = f->package ? f->package : "";
	struct file *fl = &r->files[i];
	int rc = 0;

	fl->name = f->name;
	fl->len = google__protobuf__file_descriptor_proto__get_packed_size(f);
	if (!(fl->bytes = malloc(fl->len ? fl->len : 1)))
		return HISTD_ENOMEM;
	google__protobuf__file_descriptor_proto__pack(f, fl->bytes);
	for (size_t k = 0; k < f->n_message_type && !rc; k++)
		rc = add_message(r, pkg, f->message_type[k], i);
	for (size_t k = 0; k < f->n_enum_type && !rc; k++)
		rc = add_symbol(r, pkg, f->enum_type[k]->name, i);
	for (size_t k = 0; k < f->n_service && !rc; k++) {
		const Google__Protobuf__ServiceDescriptorProto *s = f->service[k];
		size_t len = strlen(pkg) + strlen(s->name) + 2;
		char *full = malloc(len);

		if (!full)
			return HISTD_ENOMEM;
		snprintf(full, len, "%s%s%s", pkg, *pkg ? "." : "", s->name);
		rc = add_symbol(r, pkg, s->name, i);
		for (size_t m = 0; m < s->n_method && !rc; m++)
			rc = add_symbol(r, full, s->method[m]->name, i);
		free(full);
	}
	return rc;
}

int
histd_reflection_new(histd_reflection **out)
{
	histd_reflection *r = calloc(1, sizeof(*r));
	int rc = 0;

	if (!r)
		return histd_error_set(HISTD_ENOMEM, "out of memory");
	r->set = google__protobuf__file_descriptor_set__unpack(
		NULL, histd_descriptor_set_len, histd_descriptor_set);
	if (!r->set) {
		free(r);
		return histd_error_set(HISTD_EINTERNAL,
				       "the embedded descriptor set does not decode");
	}
	r->n_files = r->set->n_file;
	if (!(r->files = calloc(r->n_files ? r->n_files : 1, sizeof(*r->files))))
		rc = HISTD_ENOMEM;
	for (size_t i = 0; i < r->n_files && !rc; i++)
		rc = index_file(r, i);
	/* Dependencies by index, once all names are known. */
	for (size_t i = 0; i < r->n_files && !rc; i++) {
		const Google__Protobuf__FileDescriptorProto *f = r->set->file[i];
		struct file *fl = &r->files[i];

		fl->deps = calloc(f->n_dependency ? f->n_dependency : 1,
				  sizeof(*fl->deps));
		if (!fl->deps) {
			rc = HISTD_ENOMEM;
			break;
		}
		for (size_t k = 0; k < f->n_dependency; k++)
			if (find_file(r, f->dependency[k], &fl->deps[fl->n_deps]))
				fl->n_deps++;
	}
	if (rc) {
		histd_reflection_free(r);
		return histd_error_set(rc, "out of memory");
	}
	qsort(r->syms, r->n_syms, sizeof(*r->syms), sym_cmp);
	*out = r;
	return 0;
}

void
histd_reflection_free(histd_reflection *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->n_files; i++) {
		free(r->files[i].bytes);
		free(r->files[i].deps);
	}
	for (size_t i = 0; i < r->n_syms; i++)
		free(r->syms[i].name);
	free(r->syms);
	free(r->files);
	if (r->set)
		google__protobuf__file_descriptor_set__free_unpacked(r->set, NULL);
	free(r);
}

/* The file declaring a symbol; for "pkg.Service.Method" or
 * "pkg.Message.field" the enclosing name is tried as well. */
static int
find_symbol(const histd_reflection *r, const char *name, size_t *file)
{
	char buf[512];
	size_t len = strlen(name);

	if (len >= sizeof(buf))
		return 0;
	memcpy(buf, name, len + 1);
	for (int tries = 0; tries < 2; tries++) {
		struct symbol key = { buf, 0 };
		struct symbol *hit = bsearch(&key, r->syms, r->n_syms,
					     sizeof(*r->syms), sym_cmp);
		char *dot;

		if (hit) {
			*file = hit->file;
			return 1;
		}
		if (!(dot = strrchr(buf, '.')))
			break;
		*dot = '\0';
	}
	return 0;
}

/* The file and everything it imports, each once, the file first. */
static void
collect(const histd_reflection *r, size_t f, char *seen, size_t *order,
	size_t *n)
{
	if (seen[f])
		return;
	seen[f] = 1;
	order[(*n)++] = f;
	for (size_t k = 0; k < r->files[f].n_deps; k++)
		collect(r, r->files[f].deps[k], seen, order, n);
}

int
histd_reflection_answer(histd_reflection *r, const uint8_t *req, size_t len,
			uint8_t **out, size_t *out_len)
{
	Grpc__Reflection__V1__ServerReflectionRequest *q;
	Grpc__Reflection__V1__ServerReflectionResponse resp =
		GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
	Grpc__Reflection__V1__FileDescriptorResponse fdr =
		GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
	Grpc__Reflection__V1__ListServiceResponse lsr =
		GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
	Grpc__Reflection__V1__ServiceResponse svc[N_SERVED];
	Grpc__Reflection__V1__ServiceResponse *svcp[N_SERVED];
	Grpc__Reflection__V1__ErrorResponse err =
		GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
	ProtobufCBinaryData *fds = NULL;
	size_t *order = NULL, n_order = 0, file = 0;
	char *seen = NULL;
	int rc = 0;

	q = grpc__reflection__v1__server_reflection_request__unpack(NULL, len, req);
	if (!q)
		return histd_error_set(HISTD_EINVALID, "request does not decode "
				       "as grpc.reflection.v1.ServerReflectionRequest");
	resp.valid_host = q->host;
	resp.original_request = q;

	switch (q->message_request_case) {
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
		for (size_t i = 0; i < N_SERVED; i++) {
			grpc__reflection__v1__service_response__init(&svc[i]);
			svc[i].name = (char *)served[i];
			svcp[i] = &svc[i];
		}
		lsr.n_service = N_SERVED;
		lsr.service = svcp;
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
		resp.list_services_response = &lsr;
		break;
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL: {
		int found = q->message_request_case ==
			GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME ?
			find_file(r, q->file_by_filename, &file) :
			find_symbol(r, q->file_containing_symbol, &file);

		if (!found) {
			err.error_code = GRPC_STATUS_NOT_FOUND;
			err.error_message = q->message_request_case ==
				GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME ?
				"file not found" : "symbol not found";
			resp.message_response_case =
				GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
			resp.error_response = &err;
			break;
		}
		seen = calloc(r->n_files, 1);
		order = calloc(r->n_files, sizeof(*order));
		fds = calloc(r->n_files, sizeof(*fds));
		if (!seen || !order || !fds) {
			rc = histd_error_set(HISTD_ENOMEM, "out of memory");
			goto out;
		}
		collect(r, file, seen, order, &n_order);
		for (size_t i = 0; i < n_order; i++) {
			fds[i].data = r->files[order[i]].bytes;
			fds[i].len = r->files[order[i]].len;
		}
		fdr.n_file_descriptor_proto = n_order;
		fdr.file_descriptor_proto = fds;
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
		resp.file_descriptor_response = &fdr;
		break;
	}
	default:
		err.error_code = GRPC_STATUS_UNIMPLEMENTED;
		err.error_message = "not supported: histd defines no extensions";
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
		resp.error_response = &err;
		break;
	}

	*out_len = grpc__reflection__v1__server_reflection_response__get_packed_size(&resp);
	if (!(*out = malloc(*out_len ? *out_len : 1))) {
		rc = histd_error_set(HISTD_ENOMEM, "out of memory");
		goto out;
	}
	grpc__reflection__v1__server_reflection_response__pack(&resp, *out);
out:
	free(seen);
	free(order);
	free(fds);
	grpc__reflection__v1__server_reflection_request__free_unpacked(q, NULL);
	return rc;
}
