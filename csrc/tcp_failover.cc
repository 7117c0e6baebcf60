// The TCP transport where a pair's sockets span several networks
// (RCOLL_SOCKET_STRIPE): a link that fails under one socket takes no message
// with it.
//
// On one network the k-th message to a peer takes the lane the schedule
// picks, a send is done once the kernel has its bytes, and any socket error
// fails the peer. None of that survives a link failing under one socket: the
// bytes the kernel took may never arrive, and the messages the schedule put
// on that socket would never come. So, over several networks:
//
//  * Every message carries its number on the pair (WireHeader::message); a
//    receive takes the message with its number from whichever socket brings
//    it, and one that comes before its receive waits in a stash
//    (message_stash.h). Every socket is read as soon as bytes arrive.
//  * The receiver acknowledges what it holds, per socket, at once
//    (LaneControl::kAck, between messages); a send is done only then, so
//    until then its buffer is still there to send again.
//  * A socket error that means the link failed (lane_control.h:
//    isLinkFailure, usually RCOLL_PEER_TIMEOUT without an acknowledgement)
//    while another socket to the peer is up takes the socket out of use
//    ("down"): one WARN names the rank, the peer and the interface, and a
//    LaneControl::kLaneDown frame on a live socket tells the peer how many
//    of its messages on the failed socket arrived here. The peer, learning it
//    either way, answers with its own count. Each end then sends again, on
//    the live sockets, every message of the failed one beyond the count the
//    other end gave, and the job goes on at the bandwidth that is left.
//  * The last socket's failure fails the peer with a PeerError, as on one
//    network; so does a socket closed by the peer (its process is gone).
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "lane_control.h"
#include "log.h"
#include "tcp_connection.h"
#include "tcp_transport.h"

