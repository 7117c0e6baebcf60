// The TCP transport's per-socket and per-pair state (tcp_transport.cc: the
// data path on one network; tcp_failover.cc: a pair's messages spread over
// several networks). Private to those two files.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "ack_watch.h"
#include "message_stash.h"
#include "request_lifecycle.h"
#include "tcp_transport.h"
#include "wire.h"

namespace rcoll {

// Headers are read into a per-connection inbox with whatever follows them,
// up to this much, then copied out: a small message costs one system call
// instead of two, and messages that queued up (a root streaming broadcasts)
// come together in one (a system call costs more than copying a few KiB that
// are hot in cache). The rest of a larger payload goes straight to its
// destination.
constexpr size_t kInboxBytes = sizeof(WireHeader) + 8192;

struct TcpTransport::TcpRequest : MessageRequest {
  size_t done = 0;          // send: header + payload bytes written; recv: payload bytes read
  uint32_t message = 0;     // several networks: its number on the pair (WireHeader::message)
  uint64_t lane_index = 0;  // several networks, a send: its place among the data messages written on its socket
};

struct TcpTransport::Connection {
  int fd = -1;
  int peer = -1;
  int lane = 0;
  std::deque<TcpRequest*> sends;
  std::deque<TcpRequest*> recvs;  // one network: the receives that read this socket, in order
  WireHeader in_header{};
  size_t in_header_got = 0;  // bytes of the incoming header read so far
  bool in_header_checked = false;
  std::string abort_text;  // payload of an incoming abort message
  // Bytes read from the socket but not yet consumed (see kInboxBytes):
  // every read of the stream takes from here first.
  std::unique_ptr<char[]> inbox{new char[kInboxBytes]};
  size_t inbox_pos = 0;
  size_t inbox_end = 0;
  // A send that was partly written when the lane failed: an abort message may
  // only follow the rest of it (finishPartialSend), and the queue is gone.
  TcpRequest unfinished;
  // The peer closed this lane at a message boundary while nothing was posted
  // on it, and other lanes to it were still open: their messages may still be
  // on the way (a peer that finished its last op and exited), so the peer
  // fails only once a receive is posted here or every lane is closed.
  bool closed_by_peer = false;
  bool metering = false;       // the payload being read counts in TcpTransport::meter_
  bool failed = false;         // no more requests on this connection
  bool socket_broken = false;  // EOF or I/O error: nothing more can be sent either
  AckWatch::Marks acks;        // what the transport's AckWatch saw at its looks
  TransportFailure failure;

  // Several networks (tcp_failover.cc).
  std::string route;                                // "eth1 198.18.1.2 -> 198.18.1.3:41234", for the WARN when it fails
  bool down = false;                                // this socket's link failed; its messages went to the others
  bool report_seen = false;                         // the peer's account of this socket came (LaneControl::kLaneDown)
  uint64_t sent = 0;                                // data messages written whole on this socket
  uint64_t received = 0;                            // data messages read whole from it
  uint64_t acked_out = 0;                           // the count the last acknowledgement queued here carried
  bool ack_due = false;                             // a message was read whole since
  std::deque<TcpRequest*> unacked;                  // written whole, not acknowledged: the peer may not hold them yet
  TcpRequest* current = nullptr;                    // the receive being filled from this socket
  std::unique_ptr<MessageStash::Message> stashing;  // or the message with no receive yet, being read
  std::string control;                              // control frames to write at the next message boundary
  size_t control_sent = 0;

  bool hasControl() const { return ack_due || control_sent < control.size(); }
};

// Several networks: a pair's messages, numbered so that either end can tell
// which ones a failed socket took with it.
struct TcpTransport::PairMessages {
  uint32_t sent = 0;                        // the number of the last send posted
  uint32_t expected = 0;                    // the number of the last receive posted
  std::map<uint32_t, TcpRequest*> waiting;  // posted receives whose message has not started to arrive
  MessageStash stash;                       // messages that came before their receive
  std::optional<TransportFailure> stopped;  // the peer's abort, while its other sockets still bring acknowledgements
  bool lost_a_socket = false;               // one of the pair's sockets went down (tcp_failover.cc: laneDown)

  // Whether the message `header` announces, which no receive has asked for yet, is read
  // now (into the stash) rather than left in its socket. Past the stash's
  // bound it is read all the same where the pair lost a socket and a receive
  // waits for an older message: that one may come again behind this one on
  // the same socket (sendAgain queues it after what the kernel already
  // took), and a socket left unread would keep it there for good. What this
  // holds is bounded by what the peer sent ahead of the oldest message waited
  // for. After the peer's abort, everything is read, to reach
  // the acknowledgements behind it.
  bool readsAhead(const WireHeader& header) const {
    return stash.fits(header.bytes) || stopped.has_value() ||
           (lost_a_socket && !waiting.empty() && waiting.begin()->first < header.message);
  }
};

}  // namespace rcoll
