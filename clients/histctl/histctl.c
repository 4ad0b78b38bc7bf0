/*
 * histctl: a command line client of histd on gRPC C core (clients/client.h).
 *
 * One process makes one channel and runs one command. Output is meant for
 * people by default (one id per line, or a table) and for programs with
 * --json (proto3 JSON, pbjson.h). Errors are one line on stderr and an exit
 * code from a fixed table (usage text), so that scripts can branch on "not
 * found" or "conflict" without parsing messages.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <jansson.h>

#include "client.h"
#include "grpc/health/v1/health.pb-c.h"
#include "histd/v1/histd.pb-c.h"
#include "pbjson.h"

#define HISTCTL_VERSION "0.1.0"
#define DEFAULT_TARGET "127.0.0.1:50051"

/* Exit codes: part of the interface, listed in the usage text. */
enum {
	EXIT_OKAY = 0,
	EXIT_ERROR = 1,        /* internal, unknown, local I/O */
	EXIT_USAGE = 2,
	EXIT_NOTFOUND = 3,
	EXIT_EXISTS = 4,
	EXIT_CONFLICT = 5,     /* ABORTED (revision), FAILED_PRECONDITION */
	EXIT_INVALID = 6,      /* INVALID_ARGUMENT, OUT_OF_RANGE, bad input */
	EXIT_UNAVAILABLE = 7,  /* UNAVAILABLE, DEADLINE_EXCEEDED, not serving */
	EXIT_AUTH = 8,         /* UNAUTHENTICATED, PERMISSION_DENIED */
	EXIT_LIMIT = 9,        /* RESOURCE_EXHAUSTED */
	EXIT_UNIMPLEMENTED = 10,
	EXIT_DATALOSS = 11,
};

/* The usage text: USAGE_HEAD, each command's lines (COMMANDS), USAGE_TAIL. */
static const char USAGE_HEAD[] =
"usage: histctl [--target ADDR] [--token KEY] [--timeout SEC] [--json]\n"
"               [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE]\n"
"               COMMAND [ARGS]\n"
"\n"
"A command line client of histd, the conversation history service.\n"
"A command refuses an option it does not list here (exit 2).\n";

static const char USAGE_TAIL[] =
"\n"
"Formats: anthropic-messages, openai-chat, openai-responses, gemini,\n"
"mistral. Roles: system, user, assistant, tool. Search modes: lexical,\n"
"semantic, hybrid.\n"
"\n"
"Options (anywhere on the line, with every command):\n"
"  --target ADDR   server address (HISTD_TARGET; default " DEFAULT_TARGET ")\n"
"  --token KEY     API key, sent as 'authorization: Bearer KEY' (HISTD_TOKEN)\n"
"  --timeout SEC   deadline of each call, at most 86400 (default 30; 0: none;\n"
"                  not for tail -f)\n"
"  --json          print the response as JSON (proto field names)\n"
"  --tls           connect over TLS, trusting the system's CA certificates\n"
"  --tls-ca FILE   connect over TLS, trusting the PEM CA certificates in FILE\n"
"  --tls-cert FILE, --tls-key FILE\n"
"                  PEM client certificate and key (histd --tls-client-ca)\n"
"\n"
"Exit codes:\n"
"  0 ok                 6 invalid argument or input\n"
"  1 other error        7 unavailable, deadline exceeded, not serving\n"
"  2 usage              8 unauthenticated or permission denied\n"
"  3 not found          9 resource exhausted (a limit)\n"
"  4 already exists    10 unimplemented\n"
"  5 conflict (revision, idempotency key)   11 data loss\n";

typedef struct ctl {
	histd_client *client;
	int timeout_ms;
	int json;
	int wide;
} ctl;

static volatile sig_atomic_t stopping;

/* ------------------------------------------------------------------------
 * Errors and calls */

/* "histctl: [COMMAND: ]MESSAGE (histctl help[ COMMAND])" */
static int vusage_error(const char *command, const char *fmt, va_list ap)
{
	fputs("histctl: ", stderr);
	if (command)
		fprintf(stderr, "%s: ", command);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (histctl help%s%s)\n", command ? " " : "", command ? command : "");
	return EXIT_USAGE;
}

static int usage_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vusage_error(NULL, fmt, ap);
	va_end(ap);
	return EXIT_USAGE;
}

/* A usage error of one command, which names it. */
static int command_usage_error(const char *command, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vusage_error(command, fmt, ap);
	va_end(ap);
	return EXIT_USAGE;
}

static int status_exit(grpc_status_code code)
{
	switch (code) {
	case GRPC_STATUS_OK: return EXIT_OKAY;
	case GRPC_STATUS_NOT_FOUND: return EXIT_NOTFOUND;
	case GRPC_STATUS_ALREADY_EXISTS: return EXIT_EXISTS;
	case GRPC_STATUS_ABORTED:
	case GRPC_STATUS_FAILED_PRECONDITION: return EXIT_CONFLICT;
	case GRPC_STATUS_INVALID_ARGUMENT:
	case GRPC_STATUS_OUT_OF_RANGE: return EXIT_INVALID;
	case GRPC_STATUS_UNAVAILABLE:
	case GRPC_STATUS_DEADLINE_EXCEEDED:
	case GRPC_STATUS_CANCELLED: return EXIT_UNAVAILABLE;
	case GRPC_STATUS_UNAUTHENTICATED:
	case GRPC_STATUS_PERMISSION_DENIED: return EXIT_AUTH;
	case GRPC_STATUS_RESOURCE_EXHAUSTED: return EXIT_LIMIT;
	case GRPC_STATUS_UNIMPLEMENTED: return EXIT_UNIMPLEMENTED;
	case GRPC_STATUS_DATA_LOSS: return EXIT_DATALOSS;
	default: return EXIT_ERROR;
	}
}

static int report_status(const histd_status *st)
{
	const char *rev = histd_status_trailer(st, "histd-revision");
	fprintf(stderr, "histctl: %s: %s", histd_status_code_name(st->code),
		st->details && *st->details ? st->details : "(no message)");
	if (rev && st->code == GRPC_STATUS_ABORTED)
		fprintf(stderr, " (current revision %s)", rev);
	fputc('\n', stderr);
	return status_exit(st->code);
}

/* One unary call; on failure prints the status and returns its exit code. */
static int call(ctl *c, const char *method, const void *req,
		const ProtobufCMessageDescriptor *desc, void *resp)
{
	histd_status st;
	int rc;
	histd_status_init(&st);
	histd_client_unary(c->client, method, req, desc, c->timeout_ms, NULL,
			   (ProtobufCMessage **)resp, &st);
	rc = st.code == GRPC_STATUS_OK ? EXIT_OKAY : report_status(&st);
	histd_status_reset(&st);
	return rc;
}

static int print_json(const ProtobufCMessage *m, size_t flags)
{
	json_t *j = histctl_pb_to_json(m);
	if (!j) {
		fputs("histctl: out of memory\n", stderr);
		return EXIT_ERROR;
	}
	json_dumpf(j, stdout, flags | JSON_PRESERVE_ORDER);
	fputc('\n', stdout);
	json_decref(j);
	return EXIT_OKAY;
}

/* Builds a request from JSON assembled here (maps are easiest that way). */
static int request_from_json(const ProtobufCMessageDescriptor *desc, json_t *j,
			     ProtobufCMessage **out)
{
	char err[512];
	if (histctl_pb_from_json(desc, j, out, err, sizeof err) < 0) {
		fprintf(stderr, "histctl: %s\n", err);
		return EXIT_INVALID;
	}
	return EXIT_OKAY;
}

/* ------------------------------------------------------------------------
 * Arguments */

static int parse_u64(const char *s, const char *what, uint64_t *out)
{
	char *end;
	errno = 0;
	if (!s || *s == '-' || !*s) {
		usage_error("%s must be a non-negative integer", what);
		return -1;
	}
	*out = strtoull(s, &end, 10);
	if (errno || *end) {
		usage_error("%s must be a non-negative integer", what);
		return -1;
	}
	return 0;
}

static int parse_u32(const char *s, const char *what, uint32_t *out)
{
	uint64_t v;
	if (parse_u64(s, what, &v) < 0)
		return -1;
	if (v > UINT32_MAX) {
		usage_error("%s is too large", what);
		return -1;
	}
	*out = (uint32_t)v;
	return 0;
}

