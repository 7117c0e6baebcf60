// An agreement and a small allreduce in one collective, for front ends that
// negotiate their ops before running them (Horovod's response cache).
//
// A negotiating front end agrees on which of its ops every rank has ready
// (a bitwise AND of one bit vector per rank) and only then runs them: two
// rounds, so a synchronous small op costs twice the latency of the op alone.
// Here every rank also hands in the op it expects to run (a tag: the index of
// its bit) with that op's input, and the ranks gather (bit vector, tag,
// input) from each other in one allgather. Every rank then sees the same
// records, so every rank decides the same thing without another message:
//
//   - `agreed` is the AND of the vectors, as the agreement alone would give;
//   - when every rank handed in the same tag t >= 0 and bit t of `agreed`'s
//     candidate bits is set, the op was ready everywhere and its inputs are
//     all here: `out` becomes their reduction, folded in rank order (so it is
//     the same on every rank), and the front end does not run the op again.
//
// Any other outcome leaves `out` alone and the front end runs what `agreed`
// says as before. The inputs are small (at most `payload_capacity` bytes,
// the same on every rank, or the allgather's sizes differ and the core
// reports the mismatch), so gathering them all costs no more than the
// agreement's own round, as long as the allgather takes as few steps: on one
// host the shared-memory windows, between hosts Bruck's log2(P) steps, which
// it takes while the gathered records fit RCOLL_ALLREDUCE_RD_BYTES. Past that
// (a ring of P - 1 steps) the round is the agreement alone, a bitwise-and
// allreduce, and folds nothing; every rank decides this alike.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace rcoll {

class Communicator;

struct AgreedReduceArgs {
  const uint8_t* offer = nullptr;  // this rank's vector: a header, then one bit per candidate (little-endian)
  uint8_t* agreed = nullptr;       // out: the AND of every rank's vector (offer_bytes)
  size_t offer_bytes = 0;
  size_t candidates_at = 0;  // the byte where the candidate bits start (the header before it is ANDed only)
  int64_t tag = -1;          // the candidate whose input this rank hands in; -1 for none
  const void* input = nullptr;
  void* out = nullptr;  // may be `input`: it is read before anything is written
  size_t count = 0;     // elements of `input` and `out`
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  size_t payload_capacity = 0;  // bytes set aside per rank for an input; the same on every rank
  bool agreement_only = false;  // the agreement alone, whatever the communicator (tests)
  std::chrono::milliseconds timeout{0};
};

// Blocking (the caller's thread runs the allgather, as a blocking host op).
// Returns true when `out` holds the reduction. Throws the collective's errors.
// An input one rank cannot hand in (over the capacity, a tag beyond the
// candidate bits, an unsupported dtype and op) travels as a refusal, so every
// rank throws an InvalidArgument (naming that rank), none waits for it; so do
// inputs of different sizes, dtypes or ops under one tag. A capacity of 0 is
// the agreement alone.
bool agreeAndReduce(Communicator& comm, const AgreedReduceArgs& args);

}  // namespace rcoll
