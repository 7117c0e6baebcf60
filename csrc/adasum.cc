#include "adasum.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "adasum_math.h"
#include "blocks.h"
#include "error.h"

namespace rcoll {

namespace {

// The partial sums one rank contributes at a level: a.b and the squared norms
// of the lower and the upper side, as doubles. They travel as raw bytes in
// messages of the op's dtype: 24 bytes are a whole number of elements of
// every type Adasum takes (12, 6 or 3).
constexpr size_t kSums = 3;
constexpr size_t kSumsBytes = kSums * sizeof(double);

// One level of the halving, as this rank sees it.
struct Level {
  int partner;  // rank ^ distance
  bool lower;   // rank & distance == 0: keeps the first half (Horovod's "left neighbour")
  // What this rank keeps and combines, [keep_lo, keep_lo + keep_n), and what
  // the partner keeps, [give_lo, give_lo + give_n): sent now, back at the end.
  size_t keep_lo, keep_n;
  size_t give_lo, give_n;
};

// Every level's cut for this rank. The part held before a level is [lo, lo +
// n); the lower rank keeps floor(n / 2) elements from lo, the upper one the
// ceil(n / 2) after them, as in Horovod. A part may be empty (count < size):
// its rank then sends or receives nothing at that level but still adds its
// (zero) partial sums.
std::vector<Level> halvings(int rank, int size, size_t count) {
  std::vector<Level> levels;
  size_t lo = 0, n = count;
  for (int distance = 1; distance < size; distance <<= 1) {
    const size_t first = n / 2, second = n - first;
    Level l;
    l.partner = rank ^ distance;
    l.lower = (rank & distance) == 0;
    if (l.lower) {
      l.keep_lo = lo, l.keep_n = first, l.give_lo = lo + first, l.give_n = second;
    } else {
      l.keep_lo = lo + first, l.keep_n = second, l.give_lo = lo, l.give_n = first;
    }
    levels.push_back(l);
    lo = l.keep_lo;
    n = l.keep_n;
  }
  return levels;
}

// Sends `n` elements at `data` to `peer`, headed with element offsets from
// `offset`, cut into segments as the other algorithms cut them (both ends
// compute the same cut from the same numbers). With `after_recv` >= 0 each
// segment waits for every receive up to that one: what it sends was received
// in an earlier round.
void appendSends(Schedule& s, const AlgorithmContext& ctx, int peer, const char* data, uint64_t offset, size_t n,
                 int after_recv) {
  const size_t seg = ctx.segmenter.segmentElems(n);
  for (size_t k = 0; k < numSegments(n, seg); ++k) {
    s.sends.push_back({peer, data + k * seg * s.elem_size, offset + k * seg, std::min(seg, n - k * seg), after_recv,
                       after_recv >= 0});
  }
}

// Receives `n` elements from `peer` straight into `dest` (nothing to reduce:
// the combination needs the whole level's sums first).
void appendRecvs(Schedule& s, const AlgorithmContext& ctx, int peer, char* dest, uint64_t offset, size_t n) {
  const size_t seg = ctx.segmenter.segmentElems(n);
  for (size_t k = 0; k < numSegments(n, seg); ++k) {
    s.recvs.push_back(
        {peer, offset + k * seg, std::min(seg, n - k * seg), dest + k * seg * s.elem_size, nullptr, nullptr, false});
  }
}

}  // namespace

std::string adasumUnsupportedReason(DataType dtype, int size) {
  if (!adasumTakes(dtype)) {
    return strFormat("dtype %s is not supported: Adasum takes float16, bfloat16, float32 or float64",
                     dataTypeName(dtype));
  }
  if (size < 1 || (size & (size - 1)) != 0) {
    return strFormat(
        "the world size %d is not a power of two: Adasum pairs rank r with rank r xor 2^k at every level, as "
        "Horovod does, which refuses such worlds too (run it on a group() of 2^k ranks)",
        size);
  }
  return "";
}

const char* runAdasum(const OpDesc& desc, const AlgorithmContext& ctx, const char* send, char* recv, HostMemory& memory,
                      Schedule& schedule, const ScheduleRunner& run) {
  const size_t es = elementSize(desc.dtype);
  const size_t count = desc.count;
  memory.copy(recv, send, count * es);  // in place in `recv` from here on
  if (ctx.size == 1) return "local";
  const std::vector<Level> levels = halvings(ctx.rank, ctx.size, count);

  // Scratch: the partial sums of every rank of a group (the last level's is
  // the world), then the partner's half, at most ceil(count / 2) elements (the
  // first level's). HostMemory's block is aligned for the doubles.
  const size_t sums_bytes = static_cast<size_t>(ctx.size) * kSumsBytes;
  char* area = memory.scratch(sums_bytes + (count - count / 2) * es);
  double* sums = reinterpret_cast<double*>(area);
  char* theirs = area + sums_bytes;
  // The sums travel at element offsets past the buffer's end (count + the
  // first sender's index in units of one rank's sums), so no header of theirs
  // looks like a data segment's.
  const size_t sums_elems = kSumsBytes / es;

  for (size_t i = 0; i < levels.size(); ++i) {
    const Level& l = levels[i];
    char* mine = recv + l.keep_lo * es;
    // (1) Swap halves: the partner's part of what we both hold, for ours.
    schedule.reset(desc, es);
    appendSends(schedule, ctx, l.partner, recv + l.give_lo * es, l.give_lo, l.give_n, -1);
    appendRecvs(schedule, ctx, l.partner, theirs, l.keep_lo, l.keep_n);
    run(schedule);

    // (2) This rank's partial sums, at its index in the level's group of 2d
    // ranks. Stored by side (lower, upper), not by whose they are, so that the
    // group adds like with like.
    const int group = 2 << i;
    const int index = ctx.rank & (group - 1);
    const DotAndNorms part = dotAndNorms(mine, theirs, l.keep_n, desc.dtype);
    double* own = sums + static_cast<size_t>(index) * kSums;
    own[0] = part.dot;
    own[1] = l.lower ? part.a_sq : part.b_sq;
    own[2] = l.lower ? part.b_sq : part.a_sq;

    // (3) Every partial sum of the group, gathered by recursive doubling: in
    // round m the rank holds the sums of the m ranks from index & ~(m - 1)
    // (its own, then what it received), sends them to rank ^ m and receives
    // that rank's m next to them.
    schedule.reset(desc, es);
    for (int m = 1; m < group; m <<= 1) {
      const size_t held = static_cast<size_t>(index & ~(m - 1));
      const size_t missing = held ^ static_cast<size_t>(m);
      const size_t n = static_cast<size_t>(m) * sums_elems;
      const int after = static_cast<int>(schedule.recvs.size()) - 1;
      appendSends(schedule, ctx, ctx.rank ^ m, reinterpret_cast<const char*>(sums + held * kSums),
                  count + held * sums_elems, n, after);
      appendRecvs(schedule, ctx, ctx.rank ^ m, reinterpret_cast<char*>(sums + missing * kSums),
                  count + missing * sums_elems, n);
    }
    run(schedule);

    // (4) Combine. Every rank of the group adds the same numbers in the same
    // (index) order, so both ranks of a pair use the same coefficients.
    double dot = 0, lower_sq = 0, upper_sq = 0;
    for (int j = 0; j < group; ++j) {
      const double* theirs_sums = sums + static_cast<size_t>(j) * kSums;
      dot += theirs_sums[0];
      lower_sq += theirs_sums[1];
      upper_sq += theirs_sums[2];
    }
    const double lower_coeff = adasumCoefficient(dot, lower_sq);
    const double upper_coeff = adasumCoefficient(dot, upper_sq);
    scaledAdd(mine, l.lower ? lower_coeff : upper_coeff, theirs, l.lower ? upper_coeff : lower_coeff, l.keep_n,
              desc.dtype);
  }

  // The halves back, largest distance first: before level l's round this rank
  // holds what it kept at level l (the rounds of the levels above gave back
  // the rest of it); it sends that to the partner and receives the part the
  // partner kept. A round forwards what earlier rounds received, so it waits
  // for all of them.
  schedule.reset(desc, es);
  for (size_t i = levels.size(); i-- > 0;) {
    const Level& l = levels[i];
    const int after = static_cast<int>(schedule.recvs.size()) - 1;
    appendSends(schedule, ctx, l.partner, recv + l.keep_lo * es, l.keep_lo, l.keep_n, after);
    appendRecvs(schedule, ctx, l.partner, recv + l.give_lo * es, l.give_lo, l.give_n);
  }
  run(schedule);
  return "vector halving, distance doubling";
}

}  // namespace rcoll
