// VerbsTransport's memory registration: host memory through the registration
// cache (mr_cache.h), device memory (a dma-buf or peer memory) adopted into it,
// and each request's reference to its registration while the NIC may use it.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "rdma/ibv_api.h"
#include "rdma/verbs_transport_internal.h"

namespace rcoll {

namespace {

constexpr int kAccessRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

}  // namespace

std::unique_ptr<MrCache> VerbsTransport::makeMrCache() {
  auto reg = [this](MrCache::Entry& e, std::string* why) {
    const size_t len = e.end - e.start;
    if (len > max_mr_bytes_) {
      *why = strFormat("a buffer of %zu bytes exceeds the device's largest registration (max_mr_size %llu)", len,
                       static_cast<unsigned long long>(max_mr_bytes_));
      return false;
    }
    void* addr = reinterpret_cast<void*>(e.start);
    ibv_mr* mr = api_.reg_mr(pd_, addr, len, kAccessRemote);
    if (mr == nullptr && !e.writable && (errno == EFAULT || errno == EACCES)) {
      mr = api_.reg_mr(pd_, addr, len, 0);  // read-only memory can still be sent from
    } else if (mr != nullptr) {
      e.writable = true;
    }
    if (mr == nullptr) {
      int err = errno;
      *why = strFormat("registering %zu bytes of memory with the RDMA device failed: %s", len, std::strerror(err));
      if (err == ENOMEM || err == EAGAIN) {
        *why +=
            " (the locked-memory limit is too low: raise it with `ulimit -l unlimited`, "
            "LimitMEMLOCK=infinity in systemd, or --ulimit memlock=-1 in Docker)";
      }
      return false;
    }
    e.handle = mr;
    e.lkey = mr->lkey;
    e.rkey = mr->rkey;
    return true;
  };
  auto dereg = [this](MrCache::Entry& e) { api_.dereg_mr(static_cast<ibv_mr*>(e.handle)); };
  return std::make_unique<MrCache>(reg, dereg, config_.ib_mr_cache_bytes);
}

MemoryHandle VerbsTransport::registerMemory(void* data, size_t bytes) {
  std::string why;
  MrCache::Entry* e = mr_cache_->acquire(data, bytes, /*writable=*/true, &why);
  if (e == nullptr) throwError(ErrorKind::kGeneric, strFormat("rank %d: %s", info_.rank, why.c_str()));
  return e;
}

MemoryHandle VerbsTransport::registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                                  std::string* why) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  // The cache looks registrations up by whole pages: a range that is not
  // page-aligned would be found for neighbouring bytes it does not cover.
  if (start % page != 0 || bytes % page != 0 || bytes == 0) {
    *why = strFormat("device memory at %p (%zu bytes) is not page-aligned", data, bytes);
    return nullptr;
  }
  if (bytes > max_mr_bytes_) {
    *why = strFormat("%zu bytes exceed the device's largest registration (max_mr_size %llu)", bytes,
                     static_cast<unsigned long long>(max_mr_bytes_));
    return nullptr;
  }
  ibv_mr* mr = nullptr;
  if (dmabuf_fd >= 0) {
    if (api_.reg_dmabuf_mr == nullptr) {
      *why = "ibv_reg_dmabuf_mr is missing from " + api_.library + " (rdma-core 34 or newer has it)";
      return nullptr;
    }
    // iova = the device address: work requests name the memory by it, as for host memory.
    mr = api_.reg_dmabuf_mr(pd_, dmabuf_offset, bytes, static_cast<uint64_t>(start), dmabuf_fd, kAccessRemote);
    if (mr == nullptr) {
      const int err = errno;
      *why = strFormat("ibv_reg_dmabuf_mr on %s failed: %s%s", port_.device.c_str(), std::strerror(err),
                       err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT
                           ? " (the RDMA driver does not take dma-bufs)"
                           : "");
      return nullptr;
    }
  } else {
    mr = api_.reg_mr(pd_, data, bytes, kAccessRemote);
    if (mr == nullptr) {
      const int err = errno;
      *why = strFormat("ibv_reg_mr of device memory on %s failed: %s (needs the nvidia-peermem module)",
                       port_.device.c_str(), std::strerror(err));
      return nullptr;
    }
  }
  return mr_cache_->adopt(start, start + bytes, mr, mr->lkey, mr->rkey);
}

void VerbsTransport::deregisterMemory(MemoryHandle handle) {
  if (handle != nullptr) mr_cache_->release(static_cast<MrCache::Entry*>(handle));
}

void VerbsTransport::invalidateMemory(const void* data, size_t bytes) { mr_cache_->invalidate(data, bytes); }

bool VerbsTransport::acquireMemory(VerbsRequest* r, bool writable) {
  if (r->bytes == 0) return true;
  std::string why;
  r->mr = mr_cache_->acquire(r->data, r->bytes, writable, &why);
  if (r->mr != nullptr) return true;
  TransportFailure f{ErrorKind::kGeneric, why};
  finish(r, Request::State::kFailed, &f);
  return false;
}

void VerbsTransport::releaseRegistration(VerbsRequest* r) {
  if (r->mr != nullptr) {  // the NIC is done with the memory
    mr_cache_->release(r->mr);
    r->mr = nullptr;
  }
}

}  // namespace rcoll
