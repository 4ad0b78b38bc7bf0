/*
 * The integration harness: see harness.h.
 */
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

static const char *histd_bin;

/* Servers started and not yet freed: a failed assertion leaves a test
 * before it stops its server, so the exit handler cleans up after it. */
#define MAX_LIVE 32
static histd_proc *live[MAX_LIVE];

static void live_add(histd_proc *p)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (!live[i]) {
			live[i] = p;
			return;
		}
}

static void live_remove(histd_proc *p)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (live[i] == p)
			live[i] = NULL;
}

static void cleanup_at_exit(void)
{
	for (int i = 0; i < MAX_LIVE; i++)
		if (live[i])
			harness_free(live[i]);
}

int harness_init(int argc, char **argv)
{
	histd_bin = argc > 1 ? argv[1] : getenv("HISTD_BIN");
	if (!histd_bin || access(histd_bin, X_OK) != 0) {
		fprintf(stderr, "usage: %s HISTD_BINARY (or set HISTD_BIN)\n",
			argv[0]);
		return -1;
	}
	/* A server that died under us must not kill the test with SIGPIPE. */
	signal(SIGPIPE, SIG_IGN);
	atexit(cleanup_at_exit);
	return 0;
}

int64_t t_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

void harness_dump_log(const histd_proc *p)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/histd.log", p->dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	fprintf(stderr, "---- histd log (%s) ----\n", path);
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		fwrite(buf, 1, n, stderr);
	fprintf(stderr, "---- end of histd log ----\n");
	fclose(f);
}

/* Reads the port file: a number and a newline once complete. */
static int read_port(const char *dir)
{
	char path[256], buf[32];
	snprintf(path, sizeof(path), "%s/port", dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0 || buf[n - 1] != '\n')
		return 0;
	buf[n] = '\0';
	int port = atoi(buf);
	return port > 0 && port < 65536 ? port : 0;
}

