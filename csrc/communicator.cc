#include "communicator.h"

#include <algorithm>

#include "cuda_ipc/cuda_ipc_collectives.h"
#include "device_staging_executor.h"
#include "error.h"
#include "log.h"
#include "mesh.h"
#include "op_errors.h"
#include "op_table.h"
#include "p2p_engine.h"
#include "pipeline_executor.h"
#include "shm/shm_collectives.h"
#include "timeline.h"
#include "transport.h"

namespace rcoll {

namespace {
// The device windows' settings (RCOLL_CUDA_IPC*, agreed) for buffers on `device`.
CudaIpcCollectives::Config deviceWindowsConfig(const Config& config, int device) {
  return {installedDeviceApi(), device, config.cuda_ipc ? config.cuda_ipc_slot_bytes : 0, config.cuda_ipc_direct_bytes};
}
}  // namespace

Communicator::Communicator(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options)
    : rank_(rank), size_(size), name_(options.name), config_(Config::fromEnvironment(options.settings)) {
  if (size < 1 || rank < 0 || rank >= size) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d is not in a world of size %d", rank, size));
  }
  if (!store) throwError(ErrorKind::kInvalidArgument, "a rendezvous store is required");
  timeout_ = options.timeout.count() > 0 ? options.timeout : config_.timeout;
  setLogRank(rank);
  Mesh mesh = buildMesh(*store, rank, size, name_, config_, options.bind_hint);
  config_ = mesh.config;
  comm_id_ = mesh.info.comm_id;
  rendezvous_prefix_ = mesh.prefix;
  topology_ = std::move(mesh.topology);
  chooseAlgorithms();
  peer_transports_ = std::move(mesh.peer_transports);
  transport_ = std::move(mesh.transport);
  shm_coll_ = std::move(mesh.shm_coll);
  host_windows_ = std::move(mesh.host_windows);
  if (host_windows_ && hierarchical_) host_ipc_ = std::make_unique<CudaIpcCollectives>(*host_windows_);
  if (mesh.p2p_transport) {
    p2p_ = std::make_unique<P2PEngine>(
        std::move(mesh.p2p_transport), rank_, size_, mesh.p2p_info.comm_id,
        [this](ErrorKind kind, const std::string& message) { recordFailure(kind, message); });
  }
  size_t max_elem = 8;
  if (transport_) {  // none in a world of size 1, where every op is local
    executor_ = std::make_unique<PipelineExecutor>(*transport_, rank_, size_, comm_id_, config_.chunk_bytes + max_elem,
                                                   config_.pipeline_slots);
  }
  timeline_ = Timeline::open(config_.timeline, rank_);
  if (timeline_) {
    if (executor_) executor_->setTimeline(timeline_.get());
    if (shm_coll_) shm_coll_->setTimeline(timeline_.get());
    if (p2p_) p2p_->setTimeline(timeline_.get());
    timeline_->label(strFormat("transport %s; %s", transportName(), describeEdges().c_str()));
    RCOLL_INFO("rank %d: writing the timeline to %s", rank_, timeline_->path().c_str());
  }
  if (p2p_) p2p_->start();
  thread_ = std::thread([this] { progressLoop(); });
  RCOLL_INFO("communicator '%s' ready: rank %d of %d, transport %s, timeout %.0f s, %s", name_.c_str(), rank_, size_,
             transportName(), static_cast<double>(timeout_.count()) / 1000.0, config_.describe().c_str());
}

Communicator::~Communicator() {
  bool queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued = !queue_.empty();
  }
  if (queued) abort("the communicator was destroyed with operations still queued");
  stopThread();
}

const char* Communicator::transportName() const { return transport_ ? transport_->name() : "none"; }

std::string Communicator::describeEdges() const { return rcoll::describeEdges(transports()); }

bool Communicator::cachesRegistrations() const { return transport_ && transport_->needsRegistration(); }

const char* Communicator::devicePath() const {
  switch (device_path_.load(std::memory_order_relaxed)) {
    case DevicePath::kIpcWindows:
      return "cuda-ipc";
    case DevicePath::kStaging:
      return "staging";
    case DevicePath::kGdr:
      return "gdr";
    case DevicePath::kIpcStaging:
      return "cuda-ipc+staging";
    case DevicePath::kIpcGdr:
      return "cuda-ipc+gdr";
    default:
      return "none";
  }
}

