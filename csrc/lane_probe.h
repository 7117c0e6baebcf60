// What each socket to a peer carries when all carry at once: measured once,
// when the pair connects at set-up, where its sockets run over several NICs
// (RCOLL_SOCKET_STRIPE), so that the lane schedule (lane_schedule.h) gives each
// a share in proportion: a 1 Gbit/s NIC beside a 250 Mbit/s one takes four
// messages of every five, not one of two.
//
// Once the acceptor says go (one byte on lane 0), the dialer writes
// kProbeBytes on every lane at once; the acceptor times
// each lane's last byte from the first byte on any lane, turns the rates into
// weights (1 to kMaxWeight, the fastest lane kMaxWeight) and sends them back
// on lane 0. Both ends then hold the same weights. Sockets are non-blocking;
// every wait is bounded by `deadline` (RcollError kTimeout / kPeer, naming
// both ranks).
#pragma once

#include <cstddef>
#include <vector>

#include "socket_util.h"

namespace rcoll {

constexpr size_t kProbeBytes = size_t{2} << 20;
constexpr int kMaxWeight = 16;

std::vector<int> probeLanesAsDialer(const std::vector<int>& fds, Deadline deadline, int rank, int peer);
// `rates`: each lane's measured bytes per second.
std::vector<int> probeLanesAsAcceptor(const std::vector<int>& fds, Deadline deadline, int rank, int peer,
                                      std::vector<double>* rates);

}  // namespace rcoll
