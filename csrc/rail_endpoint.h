// What a rails transport (rails_transport.h) needs of each rail, beyond the
// transport interface, to move a pair's messages off a port whose link failed
// (rails_failover.cc). The verbs transport is one.
//
//  * Streams: the connection to a peer carries several independently ordered
//    sequences of messages each way. Stream 0 is what isend()/irecv() use;
//    the others carry the messages of a failed rail, in that rail's order, so
//    that both ends agree on them however the rest of their traffic
//    interleaves.
//  * A link failure (TransportFailure::link) is reported once per peer, after
//    everything that arrived before it has been counted: arrived() is then
//    exact, which is what the two ends trade to settle which of the failed
//    rail's messages must go again.
//  * Notes: the small message the two rails transports trade about a failed
//    rail, carried on a rail that still works.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport.h"

namespace rcoll {

// A rails transport has at most this many rails (a note's `lost` has a bit
// for each), and a rail endpoint carries 1 + this many streams.
constexpr size_t kMaxRails = 63;

// "The messages of rail `home` go on `carrier` from now on, and this many
// of yours arrived here": what each end of a pair tells the other each time
// a home rail's messages move (rails_failover.cc).
struct RailNote {
  int peer = -1;         // who sent it (taken) or whom it is for (sent)
  uint32_t home = 0;     // the rail whose messages moved
  uint32_t carrier = 0;  // the rail that carries them from now on
  uint32_t number = 0;   // the writer's notes to the reader so far, this one included (a later one supersedes)
  uint64_t lost = 0;     // bit r: the writer could not use rail r to the reader (failed, failing, not connected)
  uint64_t arrived = 0;  // how many of the home rail's messages from the note's reader arrived at its writer
};

class RailEndpoint {
 public:
  virtual ~RailEndpoint() = default;

  // Called once by the rails transport that owns this rail: from then on a
  // port that goes down fails its connections as link failures at once (there
  // is another port to go on over), and a link failure does not count its
  // peer as lost (the rails transport decides: Transport::lostPeers).
  virtual void joinRails() = 0;

  virtual Request* isendOn(int stream, int peer, const WireHeader& header, const void* data, size_t bytes) = 0;
  virtual Request* irecvOn(int stream, int peer, const WireHeader& expected, void* data, size_t bytes) = 0;
  // Peers whose connection failed with TransportFailure::link, each once, once arrived() is final.
  virtual std::vector<int> takeLinkFailures() = 0;
  // `peer`'s messages on `stream` that arrived here.
  virtual uint64_t arrived(int peer, int stream) const = 0;
  // Starts connecting `peer` when it connects on first use and is not
  // connected yet, without a message: the rails transport connects every
  // rail of a pair at the pair's first message, so that each is ready to
  // take the others' messages over (a rail not connected cannot).
  virtual void connectAhead(int peer) = 0;
  // Takes the connection to `peer` down as a link failure: the peer said its
  // end failed. It is reported through takeLinkFailures() like any other.
  virtual void failLink(int peer, const std::string& why) = 0;
  // Whether the connection to `peer` has failed (with why).
  virtual bool connectionFailed(int peer, TransportFailure* why) const = 0;
  // Whether the connection to `peer` is up and has not failed (nor is counting what arrived).
  virtual bool usable(int peer) const = 0;
  // False when the note cannot go (the connection is not usable).
  virtual bool sendNote(const RailNote& note) = 0;
  virtual std::vector<RailNote> takeNotes() = 0;
  virtual std::string portName() const = 0;  // "mlx5_0:1"
};

}  // namespace rcoll