std::vector<std::string> Communicator::transports() const {
  if (peer_transports_.empty()) return std::vector<std::string>(static_cast<size_t>(size_), "self");
  return peer_transports_;
}

void Communicator::invalidateMemory(const void* data, size_t bytes) {
  if (transport_) transport_->invalidateMemory(data, bytes);
  if (p2p_) p2p_->transport().invalidateMemory(data, bytes);
}

std::shared_ptr<Work> Communicator::enqueue(OpKind kind, DataType dtype, ReduceOp reduce_op, int root, size_t count,
                                            const void* send, void* recv, std::chrono::milliseconds timeout,
                                            Launch launch, std::vector<uint64_t> counts, const DeviceOpArgs* device) {
  OpDesc desc;
  desc.kind = kind;
  desc.dtype = dtype;
  desc.reduce_op = reduce_op;
  desc.root = static_cast<uint32_t>(root);
  desc.count = count;
  desc.seq = next_seq_;  // for the messages; taken for real below
  checkOpArgs(desc, rank_, size_, send, recv);
  std::shared_ptr<DeviceEvent> ready, completion;
  if (device != nullptr) {
    const std::string what = strFormat("rank %d: %s on device %d", rank_, describeOp(desc).c_str(), device->device);
    const DeviceApi* api = installedDeviceApi();
    if (api == nullptr) {
      throwError(ErrorKind::kInvalidArgument, what +
                                                  ": no device runtime is installed (rcoll.cuda's module was not "
                                                  "loaded; is this a CUDA build of rcoll?)");
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (device_ >= 0 && device_ != device->device) {
        throwError(ErrorKind::kInvalidArgument,
                   strFormat("%s: this communicator already serves device %d; a communicator uses one device "
                             "(create one per device)",
                             what.c_str(), device_));
      }
      device_ = device->device;
    }
    // Recorded now, on the caller's thread: the op must see what the caller
    // queued on its stream before this call, and nothing queued after it.
    ready = std::make_shared<DeviceEvent>(*api, device->device, what);
    ready->record(device->stream, what);
    completion = std::make_shared<DeviceEvent>(*api, device->device, what);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (stopping_ || closed_) {
    throwError(ErrorKind::kAborted, strFormat("rank %d: %s called after shutdown()", rank_, describeOp(desc).c_str()));
  }
  desc.seq = next_seq_++;
  auto work = std::make_shared<Work>(desc.seq);
  if (completion) work->setDeviceCompletion(completion);
  Op op{desc,
        static_cast<const char*>(send),
        static_cast<char*>(recv),
        timeout.count() > 0 ? timeout : timeout_,
        work,
        std::move(counts),
        std::chrono::steady_clock::now(),
        device != nullptr ? device->device : -1,
        std::move(ready)};
  // A caller that is about to wait runs the op itself when nothing is queued
  // or running: no hand-off to the progress thread and back, which costs two
  // thread wake-ups (tens of microseconds each on a loaded or virtual machine)
  // per small op. Issue order is kept: nothing else can start meanwhile.
  if (launch == Launch::kCallerWaits && device == nullptr && queue_.empty() && !running_op_ && !abort_flag_.load()) {
    runOwned(std::move(op), lock);
    return work;
  }
  work->setInlineRunner(weak_from_this());  // empty unless a shared_ptr owns this communicator
  queue_.push_back(std::move(op));
  queue_cv_.notify_one();
  return work;
}

void Communicator::runInline(const Work& work) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Device ops stay on the progress thread, which holds the device's context.
  if (running_op_ || queue_.empty() || queue_.front().work.get() != &work || queue_.front().device >= 0 ||
      abort_flag_.load()) {
    return;
  }
  Op op = std::move(queue_.front());
  queue_.pop_front();
  runOwned(std::move(op), lock);
}

// Takes the executor (the caller holds mutex_ through `lock` and has checked
// that nothing runs), then runs `op` on this thread without the lock.
void Communicator::runOwned(Op op, std::unique_lock<std::mutex>& lock) {
  running_op_ = true;
  lock.unlock();
  ExecutorRelease release{this};
  executeOp(op);
}

