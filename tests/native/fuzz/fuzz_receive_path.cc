// libFuzzer target: TcpTransport's receive path (header read, header check,
// payload read, abort messages) over bytes a peer might send.
//
// Each input is one connection's worth of bytes from "rank 1" to rank 0:
//
//   byte 0          flags (below)
//   3 bytes/recv    for each receive rank 0 posts (the early ones, then one
//                   probe posted after the stream is written): kind+reduce op,
//                   dtype+root, count. Expected headers are makeHeader() of that
//                   op with seq = 1, 2, ... and offset 0.
//   the rest        the stream rank 1 sends, followed by EOF
//
// The stream is written into one end of a socketpair whose other end the
// transport adopts as its connection to rank 1, and progress() is driven until
// every request is done or failed. A reference model of the protocol (a stream
// is a sequence of 64-byte headers, each followed by `bytes` of payload, or of
// min(bytes, 4096) of text for an abort) predicts each request's outcome, which
// must match: state, failure kind, message (valid UTF-8, since it becomes a
// Python exception's text), and the payload bytes delivered.
// Any crash, sanitizer report, leak, request left pending, empty failure
// message or disagreement with the model aborts.
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dtype.h"
#include "fuzz_common.h"
#include "tcp_transport.h"
#include "wire.h"

using namespace rcoll;
using rcoll_fuzz::kCommId;

namespace {

// flags (byte 0)
constexpr uint8_t kRecvCountMask = 0x03;  // early receives: 0..3 (0: only the eager header/abort read runs)
constexpr uint8_t kLatePost = 0x04;       // post the early receives halfway through the stream
constexpr uint8_t kAbortAtEnd = 0x08;     // abortPeers() at the end, then post once more
constexpr uint8_t kSpinCheck = 0x10;      // with nothing posted, progress() must sleep, not spin
constexpr uint8_t kReleaseOne = 0x20;     // release the last early receive while it is pending
constexpr int kChunkShift = 6;            // bits 6-7: bytes per write(): all, 1, 7, 64

constexpr OpKind kKinds[] = {OpKind::kAllreduce, OpKind::kAllgather,   OpKind::kBroadcast, OpKind::kReduceScatter,
                             OpKind::kBarrier,   OpKind::kReduce,      OpKind::kGather,    OpKind::kScatter,
                             OpKind::kAllToAll,  OpKind::kPointToPoint};
constexpr size_t kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);
constexpr size_t kHeader = sizeof(WireHeader);
constexpr size_t kMaxAbortText = 4096;  // tcp_transport.cc: kMaxAbortMessage

// Strict UTF-8 (Unicode 15, table 3-7: no overlongs, surrogates or code points
// above U+10FFFF), as Python decodes it: failure messages reach Python as str.
bool isValidUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  auto in = [&](size_t k, unsigned lo, unsigned hi) {
    return i + k < n && static_cast<uint8_t>(s[i + k]) >= lo && static_cast<uint8_t>(s[i + k]) <= hi;
  };
  while (i < n) {
    const unsigned b = static_cast<uint8_t>(s[i]);
    size_t len = 0;
    if (b <= 0x7F)
      len = 1;
    else if (b >= 0xC2 && b <= 0xDF && in(1, 0x80, 0xBF))
      len = 2;
    else if (b == 0xE0 && in(1, 0xA0, 0xBF) && in(2, 0x80, 0xBF))
      len = 3;
    else if (((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) && in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF))
      len = 3;
    else if (b == 0xED && in(1, 0x80, 0x9F) && in(2, 0x80, 0xBF))
      len = 3;
    else if (b == 0xF0 && in(1, 0x90, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF))
      len = 4;
    else if (b >= 0xF1 && b <= 0xF3 && in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF))
      len = 4;
    else if (b == 0xF4 && in(1, 0x80, 0x8F) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF))
      len = 4;
    if (len == 0) return false;
    i += len;
  }
  return true;
}

