// Where an op's local step runs: host memory, or a device's (the staging
// executor, device_staging_executor.h, is the device's LocalMemory). The
// algorithms' local steps (op_table.h's planOp) go through it, so one plan
// serves both.
#pragma once

#include <cstddef>
#include <vector>

#include "dtype.h"

namespace rcoll {

class LocalMemory {
 public:
  virtual ~LocalMemory() = default;
  // Ranges may overlap (callers pass views of one tensor); nothing happens when
  // dst == src or bytes == 0.
  virtual void copy(char* dst, const char* src, size_t bytes) = 0;
  virtual void scaleDivide(char* buf, size_t count, DataType dtype, size_t divisor) = 0;
  // A block of at least `bytes`, valid until the next call.
  virtual char* scratch(size_t bytes) = 0;
};

// Host memory: memmove, the CPU kernels and a scratch vector the owner keeps.
class HostMemory final : public LocalMemory {
 public:
  explicit HostMemory(std::vector<char>& scratch) : scratch_(scratch) {}
  void copy(char* dst, const char* src, size_t bytes) override;
  void scaleDivide(char* buf, size_t count, DataType dtype, size_t divisor) override;
  char* scratch(size_t bytes) override;

 private:
  std::vector<char>& scratch_;
};

}  // namespace rcoll