/* "K=V" into a JSON object (created on first use). */
static int add_kv(json_t **obj, const char *arg, const char *what)
{
	const char *eq = strchr(arg, '=');
	char *key;
	if (!eq || eq == arg) {
		usage_error("%s must be KEY=VALUE", what);
		return -1;
	}
	if (!*obj)
		*obj = json_object();
	key = strndup(arg, (size_t)(eq - arg));
	if (!*obj || !key || json_object_set_new(*obj, key, json_string(eq + 1)) < 0) {
		free(key);
		usage_error("%s must be KEY=VALUE in UTF-8", what);
		return -1;
	}
	free(key);
	return 0;
}

static int parse_enum(const ProtobufCEnumDescriptor *d, const char *s,
		      const char *what, int *out)
{
	if (histctl_enum_parse(d, s, out) < 0 || *out == 0) {
		usage_error("unknown %s '%s'", what, s);
		return -1;
	}
	return 0;
}

/* Reads a whole file ("-" is standard input). NUL-terminated; *len set. */
static char *read_all(const char *path, size_t *len)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
	char *buf = NULL;
	size_t n = 0, cap = 0;
	if (!f) {
		fprintf(stderr, "histctl: cannot open %s: %s\n", path, strerror(errno));
		return NULL;
	}
	for (;;) {
		size_t got;
		if (cap - n < 4096) {
			char *nb = realloc(buf, cap = cap ? cap * 2 : 65536);
			if (!nb) {
				free(buf);
				buf = NULL;
				fputs("histctl: out of memory\n", stderr);
				break;
			}
			buf = nb;
		}
		got = fread(buf + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0) {
			if (ferror(f)) {
				fprintf(stderr, "histctl: cannot read %s\n", path);
				free(buf);
				buf = NULL;
			}
			break;
		}
	}
	if (f != stdin)
		fclose(f);
	if (buf) {
		buf[n] = 0;
		*len = n;
	}
	return buf;
}

/*
 * Options. Every option may stand anywhere on the line, before or after the
 * command name, but a command takes only the global ones (OPT_GLOBAL) and
 * those its entry in COMMANDS lists: anything else is refused before any
 * call is made. So the line is read in two steps: collect_options() notes
 * every option as given, check_options() holds them against the command,
 * and only then apply_options() reads their values.
 */
enum { O_TARGET = 1000, O_TOKEN, O_TIMEOUT, O_JSON, O_HELP, O_KEY, O_LABEL,
       O_CONFIG, O_ID, O_LIMIT, O_REVISION, O_ROLE, O_AUTHOR, O_JSONIN,
       O_FILE, O_IDEM, O_VIEW, O_LAST, O_AFTER, O_WIDE, O_FORMAT,
       O_MAXTOK, O_MAXENT, O_OLDER, O_META, O_TLS, O_TLS_CA, O_TLS_CERT,
       O_TLS_KEY, O_LINES, O_FOLLOW, O_SESSION, O_MODE, O_TOOLRES,
       O_NONEWEST, O_END };

_Static_assert(O_END - O_TARGET <= 64, "an option set is a 64-bit mask");
#define OPT(o) (UINT64_C(1) << ((o) - O_TARGET))
#define OPT_GLOBAL (OPT(O_TARGET) | OPT(O_TOKEN) | OPT(O_TIMEOUT) | OPT(O_JSON) | \
		    OPT(O_HELP) | OPT(O_TLS) | OPT(O_TLS_CA) | OPT(O_TLS_CERT) | \
		    OPT(O_TLS_KEY))

static const struct option OPTIONS[] = {
	{ "target", required_argument, NULL, O_TARGET },
	{ "token", required_argument, NULL, O_TOKEN },
	{ "timeout", required_argument, NULL, O_TIMEOUT },
	{ "json", no_argument, NULL, O_JSON },
	{ "help", no_argument, NULL, O_HELP },
	{ "key", required_argument, NULL, O_KEY },
	{ "label", required_argument, NULL, O_LABEL },
	{ "config", required_argument, NULL, O_CONFIG },
	{ "id", required_argument, NULL, O_ID },
	{ "limit", required_argument, NULL, O_LIMIT },
	{ "revision", required_argument, NULL, O_REVISION },
	{ "role", required_argument, NULL, O_ROLE },
	{ "author", required_argument, NULL, O_AUTHOR },
	{ "json-input", no_argument, NULL, O_JSONIN },
	{ "file", required_argument, NULL, O_FILE },
	{ "idempotency-key", required_argument, NULL, O_IDEM },
	{ "view", required_argument, NULL, O_VIEW },
	{ "last", required_argument, NULL, O_LAST },
	{ "after", required_argument, NULL, O_AFTER },
	{ "wide", no_argument, NULL, O_WIDE },
	{ "format", required_argument, NULL, O_FORMAT },
	{ "max-tokens", required_argument, NULL, O_MAXTOK },
	{ "max-entries", required_argument, NULL, O_MAXENT },
	{ "older-than", required_argument, NULL, O_OLDER },
	{ "meta", required_argument, NULL, O_META },
	{ "tls", no_argument, NULL, O_TLS },
	{ "tls-ca", required_argument, NULL, O_TLS_CA },
	{ "tls-cert", required_argument, NULL, O_TLS_CERT },
	{ "tls-key", required_argument, NULL, O_TLS_KEY },
	{ "session", required_argument, NULL, O_SESSION },
	{ "mode", required_argument, NULL, O_MODE },
	{ "include-tool-results", no_argument, NULL, O_TOOLRES },
	{ "exclude-newest", no_argument, NULL, O_NONEWEST },
	{ NULL, 0, NULL, 0 },
};

/* Short options and the long ones they stand for (-n and -f have none). */
static const char SHORT_OPTIONS[] = ":n:fhjJ";
static const struct { char c; int opt; } SHORT[] = {
	{ 'n', O_LINES }, { 'f', O_FOLLOW }, { 'h', O_HELP }, { 'j', O_JSON },
	{ 'J', O_JSONIN },
};

/* One option as it stood on the line. */
typedef struct given {
	int opt;           /* O_*, or 0 when histctl has no such option */
	char shortname;    /* the letter if given as one, else 0 */
	int missing;       /* its value is missing */
	const char *arg;   /* its value (borrowed from argv), or NULL */
	const char *typed; /* the argument as typed (names an unknown one) */
} given;

/* Everything any command may be given. */
typedef struct args {
	given *given;    /* every option in the order given */
	int ngiven;
	const char *target, *token;
	const char *tls_ca, *tls_cert, *tls_key;
	int timeout_s, json, help, wide, json_input, follow, tls;
	int tool_results, exclude_newest;
	json_t *keys, *labels, *meta, *roles;
	const char *config, *id, *role, *author, *file, *idem, *view, *format;
	const char *session, *mode;
	uint64_t revision, after, max_tokens, older;
	uint32_t limit, last, max_entries, n;
	int has_limit, has_last, has_n;
	char **pos;      /* positional arguments, command first */
	int npos;
} args;

/* Notes every option; never fails but for memory. */
static int collect_options(int argc, char **argv, args *a)
{
	int o, idx;
	a->given = calloc((size_t)argc + 1, sizeof *a->given);
	if (!a->given) {
		fputs("histctl: out of memory\n", stderr);
		return -1;
	}
	opterr = 0;
	while ((idx = -1, o = getopt_long(argc, argv, SHORT_OPTIONS, OPTIONS, &idx)) != -1) {
		given *g = &a->given[a->ngiven++];
		g->typed = argv[optind - 1];
		g->arg = optarg;
		if (o == ':') {
			g->missing = 1;
			o = optopt;
		} else if (o == '?' && optopt > 0 && optopt < 128) {
			g->shortname = (char)optopt;  /* an unknown letter */
		}
		if (o >= O_TARGET && o < O_END) {
			g->opt = o;
			continue;
		}
		for (size_t i = 0; i < sizeof SHORT / sizeof SHORT[0]; i++)
			if (o == SHORT[i].c) {
				g->opt = SHORT[i].opt;
				g->shortname = SHORT[i].c;
			}
	}
	a->pos = argv + optind;
	a->npos = argc - optind;
	return 0;
}