int harness_start(histd_proc **out, const char *const *extra)
{
	*out = NULL;
	histd_proc *p = calloc(1, sizeof(*p));
	if (!p)
		return -1;
	snprintf(p->dir, sizeof(p->dir), "/tmp/histd-integ-XXXXXX");
	if (!mkdtemp(p->dir)) {
		perror("mkdtemp");
		free(p);
		return -1;
	}
	char port_file[256], log_file[256];
	snprintf(port_file, sizeof(port_file), "%s/port", p->dir);
	snprintf(log_file, sizeof(log_file), "%s/histd.log", p->dir);

	const char *argv[64];
	size_t n = 0;
	argv[n++] = histd_bin;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--port-file";
	argv[n++] = port_file;
	argv[n++] = "--driver";
	argv[n++] = "memory";
	/* Without keys of its own, a test server runs without auth. */
	int keys = 0;
	for (size_t i = 0; extra && extra[i]; i++)
		keys |= strncmp(extra[i], "--api-keys-file", 15) == 0;
	if (!keys)
		argv[n++] = "--auth-disabled";
	for (size_t i = 0; extra && extra[i] && n < 63; i++)
		argv[n++] = extra[i];
	argv[n] = NULL;

	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		harness_free(p);
		return -1;
	}
	if (pid == 0) {
		/* Die with the test, whatever kills it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		int fd = open(log_file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
			close(fd);
		}
		signal(SIGPIPE, SIG_DFL);
		execv(histd_bin, (char *const *)argv);
		perror("execv");
		_exit(127);
	}
	p->pid = pid;

	int64_t give_up = t_now_ms() + 30000;
	while (t_now_ms() < give_up) {
		p->port = read_port(p->dir);
		if (p->port)
			break;
		int status;
		if (waitpid(pid, &status, WNOHANG) == pid) {
			fprintf(stderr, "histd exited before listening (status %d)\n",
				WIFEXITED(status) ? WEXITSTATUS(status) : -1);
			p->pid = 0;
			harness_dump_log(p);
			harness_free(p);
			return -1;
		}
		sleep_ms(10);
	}
	if (!p->port) {
		fprintf(stderr, "histd wrote no port file within 30 s\n");
		harness_signal_wait(p, SIGKILL, 5000);
		harness_dump_log(p);
		harness_free(p);
		return -1;
	}
	snprintf(p->target, sizeof(p->target), "127.0.0.1:%d", p->port);
	live_add(p);
	*out = p;
	return 0;
}

int harness_signal_wait(histd_proc *p, int sig, int timeout_ms)
{
	if (!p->pid)
		return -1;
	kill(p->pid, sig);
	int64_t give_up = t_now_ms() + timeout_ms;
	int status;
	for (;;) {
		pid_t r = waitpid(p->pid, &status, WNOHANG);
		if (r == p->pid)
			break;
		if (r < 0 && errno != EINTR) {
			p->pid = 0;
			return -1;
		}
		if (t_now_ms() >= give_up) {
			kill(p->pid, SIGKILL);
			waitpid(p->pid, &status, 0);
			p->pid = 0;
			return -1;
		}
		sleep_ms(5);
	}
	p->pid = 0;
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

void harness_free(histd_proc *p)
{
	if (!p)
		return;
	live_remove(p);
	if (p->pid)
		harness_signal_wait(p, SIGKILL, 5000);
	char path[256];
	snprintf(path, sizeof(path), "%s/port", p->dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/histd.log", p->dir);
	unlink(path);
	rmdir(p->dir);
	free(p);
}

int harness_stop(histd_proc *p)
{
	if (!p)
		return 0;
	int64_t t0 = t_now_ms();
	int rc = harness_signal_wait(p, SIGTERM, 60000);
	if (rc != 0) {
		fprintf(stderr, "histd did not exit 0 on SIGTERM: %d after %lld ms\n",
			rc, (long long)(t_now_ms() - t0));
		harness_dump_log(p);
	}
	harness_free(p);
	return rc == 0 ? 0 : -1;
}

int harness_log_has(const histd_proc *p, const char *needle)
{
	char path[256], line[4096];
	int found = 0;
	snprintf(path, sizeof(path), "%s/histd.log", p->dir);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

histd_client *harness_client(const histd_proc *p)
{
	return harness_client_key(p, NULL);
}

histd_client *harness_client_key(const histd_proc *p, const char *key)
{
	histd_client *c = NULL;
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	char bearer[256];
	const char *md[] = { "authorization", bearer, NULL };
	/* Replays of big sessions may exceed gRPC's 4 MiB default. */
	opt.max_receive_message_bytes = -1;
	if (key) {
		snprintf(bearer, sizeof(bearer), "Bearer %s", key);
		opt.metadata_kv = md;   /* copied by open */
	}
	assert_int_equal(histd_client_open_ex(p->target, &opt, &c), 0);
	assert_non_null(c);
	return c;
}

/* ------------------------------------------------------------------------
 * Arena */

struct tarena {
	void **blocks;
	size_t n, cap;
};

tarena *ta_new(void)
{
	tarena *a = calloc(1, sizeof(*a));
	if (!a)
		abort();
	return a;
}

void ta_free(tarena *a)
{
	if (!a)
		return;
	for (size_t i = 0; i < a->n; i++)
		free(a->blocks[i]);
	free(a->blocks);
	free(a);
}

void *ta_alloc(tarena *a, size_t size)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? 2 * a->cap : 64;
		void **b = realloc(a->blocks, cap * sizeof(*b));
		if (!b)
			abort();
		a->blocks = b;
		a->cap = cap;
	}
	void *p = calloc(1, size ? size : 1);
	if (!p)
		abort();
	a->blocks[a->n++] = p;
	return p;
}

char *ta_strdup(tarena *a, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = ta_alloc(a, n);
	memcpy(d, s, n);
	return d;
}

