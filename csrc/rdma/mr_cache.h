// Memory-registration cache.
//
// Registering memory pins its pages and programs the NIC's translation table:
// tens of microseconds per call and more per megabyte, far too slow to do for
// every segment of every collective. A training loop hands the same gradient
// buckets to every step, so registrations are kept and reused (NCCL's
// net_ib/reg.cc keeps them per page range too).
//
// Entries cover whole pages, are reference counted while a transfer uses them,
// and stay registered when unused until `keep_bytes` of unused registrations
// accumulate (then the least recently used go). A cached registration must
// never outlive the memory it maps: freed and re-allocated memory at the same
// address is other pages, and the NIC would read or write the old ones. So the
// owner of the memory calls invalidate() when it frees it (the Python layer
// does it from a finalizer of the array or tensor that owns the buffer); an
// entry in use at that moment is dropped as soon as its transfer ends.
//
// The cache knows nothing of verbs: registering and deregistering are given as
// functions, so the same logic is unit-tested without an RDMA device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <string>

namespace rcoll {

class MrCache {
 public:
  struct Entry {
    uintptr_t start = 0;  // page-aligned
    uintptr_t end = 0;
    bool writable = false;   // registered for local and remote writes
    void* handle = nullptr;  // what the register function returned (an ibv_mr*)
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    int refs = 0;
    bool stale = false;    // invalidated while in use: deregister on last release
    bool adopted = false;  // registered by its owner (adopt()): deregistered on last release
  };
  // Fills handle/lkey/rkey of `entry` (start, end, writable set); false with *why on failure.
  using RegisterFn = std::function<bool(Entry& entry, std::string* why)>;
  using DeregisterFn = std::function<void(Entry& entry)>;

  MrCache(RegisterFn reg, DeregisterFn dereg, size_t keep_bytes);
  ~MrCache();  // deregisters everything
  MrCache(const MrCache&) = delete;
  MrCache& operator=(const MrCache&) = delete;

  // A registration covering [addr, addr + bytes) (writable if asked), with a
  // reference taken; null with *why when registration failed.
  Entry* acquire(const void* addr, size_t bytes, bool writable, std::string* why);
  void release(Entry* entry);
  // A registration made outside the cache (device memory: a dma-buf, or a
  // peer-memory address) for [start, end), with the owner's reference taken.
  // acquire() of ranges inside it hit it; it is deregistered (dereg) when the
  // last reference goes, never kept: the owner frees the memory right after.
  Entry* adopt(uintptr_t start, uintptr_t end, void* handle, uint32_t lkey, uint32_t rkey);
  // Thread-safe: the memory [addr, addr + bytes) is being freed.
  void invalidate(const void* addr, size_t bytes);

  struct Stats {
    uint64_t hits = 0, misses = 0, evictions = 0, invalidations = 0;
    size_t entries = 0, registered_bytes = 0;
  };
  Stats stats() const;

 private:
  void drop(std::list<Entry>::iterator it);  // deregister and erase (lock held)
  void trim();                               // evict unused entries beyond keep_bytes_ (lock held)

  RegisterFn reg_;
  DeregisterFn dereg_;
  size_t keep_bytes_;
  size_t page_;
  mutable std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first; entries are few (buffers, not segments)
  Stats stats_;
};

}  // namespace rcoll