/* The option's name as histctl spells it: "--revision", "-n". */
static const char *option_name(const given *g, char *buf, size_t n)
{
	if (g->shortname) {
		snprintf(buf, n, "-%c", g->shortname);
		return buf;
	}
	for (const struct option *lo = OPTIONS; lo->name; lo++)
		if (lo->val == g->opt) {
			snprintf(buf, n, "--%s", lo->name);
			return buf;
		}
	return g->typed;
}

/* Refuses an option that command (NULL: none given) does not take, and
 * one without its value: a usage error that names both. */
static int check_options(const char *command, uint64_t takes, const args *a)
{
	for (int i = 0; i < a->ngiven; i++) {
		const given *g = &a->given[i];
		char buf[64];
		const char *name = option_name(g, buf, sizeof buf);
		if (!g->opt || !(OPT(g->opt) & (OPT_GLOBAL | takes))) {
			/* Without "=VALUE" of --name=VALUE. */
			command_usage_error(command, "unknown option %.*s",
					    (int)strcspn(name, "="), name);
			return -1;
		}
		if (g->missing) {
			usage_error("%s needs a value", name);
			return -1;
		}
	}
	return 0;
}

/* Reads the values of the options, which check_options() accepted. */
static int apply_options(args *a)
{
	for (int i = 0; i < a->ngiven; i++) {
		const char *v = a->given[i].arg;
		switch (a->given[i].opt) {
		case O_TARGET: a->target = v; break;
		case O_TOKEN: a->token = v; break;
		case O_TIMEOUT: {
			uint32_t t;
			if (parse_u32(v, "--timeout", &t) < 0)
				return -1;
			if (t > 86400) {
				usage_error("--timeout is at most 86400 seconds");
				return -1;
			}
			a->timeout_s = (int)t;
			break;
		}
		case O_JSON: a->json = 1; break;
		case O_HELP: a->help = 1; break;
		case O_KEY: if (add_kv(&a->keys, v, "--key") < 0) return -1; break;
		case O_LABEL: if (add_kv(&a->labels, v, "--label") < 0) return -1; break;
		case O_META: if (add_kv(&a->meta, v, "--meta") < 0) return -1; break;
		case O_CONFIG: a->config = v; break;
		case O_ID: a->id = v; break;
		case O_LIMIT:
			if (parse_u32(v, "--limit", &a->limit) < 0) return -1;
			a->has_limit = 1;
			break;
		case O_REVISION: if (parse_u64(v, "--revision", &a->revision) < 0) return -1; break;
		case O_ROLE:
			/* append takes the last, search every one. */
			a->role = v;
			if (!a->roles)
				a->roles = json_array();
			if (!a->roles || json_array_append_new(a->roles, json_string(v)) < 0) {
				usage_error("--role must be UTF-8");
				return -1;
			}
			break;
		case O_AUTHOR: a->author = v; break;
		case O_JSONIN: a->json_input = 1; break;
		case O_FILE: a->file = v; break;
		case O_IDEM: a->idem = v; break;
		case O_VIEW: a->view = v; break;
		case O_LAST:
			if (parse_u32(v, "--last", &a->last) < 0) return -1;
			a->has_last = 1;
			break;
		case O_AFTER: if (parse_u64(v, "--after", &a->after) < 0) return -1; break;
		case O_WIDE: a->wide = 1; break;
		case O_TLS: a->tls = 1; break;
		case O_TLS_CA: a->tls_ca = v; a->tls = 1; break;
		case O_TLS_CERT: a->tls_cert = v; a->tls = 1; break;
		case O_TLS_KEY: a->tls_key = v; a->tls = 1; break;
		case O_FORMAT: a->format = v; break;
		case O_MAXTOK: if (parse_u64(v, "--max-tokens", &a->max_tokens) < 0) return -1; break;
		case O_MAXENT: if (parse_u32(v, "--max-entries", &a->max_entries) < 0) return -1; break;
		case O_OLDER: if (parse_u64(v, "--older-than", &a->older) < 0) return -1; break;
		case O_LINES:
			if (parse_u32(v, "-n", &a->n) < 0) return -1;
			a->has_n = 1;
			break;
		case O_FOLLOW: a->follow = 1; break;
		case O_SESSION: a->session = v; break;
		case O_MODE: a->mode = v; break;
		case O_TOOLRES: a->tool_results = 1; break;
		case O_NONEWEST: a->exclude_newest = 1; break;
		}
	}
	return 0;
}

/* The positional arguments from `from` on, joined by spaces as typed (no
 * escaping of newlines); NULL when out of memory. Sets *len. */
static char *join_args(const args *a, int from, size_t *len)
{
	size_t n = 1;
	char *s, *p;
	for (int i = from; i < a->npos; i++)
		n += strlen(a->pos[i]) + 1;
	if (!(s = p = malloc(n))) {
		fputs("histctl: out of memory\n", stderr);
		return NULL;
	}
	*p = 0;
	for (int i = from; i < a->npos; i++) {
		if (i > from)
			*p++ = ' ';
		p = stpcpy(p, a->pos[i]);
	}
	*len = (size_t)(p - s);
	return s;
}

/* The command's one session id argument. */
static const char *session_arg(const args *a)
{
	if (a->npos < 2) {
		usage_error("%s needs a session id", a->pos[0]);
		return NULL;
	}
	return a->pos[1];
}

static int no_more_args(const args *a, int used)
{
	if (a->npos > used) {
		usage_error("unexpected argument '%s'", a->pos[used]);
		return -1;
	}
	return 0;
}

/* ------------------------------------------------------------------------
 * Human-readable output */

static void fmt_time(const Google__Protobuf__Timestamp *t, char *buf, size_t n)
{
	json_t *j;
	if (!t) {
		snprintf(buf, n, "-");
		return;
	}
	j = histctl_pb_to_json(&t->base);
	snprintf(buf, n, "%s", j && json_is_string(j) ? json_string_value(j) : "-");
	json_decref(j);
}

/* A growable string for one table cell. */
typedef struct sbuf {
	char *s;
	size_t n, cap;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t len)
{
	/* Room for the worst case: every byte escaped into two. */
	if (b->n + 2 * len + 1 > b->cap) {
		size_t cap = (b->n + 2 * len + 1) * 2;
		char *ns = realloc(b->s, cap);
		if (!ns)
			return;
		b->s = ns;
		b->cap = cap;
	}
	/* One line per message: newlines and tabs become visible escapes. */
	for (size_t i = 0; i < len; i++) {
		char e = s[i] == '\n' ? 'n' : s[i] == '\t' ? 't' : s[i] == '\r' ? 'r' : 0;
		if (e) {
			b->s[b->n++] = '\\';
			b->s[b->n++] = e;
		} else {
			b->s[b->n++] = s[i];
		}
	}
	b->s[b->n] = 0;
}

static void sb_printf(sbuf *b, const char *fmt, ...)
{
	char tmp[512];
	va_list ap;
	int n;
	va_start(ap, fmt);
	n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n > 0)
		sb_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void describe_blocks(sbuf *b, Histd__V1__ContentBlock **blocks, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const Histd__V1__ContentBlock *cb = blocks[i];
		if (i > 0)
			sb_add(b, " ", 1);
		switch (cb->block_case) {
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TEXT:
			sb_add(b, cb->text->text, strlen(cb->text->text));
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_IMAGE:
			if (cb->image->source_case == HISTD__V1__IMAGE_BLOCK__SOURCE_URL)
				sb_printf(b, "[image %.200s]", cb->image->url);
			else
				sb_printf(b, "[image %s, %zu bytes]", cb->image->media_type,
					  cb->image->data.len);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_DOCUMENT:
			sb_printf(b, "[document %s]", *cb->document->filename
				  ? cb->document->filename : cb->document->media_type);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_REASONING:
			if (cb->reasoning->redacted || !*cb->reasoning->text) {
				sb_add(b, "[reasoning]", 11);
			} else {
				sb_add(b, "[reasoning: ", 12);
				sb_add(b, cb->reasoning->text, strlen(cb->reasoning->text));
				sb_add(b, "]", 1);
			}
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_CALL:
			sb_printf(b, "[tool_call %s %s ", cb->tool_call->id, cb->tool_call->name);
			sb_add(b, cb->tool_call->arguments, strlen(cb->tool_call->arguments));
			sb_add(b, "]", 1);
			break;
		case HISTD__V1__CONTENT_BLOCK__BLOCK_TOOL_RESULT:
			sb_printf(b, "[tool_result %s%s: ", cb->tool_result->tool_call_id,
				  cb->tool_result->is_error ? " error" : "");
			describe_blocks(b, cb->tool_result->content, cb->tool_result->n_content);
			sb_add(b, "]", 1);
			break;
		default:
			sb_add(b, "[?]", 3);
		}
	}
}

