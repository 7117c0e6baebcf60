// The requests of one transport, recycled instead of allocated per message.
//
// Every transport hands out Request pointers that the caller keeps until it
// releases them, and a request may outlive its release while the connection
// still holds it (each transport decides when it is truly free). So requests
// live as long as the transport and a freed one is reused, reset to its
// default state: steady-state traffic allocates nothing.
#pragma once

#include <memory>
#include <vector>

namespace rcoll {

template <typename R>
class RequestPool {
 public:
  // A request in its default state, peer and all.
  R* take() {
    if (free_.empty()) {
      all_.push_back(std::make_unique<R>());
      free_.push_back(all_.back().get());
    }
    R* r = free_.back();
    free_.pop_back();
    *r = R();
    return r;
  }
  // `r` is no longer referenced by the caller nor by any connection.
  void recycle(R* r) { free_.push_back(r); }

 private:
  std::vector<std::unique_ptr<R>> all_;  // owns every request ever made
  std::vector<R*> free_;
};

}  // namespace rcoll
