// What the transfers over each edge (this rank and one peer, one way) reach,
// measured where a transport can see a payload cross: the bytes of its large
// messages and the time during which at least one of them was on the way. A
// job's watch (python/rcoll/_health.py) turns the counters into bandwidths
// and names an edge far below the others (a degraded link or vNIC).
//
// Only messages of at least kMeteredBytes count: a small one's time is
// latency and system calls, not bandwidth. Time is counted once however many
// messages (lanes, queue pairs) overlap, so that several sockets to a peer
// add up to the edge's rate rather than each one's share of it.
//
// began()/ended() come from whichever thread drives the transport (its
// progress thread, or a caller running an op inline, handed over under the
// communicator's lock), one at a time; sample() from any thread (relaxed
// atomics: a reader may see a message's bytes a moment before its time,
// which a window of seconds does not notice). Each transport has its own
// meter: where a peer is served by several (the collectives' and the
// point-to-point engine's, or rails), their times add up rather than merge.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport.h"

namespace rcoll {

class EdgeMeter {
 public:
  static constexpr size_t kMeteredBytes = size_t{64} << 10;

  explicit EdgeMeter(int peers) : peers_(new Peer[static_cast<size_t>(peers > 0 ? peers : 0)]), size_(peers) {}

  static bool metered(size_t bytes) { return bytes >= kMeteredBytes; }

  // A metered payload to or from `peer` started crossing.
  void began(int peer) {
    Peer* p = at(peer);
    if (p == nullptr) return;
    if (p->active++ == 0) p->since = Clock::now();
  }
  // It crossed whole (`bytes`), or was given up (0 bytes: a failed link's time still counts).
  void ended(int peer, size_t bytes) {
    Peer* p = at(peer);
    if (p == nullptr || p->active == 0) return;
    const Clock::time_point now = Clock::now();
    p->nanos.fetch_add(
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - p->since).count()),
        std::memory_order_relaxed);
    p->since = now;  // what still overlaps counts from here
    p->bytes.fetch_add(bytes, std::memory_order_relaxed);
    --p->active;
  }

  struct Sample {
    uint64_t bytes = 0;
    uint64_t nanos = 0;
  };
  Sample sample(int peer) const {
    const Peer* p = peer >= 0 && peer < size_ ? &peers_[static_cast<size_t>(peer)] : nullptr;
    if (p == nullptr) return {};
    return {p->bytes.load(std::memory_order_relaxed), p->nanos.load(std::memory_order_relaxed)};
  }
  // Appends every peer this meter has seen, as `transport`'s, measured going `outgoing` or not.
  void appendTo(std::vector<EdgeTraffic>* out, const char* transport, bool outgoing) const {
    for (int peer = 0; peer < size_; ++peer) {
      const Sample s = sample(peer);
      if (s.bytes > 0 || s.nanos > 0) out->push_back({peer, outgoing, transport, s.bytes, s.nanos});
    }
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Peer {
    int active = 0;  // metered payloads on the way
    Clock::time_point since;
    std::atomic<uint64_t> bytes{0};
    std::atomic<uint64_t> nanos{0};
  };
  Peer* at(int peer) { return peer >= 0 && peer < size_ ? &peers_[static_cast<size_t>(peer)] : nullptr; }

  std::unique_ptr<Peer[]> peers_;
  int size_;
};

}  // namespace rcoll
