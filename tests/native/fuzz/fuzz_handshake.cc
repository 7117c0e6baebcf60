// libFuzzer target: TcpTransport::accept() against whatever a client sends.
//
// A fresh transport (rank 0 of 2) listens on 127.0.0.1 for every input, so
// nothing (accepted peers, pending handshakes) carries over between inputs; a
// raw TCP client connects to its listenAddress(), writes the bytes, and closes
// its sending side (or, in "stalled" mode, keeps it open); then accept() runs
// with a short deadline.
//
//   byte 0    bits 0-1: what the client sends
//               0: the rest of the input as is
//               1: a valid handshake XOR the next 44 bytes (zeros: valid), then the rest
//               2: the first (byte 1 % 45) bytes of a valid handshake, then the rest
//               3: like 1
//             bit 2: stalled: the client does not close before accept() returns
//             bit 3: a second client then sends a valid handshake: accept() must
//                    return rank 1 whatever the first one sent (and when both
//                    are valid, a second accept() must reject the duplicate;
//                    not sent after a hello that counts sockets differently)
//
// Oracle (an independent reading of the protocol): accept() returns 1 when the
// first 44 bytes form a valid hello of this job from rank 1 to rank 0 for its
// one socket (lane 0 of 1), and the client then reads a valid ack. When they
// differ from that only in announcing 2-64 sockets per peer (and a lane below
// that), accept() throws RcollError(kConfig) and the client reads an ack that
// says 1. Otherwise accept() throws RcollError(kTimeout).
// Anything else (another return value, another exception, a crash, a leak) is
// a bug.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "fuzz_common.h"
#include "socket_util.h"
#include "tcp_transport.h"

using namespace rcoll;

namespace {

// The handshake as the protocol defines it (tcp_transport.cc), restated here so
// that the oracle does not share code with what it checks.
#pragma pack(push, 1)
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t is_ack;
  uint32_t src_rank;
  uint32_t dst_rank;
  uint64_t comm_id;
  uint8_t token[16];
  uint16_t lane;
  uint16_t lanes;
};
#pragma pack(pop)
static_assert(sizeof(Hello) == 44, "the handshake is 44 bytes");
constexpr size_t kIdentityBytes = 40;         // everything before lane and lanes
constexpr uint32_t kHelloMagic = 0x53484352;  // "RCHS"

Hello validHello() {
  Hello h{};
  h.magic = kHelloMagic;
  h.version = kWireVersion;
  h.is_ack = 0;
  h.src_rank = 1;
  h.dst_rank = 0;
  h.comm_id = rcoll_fuzz::kCommId;
  std::memcpy(h.token, rcoll_fuzz::kToken, sizeof(h.token));
  h.lane = 0;
  h.lanes = 1;
  return h;
}

bool isValidHello(const uint8_t* bytes, size_t n) {
  if (n < sizeof(Hello)) return false;
  Hello valid = validHello();
  return std::memcmp(bytes, &valid, sizeof(Hello)) == 0;  // every field has exactly one valid value here
}

// A hello of this job that announces another number of sockets per peer.
bool countsSocketsDifferently(const uint8_t* bytes, size_t n) {
  if (n < sizeof(Hello)) return false;
  Hello valid = validHello();
  Hello got;
  std::memcpy(&got, bytes, sizeof(got));
  return std::memcmp(bytes, &valid, kIdentityBytes) == 0 && got.lanes >= 2 && got.lanes <= 64 && got.lane < got.lanes;
}

int connectTo(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    // libFuzzer's SIGALRM (its -timeout watchdog) can interrupt connect(), which then completes in the background.
    FUZZ_CHECK(errno == EINTR, "connect: %s", strerror(errno));
    pollfd pfd{fd, POLLOUT, 0};
    while (::poll(&pfd, 1, 5000) < 0 && errno == EINTR) {
    }
    int err = 0;
    socklen_t len = sizeof(err);
    FUZZ_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0, "connect: %s", strerror(err));
  }
  return fd;
}

// Writes what fits without blocking (the server reads at most 40 bytes).
size_t sendSome(int fd, const uint8_t* data, size_t n) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t k = ::send(fd, data + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      sent += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    break;
  }
  return sent;
}

