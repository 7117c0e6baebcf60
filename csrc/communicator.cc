#include "communicator.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "algorithms.h"
#include "error.h"
#include "log.h"
#include "reduce_kernels.h"
#include "socket_util.h"
#include "tcp_transport.h"

namespace rcoll {

namespace {

constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(30);

void fillRandom(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    ssize_t n = getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwError(ErrorKind::kGeneric, "getrandom(): " + errnoText(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

// What rank 0 publishes for everyone: the job secret and the settings that must
// be identical on every rank for the segment headers to line up.
#pragma pack(push, 1)
struct JobInfo {
  uint8_t token[16];
  uint64_t comm_id;
  uint32_t size;
  uint64_t chunk_bytes;
  uint64_t min_chunk_bytes;
};
#pragma pack(pop)

std::vector<uint8_t> toBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string fromBytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::chrono::milliseconds timeoutFromEnvironment() {
  const char* value = std::getenv("RCOLL_TIMEOUT");
  if (value == nullptr || *value == '\0') return kDefaultTimeout;
  char* end = nullptr;
  double seconds = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(seconds > 0)) {
    throwError(ErrorKind::kConfig, strFormat("RCOLL_TIMEOUT=%s must be a positive number of seconds", value));
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000));
}

}  // namespace

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options)
    : rank_(rank), size_(size), name_(options.name), config_(Config::fromEnvironment()) {
  if (size < 1 || rank < 0 || rank >= size) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d is not in a world of size %d", rank, size));
  }
  if (!store) throwError(ErrorKind::kInvalidArgument, "a rendezvous store is required");
  timeout_ = options.timeout.count() > 0 ? options.timeout : timeoutFromEnvironment();
  setLogRank(rank);
  info_.rank = rank;
  info_.size = size;
  rendezvous(*store, options.bind_hint);
  size_t max_elem = 8;
  executor_ = std::make_unique<PipelineExecutor>(*transport_, rank_, size_, info_.comm_id,
                                                 config_.chunk_bytes + max_elem, config_.pipeline_slots);
  thread_ = std::thread([this] { progressLoop(); });
  RCOLL_INFO("communicator '%s' ready: rank %d of %d, transport %s, timeout %.0f s, %s", name_.c_str(), rank_,
             size_, transportName(), static_cast<double>(timeout_.count()) / 1000.0, config_.describe().c_str());
}

Communicator::~Communicator() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!queue_.empty() && poison_message_.empty()) {
      abort_reason_ = "the communicator was destroyed with operations still queued";
      abort_flag_.store(true);
    }
  }
  if (transport_) transport_->interrupt();
  stopThread();
}

const char* Communicator::transportName() const { return transport_ ? transport_->name() : "none"; }

void Communicator::rendezvous(Store& store, const std::string& bind_hint) {
  const auto deadline = std::chrono::steady_clock::now() + config_.connect_timeout;
  // Each set of ranks that joins under this name gets its own generation, so a
  // communicator re-created on the same store never reads stale keys.
  std::string base = "rcoll/" + name_ + "/";
  int64_t joined = store.add(base + "joined", 1);
  std::string prefix = base + std::to_string((joined - 1) / size_) + "/";

  JobInfo job{};
  if (rank_ == 0) {
    fillRandom(job.token, sizeof(job.token));
    fillRandom(&job.comm_id, sizeof(job.comm_id));
    job.size = static_cast<uint32_t>(size_);
    job.chunk_bytes = config_.chunk_bytes;
    job.min_chunk_bytes = config_.min_chunk_bytes;
    std::vector<uint8_t> bytes(sizeof(job));
    std::memcpy(bytes.data(), &job, sizeof(job));
    store.set(prefix + "job", bytes);
  } else {
    std::vector<uint8_t> bytes = store.get(prefix + "job", config_.connect_timeout);
    if (bytes.size() != sizeof(job)) {
      throwError(ErrorKind::kConfig, strFormat("rank %d: rank 0 published job information of another rcoll "
                                               "version (%zu bytes); install the same rcoll on every rank",
                                               rank_, bytes.size()));
    }
    std::memcpy(&job, bytes.data(), sizeof(job));
    if (job.size != static_cast<uint32_t>(size_)) {
      throwError(ErrorKind::kConfig, strFormat("rank %d was started with world size %d but rank 0 with %u",
                                               rank_, size_, job.size));
    }
    if (job.chunk_bytes != config_.chunk_bytes || job.min_chunk_bytes != config_.min_chunk_bytes) {
      RCOLL_WARN("RCOLL_CHUNK_BYTES/RCOLL_MIN_CHUNK_BYTES differ from rank 0's (%llu/%llu); using rank 0's",
                 static_cast<unsigned long long>(job.chunk_bytes),
                 static_cast<unsigned long long>(job.min_chunk_bytes));
      config_.chunk_bytes = job.chunk_bytes;
      config_.min_chunk_bytes = job.min_chunk_bytes;
    }
  }
  std::memcpy(info_.token, job.token, sizeof(info_.token));
  info_.comm_id = job.comm_id;
  if (size_ == 1) return;  // nobody to talk to: no sockets at all

  std::string bind_host;
  if (!config_.socket_ifname.empty()) {
    bind_host = interfaceAddress(config_.socket_ifname);
    if (bind_host.empty()) {
      throwError(ErrorKind::kConfig, strFormat("RCOLL_SOCKET_IFNAME=%s: no such interface with an IPv4 address",
                                               config_.socket_ifname.c_str()));
    }
  } else {
    bind_host = bind_hint.empty() ? "127.0.0.1" : bind_hint;
  }
  transport_ = std::make_unique<TcpTransport>(info_, config_, bind_host);
  store.set(prefix + "addr/" + std::to_string(rank_), toBytes(transport_->listenAddress()));

  // Connect to every lower rank, accept every higher one: lower ranks never wait
  // on higher ones, so the set-up cannot deadlock.
  for (int peer = 0; peer < rank_; ++peer) {
    int ms = millisecondsUntil(deadline);
    std::string address = fromBytes(store.get(prefix + "addr/" + std::to_string(peer), std::chrono::milliseconds(ms)));
    transport_->connect(peer, address, deadline);
  }
  for (int accepted = 0; accepted < size_ - 1 - rank_; ++accepted) transport_->accept(deadline);
  transport_->closeListener();
}

