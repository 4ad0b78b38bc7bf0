#include "svc_calls.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "histd/v1/histd.pb-c.h"

static histd_service *svc;
static const histd_caller *who;

void
ut_use(histd_service *s, const histd_caller *w)
{
	svc = s;
	who = w;
}

int
ut_call(enum histd_method m, const ProtobufCMessage *req,
	const ProtobufCMessageDescriptor *rd, void **resp)
{
	size_t n = protobuf_c_message_get_packed_size(req);
	uint8_t *buf = malloc(n ? n : 1);
	histd_reply reply = { 0 };
	int rc;

	assert_non_null(buf);
	protobuf_c_message_pack(req, buf);
	rc = histd_service_unary(svc, m, who, buf, n, &reply);
	free(buf);
	if (resp)
		*resp = NULL;
	if (!rc && resp) {
		*resp = protobuf_c_message_unpack(rd, NULL, reply.len,
						  reply.data);
		assert_non_null(*resp);
	}
	free(reply.data);
	return rc;
}

#define MAX_PLUGINS 8
#define MAX_OPTIONS 8       /* per plugin */

int
ut_create(const char *id, const char *const *plugins)
{
	Histd__V1__CreateSessionRequest r =
		HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	Histd__V1__SessionConfig c = HISTD__V1__SESSION_CONFIG__INIT;
	Histd__V1__Pipeline pl = HISTD__V1__PIPELINE__INIT;
	Histd__V1__PluginConfig pc[MAX_PLUGINS], *pcs[MAX_PLUGINS];
	Histd__V1__PluginConfig__OptionsEntry e[MAX_PLUGINS * MAX_OPTIONS];
	Histd__V1__PluginConfig__OptionsEntry *ep[MAX_PLUGINS][MAX_OPTIONS];
	size_t n = 0, ne = 0;

	r.session_id = (char *)id;
	if (plugins) {
		for (size_t i = 0; plugins[i]; i += 3) {
			Histd__V1__PluginConfig *p;

			if (i == 0 || strcmp(plugins[i], plugins[i - 3])) {
				assert_true(n < MAX_PLUGINS);
				histd__v1__plugin_config__init(&pc[n]);
				pc[n].name = (char *)plugins[i];
				pc[n].options = ep[n];
				pcs[n] = &pc[n];
				n++;
			}
			if (!plugins[i + 1])
				continue;
			p = &pc[n - 1];
			assert_true(p->n_options < MAX_OPTIONS);
			histd__v1__plugin_config__options_entry__init(&e[ne]);
			e[ne].key = (char *)plugins[i + 1];
			e[ne].value = (char *)plugins[i + 2];
			p->options[p->n_options++] = &e[ne++];
		}
		pl.plugins = pcs;
		pl.n_plugins = n;
		c.pipeline = &pl;
		r.config = &c;
	}
	return ut_call(HISTD_M_CREATE_SESSION, &r.base, NULL, NULL);
}

void
ut_free_msg(void *m)
{
	if (m)
		protobuf_c_message_free_unpacked(m, NULL);
}
