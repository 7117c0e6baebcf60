// Small POSIX socket helpers shared by the TCP transport and rendezvous.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

struct sockaddr_storage;

namespace rcoll {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
int millisecondsUntil(Deadline deadline);

std::string errnoText(int err);  // "Connection refused (errno 111)"
// Whether a socket error means the link under it failed (a cable, a NIC, a
// route, every packet lost until RCOLL_PEER_TIMEOUT), which connections over
// other networks survive, rather than the peer process going away.
bool isLinkFailure(int err);

// "host:port" <-> parts. IPv6 literals are written "[addr]:port".
bool splitHostPort(const std::string& address, std::string* host, int* port);
std::string joinHostPort(const std::string& host, int port);

// The entries of a comma-separated list ("" gives one empty entry), e.g. a
// rank's published addresses.
std::vector<std::string> splitCommas(const std::string& list);
// The same for any separator (a rails transport's per-rail addresses: '|').
std::vector<std::string> splitList(const std::string& list, char separator);

// Entry k mod n of a comma-separated list of n addresses ("host:port,..."):
// where a peer is dialed on several networks, lane k takes the k-th.
std::string laneAddress(const std::string& addresses, int k);

// Resolves `host` (a name, an IPv4 literal, an IPv6 literal bare or in
// brackets, with "%scope" for a link-local one) to one address, IPv4 first
// when a name has both. With `passive` and an empty host (or "0.0.0.0" /
// "::"): the wildcard address, "::" (both families: see listenSocket) where
// the host has IPv6, else 0.0.0.0. Returns "" on success, else why not.
std::string resolveSocketAddress(const std::string& host, int port, bool passive, sockaddr_storage* out,
                                 unsigned* out_len);
bool resolveHost(const std::string& host, int port, sockaddr_storage* out, unsigned* out_len);

// A non-blocking TCP socket bound to `addr` and listening; an IPv6 wildcard
// takes IPv4 peers too (IPV6_V6ONLY off). -1 with errno set on failure.
int listenSocket(const sockaddr_storage& addr, unsigned len, int backlog);

// The numeric host of a socket address: "192.0.2.1", "fd00::1", "fe80::1%eth0".
std::string numericHost(const sockaddr_storage& addr);
int portOf(const sockaddr_storage& addr);

// The local address this host would use to reach `host` (IPv4 or IPv6; no
// packet is sent: a UDP socket is connected and asked for its name). "" if
// no route leads there.
std::string sourceAddressFor(const std::string& host);

// Peer address of a connected socket as "ip:port", for log messages.
std::string peerName(int fd);

void setNonBlocking(int fd, bool on);

// How every connection between ranks is set up (peer_listener.h): the TCP,
// shared-memory and verbs transports all hold one per peer.
struct SocketOptions {
  size_t buffer_bytes = 0;  // SO_SNDBUF and SO_RCVBUF; 0: the kernel's autotuning (RCOLL_SOCKET_BUFFER_BYTES)
  // A peer whose host acknowledges nothing for this long is dead
  // (RCOLL_PEER_TIMEOUT): a cut link or a vanished host is then seen in
  // seconds, not after the kernel's retransmissions (15 minutes) or never
  // (an idle connection). A slow process is not dead: its kernel still acknowledges. 0: the kernel's defaults.
  std::chrono::milliseconds dead_after{0};
};
// TCP_NODELAY, the buffer sizes, and for dead_after: TCP_USER_TIMEOUT (data
// unacknowledged) and keepalive probes (an idle connection), so that either
// fails the socket within dead_after.
void applySocketOptions(int fd, const SocketOptions& options);

// An eventfd used as a doorbell: ring it (adds 1), or take every ring so far.
// Neither blocks (EFD_NONBLOCK), and neither fails in a way worth reporting:
// a full counter still wakes the reader.
void signalEventfd(int fd);
void drainEventfd(int fd);

// Blocking-with-deadline helpers for the handshake phase. They return false on
// EOF, error or expiry, with errno-style text in *why.

bool sendAll(int fd, const void* data, size_t bytes, Deadline deadline, std::string* why);
bool recvAll(int fd, void* data, size_t bytes, Deadline deadline, std::string* why);

}  // namespace rcoll