WireHeader expectedHeader(const uint8_t* cfg, uint64_t seq) {
  OpDesc op;
  op.kind = kKinds[cfg[0] % kNumKinds];
  op.reduce_op = static_cast<ReduceOp>((cfg[0] / kNumKinds) % kNumReduceOps);
  op.dtype = static_cast<DataType>(cfg[1] % kNumDataTypes);
  op.root = (cfg[1] / kNumDataTypes) % 2;
  op.count = cfg[2];
  op.seq = seq;
  return makeHeader(op, kCommId, /*src_rank=*/1, /*offset=*/0, op.count * elementSize(op.dtype));
}

struct Outcome {
  bool done = false;
  ErrorKind kind = ErrorKind::kPeer;
  std::string message;    // exact, unless `contains` is set
  bool contains = false;  // message must contain `message`
  bool prefix = false;    // message must start with `message` (an abort text that is not UTF-8)
  size_t payload_at = 0;  // done: where its payload starts in the stream
};

// What the protocol says must happen to each receive, in posting order, when
// `stream` followed by EOF arrives on the connection.
std::vector<Outcome> model(const std::vector<WireHeader>& expected, const uint8_t* s, size_t n) {
  std::vector<Outcome> out;
  size_t pos = 0;
  bool failed = false;
  Outcome failure;
  for (const WireHeader& e : expected) {
    if (failed) {
      out.push_back(failure);
      continue;
    }
    failed = true;
    if (n - pos < kHeader) {
      failure = {false, ErrorKind::kPeer, "rank 1 closed its connection (", true, 0};
      out.push_back(failure);
      continue;
    }
    WireHeader h;
    std::memcpy(&h, s + pos, kHeader);
    if (h.magic == kWireMagic && h.kind == static_cast<uint8_t>(OpKind::kAbort)) {
      size_t avail = n - pos - kHeader;
      const uint64_t announced = h.bytes;  // a copy: std::min must not bind to a packed field
      size_t len = static_cast<size_t>(std::min<uint64_t>(std::min<uint64_t>(announced, kMaxAbortText), avail));
      std::string text(reinterpret_cast<const char*>(s + pos + kHeader), len);
      failure.kind =
          h.error_kind == static_cast<uint8_t>(ErrorKind::kMismatch) ? ErrorKind::kMismatch : ErrorKind::kPeer;
      text = text.c_str();  // the message is built with %s
      failure.message = "rank 1 failed: ";
      // Valid UTF-8 arrives as sent; anything else is made valid (replaced), which isValidUtf8 checks below.
      failure.prefix = !isValidUtf8(text);
      if (!failure.prefix) failure.message += text;
      out.push_back(failure);
      continue;
    }
    std::string bad = checkHeader(e, h, 0);
    if (bad.empty() && h.src_rank != 1) {
      bad = strFormat("a message on rank 1's connection claims to come from rank %u", h.src_rank);
    }
    if (!bad.empty()) {
      failure = {false, ErrorKind::kMismatch, bad, false, 0};
      out.push_back(failure);
      continue;
    }
    if (n - pos - kHeader < e.bytes) {
      failure = {false, ErrorKind::kPeer, "rank 1 closed its connection in the middle of a message", true, 0};
      out.push_back(failure);
      continue;
    }
    failed = false;
    Outcome done;
    done.done = true;
    done.payload_at = pos + kHeader;
    out.push_back(done);
    pos += kHeader + e.bytes;
  }
  return out;
}

// Voluntary context switches of this thread: a progress() call that sleeps in
// poll() makes at least one, one that spins makes none. (CPU time would be the
// obvious measure, but in a VM it counts the host's steal time too.)
long voluntarySwitches() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_nvcsw;
}

struct Posted {
  Request* request = nullptr;
  WireHeader expected{};
  std::unique_ptr<char[]> buffer;  // exactly expected.bytes long, so that ASan sees any overrun
  bool released = false;
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rcoll_fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  const size_t n_early = flags & kRecvCountMask;
  const size_t cfg_bytes = 1 + 3 * (n_early + 1);
  if (size < cfg_bytes) return 0;
  const uint8_t* stream = data + cfg_bytes;
  const size_t stream_len = size - cfg_bytes;
  static const size_t kChunks[] = {0, 1, 7, 64};
  const size_t chunk =
      kChunks[flags >> kChunkShift] == 0 ? std::max<size_t>(stream_len, 1) : kChunks[flags >> kChunkShift];

