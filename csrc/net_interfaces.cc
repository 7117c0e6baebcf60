#include "net_interfaces.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>

#include "config.h"
#include "error.h"
#include "name_filter.h"
#include "socket_util.h"

namespace rcoll {
namespace {

// Never a job's network unless nothing else is: container and VM bridges and
// the host ends of their veth pairs carry traffic of their own host only.
const char* const kBridgePrefixes[] = {"docker", "virbr", "veth", "br-", "cni", "flannel", "cali"};

bool isBridge(const std::string& ifname) {
  for (const char* prefix : kBridgePrefixes) {
    if (ifname.compare(0, std::strlen(prefix), prefix) == 0) return true;
  }
  return false;
}

int prefixLength(const sockaddr* mask) {
  if (mask == nullptr) return 0;
  const unsigned char* bytes = nullptr;
  size_t n = 0;
  if (mask->sa_family == AF_INET) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in*>(mask)->sin_addr);
    n = 4;
  } else if (mask->sa_family == AF_INET6) {
    bytes = reinterpret_cast<const unsigned char*>(&reinterpret_cast<const sockaddr_in6*>(mask)->sin6_addr);
    n = 16;
  }
  int bits = 0;
  for (size_t i = 0; i < n; ++i) bits += __builtin_popcount(bytes[i]);
  return bits;
}

std::string withoutScope(const std::string& address) { return address.substr(0, address.find('%')); }

// The address's bytes (4 or 16); false when it is not a numeric address.
bool addressBytes(const std::string& address, int* family, unsigned char out[16]) {
  const std::string bare = withoutScope(address);
  if (inet_pton(AF_INET, bare.c_str(), out) == 1) {
    *family = AF_INET;
    return true;
  }
  if (inet_pton(AF_INET6, bare.c_str(), out) == 1) {
    *family = AF_INET6;
    return true;
  }
  return false;
}

bool sameSubnet(const InterfaceAddress& mine, const std::string& other) {
  unsigned char a[16] = {}, b[16] = {};
  int fa = 0, fb = 0;
  if (!addressBytes(mine.address, &fa, a) || !addressBytes(other, &fb, b) || fa != fb) return false;
  const int bits = std::min(mine.prefix_len, fa == AF_INET ? 32 : 128);
  for (int i = 0; i < bits; ++i) {
    const int mask = 0x80 >> (i % 8);
    if ((a[i / 8] & mask) != (b[i / 8] & mask)) return false;
  }
  return true;
}

bool isLinkLocal(const std::string& address) {
  unsigned char b[16] = {};
  int family = 0;
  return addressBytes(address, &family, b) && family == AF_INET6 && b[0] == 0xfe && (b[1] & 0xc0) == 0x80;
}

std::string describeAll(const std::vector<InterfaceAddress>& list) {
  std::string out;
  for (const InterfaceAddress& a : list) out += (out.empty() ? "" : ", ") + a.describe();
  return out.empty() ? "none" : out;
}

// A published list's "host:port" entries as (host, port); malformed ones are skipped.
std::vector<std::pair<std::string, int>> hostPorts(const std::string& published) {
  std::vector<std::pair<std::string, int>> out;
  for (const std::string& entry : splitCommas(published)) {
    std::string host;
    int port = 0;
    if (splitHostPort(entry, &host, &port)) out.emplace_back(host, port);
  }
  return out;
}

int familyOf(const std::string& setting, int rank) {
  const int family = addressFamilyNamed(setting);
  if (family < 0) {
    const char* expected = "expected AF_INET (ipv4) or AF_INET6 (ipv6)";
    throwError(ErrorKind::kConfig, strFormat("rank %d: RCOLL_SOCKET_FAMILY=%s: %s", rank, setting.c_str(), expected));
  }
  return family;
}

}  // namespace

std::string InterfaceAddress::describe() const {
  return ifname + " " + withoutScope(address) + "/" + std::to_string(prefix_len);
}

std::vector<InterfaceAddress> interfaceAddresses() {
  std::vector<InterfaceAddress> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr || (it->ifa_flags & IFF_UP) == 0) continue;
    const int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    sockaddr_storage storage{};
    std::memcpy(&storage, it->ifa_addr, family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    InterfaceAddress a;
    a.ifname = it->ifa_name;
    a.address = numericHost(storage);  // a link-local one carries "%<ifname>"
    a.family = family;
    a.prefix_len = prefixLength(it->ifa_netmask);
    a.loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    a.link_local = isLinkLocal(a.address);
    out.push_back(a);
  }
  freeifaddrs(list);
  return out;
}

