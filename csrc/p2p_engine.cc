#include "p2p_engine.h"

#include <algorithm>

#include "op_stats.h"
#include "error.h"
#include "log.h"

namespace rcoll {

namespace {
// How long the engine sleeps in the transport when nothing is due: new messages
// interrupt it, so this only bounds how late a deadline is noticed.
constexpr auto kIdlePoll = std::chrono::milliseconds(200);
// How often a waiting receive from any source looks at the peers' next messages.
constexpr auto kAnySourcePoll = std::chrono::milliseconds(1);
}  // namespace

P2PEngine::P2PEngine(std::unique_ptr<Transport> transport, int rank, int size, uint64_t comm_id,
                     FailureHandler on_failure)
    : transport_(std::move(transport)),
      rank_(rank),
      size_(size),
      comm_id_(comm_id),
      on_failure_(std::move(on_failure)),
      next_send_seq_(static_cast<size_t>(size), 1),
      next_recv_seq_(static_cast<size_t>(size), 1) {}

P2PEngine::~P2PEngine() { stop(); }

void P2PEngine::start() {
  thread_ = std::thread([this] { loop(); });
}

void P2PEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  transport_->interrupt();
  if (thread_.joinable()) thread_.join();
}

std::string P2PEngine::describe(const Message& m) const {
  if (static_cast<int>(m.desc.root) == kMonitoredBarrierTag) {
    return strFormat("monitored_barrier: %s rank %d", m.is_send ? "the message to" : "the message from", m.peer);
  }
  if (m.peer == kAnySource) {
    return strFormat("recv of %s (count=%llu, tag=%u) from any source", dataTypeName(m.desc.dtype),
                     static_cast<unsigned long long>(m.desc.count), m.desc.root);
  }
  return strFormat("%s of %s (count=%llu, tag=%u) %s rank %d (message #%llu between them)", m.is_send ? "send" : "recv",
                   dataTypeName(m.desc.dtype), static_cast<unsigned long long>(m.desc.count), m.desc.root,
                   m.is_send ? "to" : "from", m.peer, static_cast<unsigned long long>(m.desc.seq));
}

std::shared_ptr<Work> P2PEngine::send(const void* data, size_t count, DataType dtype, int peer, int tag,
                                      std::chrono::milliseconds timeout) {
  return enqueue(true, static_cast<char*>(const_cast<void*>(data)), count, dtype, peer, tag, timeout);
}

std::shared_ptr<Work> P2PEngine::recv(void* data, size_t count, DataType dtype, int peer, int tag,
                                      std::chrono::milliseconds timeout) {
  return enqueue(false, static_cast<char*>(data), count, dtype, peer, tag, timeout);
}

std::shared_ptr<Work> P2PEngine::recvFromAny(void* data, size_t count, DataType dtype, int tag,
                                             std::chrono::milliseconds timeout) {
  return enqueue(false, static_cast<char*>(data), count, dtype, kAnySource, tag, timeout, true);
}