char *ta_printf(tarena *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	char *s = ta_alloc(a, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(s, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return s;
}

/* ------------------------------------------------------------------------
 * Message builders */

static Histd__V1__Message *new_message(tarena *a, Histd__V1__Role role,
				       Histd__V1__ContentBlock *block)
{
	Histd__V1__Message *m = ta_alloc(a, sizeof(*m));
	histd__v1__message__init(m);
	m->role = role;
	m->n_content = 1;
	m->content = ta_alloc(a, sizeof(*m->content));
	m->content[0] = block;
	return m;
}

static Histd__V1__ContentBlock *text_block(tarena *a, const char *text)
{
	Histd__V1__TextBlock *t = ta_alloc(a, sizeof(*t));
	histd__v1__text_block__init(t);
	t->text = ta_strdup(a, text);
	Histd__V1__ContentBlock *b = ta_alloc(a, sizeof(*b));
	histd__v1__content_block__init(b);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT;
	b->text = t;
	return b;
}

Histd__V1__Message *tm_text(tarena *a, Histd__V1__Role role, const char *text)
{
	return new_message(a, role, text_block(a, text));
}

Histd__V1__Message *tm_tool_call(tarena *a, const char *id, const char *name,
				 const char *arguments)
{
	Histd__V1__ToolCallBlock *t = ta_alloc(a, sizeof(*t));
	histd__v1__tool_call_block__init(t);
	t->id = ta_strdup(a, id);
	t->name = ta_strdup(a, name);
	t->arguments = ta_strdup(a, arguments);
	Histd__V1__ContentBlock *b = ta_alloc(a, sizeof(*b));
	histd__v1__content_block__init(b);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL;
	b->tool_call = t;
	return new_message(a, HISTD__V1__ROLE__ROLE_ASSISTANT, b);
}

Histd__V1__Message *tm_tool_result(tarena *a, const char *call_id,
				   const char *name, const char *text)
{
	Histd__V1__ToolResultBlock *t = ta_alloc(a, sizeof(*t));
	histd__v1__tool_result_block__init(t);
	t->tool_call_id = ta_strdup(a, call_id);
	t->tool_name = ta_strdup(a, name);
	t->n_content = 1;
	t->content = ta_alloc(a, sizeof(*t->content));
	t->content[0] = text_block(a, text);
	Histd__V1__ContentBlock *b = ta_alloc(a, sizeof(*b));
	histd__v1__content_block__init(b);
	b->block_case = HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT;
	b->tool_result = t;
	return new_message(a, HISTD__V1__ROLE__ROLE_TOOL, b);
}

Histd__V1__Message **tm_texts(tarena *a, size_t n, const char *prefix)
{
	Histd__V1__Message **v = ta_alloc(a, n * sizeof(*v));
	for (size_t i = 0; i < n; i++)
		v[i] = tm_text(a, HISTD__V1__ROLE__ROLE_USER,
			       ta_printf(a, "%s %zu", prefix, i));
	return v;
}

/* Every string map entry of the API is { base, key, value }. */
struct string_entry {
	ProtobufCMessage base;
	char *key;
	char *value;
};

void *tm_entry(tarena *a, const ProtobufCMessageDescriptor *d,
	       const char *key, const char *value)
{
	assert_int_equal(d->sizeof_message, sizeof(struct string_entry));
	struct string_entry *e = ta_alloc(a, sizeof(*e));
	protobuf_c_message_init(d, e);
	e->key = ta_strdup(a, key);
	e->value = ta_strdup(a, value);
	return e;
}

const char *tm_first_text(const Histd__V1__Message *m)
{
	if (m && m->n_content > 0 &&
	    m->content[0]->block_case == HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT)
		return m->content[0]->text->text;
	return "";
}

/* ------------------------------------------------------------------------
 * Calls */

void t_print_status(const char *what, const histd_status *st)
{
	fprintf(stderr, "%s: %s \"%s\"", what, histd_status_code_name(st->code),
		st->details ? st->details : "");
	for (size_t i = 0; i < st->n_trailers; i++)
		fprintf(stderr, " [%s=%s]", st->trailers[i].key,
			st->trailers[i].value);
	fprintf(stderr, "\n");
}

int t_call(histd_client *c, const char *name, const void *req,
	   const ProtobufCMessageDescriptor *resp_desc, void *resp_out,
	   histd_status *st)
{
	char path[128];
	snprintf(path, sizeof(path), "/histd.v1.HistoryService/%s", name);
	return histd_client_unary(c, path, req, resp_desc, T_TIMEOUT_MS, NULL,
				  (ProtobufCMessage **)resp_out, st);
}

char *t_create_session(histd_client *c, const char *id)
{
	Histd__V1__CreateSessionRequest req = HISTD__V1__CREATE_SESSION_REQUEST__INIT;
	if (id)
		req.session_id = (char *)id;
	Histd__V1__Session *s = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(c, "CreateSession", &req, &histd__v1__session__descriptor, &s,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	char *out = strdup(s->id);
	assert_non_null(out);
	histd_client_message_free(&s->base);
	return out;
}

grpc_status_code t_append_texts(histd_client *c, const char *session_id,
				size_t n, const char *prefix,
				uint64_t expected_revision,
				Histd__V1__AppendResponse **out)
{
	tarena *a = ta_new();
	Histd__V1__AppendRequest req = HISTD__V1__APPEND_REQUEST__INIT;
	req.session_id = (char *)session_id;
	req.n_messages = n;
	req.messages = tm_texts(a, n, prefix);
	req.expected_revision = expected_revision;
	Histd__V1__AppendResponse *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(c, "Append", &req, &histd__v1__append_response__descriptor,
	       &resp, &st);
	grpc_status_code code = st.code;
	if (out)
		*out = resp;
	else if (resp)
		histd_client_message_free(&resp->base);
	histd_status_reset(&st);
	ta_free(a);
	return code;
}

void t_try_get_raw(histd_client *c, const char *session_id,
		   uint64_t after_seq, uint32_t limit,
		   Histd__V1__GetMessagesResponse **out, histd_status *st)
{
	Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	req.session_id = (char *)session_id;
	req.view = HISTD__V1__VIEW__VIEW_RAW;
	req.after_seq = after_seq;
	req.limit = limit;
	*out = NULL;
	t_call(c, "GetMessages", &req,
	       &histd__v1__get_messages_response__descriptor, out, st);
	if (st->code != GRPC_STATUS_OK && *out) {
		histd_client_message_free(&(*out)->base);
		*out = NULL;
	}
}

Histd__V1__GetMessagesResponse *t_get_raw(histd_client *c,
					  const char *session_id,
					  uint64_t after_seq, uint32_t limit)
{
	Histd__V1__GetMessagesResponse *resp;
	histd_status st;
	histd_status_init(&st);
	t_try_get_raw(c, session_id, after_seq, limit, &resp, &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	return resp;
}

Histd__V1__Session *t_get_session(histd_client *c, const char *session_id)
{
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	req.session_id = (char *)session_id;
	Histd__V1__Session *resp = NULL;
	histd_status st;
	histd_status_init(&st);
	t_call(c, "GetSession", &req, &histd__v1__session__descriptor, &resp,
	       &st);
	assert_status(&st, GRPC_STATUS_OK);
	histd_status_reset(&st);
	return resp;
}

histd_client_stream *t_subscribe(histd_client *c, const char *session_id,
				 uint64_t after_seq)
{
	Histd__V1__SubscribeRequest req = HISTD__V1__SUBSCRIBE_REQUEST__INIT;
	req.session_id = (char *)session_id;
	req.after_seq = after_seq;
	histd_client_stream *s = NULL;
	assert_int_equal(histd_client_stream_open(c, HISTD_PATH("Subscribe"),
						  &req.base, 0, &s),
			 0);
	return s;
}

Histd__V1__HistoryEvent *t_next_event(histd_client_stream *s, int timeout_ms,
				      int *result)
{
	ProtobufCMessage *m = NULL;
	int r = histd_client_stream_next(s, &histd__v1__history_event__descriptor,
					 timeout_ms, &m);
	assert_true(r >= 0);
	if (result)
		*result = r;
	return (Histd__V1__HistoryEvent *)m;
}