std::shared_ptr<Work> Communicator::enqueue(OpKind kind, DataType dtype, ReduceOp op, uint32_t root, size_t count,
                                            const void* send, void* recv, std::chrono::milliseconds timeout) {
  OpDesc desc;
  desc.kind = kind;
  desc.dtype = dtype;
  desc.reduce_op = op;
  desc.root = root;
  desc.count = count;
  std::string bad;
  if (kind == OpKind::kAllreduce || kind == OpKind::kReduceScatter) bad = reduceUnsupportedReason(dtype, op);
  if (bad.empty() && count > 0 && kind != OpKind::kBarrier && (recv == nullptr || send == nullptr)) {
    bad = "null buffer";
  }
  if (bad.empty() && kind == OpKind::kBroadcast && static_cast<int>(root) >= size_) {
    bad = strFormat("root %u is not a rank of this communicator (size %d)", root, size_);
  }
  if (!bad.empty()) {
    desc.seq = next_seq_;
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: %s: %s", rank_, describeOp(desc).c_str(), bad.c_str()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_ || closed_) {
    throwError(ErrorKind::kAborted, strFormat("rank %d: %s called after shutdown()", rank_, describeOp(desc).c_str()));
  }
  desc.seq = next_seq_++;
  auto work = std::make_shared<Work>(desc.seq);
  queue_.push_back({desc, static_cast<const char*>(send), static_cast<char*>(recv),
                    timeout.count() > 0 ? timeout : timeout_, work});
  queue_cv_.notify_one();
  return work;
}

std::shared_ptr<Work> Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                              std::chrono::milliseconds timeout) {
  return enqueue(OpKind::kAllreduce, dtype, op, 0, count, send, recv, timeout);
}

std::shared_ptr<Work> Communicator::allgather(const void* send, void* recv, size_t count, DataType dtype,
                                              std::chrono::milliseconds timeout) {
  return enqueue(OpKind::kAllgather, dtype, ReduceOp::kSum, 0, count, send, recv, timeout);
}

std::shared_ptr<Work> Communicator::reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                                  ReduceOp op, std::chrono::milliseconds timeout) {
  return enqueue(OpKind::kReduceScatter, dtype, op, 0, count, send, recv, timeout);
}

std::shared_ptr<Work> Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                                              std::chrono::milliseconds timeout) {
  if (root < 0) throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: broadcast root %d < 0", rank_, root));
  return enqueue(OpKind::kBroadcast, dtype, ReduceOp::kSum, static_cast<uint32_t>(root), count, send, recv, timeout);
}

std::shared_ptr<Work> Communicator::barrier(std::chrono::milliseconds timeout) {
  return enqueue(OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, 0, nullptr, nullptr, timeout);
}

