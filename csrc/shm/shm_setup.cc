#include "shm/shm_setup.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "error.h"
#include "log.h"
#include "peer_listener.h"
#include "shm/shm_ring.h"
#include "shm/shm_window.h"

namespace rcoll {
namespace shm {

namespace {

constexpr uint32_t kOfferMagic = 0x4f534352;  // "RCSO"
constexpr uint32_t kReplyMagic = 0x52534352;  // "RCSR"
constexpr uint32_t kSetupVersion = 2;         // 2: shared windows
constexpr size_t kMaxReplyText = 1024;
// A connection on the Unix socket must present the secret this fast: a
// stranger that connects and stays silent must not hold the set-up up.
constexpr auto kUnixHelloTimeout = std::chrono::seconds(2);

#pragma pack(push, 1)
struct Offer {
  uint32_t magic;
  uint32_t version;
  uint32_t creator_rank;
  uint32_t name_bytes;  // of socket_name
  uint64_t ring_bytes;
  uint64_t segment_bytes;
  uint64_t window_bytes;  // each side's shared window (0: none); both sides must agree
  char boot_id[40];       // /proc/sys/kernel/random/boot_id, NUL padded ("" if unreadable)
  uint8_t secret[16];     // what the peer presents on the Unix socket
  char socket_name[64];   // abstract Unix socket name, without the leading NUL
};
struct Reply {
  uint32_t magic;
  uint32_t refused;  // 0: mapped and ready; 1: refused, text_bytes of reason follow
  uint32_t text_bytes;
  uint32_t kind;  // ErrorKind of a refusal
};
#pragma pack(pop)

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

std::string bootId() {
  char buf[64] = {};
  int fd = ::open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  std::string id(buf, n > 0 ? static_cast<size_t>(n) : 0);
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  return id;
}

void randomBytes(uint8_t* out, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throwError(ErrorKind::kGeneric, "getrandom(): " + errnoText(errno));
    got += static_cast<size_t>(r);
  }
}

bool sameSecret(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < 16; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

sockaddr_un abstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  addr.sun_path[0] = '\0';
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

bool waitReadable(int fd, short events, Deadline deadline, std::string* why) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, millisecondsUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      *why = "timed out";
      return false;
    }
    if (errno != EINTR) {
      *why = errnoText(errno);
      return false;
    }
  }
}

// Sends `len` bytes with `nfds` descriptors attached to the first byte.
bool sendWithFds(int sock, const void* data, size_t len, const int* fds, size_t nfds, Deadline deadline,
                 std::string* why) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
  std::memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      // The descriptors went with the first byte; the rest (never, in practice) follows plainly.
      return static_cast<size_t>(n) == len ||
             sendAll(sock, static_cast<const char*>(data) + n, len - static_cast<size_t>(n), deadline, why);
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitReadable(sock, POLLOUT, deadline, why)) return false;
      continue;
    }
    *why = n == 0 ? "sent nothing" : errnoText(errno);
    return false;
  }
}

// Receives exactly `len` bytes and the descriptors that came with them (at most
// `max_fds`; any beyond are closed). On failure every received descriptor is closed.
bool recvWithFds(int sock, void* data, size_t len, int* fds, size_t max_fds, size_t* nfds, Deadline deadline,
                 std::string* why) {
  *nfds = 0;
  size_t got = 0;
  bool ok = true;
  while (ok && got < len) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{static_cast<char*>(data) + got, len - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n > 0) {
      for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
          if (*nfds < max_fds) {
            fds[(*nfds)++] = fd;
          } else {
            ::close(fd);
          }
        }
      }
      if (msg.msg_flags & MSG_CTRUNC) {
        *why = "file descriptors were lost in transit (MSG_CTRUNC: out of descriptors?)";
        ok = false;
      }
      got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ok = waitReadable(sock, POLLIN, deadline, why);
      continue;
    }
    *why = n == 0 ? "the peer closed the connection" : errnoText(errno);
    ok = false;
  }
  if (!ok) {
    for (size_t i = 0; i < *nfds; ++i) ::close(fds[i]);
    *nfds = 0;
  }
  return ok;
}