/* Width left for the content column: the terminal's, unless --wide or not
 * a terminal (then nothing is cut). 0 means no limit. */
static size_t content_width(const ctl *c, size_t used)
{
	struct winsize ws;
	if (c->wide || !isatty(STDOUT_FILENO) ||
	    ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) < 0 || ws.ws_col == 0)
		return 0;
	return ws.ws_col > used + 10 ? ws.ws_col - used : 10;
}

static const char ROW_FMT[] = "%6s  %-9s  %-10s  %6s  ";

/* One message on one line; used: the width already printed on it. */
static void print_message_row(const ctl *c, const Histd__V1__Message *m, size_t used)
{
	char seq[24], tok[16], role[16];
	size_t width = content_width(c, used + 41);
	sbuf b = { 0 };

	snprintf(seq, sizeof seq, "%" PRIu64, m->seq);
	snprintf(tok, sizeof tok, "%u", m->token_estimate);
	histctl_enum_short(&histd__v1__role__descriptor, m->role, role, sizeof role);
	describe_blocks(&b, m->content, m->n_content);
	printf(ROW_FMT, seq, role, *m->author ? m->author : "-", tok);
	if (b.s && width && b.n > width) {
		/* Cut on a UTF-8 character boundary. */
		size_t k = width - 3;
		while (k > 0 && ((unsigned char)b.s[k] & 0xC0) == 0x80)
			k--;
		printf("%.*s...\n", (int)k, b.s);
	} else {
		printf("%s\n", b.s ? b.s : "");
	}
	free(b.s);
}

static void print_message_header(void)
{
	printf(ROW_FMT, "SEQ", "ROLE", "AUTHOR", "TOKENS");
	printf("CONTENT\n");
}

/* A CONTEXT view's summary comes without its text (the view's summary
 * message holds it): then only the line of what it covers. */
static void print_summary(const Histd__V1__Summary *s)
{
	printf("summary of seq %" PRIu64 "..%" PRIu64 " (%u tokens%s%s)%s%s\n",
	       s->covers_from_seq, s->covers_to_seq, s->token_estimate,
	       *s->model ? ", " : "", s->model, *s->text ? ": " : "", s->text);
}

static void print_kv_line(const char *title, json_t *obj)
{
	const char *k;
	json_t *v;
	int first = 1;
	printf("%-14s", title);
	json_object_foreach(obj, k, v) {
		printf("%s%s=%s", first ? "" : ",", k, json_string_value(v));
		first = 0;
	}
	printf("%s\n", first ? "-" : "");
}

static void print_session(const Histd__V1__Session *s)
{
	json_t *j = histctl_pb_to_json(&s->base);
	char created[64], updated[64];
	fmt_time(s->created_at, created, sizeof created);
	fmt_time(s->updated_at, updated, sizeof updated);
	printf("%-14s%s\n", "id", s->id);
	printf("%-14s%" PRIu64 "\n", "revision", s->revision);
	if (j) {
		print_kv_line("context_keys", json_object_get(j, "context_keys"));
		print_kv_line("labels", json_object_get(j, "labels"));
	}
	printf("%-14s%s\n%-14s%s\n", "created", created, "updated", updated);
	if (s->stats) {
		printf("%-14s%" PRIu64 "\n", "messages", s->stats->message_count);
		printf("%-14s%" PRIu64 "\n", "tokens", s->stats->token_estimate);
		printf("%-14s%" PRIu64 "\n", "bytes", s->stats->bytes);
		printf("%-14s%" PRIu64 "..%" PRIu64 "\n", "seqs", s->stats->first_seq,
		       s->stats->last_seq);
		printf("%-14s%" PRIu64 "\n", "summaries", s->stats->summary_count);
	}
	if (j && json_object_get(j, "config")) {
		printf("%-14s", "config");
		json_dumpf(json_object_get(j, "config"), stdout, JSON_COMPACT | JSON_PRESERVE_ORDER);
		putchar('\n');
	}
	json_decref(j);
}

/* ------------------------------------------------------------------------
 * Commands: sessions */

static int cmd_create(ctl *c, args *a)
{
	json_t *req = json_object();
	ProtobufCMessage *msg = NULL;
	Histd__V1__Session *s = NULL;
	int rc;

	if (no_more_args(a, 1) < 0) {
		json_decref(req);
		return EXIT_USAGE;
	}
	if (a->id)
		json_object_set_new(req, "session_id", json_string(a->id));
	if (a->keys)
		json_object_set(req, "context_keys", a->keys);
	if (a->labels)
		json_object_set(req, "labels", a->labels);
	if (a->config) {
		json_error_t e;
		json_t *cfg = json_loads(a->config, 0, &e);
		if (!cfg) {
			json_decref(req);
			return usage_error("--config is not JSON: %s", e.text);
		}
		json_object_set_new(req, "config", cfg);
	}
	rc = request_from_json(&histd__v1__create_session_request__descriptor, req, &msg);
	json_decref(req);
	if (rc)
		return rc;
	rc = call(c, HISTD_PATH("CreateSession"), msg, &histd__v1__session__descriptor, &s);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&s->base, JSON_INDENT(2));
		else
			printf("%s\n", s->id);
	}
	protobuf_c_message_free_unpacked(msg, NULL);
	histd_client_message_free((ProtobufCMessage *)s);
	return rc;
}

static int cmd_resolve(ctl *c, args *a)
{
	json_t *req;
	ProtobufCMessage *msg = NULL;
	Histd__V1__ResolveSessionResponse *r = NULL;
	int rc;

	if (no_more_args(a, 1) < 0)
		return EXIT_USAGE;
	if (!a->keys)
		return usage_error("resolve needs at least one --key K=V");
	req = json_object();
	json_object_set(req, "context_keys", a->keys);
	if (a->labels)
		json_object_set(req, "labels", a->labels);
	rc = request_from_json(&histd__v1__resolve_session_request__descriptor, req, &msg);
	json_decref(req);
	if (rc)
		return rc;
	rc = call(c, HISTD_PATH("ResolveSession"), msg,
		  &histd__v1__resolve_session_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&r->base, JSON_INDENT(2));
		else
			printf("%s\n", r->session ? r->session->id : "");
	}
	protobuf_c_message_free_unpacked(msg, NULL);
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

static int cmd_session(ctl *c, args *a)
{
	Histd__V1__GetSessionRequest req = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	int rc;
	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	rc = call(c, HISTD_PATH("GetSession"), &req, &histd__v1__session__descriptor, &s);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&s->base, JSON_INDENT(2));
		else
			print_session(s);
	}
	histd_client_message_free((ProtobufCMessage *)s);
	return rc;
}