std::string DataInterfaces::bindList() const {
  std::string out;
  for (const InterfaceAddress& a : chosen) out += (out.empty() ? "" : ",") + a.address;
  return out;
}

DataInterfaces chooseDataInterfaces(const std::string& spec, const std::string& family_setting,
                                    const std::vector<InterfaceAddress>& here, const std::string& preferred, int rank) {
  const int family = familyOf(family_setting, rank);
  const NameFilter filter(spec);
  std::vector<InterfaceAddress> candidates, left_out;
  for (const InterfaceAddress& a : here)
    (family == AF_UNSPEC || a.family == family ? candidates : left_out).push_back(a);
  DataInterfaces out;
  std::string reasons;
  auto leave = [&](const InterfaceAddress& a, const char* why) {
    if (reasons.find(a.ifname + " (") == std::string::npos)
      reasons += (reasons.empty() ? "" : ", ") + a.ifname + " (" + why + ")";
  };
  if (spec.empty()) {
    for (const InterfaceAddress& a : candidates) {
      if (a.loopback) {
        leave(a, "loopback");
      } else if (isBridge(a.ifname)) {
        leave(a, "a container or VM bridge");
      } else {
        out.chosen.push_back(a);
      }
    }
    // Nothing else: the ranks can only be on this host; loopback reaches them.
    if (out.chosen.empty()) {
      for (const InterfaceAddress& a : candidates) {
        if (a.loopback) out.chosen.push_back(a);
      }
      reasons = "no other interface is up with an address";
    }
    if (out.chosen.empty()) out.chosen = candidates;
  } else {
    for (const InterfaceAddress& a : candidates) {
      if (filter.accepts(a.ifname)) {
        out.chosen.push_back(a);
      } else {
        leave(a, "not in RCOLL_SOCKET_IFNAME");
      }
    }
    if (filter.exact() && !filter.excludes()) {
      for (const std::string& name : filter.names()) {
        const bool present = std::any_of(candidates.begin(), candidates.end(),
                                         [&](const InterfaceAddress& a) { return a.ifname == name; });
        if (!present) {
          throwError(ErrorKind::kConfig,
                     strFormat("rank %d: RCOLL_SOCKET_IFNAME=%s: no interface '%s' is up with %saddress here (this "
                               "host has: %s)",
                               rank, spec.c_str(), name.c_str(), family == AF_UNSPEC ? "an " : "a matching ",
                               describeAll(here).c_str()));
        }
      }
    }
  }
  if (out.chosen.empty()) {
    throwError(ErrorKind::kConfig,
               strFormat("rank %d: no interface to carry data: %s%s%s%s matches no interface that is up with an "
                         "address (this host has: %s)",
                         rank, spec.empty() ? "" : "RCOLL_SOCKET_IFNAME=", spec.c_str(),
                         family_setting.empty() ? "" : " RCOLL_SOCKET_FAMILY=", family_setting.c_str(),
                         describeAll(here).c_str()));
  }
  for (const InterfaceAddress& a : left_out) leave(a, "another family than RCOLL_SOCKET_FAMILY");
  // Preferred first (the address that reaches the store: what a one-NIC job
  // used), then global IPv4, global IPv6, link-local.
  auto rank_of = [&](const InterfaceAddress& a) {
    if (!preferred.empty() && withoutScope(a.address) == withoutScope(preferred)) return 0;
    if (a.link_local) return 3;
    return a.family == AF_INET ? 1 : 2;
  };
  std::stable_sort(out.chosen.begin(), out.chosen.end(),
                   [&](const InterfaceAddress& x, const InterfaceAddress& y) { return rank_of(x) < rank_of(y); });
  out.why = "data interfaces " + describeAll(out.chosen) +
            (spec.empty() ? " (default)" : " (RCOLL_SOCKET_IFNAME=" + spec + ")");
  if (!reasons.empty()) out.why += "; left out: " + reasons;
  return out;
}

