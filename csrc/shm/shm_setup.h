// Setting up the shared memory of one pair of ranks, over their handshake socket.
//
// The handshake socket (peer_listener.h) is TCP, and file descriptors only
// travel over Unix sockets, so the set-up takes one detour:
//
//   1. The accepting rank (side 0) creates the segment: memfd_create
//      (MFD_CLOEXEC | MFD_ALLOW_SEALING), ftruncate, sealed against shrinking
//      and growing (so a peer cannot make our mapping SIGBUS), mmap, control
//      block initialised. It listens on an abstract-namespace Unix socket with
//      a random name (nothing in the file system, gone with the process) and
//      sends, on the authenticated TCP socket: the socket's name, a random
//      16-byte secret, the ring size and its host's boot id.
//   2. The dialing rank (side 1) checks the boot id (another host: a clear
//      refusal), connects to the Unix socket and sends the secret with its
//      doorbell eventfd (SCM_RIGHTS). Connections that do not present the
//      secret (another local user who read the name in /proc/net/unix) are
//      dropped with a WARN, as the TCP listener drops strangers.
//   3. Side 0 answers with the memfd and its own doorbell eventfd, then closes
//      the Unix sockets and the memfd. Side 1 checks the memfd's size and
//      seals, maps it, closes it and confirms on the TCP socket ("ready", or
//      a refusal with the reason, which side 0 raises).
//
// So a crash at any point leaves nothing behind: no name in /dev/shm or the
// file system, and the memory goes when the last mapping does. Everything
// blocks with the caller's deadline and throws RcollError naming the peer.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "socket_util.h"
#include "transport.h"

namespace rcoll {
namespace shm {

struct SegmentControl;

// A MAP_SHARED mapping of a pair segment, unmapped on destruction.
class Segment {
 public:
  Segment(char* base, size_t bytes, size_t ring_bytes) : base_(base), bytes_(bytes), ring_bytes_(ring_bytes) {}
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  char* base() const { return base_; }
  size_t ringBytes() const { return ring_bytes_; }
  SegmentControl* control() const { return reinterpret_cast<SegmentControl*>(base_); }

 private:
  char* base_;
  size_t bytes_;
  size_t ring_bytes_;
};

struct PairLink {
  std::unique_ptr<Segment> segment;
  std::unique_ptr<Segment> peer_window;  // the peer's shared window (shm_window.h); null when windows are off
  int side = 0;                          // 0: this rank created the segment (it accepted); 1: it mapped it (it dialed)
  int peer_doorbell = -1;                // the peer's eventfd, written to wake it; the caller owns (closes) it
};

// This rank's shared window, `window_bytes` long: the memfd (handed to each
// peer by the pair set-up, then closed by the caller) and its mapping, with
// the control block written.
struct OwnWindow {
  int fd = -1;
  std::unique_ptr<Segment> mapping;
};
OwnWindow createWindow(const ConnectInfo& info, size_t slot_bytes);

// Side 0, on a socket returned by PeerListener::accept. `my_doorbell` is this
// rank's eventfd (a duplicate goes to the peer; the caller keeps its own).
// `my_window` is this rank's window memfd, or -1 when windows are off; both
// ranks of a pair must agree on `window_bytes` (0: off), or the set-up fails.
PairLink createPair(const ConnectInfo& info, int peer, int sock, size_t ring_bytes, int my_doorbell, int my_window,
                    size_t window_bytes, Deadline deadline);

// Side 1, on a socket returned by dialPeer.
PairLink joinPair(const ConnectInfo& info, int peer, int sock, int my_doorbell, int my_window, size_t window_bytes,
                  Deadline deadline);

// What "the same host" means for shared memory: the kernel's boot id and this
// process's network namespace (the set-up's abstract Unix socket lives there),
// as "<boot id>/<netns device>:<netns inode>". Two ranks with equal non-empty
// keys can connect with ShmTransport; publish it beside the address to choose
// shm per peer. "" if it cannot be read (then do not use shm).
std::string hostKey();

}  // namespace shm
}  // namespace rcoll
