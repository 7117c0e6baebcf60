// The kinds of op a communicator runs, and what each kind is: whether it
// reduces, has a root, which buffers it touches, and which paths can carry it.
// One row per collective; the wire header (wire.h), the argument checks
// (op_table.h), the route chooser (op_route.h) and the Python front ends (the
// bindings publish the table as rcoll._core.OPS) all read these rows.
//
// The numeric values travel in the wire header, so they are part of the
// protocol: append, never renumber.
#pragma once

#include <cstdint>

namespace rcoll {

enum class OpKind : uint8_t {
  kAllreduce = 1,
  kAllgather = 2,
  kBroadcast = 3,
  kReduceScatter = 4,
  kBarrier = 5,
  kReduce = 6,
  kGather = 7,
  kScatter = 8,
  kAllToAll = 9,       // alltoallv; the equal split is the same op with equal counts
  kPointToPoint = 10,  // send/recv: root = tag, seq = the message's number between the two ranks
  kAdasum = 11,        // Horovod's adaptive summation (adasum.h)
  kAbort = 100,        // control: "I failed; here is why" (payload = UTF-8 message)
};
// "allreduce", "reduce_scatter", ...: the names users and the Python layer use.
const char* opKindName(OpKind kind);

// Which ranks must pass a buffer (when count > 0).
enum class BufferUse : uint8_t { kNone, kEveryRank, kRootOnly };

struct OpTraits {
  OpKind kind;
  bool reduces;          // takes a reduce op, checked against the dtype
  bool rooted;           // takes a root
  bool per_rank_blocks;  // one of its buffers holds size x count elements
  BufferUse send;
  BufferUse recv;
  bool on_device;          // runs on device buffers
  bool host_windows;       // the shared host windows carry it (shm/shm_collectives.h)
  bool device_windows;     // the device windows carry it (cuda_ipc/cuda_ipc_collectives.h), alone or over hosts
  const char* trace_name;  // torch's name for it, which the flight recorder's dumps use (flight_recorder.h)
};

// Every collective's row, in OpKind order.
const OpTraits* opTraitsTable(int* rows);
// The row of a collective, or null for kinds that are not collectives (p2p, abort).
const OpTraits* findOpTraits(OpKind kind);
// The row of a collective; throws InvalidArgument for kinds that are not.
const OpTraits& opTraits(OpKind kind);

}  // namespace rcoll
