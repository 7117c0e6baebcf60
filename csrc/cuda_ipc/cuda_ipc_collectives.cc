// The shared-window collectives on device buffers (cuda_ipc_collectives.h
// explains the design): the steps of shm/window_steps.h with the data in
// device windows mapped through CUDA IPC.
#include "cuda_ipc/cuda_ipc_collectives.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "error.h"
#include "log.h"
#include "op_errors.h"

namespace rcoll {

CudaIpcCollectives::Config deviceWindowsConfig(const Config& settings, int device) {
  return {installedDeviceApi(), device, settings.cuda_ipc ? settings.cuda_ipc_slot_bytes : 0,
          settings.cuda_ipc_direct_bytes};
}

CudaIpcCollectives::~CudaIpcCollectives() = default;

CudaIpcCollectives::Windows::~Windows() { release(); }

void CudaIpcCollectives::Windows::release() {
  if (stream != nullptr) (void)api.stream_synchronize(stream);  // nothing may still read or write the blocks
  for (size_t r = 0; r < blocks.size(); ++r) {
    if (blocks[r] != nullptr && blocks[r] != own) (void)api.ipc_close(blocks[r]);
  }
  blocks.clear();
  if (own != nullptr) (void)api.device_free(own);
  own = nullptr;
  event.reset();
  if (stream != nullptr) (void)api.stream_destroy(stream);
  stream = nullptr;
}

std::string CudaIpcCollectives::state() const {
  if (!device_ || device_->state == Windows::State::kUnset) return "not set up (no device op yet)";
  if (device_->state == Windows::State::kOn) {
    return strFormat("on (device %d, 2 slots of %zu bytes per rank)", device_->device, device_->slot_bytes);
  }
  return "off: " + device_->why_off;
}

std::string CudaIpcCollectives::context(const OpDesc& op) const {
  return strFormat("rank %d: %s (op #%llu) on device %d", rank_, describeOp(op).c_str(),
                   static_cast<unsigned long long>(op.seq), device_->device);
}

char* CudaIpcCollectives::slot(int index) const {
  return device_->blocks[static_cast<size_t>(index)] + static_cast<size_t>(steps_.step() % 2) * device_->slot_bytes;
}

void CudaIpcCollectives::check(int rc, const OpDesc& op, const char* what) const {
  if (rc != 0) rcoll::deviceCheck(device_->api, rc, context(op) + ": " + what);
}

void CudaIpcCollectives::copy(const OpDesc& op, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  check(device_->api.copy_d2d_async(dst, src, bytes, device_->stream), op, "copying through the device windows");
}

void CudaIpcCollectives::reduceSlots(const OpDesc& op, ReduceOp how, size_t divisor, char* out, size_t offset,
                                     size_t count) {
  if (count == 0) return;
  const DeviceApi& api = device_->api;
  const int dtype = static_cast<int>(op.dtype), reduce_op = static_cast<int>(how);
  // Rank order on every rank that computes it, so that all get the same bits.
  check(api.reduce_async(out, slot(0) + offset, slot(1) + offset, count, dtype, reduce_op, device_->stream), op,
        "reducing the device windows");
  for (int r = 2; r < size_; ++r) {
    check(api.reduce_async(out, out, slot(r) + offset, count, dtype, reduce_op, device_->stream), op,
          "reducing the device windows");
  }
  if (divisor != 0) {
    check(api.scale_divide_async(out, count, dtype, divisor, device_->stream), op, "dividing (avg) on the device");
  }
}

void CudaIpcCollectives::wait(const RunContext& run) {
  const std::string where = context(run.op);
  device_->event->record(device_->stream, where);
  // The GPU always finishes what was queued; the checks only bound a hung one.
  while (!device_->event->done(where, "waiting for the device windows' copies")) {
    if (run.abort_flag.load(std::memory_order_relaxed)) {
      throwError(ErrorKind::kAborted, where + " was aborted");
    }
    if (std::chrono::steady_clock::now() >= run.deadline) {
      throwError(ErrorKind::kTimeout,
                 strFormat("%s %s waiting for its own device copies (is the GPU hung or busy "
                           "with a long kernel?)",
                           where.c_str(), timedOut(static_cast<double>(run.timeout.count()) / 1000.0).c_str()));
    }
    std::this_thread::yield();
  }
}

// --- set-up ------------------------------------------------------------------------

bool CudaIpcCollectives::setUp(const RunContext& run, const Config& config, const BetweenHosts* hosts) {
  if (!device_)
    device_ = std::make_unique<CudaIpcCollectives::Windows>(*config.api, config.device, config.slot_bytes,
                                                            config.direct_bytes);
  CudaIpcCollectives::Windows& dev = *device_;
  if (dev.state != Windows::State::kUnset) return dev.state == Windows::State::kOn;
  if (config.slot_bytes == 0) {  // RCOLL_CUDA_IPC=0, rank 0's value: every rank takes this branch
    dev.state = Windows::State::kOff;
    dev.why_off = "RCOLL_CUDA_IPC=0";
    return false;
  }
  const std::string where = context(run.op);
  // 1. Export this rank's block (or say that it cannot).
  std::string mine_failed;
  try {
    check(dev.api.set_device(dev.device), run.op, "selecting the device");
    check(dev.api.stream_create(dev.device, &dev.stream), run.op, "creating a stream");
    dev.event = std::make_unique<DeviceEvent>(dev.api, dev.device, where);
    check(dev.api.device_alloc(dev.device, 2 * dev.slot_bytes, reinterpret_cast<void**>(&dev.own)), run.op,
          "allocating the device window");
    check(dev.api.ipc_handle(dev.own, steps_.mine()->ipc_handle), run.op, "exporting the device window");
    std::memset(steps_.mine()->device_id, 0, sizeof(steps_.mine()->device_id));
    check(dev.api.device_id(dev.device, steps_.mine()->device_id, sizeof(steps_.mine()->device_id) - 1), run.op,
          "naming the GPU");
  } catch (const RcollError& e) {
    mine_failed = e.what();
  }
  // A failure from here on (a peer that died, mismatched or timed out) leaves
  // the windows off: the communicator reports it and is not used again.
  try {
    const bool on = agree(run, mine_failed);
    // Across hosts, every host must take the windows' path, or none.
    if (hosts != nullptr && !hosts->agree(on)) {
      if (on) turnOff("the device windows of another host are off");
      return false;
    }
    if (on) {
      RCOLL_INFO("rank %d: %s go through CUDA IPC windows (device %d, 2 x %zu bytes, %d ranks)", rank_,
                 hosts != nullptr ? "device allreduce, allgather and reduce_scatter inside this host"
                                  : "device ops of this communicator",
                 dev.device, dev.slot_bytes, size_);
    }
    return on;
  } catch (...) {
    dev.state = Windows::State::kOff;
    dev.why_off = "the set-up with the other ranks failed";
    dev.release();
    throw;
  }
}

bool CudaIpcCollectives::agree(const RunContext& run, const std::string& mine_failed) {
  CudaIpcCollectives::Windows& dev = *device_;
  steps_.mine()->device_slot_bytes = dev.slot_bytes;
  steps_.mine()->device = dev.device;
  steps_.publishValue(Counter::kDevicePublished, mine_failed.empty() ? shm::kDeviceOk : shm::kDeviceFailed);
  steps_.waitAll(run, Counter::kDevicePublished, shm::kDeviceOk);
  // 2. Map every peer's block (or say that this rank cannot).
  std::string why = mine_failed;
  dev.blocks.assign(static_cast<size_t>(size_), nullptr);
  dev.blocks[static_cast<size_t>(me_)] = dev.own;
  for (int p = 0; p < size_ && why.empty(); ++p) {
    if (p == me_) continue;
    const int peer = steps_.member(p);
    shm::WindowControl* theirs = steps_.control(p);
    if (theirs->device_published.value.load(std::memory_order_acquire) != shm::kDeviceOk) continue;  // they say why
    // The kernels here read the peer's slots: its GPU must be this one or
    // one with peer access (VMs with passthrough GPUs often have none).
    char their_id[RCOLL_DEVICE_ID_BYTES] = {};
    std::memcpy(their_id, theirs->device_id, sizeof(their_id) - 1);
    int access = 0;
    if (dev.api.peer_access(dev.device, their_id, &access) != 0) {
      const char* err = dev.api.last_error();
      why = strFormat("rank %d could not check its access to rank %d's GPU %s: %s", rank_, peer, their_id,
                      err != nullptr ? err : "device runtime error");
      break;
    }
    if (access == RCOLL_PEER_NOT_VISIBLE) {
      why = strFormat("rank %d's GPU %s is not visible to rank %d (CUDA_VISIBLE_DEVICES?)", peer, their_id, rank_);
      break;
    }
    if (access == RCOLL_PEER_NO_ACCESS) {
      why = strFormat("rank %d's GPU %s has no peer-to-peer access to rank %d's GPU %s", peer, their_id, rank_,
                      steps_.mine()->device_id);
      break;
    }
    const int rc =
        dev.api.ipc_open(dev.device, theirs->ipc_handle, reinterpret_cast<void**>(&dev.blocks[static_cast<size_t>(p)]));
    if (rc != 0) {
      const char* err = dev.api.last_error();
      why = strFormat("rank %d could not map rank %d's device window (device %lld): %s", rank_, peer,
                      static_cast<long long>(theirs->device), err != nullptr ? err : "device runtime error");
    }
  }
  steps_.publishValue(Counter::kDeviceOpened, why.empty() ? shm::kDeviceOk : shm::kDeviceFailed);
  steps_.waitAll(run, Counter::kDeviceOpened, shm::kDeviceOk);
  // 3. On only if every rank exported and mapped: the same answer everywhere.
  std::vector<int> failed;
  for (int p = 0; p < size_; ++p) {
    shm::WindowControl* c = steps_.control(p);
    if (c->device_published.value.load() != shm::kDeviceOk || c->device_opened.value.load() != shm::kDeviceOk) {
      failed.push_back(p);
    }
  }
  if (failed.empty()) {
    dev.state = Windows::State::kOn;
    return true;
  }
  std::string ranks;
  for (int p : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(steps_.member(p));
  turnOff(!why.empty() ? why : "rank(s) " + ranks + " could not export or map a device window");
  return false;
}

void CudaIpcCollectives::turnOff(const std::string& why) {
  device_->why_off = why;
  device_->state = Windows::State::kOff;
  device_->release();
  RCOLL_WARN(
      "rank %d: CUDA IPC is off for this communicator, device ops are staged through pinned host memory "
      "(slower): %s (set RCOLL_CUDA_IPC=0 to skip the attempt)",
      rank_, why.c_str());
}

// --- ops -----------------------------------------------------------------------------

bool CudaIpcCollectives::run(const OpDesc& op, const char* send, char* recv, const Config& config,
                             const DeviceEvent* ready, DeviceEvent* done, Deadline deadline,
                             std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag,
                             const BetweenHosts* hosts) {
  if (device_ && device_->state == Windows::State::kOff) return false;
  RunContext ctx{op, deadline, timeout, abort_flag, true};
  if (device_ && device_->device != config.device) {
    throwError(
        ErrorKind::kInvalidArgument,
        strFormat("rank %d: %s (op #%llu): buffers on device %d, but this communicator serves device %d", rank_,
                  describeOp(op).c_str(), static_cast<unsigned long long>(op.seq), config.device, device_->device));
  }
  if (!setUp(ctx, config, hosts)) return false;
  CudaIpcCollectives::Windows& dev = *device_;
  try {
    check(dev.api.set_device(dev.device), op, "selecting the device");
    // The caller's stream may still be writing the input.
    if (ready != nullptr) ready->streamWait(dev.stream, context(op));
    switch (op.kind) {
      case OpKind::kAllreduce:
        allreduce(ctx, send, recv, hosts);
        break;
      case OpKind::kAllgather:
        if (hosts != nullptr) {
          allgatherOverHosts(ctx, send, recv, *hosts);
        } else {
          allgather(ctx, send, recv);
        }
        break;
      case OpKind::kReduceScatter:
        if (hosts != nullptr) {
          reduceScatterOverHosts(ctx, send, recv, *hosts);
        } else {
          reduceScatter(ctx, send, recv);
        }
        break;
      case OpKind::kBroadcast:
        if (hosts != nullptr) {
          broadcastOverHosts(ctx, send, recv, *hosts);
        } else {
          broadcastFrom(ctx, steps_.indexOf(static_cast<int>(op.root)), send, recv);
        }
        break;
      default:
        break;
    }
    if (done != nullptr) done->record(dev.stream, context(op));  // complete already: every phase was waited for
  } catch (...) {
    (void)dev.api.stream_synchronize(dev.stream);  // no copy may still write the caller's memory
    throw;
  }
  return true;
}

void CudaIpcCollectives::allreduce(const RunContext& run, const char* send, char* recv, const BetweenHosts* hosts) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t P = static_cast<size_t>(size_);
  const bool avg = op.reduce_op == ReduceOp::kAvg;
  // Between hosts, the host's sum goes on to the others and avg divides once,
  // by the world size, when every host's share is in.
  const ReduceOp local_op = hosts != nullptr && avg ? ReduceOp::kSum : op.reduce_op;
  const size_t local_divisor = avg && hosts == nullptr ? P : 0;
  // Slices start on 256-byte boundaries: the kernels' 16-byte vector loads.
  const size_t align = std::max<size_t>(1, 256 / es);
  auto slice = [&](size_t n, size_t r, size_t* lo, size_t* len) { sliceOfStep(n, P, r, align, lo, len); };
  steps_.forEachStep(
      run, op.count, device_->slot_bytes / es,
      [&](size_t done, size_t n) {
        // The whole step's input goes into the slot first: `out` may alias `in`.
        copy(op, slot(me_), send + done * es, n * es);
        wait(run);
      },
      [&](size_t done, size_t n) {
        char* out = recv + done * es;
        if (hosts == nullptr && n * es * P <= device_->direct_bytes) {
          // Every rank reduces the whole step: one hand-off.
          reduceSlots(op, local_op, local_divisor, out, 0, n);
          wait(run);
          return;
        }
        // Rank r reduces slice r and leaves it in its slot; the others copy it out.
        size_t my_lo = 0, my_len = 0;
        slice(n, static_cast<size_t>(me_), &my_lo, &my_len);
        char* mine = out + my_lo * es;
        reduceSlots(op, local_op, local_divisor, mine, my_lo * es, my_len);
        if (hosts != nullptr && my_len > 0) {
          // The same slice on every host (the same n, the same cut): the ranks
          // of this local index sum it between the hosts.
          wait(run);
          hosts->allreduce(mine, my_len);
          if (avg) {
            check(device_->api.scale_divide_async(mine, my_len, static_cast<int>(op.dtype), hosts->worldSize(),
                                                  device_->stream),
                  op, "dividing (avg) on the device");
          }
        }
        copy(op, slot(me_) + my_lo * es, mine, my_len * es);
        wait(run);
        steps_.exchange(run, Counter::kReduced);
        for (int r = 0; r < size_; ++r) {
          if (r == me_) continue;
          size_t lo = 0, len = 0;
          slice(n, static_cast<size_t>(r), &lo, &len);
          copy(op, out + lo * es, slot(r) + lo * es, len * es);
        }
        wait(run);
      });
}

void CudaIpcCollectives::allgather(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank
  steps_.forEachStep(
      run, total, device_->slot_bytes / es,
      [&](size_t done, size_t n) {
        copy(op, slot(me_), send + done * es, n * es);
        wait(run);
      },
      [&](size_t done, size_t n) {
        // Every block from a slot, this rank's too: `send` may alias a block of `recv`.
        for (int r = 0; r < size_; ++r) copy(op, recv + (static_cast<size_t>(r) * total + done) * es, slot(r), n * es);
        wait(run);
      });
}

void CudaIpcCollectives::reduceBlocks(const RunContext& run, const char* send, size_t blocks,
                                      const std::vector<size_t>& mine, ReduceOp how, size_t divisor,
                                      const std::function<char*(size_t block)>& out) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per block
  steps_.forEachStep(
      run, total, std::max<size_t>(1, device_->slot_bytes / (es * blocks)),
      [&](size_t done, size_t n) {
        // Slot layout of a step: block j's n elements at j * n.
        for (size_t j = 0; j < blocks; ++j) copy(op, slot(me_) + j * n * es, send + (j * total + done) * es, n * es);
        wait(run);
      },
      [&](size_t done, size_t n) {
        for (size_t j : mine) reduceSlots(op, how, divisor, out(j) + done * es, j * n * es, n);
        wait(run);
      });
}

