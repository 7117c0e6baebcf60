// The shared window of one rank: memory it writes and every rank on its host reads.
//
// Each rank of a shared-memory transport owns one window (a sealed memfd,
// handed to every shm peer during the pair set-up, shm_setup.h), so with all
// ranks on one host every rank maps every rank's window. That is what the
// shared-memory collectives (shm_collectives.h) need: a rank publishes its
// input once, and each peer reads (and reduces) it straight from there,
// instead of one copy per ring hop through the pair rings.
//
//   page 0   WindowControl: identity, the rank's progress counters (each on
//            its own cache line), its sleep word, its announced op
//   slot 0   slot_bytes
//   slot 1   slot_bytes
//
// Device (GPU) buffers take the same steps and counters, with the data in a
// device window of each rank instead (CUDA IPC: cuda_ipc/cuda_ipc_collectives.h); the
// control page carries its handle.
//
// Only the owner writes its window; peers only read it. Progress is counted
// in *steps* (one step moves at most one slot of data; an op takes one or
// more), numbered 1, 2, ... identically on every rank because every rank runs
// the same ops in the same order. Step t uses slot t % 2, so a rank may fill
// the next slot while its peers still read the previous one.
//
// Sleeping: a waiter stores 1 in its own `sleeping` word, then loads the
// counter it waits for; a publisher stores its counter, then loads every
// peer's `sleeping` word and rings the doorbell (eventfd) of those that sleep.
// All four accesses are seq_cst (Dekker, as in shm_ring.h), so a wake-up is
// never lost and the fast path costs no system call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "device_api.h"
#include "shm/shm_ring.h"

namespace rcoll {
namespace shm {

constexpr uint64_t kWindowMagic = 0x314e57444c4f4352ull;  // "RCOLDWN1"
constexpr uint32_t kWindowVersion = 2;                    // 2: StepDesc.memory, the device window fields
constexpr size_t kWindowControlBytes = 4096;
constexpr size_t kMinWindowSlotBytes = 4096;
constexpr size_t kMaxWindowSlotBytes = size_t{1} << 30;

// What a rank runs in a step: checked by every peer before it reads the slot,
// so ranks that called different collectives fail with a mismatch, not garbage.
struct StepDesc {
  uint64_t seq;    // the op's sequence number
  uint64_t count;  // the op's element count (not the step's)
  uint32_t kind;   // OpKind
  uint32_t dtype;  // DataType
  uint32_t reduce_op;
  uint32_t root;
  uint32_t memory;  // kHostMemory or kDeviceMemory: where this rank's buffers live
  uint32_t pad;
};
constexpr uint32_t kHostMemory = 0;
constexpr uint32_t kDeviceMemory = 1;

// device_published / device_opened values.
constexpr uint64_t kDeviceNotYet = 0;
constexpr uint64_t kDeviceOk = 1;
constexpr uint64_t kDeviceFailed = 2;

struct WindowControl {
  // Written by the owner before any peer maps the window; read-only after.
  alignas(64) uint64_t magic;
  uint32_t version;
  uint32_t rank;
  uint64_t slot_bytes;
  // Progress, in steps: the owner's slot of step t holds its data (arrived),
  // its share of step t's result is in its slot (reduced), it has read all
  // it needs of step t from every window (finished: step t's slots may be reused).
  SharedIndex arrived;
  SharedIndex reduced;
  SharedIndex finished;
  SleepWord sleeping;  // 1 while the owner sleeps waiting on a peer's counter
  // seq << 8 | OpKind of the op the owner runs now (any op, not only those that
  // use the windows): a peer that waits in vain for this rank sees the mismatch.
  SharedIndex current_op;
  // desc[t % 2]: the op of step t, written before `arrived` is published.
  alignas(64) StepDesc desc[2];
  // The owner's *device* window (CUDA IPC, cuda_ipc/cuda_ipc_collectives.h), set up at
  // the first device op the windows carry: its two device slots of
  // device_slot_bytes, exported as ipc_handle. device_published says whether
  // the handle is valid (written before it), device_opened whether the owner
  // mapped every peer's device window; both kDeviceNotYet/Ok/Failed.
  SharedIndex device_published;
  SharedIndex device_opened;
  alignas(64) uint64_t device_slot_bytes;
  int64_t device;                         // the owner's ordinal (its own numbering: for messages)
  char device_id[RCOLL_DEVICE_ID_BYTES];  // the GPU's identity on the host (PCI bus id)
  unsigned char ipc_handle[RCOLL_IPC_HANDLE_BYTES];
};
static_assert(sizeof(WindowControl) <= kWindowControlBytes, "the window control block fits page 0");

inline size_t windowBytes(size_t slot_bytes) { return kWindowControlBytes + 2 * slot_bytes; }
inline char* windowSlot(char* base, uint64_t step, size_t slot_bytes) {
  return base + kWindowControlBytes + static_cast<size_t>(step % 2) * slot_bytes;
}
inline WindowControl* windowControl(char* base) { return reinterpret_cast<WindowControl*>(base); }

}  // namespace shm
}  // namespace rcoll
