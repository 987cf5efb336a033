/* Roll call before a process group is built (torch TUs). Without it a rank that never
 * started shows up as Gloo's "Socket Timeout" after twice the timeout, and ranks with
 * different world sizes as Gloo's "[enforce fail at address.cc] ... 136 vs 272".
 *
 * Every rank sets join/<rank> to its world size and counts itself in `joined`. Rank 0
 * polls that one counter (not W keys, which W ranks polling would make O(W^2) store
 * traffic) until all have joined, a rank reports a different world size, or the deadline;
 * then it reads the keys once and posts a verdict that the other ranks wait for. A rank
 * that sees rank 0's world size differ from its own says so at once. */
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "first_line.h"

namespace videotrain {

namespace roll_call_detail {

inline std::vector<uint8_t> bytes(const std::string &s) { return {s.begin(), s.end()}; }
inline std::string text(const std::vector<uint8_t> &v) { return {v.begin(), v.end()}; }
inline std::string key(int r) { return "join/" + std::to_string(r); }
// `others`: ", rank R has W" for each rank whose world size differs from ours.
inline std::string disagree(const std::string &me, int world, const std::string &others) {
  return "the ranks disagree on the world size: " + me + " has " + std::to_string(world) + others +
         " (set the same world-size or WORLD_SIZE on every rank)";
}

// Rank 0, once every rank joined or the time is up: "" or what is wrong.
inline std::string verdict(c10d::Store &store, int world, const std::string &me, std::chrono::milliseconds timeout) {
  std::string missing, differ;
  for (int r = 1; r <= world; r++) {  // r == world: a rank beyond ours has a larger world
    if (!store.check({key(r)})) {
      if (r < world) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      continue;
    }
    const std::string w = text(store.get(key(r)));
    if (w != std::to_string(world)) differ += ", rank " + std::to_string(r) + " has " + w;
  }
  if (!differ.empty()) return disagree(me, world, differ);
  if (missing.empty()) return "";
  const std::string waited = timeout.count() % 1000 ? std::to_string(timeout.count()) + " ms"
                                                    : std::to_string(timeout.count() / 1000) + " s";
  return (missing.find(',') == std::string::npos ? "rank " : "ranks ") + missing + " never joined: " + me +
         " waited " + waited + " for them (start every rank, with the same MASTER_ADDR:MASTER_PORT)";
}

}  // namespace roll_call_detail

// Returns when all `world` ranks are there with the same world size; else throws
// std::runtime_error naming the ranks that never joined or the world sizes seen. Rank 0
// decides by `deadline`; the others wait for its verdict until `timeout` after they got
// here (rank 0 was up before they could reach its store).
inline void await_ranks(c10d::Store &store, int rank, int world, std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds timeout) {
  using namespace roll_call_detail;
  using Clock = std::chrono::steady_clock;
  const std::string me = "rank " + std::to_string(rank) + " of " + std::to_string(world);
  const auto grace = std::chrono::seconds(2);
  std::string error;
  try {
    store.set(key(rank), bytes(std::to_string(world)));
    const int64_t joined = store.add("joined", 1);
    if (rank == 0) {
      int64_t n = joined;
      while (n < world && !store.check({"mismatch"}) && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        n = store.add("joined", 0);
      }
      error = verdict(store, world, me, timeout);
      store.set("verdict", bytes(error.empty() ? "ok" : error));
      // Keep the store (ours) up until the others have read a bad verdict, briefly.
      const auto until = Clock::now() + grace;
      while (!error.empty() && store.add("read", 0) < n - 1 && Clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else {
      store.wait({key(0)}, timeout);
      const std::string w0 = text(store.get(key(0)));
      if (w0 != std::to_string(world)) {
        error = disagree(me, world, ", rank 0 has " + w0);
        store.set("mismatch", bytes("1"));
      } else {
        store.wait({"verdict"}, timeout + grace);
        const std::string v = text(store.get("verdict"));
        if (v != "ok") error = v;
      }
      store.add("read", 1);
    }
  } catch (const std::exception &e) {  // c10::Error is no runtime_error
    if (error.empty())
      throw std::runtime_error(me + " lost the c10d store while waiting for the other ranks to join: " +
                               first_line(e.what()));
  }
  if (!error.empty()) throw std::runtime_error(error);
}

}  // namespace videotrain