std::shared_ptr<Work> Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                              std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kAllreduce, dtype, op, 0, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::allgather(const void* send, void* recv, size_t count, DataType dtype,
                                              std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kAllgather, dtype, ReduceOp::kSum, 0, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                                  ReduceOp op, std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kReduceScatter, dtype, op, 0, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                                              std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kBroadcast, dtype, ReduceOp::kSum, root, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::deviceCollective(OpKind kind, const void* send, void* recv, size_t count,
                                                     DataType dtype, ReduceOp op, int root, const DeviceOpArgs& device,
                                                     std::chrono::milliseconds timeout) {
  const OpTraits& traits = opTraits(kind);
  if (!traits.on_device || kind == OpKind::kAllToAll) {  // alltoall takes its counts through allToAll()
    throwError(
        ErrorKind::kInvalidArgument,
        strFormat("rank %d: %s is not supported on device buffers (copy them to the host)", rank_, opKindName(kind)));
  }
  if (!traits.reduces) op = ReduceOp::kSum;
  if (!traits.rooted) root = 0;
  return enqueue(kind, dtype, op, root, count, send, recv, timeout, Launch::kQueued, {}, &device);
}

std::shared_ptr<Work> Communicator::barrier(std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kBarrier, DataType::kUInt8, ReduceOp::kSum, 0, 0, nullptr, nullptr, timeout, launch);
}

std::shared_ptr<Work> Communicator::reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                           int root, std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kReduce, dtype, op, root, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::gather(const void* send, void* recv, size_t count, DataType dtype, int root,
                                           std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kGather, dtype, ReduceOp::kSum, root, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
                                            std::chrono::milliseconds timeout, Launch launch) {
  return enqueue(OpKind::kScatter, dtype, ReduceOp::kSum, root, count, send, recv, timeout, launch);
}

std::shared_ptr<Work> Communicator::allToAll(const void* send, void* recv, const std::vector<int64_t>& send_counts,
                                             const std::vector<int64_t>& send_displs,
                                             const std::vector<int64_t>& recv_counts,
                                             const std::vector<int64_t>& recv_displs, DataType dtype,
                                             std::chrono::milliseconds timeout, Launch launch,
                                             const DeviceOpArgs* device) {
  AllToAllArgs args =
      checkAllToAllArgs(rank_, size_, dtype, send, recv, send_counts, send_displs, recv_counts, recv_displs);
  // Device ops always go through the progress thread, which holds the device's context.
  return enqueue(OpKind::kAllToAll, dtype, ReduceOp::kSum, 0, static_cast<size_t>(args.send_total), send, recv, timeout,
                 device != nullptr ? Launch::kQueued : launch, std::move(args.packed), device);
}

// Every rank has the same topology and RCOLL_ALGO (agreed_settings.h), so
// every rank makes the same choice.
void Communicator::chooseAlgorithms() {
  std::string why;
  const bool fits = topology_.host_order.size() == static_cast<size_t>(size_) && hierarchicalFits(topology_, &why);
  hierarchical_ = fits && config_.algo != Config::Algo::kRing;
  if (hierarchical_) {
    const int local = topology_.local_rank[static_cast<size_t>(rank_)];
    host_ring_position_.assign(static_cast<size_t>(size_), -1);
    for (const std::vector<int>& ranks : topology_.ranks_on_host) {
      const int r = ranks[static_cast<size_t>(local)];
      host_ring_position_[static_cast<size_t>(r)] = static_cast<int>(host_ring_order_.size());
      host_ring_order_.push_back(r);
    }
    algorithms_ =
        strFormat("allgather, reduce_scatter and allreduce above %zu bytes: hierarchical", config_.allreduce_rd_bytes);
  } else {
    algorithms_ = strFormat("allgather, reduce_scatter and allreduce above %zu bytes: the ring in host order",
                            config_.allreduce_rd_bytes);
    if (config_.algo == Config::Algo::kRing) {
      algorithms_ += ", not hierarchical: RCOLL_ALGO=ring";
    } else if (!why.empty() && (topology_.hosts() > 1 || config_.algo == Config::Algo::kHierarchical)) {
      algorithms_ += ", not hierarchical: " + why;
    }
  }
  if (hierarchical_ || config_.algo == Config::Algo::kHierarchical || topology_.hosts() > 1) {
    RCOLL_INFO("rank %d: %s (%s)", rank_, algorithms_.c_str(), topology_.describe().c_str());
  }
}

