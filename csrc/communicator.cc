#include "communicator.h"

#include <algorithm>

#include "adasum.h"
#include "cuda_ipc/device_over_hosts.h"
#include "device_staging_executor.h"
#include "error.h"
#include "log.h"
#include "mesh.h"
#include "op_errors.h"
#include "op_table.h"
#include "p2p_engine.h"
#include "pipeline_executor.h"
#include "shm/shm_collectives.h"
#include "shm/window_steps.h"
#include "op_stats.h"
#include "timeline.h"
#include "transport.h"

namespace rcoll {

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
  setUpWindows(mesh.windows_transport, mesh.window_members);
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
  {
    FlightRecorder::Group group{rendezvous_prefix_, "", std::vector<int>(static_cast<size_t>(size_))};
    for (int r = 0; r < size_; ++r) group.ranks[static_cast<size_t>(r)] = r;
    static std::atomic<bool> first{true};
    group.desc = first.exchange(false) ? "default_pg" : "undefined";
    trace_group_ =
        FlightRecorder::process().addGroup(std::move(group), rank_, config_.trace_buffer_size, config_.trace_dir);
    if (p2p_) p2p_->setTraceGroup(trace_group_);
  }
  timeline_ = Timeline::open(config_.timeline, rank_);
  if (timeline_) {
    if (executor_) executor_->setTimeline(timeline_.get());
    if (shm_coll_) shm_coll_->setTimeline(timeline_.get());
    if (p2p_) p2p_->setTimeline(timeline_.get());
    timeline_->label(strFormat("transport %s; %s", transportName(), describeEdges().c_str()));
    RCOLL_INFO("rank %d: writing the timeline to %s", rank_, timeline_->path().c_str());
  }
  if (p2p_) barrier_tokens_.assign(static_cast<size_t>(size_) + 1, 0);  // monitoredBarrier()'s messages
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
  const bool gdr = device_path_gdr_.load(std::memory_order_relaxed);
  switch (device_path_.load(std::memory_order_relaxed)) {
    case OpPath::kDeviceWindows:
      return "cuda-ipc";
    case OpPath::kStaging:
      return gdr ? "gdr" : "staging";
    case OpPath::kDeviceOverHosts:
      return gdr ? "cuda-ipc+gdr" : "cuda-ipc+staging";
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
  const OpTraits* traits = findOpTraits(kind);
  const uint64_t trace =
      FlightRecorder::process().scheduled({trace_group_, kind, dtype, count, traits && traits->rooted ? root : -1,
                                           false, desc.seq, (timeout.count() > 0 ? timeout : timeout_).count()});
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
        std::move(ready),
        trace};
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
  return collective(OpKind::kAllreduce, send, recv, count, dtype, op, 0, timeout, launch);
}

std::shared_ptr<Work> Communicator::allgather(const void* send, void* recv, size_t count, DataType dtype,
                                              std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kAllgather, send, recv, count, dtype, ReduceOp::kSum, 0, timeout, launch);
}

std::shared_ptr<Work> Communicator::reduceScatter(const void* send, void* recv, size_t count, DataType dtype,
                                                  ReduceOp op, std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kReduceScatter, send, recv, count, dtype, op, 0, timeout, launch);
}

std::shared_ptr<Work> Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                                              std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kBroadcast, send, recv, count, dtype, ReduceOp::kSum, root, timeout, launch);
}

std::shared_ptr<Work> Communicator::collective(OpKind kind, const void* send, void* recv, size_t count, DataType dtype,
                                               ReduceOp op, int root, std::chrono::milliseconds timeout, Launch launch,
                                               const DeviceOpArgs* device) {
  const OpTraits* traits = findOpTraits(kind);
  if (traits == nullptr || kind == OpKind::kAllToAll) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: %s is not a collective this call runs (alltoall takes its counts through "
                         "allToAll)",
                         rank_, opKindName(kind)));
  }
  if (device != nullptr && !traits->on_device) {
    throwError(
        ErrorKind::kInvalidArgument,
        strFormat("rank %d: %s is not supported on device buffers (copy them to the host)", rank_, opKindName(kind)));
  }
  if (!traits->reduces) op = ReduceOp::kSum;
  if (!traits->rooted) root = 0;
  if (kind == OpKind::kBarrier) {  // moves nothing: one descriptor whatever the caller passed
    dtype = DataType::kUInt8;
    count = 0;
    send = recv = nullptr;
  }
  // Device ops always go through the progress thread, which holds the device's context.
  return enqueue(kind, dtype, op, root, count, send, recv, timeout, device != nullptr ? Launch::kQueued : launch, {},
                 device);
}

