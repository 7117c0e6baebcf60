// What each RDMA port ("rail") to a peer carries when all carry at once:
// measured once, when the pair connects at set-up, so that the rails take
// shares of its bytes in proportion (rails_transport.h): a 100 Gbit/s port
// beside a 25 Gbit/s one takes four bytes of every five, not one of two.
//
// The exchange runs over the rails' own messages, so it knows nothing of
// verbs. The acceptor posts kRailProbeMessages receives of kRailProbeBytes on
// every rail; the dialer posts as many sends on every rail at once (a verbs
// send waits for its receive's credit, so the acceptor's receives are there
// first). From the first message on any rail to the first rail that has
// brought all of its own, the acceptor counts what each rail brought: over
// that time every rail was busy, so the counts are the rails' rates relative
// to each other (one way, dialer to acceptor; the shares serve both ways, as
// a port's two directions run at one speed). Timing
// each rail to its own last message would not do: another pair of this host
// whose fast rail finished early would leave our slow rail less contended,
// and it would look faster than it is (lane_probe.h says the same of the
// TCP sockets). The acceptor turns the counts into weights
// (weightsFromRates, as for sockets) and sends them back on rail 0, so both
// ends hold the same. Every wait is bounded by `deadline` (RcollError
// kTimeout, or the failed message's kind, naming both ranks).
#pragma once

#include <cstddef>
#include <vector>

#include "socket_util.h"
#include "transport.h"

namespace rcoll {

constexpr size_t kRailProbeBytes = size_t{128} << 10;
constexpr int kRailProbeMessages = 32;

// `group` drives every rail (its progress()); `rails` are its children, each
// connected to `peer`. `scratch` (railProbeScratchBytes) is what the rails
// read and write: it must outlive the rails' connections, since after a
// failure a peer's write may still land in it. The acceptor's `rates` get
// each rail's bytes per second over the time all were busy.
size_t railProbeScratchBytes(size_t rails);
std::vector<int> probeRails(Transport& group, const std::vector<Transport*>& rails, const ConnectInfo& info, int peer,
                            bool dialer, Deadline deadline, char* scratch, std::vector<double>* rates);

}  // namespace rcoll