namespace rcoll {

void TcpTransport::postNumbered(TcpRequest* r, Connection* any_lane) {
  PairMessages& pair = pairs_[static_cast<size_t>(r->peer)];
  if (pair.stopped) {
    finish(r, Request::State::kFailed, &*pair.stopped);
    return;
  }
  if (r->is_send) {
    r->message = ++pair.sent;
    r->header.message = r->message;
    Connection* c = liveSendLane(r->peer);
    if (c == nullptr) {  // cannot happen: the last live socket's failure fails the peer
      finish(r, Request::State::kFailed, &any_lane->failure);
      return;
    }
    c->sends.push_back(r);
    return;
  }
  r->message = ++pair.expected;
  if (const MessageStash::Message* m = pair.stash.find(r->message)) {
    deliverStashed(r, *m, *any_lane);
    pair.stash.erase(r->message);
    return;
  }
  if (liveLanes(r->peer, nullptr) == 0) {  // every socket closed by the peer: nothing more can come
    failConnection(*any_lane, ErrorKind::kPeer,
                   strFormat("rank %d closed its connection (its process exited, "
                             "crashed or was killed)",
                             r->peer));
    return;
  }
  pair.waiting[r->message] = r;
}

// A message that came before its receive: checked as if it came now.
void TcpTransport::deliverStashed(TcpRequest* r, const MessageStash::Message& m, Connection& any_lane) {
  std::string bad = checkHeader(r->header, m.header, info_.rank);
  if (!bad.empty()) {
    pairs_[static_cast<size_t>(r->peer)].waiting[r->message] = r;  // failConnection() fails it with the rest
    failConnection(any_lane, ErrorKind::kMismatch, bad);
    return;
  }
  if (r->bytes > 0) std::memcpy(r->data, m.data.get(), r->bytes);
  r->done = r->bytes;
  finish(r, Request::State::kDone, nullptr);
}

// After a whole header on live socket c.
bool TcpTransport::readNumbered(Connection& c, bool* finished) {
  if (isLaneControl(c.in_header)) {
    takeControl(c, finished);
    c.in_header_got = 0;
    return !c.failed && !c.down;
  }
  PairMessages& pair = pairs_[static_cast<size_t>(c.peer)];
  if (c.current == nullptr && !c.stashing) {
    if (c.in_header.magic != kWireMagic || c.in_header.src_rank != static_cast<uint32_t>(c.peer)) {
      failConnection(c, ErrorKind::kMismatch,
                     strFormat("rank %d's connection carries bytes that are not an rcoll message from it "
                               "(magic 0x%08x, from rank %u): the stream is corrupt or the peer is not rcoll",
                               c.peer, c.in_header.magic, c.in_header.src_rank));
      *finished = true;
      return false;
    }
    const uint32_t number = c.in_header.message;
    auto it = pair.waiting.find(number);
    if (it != pair.waiting.end()) {
      std::string bad = checkHeader(it->second->header, c.in_header, info_.rank);
      if (!bad.empty()) {
        failConnection(c, ErrorKind::kMismatch, bad);
        *finished = true;
        return false;
      }
      c.current = it->second;
      pair.waiting.erase(it);
    } else if (pair.readsAhead(c.in_header)) {
      c.stashing = pair.stash.start(c.in_header);
    } else {
      return false;  // wantsNumbered() leaves the socket unread until its receive is posted
    }
  }
  char* const data = c.current ? c.current->data : c.stashing->data.get();
  const size_t bytes = c.current ? c.current->bytes : static_cast<size_t>(c.stashing->header.bytes);
  size_t& done = c.current ? c.current->done : c.stashing->done;
  const PayloadRead read = readPayload(c, data, bytes, &done);
  if (read != PayloadRead::kWhole) {
    *finished = read == PayloadRead::kLost;
    return false;
  }
  ++c.received;
  c.ack_due = true;
  c.in_header_got = 0;
  if (c.current != nullptr) {
    finish(c.current, Request::State::kDone, nullptr);
    c.current = nullptr;
    *finished = true;
    return true;
  }
  // Its receive may have been posted while it was being read.
  auto it = pair.waiting.find(c.stashing->header.message);
  if (it == pair.waiting.end()) {
    pair.stash.put(std::move(c.stashing));
    return true;
  }
  TcpRequest* r = it->second;
  pair.waiting.erase(it);
  pair.stash.drop(*c.stashing);
  std::unique_ptr<MessageStash::Message> m = std::move(c.stashing);
  deliverStashed(r, *m, c);
  *finished = true;
  return !c.failed;
}

bool TcpTransport::wantsNumbered(const Connection& c) const {
  if (isLaneControl(c.in_header) || c.current != nullptr || c.stashing) return true;
  const PairMessages& pair = pairs_[static_cast<size_t>(c.peer)];
  const uint32_t number = c.in_header.message;
  return pair.waiting.count(number) > 0 || pair.readsAhead(c.in_header);
}

// The next message's header (the number the next receive will take), from
// the stash or from a socket that has read it.
bool TcpTransport::peekNumbered(int peer, WireHeader* header) const {
  const PairMessages& pair = pairs_[static_cast<size_t>(peer)];
  const uint32_t next = pair.expected + 1;
  if (const MessageStash::Message* m = pair.stash.find(next)) {
    *header = m->header;
    return true;
  }
  for (int k = 0; k < lanes_; ++k) {
    const Connection* c = laneTo(peer, k);
    if (c == nullptr || c->failed || c->down || c->current != nullptr || c->stashing) continue;
    if (c->in_header_got == sizeof(WireHeader) && c->in_header.magic == kWireMagic && c->in_header.message == next) {
      *header = c->in_header;
      return true;
    }
  }
  return false;
}

void TcpTransport::sentWhole(Connection& c, TcpRequest* r) {
  r->lane_index = c.sent++;
  c.unacked.push_back(r);
}

// Queues what is due (an acknowledgement) and writes the control frames
// waiting on c, which sits at a message boundary.
bool TcpTransport::writeControl(Connection& c, bool* finished) {
  if (c.control_sent == c.control.size()) {
    c.control.clear();
    c.control_sent = 0;
  }
  if (c.ack_due) queueAck(c);
  while (c.control_sent < c.control.size()) {
    ssize_t n =
        ::send(c.fd, c.control.data() + c.control_sent, c.control.size() - c.control_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.control_sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    const int err = errno;
    loseSocket(c, err, strFormat("lost the connection to rank %d while sending: %s", c.peer, errnoText(err).c_str()));
    *finished = true;
    return false;
  }
  c.control.clear();
  c.control_sent = 0;
  return true;
}

void TcpTransport::takeControl(Connection& c, bool* finished) {
  std::string bad = checkLaneControl(c.in_header, info_.comm_id, c.peer, lanes_);
  if (!bad.empty()) {
    failConnection(c, ErrorKind::kMismatch, bad);
    *finished = true;
    return;
  }
  const uint64_t count = c.in_header.count;
  if (c.in_header.kind == static_cast<uint8_t>(LaneControl::kAck)) {
    while (!c.unacked.empty() && c.unacked.front()->lane_index < count) {
      finish(c.unacked.front(), Request::State::kDone, nullptr);
      c.unacked.pop_front();
      *finished = true;
    }
    return;
  }
  // kLaneDown: the peer's account of one of the sockets between us.
  Connection& d = *laneTo(c.peer, static_cast<int>(c.in_header.offset));
  if (d.report_seen) return;
  d.report_seen = true;
  laneDown(d, strFormat("rank %d found it failed", c.peer));
  if (!d.failed) sendAgain(d, count);
  *finished = true;
}

void TcpTransport::loseSocket(Connection& c, int err, const std::string& message, const std::string& why) {
  if (numbered_ && err != 0 && isLinkFailure(err) && liveLanes(c.peer, &c) > 0) {
    laneDown(c, why.empty() ? errnoText(err) : why);
    return;
  }
  failConnection(c, ErrorKind::kPeer, message);
}

void TcpTransport::laneDown(Connection& c, const std::string& why) {
  if (c.down || c.failed) return;
  const int others = liveLanes(c.peer, &c);
  if (others == 0) {
    failConnection(c, ErrorKind::kPeer,
                   strFormat("lost the connection to rank %d: the last of its sockets (%s) failed: %s", c.peer,
                             c.route.c_str(), why.c_str()));
    return;
  }
  c.down = true;
  c.socket_broken = true;  // not even an abort message goes out on it
  stopMetering(c);
  RCOLL_WARN("rank %d: the socket to rank %d over %s failed (%s); its messages go on over the other %d socket(s)",
             info_.rank, c.peer, c.route.c_str(), why.c_str(), others);
  // Whatever was half read from it comes again on another socket.
  PairMessages& pair = pairs_[static_cast<size_t>(c.peer)];
  pair.lost_a_socket = true;
  if (c.current != nullptr) {
    c.current->done = 0;
    pair.waiting[c.current->message] = c.current;
    c.current = nullptr;
  }
  if (c.stashing) {
    pair.stash.drop(*c.stashing);
    c.stashing.reset();
  }
  c.in_header_got = 0;
  c.inbox_pos = c.inbox_end = 0;
  c.control.clear();
  c.control_sent = 0;
  c.ack_due = false;
  // Our account of it, so that the peer sends again what did not arrive.
  Connection* live = liveSendLane(c.peer);
  const WireHeader report = makeLaneControl(LaneControl::kLaneDown, info_.comm_id, info_.rank, c.lane, c.received);
  live->control.append(reinterpret_cast<const char*>(&report), sizeof(report));
  // If the peer's account came first, takeControl() sends again right after this.
}

// The peer holds the first `peer_holds` messages written on d: the rest, and
// those not written yet, go again on the live sockets, ahead of what waits
// there (they are the oldest; the receiver is likely waiting for them).
void TcpTransport::sendAgain(Connection& d, uint64_t peer_holds) {
  std::vector<TcpRequest*> again;
  for (TcpRequest* r : d.unacked) {
    if (r->lane_index < peer_holds) {
      finish(r, Request::State::kDone, nullptr);
    } else {
      again.push_back(r);
    }
  }
  again.insert(again.end(), d.sends.begin(), d.sends.end());
  d.unacked.clear();
  d.sends.clear();
  std::vector<size_t> insert_at(static_cast<size_t>(lanes_), 0);
  for (int k = 0; k < lanes_; ++k) {
    const Connection* l = laneTo(d.peer, k);
    insert_at[static_cast<size_t>(k)] = !l->sends.empty() && l->sends.front()->done > 0 ? 1 : 0;
  }
  for (TcpRequest* r : again) {
    r->done = 0;
    Connection* l = liveSendLane(d.peer);
    if (l == nullptr) {  // the others failed too: the peer failed with them, and takes these along
      d.sends.push_back(r);
      continue;
    }
    l->sends.insert(l->sends.begin() + static_cast<std::ptrdiff_t>(insert_at[static_cast<size_t>(l->lane)]++), r);
  }
  RCOLL_INFO("rank %d: rank %d holds %llu message(s) sent over %s; %zu go again over the other socket(s)", info_.rank,
             d.peer, static_cast<unsigned long long>(peer_holds), d.route.c_str(), again.size());
}

// The next send's socket by the pair's schedule, passing over failed ones.
TcpTransport::Connection* TcpTransport::liveSendLane(int peer) {
  LaneSchedule& schedule = schedules_[static_cast<size_t>(peer)].sends;
  for (int i = 0; i < lanes_; ++i) {
    Connection* c = laneTo(peer, schedule.next());
    if (c != nullptr && !c->failed && !c->down) return c;
  }
  return nullptr;
}

int TcpTransport::liveLanes(int peer, const Connection* besides) const {
  int live = 0;
  for (int k = 0; k < lanes_; ++k) {
    const Connection* c = laneTo(peer, k);
    if (c != nullptr && c != besides && !c->failed && !c->down && !c->closed_by_peer) ++live;
  }
  return live;
}

void TcpTransport::failNumbered(int peer, const TransportFailure& failure) {
  PairMessages& pair = pairs_[static_cast<size_t>(peer)];
  for (auto& waiting : pair.waiting) finish(waiting.second, Request::State::kFailed, &failure);
  pair.waiting.clear();
  pair.stash.clear();
  for (int k = 0; k < lanes_; ++k) {
    if (Connection* c = laneTo(peer, k)) c->stashing.reset();
  }
}

// The peer's abort came on socket c. It acknowledged what it had read on
// each socket before writing its abort there, but the sockets run over
// different links: an acknowledgement on another one may still be on its
// way. What cannot finish any more fails now with the peer's reason: c's
// unacknowledged sends (the peer wrote its acknowledgements on c before the
// abort, so these it did not hold), the receives, the sends not written
// whole. Sends written whole on another open socket wait for that socket's
// acknowledgement, abort or close; the last of those fails the pair
// (failConnection, with this reason). False when nothing waits.
bool TcpTransport::peerStopped(Connection& c, const TransportFailure& told) {
  PairMessages& pair = pairs_[static_cast<size_t>(c.peer)];
  bool waits = false;
  for (int k = 0; k < lanes_; ++k) {
    Connection* l = laneTo(c.peer, k);
    if (l == nullptr || l == &c || l->failed || l->down || l->closed_by_peer || l->unacked.empty()) continue;
    waits = true;
  }
  if (!waits) return false;
  pair.stopped = told;
  failLane(c, told);
  for (int k = 0; k < lanes_; ++k) {
    Connection* l = laneTo(c.peer, k);
    if (l == nullptr || l->failed) continue;
    // Nothing more is written to a peer that stopped; the buffer of a send
    // half written is not kept for an abort of ours either.
    l->socket_broken = true;
    for (TcpRequest* r : l->sends) finish(r, Request::State::kFailed, &told);
    l->sends.clear();
    if (l->down || l->closed_by_peer || l->unacked.empty()) failLane(*l, told);
  }
  // The receives fail; the stash stays (a kept socket may be half way
  // through a message into it, and must go on reading in step) until the
  // pair fails whole (failConnection: failNumbered).
  for (auto& waiting : pair.waiting) finish(waiting.second, Request::State::kFailed, &told);
  pair.waiting.clear();
  return true;
}

// Our abort follows what this socket has read: the acknowledgement of it
// goes first (bounded by the abort's deadline).
// (After finishPartialSend, so c is at a message boundary.) The control
// frames queued and not yet written go too: an acknowledgement queued while
// the socket was full would be lost otherwise.
bool TcpTransport::sendDueAck(Connection& c, Deadline deadline) {
  queueAck(c);
  std::string why;
  if (c.control_sent < c.control.size() &&
      !sendAll(c.fd, c.control.data() + c.control_sent, c.control.size() - c.control_sent, deadline, &why)) {
    return false;
  }
  c.control.clear();
  c.control_sent = 0;
  return true;
}

// An acknowledgement of every message read whole from c so far, queued
// behind the control frames already waiting.
void TcpTransport::queueAck(Connection& c) {
  c.ack_due = false;
  if (c.received <= c.acked_out) return;
  if (c.control_sent == c.control.size()) {
    c.control.clear();
    c.control_sent = 0;
  }
  const WireHeader ack = makeLaneControl(LaneControl::kAck, info_.comm_id, info_.rank, c.lane, c.received);
  c.control.append(reinterpret_cast<const char*>(&ack), sizeof(ack));
  c.acked_out = c.received;
}

}  // namespace rcoll