std::shared_ptr<Work> Communicator::barrier(std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8, ReduceOp::kSum, 0, timeout, launch);
}

std::shared_ptr<Work> Communicator::reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                           int root, std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kReduce, send, recv, count, dtype, op, root, timeout, launch);
}

std::shared_ptr<Work> Communicator::gather(const void* send, void* recv, size_t count, DataType dtype, int root,
                                           std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kGather, send, recv, count, dtype, ReduceOp::kSum, root, timeout, launch);
}

std::shared_ptr<Work> Communicator::scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
                                            std::chrono::milliseconds timeout, Launch launch) {
  return collective(OpKind::kScatter, send, recv, count, dtype, ReduceOp::kSum, root, timeout, launch);
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
  const bool hierarchical = fits && config_.algo != Config::Algo::kRing;
  route_facts_.world = size_;
  route_facts_.hosts = topology_.hosts();
  route_facts_.hierarchical = hierarchical;
  route_facts_.allreduce_rd_bytes = config_.allreduce_rd_bytes;
  route_facts_.cuda_ipc = config_.cuda_ipc;
  route_facts_.cuda_ipc_slot_bytes = config_.cuda_ipc_slot_bytes;
  route_facts_.cuda_ipc_hosts_min_bytes = config_.cuda_ipc_hosts_min_bytes;
  if (hierarchical) {
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
  if (hierarchical || config_.algo == Config::Algo::kHierarchical || topology_.hosts() > 1) {
    RCOLL_INFO("rank %d: %s (%s)", rank_, algorithms_.c_str(), topology_.describe().c_str());
  }
}

void Communicator::setUpWindows(ShmTransport* transport, const std::vector<int>& members) {
  std::unique_ptr<WindowSteps> host_group;
  if (transport != nullptr && members.size() == static_cast<size_t>(size_)) {
    if (ShmCollectives::available(*transport, size_)) {
      shm_coll_ =
          std::make_unique<ShmCollectives>(*transport, rank_, size_, config_.spin, config_.shm_coll_direct_bytes);
      route_facts_.host_windows = true;
      RCOLL_INFO(
          "rank %d: allreduce, allgather, reduce_scatter, broadcast and barrier go through shared windows "
          "(slots of %zu bytes)",
          rank_, transport->windowSlotBytes());
    }
  } else if (transport != nullptr && route_facts_.hierarchical && WindowSteps::available(*transport, members)) {
    host_group = std::make_unique<WindowSteps>(*transport, members, rank_, config_.spin);
  }
  if (route_facts_.hierarchical) {
    device_over_hosts_ = std::make_unique<DeviceOverHosts>(std::move(host_group), topology_, rank_, config_);
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

void Communicator::runOp(const Op& op) {
  op_algorithm_ = "";
  const bool device = op.device >= 0;
  if (shm_coll_) shm_coll_->announce(op.desc, device);
  if (device_over_hosts_) device_over_hosts_->announce(op.desc, device);
  const OpRoute route = chooseRoute(op.desc, device, route_facts_);
  const auto deadline = std::chrono::steady_clock::now() + op.timeout;
  for (OpPath path : {route.path, route.fallback}) {
    op_path_ = path;
    if (device) device_path_.store(path, std::memory_order_relaxed);
    if (runOnPath(path, op, route, deadline)) return;
  }
}

bool Communicator::runOnPath(OpPath path, const Op& op, const OpRoute& route,
                             std::chrono::steady_clock::time_point deadline) {
  const OpDesc& d = op.desc;
  const size_t es = elementSize(d.dtype);
  const OpCall call{d, op.send, op.recv, op.counts};
  auto context = [&] {
    return strFormat("rank %d: %s (op #%llu) on device %d", rank_, describeOp(d).c_str(),
                     static_cast<unsigned long long>(d.seq), op.device);
  };
  switch (path) {
    case OpPath::kHostWindows:
      op_algorithm_ = "shm windows";
      shm_coll_->run(d, op.send, op.recv, deadline, op.timeout, abort_flag_);
      return true;
    case OpPath::kPipeline: {
      HostMemory memory(scratch_);
      if (d.kind == OpKind::kAdasum) {  // a schedule per step, local steps between them (adasum.h)
        op_algorithm_ = runAdasum(d, algorithmContext(es), op.send, op.recv, memory, schedule_,
                                  [&](const Schedule& s) { executor_->run(s, deadline, op.timeout, abort_flag_); });
        return true;
      }
      schedule_.reset(d, es);
      const bool exchange = planOp(call, algorithmContext(es), route.algorithm, memory, schedule_);
      op_algorithm_ = exchange ? schedule_.algorithm : "local";
      if (exchange) executor_->run(schedule_, deadline, op.timeout, abort_flag_);
      return true;
    }
    case OpPath::kDeviceWindows:
      op_algorithm_ = "cuda ipc windows";
      return shm_coll_->runDevice(d, op.send, op.recv, deviceWindowsConfig(config_, op.device), op.ready.get(),
                                  op.work->deviceCompletion().get(), deadline, op.timeout, abort_flag_);
    case OpPath::kDeviceOverHosts: {
      const std::string where = context();
      DeviceStagingExecutor& staging = deviceExecutor(op.device, where);
      device_path_gdr_.store(staging.gdr(), std::memory_order_relaxed);
      op_algorithm_ = "hierarchical (cuda ipc windows in each host)";
      return device_over_hosts_->run(d, op.send, op.recv, op.device, op.ready.get(), op.work->deviceCompletion().get(),
                                     *executor_, staging, deadline, op.timeout, abort_flag_, where);
    }
    case OpPath::kStaging: {
      // The same schedules as the pipeline's, with the local steps done on
      // the device and the segments staged through pinned host memory.
      const std::string where = context();
      DeviceStagingExecutor& ex = deviceExecutor(op.device, where);
      device_path_gdr_.store(ex.gdr(), std::memory_order_relaxed);
      schedule_.reset(d, es);
      try {
        ex.begin(op.ready.get(), where);
        const bool exchange = planOp(call, algorithmContext(es), route.algorithm, ex, schedule_);
        op_algorithm_ = exchange ? schedule_.algorithm : "local";
        if (exchange) ex.run(schedule_, deadline, op.timeout, abort_flag_);
        ex.finish(op.work->deviceCompletion().get(), deadline, op.timeout, abort_flag_);
      } catch (...) {
        ex.abandon();  // no copy may still touch the slots or the caller's memory
        throw;
      }
      return true;
    }
  }
  return false;
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

void Communicator::recordFailure(ErrorKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poison_message_.empty()) return;
    poison_kind_ = kind;
    poison_message_ = message;
    abort_flag_.store(true);  // stops a running collective
  }
  RCOLL_WARN("%s", message.c_str());
  FlightRecorder::process().dumpNow(message);
  FlightRecorder::process().failed();
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

namespace {
double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

// Runs one op on the calling thread (which owns the executor) and completes its Work.
void Communicator::executeOp(const Op& op) {
  std::string earlier;
  ErrorKind earlier_kind;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    earlier = poison_message_;
    earlier_kind = poison_kind_;
  }
  FlightRecorder& recorder = FlightRecorder::process();
  if (!earlier.empty()) {
    const std::string text =
        strFormat("rank %d: %s (op #%llu) was not run because the communicator failed earlier: %s", rank_,
                  describeOp(op.desc).c_str(), static_cast<unsigned long long>(op.desc.seq), earlier.c_str());
    recorder.finished(op.trace, false, "", "", text);
    op.work->markFailed(earlier_kind, text);
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  recorder.started(op.trace);
  op_algorithm_ = "";
  try {
    runOp(op);
    if (timeline_) recordTimeline(op, start, "done");
    recorder.finished(op.trace, true, op_algorithm_, opPathName(op_path_));
    OpStats::process().add(op.desc, size_, op_algorithm_, opPathName(op_path_), secondsSince(start), true);
    op.work->markDone();
  } catch (const std::exception& e) {
    if (timeline_) recordTimeline(op, start, "failed");
    const auto* rcoll_error = dynamic_cast<const RcollError*>(&e);
    ErrorKind kind = rcoll_error ? rcoll_error->kind() : ErrorKind::kGeneric;
    std::string message = rcoll_error ? std::string(e.what()) : opFailureMessage(rank_, op.desc, e.what());
    recorder.finished(op.trace, false, op_algorithm_, opPathName(op_path_), message);  // before recordFailure's dump
    OpStats::process().add(op.desc, size_, op_algorithm_, opPathName(op_path_), secondsSince(start), false);
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
  if (op_path_ == OpPath::kHostWindows || op_path_ == OpPath::kDeviceWindows) {
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

void Communicator::monitoredBarrier(std::chrono::milliseconds timeout, bool wait_all_ranks) {
  if (!p2p_) return;  // a world of one
  if (timeout.count() <= 0) timeout = timeout_;
  const int tag = P2PEngine::kMonitoredBarrierTag;
  const std::string within = timedOut(static_cast<double>(timeout.count()) / 1000.0);
  uint8_t* tokens = barrier_tokens_.data();
  if (rank_ != 0) {
    std::shared_ptr<Work> arrived = p2p_->send(&tokens[0], 1, DataType::kUInt8, 0, tag, timeout);
    std::shared_ptr<Work> released = p2p_->recv(&tokens[1], 1, DataType::kUInt8, 0, tag, timeout);
    try {
      arrived->wait(std::chrono::milliseconds(-1));
      released->wait(std::chrono::milliseconds(-1));
    } catch (const RcollError& e) {
      throwError(e.kind(),
                 strFormat("rank %d: monitored_barrier: rank 0 did not release the barrier (%s)", rank_, e.what()));
    }
    return;
  }
  // Every arrival is posted at once, so all of them share one deadline: the
  // first that passes it fails the others that are still waiting, and those
  // that arrived in time have completed.
  std::vector<std::shared_ptr<Work>> arrivals;
  for (int r = 1; r < size_; ++r) {
    arrivals.push_back(p2p_->recv(&tokens[r], 1, DataType::kUInt8, r, tag, timeout));
  }
  std::vector<int> missing;
  ErrorKind kind = ErrorKind::kTimeout;
  std::string first_error;
  for (int r = 1; r < size_; ++r) {
    try {
      arrivals[static_cast<size_t>(r - 1)]->wait(std::chrono::milliseconds(-1));
    } catch (const RcollError& e) {
      if (first_error.empty()) {
        kind = e.kind();
        first_error = e.what();
      }
      missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    std::string ranks;
    const size_t named = wait_all_ranks ? missing.size() : 1;
    for (size_t i = 0; i < named; ++i) ranks += (i == 0 ? "" : ", ") + std::to_string(missing[i]);
    throwError(kind, strFormat("rank 0: monitored_barrier: %s %s failed to pass monitoredBarrier (%s)%s",
                               named == 1 ? "rank" : "ranks", ranks.c_str(), within.c_str(),
                               wait_all_ranks || missing.size() == 1
                                   ? ""
                                   : "; wait_all_ranks=True names every rank that did not come"));
  }
  std::vector<std::shared_ptr<Work>> releases;
  for (int r = 1; r < size_; ++r) releases.push_back(p2p_->send(&tokens[0], 1, DataType::kUInt8, r, tag, timeout));
  for (const std::shared_ptr<Work>& w : releases) w->wait(std::chrono::milliseconds(-1));
}

std::shared_ptr<Work> Communicator::send(const void* data, size_t count, DataType dtype, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  if (!p2p_)
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: send: no other rank in a world of size 1", rank_));
  if (tag < 0) throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: send: tag %d < 0", rank_, tag));
  return p2p_->send(data, count, dtype, peer, tag, timeout.count() > 0 ? timeout : timeout_);
}

std::shared_ptr<Work> Communicator::recv(void* data, size_t count, DataType dtype, int peer, int tag,
                                         std::chrono::milliseconds timeout) {
  if (!p2p_)
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: recv: no other rank in a world of size 1", rank_));
  if (tag < 0) throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: recv: tag %d < 0", rank_, tag));
  return p2p_->recv(data, count, dtype, peer, tag, timeout.count() > 0 ? timeout : timeout_);
}

std::shared_ptr<Work> Communicator::recvFromAny(void* data, size_t count, DataType dtype, int tag,
                                                std::chrono::milliseconds timeout) {
  if (!p2p_) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: recv from any source: no other rank in a world of size 1", rank_));
  }
  if (tag < 0) throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: recv: tag %d < 0", rank_, tag));
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

std::vector<EdgeTraffic> Communicator::edgeTraffic() const {
  std::vector<EdgeTraffic> traffic;
  if (transport_) transport_->edgeTraffic(&traffic);
  if (p2p_) p2p_->transport().edgeTraffic(&traffic);
  return traffic;
}

void Communicator::setTraceGroup(const std::string& name, const std::string& desc,
                                 const std::vector<int>& global_ranks) {
  if (!global_ranks.empty() && global_ranks.size() != static_cast<size_t>(size_)) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: set_trace_group: %zu global ranks for a group of %d",
                                                      rank_, global_ranks.size(), size_));
  }
  FlightRecorder::Group group{name, desc, global_ranks};
  if (group.ranks.empty()) {
    for (int r = 0; r < size_; ++r) group.ranks.push_back(r);
  }
  FlightRecorder::process().setGroup(trace_group_, std::move(group));
}

}  // namespace rcoll
