// A communicator: `size` ranks that rendezvoused through a store and hold a
// connection to each other, plus the progress thread that runs their
// collectives.
//
// Every collective call validates its arguments on the caller's thread (a bad
// call raises at once and consumes no sequence number), then enqueues the op
// and returns a Work handle. The progress thread runs ops strictly in issue
// order, which is what keeps every rank's op #n the same op. The first failure
// poisons the communicator: the peers are told why, and every pending and later
// op fails with that cause instead of hanging.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms.h"
#include "config.h"
#include "device_runtime.h"
#include "dtype.h"
#include "error.h"
#include "flight_recorder.h"
#include "op_route.h"
#include "schedule.h"
#include "store.h"
#include "topology.h"
#include "wire.h"
#include "work.h"

namespace rcoll {

// The parts a communicator runs ops with; it reaches them only through their
// own headers, in communicator.cc.
class DeviceOverHosts;
class DeviceStagingExecutor;
class P2PEngine;
class ShmTransport;
class PipelineExecutor;
class ShmCollectives;
class Timeline;
class Transport;
struct EdgeTraffic;

struct CommunicatorOptions {
  std::string name = "default";          // store namespace; communicators on one store need distinct names
  std::chrono::milliseconds timeout{0};  // per-op default; 0 = RCOLL_TIMEOUT or 30 min
  std::string bind_hint;                 // address to bind data sockets to when RCOLL_SOCKET_IFNAME is unset
  Settings settings;                     // RCOLL_* values for this communicator, over the environment
};

// How an op starts: queued for the progress thread, or run on the calling
// thread when the caller will wait for it at once and nothing is queued ahead
// (the Work is then complete when the call returns).
enum class Launch { kQueued, kCallerWaits };

// Where the buffers of a device op live, and the caller's stream that wrote them.
struct DeviceOpArgs {
  int device = 0;
  void* stream = nullptr;  // the op waits for work queued here before it (null: legacy default stream)
};

class Communicator : public InlineRunner, public std::enable_shared_from_this<Communicator> {
 public:
  // Rendezvous and connection set-up; blocks until every rank has joined (or
  // RCOLL_CONNECT_TIMEOUT passes). Call without holding the GIL.
  Communicator(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // "shm", "tcp", "ib", or for a rank with edges of both kinds e.g. "shm+tcp"; "none" in a world of 1.
  const char* transportName() const;
  // The transport of each rank's edge, indexed by rank: "self" for this rank,
  // else "shm", "tcp" or "ib" (edge_plan.h).
  std::vector<std::string> transports() const;
  // How the last device-buffer op moved its data: "cuda-ipc" (device windows,
  // every rank on one host), "gdr" (GPUDirect RDMA: device memory to the NIC),
  // "staging" (pinned host memory and a transport), "cuda-ipc+staging" or
  // "cuda-ipc+gdr" (several hosts: device windows inside each, staging or
  // GPUDirect RDMA between them), or "none" before the first.
  const char* devicePath() const;
  std::string describeEdges() const;  // "per rank: 0 self, 1 shm, 2 tcp", for logs and the timeline
  // Thread-safe: [data, data + bytes) is being freed; drops cached RDMA registrations of it.
  void invalidateMemory(const void* data, size_t bytes);
  // Whether the transport keeps registrations (the caller should then report frees).
  bool cachesRegistrations() const;
  // Which host each rank is on (topology.h), the same on every rank.
  const Topology& topology() const { return topology_; }
  const std::string& algorithms() const { return algorithms_; }  // which algorithms ops of each size use, and why
  const Config& config() const { return config_; }
  std::chrono::milliseconds defaultTimeout() const { return timeout_; }

  // `timeout` 0 = the communicator's default. `send` may equal `recv`.
  std::shared_ptr<Work> allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                  std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // `send`: count elements; `recv`: size*count elements (in place when send == recv + rank*count).
  std::shared_ptr<Work> allgather(const void* send, void* recv, size_t count, DataType dtype,
                                  std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // `send`: size*count elements; `recv`: count elements, block `rank` of the reduction.
  std::shared_ptr<Work> reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                      std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // The root's `send` reaches every rank's `recv` (the root's too).
  std::shared_ptr<Work> broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                                  std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  std::shared_ptr<Work> barrier(std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // The reduction of every rank's `send` (count elements) lands in the root's
  // `recv` only (`recv` may equal `send`; it is not used, and may be null,
  // elsewhere).
  std::shared_ptr<Work> reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                               std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // `send`: count elements; the root's `recv`: size*count elements, block r from
  // rank r (in place when send == recv + root*count). `recv` may be null elsewhere.
  std::shared_ptr<Work> gather(const void* send, void* recv, size_t count, DataType dtype, int root,
                               std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // The root's `send`: size*count elements; rank r's `recv` gets block r (in
  // place on the root when recv == send + root*count). `send` may be null elsewhere.
  std::shared_ptr<Work> scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
                                std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued);
  // alltoallv: send_counts[p] elements from send + send_displs[p] go to rank p,
  // which receives them at recv + recv_displs[rank] (its recv_counts[rank] must
  // be the same number). Every vector has one entry per rank, in elements; the
  // block to self is copied locally. `send` and `recv` must not overlap; a
  // buffer may be null when its counts are all 0.
  std::shared_ptr<Work> allToAll(const void* send, void* recv, const std::vector<int64_t>& send_counts,
                                 const std::vector<int64_t>& send_displs, const std::vector<int64_t>& recv_counts,
                                 const std::vector<int64_t>& recv_displs, DataType dtype,
                                 std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued,
                                 const DeviceOpArgs* device = nullptr);

  // Any collective but alltoall (allToAll() takes its counts), by kind, on
  // host buffers or, with `device`, on device (GPU) buffers through the
  // installed device API (device_api.h): the calls above in one, for the front
  // ends. `op` is ignored where the kind does not reduce, `root` where it has
  // none. A device op starts after the work queued on `device->stream` before
  // this call (an event, no host wait), always through the progress thread;
  // its Work carries a completion event (Work::deviceCompletion). A
  // communicator serves one device.
  std::shared_ptr<Work> collective(OpKind kind, const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                   int root, std::chrono::milliseconds timeout = {}, Launch launch = Launch::kQueued,
                                   const DeviceOpArgs* device = nullptr);

  // Point-to-point: outside the collective order (see p2p_engine.h); messages
  // between two ranks match in issue order, and their tags must agree.
  // recvFromAny takes the first unclaimed message with its tag from any rank;
  // its Work's sourceRank() names the sender.
  std::shared_ptr<Work> send(const void* data, size_t count, DataType dtype, int peer, int tag,
                             std::chrono::milliseconds timeout = {});
  std::shared_ptr<Work> recv(void* data, size_t count, DataType dtype, int peer, int tag,
                             std::chrono::milliseconds timeout = {});
  std::shared_ptr<Work> recvFromAny(void* data, size_t count, DataType dtype, int tag,
                                    std::chrono::milliseconds timeout = {});

  // A barrier that names the ranks that did not reach it (torch's
  // monitored_barrier, as Gloo runs it): rank 0 waits up to `timeout` (0: the
  // communicator's) for a message from every other rank, then releases them.
  // When some rank does not come, rank 0 raises TimeoutError naming the
  // lowest such rank or, with `wait_all_ranks`, every one; the others then
  // fail with rank 0's report. Runs on the calling thread over the
  // point-to-point connections, outside the collective order; a failure ends
  // the communicator, as a timed-out op does. Call without holding the GIL.
  void monitoredBarrier(std::chrono::milliseconds timeout, bool wait_all_ranks);

  // Runs `work`'s op on this thread if it is next in the queue and nothing
  // runs (the untimed Work::wait() of a queued op calls it).
  void runInline(const Work& work) override;

  // Fails the running and every queued op at once, tells the peers, and makes
  // the communicator unusable. Safe from any thread; returns without waiting.
  void abort(const std::string& reason);
  // Takes no more ops, gives the queued and running ones `grace` (default
  // RCOLL_SHUTDOWN_TIMEOUT, 10 s) to finish, aborts what is left, and closes the
  // connections. Safe from any thread; later calls raise.
  void shutdown(std::chrono::milliseconds grace = {});
  // "" while healthy, else the first error, and its kind.
  std::string poisonMessage() const;
  ErrorKind poisonKind() const;
  // Thread-safe: the ranks whose connections died under this one (collective
  // or point-to-point; closed, reset, unreachable), sorted; not those that
  // reported their own failure. What a shrink leaves out without waiting for
  // them (python/rcoll/shrink.py).
  std::vector<int> lostPeers() const;
  // Thread-safe: what the large transfers over each edge reached so far
  // (edge_meter.h), collective and point-to-point, one entry per transport
  // and direction that metered the peer.
  std::vector<EdgeTraffic> edgeTraffic() const;
  // This communicator's keys in the rendezvous store ("rcoll/<name>/<epoch>/"),
  // new for every communicator, also on a store that outlived earlier jobs:
  // where a shrink's agreement keeps its own.
  const std::string& rendezvousPrefix() const { return rendezvous_prefix_; }

  // How the flight recorder names this communicator (torch's group name and
  // description; the members' global ranks, in rank order). Default: the
  // rendezvous prefix, "default_pg" for a process's first communicator
  // ("undefined" after), ranks 0..size-1.
  void setTraceGroup(const std::string& name, const std::string& desc, const std::vector<int>& global_ranks);

 private:
  struct Op {
    OpDesc desc;
    const char* send;
    char* recv;
    std::chrono::milliseconds timeout;
    std::shared_ptr<Work> work;
    // alltoall: send_counts, send_displs, recv_counts, recv_displs (size each),
    // copied: the caller's vectors are gone by the time the op runs.
    std::vector<uint64_t> counts;
    std::chrono::steady_clock::time_point enqueued;
    // Device ops only: the device (-1: host memory) and the caller's stream's event.
    int device = -1;
    std::shared_ptr<DeviceEvent> ready;
    uint64_t trace = FlightRecorder::kNoRecord;  // its flight recorder entry
  };

  std::shared_ptr<Work> enqueue(OpKind kind, DataType dtype, ReduceOp op, int root, size_t count, const void* send,
                                void* recv, std::chrono::milliseconds timeout, Launch launch,
                                std::vector<uint64_t> counts = {}, const DeviceOpArgs* device = nullptr);
  void progressLoop();
  void executeOp(const Op& op);
  void runOwned(Op op, std::unique_lock<std::mutex>& lock);
  void runOp(const Op& op);
  bool abortPending() const;  // with mutex_ held: an abort the peers were not told of yet
  // Whoever runs an op owns the executor (running_op_); this gives it back.
  struct ExecutorRelease {
    Communicator* self;
    ~ExecutorRelease();
  };
  // Runs `op` on `path`; false, having run nothing, when a windows path
  // declines at run time (op_route.h).
  bool runOnPath(OpPath path, const Op& op, const OpRoute& route, std::chrono::steady_clock::time_point deadline);
  // The device executor, created by the first device op that needs it.
  DeviceStagingExecutor& deviceExecutor(int device, const std::string& context);
  void chooseAlgorithms();  // sets route_facts_.hierarchical, once the topology is known
  // Builds what runs on the shared windows the mesh handed over (op_route.h's paths).
  void setUpWindows(ShmTransport* transport, const std::vector<int>& members);
  AlgorithmContext algorithmContext(size_t element_size) const;
  void recordTimeline(const Op& op, std::chrono::steady_clock::time_point start, const char* outcome);
  // Thread-safe: records the first failure (sticky), fails the p2p engine with
  // it and wakes the collective thread, which tells its peers (tellPeers).
  void recordFailure(ErrorKind kind, const std::string& message);
  void tellPeers();  // collective thread only: abortPeers with the recorded cause, once
  void stopThread();

  int rank_;
  int size_;
  std::string name_;
  Config config_;
  std::chrono::milliseconds timeout_;
  uint64_t comm_id_ = 0;           // tells this communicator's connections from any other's (mesh.h)
  std::string rendezvous_prefix_;  // its keys in the store, new for every communicator
  Topology topology_;
  // What chooses each op's path (op_route.h); the same on every rank.
  RouteFacts route_facts_;
  std::string algorithms_;              // the choice and why, for the log and `python -m rcoll info`
  const char* op_algorithm_ = "";       // what ran the op in flight, for the timeline and the flight recorder
  int trace_group_ = 0;                 // this communicator in the flight recorder
  OpPath op_path_ = OpPath::kPipeline;  // the path that ran it
  std::unique_ptr<Timeline> timeline_;  // RCOLL_TIMELINE; outlives the executor and p2p engine below
  std::unique_ptr<Transport> transport_;
  std::vector<std::string> peer_transports_;  // per rank, see transports(); empty in a world of 1
  std::unique_ptr<PipelineExecutor> executor_;
  // Every rank on this host: the window collectives (shm/shm_collectives.h); else null.
  std::unique_ptr<ShmCollectives> shm_coll_;
  // Several hosts, the hierarchical algorithms: device ops through each host's device windows; else null.
  std::unique_ptr<DeviceOverHosts> device_over_hosts_;
  // The path and executor of the last device op, for devicePath().
  std::atomic<OpPath> device_path_{OpPath::kPipeline};
  std::atomic<bool> device_path_gdr_{false};
  std::unique_ptr<P2PEngine> p2p_;  // own sockets and thread; none in a world of size 1
  // Device ops: created by the first one, on the progress thread; destroyed
  // before the transport it registered its staging memory with.
  std::unique_ptr<DeviceStagingExecutor> device_executor_;
  int device_ = -1;                      // the device this communicator serves (set by the first device op)
  std::atomic<bool> peers_told_{false};  // set by whoever owns the executor
  Schedule schedule_;                    // reused by every op on the progress thread
  // monitoredBarrier()'s one-byte messages, one per rank (sized at
  // construction, never again): alive as long as the engine that may still
  // write into them.
  std::vector<uint8_t> barrier_tokens_;
  std::vector<char> scratch_;  // reduce-scatter and reduce partial sums, grown on demand

  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::condition_variable idle_cv_;  // signalled when an op ends: shutdown() waits on it
  bool running_op_ = false;
  std::deque<Op> queue_;
  uint64_t next_seq_ = 1;
  bool stopping_ = false;  // shutdown(): no new ops, finish the queue
  bool closed_ = false;
  ErrorKind poison_kind_ = ErrorKind::kGeneric;
  std::string poison_message_;  // sticky first error
  std::atomic<bool> abort_flag_{false};
  std::thread thread_;
};

}  // namespace rcoll
