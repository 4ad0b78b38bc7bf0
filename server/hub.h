/*
 * The Subscribe hub: fans a session's changes out to its subscribers.
 *
 * Changes come from the driver's change hook (histd_hub_notify), in
 * revision order per session. The hub packs each change once into a
 * reference-counted HistoryEvent and queues a reference on every subscriber
 * of that session. Each subscriber has a bounded queue and at most one send
 * in flight; one that falls behind is ended with HISTD_ELIMIT and the seq to
 * resume from. Nothing a subscriber does slows appends or other
 * subscribers: notify never blocks on a subscriber.
 *
 * The hub knows no gRPC: the transport gives it a stream as a pair of
 * callbacks (histd_sub_ops).
 *
 * Lifecycle of a subscriber, as the transport drives it:
 *   histd_hub_subscribe  registers; live events are queued, not sent
 *   (transport reads the snapshot from the driver, builds replay events)
 *   histd_hub_start      replay events first, then queued live events with
 *                        revision > snapshot revision; sending starts
 *   ops->send / histd_hub_sent   one event at a time
 *   ops->finish          at most once: overflow, session deleted, shutdown
 *   histd_hub_unsubscribe  exactly once, when the call is over; frees it
 */
#ifndef HISTD_HUB_H
#define HISTD_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "driver.h"

/* A packed Histd__V1__HistoryEvent, shared by every subscriber it goes to. */
typedef struct histd_event {
	int refs;                 /* atomic; histd_event_ref / _unref */
	enum histd_change_kind kind;
	uint64_t revision;
	/* Highest message seq this event carries or accounts for (appended,
	 * replaced: the last message; cleared: cleared_to_seq); 0 if none. */
	uint64_t last_seq;
	/* Cleared and replaced: the cleared_to_seq, the seq up to which it
	 * removed messages; 0 for other events. */
	uint64_t cleared_to_seq;
	/* The next event of the same change, at the same revision, when the
	 * change was too large for one (hub config max_event_bytes); this
	 * event holds a reference on it. Subscribers queue, and the hub's
	 * limits count, the first one only. */
	struct histd_event *next_part;
	/* The life of the session its change was made to
	 * (histd_change.incarnation); 0: unknown, or no change. */
	uint64_t incarnation;
	size_t len;
	uint8_t data[];           /* the packed HistoryEvent */
} histd_event;

void histd_event_ref(histd_event *ev);
void histd_event_unref(histd_event *ev);

/* Packs a change into an event with one reference; NULL if out of memory
 * (or if the change carries no records where it needs them). */
histd_event *histd_event_from_change(const histd_change *c);

/*
 * Replay events for a subscriber that starts after after_seq, from a
 * snapshot read (records with seq > after_seq at `revision`):
 * `replaced` 0: MessagesAppended events of at most `chunk` messages each;
 * `replaced` 1: one SessionReplaced event first (the session was cleared
 * or replaced after after_seq), holding the records from the first on.
 * No event is larger than max_bytes (0: no bound) unless it holds a single
 * record: a client's receive limit (gRPC's default is 4 MiB) must not
 * refuse a replay that GetMessages pages would return. The records that do
 * not fit follow in MessagesAppended events. Every event carries
 * `revision`. *out is a malloc'ed array of events, each with one
 * reference; 0 events when there is nothing to replay (and not replaced).
 * Returns 0 or ENOMEM.
 */
int histd_event_replay(const char *session_id, uint64_t revision,
		       const histd_records *records, int replaced,
		       uint64_t cleared_to_seq, size_t chunk, size_t max_bytes,
		       histd_event ***out, size_t *n_out);

typedef struct histd_sub_ops {
	/* Start sending ev. The hub keeps its reference until histd_hub_sent;
	 * the transport takes its own if it needs the bytes longer. Never
	 * called while a send is in flight or after finish. Returns 0 if the
	 * send started; non-zero if the stream cannot send any more (the hub
	 * then stops sending to it and waits for unsubscribe). */
	int (*send)(void *stream, histd_event *ev);
	/* End the stream: err 0 for OK, or HISTD_ELIMIT (fell behind, with
	 * resume_after_seq: every message up to it was sent; lower than the
	 * last seq sent when a clear, replace or truncate that removed seqs
	 * below that was not sent, so that the replay from it is a replaced
	 * event), HISTD_EUNAVAILABLE (shutting down). msg is one line. Called
	 * at most once; may be called while a send is in flight (the transport
	 * sends the status after it). */
	void (*finish)(void *stream, int err, const char *msg,
		       uint64_t resume_after_seq);
	/* Optional (needed by histd_hub_start_replay with more set): the
	 * replay handed over so far is sent and more of it is to come. The
	 * transport reads the next part and hands it over with
	 * histd_hub_replay_more, later or from another thread (never from
	 * within this call); live events wait meanwhile. Returns 0 if it
	 * will; non-zero if the stream cannot send any more (as for send). */
	int (*more)(void *stream);
	/* Optional (needed with config end_grace_us): cancel the stream at
	 * once with RESOURCE_EXHAUSTED and msg, dropping the send in flight,
	 * which then completes failed. Called when a stream ended by
	 * HISTD_ELIMIT has not taken its last event for end_grace_us: its
	 * client reads nothing, so the status would never go out. */
	void (*abort)(void *stream, const char *msg);
} histd_sub_ops;
/* The hub may call send, finish, more and abort with its own locks held:
 * they must not call back into the hub on their own thread (other threads
 * may), and the transport must not hold a lock of its own that those
 * callbacks take when it calls into the hub. */

