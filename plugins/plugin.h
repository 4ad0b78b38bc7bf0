/*
 * The context pipeline: what the CONTEXT view of GetMessages applies to a
 * session's messages at read time, and what compacts a session.
 *
 * A plugin is a versioned struct of hooks. An implementation fills a
 * `histd_plugin` with designated initializers; members are only ever
 * appended and `version` says which members it fills. Plugins are found by
 * name in one registry (pipeline.c): the built-in ones (window, masking,
 * compaction) and those loaded from shared objects at start
 * (histd_plugin_load, loader.c). A plugin is validated once, when it is
 * registered: a known version, a name, configure present, and one of
 * transform, after_append, reduce. release is required whenever configure
 * may allocate: a state returned without it is refused (EINTERNAL) where
 * a pipeline names the plugin.
 *
 * Hooks:
 *   configure     parses one session's options for the plugin into an
 *                 opaque state (called at CreateSession/UpdateSession to
 *                 validate, and on every read to build the pipeline: keep
 *                 it cheap, no I/O).
 *   transform     read time. Rewrites the view (histd_view) in place: may
 *                 remove items, change their messages. Pure: never touches
 *                 storage, and the same input gives the same output.
 *   after_append  after a successful Append, off the request path (a
 *                 worker thread): a cheap threshold check on the session's
 *                 totals; returns 1 to ask for a reduce.
 *   reduce        compaction: turns the older messages into a summary. It
 *                 may block (an LLM call); it runs off the request path or
 *                 in a Reduce call, at most one per session at a time.
 *
 * Order. A session's config lists its pipeline in order, and transforms
 * run in exactly that order. The order matters where one plugin changes
 * what the next one measures: masking before window makes masked results
 * cheap, so a token budget keeps more messages (the recommended order is
 * compaction, masking, window). Whatever the order, the view then gets one
 * last fix-up, not a plugin, that makes it valid for every provider:
 * system messages first, then the summary message, then the rest, with
 * every tool_result's tool_call present and every tool_call's results
 * present (a block without its partner is removed; a message left empty is
 * removed).
 *
 * Shared objects cannot call into the histd binary: everything a hook may
 * need from the host comes through `v->ops` (histd_view_ops) or the hook's
 * arguments. Plugins read protobuf-c structs directly (the layout is the
 * API's), but allocate only through the ops.
 *
 * Threads: hooks may run on any thread, concurrently, each call with its
 * own state and view; a plugin keeps no mutable globals.
 *
 * Errors: hooks return 0 or a negative HISTD_E* code. configure writes a
 * one-line message naming the option ("options.max_tokens must be a whole
 * number") into err (cap bytes); the registry prefixes the field path.
 */
#ifndef HISTD_PLUGIN_H
#define HISTD_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#include "histd/v1/histd.pb-c.h"
#include "histd_error.h"

/* 2 added histd_plugin.newest_needed. The host accepts a plugin of any
 * version from 1 to its own and never reads hooks newer than the
 * plugin's version. */
#define HISTD_PLUGIN_VERSION 2

/* transform: "I need older messages than the view holds" (only returned
 * when v->complete is 0); the pipeline loads more and runs every
 * transform again from the start. */
#define HISTD_PLUGIN_MORE 1

typedef struct histd_plugin_opt {
	const char *key;
	const char *value;
} histd_plugin_opt;

/* Flags of a view item. */
enum {
	HISTD_ITEM_SYSTEM = 1u << 0,     /* role system: always kept */
	HISTD_ITEM_SUMMARY = 1u << 1,    /* the summary message (seq 0) */
	HISTD_ITEM_CHANGED = 1u << 2,    /* msg differs from data */
	HISTD_ITEM_CALLS = 1u << 3,      /* holds tool_call blocks */
	HISTD_ITEM_RESULTS = 1u << 4,    /* holds tool_result blocks */
	HISTD_ITEM_REASONING = 1u << 5,  /* holds reasoning blocks */
};

