// The registration cache's bookkeeping (csrc/rdma/mr_cache.h), with counting
// register/deregister functions in place of the NIC: hits and misses, page
// rounding, reference counts, eviction beyond the byte budget, invalidation of
// freed memory (deferred while in use) and concurrent invalidation.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rdma/mr_cache.h"

using rcoll::MrCache;

static int failures = 0;
#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "%s:%d: CHECK(%s)\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                            \
    }                                                                        \
  } while (0)

struct FakeNic {
  int registered = 0, deregistered = 0;
  std::multiset<uintptr_t> live;  // start addresses of live registrations
  bool fail_next = false;
  MrCache make(size_t keep) {
    return MrCache(
        [this](MrCache::Entry& e, std::string* why) {
          if (fail_next) {
            fail_next = false;
            *why = "registration refused";
            return false;
          }
          ++registered;
          e.handle = reinterpret_cast<void*>(e.start);
          e.lkey = e.rkey = static_cast<uint32_t>(registered);
          live.insert(e.start);
          return true;
        },
        [this](MrCache::Entry& e) {
          ++deregistered;
          live.erase(live.find(e.start));
        },
        keep);
  }
};

int main() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<char> arena(64 * page);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(arena.data()) + page - 1) & ~(page - 1));
  std::string why;

  {  // hits, page rounding, containment
    FakeNic nic;
    MrCache cache = nic.make(size_t{1} << 30);
    MrCache::Entry* a = cache.acquire(base + 10, 3 * page, true, &why);
    CHECK(a != nullptr && a->start == reinterpret_cast<uintptr_t>(base) &&
          a->end == reinterpret_cast<uintptr_t>(base + 4 * page));
    MrCache::Entry* b = cache.acquire(base + page, 100, false, &why);  // inside a: a hit
    CHECK(b == a && nic.registered == 1 && a->refs == 2);
    cache.release(a);
    cache.release(b);
    CHECK(nic.deregistered == 0);  // kept for the next step
    CHECK(cache.acquire(base, 4 * page, true, &why) == a && nic.registered == 1);
    cache.release(a);
    MrCache::Entry* c = cache.acquire(base + 3 * page, 2 * page, true, &why);  // not contained: a new one
    CHECK(c != a && nic.registered == 2);
    cache.release(c);
    CHECK(cache.stats().hits == 2 && cache.stats().misses == 2);
  }
  {  // a read-only entry never serves a writable request
    FakeNic nic;
    MrCache cache = nic.make(size_t{1} << 30);
    MrCache::Entry* ro = cache.acquire(base, page, false, &why);
    CHECK(ro != nullptr && !ro->writable);
    MrCache::Entry* rw = cache.acquire(base, page, true, &why);
    CHECK(rw != ro && nic.registered == 2);
    cache.release(ro);
    cache.release(rw);
  }
  {  // budget 0: deregistered as soon as unused; failures are reported
    FakeNic nic;
    MrCache cache = nic.make(0);
    MrCache::Entry* e = cache.acquire(base, page, true, &why);
    cache.release(e);
    CHECK(nic.deregistered == 1 && nic.live.empty());
    nic.fail_next = true;
    CHECK(cache.acquire(base, page, true, &why) == nullptr && why == "registration refused");
  }
  {  // eviction of the least recently used beyond the budget
    FakeNic nic;
    MrCache cache = nic.make(2 * page);
    for (int i = 0; i < 4; ++i) cache.release(cache.acquire(base + i * 2 * page, page, true, &why));
    CHECK(nic.live.size() == 2);
    CHECK(nic.live.count(reinterpret_cast<uintptr_t>(base + 6 * page)) == 1);  // newest kept
    CHECK(cache.stats().evictions == 2);
  }
  {  // invalidation: at once when unused, after the transfer when in use
    FakeNic nic;
    MrCache cache = nic.make(size_t{1} << 30);
    cache.release(cache.acquire(base, 2 * page, true, &why));
    MrCache::Entry* busy = cache.acquire(base + 8 * page, 2 * page, true, &why);
    cache.invalidate(base + 100, 8);  // a few bytes inside the first: it goes
    CHECK(nic.live.size() == 1 && nic.deregistered == 1);
    cache.invalidate(base + 8 * page, page);
    CHECK(nic.live.size() == 1);  // still in use
    MrCache::Entry* again = cache.acquire(base + 8 * page, page, true, &why);
    CHECK(again != busy && nic.registered == 3);  // a stale entry is never handed out
    cache.release(busy);
    CHECK(nic.live.size() == 1 && nic.deregistered == 2);
    cache.release(again);
    cache.invalidate(base + 64 * page, page);  // nothing there: nothing happens
    CHECK(nic.live.size() == 1);
  }
  {  // adopted (device memory) registrations: hit by acquire, gone with the owner's release
    FakeNic nic;
    MrCache cache = nic.make(size_t{1} << 30);
    const uintptr_t start = reinterpret_cast<uintptr_t>(base + 16 * page);
    nic.live.insert(start);  // registered by its owner, outside the cache
    MrCache::Entry* owned = cache.adopt(start, start + 4 * page, nullptr, 7, 8);
    MrCache::Entry* use = cache.acquire(base + 17 * page + 5, page, true, &why);
    CHECK(use == owned && use->lkey == 7 && use->rkey == 8 && nic.registered == 0);
    cache.release(use);
    CHECK(nic.live.size() == 1);  // the owner still holds it
    cache.release(owned);
    CHECK(nic.live.empty() && nic.deregistered == 1);  // not kept: the memory is about to be freed
    CHECK(cache.stats().entries == 0 && cache.stats().registered_bytes == 0);
    MrCache::Entry* fresh = cache.acquire(base + 17 * page, page, true, &why);  // same address, new memory
    CHECK(fresh != nullptr && nic.registered == 1);
    cache.release(fresh);
  }
  {  // invalidate() from another thread while the owner acquires and releases
    FakeNic nic;
    MrCache cache = nic.make(size_t{1} << 30);
    std::thread freer([&] {
      for (int i = 0; i < 2000; ++i) cache.invalidate(base + (i % 16) * page, page);
    });
    for (int i = 0; i < 2000; ++i) {
      MrCache::Entry* e = cache.acquire(base + (i % 16) * page, page, true, &why);
      CHECK(e != nullptr);
      cache.release(e);
    }
    freer.join();
  }
  std::printf("%s\n", failures == 0 ? "mr_cache: all checks passed" : "mr_cache: FAILED");
  return failures == 0 ? 0 : 1;
}
