#include "local_memory.h"

#include <cstring>

#include "reduce_kernels.h"

namespace rcoll {

void HostMemory::copy(char* dst, const char* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memmove(dst, src, bytes);
}

void HostMemory::scaleDivide(char* buf, size_t count, DataType dtype, size_t divisor) {
  rcoll::scaleDivide(buf, count, dtype, divisor);
}

char* HostMemory::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

}  // namespace rcoll