std::shared_ptr<Work> P2PEngine::enqueue(bool is_send, char* data, size_t count, DataType dtype, int peer, int tag,
                                         std::chrono::milliseconds timeout, bool any_source) {
  const char* what = is_send ? "send" : "recv";
  if (any_source) {
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && !transport_->canPeek(p)) {
        throwError(ErrorKind::kInvalidArgument,
                   strFormat("rank %d: recv from any source: rank %d is reached over the %s transport, which "
                             "cannot see a message before its receive is posted (over verbs the sender waits for "
                             "the receiver's credit); name the sender (src=)",
                             rank_, p, transport_->transportOf(p)));
      }
    }
  } else if (peer < 0 || peer >= size_ || peer == rank_) {
    throwError(
        ErrorKind::kInvalidArgument,
        strFormat("rank %d: %s: peer %d is not another rank of this communicator (size %d)", rank_, what, peer, size_));
  }
  if (tag < 0 && tag != kMonitoredBarrierTag) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: %s: tag %d < 0", rank_, what, tag));
  }
  if (count > 0 && data == nullptr) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: %s: null buffer", rank_, what));
  }
  Message m;
  m.is_send = is_send;
  m.peer = peer;
  m.desc.kind = OpKind::kPointToPoint;
  m.desc.dtype = dtype;
  m.desc.root = static_cast<uint32_t>(tag);
  m.desc.count = count;
  m.data = data;
  m.bytes = count * elementSize(dtype);
  m.timeout = timeout;
  m.issued = std::chrono::steady_clock::now();
  m.deadline = m.issued + timeout;
  std::shared_ptr<Work> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!any_source) {  // a receive from any source takes its number when it finds its sender
      auto& seq = is_send ? next_send_seq_ : next_recv_seq_;
      m.desc.seq = seq[static_cast<size_t>(peer)]++;
    }
    m.trace = FlightRecorder::process().scheduled({trace_group_, OpKind::kPointToPoint, dtype, count,
                                                   any_source ? -1 : peer, is_send, m.desc.seq, timeout.count()});
    work = std::make_shared<Work>(m.desc.seq);
    if (!is_send && !any_source) work->setSourceRank(peer);
    m.work = work;
    if (failed_ || stopping_) {
      const std::string text =
          strFormat("rank %d: %s was not run because the communicator %s", rank_, describe(m).c_str(),
                    failed_ ? ("failed earlier: " + fail_message_).c_str() : "was shut down");
      FlightRecorder::process().finished(m.trace, false, "", "", text);
      work->markFailed(failed_ ? fail_kind_ : ErrorKind::kAborted, text);
      return work;
    }
    incoming_.push_back(std::move(m));
  }
  cv_.notify_one();
  transport_->interrupt();  // the engine may be blocked in progress()
  return work;
}

void P2PEngine::fail(ErrorKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    failed_ = true;
    fail_kind_ = kind;
    fail_message_ = message;
  }
  cv_.notify_all();
  transport_->interrupt();
}

void P2PEngine::failAll(ErrorKind kind, const std::string& message) {
  // Engine thread: tell the peers, then fail what is posted and what is waiting.
  transport_->abortPeers(kind, message);
  std::deque<Message> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waiting.swap(incoming_);
  }
  for (Message& m : active_) {
    transport_->release(m.request);
    const std::string text = strFormat("rank %d: %s failed: %s", rank_, describe(m).c_str(), message.c_str());
    FlightRecorder::process().finished(m.trace, false, "", "", text);
    m.work->markFailed(kind, text);
  }
  active_.clear();
  for (Message& m : any_source_) waiting.push_back(std::move(m));
  any_source_.clear();
  for (Message& m : waiting) {
    const std::string text = strFormat("rank %d: %s failed: %s", rank_, describe(m).c_str(), message.c_str());
    FlightRecorder::process().finished(m.trace, false, "", "", text);
    m.work->markFailed(kind, text);
  }
}

