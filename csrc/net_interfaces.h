// Which of this host's addresses carry a job's data, and which of a peer's
// addresses to dial: the only place that knows about network interfaces.
//
// The rules are NCCL's (NCCL_SOCKET_IFNAME), because users already know them.
// RCOLL_SOCKET_IFNAME is a list in name_filter.h's syntax; without it, every
// interface that is up and has an address, but loopback and the container and
// VM bridges (docker*, virbr*, veth*, br-*, cni*, flannel*, cali*), when any
// other is there; RCOLL_SOCKET_FAMILY keeps one family. A rank listens on all
// of its chosen addresses and publishes them; a peer dials, of those, one on
// a network it shares (the same subnet), else one that a route reaches through
// one of its own chosen interfaces. IPv6 link-local addresses are dialed with
// the dialer's interface as their scope.
#pragma once

#include <string>
#include <vector>

namespace rcoll {

struct InterfaceAddress {
  std::string ifname;
  std::string address;  // numeric; a link-local IPv6 one with "%<ifname>"
  int family = 0;       // AF_INET or AF_INET6
  int prefix_len = 0;
  bool loopback = false;
  bool link_local = false;

  std::string describe() const;  // "eth0 192.0.2.2/24"
};

// The addresses of this host's interfaces that are up, in the kernel's order.
std::vector<InterfaceAddress> interfaceAddresses();

struct DataInterfaces {
  std::vector<InterfaceAddress> chosen;  // what the rank listens on and dials from, preferred first
  std::string why;                       // what was chosen and what was left out, and why (the INFO line)

  std::string bindList() const;  // the chosen addresses, comma-separated (PeerListener)
};

// This rank's data addresses among `here`, by `spec` (RCOLL_SOCKET_IFNAME) and
// `family` ("", "AF_INET"/"ipv4", "AF_INET6"/"ipv6"); `preferred` (the address
// that reaches the rendezvous store), when chosen, comes first. Throws a
// ConfigError naming the rank, the setting and this host's addresses when
// nothing is left, or when an exact name (`=eth9`) is not here.
DataInterfaces chooseDataInterfaces(const std::string& spec, const std::string& family,
                                    const std::vector<InterfaceAddress>& here, const std::string& preferred, int rank);

// Which of `published` (a peer's "host:port" list, comma-separated) this rank
// dials, from `mine`: one on a shared subnet, then a link-local one, then one
// that a route reaches through a chosen interface. ConfigError, naming both
// ranks' addresses, when none is.
std::string chooseDialAddress(const std::string& published, const DataInterfaces& mine, int rank, int peer);

// Several NICs: the subnets ("198.18.40.0/24", "2001:2::/64") of the chosen
// addresses, link-local and loopback ones left out, sorted; those every one
// of `lists` has, sorted; and, for each of `subnets`, the peer's published
// address on it, comma-separated, in that order (lane k of a peer dials the
// (k mod n)-th). ConfigError when the peer has none on one of them.
std::vector<std::string> subnetsOf(const DataInterfaces& interfaces);
std::vector<std::string> commonSubnets(const std::vector<std::vector<std::string>>& lists);
std::string dialAddressesOn(const std::vector<std::string>& subnets, const std::string& published, int rank, int peer);

// "eth1 198.18.1.2 -> 198.18.1.3:41234": a connected socket's interface,
// local address and peer, for messages about it.
std::string socketRoute(int fd);

}  // namespace rcoll
