// What each socket to a peer carries when all carry at once: measured once,
// when the pair connects at set-up, where its sockets run over several NICs
// (RCOLL_SOCKET_STRIPE), so that the lane schedule (lane_schedule.h) gives each
// a share in proportion: a 1 Gbit/s NIC beside a 250 Mbit/s one takes four
// messages of every five, not one of two.
//
// The measurement is over a time window, not a byte count. A host's ranks
// share its NICs, and their pairs measure while others do: had each lane
// carried a fixed number of bytes, another pair's fast lane would finish
// early and leave its slow lane competing with ours alone, so our slow lane
// would look slower than it is (at 2 x 4 ranks, a 250 Mbit/s link beside a
// 1 Gbit/s one got weights of 1 to 4 of 16, 2.1 to 2.6 on average). Over one
// window every pair streams on all of its lanes at once, so a pair that
// joins or leaves takes about the same part of each link from ours. TCP
// still shares a slow link unevenly between flows over so short a time, so
// single pairs read from 1 to 7 in that layout; their mean comes out right
// (3.7 to 4.3, where 4 is the links' ratio).
//
// The exchange: the acceptor says go (one byte on lane 0); the dialer
// streams zeros on every lane, keeping little unsent (TCP_NOTSENT_LOWAT, so
// that what it queued drains fast); the acceptor counts what each lane
// brings between kProbeWarmup (past the links' bursts and TCP's start) and
// kProbeWarmup + kProbeWindow after the first byte, then says stop (one byte
// on lane 0); the dialer ends each lane with a byte 1 and the acceptor reads
// up to it. The acceptor turns the rates into weights (1 to kMaxWeight, the
// fastest lane kMaxWeight) and sends them back on lane 0, so both ends hold
// the same. Sockets are non-blocking; every wait is bounded by `deadline`
// (RcollError kTimeout / kPeer, naming both ranks).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "socket_util.h"

namespace rcoll {

constexpr std::chrono::milliseconds kProbeWarmup{15};
constexpr std::chrono::milliseconds kProbeWindow{50};
constexpr int kMaxWeight = 16;

std::vector<int> probeLanesAsDialer(const std::vector<int>& fds, Deadline deadline, int rank, int peer);
// `rates`: each lane's measured bytes per second.
std::vector<int> probeLanesAsAcceptor(const std::vector<int>& fds, Deadline deadline, int rank, int peer,
                                      std::vector<double>* rates);

// Rates to weights: within a fifth of the fastest counts as the fastest (a
// short measurement on busy cores varies that much, and equal NICs should
// share equally), the others in proportion, at least 1.
std::vector<int> weightsFromRates(const std::vector<double>& rates);

// "16 (58 MB/s), 6 (21 MB/s)": the shares for an INFO line, each with its
// rate where the caller measured them (`rates` empty: the other end did).
std::string describeShares(const std::vector<int>& weights, const std::vector<double>& rates);

}  // namespace rcoll