/* One message of the view. */
typedef struct histd_view_item {
	uint64_t seq;               /* 0 for the summary message */
	uint32_t tokens;            /* its estimate (updated by changed()) */
	uint32_t flags;
	int role;                   /* Histd__V1__Role */
	/* The host's (in what was padding: the layout is unchanged); plugins
	 * do not touch it. */
	uint32_t host_ix;
	/* The stored bytes (a packed Message with its seq), borrowed; what
	 * the view returns unless HISTD_ITEM_CHANGED. */
	const uint8_t *data;
	size_t len;
	/* Unpacked on demand by ops->message, in the view's arena (never
	 * free it; allocate replacements with ops->alloc). */
	Histd__V1__Message *msg;
} histd_view_item;

typedef struct histd_view histd_view;

typedef struct histd_view_ops {
	unsigned int version;       /* HISTD_PLUGIN_VERSION */
	/* The item's message, unpacked once; NULL if it does not decode or
	 * memory ran out (the transform then returns HISTD_ECORRUPT: the
	 * host answers ENOMEM instead when the view's memory ran out). */
	Histd__V1__Message *(*message)(histd_view *v, size_t i);
	/* After changing item i's message in place: marks it changed and
	 * re-estimates its tokens. */
	void (*changed)(histd_view *v, size_t i);
	/* Removes item i (later items move down by one). Each call moves
	 * every later item: removing k of n items near the front costs
	 * about k * n moves. */
	void (*remove)(histd_view *v, size_t i);
	/* Zeroed memory that lives as long as the view; NULL if out of
	 * memory. */
	void *(*alloc)(histd_view *v, size_t size);
	char *(*strdup)(histd_view *v, const char *s);
	/* The token estimator (plugins/tokens.h) for a message. */
	uint32_t (*tokens)(const Histd__V1__Message *m);
} histd_view_ops;

/*
 * The working set of a transform: a suffix of the session (the newest
 * messages after the summary, as many as loaded), the system messages
 * before it, and the summary message, in seq order with system messages
 * first. Items are owned by the view.
 */
struct histd_view {
	const histd_view_ops *ops;
	histd_view_item *items;
	size_t n;
	/* 1 when no older message (after the summary) exists beyond items. */
	int complete;
	/* Set by a transform that chose where the view starts (a window):
	 * older messages would not be shown even if loaded. */
	int bounded;
	/* The summary this view starts with, or NULL. */
	const Histd__V1__Summary *summary;
	int64_t now_us;
	void *host;                 /* the pipeline's; plugins do not touch */
};

/* The totals after_append sees (all O(1) to obtain). */
typedef struct histd_session_totals {
	uint64_t message_count;     /* stored messages */
	uint64_t token_total;       /* their estimate */
	uint64_t last_seq;
	uint64_t first_seq;
	/* Messages and tokens after the newest summary (what the CONTEXT
	 * view would show before window and masking). */
	uint64_t messages_after_summary;
	uint64_t tokens_after_summary;
	/* created_at of the oldest message after the summary; 0 unknown. */
	int64_t oldest_after_summary_us;
	int64_t now_us;
} histd_session_totals;

/*
 * A reduce call. The compaction decides how many of the oldest messages
 * to summarize (n_covered, a safe boundary: the kept messages hold the
 * calls of all their results, and no covered message holds a call whose
 * result is not stored yet: histd_first_open_call) and asks its
 * summarizer. The host refuses a cut that is not safe (EINTERNAL) and an
 * empty text (or only white space: EUNAVAILABLE), and stores nothing
 * then.
 */
typedef struct histd_reduce {
	/* In: every message after the previous summary, oldest first, system
	 * messages left out (they stay verbatim). Borrowed. */
	Histd__V1__Message *const *messages;
	size_t n_messages;
	/* In: the previous summary, or NULL. */
	const Histd__V1__Summary *previous;
	/* In: tokens and count of the system messages the view keeps. */
	uint64_t system_tokens;
	uint32_t system_count;
	/* In: the Reduce request's bounds (0: unused). None set: the
	 * plugin's own policy (keep its recent tail, summarize the rest). */
	uint64_t max_tokens;
	uint32_t max_entries;
	uint64_t older_than_s;
	int64_t now_us;
	/* Out: how many of messages[] the summary covers (0: nothing to
	 * do, the rest of Out unset), and the summary. */
	size_t n_covered;
	char *text;                 /* malloc'ed; the caller frees */
	char *model;                /* malloc'ed; the caller frees */
	uint32_t input_tokens;
	uint32_t output_tokens;
	/* Out, optional (the host zeroes it; the built-in compaction sets
	 * its max_summary_tokens): the most tokens (tokens.h) the summary
	 * text may hold, 0 for no bound. The host cuts a longer text to fit,
	 * on a UTF-8 boundary, and logs it. */
	uint32_t max_summary_tokens;
} histd_reduce;

