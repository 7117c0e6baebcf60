#include "composite_transport.h"

#include <sstream>

#include "log.h"
#include "socket_util.h"

namespace rcoll {

CompositeTransport::CompositeTransport(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> children,
                                       std::vector<int> route, std::chrono::microseconds spin)
    : TransportGroup(info, std::move(children), spin), route_(std::move(route)) {
  if (route_.size() != static_cast<size_t>(info_.size)) {
    throwError(ErrorKind::kGeneric,
               strFormat("rank %d: a composite transport needs a route for each of %d ranks", info_.rank, info_.size));
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    std::vector<bool> served(route_.size());
    for (size_t p = 0; p < route_.size(); ++p) served[p] = route_[p] == static_cast<int>(i);
    children_[i]->setPeers(served);
    if (children_[i]->needsRegistration()) {
      if (registrar_ != nullptr) {
        throwError(ErrorKind::kGeneric, strFormat("rank %d: two transports of one composite need memory "
                                                  "registration (%s and %s)",
                                                  info_.rank, registrar_->name(), children_[i]->name()));
      }
      registrar_ = children_[i].get();
    }
    if (i > 0) name_ += "+";
    name_ += children_[i]->name();
  }
}

Transport& CompositeTransport::childOf(int peer) const {
  if (peer < 0 || peer >= info_.size || route_[static_cast<size_t>(peer)] < 0) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: rank %d is not a peer of this communicator (size %d)",
                                                      info_.rank, peer, info_.size));
  }
  return *children_[static_cast<size_t>(route_[static_cast<size_t>(peer)])];
}

const char* CompositeTransport::transportOf(int peer) const {
  if (peer == info_.rank) return "self";
  return childOf(peer).name();
}

// --- set-up --------------------------------------------------------------------

std::string CompositeTransport::listenAddress() const {
  std::string out;
  for (auto& child : children_) {
    if (!out.empty()) out += ' ';
    out += listenAddresses(*child);
  }
  return out;
}

void CompositeTransport::connect(int peer, const std::string& address, Deadline deadline) {
  childOf(peer).connect(peer, address, deadline);
}

int CompositeTransport::accept(Deadline deadline) {
  // Child by child, each until its higher peers are in (see the header for why
  // this cannot deadlock).
  for (auto& child : children_) {
    for (int peer = info_.rank + 1; peer < info_.size; ++peer) {
      if (child->serves(peer) && !child->connected(peer)) return child->accept(deadline);
    }
  }
  throwError(ErrorKind::kGeneric, strFormat("rank %d: accept() with every higher rank connected", info_.rank));
}

void CompositeTransport::closeListener() {
  for (auto& child : children_) child->closeListener();
}

bool CompositeTransport::canConnectOnDemand(int peer) const { return childOf(peer).canConnectOnDemand(peer); }

// Each child gets the addresses of its own peers.
void CompositeTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  for (auto& child : children_) {
    std::vector<std::string> mine(addresses.size());
    for (size_t p = 0; p < addresses.size(); ++p) {
      if (child->serves(static_cast<int>(p))) mine[p] = addresses[p];
    }
    child->connectOnDemand(mine);
  }
}

bool CompositeTransport::connected(int peer) const {
  if (peer < 0 || peer >= info_.size || route_[static_cast<size_t>(peer)] < 0) return false;
  return childOf(peer).connected(peer);
}

// --- memory --------------------------------------------------------------------

MemoryHandle CompositeTransport::registerMemory(void* data, size_t bytes) {
  return registrar_ != nullptr ? registrar_->registerMemory(data, bytes) : nullptr;
}

MemoryHandle CompositeTransport::registerDeviceMemory(void*, size_t, int, uint64_t, std::string* why) {
  *why = "this rank's edges mix transports (" + name_ + "): GPUDirect RDMA needs every edge on verbs";
  return nullptr;
}

void CompositeTransport::deregisterMemory(MemoryHandle handle) {
  if (registrar_ != nullptr) registrar_->deregisterMemory(handle);
}

void CompositeTransport::invalidateMemory(const void* data, size_t bytes) {
  for (auto& child : children_) child->invalidateMemory(data, bytes);
}

// --- data path -----------------------------------------------------------------

Request* CompositeTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  return childOf(peer).isend(peer, header, data, bytes);
}

Request* CompositeTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return childOf(peer).irecv(peer, expected, data, bytes);
}

bool CompositeTransport::canPeek(int peer) const { return childOf(peer).canPeek(peer); }

bool CompositeTransport::peekIncoming(int peer, WireHeader* header) { return childOf(peer).peekIncoming(peer, header); }

TransportFailure CompositeTransport::failure(Request* request) const { return childOf(request->peer).failure(request); }

void CompositeTransport::release(Request* request) { childOf(request->peer).release(request); }

// --- published addresses ---------------------------------------------------------

std::string listenAddresses(const Transport& transport) {
  if (auto* composite = dynamic_cast<const CompositeTransport*>(&transport)) return composite->listenAddress();
  return std::string(transport.name()) + "=" + transport.listenAddress();
}

std::string pickAddress(const std::string& published, const std::string& kind, int rank, int peer) {
  std::istringstream in(published);
  std::string entry;
  const std::string prefix = kind + "=";
  while (in >> entry) {
    if (entry.compare(0, prefix.size(), prefix) == 0) return entry.substr(prefix.size());
  }
  throwError(ErrorKind::kConfig,
             strFormat("rank %d: rank %d runs no %s listener (it published \"%s\"): the two ranks chose different "
                       "transports for their edge; is the same rcoll installed on both?",
                       rank, peer, kind.c_str(), published.c_str()));
}

}  // namespace rcoll