AlgorithmContext Communicator::algorithmContext(size_t element_size) const {
  AlgorithmContext ctx{rank_, size_,
                       Segmenter{std::max<size_t>(1, config_.chunk_bytes / element_size),
                                 std::max<size_t>(1, config_.min_chunk_bytes / element_size)}};
  if (topology_.host_order.size() == static_cast<size_t>(size_)) {  // rings in host order (topology.h)
    ctx.ring_order = topology_.host_order.data();
    ctx.ring_position = topology_.position.data();
    ctx.topology = &topology_;
  }
  return ctx;
}

AlgorithmContext Communicator::hostRingContext(size_t element_size) const {
  AlgorithmContext ctx = algorithmContext(element_size);
  ctx.size = static_cast<int>(host_ring_order_.size());
  ctx.ring_order = host_ring_order_.data();
  ctx.ring_position = host_ring_position_.data();
  ctx.topology = nullptr;
  return ctx;
}

void Communicator::runOp(const Op& op) {
  op_algorithm_ = "";
  if (shm_coll_) shm_coll_->announce(op.desc, op.device >= 0);
  if (host_ipc_) host_windows_->announce(op.desc, op.device >= 0);
  if (op.device >= 0) return runDeviceOp(op);
  const OpDesc& d = op.desc;
  const size_t es = elementSize(d.dtype);
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  if (shm_coll_ && ShmCollectives::handles(d.kind)) {
    op_algorithm_ = "shm windows";
    return shm_coll_->run(d, op.send, op.recv, deadline, op.timeout, abort_flag_);
  }
  schedule_.reset(d, es);
  HostMemory memory(scratch_);
  const AlgorithmChoice choice{config_.allreduce_rd_bytes, hierarchical_};
  const bool exchange = planOp(OpCall{d, op.send, op.recv, op.counts}, algorithmContext(es), choice, memory, schedule_);
  op_algorithm_ = exchange ? schedule_.algorithm : "local";
  if (exchange) executor_->run(schedule_, deadline, op.timeout, abort_flag_);
}

// The device twin of runOp(): the same schedules, with the local steps done
// on the device and the segments staged through pinned host memory
// (device_staging_executor.h).
void Communicator::runDeviceOp(const Op& op) {
  const OpDesc& d = op.desc;
  const size_t es = elementSize(d.dtype);
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  const std::string context = strFormat("rank %d: %s (op #%llu) on device %d", rank_, describeOp(d).c_str(),
                                        static_cast<unsigned long long>(d.seq), op.device);
  // Every rank on one host: device to device through the CUDA IPC windows,
  // when all ranks could set them up (the same answer on every rank).
  if (shm_coll_) {
    if (shm_coll_->runDevice(d, op.send, op.recv, deviceWindowsConfig(config_, op.device), op.ready.get(),
                             op.work->deviceCompletion().get(), deadline, op.timeout, abort_flag_)) {
      device_path_.store(DevicePath::kIpcWindows, std::memory_order_relaxed);
      op_algorithm_ = "cuda ipc windows";
      return;
    }
  }
  if (hierarchical_ && runDeviceOpOverHosts(op, context)) return;
  DeviceStagingExecutor& ex = deviceExecutor(op.device, context);
  device_path_.store(ex.gdr() ? DevicePath::kGdr : DevicePath::kStaging, std::memory_order_relaxed);
  schedule_.reset(d, es);
  try {
    ex.begin(op.ready.get(), context);
    // The staging executor has no recursive doubling (it would hold slots
    // across sends); the ring or the hierarchical allreduce for every size.
    const AlgorithmChoice choice{0, hierarchical_};
    const bool exchange = planOp(OpCall{d, op.send, op.recv, op.counts}, algorithmContext(es), choice, ex, schedule_);
    op_algorithm_ = exchange ? schedule_.algorithm : "local";
    if (exchange) ex.run(schedule_, deadline, op.timeout, abort_flag_);
    ex.finish(op.work->deviceCompletion().get(), deadline, op.timeout, abort_flag_);
  } catch (...) {
    ex.abandon();  // no copy may still touch the slots or the caller's memory
    throw;
  }
}

DeviceStagingExecutor& Communicator::deviceExecutor(int device, const std::string& context) {
  if (!device_executor_) {
    try {
      device_executor_ = std::make_unique<DeviceStagingExecutor>(transport_.get(), *installedDeviceApi(), device, rank_,
                                                                 size_, comm_id_, config_.chunk_bytes + 8,
                                                                 config_.pipeline_slots, config_.gdr);
    } catch (const RcollError& e) {
      throwError(e.kind(), context + ": " + e.what());
    }
  }
  return *device_executor_;
}