typedef struct histd_plugin histd_plugin;

struct histd_plugin {
	/* HISTD_PLUGIN_VERSION the plugin was written against. */
	unsigned int version;
	/* Unique in the registry; [a-z0-9_]+. */
	const char *name;

	/* Required. Parses the options (n pairs, keys unique, borrowed) into
	 * *state (may stay NULL). Unknown keys are an error. On error *state
	 * is untouched and err holds a one-line message. */
	int (*configure)(const histd_plugin_opt *opts, size_t n, void **state,
			 char *err, size_t cap);
	/* Frees a state configure made; required with a non-NULL state. */
	void (*release)(void *state);

	/* Optional. See above. */
	int (*transform)(void *state, histd_view *v);

	/* Optional. 1 to ask for a reduce, 0 not. Must not block. */
	int (*after_append)(void *state, const histd_session_totals *t);

	/* Optional. 0 with r's Out filled (n_covered 0: nothing needed
	 * compaction), or a negative code with the thread's message set
	 * (EUNAVAILABLE, ELIMIT: retried with backoff). Blocks. */
	int (*reduce)(void *state, histd_reduce *r);

	/* Version 2. Optional, an efficiency hint: with this many of the
	 * newest messages loaded, transform decides without asking for
	 * more (a window of max_messages N: N + 1); 0 for no bound. The host
	 * loads the largest hint of the pipeline first (else its default);
	 * HISTD_PLUGIN_MORE still applies, so a low hint costs a second
	 * pass, never a different view. */
	uint32_t (*newest_needed)(void *state);
};

/* What a shared object exports, under this symbol name: a function that
 * returns its plugin (static storage) for the host's plugin version, or
 * NULL if it does not support that version. */
#define HISTD_PLUGIN_ENTRY "histd_plugin_entry"
typedef const histd_plugin *(*histd_plugin_entry_fn)(unsigned int host_version);

/* ---------------------------------------------------------------------- */
/* The registry and the pipeline (pipeline.c): host side                  */

/* Registers a plugin after validating it (EINVALID says what is wrong,
 * EEXISTS for a taken name). The struct is borrowed for the life of the
 * process. Built-in plugins are registered on first use. Thread-safe, but
 * meant for start-up. */
int histd_plugin_register(const histd_plugin *p);

/* The plugin registered under name, or NULL. */
const histd_plugin *histd_plugin_find(const char *name);

/* Loads a shared object (dlopen), checks its version and registers its
 * plugin (loader.c). EINVALID with the path and reason. */
int histd_plugin_load(const char *path);

/* Loads each path of a comma-separated list; stops at the first error. */
int histd_plugin_load_list(const char *paths);

/* A configured pipeline: plugins with their states, in order. */
typedef struct histd_pipeline histd_pipeline;

/*
 * Builds a pipeline from a session's config (field names the config in
 * errors, e.g. "config"). c NULL or c->pipeline NULL: *out = the default
 * pipeline given (may be NULL: empty). EINVALID naming the field path for
 * an unknown plugin or a bad option. *out freed with histd_pipeline_free.
 */
int histd_pipeline_build(const Histd__V1__SessionConfig *c,
			 const char *field, const histd_pipeline *def,
			 histd_pipeline **out);

/* Validates a config as CreateSession/UpdateSession must (as build, then
 * frees). */
int histd_pipeline_validate(const Histd__V1__SessionConfig *c,
			    const char *field);

/*
 * Parses a pipeline from text (the server's default-pipeline option):
 * plugins separated by ';', each a name optionally followed by ':' and
 * key=value pairs separated by ','. Example:
 *   "compaction:auto_reduce_when=tokens>=100000;masking:keep_recent_results=3;window:max_tokens=120000"
 * (values cannot hold ',' or ';')
 * "" or NULL: an empty pipeline. EINVALID naming `field`.
 */