void Communicator::runOp(const Op& op) {
  const OpDesc& d = op.desc;
  const size_t es = elementSize(d.dtype);
  const size_t bytes = d.count * es;
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  const RingContext ctx{rank_, size_,
                        Segmenter{std::max<size_t>(1, config_.chunk_bytes / es),
                                  std::max<size_t>(1, config_.min_chunk_bytes / es)}};
  schedule_.reset(d, es);
  // Local part first: out-of-place inputs are copied where the algorithm
  // expects them (memmove: callers may pass overlapping views).
  switch (d.kind) {
    case OpKind::kAllreduce:
      if (size_ == 1) {
        if (op.send != op.recv) std::memmove(op.recv, op.send, bytes);
        if (d.reduce_op == ReduceOp::kAvg) scaleDivide(op.recv, d.count, d.dtype, 1);
        return;
      }
      buildRingAllreduce(schedule_, ctx, op.send, op.recv, d.count);
      break;
    case OpKind::kAllgather: {
      char* own = op.recv + static_cast<size_t>(rank_) * bytes;
      if (op.send != own) std::memmove(own, op.send, bytes);
      if (size_ == 1) return;
      buildRingAllgather(schedule_, ctx, op.recv, d.count);
      break;
    }
    case OpKind::kReduceScatter:
      if (size_ == 1) {
        if (op.send != op.recv) std::memmove(op.recv, op.send, bytes);
        if (d.reduce_op == ReduceOp::kAvg) scaleDivide(op.recv, d.count, d.dtype, 1);
        return;
      }
      if (scratch_.size() < bytes * static_cast<size_t>(size_)) scratch_.resize(bytes * static_cast<size_t>(size_));
      buildRingReduceScatter(schedule_, ctx, op.send, op.recv, scratch_.data(), d.count);
      break;
    case OpKind::kBroadcast:
      if (rank_ == static_cast<int>(d.root) && op.send != op.recv) std::memmove(op.recv, op.send, bytes);
      if (size_ == 1) return;
      buildChainBroadcast(schedule_, ctx, op.recv, d.count, static_cast<int>(d.root));
      break;
    case OpKind::kBarrier:
      if (size_ == 1) return;
      buildDisseminationBarrier(schedule_, ctx);
      break;
    case OpKind::kAbort:
      return;
  }
  executor_->run(schedule_, deadline, op.timeout, abort_flag_);
}

void Communicator::poison(ErrorKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_message_.empty()) return;
    poison_kind_ = kind;
    poison_message_ = message;
  }
  RCOLL_WARN("%s", message.c_str());
  // Tell the peers why, so that they fail with this cause rather than a bare
  // "connection closed" or a timeout.
  if (transport_) transport_->abortPeers(kind, message);
}

void Communicator::progressLoop() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return !queue_.empty() || stopping_ || abort_flag_.load(); });
      if (queue_.empty()) {
        if (abort_flag_.load() && poison_message_.empty()) {
          lock.unlock();
          poison(ErrorKind::kAborted, strFormat("rank %d: communicator aborted: %s", rank_, abort_reason_.c_str()));
          continue;
        }
        if (stopping_) return;
        continue;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string earlier;
    ErrorKind earlier_kind;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      earlier = poison_message_;
      earlier_kind = poison_kind_;
    }
    if (earlier.empty() && abort_flag_.load()) {
      poison(ErrorKind::kAborted, strFormat("rank %d: communicator aborted: %s", rank_, abort_reason_.c_str()));
      std::lock_guard<std::mutex> lock(mutex_);
      earlier = poison_message_;
      earlier_kind = poison_kind_;
    }
    if (!earlier.empty()) {
      op.work->markFailed(earlier_kind, strFormat("rank %d: %s (op #%llu) was not run because the communicator "
                                                  "failed earlier: %s",
                                                  rank_, describeOp(op.desc).c_str(),
                                                  static_cast<unsigned long long>(op.desc.seq), earlier.c_str()));
      continue;
    }
    try {
      runOp(op);
      op.work->markDone();
    } catch (const RcollError& e) {
      ErrorKind kind = e.kind();
      std::string message = e.what();
      if (kind == ErrorKind::kAborted && !abort_reason_.empty()) message += ": " + abort_reason_;
      poison(kind, message);
      op.work->markFailed(kind, message);
    } catch (const std::exception& e) {
      std::string message = strFormat("rank %d: %s (op #%llu) failed: %s", rank_, describeOp(op.desc).c_str(),
                                      static_cast<unsigned long long>(op.desc.seq), e.what());
      poison(ErrorKind::kGeneric, message);
      op.work->markFailed(ErrorKind::kGeneric, message);
    }
  }
}

void Communicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_flag_.load()) return;
    abort_reason_ = reason.empty() ? "abort() was called" : reason;
    abort_flag_.store(true);
  }
  queue_cv_.notify_all();
  if (transport_) transport_->interrupt();
}

void Communicator::stopThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
}

void Communicator::shutdown() { stopThread(); }

std::string Communicator::poisonMessage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return poison_message_;
}

}  // namespace rcoll
