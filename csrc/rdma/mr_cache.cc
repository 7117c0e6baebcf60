#include "rdma/mr_cache.h"

#include <unistd.h>

namespace rcoll {

MrCache::MrCache(RegisterFn reg, DeregisterFn dereg, size_t keep_bytes)
    : reg_(std::move(reg)),
      dereg_(std::move(dereg)),
      keep_bytes_(keep_bytes),
      page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {}

MrCache::~MrCache() {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!entries_.empty()) drop(entries_.begin());
}

MrCache::Entry* MrCache::acquire(const void* addr, size_t bytes, bool writable, std::string* why) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr) & ~(page_ - 1);
  const uintptr_t b = (reinterpret_cast<uintptr_t>(addr) + bytes + page_ - 1) & ~(page_ - 1);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!it->stale && it->start <= a && it->end >= b && (it->writable || !writable)) {
      entries_.splice(entries_.begin(), entries_, it);  // most recently used first
      ++stats_.hits;
      ++entries_.front().refs;
      return &entries_.front();
    }
  }
  Entry e;
  e.start = a;
  e.end = b;
  e.writable = writable;
  if (!reg_(e, why)) return nullptr;
  ++stats_.misses;
  stats_.registered_bytes += b - a;
  e.refs = 1;
  entries_.push_front(e);
  Entry* out = &entries_.front();
  trim();
  return out;
}

MrCache::Entry* MrCache::adopt(uintptr_t start, uintptr_t end, void* handle, uint32_t lkey, uint32_t rkey) {
  Entry e;
  e.start = start;
  e.end = end;
  e.writable = true;
  e.handle = handle;
  e.lkey = lkey;
  e.rkey = rkey;
  e.refs = 1;
  e.adopted = true;
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.registered_bytes += end - start;
  entries_.push_front(e);
  return &entries_.front();
}

void MrCache::release(Entry* entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  --entry->refs;
  if (entry->refs == 0 && (entry->stale || entry->adopted)) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (&*it == entry) {
        drop(it);
        break;
      }
    }
    return;
  }
  trim();
}

void MrCache::invalidate(const void* addr, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t b = a + bytes;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->start < b && a < it->end && !it->stale) {  // overlaps the freed range
      ++stats_.invalidations;
      if (it->refs == 0) {
        drop(it);
      } else {
        it->stale = true;
      }
    }
    it = next;
  }
}

void MrCache::drop(std::list<Entry>::iterator it) {
  dereg_(*it);
  stats_.registered_bytes -= it->end - it->start;
  entries_.erase(it);
}

void MrCache::trim() {
  size_t unused = 0;
  for (const Entry& e : entries_) {
    if (e.refs == 0) unused += e.end - e.start;
  }
  // Least recently used at the back.
  for (auto it = entries_.end(); unused > keep_bytes_ && it != entries_.begin();) {
    --it;
    if (it->refs != 0) continue;
    unused -= it->end - it->start;
    ++stats_.evictions;
    dereg_(*it);
    stats_.registered_bytes -= it->end - it->start;
    it = entries_.erase(it);  // the next (newer) entry; the loop steps back from it
  }
}

MrCache::Stats MrCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = stats_;
  s.entries = entries_.size();
  return s;
}

}  // namespace rcoll
