#include "rdma/verbs_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "log.h"
#include "rdma/ibv_api.h"
#include "rdma/mr_cache.h"
#include "rdma/verbs_factory.h"
#include "rdma/verbs_transport_internal.h"
#include "socket_util.h"

namespace rcoll {

using verbs::kCtrlBytes;
using verbs::mtuName;
using verbs::sideChannelOptions;

namespace {

constexpr int kWantRecvSlots = 128;                    // posted receives per peer (credits, data immediates)
constexpr int kWantSendSlots = 64;                     // control messages in flight per peer
constexpr int kWantSendQueue = 256;                    // work requests in flight per peer
constexpr auto kSpin = std::chrono::microseconds(30);  // poll the CQ this long before sleeping

}  // namespace

VerbsTransport::VerbsTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host,
                               const IbPortChoice& port)
    : api_([] {
        std::string why;
        const IbvApi* api = ibvApi(&why);
        if (api == nullptr) throwError(ErrorKind::kConfig, "RDMA transport unavailable: " + why);
        return std::cref(*api);
      }()),
      info_(info),
      config_(config),
      port_(port),
      listener_(std::make_unique<PeerListener>(info, bind_host, sideChannelOptions(config))),
      listen_address_(listener_->address()),
      connections_(static_cast<size_t>(info.size)),
      meter_(info.size) {
  auto fail = [&](const std::string& what) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: RDMA device %s: %s failed: %s", info_.rank, port_.device.c_str(),
                                             what.c_str(), std::strerror(errno)));
  };
  int count = 0;
  ibv_device** list = api_.get_device_list(&count);
  if (list == nullptr) fail("ibv_get_device_list");
  for (int i = 0; i < count && context_ == nullptr; ++i) {
    if (port_.device == api_.get_device_name(list[i])) context_ = api_.open_device(list[i]);
  }
  api_.free_device_list(list);
  if (context_ == nullptr) fail("ibv_open_device");
  ibv_device_attr dev{};
  if (api_.query_device(context_, &dev) != 0) fail("ibv_query_device");
  ibv_port_attr pattr{};
  if (api_.query_port(context_, static_cast<uint8_t>(port_.port), &pattr) != 0) fail("ibv_query_port");
  active_mtu_ = pattr.active_mtu;
  lid_ = pattr.lid;
  max_msg_bytes_ = std::min<uint64_t>(pattr.max_msg_sz != 0 ? pattr.max_msg_sz : (1ull << 31), 1ull << 30);
  max_mr_bytes_ = dev.max_mr_size;
  if (port_.gid_index >= 0) {
    ibv_gid gid{};
    if (api_.query_gid(context_, static_cast<uint8_t>(port_.port), port_.gid_index, &gid) != 0) fail("ibv_query_gid");
    std::memcpy(gid_, gid.raw, sizeof(gid_));
  }
  // Respect what the device allows: PVRDMA and rxe have far smaller queues than mlx5.
  sq_depth_ = std::max(4, std::min(kWantSendQueue, dev.max_qp_wr));
  recv_slots_ = std::max(4, std::min(kWantRecvSlots, dev.max_qp_wr));
  send_slots_ = std::max(2, std::min(kWantSendSlots, sq_depth_ / 2));
  const int peers = info_.size - 1;
  pd_ = api_.alloc_pd(context_);
  if (pd_ == nullptr) fail("ibv_alloc_pd");
  channel_ = api_.create_comp_channel(context_);
  if (channel_ == nullptr) fail("ibv_create_comp_channel");
  setNonBlocking(channel_->fd, true);
  setNonBlocking(context_->async_fd, true);  // read when poll() says so, and never waited on
  int cqe = std::min(dev.max_cqe, std::max(64, peers * (recv_slots_ + sq_depth_) + 16));
  cq_ = api_.create_cq(context_, cqe, nullptr, channel_, 0);
  if (cq_ == nullptr) fail(strFormat("ibv_create_cq(%d entries)", cqe));
  const size_t ctrl_bytes =
      static_cast<size_t>(std::max(peers, 1)) * static_cast<size_t>(recv_slots_ + send_slots_) * kCtrlBytes;
  ctrl_memory_ = static_cast<char*>(std::aligned_alloc(4096, (ctrl_bytes + 4095) / 4096 * 4096));
  if (ctrl_memory_ == nullptr) throwError(ErrorKind::kGeneric, "out of memory for RDMA control slots");
  std::memset(ctrl_memory_, 0, ctrl_bytes);
  ctrl_mr_ = api_.reg_mr(pd_, ctrl_memory_, ctrl_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (ctrl_mr_ == nullptr) {
    fail(
        strFormat("registering %zu bytes of control slots (if 'Cannot allocate memory': raise the "
                  "locked-memory limit, ulimit -l)",
                  ctrl_bytes));
  }
  mr_cache_ = makeMrCache();
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RCOLL_INFO("rank %d: ib transport on %s:%d (GID %s, MTU %s, max_qp_wr %d, max_msg %llu), handshakes at %s",
             info_.rank, port_.device.c_str(), port_.port, port_.gid_reason.c_str(), mtuName(active_mtu_),
             dev.max_qp_wr, static_cast<unsigned long long>(max_msg_bytes_), listen_address_.c_str());
}