void CudaIpcCollectives::reduceScatter(const RunContext& run, const char* send, char* recv) {
  const size_t P = static_cast<size_t>(size_);
  const bool avg = run.op.reduce_op == ReduceOp::kAvg;
  reduceBlocks(run, send, P, {static_cast<size_t>(me_)}, run.op.reduce_op, avg ? P : 0, [&](size_t) { return recv; });
}

void CudaIpcCollectives::allgatherOverHosts(const RunContext& run, const char* send, char* recv,
                                            const BetweenHosts& hosts) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank
  const std::vector<std::vector<int>>& on_host = hosts.topology->ranks_on_host;
  const size_t H = on_host.size();
  auto block = [&](size_t h, int index) { return recv + static_cast<size_t>(on_host[h][index]) * total * es; };
  // 1. Between the hosts: the blocks of this local index's ranks.
  copy(op, recv + static_cast<size_t>(rank_) * total * es, send, total * es);
  wait(run);
  if (total > 0) hosts.allgather(recv, total);
  // 2. In the host: each rank's H blocks go through its window (slot layout
  // of a step: host h's block at h * n).
  steps_.forEachStep(
      run, total, std::max<size_t>(1, device_->slot_bytes / (es * H)),
      [&](size_t done, size_t n) {
        for (size_t h = 0; h < H; ++h) copy(op, slot(me_) + h * n * es, block(h, me_) + done * es, n * es);
        wait(run);
      },
      [&](size_t done, size_t n) {
        for (int p = 0; p < size_; ++p) {
          if (p == me_) continue;
          for (size_t h = 0; h < H; ++h) copy(op, block(h, p) + done * es, slot(p) + h * n * es, n * es);
        }
        wait(run);
      });
}

