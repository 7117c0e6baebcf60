// How the algorithms cut a buffer: into nearly equal blocks, and blocks into
// pipeline segments. Every rank computes the same cut from the same numbers,
// so nothing about it travels.
#pragma once

#include <algorithm>
#include <cstddef>

namespace rcoll {

// Block b of `count` elements cut into P nearly equal blocks: the first
// count % P blocks hold one element more. Blocks may be empty.
struct Blocks {
  size_t base;
  size_t rem;
  Blocks(size_t count, int parts) : base(count / static_cast<size_t>(parts)), rem(count % static_cast<size_t>(parts)) {}
  size_t start(int b) const { return static_cast<size_t>(b) * base + std::min<size_t>(static_cast<size_t>(b), rem); }
  size_t length(int b) const { return base + (static_cast<size_t>(b) < rem ? 1 : 0); }
};

// Segments of `len` elements cut `seg` at a time: segment k is [seg * k, min(seg * (k + 1), len)).
inline size_t numSegments(size_t len, size_t seg) { return (len + seg - 1) / seg; }

}  // namespace rcoll