int histd_pipeline_parse(const char *spec, const char *field,
			 histd_pipeline **out);

/* A copy that shares nothing mutable (NULL in, NULL out). */
int histd_pipeline_dup(const histd_pipeline *p, histd_pipeline **out);

void histd_pipeline_free(histd_pipeline *p);

size_t histd_pipeline_len(const histd_pipeline *p);
/* The i-th plugin and its state. */
const histd_plugin *histd_pipeline_plugin(const histd_pipeline *p, size_t i,
					  void **state);

/*
 * Runs every transform in order on v, then the fix-up (see above).
 * Returns 0; HISTD_PLUGIN_MORE when a transform needs older messages or
 * when the view is incomplete and no transform bounded it (load more,
 * make a new view, run again); or a negative code.
 */
int histd_pipeline_transform(const histd_pipeline *p, histd_view *v);

/* 1 if some plugin's after_append asks for a reduce. */
int histd_pipeline_after_append(const histd_pipeline *p,
				const histd_session_totals *t);

/* The first plugin with a reduce hook, or -1 (then the host uses
 * compaction with its defaults). */
int histd_pipeline_reducer(const histd_pipeline *p);

/* The largest newest_needed hint of p's plugins, or 0 when none gives
 * one. */
uint32_t histd_pipeline_newest_needed(const histd_pipeline *p);

/* ---------------------------------------------------------------------- */
/* Views (pipeline.c)                                                      */

/* An empty view with its arena. Free with histd_view_free. */
histd_view *histd_view_new(void);
void histd_view_free(histd_view *v);
/* Appends an item that borrows data (a stored record: packed Message with
 * seq); reads its role and block kinds from the bytes. 0, ENOMEM, or
 * ECORRUPT if the bytes are not a message. */
int histd_view_push_record(histd_view *v, uint64_t seq, uint32_t tokens,
			   const uint8_t *data, size_t len);
/* Appends an item that borrows data whose role and HISTD_ITEM_* flags the
 * caller knows (a message it made): no scan. 0 or ENOMEM. */
int histd_view_push_known(histd_view *v, uint64_t seq, uint32_t tokens,
			  const uint8_t *data, size_t len, int role,
			  uint32_t flags);
/* Appends an item holding m (allocated in the view's arena or borrowed
 * for the view's life), marked changed, with extra flags. */
int histd_view_push_message(histd_view *v, Histd__V1__Message *m,
			    uint32_t flags);
/* Role and HISTD_ITEM_* block flags of a packed Message, read from the
 * bytes without unpacking. 0 or ECORRUPT (no message set). */
int histd_message_scan(const uint8_t *p, size_t len, int *role,
		       uint32_t *flags);
/* The message of item i, unpacked (same as v->ops->message). */
Histd__V1__Message *histd_view_message(histd_view *v, size_t i);

/* One tool block of a view item (histd_view_tools). */
typedef struct histd_view_tool {
	uint32_t kind;        /* HISTD_ITEM_CALLS or HISTD_ITEM_RESULTS */
	uint32_t block;       /* its index in the message's content */
	const char *id;       /* tool_call.id or tool_result.tool_call_id */
	const char *name;     /* tool_call.name or tool_result.tool_name */
} histd_view_tool;

/*
 * The tool_call and tool_result blocks of item i, in content order, as
 * an array in the view's arena (*refs NULL when *n is 0). An item whose
 * message is unpacked (item->msg set) is read from it, so changes made
 * in place show; otherwise they are read from the item's bytes without
 * unpacking, once per item (histd_view_mask_result keeps its blocks and
 * ids). 0, ENOMEM, or
 * ECORRUPT if the bytes do not decode. Lets the built-in plugins and the
 * fix-up find tool ids without unpacking whole messages.
 */
int histd_view_tools(histd_view *v, size_t i, const histd_view_tool **refs,
		     size_t *n);