bool Communicator::runDeviceOpOverHosts(const Op& op, const std::string& context) {
  const OpDesc& d = op.desc;
  // Every test before the windows' set-up gives the same answer on every
  // rank (the op, the topology, the agreed settings), so that all of them
  // reach the agreement below at the same op, or none does.
  if (!CudaIpcCollectives::handles(d.kind)) return false;
  if (!config_.cuda_ipc) return false;
  if (d.kind != OpKind::kAllreduce) {
    // Their phases inside and between the hosts run one after the other: a
    // small buffer pays the windows' hand-offs and saves little (config.cc).
    const size_t blocks = opTraits(d.kind).per_rank_blocks ? static_cast<size_t>(size_) : 1;
    const size_t whole = d.count * elementSize(d.dtype) * blocks;  // the whole buffer, as benchmarks count it
    if (whole < config_.cuda_ipc_hosts_min_bytes) return false;
  }
  if (!CudaIpcCollectives::stepHoldsBlocks(d, config_.cuda_ipc_slot_bytes, static_cast<size_t>(size_),
                                           static_cast<size_t>(topology_.hosts()))) {
    return false;
  }
  const size_t es = elementSize(d.dtype);
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  DeviceStagingExecutor& ex = deviceExecutor(op.device, context);
  // The windows' set-up ends with every host's answer: the ring of this local
  // index (one rank per host, each knowing its host's answer) takes the
  // minimum of one byte, on host memory.
  auto agree = [&](bool this_host_on) {
    OpDesc question = d;
    question.dtype = DataType::kUInt8;
    question.reduce_op = ReduceOp::kMin;
    question.count = 1;
    uint8_t on = this_host_on ? 1 : 0;
    Schedule s;
    s.reset(question, 1);
    buildRingAllreduce(s, hostRingContext(1), reinterpret_cast<const char*>(&on), reinterpret_cast<char*>(&on), 1);
    executor_->run(s, deadline, op.timeout, abort_flag_);
    return on == 1;
  };
  if (!host_ipc_) {
    // This host has no windows (a rank here refused shared memory, or it has
    // too many ranks): it still answers the other hosts, once, and stages.
    if (!windows_question_answered_) {
      windows_question_answered_ = true;
      agree(false);
    }
    return false;
  }
  // The phases between the hosts: rings of the ranks of this local index, on
  // device memory through the staging executor. The op's own descriptor goes
  // on the wire (hosts that disagree on it meet a header naming the other
  // call); avg reduces as a sum and divides once, by the world, when every
  // host's share is in (cuda_ipc_collectives.cc), not in the ring.
  auto between = [&](auto&& build) {
    schedule_.reset(d, es);
    build(schedule_, hostRingContext(es));
    for (RecvStep& r : schedule_.recvs) r.divide_after = false;
    try {
      ex.begin(nullptr, context);  // the windows' stream finished its part already
      ex.run(schedule_, deadline, op.timeout, abort_flag_);
      ex.finish(nullptr, deadline, op.timeout, abort_flag_);
    } catch (...) {
      ex.abandon();
      throw;
    }
  };
  CudaIpcCollectives::BetweenHosts hosts;
  hosts.agree = agree;
  hosts.allreduce = [&](char* data, size_t count) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildRingAllreduce(s, ring, data, data, count); });
  };
  hosts.allgather = [&](char* recv, size_t count) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildRingAllgather(s, ring, recv, count); });
  };
  hosts.reduce_scatter = [&](char* sums, char* recv, size_t count) {
    // In place in `sums`, one block per host (blocks_by_position: host h's at
    // h * count): a block is reduced there only after it was sent (algorithms.cc).
    between([&](Schedule& s, const AlgorithmContext& ring) {
      AlgorithmContext by_host = ring;
      by_host.blocks_by_position = true;
      buildRingReduceScatter(s, by_host, sums, recv, sums, count);
    });
  };
  hosts.broadcast = [&](char* data, size_t count, int root) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildChainBroadcast(s, ring, data, count, root); });
  };
  hosts.scratch = [&](size_t bytes) { return ex.scratch(bytes); };
  hosts.topology = &topology_;
  if (!host_ipc_->run(d, op.send, op.recv, deviceWindowsConfig(config_, op.device), op.ready.get(),
                      op.work->deviceCompletion().get(), deadline, op.timeout, abort_flag_, &hosts)) {
    return false;
  }
  device_path_.store(ex.gdr() ? DevicePath::kIpcGdr : DevicePath::kIpcStaging, std::memory_order_relaxed);
  op_algorithm_ = "hierarchical (cuda ipc windows in each host)";  // the timeline's name
  return true;
}

