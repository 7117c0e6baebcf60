// What the parts of the verbs transport share and nobody else sees: the
// connection's and the requests' types, and the control messages' format.
//
// VerbsTransport (verbs_transport.h) is implemented by phase, one file each:
//   verbs_transport.cc     life cycle: the device's objects, the requests' ends, progress and sleep
//   verbs_connect.cc       set-up's connections: queue pairs created and swapped over the socket
//   verbs_on_demand.cc     connections on demand: the same swap, in steps that never wait
//   verbs_registration.cc  memory registration (through the registration cache, mr_cache.h)
//   verbs_data_path.cc     posting: credits, RDMA writes with immediate, control messages, flow control
//   verbs_completions.cc   completions: what each finished work request means
//   verbs_failure.cc       the side channel, failed connections, abort
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "config.h"
#include "rdma/mr_cache.h"
#include "rdma/verbs_abi.h"
#include "rdma/verbs_transport.h"
#include "side_channel.h"
#include "socket_util.h"
#include "wire.h"

namespace rcoll {

namespace verbs {

constexpr size_t kCtrlBytes = 128;  // one control slot

enum CtrlType : uint32_t { kCredit = 1, kEmpty = 2, kMismatch = 3, kRailNote = 4 };

// A connection's streams (rail_endpoint.h): stream 0 and the rescue streams
// of failed rails. The immediate of a write names its stream in the top byte
// and the low 24 bits of its sequence number, which is all the in-order check
// needs.
constexpr uint32_t kMaxStreams = 64;
static_assert(kMaxStreams >= 1 + kMaxRails, "a rail carries its own stream and one per other rail");

// How long a link failure waits for its queue pair's flushes (Connection::draining).
constexpr std::chrono::seconds kDrainBound(5);
inline uint32_t immediateFor(uint32_t stream, uint64_t seq) {
  return (stream << 24) | static_cast<uint32_t>(seq & 0xFFFFFFu);
}

#pragma pack(push, 1)
struct CtrlMessage {
  uint32_t type;
  uint32_t rkey;
  uint64_t seq;  // the receive's number between the two ranks
  uint64_t addr;
  uint64_t bytes;
  WireHeader header;  // credit: what the receiver expects; mismatch: what the sender had
  uint32_t stream;    // credit, empty, mismatch: the stream of the message; rail note: its number
};
#pragma pack(pop)
static_assert(sizeof(CtrlMessage) <= kCtrlBytes, "a control message fits its slot");

// The side channel carries handshakes and abort messages, not data: default
// buffers, but the same dead-peer bound as every connection (a cut link is
// seen there while the queue pairs only retry).
inline SocketOptions sideChannelOptions(const Config& config) {
  SocketOptions options = config.socketOptions();
  options.buffer_bytes = 0;
  return options;
}

inline const char* mtuName(int mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

}  // namespace verbs

// What the two ends of a queue pair swap over the socket, each way.
#pragma pack(push, 1)
struct VerbsTransport::QpInfo {
  uint32_t magic;
  uint32_t rank;
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t ethernet;
  uint8_t mtu;  // ibv_mtu
  uint8_t gid[16];
};
#pragma pack(pop)

// Every work request's wr_id points at its owner, so a completion finds it.
struct VerbsTransport::WrOwner {
  enum Kind : uint8_t { kCtrlRecv, kCtrlSend, kData };
  Kind kind;
  explicit WrOwner(Kind k) : kind(k) {}
};

struct VerbsTransport::CtrlSlot : WrOwner {
  CtrlSlot(Kind k, Connection* c, char* b) : WrOwner(k), conn(c), buf(b) {}
  Connection* conn;
  char* buf;
  VerbsRequest* request = nullptr;  // a zero-byte send completes with its control message
};

// holds: work requests posted and not yet completed (the NIC may still read
// or write the memory, so the request and its registration wait for them).
struct VerbsTransport::VerbsRequest : MessageRequest, WrOwner {
  VerbsRequest() : WrOwner(kData) {}
  uint32_t stream = 0;
  uint64_t seq = 0;  // per peer, stream and direction: matches credits to sends
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  MrCache::Entry* mr = nullptr;
  bool metered = false;  // a send whose writes count in VerbsTransport::meter_, until its last completes
};

// Something to post on a connection's send queue, in order.
struct VerbsTransport::Outgoing {
  verbs::CtrlMessage message{};     // a control message, when request is null or a zero-byte send
  VerbsRequest* request = nullptr;  // a send whose credit arrived
};

// One ordered sequence of messages each way on a connection.
struct VerbsTransport::Stream {
  std::deque<VerbsRequest*> recvs;         // posted receives, oldest first
  std::deque<VerbsRequest*> unmatched;     // sends waiting for their credit
  std::deque<verbs::CtrlMessage> credits;  // credits that arrived before their send
  uint64_t next_send_seq = 0, next_recv_seq = 0;
  uint64_t arrived = 0;  // receives completed
};

struct VerbsTransport::Connection {
  int peer = -1;
  int fd = -1;  // the handshake socket, kept as a side channel
  ibv_qp* qp = nullptr;
  std::vector<std::unique_ptr<CtrlSlot>> recv_slots;
  std::vector<std::unique_ptr<CtrlSlot>> send_slots;
  std::vector<CtrlSlot*> free_send_slots;
  int sq_used = 0;
  std::vector<Stream> streams = std::vector<Stream>(1);  // grown as rescue streams are used
  std::deque<VerbsRequest*> in_flight;                   // sends whose work requests are posted
  std::deque<Outgoing> backlog;                          // waiting for send-queue room, in order
  int recv_posted = 0;                                   // control receive slots posted and not completed
  SideChannelReader side_channel;
  bool closed = false;  // the peer is gone: no new requests; posted writes may still finish
  bool failed = false;  // no more requests at all
  // A link failure waits for every posted receive slot's completion (the
  // error state flushes them after whatever had arrived), so that what
  // arrived is counted before the requests fail (rail_endpoint.h).
  bool draining = false;
  Deadline drain_deadline{};
  bool socket_broken = false;
  TransportFailure failure;
  uint32_t psn = 0;  // the first packet sequence number of this side's sends

  Stream& stream(uint32_t s) {
    if (s >= streams.size()) streams.resize(s + 1);
    return streams[s];
  }
};

// A queue-pair exchange on first use, over a non-blocking socket. Each side
// sends its QpInfo, moves its queue pair to RTS once the peer's has come, then
// sends one byte; the connection is usable once the peer's byte has come (its
// queue pair is ready for writes), as in setUpConnection.
struct VerbsTransport::Handshake {
  std::unique_ptr<Connection> conn;
  char out[sizeof(QpInfo) + 1] = {};  // this side's QpInfo, then the ready byte
  size_t out_end = sizeof(QpInfo);    // bytes of `out` to send so far
  size_t sent = 0;
  QpInfo theirs{};
  size_t got = 0;  // bytes of theirs, then of the peer's ready byte
  bool wants_write() const { return sent < out_end; }
};

}  // namespace rcoll
