// The key-value store used for rendezvous.
//
// The caller supplies it: torch's Store (wrapped by the bindings), or rcoll's own
// TCP store (tcp_store.h) for use without torch. The communicator only needs these
// three calls; keys are namespaced by the communicator ("rcoll/<name>/...").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rcoll {

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;

  // Blocks until `key` exists, then returns its value. Throws RcollError
  // (kTimeout) naming the key if it does not appear within `timeout`.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (missing = 0) and
  // returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

}  // namespace rcoll