std::unique_ptr<Segment> mapSegment(int fd, size_t bytes, size_t ring_bytes, std::string* why) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *why = "mmap(" + std::to_string(bytes) + " bytes): " + errnoText(errno);
    return nullptr;
  }
  return std::make_unique<Segment>(static_cast<char*>(base), bytes, ring_bytes);
}

// Maps a peer's window memfd after checking that it is sealed at the agreed size.
std::unique_ptr<Segment> mapPeerWindow(int fd, size_t window_bytes, int peer, std::string* why) {
  struct stat st {};
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != window_bytes || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    *why = "the received window is not a sealed memfd of the agreed size";
    return nullptr;
  }
  auto mapping = mapSegment(fd, window_bytes, 0, why);
  if (!mapping) return nullptr;
  const WindowControl* control = windowControl(mapping->base());
  if (control->magic != kWindowMagic || control->version != kWindowVersion || static_cast<int>(control->rank) != peer ||
      windowBytes(control->slot_bytes) != window_bytes) {
    *why = "the received window's control block does not match";
    return nullptr;
  }
  return mapping;
}

// Reads side 1's answer. Throws on a refusal (with its reason) or a lost socket.
void readReply(const ConnectInfo& info, int peer, int sock, Deadline deadline) {
  Reply reply{};
  std::string why;
  if (!recvAll(sock, &reply, sizeof(reply), deadline, &why)) {
    throwError(why == "timed out" ? ErrorKind::kTimeout : ErrorKind::kPeer,
               strFormat("rank %d: rank %d did not finish setting up shared memory: %s", info.rank, peer, why.c_str()));
  }
  if (reply.magic != kReplyMagic) {
    throwError(ErrorKind::kPeer,
               strFormat("rank %d: rank %d answered the shared-memory offer with garbage", info.rank, peer));
  }
  if (reply.refused == 0) return;
  std::string text(std::min<size_t>(reply.text_bytes, kMaxReplyText), '\0');
  if (!recvAll(sock, &text[0], text.size(), deadline, &why)) text = "(no reason given)";
  const ErrorKind kind =
      reply.kind == static_cast<uint32_t>(ErrorKind::kConfig) ? ErrorKind::kConfig : ErrorKind::kPeer;
  throwError(kind, strFormat("rank %d: rank %d cannot share memory with this rank: %s", info.rank, peer,
                             validUtf8(text).c_str()));
}

}  // namespace

Segment::~Segment() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

std::string hostKey() {
  const std::string boot = bootId();
  struct stat ns {};
  if (boot.empty() || ::stat("/proc/self/ns/net", &ns) != 0) return "";
  return strFormat("%s/%llu:%llu", boot.c_str(), static_cast<unsigned long long>(ns.st_dev),
                   static_cast<unsigned long long>(ns.st_ino));
}

OwnWindow createWindow(const ConnectInfo& info, size_t slot_bytes) {
  auto fail = [&](const std::string& what) {
    throwError(ErrorKind::kGeneric, strFormat("rank %d: creating the shared window: %s", info.rank, what.c_str()));
  };
  const size_t bytes = windowBytes(slot_bytes);
  UniqueFd memfd(::memfd_create("rcoll-window", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (memfd.get() < 0) fail("memfd_create(): " + errnoText(errno));
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
    fail(strFormat("sizing it to %zu bytes: %s", bytes, errnoText(errno).c_str()));
  }
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail("sealing it: " + errnoText(errno));
  }
  std::string why;
  OwnWindow window;
  window.mapping = mapSegment(memfd.get(), bytes, 0, &why);
  if (!window.mapping) fail(why);
  auto* control = new (window.mapping->base()) WindowControl();
  control->magic = kWindowMagic;
  control->version = kWindowVersion;
  control->rank = static_cast<uint32_t>(info.rank);
  control->slot_bytes = slot_bytes;
  control->arrived.value.store(0, std::memory_order_relaxed);
  control->reduced.value.store(0, std::memory_order_relaxed);
  control->finished.value.store(0, std::memory_order_relaxed);
  control->sleeping.bits.store(0, std::memory_order_relaxed);
  control->current_op.value.store(0, std::memory_order_relaxed);
  window.fd = memfd.release();
  return window;
}

