/* Roll call before a process group is built (torch TUs). Without it a rank that never
 * started shows up as Gloo's "Socket Timeout" after twice the timeout, and ranks with
 * different world sizes as Gloo's "[enforce fail at address.cc] ... 136 vs 272".
 *
 * Every rank sets join/<rank> to its world size and counts itself in `joined`. Rank 0
 * polls that one counter (not W keys, which W ranks polling would make O(W^2) store
 * traffic) until all have joined, a rank reports a different world size, or the deadline;
 * then it reads the keys once and posts a verdict that the other ranks wait for. A rank
 * that sees rank 0's world size differ from its own says so at once.
 *
 * A RollCallWatch hears, every ~15 s of waiting, which ranks are still missing and until when
 * the wait lasts, and can cancel the wait (a stop) within tens of milliseconds. */
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
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

// "1, 3": the ranks below `world` that have not set their join key (never blocks).
inline std::string missing_ranks(c10d::Store &store, int world) {
  std::string missing;
  for (int r = 0; r < world; r++)
    if (!store.check({key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  return missing;
}

// Local wall-clock time `from_now` ahead, HH:MM:SS.
inline std::string clock_in(std::chrono::milliseconds from_now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now() +
                                                             std::chrono::duration_cast<std::chrono::seconds>(from_now));
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &tm);
  return buf;
}

}  // namespace roll_call_detail

// What a waiting rank tells and asks while the others have not all joined.
struct RollCallWatch {
  std::function<void(const std::string &)> waiting;  // every `every` s of waiting: who is missing, until when
  std::function<bool()> cancelled;                   // true: give up now (a stop)
  // The report interval: 15 s, or a quarter of a shorter timeout.
  static std::chrono::milliseconds interval(std::chrono::milliseconds timeout) {
    return std::max(std::chrono::milliseconds(1000), std::min(std::chrono::milliseconds(15000), timeout / 4));
  }
};

// Returns when all `world` ranks are there with the same world size; else throws
// std::runtime_error naming the ranks that never joined or the world sizes seen. Rank 0
// decides by `deadline`; the others wait for its verdict until `timeout` after they got
// here (rank 0 was up before they could reach its store).
inline void await_ranks(c10d::Store &store, int rank, int world, std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds timeout, const RollCallWatch &watch = {}) {
  using namespace roll_call_detail;
  using Clock = std::chrono::steady_clock;
  const std::string me = "rank " + std::to_string(rank) + " of " + std::to_string(world);
  const auto grace = std::chrono::seconds(2);
  const auto began = Clock::now();
  const auto every = RollCallWatch::interval(timeout);
  auto next_report = began + every;
  // Called in every wait loop: a stop ends the wait; every `every` the missing ranks are told.
  auto tick = [&](Clock::time_point until) {
    if (watch.cancelled && watch.cancelled())
      throw std::runtime_error(me + " stopped while waiting for the other ranks to join (ranks missing: " +
                               missing_ranks(store, world) + ")");
    const auto now = Clock::now();
    if (!watch.waiting || now < next_report) return;
    next_report = now + every;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - now);
    const std::string missing = missing_ranks(store, world);
    watch.waiting(me + " is waiting for " + (missing.find(',') == std::string::npos ? "rank " : "ranks ") +
                  missing + " to join: " +
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - began).count()) +
                  " s so far; gives up at " + clock_in(left) + " (in " + std::to_string(left.count() / 1000) +
                  " s, timeout " + std::to_string(timeout.count() / 1000) + " s)");
  };
  // A store wait in slices, so that tick() runs (c10d's wait blocks for its whole timeout).
  auto sliced_wait = [&](const std::string &k, std::chrono::milliseconds within) {
    const auto until = Clock::now() + within;
    while (!store.check({k})) {
      tick(until);
      if (Clock::now() >= until) store.wait({k}, std::chrono::milliseconds(1));  // throws c10d's timeout
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  std::string error;
  try {
    store.set(key(rank), bytes(std::to_string(world)));
    const int64_t joined = store.add("joined", 1);
    if (rank == 0) {
      int64_t n = joined;
      while (n < world && !store.check({"mismatch"}) && Clock::now() < deadline) {
        tick(deadline);
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
      sliced_wait(key(0), timeout);
      const std::string w0 = text(store.get(key(0)));
      if (w0 != std::to_string(world)) {
        error = disagree(me, world, ", rank 0 has " + w0);
        store.set("mismatch", bytes("1"));
      } else {
        sliced_wait("verdict", timeout + grace);
        const std::string v = text(store.get("verdict"));
        if (v != "ok") error = v;
      }
      store.add("read", 1);
    }
  } catch (const std::runtime_error &e) {  // a stop (tick), or c10d's own errors that are runtime_errors
    if (error.empty() && watch.cancelled && watch.cancelled()) throw;
    if (error.empty())
      throw std::runtime_error(me + " lost the c10d store while waiting for the other ranks to join: " +
                               first_line(e.what()));
  } catch (const std::exception &e) {  // c10::Error is no runtime_error
    if (error.empty())
      throw std::runtime_error(me + " lost the c10d store while waiting for the other ranks to join: " +
                               first_line(e.what()));
  }
  if (!error.empty()) throw std::runtime_error(error);
}

}  // namespace videotrain