void P2PEngine::loop() {
  for (;;) {
    std::deque<Message> fresh;
    bool failed, stopping;
    ErrorKind kind;
    std::string message;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (active_.empty() && any_source_.empty()) {
        cv_.wait(lock, [&] { return !incoming_.empty() || stopping_ || failed_; });
      }
      failed = failed_;
      stopping = stopping_;
      kind = fail_kind_;
      message = fail_message_;
      if (!failed && !stopping) fresh.swap(incoming_);
    }
    if (failed || stopping) {
      // failAll takes both what is posted and what is still waiting.
      failAll(failed ? kind : ErrorKind::kAborted, failed ? message : "the communicator was shut down");
      if (stopping) return;
      // Failed but not stopped: later messages fail at enqueue time.
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_; });
      continue;
    }
    for (Message& m : fresh) {
      if (m.peer == kAnySource) {
        any_source_.push_back(std::move(m));
      } else {
        post(m);
      }
    }
    matchAnySource();
    // Wait for progress, but not past the nearest deadline. A receive from any
    // source looks at the peers' next messages again every kAnySourcePoll: a
    // message that no receive claims finishes no request, so it would not end
    // the transport's wait.
    auto now = std::chrono::steady_clock::now();
    Deadline wake = now + (any_source_.empty() ? kIdlePoll : kAnySourcePoll);
    for (const Message& m : active_) wake = std::min(wake, m.deadline);
    for (const Message& m : any_source_) wake = std::min(wake, m.deadline);
    bool any_finished = std::any_of(active_.begin(), active_.end(),
                                    [](const Message& m) { return m.request->state != Request::State::kPending; });
    if (!any_finished && wake > now) {
      transport_->progress(std::chrono::duration_cast<std::chrono::milliseconds>(wake - now) +
                           std::chrono::milliseconds(1));
    }
    now = std::chrono::steady_clock::now();
    for (auto it = active_.begin(); it != active_.end();) {
      Message& m = *it;
      if (m.request->state == Request::State::kDone) {
        transport_->release(m.request);
        if (timeline_ != nullptr) {
          timeline_->slice(1, describe(m), m.is_send ? "send" : "recv", m.issued, now,
                           strFormat("\"bytes\": %zu", m.bytes));
        }
        FlightRecorder::process().finished(m.trace, true, "", "p2p");
        OpStats::process().add(m.desc, 2, "", "p2p", std::chrono::duration<double>(now - m.issued).count(), true);
        m.work->markDone();
        it = active_.erase(it);
        continue;
      }
      if (m.request->state == Request::State::kFailed) {
        TransportFailure f = transport_->failure(m.request);
        std::string text = strFormat("rank %d: %s failed: %s", rank_, describe(m).c_str(), f.message.c_str());
        FlightRecorder::process().finished(m.trace, false, "", "p2p", text);  // before the dump that on_failure_ makes
        on_failure_(f.kind, text);  // records it; fail() below reaches everything else
        fail(f.kind, text);
        break;
      }
      if (now >= m.deadline) {
        std::string text = strFormat("rank %d: %s %s (did rank %d post the matching %s?)", rank_, describe(m).c_str(),
                                     timedOut(static_cast<double>(m.timeout.count()) / 1000.0).c_str(), m.peer,
                                     m.is_send ? "recv" : "send");
        FlightRecorder::process().finished(m.trace, false, "", "p2p", text);
        on_failure_(ErrorKind::kTimeout, text);
        fail(ErrorKind::kTimeout, text);
        break;
      }
      ++it;
    }
    for (const Message& m : any_source_) {
      if (now < m.deadline) continue;
      std::string text = strFormat(
          "rank %d: %s %s (no rank sent a message with tag %u that another receive did "
          "not take)",
          rank_, describe(m).c_str(), timedOut(static_cast<double>(m.timeout.count()) / 1000.0).c_str(), m.desc.root);
      on_failure_(ErrorKind::kTimeout, text);
      fail(ErrorKind::kTimeout, text);
      break;
    }
  }
}

void P2PEngine::post(Message& m) {
  WireHeader header = makeHeader(m.desc, comm_id_, static_cast<uint32_t>(m.is_send ? rank_ : m.peer), 0, m.bytes);
  m.request = m.is_send ? transport_->isend(m.peer, header, m.data, m.bytes)
                        : transport_->irecv(m.peer, header, m.data, m.bytes);
  FlightRecorder::process().started(m.trace);
  active_.push_back(std::move(m));
}

// A peer's next message is free for a receive from any source when nobody has
// claimed its number yet: every receive from that peer, posted or still
// queued, took a number at issue, so a message whose number is the next one
// to hand out belongs to no one.
void P2PEngine::matchAnySource() {
  for (auto it = any_source_.begin(); it != any_source_.end();) {
    Message& m = *it;
    int found = -1;
    for (int i = 0; i < size_ && found < 0; ++i) {
      const int p = (next_peer_to_try_ + i) % size_;
      WireHeader next{};
      if (p == rank_ || !transport_->peekIncoming(p, &next)) continue;
      const uint64_t next_seq = next.seq;  // copies: the packed fields may be misaligned
      const uint32_t next_tag = next.root;
      if (next.magic != kWireMagic || next.kind != static_cast<uint8_t>(OpKind::kPointToPoint) ||
          next.comm_id != comm_id_ || next_tag != m.desc.root) {
        continue;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      uint64_t& seq = next_recv_seq_[static_cast<size_t>(p)];
      if (next_seq != seq) continue;  // claimed by a receive from p issued meanwhile
      m.desc.seq = seq++;
      found = p;
    }
    if (found < 0) {
      ++it;
      continue;
    }
    next_peer_to_try_ = (found + 1) % size_;
    m.peer = found;
    m.work->setSourceRank(found);
    post(m);
    it = any_source_.erase(it);
  }
}

}  // namespace rcoll