void CudaIpcCollectives::reduceScatterOverHosts(const RunContext& run, const char* send, char* recv,
                                                const BetweenHosts& hosts) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank: send holds world_size * total elements
  const size_t W = hosts.worldSize();
  const Topology& t = *hosts.topology;
  const bool avg = op.reduce_op == ReduceOp::kAvg;
  const ReduceOp local_op = avg ? ReduceOp::kSum : op.reduce_op;
  // One block per host, not per rank: with k ranks on each host the scratch
  // is 1/k of the input.
  char* sums = hosts.scratch(std::max<size_t>(1, static_cast<size_t>(t.hosts()) * total * es));
  // 1. In the host: this rank sums the blocks of its local index's ranks,
  // each host's sum at its host's place.
  std::vector<size_t> mine;
  for (const std::vector<int>& ranks : t.ranks_on_host)
    mine.push_back(static_cast<size_t>(ranks[static_cast<size_t>(me_)]));
  reduceBlocks(run, send, W, mine, local_op, 0,
               [&](size_t rank) { return sums + static_cast<size_t>(t.host_of[rank]) * total * es; });
  // 2. Between the hosts: those sums reduce-scattered; avg divides once.
  if (total == 0) return;
  hosts.reduce_scatter(sums, recv, total);
  if (avg) {
    check(device_->api.scale_divide_async(recv, total, static_cast<int>(op.dtype), W, device_->stream), op,
          "dividing (avg) on the device");
    wait(run);
  }
}