static int cmd_list(ctl *c, args *a)
{
	json_t *req = json_object(), *all = json_array();
	ProtobufCMessage *msg = NULL;
	uint64_t shown = 0;
	int rc;

	if (no_more_args(a, 1) < 0) {
		rc = EXIT_USAGE;
		goto out;
	}
	if (a->labels)
		json_object_set(req, "label_selector", a->labels);
	if ((rc = request_from_json(&histd__v1__list_sessions_request__descriptor, req, &msg)))
		goto out;
	for (int page = 0;; page++) {
		Histd__V1__ListSessionsRequest *lr = (Histd__V1__ListSessionsRequest *)msg;
		Histd__V1__ListSessionsResponse *r = NULL;
		rc = call(c, HISTD_PATH("ListSessions"), lr,
			  &histd__v1__list_sessions_response__descriptor, &r);
		if (rc)
			break;
		/* The header once the first page came: a failed call prints
		 * its error alone. */
		if (!c->json && page == 0)
			printf("%-36s  %8s  %8s  %8s  %-27s  %s\n", "ID", "MESSAGES",
			       "TOKENS", "REVISION", "UPDATED", "LABELS");
		for (size_t i = 0; i < r->n_sessions && (!a->has_limit || shown < a->limit); i++, shown++) {
			const Histd__V1__Session *s = r->sessions[i];
			if (c->json) {
				json_array_append_new(all, histctl_pb_to_json(&s->base));
			} else {
				char up[64];
				json_t *j = histctl_pb_to_json(&s->base);
				fmt_time(s->updated_at, up, sizeof up);
				printf("%-36s  %8" PRIu64 "  %8" PRIu64 "  %8" PRIu64 "  %-27s  ",
				       s->id, s->stats ? s->stats->message_count : 0,
				       s->stats ? s->stats->token_estimate : 0, s->revision, up);
				if (j && json_object_get(j, "labels")) {
					const char *k;
					json_t *v;
					int first = 1;
					json_object_foreach(json_object_get(j, "labels"), k, v) {
						printf("%s%s=%s", first ? "" : ",", k, json_string_value(v));
						first = 0;
					}
				} else {
					putchar('-');
				}
				putchar('\n');
				json_decref(j);
			}
		}
		/* The next page token replaces the previous one in place. */
		free(lr->page_token != protobuf_c_empty_string ? lr->page_token : NULL);
		lr->page_token = strdup(r->next_page_token);
		if (!*r->next_page_token || (a->has_limit && shown >= a->limit)) {
			histd_client_message_free((ProtobufCMessage *)r);
			break;
		}
		histd_client_message_free((ProtobufCMessage *)r);
	}
	if (rc == EXIT_OKAY && c->json) {
		json_t *o = json_pack("{sO}", "sessions", all);
		json_dumpf(o, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		putchar('\n');
		json_decref(o);
	}
out:
	protobuf_c_message_free_unpacked(msg, NULL);
	json_decref(req);
	json_decref(all);
	return rc;
}

static int cmd_delete(ctl *c, args *a)
{
	Histd__V1__DeleteSessionRequest req = HISTD__V1__DELETE_SESSION_REQUEST__INIT;
	Histd__V1__DeleteSessionResponse *r = NULL;
	int rc;
	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	req.expected_revision = a->revision;
	rc = call(c, HISTD_PATH("DeleteSession"), &req,
		  &histd__v1__delete_session_response__descriptor, &r);
	if (rc == EXIT_OKAY && c->json)
		print_json(&r->base, JSON_INDENT(2));
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

/* ------------------------------------------------------------------------
 * Commands: messages */

/*
 * Shorthands people write by hand, rewritten into the API's shape before
 * decoding: a message's "text": "..." for one text block, and a plain
 * string in a content array (also a tool result's) for a text block.
 */
static void expand_blocks(json_t *content)
{
	size_t i;
	json_t *b;
	json_array_foreach(content, i, b) {
		json_t *tr;
		if (json_is_string(b)) {
			json_array_set_new(content, i, json_pack("{s{sO}}", "text", "text", b));
			continue;
		}
		tr = json_object_get(b, "tool_result");
		if (!tr)
			tr = json_object_get(b, "toolResult");
		expand_blocks(json_object_get(tr, "content"));
	}
}

static void expand_message(json_t *m)
{
	json_t *text = json_object_get(m, "text");

	if (!json_is_object(m))
		return;
	if (json_is_string(text) && !json_object_get(m, "content")) {
		json_object_set_new(m, "content",
			json_pack("[{s{sO}}]", "text", "text", text));
		json_object_del(m, "text");
	}
	expand_blocks(json_object_get(m, "content"));
}

/* The input of append --json-input as an AppendRequest's JSON. */
static json_t *append_request_json(json_t *in, const char *sid)
{
	json_t *req, *msgs, *m;
	size_t i;

	if (json_is_object(in) && json_object_get(in, "messages")) {
		req = json_deep_copy(in);
	} else {
		req = json_object();
		msgs = json_is_array(in) ? json_deep_copy(in) : json_pack("[O]", in);
		json_object_set_new(req, "messages", msgs);
	}
	if (!req)
		return NULL;
	json_object_set_new(req, "session_id", json_string(sid));
	json_array_foreach(json_object_get(req, "messages"), i, m)
		expand_message(m);
	return req;
}

static int cmd_append(ctl *c, args *a)
{
	const char *sid = session_arg(a);
	json_t *req = NULL;
	ProtobufCMessage *msg = NULL;
	Histd__V1__AppendResponse *r = NULL;
	char *input = NULL;
	size_t len = 0;
	int rc;

	if (!sid)
		return EXIT_USAGE;
	if (a->npos > 2 && (a->file || a->json_input))
		return usage_error("give TEXT or --file/--json-input, not both");
	if (a->npos > 2) {
		if (!(input = join_args(a, 2, &len)))
			return EXIT_ERROR;
	} else {
		input = read_all(a->file ? a->file : "-", &len);
		if (!input)
			return EXIT_ERROR;
	}

	if (a->json_input) {
		json_error_t e;
		json_t *in = json_loadb(input, len, 0, &e);
		if (!in) {
			fprintf(stderr, "histctl: input is not JSON: line %d: %s\n", e.line, e.text);
			free(input);
			return EXIT_INVALID;
		}
		req = append_request_json(in, sid);
		json_decref(in);
	} else {
		/* Plain text: one message; a final newline (echo, files) is
		 * not part of it. */
		if (len > 0 && input[len - 1] == '\n')
			input[--len] = 0;
		if (len == 0) {
			free(input);
			return usage_error("nothing to append: the text is empty");
		}
		req = json_pack("{ss s[{s[{s{ss%}}]}]}", "session_id", sid,
				"messages", "content", "text", "text", input, len);
		if (req) {
			json_t *m = json_array_get(json_object_get(req, "messages"), 0);
			json_object_set_new(m, "role", json_string(a->role ? a->role : "user"));
			if (a->author)
				json_object_set_new(m, "author", json_string(a->author));
			if (a->meta)
				json_object_set(m, "metadata", a->meta);
		}
	}
	free(input);
	if (!req) {
		fputs("histctl: the text is not valid UTF-8\n", stderr);
		return EXIT_INVALID;
	}
	if (a->revision)
		json_object_set_new(req, "expected_revision", json_integer((json_int_t)a->revision));
	if (a->idem)
		json_object_set_new(req, "idempotency_key", json_string(a->idem));
	rc = request_from_json(&histd__v1__append_request__descriptor, req, &msg);
	json_decref(req);
	if (rc)
		return rc;
	rc = call(c, HISTD_PATH("Append"), msg, &histd__v1__append_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&r->base, JSON_INDENT(2));
		else
			printf("seq %" PRIu64 "..%" PRIu64 " revision %" PRIu64 "%s\n",
			       r->first_seq, r->last_seq, r->revision,
			       r->replayed ? " (replayed)" : "");
	}
	protobuf_c_message_free_unpacked(msg, NULL);
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

/* Says on stderr that a --last / -n answer holds fewer than asked. */
static void warn_truncated(const Histd__V1__GetMessagesResponse *r, uint64_t asked)
{
	if (!r->truncated)
		return;
	fprintf(stderr, "histctl: only the newest %zu of the last %" PRIu64
		" messages came back (the server's page or answer size limit); "
		"read the older ones with get --after SEQ --limit N\n",
		r->n_messages, asked);
}

static int cmd_get(ctl *c, args *a)
{
	Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	json_t *out = NULL;
	int rc = EXIT_OKAY, header = 0;
	uint64_t shown = 0, tokens = 0;
	int view;

	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	if (a->view && parse_enum(&histd__v1__view__descriptor, a->view, "view", &view) < 0)
		return EXIT_USAGE;
	req.view = a->view ? (Histd__V1__View)view : HISTD__V1__VIEW__VIEW_RAW;
	req.after_seq = a->after;
	req.last_n = a->has_last ? a->last : 0;
	req.limit = a->has_limit && a->limit < 1000 ? a->limit : 0;

	for (;;) {
		Histd__V1__GetMessagesResponse *r = NULL;
		size_t n;
		rc = call(c, HISTD_PATH("GetMessages"), &req,
			  &histd__v1__get_messages_response__descriptor, &r);
		if (rc)
			break;
		n = r->n_messages;
		if (a->has_limit && shown + n > a->limit)
			n = (size_t)(a->limit - shown);
		warn_truncated(r, req.last_n);
		for (size_t i = 0; i < n; i++)
			tokens += r->messages[i]->token_estimate;
		if (c->json) {
			json_t *page = histctl_pb_to_json(&r->base);
			json_t *msgs = json_object_get(page, "messages");
			if (!out) {
				out = page;
				if (msgs)
					while (json_array_size(msgs) > n)
						json_array_remove(msgs, json_array_size(msgs) - 1);
			} else {
				json_t *all = json_object_get(out, "messages");
				for (size_t i = 0; i < n; i++)
					json_array_append(all, json_array_get(msgs, i));
				json_object_set(out, "next_after_seq",
						json_object_get(page, "next_after_seq"));
				json_decref(page);
			}
		} else {
			if (!header) {
				if (r->summary)
					print_summary(r->summary);
				print_message_header();
				header = 1;
			}
			for (size_t i = 0; i < n; i++)
				print_message_row(c, r->messages[i], 0);
		}
		shown += n;
		/* Only the RAW view pages; --last and CONTEXT are one answer. */
		req.after_seq = r->next_after_seq;
		histd_client_message_free((ProtobufCMessage *)r);
		if (req.after_seq == 0 || req.last_n || req.view == HISTD__V1__VIEW__VIEW_CONTEXT ||
		    (a->has_limit && shown >= a->limit))
			break;
	}
	if (rc == EXIT_OKAY && c->json && out) {
		char t[24];

		json_object_del(out, "next_after_seq");
		/* The sum over the messages shown, all pages. */
		snprintf(t, sizeof(t), "%" PRIu64, tokens);
		json_object_set_new(out, "token_estimate", json_string(t));
		json_dumpf(out, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		putchar('\n');
	}
	json_decref(out);
	return rc;
}

/* A search hit's columns before those of its message. */
static const char HIT_FMT[] = "%8s  %-36s  ";

static int cmd_search(ctl *c, args *a)
{
	json_t *req, *roles, *role;
	ProtobufCMessage *msg = NULL;
	Histd__V1__SearchResponse *r = NULL;
	char *query;
	size_t len, i;
	int rc = EXIT_USAGE, v;

	if (a->npos < 2)
		return command_usage_error("search", "needs a query");
	if (a->session && a->labels)
		return command_usage_error("search", "give --session or --label, not both");
	if (!(query = join_args(a, 1, &len)))
		return EXIT_ERROR;
	req = json_pack("{ss%}", "query", query, len);
	free(query);
	if (!req) {
		fputs("histctl: the query is not valid UTF-8\n", stderr);
		return EXIT_INVALID;
	}
	if (a->session)
		json_object_set_new(req, "session_id", json_string(a->session));
	if (a->labels)
		json_object_set(req, "label_selector", a->labels);
	if (a->has_limit)
		json_object_set_new(req, "k", json_integer(a->limit));
	if (a->mode) {
		if (parse_enum(&histd__v1__search_mode__descriptor, a->mode, "mode", &v) < 0)
			goto out;
		json_object_set_new(req, "mode", json_integer(v));
	}
	if (a->roles) {
		json_object_set_new(req, "roles", roles = json_array());
		json_array_foreach(a->roles, i, role) {
			if (parse_enum(&histd__v1__role__descriptor, json_string_value(role),
				       "role", &v) < 0)
				goto out;
			json_array_append_new(roles, json_integer(v));
		}
	}
	if (a->tool_results)
		json_object_set_new(req, "include_tool_results", json_true());
	if (a->exclude_newest)
		json_object_set_new(req, "exclude_newest", json_true());
	if ((rc = request_from_json(&histd__v1__search_request__descriptor, req, &msg)))
		goto out;
	rc = call(c, HISTD_PATH("Search"), msg, &histd__v1__search_response__descriptor, &r);
	if (rc == EXIT_OKAY && c->json) {
		print_json(&r->base, JSON_INDENT(2));
	} else if (rc == EXIT_OKAY) {
		printf(HIT_FMT, "SCORE", "SESSION");
		print_message_header();
		for (i = 0; i < r->n_hits; i++) {
			const Histd__V1__SearchHit *h = r->hits[i];
			char score[32];
			snprintf(score, sizeof score, "%.4f", h->score);
			printf(HIT_FMT, score, h->session_id);
			if (h->message)
				print_message_row(c, h->message, 48);
			else
				printf("%6" PRIu64 "\n", h->seq);
		}
		for (i = 0; i < r->n_lexical_fallback_sessions; i++)
			fprintf(stderr, "histctl: searched by words (no embeddings): %s\n",
				r->lexical_fallback_sessions[i]);
	}
out:
	protobuf_c_message_free_unpacked(msg, NULL);
	histd_client_message_free((ProtobufCMessage *)r);
	json_decref(req);
	return rc;
}

static void on_stop(int sig)
{
	(void)sig;
	stopping = 1;
}

/* Prints one event of tail -f; returns 1 when the stream is over for us. */
static int print_event(const ctl *c, const Histd__V1__HistoryEvent *e)
{
	if (c->json) {
		print_json(&e->base, JSON_COMPACT);
		fflush(stdout);
		return e->event_case == HISTD__V1__HISTORY_EVENT__EVENT_DELETED;
	}
	switch (e->event_case) {
	case HISTD__V1__HISTORY_EVENT__EVENT_APPENDED:
		for (size_t i = 0; i < e->appended->n_messages; i++)
			print_message_row(c, e->appended->messages[i], 0);
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_REPLACED:
		printf("# replaced: %zu messages\n", e->replaced->n_messages);
		for (size_t i = 0; i < e->replaced->n_messages; i++)
			print_message_row(c, e->replaced->messages[i], 0);
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_CLEARED:
		printf("# cleared up to seq %" PRIu64 "\n", e->cleared->cleared_to_seq);
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_REDUCED:
		if (e->reduced->summary)
			print_summary(e->reduced->summary);
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_DELETED:
		printf("# session deleted\n");
		fflush(stdout);
		return 1;
	case HISTD__V1__HISTORY_EVENT__EVENT_PLUGIN_ERROR:
		fprintf(stderr, "histctl: plugin %s: %s\n", e->plugin_error->plugin,
			e->plugin_error->message);
		break;
	case HISTD__V1__HISTORY_EVENT__EVENT_UPDATED:
		printf("# session updated, revision %" PRIu64 "\n", e->revision);
		break;
	default:
		break;
	}
	fflush(stdout);
	return 0;
}

static int tail_follow(ctl *c, const char *sid, uint64_t after)
{
	Histd__V1__SubscribeRequest req = HISTD__V1__SUBSCRIBE_REQUEST__INIT;
	histd_client_stream *s = NULL;
	struct sigaction sa = { 0 };
	int rc = EXIT_OKAY;

	/* No SA_RESTART: the flag is polled between short waits. */
	sa.sa_handler = on_stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	req.session_id = (char *)sid;
	req.after_seq = after;
	if (histd_client_stream_open(c->client, HISTD_PATH("Subscribe"), &req.base, 0, &s) < 0) {
		fputs("histctl: cannot start Subscribe\n", stderr);
		return EXIT_ERROR;
	}
	while (!stopping) {
		ProtobufCMessage *m = NULL;
		int r = histd_client_stream_next(s, &histd__v1__history_event__descriptor, 200, &m);
		if (r == HISTD_STREAM_TIMEOUT)
			continue;
		if (r == HISTD_STREAM_MESSAGE) {
			int done = print_event(c, (Histd__V1__HistoryEvent *)m);
			histd_client_message_free(m);
			if (done)
				break;
			continue;
		}
		if (r == HISTD_STREAM_END) {
			const histd_status *st = histd_client_stream_status(s);
			const char *resume = st->code == GRPC_STATUS_RESOURCE_EXHAUSTED
				? histd_status_trailer(st, "histd-resume-after-seq") : NULL;
			char *end;
			unsigned long long at = resume ? strtoull(resume, &end, 10) : 0;

			/* Fell behind: the server says where to go on from
			 * (the replay from there holds what was missed). */
			if (resume && *resume && !*end) {
				histd_client_stream_close(s);
				s = NULL;
				req.after_seq = at;
				if (histd_client_stream_open(c->client, HISTD_PATH("Subscribe"),
							     &req.base, 0, &s) < 0) {
					fputs("histctl: cannot start Subscribe again\n", stderr);
					return EXIT_ERROR;
				}
				continue;
			}
			if (st->code != GRPC_STATUS_OK)
				rc = report_status(st);
		} else {
			fputs("histctl: INTERNAL: an event did not decode\n", stderr);
			rc = EXIT_ERROR;
		}
		break;
	}
	histd_client_stream_close(s);
	return rc;
}

static int cmd_tail(ctl *c, args *a)
{
	Histd__V1__GetSessionRequest gs = HISTD__V1__GET_SESSION_REQUEST__INIT;
	Histd__V1__GetMessagesRequest req = HISTD__V1__GET_MESSAGES_REQUEST__INIT;
	Histd__V1__Session *s = NULL;
	Histd__V1__GetMessagesResponse *r = NULL;
	uint32_t n = a->has_n ? a->n : 10;
	uint64_t last;
	int rc;

	if (!(gs.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	if (a->follow) {
		/* Subscribe replays what follows after_seq, so starting n
		 * before the end shows the last n and then goes on live. */
		if ((rc = call(c, HISTD_PATH("GetSession"), &gs, &histd__v1__session__descriptor, &s)))
			return rc;
		last = s->stats ? s->stats->last_seq : 0;
		histd_client_message_free((ProtobufCMessage *)s);
		return tail_follow(c, gs.session_id, last > n ? last - n : 0);
	}
	if (n == 0)
		return EXIT_OKAY;
	req.session_id = gs.session_id;
	req.view = HISTD__V1__VIEW__VIEW_RAW;
	req.last_n = n;
	rc = call(c, HISTD_PATH("GetMessages"), &req, &histd__v1__get_messages_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		warn_truncated(r, n);
		for (size_t i = 0; i < r->n_messages; i++) {
			if (c->json)
				print_json(&r->messages[i]->base, JSON_COMPACT);
			else
				print_message_row(c, r->messages[i], 0);
		}
	}
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

static int cmd_export(ctl *c, args *a)
{
	Histd__V1__ExportRequest req = HISTD__V1__EXPORT_REQUEST__INIT;
	Histd__V1__ExportResponse *r = NULL;
	int fmt, view, rc;

	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	if (!a->format)
		return usage_error("export needs --format");
	if (parse_enum(&histd__v1__format__descriptor, a->format, "format", &fmt) < 0)
		return EXIT_USAGE;
	if (a->view && parse_enum(&histd__v1__view__descriptor, a->view, "view", &view) < 0)
		return EXIT_USAGE;
	req.format = (Histd__V1__Format)fmt;
	req.view = a->view ? (Histd__V1__View)view : HISTD__V1__VIEW__VIEW_RAW;
	rc = call(c, HISTD_PATH("Export"), &req, &histd__v1__export_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		if (c->json) {
			print_json(&r->base, JSON_INDENT(2));
		} else {
			printf("%s\n", r->json);
			for (size_t i = 0; i < r->n_dropped; i++)
				fprintf(stderr, "histctl: dropped: %s\n", r->dropped[i]);
		}
	}
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

static int cmd_import(ctl *c, args *a)
{
	Histd__V1__ImportRequest req = HISTD__V1__IMPORT_REQUEST__INIT;
	Histd__V1__ImportResponse *r = NULL;
	size_t len;
	int fmt, rc;

	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 3) < 0)
		return EXIT_USAGE;
	if (!a->format)
		return usage_error("import needs --format");
	if (parse_enum(&histd__v1__format__descriptor, a->format, "format", &fmt) < 0)
		return EXIT_USAGE;
	req.format = (Histd__V1__Format)fmt;
	req.expected_revision = a->revision;
	if (a->idem)
		req.idempotency_key = (char *)a->idem;
	req.json = read_all(a->npos > 2 ? a->pos[2] : a->file ? a->file : "-", &len);
	if (!req.json)
		return EXIT_ERROR;
	rc = call(c, HISTD_PATH("Import"), &req, &histd__v1__import_response__descriptor, &r);
	free(req.json);
	if (rc == EXIT_OKAY) {
		if (c->json) {
			print_json(&r->base, JSON_INDENT(2));
		} else {
			if (r->append)
				printf("seq %" PRIu64 "..%" PRIu64 " revision %" PRIu64 "%s\n",
				       r->append->first_seq, r->append->last_seq,
				       r->append->revision, r->append->replayed ? " (replayed)" : "");
			for (size_t i = 0; i < r->n_dropped; i++)
				fprintf(stderr, "histctl: dropped: %s\n", r->dropped[i]);
		}
	}
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

static int cmd_reduce(ctl *c, args *a)
{
	Histd__V1__ReduceRequest req = HISTD__V1__REDUCE_REQUEST__INIT;
	Histd__V1__ReduceResponse *r = NULL;
	int rc;

	if (!(req.session_id = (char *)session_arg(a)) || no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	req.max_tokens = a->max_tokens;
	req.max_entries = a->max_entries;
	req.older_than_seconds = a->older;
	rc = call(c, HISTD_PATH("Reduce"), &req, &histd__v1__reduce_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&r->base, JSON_INDENT(2));
		else if (r->summary)
			print_summary(r->summary);
		else
			printf("nothing to reduce (revision %" PRIu64 ")\n", r->revision);
	}
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

static int cmd_health(ctl *c, args *a)
{
	Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
	Grpc__Health__V1__HealthCheckResponse *r = NULL;
	char name[32];
	int rc;

	if (no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	if (a->npos > 1)
		req.service = a->pos[1];
	rc = call(c, HISTD_PATH_HEALTH_CHECK, &req,
		  &grpc__health__v1__health_check_response__descriptor, &r);
	if (rc == EXIT_OKAY) {
		if (c->json)
			print_json(&r->base, JSON_INDENT(2));
		else
			printf("%s\n", histctl_enum_short(
				&grpc__health__v1__health_check_response__serving_status__descriptor,
				r->status, name, sizeof name));
		if (r->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING)
			rc = EXIT_UNAVAILABLE;
	}
	histd_client_message_free((ProtobufCMessage *)r);
	return rc;
}

/* ------------------------------------------------------------------------
 * main */

/* The PEM files of --tls-ca, --tls-cert, --tls-key into pem[0..2] (NULL
 * where not given); an exit code after saying which file failed. */
static int read_tls_files(const args *a, char *pem[3])
{
	const char *files[3] = { a->tls_ca, a->tls_cert, a->tls_key };
	size_t len;

	for (int i = 0; i < 3; i++)
		if (files[i] && !(pem[i] = read_all(files[i], &len)))
			return EXIT_ERROR;
	return EXIT_OKAY;
}

static int cmd_help(ctl *c, args *a);
static int cmd_version(ctl *c, args *a);

/*
 * The commands: each with the options it takes besides OPT_GLOBAL (any
 * other is refused, check_options) and its part of the usage text, which
 * names the same options. In the order of the usage text.
 */
static const struct command {
	const char *name;
	int (*fn)(ctl *c, args *a);
	uint64_t takes;
	const char *group;   /* a heading before it in the usage text */
	const char *usage;
	int local;           /* runs without a channel */
} COMMANDS[] = {
	{ .name = "create", .fn = cmd_create,
	  .takes = OPT(O_ID) | OPT(O_KEY) | OPT(O_LABEL) | OPT(O_CONFIG),
	  .group = "Sessions",
	  .usage =
"  create [--id ID] [--key K=V]... [--label K=V]... [--config JSON]\n"
"                     create a session; prints its id\n" },
	{ .name = "resolve", .fn = cmd_resolve,
	  .takes = OPT(O_KEY) | OPT(O_LABEL),
	  .usage =
"  resolve --key K=V... [--label K=V]...\n"
"                     get or create the session of these context keys;\n"
"                     prints its id\n" },
	{ .name = "session", .fn = cmd_session,
	  .usage =
"  session ID         show one session and its stats\n" },
	{ .name = "list", .fn = cmd_list,
	  .takes = OPT(O_LABEL) | OPT(O_LIMIT),
	  .usage =
"  list [--label K=V]... [--limit N]\n"
"                     list sessions (all pages) as a table\n" },
	{ .name = "delete", .fn = cmd_delete,
	  .takes = OPT(O_REVISION),
	  .usage =
"  delete ID [--revision N]\n"
"                     delete a session and everything in it\n" },
	{ .name = "append", .fn = cmd_append,
	  .takes = OPT(O_ROLE) | OPT(O_AUTHOR) | OPT(O_JSONIN) | OPT(O_FILE) |
		   OPT(O_META) | OPT(O_REVISION) | OPT(O_IDEM),
	  .group = "Messages",
	  .usage =
"  append ID [TEXT...] [--role ROLE] [--author NAME] [-J|--json-input]\n"
"         [--file FILE] [--meta K=V]... [--revision N] [--idempotency-key KEY]\n"
"                     append TEXT (or standard input, or FILE) as one\n"
"                     message; with --json-input the input is a message\n"
"                     object, an array of them, or {\"messages\": [...]}\n" },
	{ .name = "get", .fn = cmd_get,
	  .takes = OPT(O_VIEW) | OPT(O_LAST) | OPT(O_AFTER) | OPT(O_LIMIT) |
		   OPT(O_WIDE),
	  .usage =
"  get ID [--view raw|context] [--last N] [--after SEQ] [--limit N] [--wide]\n"
"                     print messages as a table (or JSON with --json)\n" },
	{ .name = "search", .fn = cmd_search,
	  .takes = OPT(O_SESSION) | OPT(O_LABEL) | OPT(O_MODE) | OPT(O_ROLE) |
		   OPT(O_LIMIT) | OPT(O_TOOLRES) | OPT(O_NONEWEST) | OPT(O_WIDE),
	  .usage =
"  search QUERY... [--session ID | --label K=V...] [--mode MODE]\n"
"         [--role ROLE]... [--limit N] [--include-tool-results]\n"
"         [--exclude-newest] [--wide]\n"
"                     find messages by words (mode lexical, the default),\n"
"                     by meaning (semantic) or both (hybrid), in session\n"
"                     ID, in the sessions with these labels, or in all;\n"
"                     prints the best N (10; at most 100), best first\n" },
	{ .name = "tail", .fn = cmd_tail,
	  .takes = OPT(O_LINES) | OPT(O_FOLLOW) | OPT(O_WIDE),
	  .usage =
"  tail ID [-n N] [-f] [--wide]\n"
"                     print the last N messages (10); with -f keep\n"
"                     printing new ones as they are appended (Subscribe)\n"
"                     until the session is deleted or SIGINT/SIGTERM\n" },
	{ .name = "export", .fn = cmd_export,
	  .takes = OPT(O_FORMAT) | OPT(O_VIEW),
	  .usage =
"  export ID --format F [--view raw|context]\n"
"                     print the session as provider F's request body\n" },
	{ .name = "import", .fn = cmd_import,
	  .takes = OPT(O_FORMAT) | OPT(O_FILE) | OPT(O_REVISION) | OPT(O_IDEM),
	  .usage =
"  import ID --format F [FILE|-|--file FILE] [--revision N]\n"
"         [--idempotency-key KEY]\n"
"                     append a transcript in provider F's format\n" },
	{ .name = "reduce", .fn = cmd_reduce,
	  .takes = OPT(O_MAXTOK) | OPT(O_MAXENT) | OPT(O_OLDER),
	  .usage =
"  reduce ID [--max-tokens N] [--max-entries N] [--older-than SEC]\n"
"                     compact the older part of the session now\n" },
	{ .name = "health", .fn = cmd_health,
	  .group = "Other",
	  .usage =
"  health [SERVICE]   check the server (grpc.health.v1); exit 0 if serving\n" },
	{ .name = "help", .fn = cmd_help,
	  .usage =
"  help [COMMAND]     this text, or COMMAND's part of it\n",
	  .local = 1 },
	{ .name = "version", .fn = cmd_version,
	  .usage =
"  version            print histctl's version\n",
	  .local = 1 },
};

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++)
		if (strcmp(name, COMMANDS[i].name) == 0)
			return &COMMANDS[i];
	return NULL;
}

/* The whole usage text (cmd NULL or help), or cmd's part of it. */
static void print_usage(const struct command *cmd)
{
	if (cmd && cmd->fn != cmd_help) {
		fputs(cmd->usage, stdout);
		fputs("\nand the options of every command: --target, --token, --timeout,\n"
		      "--json, --tls, --tls-ca, --tls-cert, --tls-key (histctl help)\n", stdout);
		return;
	}
	fputs(USAGE_HEAD, stdout);
	for (size_t i = 0; i < sizeof COMMANDS / sizeof COMMANDS[0]; i++) {
		if (COMMANDS[i].group)
			printf("\n%s:\n", COMMANDS[i].group);
		fputs(COMMANDS[i].usage, stdout);
	}
	fputs(USAGE_TAIL, stdout);
}

static int cmd_help(ctl *c, args *a)
{
	const struct command *cmd = NULL;
	(void)c;
	if (no_more_args(a, 2) < 0)
		return EXIT_USAGE;
	if (a->npos > 1 && !(cmd = find_command(a->pos[1])))
		return usage_error("unknown command '%s'", a->pos[1]);
	print_usage(cmd);
	return EXIT_OKAY;
}

static int cmd_version(ctl *c, args *a)
{
	(void)c;
	if (no_more_args(a, 1) < 0)
		return EXIT_USAGE;
	printf("histctl %s\n", HISTCTL_VERSION);
	return EXIT_OKAY;
}

int main(int argc, char **argv)
{
	args a = { 0 };
	ctl c = { 0 };
	const struct command *cmd = NULL;
	histd_client_options opt = HISTD_CLIENT_OPTIONS_INIT;
	char *bearer = NULL, *pem[3] = { NULL, NULL, NULL };
	const char *md[3] = { NULL, NULL, NULL };
	int rc;

	/* Options go anywhere on the line (README): glibc's getopt stops at
	 * the first argument instead under POSIXLY_CORRECT. */
	unsetenv("POSIXLY_CORRECT");
	a.timeout_s = 30;
	a.target = getenv("HISTD_TARGET");
	a.token = getenv("HISTD_TOKEN");
	if (collect_options(argc, argv, &a) < 0) {
		rc = EXIT_ERROR;
		goto out;
	}
	if (a.npos > 0 && !(cmd = find_command(a.pos[0]))) {
		rc = usage_error("unknown command '%s'", a.pos[0]);
		goto out;
	}
	if (check_options(cmd ? cmd->name : NULL, cmd ? cmd->takes : 0, &a) < 0 ||
	    apply_options(&a) < 0) {
		rc = EXIT_USAGE;
		goto out;
	}
	if (!cmd || a.help) {
		print_usage(cmd);
		rc = !cmd && !a.help ? EXIT_USAGE : EXIT_OKAY;
		goto out;
	}
	if (cmd->local) {
		rc = cmd->fn(&c, &a);
		goto out;
	}
	if (!a.target || !*a.target)
		a.target = DEFAULT_TARGET;
	if (a.token && *a.token) {
		if (asprintf(&bearer, "Bearer %s", a.token) < 0) {
			rc = EXIT_ERROR;
			goto out;
		}
		md[0] = "authorization";
		md[1] = bearer;
		opt.metadata_kv = md;
	}
	if (!a.tls_cert != !a.tls_key) {
		rc = usage_error("--tls-cert and --tls-key go together");
		goto out;
	}
	if (a.tls && (rc = read_tls_files(&a, pem)) != EXIT_OKAY)
		goto out;
	opt.tls = a.tls;
	opt.tls_root_pem = pem[0];
	opt.tls_cert_pem = pem[1];
	opt.tls_key_pem = pem[2];
	/* Responses are bounded by the server's own page limits. */
	opt.max_receive_message_bytes = -1;
	if (histd_client_open_ex(a.target, &opt, &c.client) < 0) {
		fprintf(stderr, "histctl: cannot open a channel to %s\n", a.target);
		rc = EXIT_ERROR;
		goto out;
	}
	c.timeout_ms = a.timeout_s * 1000;
	c.json = a.json;
	c.wide = a.wide;
	rc = cmd->fn(&c, &a);
	/* Output that did not reach its file (a full disk) is a failure. */
	if ((fflush(stdout) == EOF || ferror(stdout)) && rc == EXIT_OKAY) {
		fprintf(stderr, "histctl: cannot write the output: %s\n",
			strerror(errno));
		rc = EXIT_ERROR;
	}
	histd_client_close(c.client);
out:
	free(bearer);
	for (int i = 0; i < 3; i++)
		free(pem[i]);
	json_decref(a.keys);
	json_decref(a.labels);
	json_decref(a.meta);
	json_decref(a.roles);
	free(a.given);
	return rc;
}