  std::vector<Posted> posted(n_early + 1);
  std::vector<WireHeader> expected;
  for (size_t i = 0; i <= n_early; ++i) {
    posted[i].expected = expectedHeader(data + 1 + 3 * i, i + 1);
    posted[i].buffer.reset(new char[posted[i].expected.bytes]);
    expected.push_back(posted[i].expected);
  }
  const std::vector<Outcome> want = model(expected, stream, stream_len);

  int sv[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s", strerror(errno));
  const int writer = sv[1];
  // The sleep check below is about the poll() phase of progress(): the spin
  // before it (RCOLL_SPIN_US) yields the core, and on a loaded machine one
  // sched_yield() can lose it for longer than the whole 2 ms timeout, which
  // looks like a spin to that check. Inputs without the check keep the spin.
  Config config;
  if (flags & kSpinCheck) config.spin = std::chrono::microseconds(0);
  auto transport = std::make_unique<TcpTransport>(rcoll_fuzz::connectInfo(), config, "127.0.0.1");
  transport->adoptConnectedSocket(1, sv[0]);
  FUZZ_CHECK(transport->connected(1), "adopted socket not connected");

  auto post = [&](size_t i) {
    Posted& p = posted[i];
    p.request = transport->irecv(1, p.expected, p.buffer.get(), p.expected.bytes);
    FUZZ_CHECK(p.request != nullptr, "irecv returned null");
  };
  size_t written = 0;
  bool shut = false;
  bool early_posted = false;
  bool stalled = false;  // the socket buffer is full: the transport is not reading
  auto pump = [&]() {
    if (written < stream_len) {
      ssize_t n = ::send(writer, stream + written, std::min(chunk, stream_len - written), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) written += static_cast<size_t>(n);
      stalled = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
      FUZZ_CHECK(n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR, "send: %s", strerror(errno));
    }
    if (written == stream_len && !shut) {
      ::shutdown(writer, SHUT_WR);
      shut = true;
    }
    transport->progress(std::chrono::milliseconds(0));
  };
  auto pending = [&](size_t upto) {
    for (size_t i = 0; i < upto; ++i) {
      if (!posted[i].released && posted[i].request->state == Request::State::kPending) return true;
    }
    return false;
  };

  // Phase 1: the stream goes out; the early receives are posted at the start, or
  // halfway (or when the transport stops reading: a data header with no receive).
  const size_t max_iters = stream_len / chunk + 64;
  for (size_t iter = 0; iter < max_iters; ++iter) {
    if (!early_posted && (!(flags & kLatePost) || written >= stream_len / 2 || stalled)) {
      for (size_t i = 0; i < n_early; ++i) post(i);
      if ((flags & kReleaseOne) && n_early > 0) {
        transport->release(posted[n_early - 1].request);  // may still be pending: must be recycled safely
        posted[n_early - 1].released = true;
      }
      early_posted = true;
    }
    pump();
    if (early_posted && shut && !pending(n_early)) break;
  }
  FUZZ_CHECK(early_posted, "early receives never posted");

  // With nothing to receive, progress() must block in poll(), not spin on a
  // readable socket. A vCPU the host preempts past the deadline also returns
  // without sleeping, so only three spins in a row count.
  if ((flags & kSpinCheck) && !pending(n_early)) {
    bool slept = false;
    for (int attempt = 0; attempt < 3 && !slept; ++attempt) {
      long switches = voluntarySwitches();
      auto t0 = std::chrono::steady_clock::now();
      transport->progress(std::chrono::milliseconds(2));
      slept = std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1) || voluntarySwitches() > switches;
    }
    FUZZ_CHECK(slept, "progress(2 ms) with no receive posted never slept: it spins on a readable socket");
  }