void Communicator::recordFailure(ErrorKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_message_.empty()) return;
    poison_kind_ = kind;
    poison_message_ = message;
    abort_flag_.store(true);  // stops a running collective
  }
  RCOLL_WARN("%s", message.c_str());
  queue_cv_.notify_all();
  if (transport_) transport_->interrupt();
  if (p2p_) p2p_->fail(kind, message);
}

void Communicator::tellPeers() {
  if (peers_told_.exchange(true)) return;
  ErrorKind kind;
  std::string message;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    kind = poison_kind_;
    message = poison_message_;
  }
  // So that the peers fail with this cause rather than a bare "connection
  // closed" or a timeout.
  if (transport_) transport_->abortPeers(kind, message);
}

// The progress thread runs queued ops in issue order. It owns the executor
// (running_op_) while it runs one, and waits while a caller thread runs an op
// inline (enqueue with Launch::kCallerWaits), so ops never overlap.
void Communicator::progressLoop() {
  for (;;) {
    Op op;
    bool have_op = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queue_cv_.wait(lock, [&] { return !running_op_ && (!queue_.empty() || stopping_ || abortPending()); });
      if (!queue_.empty()) {
        op = std::move(queue_.front());
        queue_.pop_front();
        have_op = true;
      } else if (stopping_ && !abort_flag_.load()) {
        return;
      }
      running_op_ = true;
    }
    ExecutorRelease release{this};
    if (abort_flag_.load()) tellPeers();
    if (!have_op) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_ && queue_.empty()) return;
      continue;
    }
    executeOp(op);
  }
}

bool Communicator::abortPending() const { return abort_flag_.load() && !peers_told_.load(); }

// Gives the executor back. The progress thread is woken only when it has
// something to do: waking it costs tens of microseconds on a busy or virtual
// machine, which is what the inline path exists to avoid.
Communicator::ExecutorRelease::~ExecutorRelease() {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(self->mutex_);
    self->running_op_ = false;
    wake = !self->queue_.empty() || self->stopping_ || self->abortPending();
  }
  self->idle_cv_.notify_all();
  if (wake) self->queue_cv_.notify_all();
}

// Runs one op on the calling thread (which owns the executor) and completes its Work.
void Communicator::executeOp(const Op& op) {
  std::string earlier;
  ErrorKind earlier_kind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    earlier = poison_message_;
    earlier_kind = poison_kind_;
  }
  if (!earlier.empty()) {
    op.work->markFailed(earlier_kind, strFormat("rank %d: %s (op #%llu) was not run because the communicator "
                                                "failed earlier: %s",
                                                rank_, describeOp(op.desc).c_str(),
                                                static_cast<unsigned long long>(op.desc.seq), earlier.c_str()));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    runOp(op);
    if (timeline_) recordTimeline(op, start, "done");
    op.work->markDone();
  } catch (const std::exception& e) {
    if (timeline_) recordTimeline(op, start, "failed");
    const auto* rcoll_error = dynamic_cast<const RcollError*>(&e);
    ErrorKind kind = rcoll_error ? rcoll_error->kind() : ErrorKind::kGeneric;
    std::string message = rcoll_error ? std::string(e.what()) : opFailureMessage(rank_, op.desc, e.what());
    recordFailure(kind, message);
    {
      // Stopped by a failure recorded elsewhere (abort(), the p2p engine):
      // report that cause, not a bare "aborted".
      std::lock_guard<std::mutex> lock(mutex_);
      if (kind == ErrorKind::kAborted && poison_message_ != message) {
        kind = poison_kind_;
        message = opFailureMessage(rank_, op.desc, poison_message_);
      }
    }
    tellPeers();
    op.work->markFailed(kind, message);
  }
}

