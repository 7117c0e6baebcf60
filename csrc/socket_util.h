// Small POSIX socket helpers shared by the TCP transport and rendezvous.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

struct sockaddr_storage;

namespace rcoll {

using Deadline = std::chrono::steady_clock::time_point;

// Milliseconds left until `deadline`, clamped to [0, INT_MAX] for poll().
int millisecondsUntil(Deadline deadline);

std::string errnoText(int err);  // "Connection refused (errno 111)"

// "host:port" <-> parts. IPv6 literals are written "[addr]:port".
bool splitHostPort(const std::string& address, std::string* host, int* port);
std::string joinHostPort(const std::string& host, int port);

// Resolves `host` (name or literal) to the first IPv4/IPv6 address.
bool resolveHost(const std::string& host, int port, sockaddr_storage* out, unsigned* out_len);

// IPv4 address of a network interface ("eth0"); "" if it has none.
std::string interfaceAddress(const std::string& ifname);

// The local address this host would use to reach `host` (no packet is sent:
// a UDP socket is connected and asked for its name). "" if unreachable.
std::string sourceAddressFor(const std::string& host);

// Peer address of a connected socket as "ip:port", for log messages.
std::string peerName(int fd);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);
void setBufferSizes(int fd, size_t bytes);  // no-op when bytes == 0

// Blocking-with-deadline helpers for the handshake phase. They return false on
// EOF, error or expiry, with errno-style text in *why.
bool sendAll(int fd, const void* data, size_t bytes, Deadline deadline, std::string* why);
bool recvAll(int fd, void* data, size_t bytes, Deadline deadline, std::string* why);

}  // namespace rcoll
