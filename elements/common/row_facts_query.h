/* The row-facts handshake: with several ranks, csvvideosrc sends this custom query downstream
 * before it plans an epoch, with the row facts (row_facts.h) it learned from the clips of the
 * epochs before; the ddptrainsink downstream posts them to its run's c10d store, waits for every
 * rank's, and answers with all of them, so that every rank's source applies the same facts at the
 * same epoch. Elements in between forward it (the default for custom queries). */
#pragma once

#include <gst/gst.h>

#include <cstdint>
#include <climits>
#include <string>

namespace videotrain {

// The epoch of a probe at start: a trainer answers it at once (agreed, no facts), so that the
// source knows whether anything downstream can relay its facts.
constexpr uint32_t kRowFactsProbe = UINT32_MAX;
// The epoch of a notice: `mine` holds facts just learned, which the trainer keeps for its
// checkpoints (answered at once).
constexpr uint32_t kRowFactsLearned = UINT32_MAX - 1;

GstQuery *row_facts_query_new(uint32_t epoch, const std::string &mine);
bool is_row_facts_query(GstQuery *query);
// The trainer's side: the epoch and the sender's facts.
bool row_facts_query_request(GstQuery *query, uint32_t *epoch, std::string *mine);
// ok: `text` is every rank's facts; else why the ranks could not agree.
void row_facts_query_answer(GstQuery *query, bool ok, const std::string &text);

enum class RowFactsReply { kNobody, kAgreed, kFailed };
// After gst_pad_peer_query(): kNobody when no trainer answered; *text as answered.
RowFactsReply row_facts_query_reply(GstQuery *query, std::string *text);

}  // namespace videotrain