/*
 * Replaces, in item i's bytes, the tool result of content block `block`
 * (numbered as histd_view_tools numbers them) by one text block `text`,
 * keeping its tool_call_id, tool_name and is_error: what unpacking the
 * message, replacing the block's tool_result and packing gives, without
 * unpacking. The item's bytes become the new ones (in the view's arena;
 * the stored bytes are never written) and its tokens are re-estimated
 * (a message of other blocks too: from its stored estimate). *done is 0,
 * and nothing changes, when the item is unpacked already, or its bytes
 * are not the plain shape this reads (a block with another of the
 * oneof's fields; in a message of several blocks, a result with other
 * than text blocks, or a saturated estimate): the caller then unpacks
 * the message and changes it. 0 or ENOMEM.
 */
int histd_view_mask_result(histd_view *v, size_t i, uint32_t block,
			   const char *text, int *done);
/* Arena allocation (same as v->ops->alloc). */
void *histd_view_alloc(histd_view *v, size_t size);
/* Removes items [i, i + k) (k cut at the end of the view) with one move
 * of the items after them: what k calls of ops->remove at i leave, at
 * the cost of one. For the host and the built-in plugins (a shared
 * object cannot call it). */
void histd_view_remove_range(histd_view *v, size_t i, size_t k);
/* How many items removals (ops->remove, histd_view_remove_range, the
 * fix-up) have moved in v since histd_view_new: a cost figure for
 * tests. */
size_t histd_view_moved(const histd_view *v);

/*
 * The fix-up alone: orders system, summary, rest; removes tool blocks
 * without partners (and messages left empty). 0 or ENOMEM/ECORRUPT.
 */
int histd_view_fixup(histd_view *v);
/* The seq of the newest item of v holding a tool_result whose tool_call
 * no item of v holds (what the fix-up would drop), in *seq; 0 when there
 * is none. 0 or ENOMEM/ECORRUPT. */
int histd_view_last_unanswered(histd_view *v, uint64_t *seq);
/* Orders v's items system messages first, then the summary, then the rest,
 * each kind in its order (as a view is handed to transforms): 0 or
 * ENOMEM. */
int histd_view_partition(histd_view *v);

/*
 * Safe starts. For a run of messages m[0..n) (no system messages), sets
 * safe[s] = 1 where keeping m[s..n) splits nothing: every tool_result in
 * it answers a tool_call in it, and m[s] does not continue an assistant
 * turn begun at m[s-1] (its reasoning or tool calls). safe[n] = 1 always;
 * safe[0] = 1 only if m[0] itself qualifies and `first_is_start` (nothing
 * older, or the caller knows m[0] starts a turn). The item form reads the
 * view's items from..n_items (their tool ids by histd_view_tools: no
 * unpacking).
 */
int histd_safe_starts_items(histd_view *v, size_t from, unsigned char *safe,
			    int first_is_start);
/* As histd_safe_starts_items, but only safe[lo..n_items-from] are set,
 * each as the full scan sets it (a start depends only on the messages
 * from it on, so the scan stops at lo); the rest of safe is untouched. */
int histd_safe_starts_items_from(histd_view *v, size_t from, size_t lo,
				 unsigned char *safe, int first_is_start);
int histd_safe_starts_msgs(Histd__V1__Message *const *m, size_t n,
			   unsigned char *safe, int first_is_start);

/*
 * Open tool calls. For the messages after a summary m[0..n) (the whole
 * rest of the session), *at is the index of the first message holding a
 * tool_call that no tool_result in m[0..n) answers (yet), or n when every
 * call is answered. A compaction covers at most m[0..*at): its result may
 * still be appended, and a covered call would leave it without its call
 * in the CONTEXT view. 0 or ENOMEM.
 */
int histd_first_open_call(Histd__V1__Message *const *m, size_t n,
			  size_t *at);

/* ---------------------------------------------------------------------- */
/* Built-in plugins                                                        */

extern const histd_plugin histd_plugin_window;
extern const histd_plugin histd_plugin_masking;
extern const histd_plugin histd_plugin_compaction;

/*
 * Whether a state made by histd_plugin_window's configure has retention =
 * delete: the host then deletes, after appends and off the request path,
 * the non-system messages older than where that window starts (see
 * server/context.h). 0 for NULL. The host finds the window of a pipeline
 * by comparing histd_pipeline_plugin's answer with &histd_plugin_window.
 */
int histd_window_retention_delete(const void *state);

/* Text that starts the summary message of the CONTEXT view. */
#define HISTD_SUMMARY_PREFIX "[Earlier conversation summary: "

#endif