VerbsTransport::~VerbsTransport() {
  for (auto& h : handshakes_) connections_[static_cast<size_t>(h->conn->peer)] = std::move(h->conn);
  for (auto& c : connections_) {
    if (!c) continue;
    if (c->qp != nullptr) api_.destroy_qp(c->qp);
    if (c->fd >= 0) ::close(c->fd);
  }
  mr_cache_.reset();  // deregisters while the protection domain is alive
  if (ctrl_mr_ != nullptr) api_.dereg_mr(ctrl_mr_);
  if (cq_ != nullptr) {
    if (unacked_cq_events_ > 0) api_.ack_cq_events(cq_, unacked_cq_events_);
    api_.destroy_cq(cq_);
  }
  if (channel_ != nullptr) api_.destroy_comp_channel(channel_);
  if (pd_ != nullptr) api_.dealloc_pd(pd_);
  if (context_ != nullptr) api_.close_device(context_);
  std::free(ctrl_memory_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool VerbsTransport::connected(int peer) const {
  return peer >= 0 && peer < info_.size && connections_[static_cast<size_t>(peer)] != nullptr;
}

// --- requests --------------------------------------------------------------

void VerbsTransport::maybeRecycle(VerbsRequest* r) { requests_.settle(r); }

void VerbsTransport::finish(VerbsRequest* r, Request::State state, const TransportFailure* why) {
  if (requests_.finish(r, state, why)) progressed_ = true;
}

void VerbsTransport::release(Request* request) { requests_.release(request); }

TransportFailure VerbsTransport::failure(Request* request) const { return requests_.failure(request); }

// --- progress ---------------------------------------------------------------

void VerbsTransport::progress(std::chrono::milliseconds timeout) {
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  progressed_ = false;
  for (;;) {
    serviceOnDemand();
    pollCompletions();
    checkDrains();
    if (progressed_) return;
    // Completions usually follow within microseconds on real hardware: a short
    // spin saves the sleep and wake-up. Emulated devices (rxe) gain nothing.
    const auto spin_until = std::min(deadline, std::chrono::steady_clock::now() + kSpin);
    while (std::chrono::steady_clock::now() < spin_until) {
      if (pollCompletions() > 0) break;
    }
    if (progressed_) return;
    int wait_ms = millisecondsUntil(deadline);
    if (wait_ms <= 0) return;
    wait_ms = static_cast<int>(std::min<long long>(wait_ms, maxSleep().count()));  // a drain's deadline
    poll_fds_.clear();
    poll_fds_.push_back({wake_fd_, POLLIN, 0});
    if (!prepareSleep(&poll_fds_)) {
      finishSleep(nullptr, 0);
      if (progressed_) return;
      continue;
    }
    int rc = ::poll(poll_fds_.data(), poll_fds_.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc <= 0) continue;
    finishSleep(poll_fds_.data() + 1, poll_fds_.size() - 1);
    if (poll_fds_[0].revents & POLLIN) {
      drainEventfd(wake_fd_);
      return;  // interrupted: the caller checks why
    }
    if (progressed_) return;
  }
}

Activity VerbsTransport::progressNow() {
  progressed_ = false;
  serviceOnDemand();
  const int completions = pollCompletions();
  checkDrains();
  return progressed_ ? Activity::kFinished : completions > 0 ? Activity::kMoved : Activity::kIdle;
}

// Arms the completion channel, then looks once more: a completion that came in
// between would otherwise raise no event. progressed_ spans this call and
// finishSleep(), which reports it.
bool VerbsTransport::prepareSleep(std::vector<pollfd>* fds) {
  progressed_ = false;
  poll_peers_.clear();
  if (reqNotifyCq(cq_, 0) != 0) throwError(ErrorKind::kGeneric, "ibv_req_notify_cq failed");
  if (pollCompletions() > 0) return false;
  fds->push_back({channel_->fd, POLLIN, 0});
  fds->push_back({async_broken_ ? -1 : context_->async_fd, POLLIN, 0});  // poll() skips -1
  for (auto& c : connections_) {
    if (!c || c->failed || c->socket_broken) continue;
    fds->push_back({c->fd, POLLIN, 0});
    poll_peers_.push_back(c.get());
  }
  const size_t before = fds->size();
  if (on_demand_.started()) fds->push_back({on_demand_.readyFd(), POLLIN, 0});
  for (auto& h : handshakes_) {
    fds->push_back({h->conn->fd, static_cast<short>(POLLIN | (h->wants_write() ? POLLOUT : 0)), 0});
  }
  poll_on_demand_ = fds->size() - before;
  return true;
}

// `fds`: the completion channel, the device's async events, then poll_peers_'
// side channels (none when nobody slept).
Activity VerbsTransport::finishSleep(const pollfd* fds, size_t count) {
  constexpr size_t kFirstPeer = 2;
  if (count > 0 && (fds[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (api_.get_cq_event(channel_, &cq, &context) == 0 && ++unacked_cq_events_ >= 64) {
      api_.ack_cq_events(cq_, unacked_cq_events_);  // acking is a lock round trip: batch it
      unacked_cq_events_ = 0;
    }
  }
  if (count > 1 && fds[1].revents != 0) serviceAsyncEvents();
  for (size_t i = 0; i < poll_peers_.size() && i + kFirstPeer < count; ++i) {
    if (fds[i + kFirstPeer].revents != 0) serviceSideChannel(*poll_peers_[i]);
  }
  for (size_t i = kFirstPeer + poll_peers_.size(); i < count && i < kFirstPeer + poll_peers_.size() + poll_on_demand_;
       ++i) {
    if (fds[i].revents != 0) {
      serviceOnDemand();
      break;
    }
  }
  return progressed_ ? Activity::kFinished : Activity::kIdle;
}

void VerbsTransport::interrupt() { signalEventfd(wake_fd_); }

std::unique_ptr<Transport> makeVerbsTransport(const ConnectInfo& info, const Config& config,
                                              const std::string& bind_host, const IbPortChoice& port) {
  return std::make_unique<VerbsTransport>(info, config, bind_host, port);
}

void VerbsTransport::edgeTraffic(std::vector<EdgeTraffic>* out) const { meter_.appendTo(out, name(), true); }

}  // namespace rcoll