PairLink createPair(const ConnectInfo& info, int peer, int sock, size_t ring_bytes, int my_doorbell, int my_window,
                    size_t window_bytes, Deadline deadline) {
  auto fail = [&](ErrorKind kind, const std::string& what) {
    throwError(kind, strFormat("rank %d: setting up shared memory with rank %d: %s", info.rank, peer, what.c_str()));
  };
  const size_t bytes = segmentBytes(ring_bytes);

  // 1. The segment: anonymous, sealed at its size, mapped, control block written.
  UniqueFd memfd(::memfd_create("rcoll-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (memfd.get() < 0) fail(ErrorKind::kGeneric, "memfd_create(): " + errnoText(errno));
  if (::ftruncate(memfd.get(), static_cast<off_t>(bytes)) != 0) {
    fail(ErrorKind::kGeneric, strFormat("sizing the segment to %zu bytes: %s", bytes, errnoText(errno).c_str()));
  }
  if (::fcntl(memfd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    fail(ErrorKind::kGeneric, "sealing the segment: " + errnoText(errno));
  }
  std::string why;
  PairLink link;
  link.side = 0;
  link.segment = mapSegment(memfd.get(), bytes, ring_bytes, &why);
  if (!link.segment) fail(ErrorKind::kGeneric, why);
  auto* control = new (link.segment->base()) SegmentControl();
  control->magic = kSegmentMagic;
  control->version = kSegmentVersion;
  control->creator_rank = static_cast<uint32_t>(info.rank);
  control->ring_bytes = ring_bytes;
  control->segment_bytes = bytes;
  for (int i = 0; i < 2; ++i) {
    control->head[i].value.store(0, std::memory_order_relaxed);
    control->tail[i].value.store(0, std::memory_order_relaxed);
    control->sleeping[i].bits.store(0, std::memory_order_relaxed);
  }

  // 2. A Unix socket with a random abstract name, and the offer on the TCP socket.
  Offer offer{};
  offer.magic = kOfferMagic;
  offer.version = kSetupVersion;
  offer.creator_rank = static_cast<uint32_t>(info.rank);
  offer.ring_bytes = ring_bytes;
  offer.segment_bytes = bytes;
  offer.window_bytes = window_bytes;
  const std::string boot = bootId();
  std::memcpy(offer.boot_id, boot.data(), std::min(boot.size(), sizeof(offer.boot_id) - 1));
  randomBytes(offer.secret, sizeof(offer.secret));
  uint8_t name_bits[16];
  randomBytes(name_bits, sizeof(name_bits));
  std::string name = "rcoll-shm-";
  for (uint8_t b : name_bits) name += strFormat("%02x", b);
  std::memcpy(offer.socket_name, name.data(), name.size());
  offer.name_bytes = static_cast<uint32_t>(name.size());

  UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  socklen_t addr_len = 0;
  sockaddr_un addr = abstractAddress(name, &addr_len);
  if (listener.get() < 0 || ::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
      ::listen(listener.get(), 16) != 0) {
    fail(ErrorKind::kGeneric, "listening on a Unix socket: " + errnoText(errno));
  }
  if (!sendAll(sock, &offer, sizeof(offer), deadline, &why)) {
    fail(ErrorKind::kPeer, "sending the offer: " + why);
  }

  // 3. The peer on the Unix socket (with the secret), or its refusal on the TCP socket.
  const size_t fds_in = window_bytes > 0 ? 2 : 1;  // side 1 sends its doorbell (and window)
  UniqueFd peer_doorbell;
  UniqueFd peer_window;
  while (peer_doorbell.get() < 0) {
    pollfd fds[2] = {{listener.get(), POLLIN, 0}, {sock, POLLIN, 0}};
    int rc = ::poll(fds, 2, millisecondsUntil(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) fail(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc == 0) fail(ErrorKind::kTimeout, "the peer did not come to the Unix socket in time");
    if (fds[1].revents != 0) {
      readReply(info, peer, sock, deadline);  // throws on a refusal or a lost peer
      fail(ErrorKind::kPeer, "the peer confirmed before it received the segment (protocol error)");
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (conn.get() < 0) continue;
    uint8_t secret[16];
    int got_fds[3] = {-1, -1, -1};
    size_t n_fds = 0;
    const Deadline hello_deadline = std::min(deadline, std::chrono::steady_clock::now() + kUnixHelloTimeout);
    if (!recvWithFds(conn.get(), secret, sizeof(secret), got_fds, 3, &n_fds, hello_deadline, &why)) {
      RCOLL_WARN("rank %d: dropped a connection to the shared-memory socket for rank %d: %s", info.rank, peer,
                 why.c_str());
      continue;
    }
    if (!sameSecret(secret, offer.secret) || n_fds != fds_in) {
      for (size_t i = 0; i < n_fds; ++i) ::close(got_fds[i]);
      RCOLL_WARN(
          "rank %d: dropped a connection to the shared-memory socket for rank %d that did not present "
          "the job's secret",
          info.rank, peer);
      continue;
    }
    UniqueFd doorbell(got_fds[0]);
    UniqueFd window(n_fds > 1 ? got_fds[1] : -1);
    const int handover[3] = {memfd.get(), my_doorbell, my_window};
    const char ack = 1;
    if (!sendWithFds(conn.get(), &ack, 1, handover, window_bytes > 0 ? 3 : 2, deadline, &why)) {
      fail(ErrorKind::kPeer, "handing over the segment: " + why);
    }
    peer_doorbell.reset(doorbell.release());
    peer_window.reset(window.release());
  }
  listener.reset();
  memfd.reset();  // the peer holds its own reference now; the mapping keeps ours

  // 4. The peer mapped it (or says why not).
  readReply(info, peer, sock, deadline);
  if (window_bytes > 0) {
    link.peer_window = mapPeerWindow(peer_window.get(), window_bytes, peer, &why);
    if (!link.peer_window) fail(ErrorKind::kPeer, why);
  }
  link.peer_doorbell = peer_doorbell.release();
  return link;
}

PairLink joinPair(const ConnectInfo& info, int peer, int sock, int my_doorbell, int my_window, size_t window_bytes,
                  Deadline deadline) {
  std::string why;
  Offer offer{};
  if (!recvAll(sock, &offer, sizeof(offer), deadline, &why)) {
    throwError(why == "timed out" ? ErrorKind::kTimeout : ErrorKind::kPeer,
               strFormat("rank %d: rank %d did not offer shared memory: %s", info.rank, peer, why.c_str()));
  }
  // Every failure from here on is told to the creator, which raises it too.
  auto refuse = [&](ErrorKind kind, const std::string& what) {
    const std::string text = truncateUtf8(what, kMaxReplyText);
    Reply reply{kReplyMagic, 1, static_cast<uint32_t>(text.size()), static_cast<uint32_t>(kind)};
    std::string ignored;
    const Deadline soon = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(2));
    if (sendAll(sock, &reply, sizeof(reply), soon, &ignored)) sendAll(sock, text.data(), text.size(), soon, &ignored);
    throwError(kind, strFormat("rank %d: setting up shared memory with rank %d: %s", info.rank, peer, what.c_str()));
  };
  if (offer.magic != kOfferMagic || offer.version != kSetupVersion) {
    refuse(ErrorKind::kPeer, strFormat("unexpected shared-memory offer (magic 0x%08x, version %u): another rcoll "
                                       "version?",
                                       offer.magic, offer.version));
  }
  if (static_cast<int>(offer.creator_rank) != peer) {
    refuse(ErrorKind::kPeer, strFormat("the offer claims to come from rank %u", offer.creator_rank));
  }
  const uint64_t ring_bytes = offer.ring_bytes;
  const uint64_t bytes = offer.segment_bytes;
  if (ring_bytes < kMinRingBytes || ring_bytes > kMaxRingBytes || ring_bytes % kRecordAlign != 0 ||
      bytes != segmentBytes(ring_bytes) || offer.name_bytes == 0 || offer.name_bytes > sizeof(offer.socket_name)) {
    refuse(ErrorKind::kPeer, strFormat("malformed shared-memory offer (ring of %llu bytes)",
                                       static_cast<unsigned long long>(ring_bytes)));
  }
  if (offer.window_bytes != window_bytes) {
    refuse(ErrorKind::kConfig, strFormat("the shared windows differ (%llu bytes there, %zu here): RCOLL_SHM_COLL and "
                                         "RCOLL_SHM_COLL_SLOT_BYTES must be the same on every rank",
                                         static_cast<unsigned long long>(offer.window_bytes), window_bytes));
  }
  const std::string mine = bootId();
  const std::string theirs(offer.boot_id, strnlen(offer.boot_id, sizeof(offer.boot_id)));
  if (!mine.empty() && !theirs.empty() && mine != theirs) {
    refuse(ErrorKind::kConfig, strFormat("rank %d runs on another host (boot id %s, this rank's is %s): shared "
                                         "memory only connects ranks on one host",
                                         peer, theirs.c_str(), mine.c_str()));
  }

  // The Unix socket: present the secret and our doorbell, get the segment and the peer's doorbell.
  const std::string name(offer.socket_name, offer.name_bytes);
  socklen_t addr_len = 0;
  sockaddr_un addr = abstractAddress(name, &addr_len);
  UniqueFd conn(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (conn.get() < 0) refuse(ErrorKind::kGeneric, "socket(AF_UNIX): " + errnoText(errno));
  for (;;) {
    if (::connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) break;
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN && std::chrono::steady_clock::now() < deadline) {  // backlog full: retry
      ::usleep(1000);
      continue;
    }
    refuse(ErrorKind::kConfig,
           strFormat("cannot reach rank %d's shared-memory socket: %s (same host, but another network "
                     "namespace, e.g. another container?)",
                     peer, errnoText(err).c_str()));
  }
  const int presented[2] = {my_doorbell, my_window};
  if (!sendWithFds(conn.get(), offer.secret, sizeof(offer.secret), presented, window_bytes > 0 ? 2 : 1, deadline,
                   &why)) {
    refuse(ErrorKind::kPeer, "presenting the secret: " + why);
  }
  char ack = 0;
  int got_fds[3] = {-1, -1, -1};
  size_t n_fds = 0;
  if (!recvWithFds(conn.get(), &ack, 1, got_fds, 3, &n_fds, deadline, &why)) {
    refuse(ErrorKind::kPeer, "receiving the segment: " + why);
  }
  UniqueFd memfd(got_fds[0]);
  UniqueFd peer_doorbell(n_fds > 1 ? got_fds[1] : -1);
  UniqueFd peer_window(n_fds > 2 ? got_fds[2] : -1);
  const size_t fds_expected = window_bytes > 0 ? 3 : 2;
  if (n_fds != fds_expected) {
    refuse(ErrorKind::kPeer, strFormat("received %zu descriptors instead of %zu", n_fds, fds_expected));
  }
  conn.reset();

  // Check what we map: the announced size, sealed so that the peer cannot shrink it under us.
  struct stat st {};
  const int seals = ::fcntl(memfd.get(), F_GET_SEALS);
  if (::fstat(memfd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes || seals < 0 ||
      (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    refuse(ErrorKind::kPeer, "the received segment is not a sealed memfd of the announced size");
  }
  PairLink link;
  link.side = 1;
  link.segment = mapSegment(memfd.get(), static_cast<size_t>(bytes), static_cast<size_t>(ring_bytes), &why);
  if (!link.segment) refuse(ErrorKind::kGeneric, why);
  memfd.reset();
  const SegmentControl* control = link.segment->control();
  if (control->magic != kSegmentMagic || control->version != kSegmentVersion || control->ring_bytes != ring_bytes ||
      control->segment_bytes != bytes) {
    refuse(ErrorKind::kPeer, "the received segment's control block does not match the offer");
  }
  if (window_bytes > 0) {
    link.peer_window = mapPeerWindow(peer_window.get(), window_bytes, peer, &why);
    if (!link.peer_window) refuse(ErrorKind::kPeer, why);
  }
  Reply ready{kReplyMagic, 0, 0, 0};
  if (!sendAll(sock, &ready, sizeof(ready), deadline, &why)) {
    throwError(ErrorKind::kPeer,
               strFormat("rank %d: lost rank %d while setting up shared memory: %s", info.rank, peer, why.c_str()));
  }
  link.peer_doorbell = peer_doorbell.release();
  return link;
}

}  // namespace shm
}  // namespace rcoll
