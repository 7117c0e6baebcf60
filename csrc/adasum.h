// Adasum, Horovod's adaptive summation, as a collective on host buffers.
//
// Two vectors a and b combine as
//
//     adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
//
// (a side whose squared norm is below sqrt(DBL_MIN) enters with coefficient
// 1: adasum_math.h), which is the sum for orthogonal vectors and the average
// for equal ones. P = 2^k ranks combine along a binary tree over the rank
// order, as Horovod's vector-halving distance-doubling (VHDD) pairs them:
// adasum(adasum(x0, x1), adasum(x2, x3)) for four ranks, every rank ending with
// the same result. A world that is not a power of two is refused, as Horovod
// refuses it ("Running Adasum with non-power of 2 ranks is not supported").
//
// Level l (distance d = 2^l) pairs rank r with r ^ d. Both hold the same part
// of the buffer (their lower bits are equal, so every earlier level cut it the
// same way); the lower one keeps the first floor(n/2) elements, the upper one
// the last ceil(n/2) (Horovod's cut: any count, even smaller than P, splits),
// and each sends the other the part it gives away. A rank then holds its half
// of A (the combined vector of its side's d ranks) and of B (the other side's).
// A.B, |A|^2 and |B|^2 are sums over the whole buffer, which at this level is
// spread over the 2d ranks r & ~(2d - 1) ... r | (2d - 1): each computes the
// three partial sums of its half and that group adds them up, then each
// combines its half. After the last level every rank holds 1/P of the result;
// the halves travel back level by level, largest distance first, so that
// every rank ends with the whole buffer.
//
// Why not one schedule (planOp, op_table.h): a schedule is a fixed list of
// transfers and element-wise reductions with one reduce op. Adasum's elements
// can only be combined once scalars summed over several ranks are known, and
// the next level sends what that combination wrote. So the op runs as a
// sequence of schedules on the communicator's executor, with the local steps
// between them: per level, (1) swap halves with the partner, (2) the partial
// sums, (3) gather the partial sums of the level's group, (4) combine; then one
// schedule brings the halves back. Every message still carries the op's own
// header (kind, dtype, count, sequence number), so a rank that called something
// else is named as for any collective, and the whole op has one deadline and
// obeys the communicator's abort. Point-to-point messages would have neither:
// they run outside the collective order, under the user's tags.
#pragma once

#include <functional>
#include <string>

#include "algorithms.h"
#include "dtype.h"
#include "local_memory.h"
#include "schedule.h"
#include "wire.h"

namespace rcoll {

// "" when Adasum can run on `dtype` in a world of `size` ranks, else why not
// (for checkOpArgs, which names the rank and the op).
std::string adasumUnsupportedReason(DataType dtype, int size);

// Runs one schedule to completion, or throws (the executor's errors: peer,
// mismatch, timeout, abort).
using ScheduleRunner = std::function<void(const Schedule&)>;

// Runs this rank's part of an Adasum of `desc.count` elements: `send` (which
// may equal `recv`) in, the result in `recv` on every rank. Each schedule is
// built into `schedule` and handed to `run`; between them the local steps run
// on host memory (`memory` lends the scratch: the partner's half and the
// group's partial sums). A world of one copies and runs nothing. Returns what
// ran, for the timeline.
const char* runAdasum(const OpDesc& desc, const AlgorithmContext& ctx, const char* send, char* recv, HostMemory& memory,
                      Schedule& schedule, const ScheduleRunner& run);

}  // namespace rcoll