// One row per op: the op's slice, with "queue", "wait for peers" and
// "transfer" inside it (the executor adds the "reduce" slices).
void Communicator::recordTimeline(const Op& op, std::chrono::steady_clock::time_point start, const char* outcome) {
  const auto end = std::chrono::steady_clock::now();
  const std::string args =
      strFormat("\"op\": \"%s\", \"seq\": %llu, \"bytes\": %zu, \"algorithm\": \"%s\", \"outcome\": \"%s\"",
                jsonEscape(describeOp(op.desc)).c_str(), static_cast<unsigned long long>(op.desc.seq),
                op.desc.count * elementSize(op.desc.dtype), op_algorithm_, outcome);
  timeline_->slice(0, strFormat("%s #%llu", opKindName(op.desc.kind), static_cast<unsigned long long>(op.desc.seq)),
                   "op", op.enqueued, end, args);
  timeline_->slice(0, "queue", "queue", op.enqueued, start);
  auto first = op.device >= 0
                   ? (device_executor_ ? device_executor_->firstCompletion() : std::chrono::steady_clock::time_point{})
               : executor_ ? executor_->firstCompletion()
                           : std::chrono::steady_clock::time_point{};
  if (shm_coll_ && ShmCollectives::handles(op.desc.kind)) {
    // Device ops too, when they went through the device windows (then it is this op's).
    const auto windows_first = shm_coll_->firstCompletion();
    if (op.device < 0 || windows_first > start) first = windows_first;
  }
  if (first > start && first <= end) {
    timeline_->slice(0, "wait for peers", "wait", start, first);
    timeline_->slice(0, "transfer", "transfer", first, end);
  } else {
    timeline_->slice(0, "local", "transfer", start, end);  // world 1, or nothing to exchange
  }
}

void Communicator::abort(const std::string& reason) {
  recordFailure(ErrorKind::kAborted, strFormat("rank %d: communicator aborted: %s", rank_,
                                               reason.empty() ? "abort() was called" : reason.c_str()));
}

std::shared_ptr<Work> Communicator::send(const void* data, size_t count, DataType dtype, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  if (!p2p_)
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: send: no other rank in a world of size 1", rank_));
  return p2p_->send(data, count, dtype, peer, tag, timeout.count() > 0 ? timeout : timeout_);
}

std::shared_ptr<Work> Communicator::recv(void* data, size_t count, DataType dtype, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  if (!p2p_)
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: recv: no other rank in a world of size 1", rank_));
  return p2p_->recv(data, count, dtype, peer, tag, timeout.count() > 0 ? timeout : timeout_);
}

std::shared_ptr<Work> Communicator::recvFromAny(void* data, size_t count, DataType dtype, int tag,
                                                std::chrono::milliseconds timeout) {
  if (!p2p_) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: recv from any source: no other rank in a world of size 1", rank_));
  }
  return p2p_->recvFromAny(data, count, dtype, tag, timeout.count() > 0 ? timeout : timeout_);
}

void Communicator::stopThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (p2p_) p2p_->stop();
  // The peers were told why this communicator failed: let them read it before
  // the connections close (bounded; nothing to do otherwise).
  if (transport_ && peers_told_) transport_->settleAbort();
  // Both threads are gone, so nothing writes to the timeline any more: close it.
  std::lock_guard<std::mutex> lock(mutex_);
  if (timeline_) {
    if (executor_) executor_->setTimeline(nullptr);
    if (shm_coll_) shm_coll_->setTimeline(nullptr);
    if (p2p_) p2p_->setTimeline(nullptr);
    timeline_.reset();
  }
  closed_ = true;
}

void Communicator::shutdown(std::chrono::milliseconds grace) {
  if (grace.count() <= 0) grace = config_.shutdown_timeout + std::chrono::milliseconds(1);
  bool drained;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    queue_cv_.notify_all();
    drained = idle_cv_.wait_for(lock, grace, [&] { return queue_.empty() && !running_op_; });
  }
  if (!drained) {
    abort(strFormat("shutdown() was called and the pending operations did not finish within %.1f s",
                    static_cast<double>(grace.count()) / 1000.0));
  }
  stopThread();
}

std::string Communicator::poisonMessage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return poison_message_;
}

ErrorKind Communicator::poisonKind() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return poison_kind_;
}

std::vector<int> Communicator::lostPeers() const {
  std::vector<int> lost = transport_ ? transport_->lostPeers() : std::vector<int>{};
  if (p2p_) {
    for (int peer : p2p_->transport().lostPeers()) lost.push_back(peer);
  }
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  return lost;
}

}  // namespace rcoll