void CudaIpcCollectives::broadcastOverHosts(const RunContext& run, const char* send, char* recv,
                                            const BetweenHosts& hosts) {
  const OpDesc& op = run.op;
  const size_t bytes = op.count * elementSize(op.dtype);
  const int root = static_cast<int>(op.root);
  const int root_index = hosts.topology->local_rank[static_cast<size_t>(root)];
  // 1. Between the hosts: the root's local index's ranks, down a chain. The
  // others wait for its window in step 2.
  if (me_ == root_index) {
    if (rank_ == root && send != recv && bytes > 0) copy(op, recv, send, bytes);
    // The chain reads `recv` (the root) or writes it (the others) off the
    // windows' stream, which alone waited for the caller's: what the caller
    // queued on `recv` must be done first, even with nothing to copy.
    wait(run);
    if (op.count > 0) hosts.broadcast(recv, op.count, root);
  }
  // 2. In the host: from that rank's window to the others.
  broadcastFrom(run, root_index, recv, recv);
}

void CudaIpcCollectives::broadcastFrom(const RunContext& run, int source, const char* from, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  steps_.forEachStep(
      run, op.count, device_->slot_bytes / es,
      [&](size_t done, size_t n) {
        if (me_ != source) return;
        copy(op, slot(me_), from + done * es, n * es);
        wait(run);
      },
      [&](size_t done, size_t n) {
        if (me_ == source && from == recv) return;         // in place there already
        copy(op, recv + done * es, slot(source), n * es);  // the root's own copy (out of place) from its slot too
        wait(run);
      });
}

}  // namespace rcoll