  // Phase 2: one more receive, posted late, then everything must finish.
  post(n_early);
  for (size_t iter = 0; iter < max_iters && pending(n_early + 1); ++iter) pump();
  FUZZ_CHECK(!pending(n_early + 1),
             "a receive is still pending after the whole stream and EOF (%zu of %zu bytes written)", written,
             stream_len);

  static const bool verbose = std::getenv("RCOLL_FUZZ_VERBOSE") != nullptr;
  for (size_t i = 0; i <= n_early; ++i) {
    Posted& p = posted[i];
    if (p.released) continue;
    const Outcome& w = want[i];
    Request::State state = p.request->state;
    if (verbose) {
      std::fprintf(stderr, "receive %zu (%s): %s\n", i, describeOp(opFromHeader(p.expected)).c_str(),
                   state == Request::State::kDone ? "done" : transport->failure(p.request).message.c_str());
    }
    if (w.done) {
      std::string why = state == Request::State::kFailed ? transport->failure(p.request).message : "";
      FUZZ_CHECK(state == Request::State::kDone, "receive %zu: the model says done, the transport says failed: %s", i,
                 why.c_str());
      FUZZ_CHECK(std::memcmp(p.buffer.get(), stream + w.payload_at, p.expected.bytes) == 0,
                 "receive %zu: payload differs from the stream's bytes", i);
    } else {
      FUZZ_CHECK(state == Request::State::kFailed, "receive %zu: the model says failed (%s), the transport says done",
                 i, w.message.c_str());
      TransportFailure f = transport->failure(p.request);
      FUZZ_CHECK(!f.message.empty(), "receive %zu failed with an empty message", i);
      FUZZ_CHECK(isValidUtf8(f.message), "receive %zu failed with a message that is not UTF-8: '%s'", i,
                 f.message.c_str());
      FUZZ_CHECK(f.kind == w.kind, "receive %zu failed with kind %s, expected %s: %s", i, errorKindName(f.kind),
                 errorKindName(w.kind), f.message.c_str());
      bool as_expected = w.contains ? f.message.find(w.message) != std::string::npos
                         : w.prefix ? f.message.compare(0, w.message.size(), w.message) == 0
                                    : f.message == w.message;
      FUZZ_CHECK(as_expected, "receive %zu failed with\n  '%s'\nexpected %s\n  '%s'", i, f.message.c_str(),
                 w.contains ? "a message containing"
                 : w.prefix ? "a message starting with"
                            : "",
                 w.message.c_str());
    }
    transport->release(p.request);
  }

  if (flags & kAbortAtEnd) {
    transport->abortPeers(ErrorKind::kPeer, "fuzz abort");
    WireHeader h = expectedHeader(data + 1, 99);
    std::unique_ptr<char[]> buf(new char[h.bytes]);
    Request* r = transport->irecv(1, h, buf.get(), h.bytes);
    FUZZ_CHECK(r->state == Request::State::kFailed, "a receive posted after abortPeers() did not fail at once");
    FUZZ_CHECK(!transport->failure(r).message.empty(), "a receive after abortPeers() failed with an empty message");
    transport->release(r);
    // What abortPeers() wrote, if anything, must be one well-formed abort message.
    char back[kHeader + 64];
    size_t got = 0;
    for (;;) {
      ssize_t n = ::recv(writer, back + got, sizeof(back) - got, MSG_DONTWAIT);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    if (got > 0) {
      WireHeader a;
      FUZZ_CHECK(got >= kHeader, "abortPeers() wrote a partial header (%zu bytes)", got);
      std::memcpy(&a, back, kHeader);
      FUZZ_CHECK(a.magic == kWireMagic && a.kind == static_cast<uint8_t>(OpKind::kAbort) && a.comm_id == kCommId &&
                     a.src_rank == 0 && a.bytes == 10 && got == kHeader + 10 &&
                     std::memcmp(back + kHeader, "fuzz abort", 10) == 0,
                 "abortPeers() wrote a malformed abort message (%zu bytes)", got);
    }
  }

  transport.reset();  // closes sv[0]
  ::close(writer);
  return 0;
}
