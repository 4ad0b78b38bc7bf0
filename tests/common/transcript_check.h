/*
 * Checks on transcripts that unit and integration tests share (cmocka).
 */
#ifndef HISTD_TRANSCRIPT_CHECK_H
#define HISTD_TRANSCRIPT_CHECK_H

#include "histd/v1/histd.pb-c.h"

/* The text of m's first block when it is a text block, else "". */
const char *tc_text_of(const Histd__V1__Message *m);

/* Fails the test unless every tool_result of g (first blocks) answers a
 * tool_call before it, and every tool_call has its result after it. */
void tc_assert_pairs_whole(const Histd__V1__GetMessagesResponse *g);

#endif