// Closes without leaving a TIME_WAIT entry behind (thousands of inputs a
// second would otherwise exhaust the ephemeral ports).
void closeHard(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

constexpr int kConfigError = -2;

// accept() with a short deadline; for an input the oracle calls valid, a
// timeout is retried with a long one so that a slow machine is not reported.
// -1: timed out; kConfigError: threw RcollError(kConfig).
int acceptOutcome(TcpTransport& t, bool valid) {
  for (auto wait : {std::chrono::milliseconds(3), std::chrono::milliseconds(5000)}) {
    try {
      return t.accept(std::chrono::steady_clock::now() + wait);
    } catch (const RcollError& e) {
      if (e.kind() == ErrorKind::kConfig) {
        FUZZ_CHECK(std::strstr(e.what(), "RCOLL_SOCKETS_PER_PEER") != nullptr, "unclear config error: %s", e.what());
        return kConfigError;
      }
      FUZZ_CHECK(e.kind() == ErrorKind::kTimeout, "accept() threw %s: %s", errorKindName(e.kind()), e.what());
      FUZZ_CHECK(std::strlen(e.what()) > 0, "accept() threw an empty message");
      if (!valid) return -1;
    } catch (const std::exception& e) {
      FUZZ_CHECK(false, "accept() threw a non-rcoll exception: %s", e.what());
    }
  }
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rcoll_fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const uint8_t* rest = data + 1;
  size_t rest_len = size - 1;
  std::vector<uint8_t> out;
  Hello valid = validHello();
  const auto* valid_bytes = reinterpret_cast<const uint8_t*>(&valid);
  switch (mode & 3) {
    case 0:
      out.assign(rest, rest + rest_len);
      break;
    case 2: {
      size_t keep = rest_len > 0 ? rest[0] % (sizeof(Hello) + 1) : sizeof(Hello);
      out.assign(valid_bytes, valid_bytes + keep);
      if (rest_len > 0) out.insert(out.end(), rest + 1, rest + rest_len);
      break;
    }
    default: {
      out.assign(valid_bytes, valid_bytes + sizeof(Hello));
      size_t mask = std::min(rest_len, sizeof(Hello));
      for (size_t i = 0; i < mask; ++i) out[i] ^= rest[i];
      out.insert(out.end(), rest + mask, rest + rest_len);
      break;
    }
  }
  const bool stalled = mode & 4;
  const bool config_first = countsSocketsDifferently(out.data(), std::min(out.size(), sizeof(Hello)));

  TcpTransport transport(rcoll_fuzz::connectInfo(), Config(), "127.0.0.1");
  std::string host;
  int port = 0;
  FUZZ_CHECK(splitHostPort(transport.listenAddress(), &host, &port) && host == "127.0.0.1", "listenAddress() = '%s'",
             transport.listenAddress().c_str());

  int client = connectTo(port);
  size_t sent = sendSome(client, out.data(), out.size());
  if (!stalled) ::shutdown(client, SHUT_WR);
  bool valid_first = isValidHello(out.data(), sent);
  const bool config_error = config_first && sent >= sizeof(Hello);
  const bool second_valid = (mode & 8) && !config_first;

  int client2 = -1;
  if (second_valid) {
    client2 = connectTo(port);
    FUZZ_CHECK(sendSome(client2, valid_bytes, sizeof(Hello)) == sizeof(Hello), "second client: short write");
  }

  const bool expect_accept = valid_first || second_valid;
  int peer = acceptOutcome(transport, expect_accept || config_error);
  if (config_error) {
    FUZZ_CHECK(peer == kConfigError, "accept() gave %d for a hello announcing %u sockets per peer", peer,
               reinterpret_cast<const Hello*>(out.data())->lanes);
    FUZZ_CHECK(!transport.connected(1), "rank 1 connected with another socket count");
    Hello ack{};
    std::string why;
    FUZZ_CHECK(recvAll(client, &ack, sizeof(ack), std::chrono::steady_clock::now() + std::chrono::seconds(5), &why),
               "no ack telling the socket count: %s", why.c_str());
    FUZZ_CHECK(ack.magic == kHelloMagic && ack.is_ack == 1 && ack.lanes == 1, "malformed ack");
  } else if (expect_accept) {
    FUZZ_CHECK(peer == 1, "a valid handshake was not accepted (accept() gave %d; %zu bytes sent%s)", peer, sent,
               second_valid ? ", then a second, valid client" : "");
    FUZZ_CHECK(transport.connected(1), "accept() returned 1 but rank 1 is not connected");
    // The accepted client gets an ack: the first one if its hello was valid (it
    // was queued first), but wait for either rather than rely on that order.
    int acked = valid_first ? client : client2;
    if (valid_first && second_valid) {
      pollfd both[2] = {{client, POLLIN, 0}, {client2, POLLIN, 0}};
      while (::poll(both, 2, 5000) < 0 && errno == EINTR) {
      }
      acked = (both[0].revents & POLLIN) ? client : client2;
    }
    Hello ack{};
    std::string why;
    FUZZ_CHECK(recvAll(acked, &ack, sizeof(ack), std::chrono::steady_clock::now() + std::chrono::seconds(5), &why),
               "no ack for an accepted handshake: %s", why.c_str());
    FUZZ_CHECK(ack.magic == kHelloMagic && ack.version == kWireVersion && ack.is_ack == 1 && ack.src_rank == 0 &&
                   ack.dst_rank == 1 && ack.comm_id == rcoll_fuzz::kCommId &&
                   std::memcmp(ack.token, rcoll_fuzz::kToken, sizeof(ack.token)) == 0 && ack.lane == 0 &&
                   ack.lanes == 1,
               "malformed ack");
    if (valid_first && second_valid) {
      // The other client claims rank 1 too: rejected ("already connected"), never re-adopted.
      FUZZ_CHECK(acceptOutcome(transport, /*valid=*/false) == -1, "a second rank 1 was accepted");
      FUZZ_CHECK(transport.connected(1), "rank 1 lost its connection to a duplicate");
    }
  } else {
    FUZZ_CHECK(peer == -1, "accept() returned %d for an invalid handshake (%zu bytes sent)", peer, sent);
    FUZZ_CHECK(!transport.connected(1), "rank 1 connected without a valid handshake");
  }

  closeHard(client);
  if (client2 >= 0) closeHard(client2);
  return 0;  // ~TcpTransport closes the listener, pending handshakes and the connection
}
