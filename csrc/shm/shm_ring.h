// The shared segment of one pair of ranks: layout and byte-ring copies.
//
// One segment per pair, created by the rank that accepted the handshake (side
// 0) and mapped by the one that dialed (side 1):
//
//   page 0   SegmentControl: identity, then every shared index on its own
//            cache line (ring heads, ring tails, the two sleep words)
//   ring 0   side 0 -> side 1, ring_bytes
//   ring 1   side 1 -> side 0, ring_bytes
//
// Each ring is a single-producer single-consumer byte stream. head and tail
// count bytes since the start (they never wrap; 2^64 bytes is centuries at
// memory speed): the producer owns head, the consumer owns tail, head - tail is
// what is readable, ring_bytes - (head - tail) what is writable. The producer
// publishes with a store of head after copying, the consumer loads it (acquire)
// before copying out, and the same the other way for tail.
//
// The stream is a sequence of records: a 64-byte WireHeader, the payload, and
// padding up to the next multiple of 64. Padding keeps every header 64-aligned
// in the ring (ring_bytes is a multiple of 64), so a header is never split by
// the wrap and payload copies start cache-line aligned on the ring side.
// Padding bytes are never written or read, only counted.
//
// The sleep words: before a rank sleeps it stores, in each pair segment, what
// it waits for from that peer (kWantData: a receive is posted; kWantSpace: a
// send waits for room), then looks at the rings once more. A producer or
// consumer stores head or tail, then loads the peer's word. All four accesses
// are seq_cst, so they fall in one total order and both sides cannot miss each
// other (Dekker): a wake-up is never lost. (seq_cst operations rather than
// relaxed ones plus fences, because ThreadSanitizer does not model fences.)
// The fast path costs one locked store per publication (x86 xchg, ARM stlr)
// and one plain load, no system call. The wake-up is a write to the peer's eventfd.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rcoll {
namespace shm {

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared indices must be lock-free (address-free)");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared sleep words must be lock-free (address-free)");

constexpr uint64_t kSegmentMagic = 0x314d48534c4f4352ull;  // "RCOLSHM1"
constexpr uint32_t kSegmentVersion = 1;
constexpr size_t kControlBytes = 4096;  // page 0
constexpr size_t kRecordAlign = 64;
constexpr size_t kHeaderBytes = 64;  // sizeof(WireHeader), checked in shm_transport.cc
constexpr size_t kMinRingBytes = 4096;
constexpr size_t kMaxRingBytes = size_t{1} << 30;

// Sleep-word bits: what a sleeping rank wants from the peer of this segment.
constexpr uint32_t kWantData = 1;   // bytes in the ring towards it
constexpr uint32_t kWantSpace = 2;  // room in the ring from it

struct alignas(64) SharedIndex {
  std::atomic<uint64_t> value;
};
struct alignas(64) SleepWord {
  std::atomic<uint32_t> bits;
};

struct SegmentControl {
  // Written by the creator before the peer maps the segment; read-only after.
  alignas(64) uint64_t magic;
  uint32_t version;
  uint32_t creator_rank;
  uint64_t ring_bytes;
  uint64_t segment_bytes;
  SharedIndex head[2];    // ring r: bytes its producer (side r) has published
  SharedIndex tail[2];    // ring r: bytes its consumer (side 1 - r) has consumed
  SleepWord sleeping[2];  // side s: kWant* bits while side s sleeps, else 0
};
static_assert(sizeof(SegmentControl) <= kControlBytes, "the control block fits page 0");

inline size_t segmentBytes(size_t ring_bytes) { return kControlBytes + 2 * ring_bytes; }
inline char* ringData(char* base, int ring, size_t ring_bytes) {
  return base + kControlBytes + static_cast<size_t>(ring) * ring_bytes;
}

// Header + payload + padding to the next 64-byte boundary.
inline uint64_t recordBytes(uint64_t payload) {
  return (kHeaderBytes + payload + kRecordAlign - 1) / kRecordAlign * kRecordAlign;
}

// Copies `n` bytes into / out of the ring at stream position `pos`, wrapping.
inline void ringWrite(char* ring, size_t ring_bytes, uint64_t pos, const void* src, size_t n) {
  const size_t at = static_cast<size_t>(pos % ring_bytes);
  const size_t first = n < ring_bytes - at ? n : ring_bytes - at;
  std::memcpy(ring + at, src, first);
  if (first < n) std::memcpy(ring, static_cast<const char*>(src) + first, n - first);
}

inline void ringRead(const char* ring, size_t ring_bytes, uint64_t pos, void* dst, size_t n) {
  const size_t at = static_cast<size_t>(pos % ring_bytes);
  const size_t first = n < ring_bytes - at ? n : ring_bytes - at;
  std::memcpy(dst, ring + at, first);
  if (first < n) std::memcpy(static_cast<char*>(dst) + first, ring, n - first);
}

}  // namespace shm
}  // namespace rcoll