typedef struct histd_hub_config {
	size_t queue_max;          /* changes queued per subscriber; > 0 */
	size_t max_subscribers;    /* in total; 0: no limit */
	size_t max_per_session;    /* per session, not counting streams that
	                            * are ended; 0: no limit */
	/* An appended or replaced change larger than this goes out as several
	 * events at its revision (as a replay does, histd_event_replay), so
	 * that a client's receive limit takes each; 0: never split. */
	size_t max_event_bytes;
	/* A stream ended as too slow whose send in flight has not completed
	 * this long after is aborted (ops.abort), so that its client's
	 * connection no longer holds it; 0: never. */
	int64_t end_grace_us;
} histd_hub_config;

typedef struct histd_hub histd_hub;
typedef struct histd_sub histd_sub;

int histd_hub_new(histd_hub **out, const histd_hub_config *cfg);
/* Frees the hub; every subscriber must have been unsubscribed. */
void histd_hub_free(histd_hub *h);

/* The driver's change hook: histd_driver_set_notify(d, histd_hub_notify,
 * hub). Fast when nobody subscribes to the session; never blocks on a
 * subscriber. */
void histd_hub_notify(void *hub, const histd_change *c);

/* Registers a subscriber of (tenant, session_id) that starts after
 * after_seq (it holds every seq up to it: the resume seq starts there).
 * ELIMIT past the configured counts; EUNAVAILABLE after shutdown. */
int histd_hub_subscribe(histd_hub *h, const char *tenant,
			const char *session_id, uint64_t after_seq,
			const histd_sub_ops *ops, void *stream, histd_sub **out);

/* Queues the replay events (taking over their references, not the array,
 * which the caller frees) in front of the
 * live ones, drops live events with revision <= snapshot_revision, and
 * starts sending. Called once, after subscribe. */
void histd_hub_start(histd_sub *s, histd_event **replay, size_t n,
		     uint64_t snapshot_revision);

/* histd_hub_start for a replay read in parts, so that a subscriber holds
 * one part at a time, not a whole session: with `more` set, ops->more is
 * called once these events are sent. `incarnation` is the life of the
 * session the snapshot read (histd_session.incarnation; 0: unknown):
 * changes made to another life (one deleted before the snapshot, whose
 * notices came late) are dropped, not sent. */
void histd_hub_start_replay(histd_sub *s, histd_event **replay, size_t n,
			    uint64_t snapshot_revision, uint64_t incarnation,
			    int more);

/* The transport, answering ops->more: the next replay events (references
 * taken over, as by histd_hub_start), and whether more is to come (0: the
 * replay is over; live events follow). */
void histd_hub_replay_more(histd_sub *s, histd_event **replay, size_t n,
			   int more);

/* The transport: the send started by ops->send completed (ok 0: failed,
 * the stream is broken). */
void histd_hub_sent(histd_sub *s, int ok);

/* The transport: the call is over. Exactly once per subscriber, after any
 * in-flight send completed. Frees the subscriber. */
void histd_hub_unsubscribe(histd_sub *s);

/* The kind of an event that is no storage change (a plugin error). */
#define HISTD_EVENT_PLUGIN_ERROR 100

/*
 * Publishes a HistoryEvent plugin_error to the session's subscribers (the
 * context pipeline's error sink, server/context.h). It is no storage
 * change: it carries the session's current revision, and a subscriber
 * whose snapshot is at that revision still receives it (the snapshot
 * filter applies to changes only). A subscriber already sent a later
 * revision (a change that raced the report, or its snapshot) receives it
 * at that later revision, so that its events stay in revision order.
 * incarnation: the session life it is about (0: any); a stream that
 * follows another life does not receive it.
 * Never blocks; dropped when nobody subscribes or memory runs out.
 */
void histd_hub_publish_plugin_error(void *hub, const char *tenant,
				    const char *session_id, uint64_t revision,
				    uint64_t incarnation, const char *plugin,
				    const char *message, int will_retry);

/* Ends every stream with HISTD_EUNAVAILABLE; later subscribes fail. */
void histd_hub_shutdown(histd_hub *h);

/* Live subscribers (for metrics and tests). */
size_t histd_hub_count(histd_hub *h);

#endif
