// The life of a message request, the same in every transport (TCP, shared
// memory, verbs):
//
//   take()      isend/irecv: a recycled request, reset, with the message's fields
//   finish()    the transport: done, or failed with why; once (later calls change nothing)
//   release()   the caller: it will not look at the request again
//   holds       the transport: references it keeps past finish (verbs: work
//               requests the NIC has not completed), which keep the request
//               and its resources from being reused
//
// A request is recycled once it is final, released and unheld, in whichever
// order those come: a request the caller dropped while it was still queued
// on a connection (its op failed or was abandoned) is not handed out again
// until it leaves that queue. Requests live as long as the transport and are
// reused, so steady-state traffic allocates nothing.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#include "transport.h"
#include "wire.h"

namespace rcoll {

struct MessageRequest : Request {
  bool is_send = false;
  WireHeader header{};  // send: what goes out; recv: what is expected
  char* data = nullptr;
  size_t bytes = 0;
  TransportFailure why;   // when failed
  bool released = false;  // the caller let go
  int holds = 0;          // the transport's references past finish
};

template <typename R>
class RequestLifecycle {
 public:
  // Called once a request is final and unheld, before it may be recycled: what
  // the transport frees then (verbs: the memory registration).
  using OnQuiet = std::function<void(R*)>;
  explicit RequestLifecycle(OnQuiet on_quiet = nullptr) : on_quiet_(std::move(on_quiet)) {}

  R* take(bool is_send, int peer, const WireHeader& header, const void* data, size_t bytes) {
    static_assert(std::is_base_of<MessageRequest, R>::value, "requests derive from MessageRequest");
    if (free_.empty()) {
      all_.push_back(std::make_unique<R>());
      free_.push_back(all_.back().get());
    }
    R* r = free_.back();
    free_.pop_back();
    *r = R();
    r->is_send = is_send;
    r->peer = peer;
    r->header = header;
    r->data = static_cast<char*>(const_cast<void*>(data));
    r->bytes = bytes;
    return r;
  }

  // Returns false (and changes nothing) when the request was final already.
  bool finish(R* r, Request::State state, const TransportFailure* why) {
    if (r->state != Request::State::kPending) return false;
    r->state = state;
    if (why != nullptr) r->why = *why;
    settle(r);
    return true;
  }

  void release(Request* request) {
    R* r = static_cast<R*>(request);
    r->released = true;
    settle(r);
  }

  TransportFailure failure(Request* request) const { return static_cast<R*>(request)->why; }

  // After the transport dropped a hold: recycles the request if nothing keeps it.
  void settle(R* r) {
    if (r->holds > 0 || r->state == Request::State::kPending) return;
    if (on_quiet_) on_quiet_(r);
    if (r->released) {
      r->released = false;
      free_.push_back(r);
    }
  }

 private:
  OnQuiet on_quiet_;
  std::vector<std::unique_ptr<R>> all_;  // owns every request ever made
  std::vector<R*> free_;
};

}  // namespace rcoll
