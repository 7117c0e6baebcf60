// A rendezvous store implemented in Python: torch.distributed's Store, or any
// object with set(key, bytes), get(key) -> bytes (blocking until the key
// exists) and add(key, int) -> int. An optional wait([keys], timedelta) bounds
// the wait. The communicator calls it from its constructor, with the GIL
// released, so each call takes the GIL back.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "store.h"

namespace rcoll::python {

class PythonStore : public Store {
 public:
  explicit PythonStore(pybind11::object store) : store_(std::move(store)) {}
  ~PythonStore() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;

 private:
  pybind11::object store_;
};

}  // namespace rcoll::python