std::vector<std::string> subnetsOf(const DataInterfaces& interfaces) {
  std::vector<std::string> out;
  for (const InterfaceAddress& a : interfaces.chosen) {
    unsigned char bytes[16] = {};
    int family = 0;
    if (a.link_local || a.loopback || !addressBytes(a.address, &family, bytes)) continue;
    const int total = family == AF_INET ? 32 : 128;
    const int bits = std::min(a.prefix_len, total);
    for (int i = bits; i < total; ++i) bytes[i / 8] &= static_cast<unsigned char>(~(0x80 >> (i % 8)));
    char text[INET6_ADDRSTRLEN] = {};
    if (inet_ntop(family, bytes, text, sizeof(text)) == nullptr) continue;
    out.push_back(std::string(text) + "/" + std::to_string(bits));
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> commonSubnets(const std::vector<std::vector<std::string>>& lists) {
  if (lists.empty()) return {};
  std::vector<std::string> common = lists[0];
  for (const auto& list : lists) {
    std::vector<std::string> both;
    std::set_intersection(common.begin(), common.end(), list.begin(), list.end(), std::back_inserter(both));
    common.swap(both);
  }
  return common;
}

std::string dialAddressesOn(const std::vector<std::string>& subnets, const std::string& published, int rank, int peer) {
  std::string out;
  for (const std::string& subnet : subnets) {
    InterfaceAddress network;
    network.address = subnet.substr(0, subnet.find('/'));
    network.prefix_len = std::atoi(subnet.c_str() + subnet.find('/') + 1);
    std::string found;
    for (const auto& [host, port] : hostPorts(published)) {
      if (sameSubnet(network, host)) {
        found = joinHostPort(host, port);
        break;
      }
    }
    if (found.empty()) {
      throwError(ErrorKind::kConfig, strFormat("rank %d: rank %d has no address on network %s (it listens on %s), "
                                               "which every rank's data interfaces were to share",
                                               rank, peer, subnet.c_str(), published.c_str()));
    }
    out += (out.empty() ? "" : ",") + found;
  }
  return out;
}

std::string chooseDialAddress(const std::string& published, const DataInterfaces& mine, int rank, int peer) {
  const std::vector<std::pair<std::string, int>> theirs = hostPorts(published);
  // 1. A network both ranks are on.
  for (const auto& [host, port] : theirs) {
    if (isLinkLocal(host)) continue;
    for (const InterfaceAddress& a : mine.chosen) {
      if (sameSubnet(a, host)) return joinHostPort(host, port);
    }
  }
  // 2. A link: every link-local address looks alike, so this rank's own
  //    link-local interface gives the scope.
  for (const auto& [host, port] : theirs) {
    if (!isLinkLocal(host)) continue;
    for (const InterfaceAddress& a : mine.chosen) {
      if (a.link_local) return joinHostPort(withoutScope(host) + "%" + a.ifname, port);
    }
  }
  // 3. A route that leaves through one of this rank's chosen interfaces.
  for (const auto& [host, port] : theirs) {
    if (isLinkLocal(host)) continue;
    const std::string source = withoutScope(sourceAddressFor(host));
    for (const InterfaceAddress& a : mine.chosen) {
      if (!source.empty() && withoutScope(a.address) == source) return joinHostPort(host, port);
    }
  }
  throwError(ErrorKind::kConfig,
             strFormat("rank %d: no network of this rank reaches rank %d: rank %d listens on %s; this rank's %s (see "
                       "RCOLL_SOCKET_IFNAME, RCOLL_SOCKET_FAMILY)",
                       rank, peer, peer, published.c_str(), mine.why.c_str()));
}

std::string socketRoute(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return peerName(fd);
  std::string host = numericHost(local);
  const std::string bare = host.substr(0, host.find('%'));
  // An IPv4 peer on a dual-stack socket shows as ::ffff:a.b.c.d.
  const std::string v4 = bare.rfind("::ffff:", 0) == 0 ? bare.substr(7) : bare;
  std::string ifname;
  for (const InterfaceAddress& a : interfaceAddresses()) {
    const std::string mine = a.address.substr(0, a.address.find('%'));
    if (mine == bare || mine == v4) ifname = a.ifname;
  }
  return (ifname.empty() ? "" : ifname + " ") + v4 + " -> " + peerName(fd);
}

}  // namespace rcoll
