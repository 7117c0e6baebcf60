// Checks the CUDA kernels without a GPU: runs their loops (elementwise.cuh)
// with their dtype x op table (reduce_table.cuh) on the CPU, one emulated GPU
// thread after another, and compares every result bit for bit with the CPU
// kernels (csrc/reduce_kernels.cc). Only NaN payloads may differ.
//
// What this covers: the head / 16-byte pack / tail split for every offset,
// the grid-stride loops for several grid sizes, in-place operation, and the
// element semantics (wrapping, float16/bfloat16 rounding, NaN, bool). What it
// cannot: the device compiler's code generation and the launches themselves;
// tests/device/test_cuda.py checks those against torch on a GPU.
//
// Built and run by tests/device/test_cuda.py, from the repository root:
//   nvcc -std=c++17 -Icsrc -Icsrc/cuda csrc/cuda/host_check/kernels_on_host.cu
//        csrc/reduce_kernels.cc csrc/dtype.cc csrc/error.cc -o kernels_on_host
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "dtype.h"
#include "elementwise.cuh"
#include "reduce_kernels.h"
#include "reduce_table.cuh"

using namespace rcoll;
using namespace rcoll::cuda;

namespace {

const size_t kSizes[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 127, 1000, 4099};
const size_t kThreads[] = {1, 3, 256};  // emulated grid sizes: 1 and 3 force many grid strides
constexpr size_t kSlack = 64;           // bytes of room for offsets at either end of a buffer

// A 64-byte aligned byte buffer, so that element offsets give known alignments.
struct Buffer {
  std::vector<uint64_t> words;
  explicit Buffer(size_t bytes) : words((bytes + kSlack * 2) / 8 + 8) {}
  uint8_t* at(size_t byteOffset) { return reinterpret_cast<uint8_t*>(words.data()) + byteOffset; }
};

bool isNanBits(DataType dtype, const uint8_t* p) {
  switch (dtype) {
    case DataType::kFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return (v & 0x7fffu) > 0x7c00u;
    }
    case DataType::kBFloat16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return (v & 0x7fffu) > 0x7f80u;
    }
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, p, 4);
      return std::isnan(v);
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, p, 8);
      return std::isnan(v);
    }
    case DataType::kFloat8E4M3FN:
      return (p[0] & 0x7fu) == 0x7fu;
    case DataType::kFloat8E5M2:
      return (p[0] & 0x7fu) > 0x7cu;
    default:
      return false;
  }
}

// Index of the first element that differs (bits, or NaN-ness for floats), or -1.
long firstMismatch(DataType dtype, const uint8_t* got, const uint8_t* want, size_t count) {
  const size_t size = elementSize(dtype);
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* g = got + i * size;
    const uint8_t* w = want + i * size;
    if (std::memcmp(g, w, size) == 0) continue;
    if (isFloatingPoint(dtype) && isNanBits(dtype, g) && isNanBits(dtype, w)) continue;
    return static_cast<long>(i);
  }
  return -1;
}

std::string hexBytes(const uint8_t* p, size_t size) {
  std::string out;
  char part[4];
  for (size_t i = size; i-- > 0;) {
    std::snprintf(part, sizeof part, "%02x", p[i]);
    out += part;
  }
  return out;
}

// The split must cover [0, count) exactly, with short scalar ends when the
// buffers share their alignment and no packs when they do not.
bool splitIsSound(const Split& split, size_t count, size_t perPack, bool sameOffset) {
  if (split.count != count || split.head > count || split.tailStart > count) return false;
  if (split.head + split.packs * perPack != split.tailStart) return false;
  if (!sameOffset) return split.packs == 0;
  return split.head < perPack && count - split.tailStart < perPack;
}

struct Layout {
  const char* name;
  size_t out, a, b;  // element offsets; kAliasA/kAliasB: out is that input
};
constexpr size_t kAliasA = ~size_t{0};
constexpr size_t kAliasB = ~size_t{0} - 1;

std::vector<Layout> layoutsFor(size_t perPack) {
  std::vector<Layout> layouts;
  for (size_t k = 0; k <= perPack; ++k) layouts.push_back({"same offset", k, k, k});
  layouts.push_back({"mixed offsets", 0, 1, 2});
  layouts.push_back({"mixed offsets", 1, 0, 0});
  layouts.push_back({"mixed offsets", 0, 0, 1});
  layouts.push_back({"in place (out is a)", kAliasA, 1, 1});
  layouts.push_back({"in place (out is a)", kAliasA, 0, 3});
  layouts.push_back({"out is b", kAliasB, 0, 0});
  return layouts;
}

int g_failures = 0;
long g_cases = 0;

void checkReduce(DataType dtype, ReduceOp op, std::mt19937_64& rng) {
  const size_t size = elementSize(dtype);
  const size_t perPack = kPackBytes / size;
  const bool floating = isFloatingPoint(dtype);
  for (size_t count : kSizes) {
    const size_t bytes = count * size;
    std::vector<uint8_t> inA(bytes), inB(bytes);
    for (auto& v : inA) v = static_cast<uint8_t>(rng());  // every bit pattern: NaN, inf,
    for (auto& v : inB) v = static_cast<uint8_t>(rng());  // subnormals, bool bytes > 1
    std::vector<uint8_t> want(bytes);
    reduceInto(want.data(), inA.data(), inB.data(), count, dtype, op);

    for (const Layout& layout : layoutsFor(perPack)) {
      for (size_t threads : kThreads) {
        Buffer bufA(bytes), bufB(bytes), bufOut(bytes);
        uint8_t* a = bufA.at(kSlack + layout.a * size);
        uint8_t* b = bufB.at(kSlack + layout.b * size);
        if (bytes) std::memcpy(a, inA.data(), bytes);
        if (bytes) std::memcpy(b, inB.data(), bytes);
        uint8_t* out = layout.out == kAliasA ? a : layout.out == kAliasB ? b : bufOut.at(kSlack + layout.out * size);
        auto run = [&](auto type, auto f) {
          using T = typename decltype(type)::type;
          const Split split = splitForPacks(count, sizeof(T), {out, a, b});
          const bool same =
              reinterpret_cast<uintptr_t>(out) % kPackBytes == reinterpret_cast<uintptr_t>(a) % kPackBytes &&
              reinterpret_cast<uintptr_t>(a) % kPackBytes == reinterpret_cast<uintptr_t>(b) % kPackBytes;
          if (!splitIsSound(split, count, perPack, same)) return false;
          for (size_t t = 0; t < threads; ++t) {
            binaryRange<T>(t, threads, reinterpret_cast<T*>(out), reinterpret_cast<const T*>(a),
                           reinterpret_cast<const T*>(b), split, f);
          }
          return true;
        };
        const bool ran =
            floating ? visitFloatingReduce(dtype, op, run, false) : visitIntegralReduce(dtype, op, run, false);
        ++g_cases;
        const long bad = ran ? firstMismatch(dtype, out, want.data(), count) : -2;
        if (bad != -1) {
          if (++g_failures <= 20) {
            std::printf("FAIL reduce %s %s count=%zu layout=%s (%zd,%zd,%zd) threads=%zu: %s\n", dataTypeName(dtype),
                        reduceOpName(op), count, layout.name, static_cast<ssize_t>(layout.out),
                        static_cast<ssize_t>(layout.a), static_cast<ssize_t>(layout.b), threads,
                        bad == -2
                            ? "bad split or not in the table"
                            : ("element " + std::to_string(bad) + ": a=" + hexBytes(inA.data() + bad * size, size) +
                               " b=" + hexBytes(inB.data() + bad * size, size) + " got=" +
                               hexBytes(out + bad * size, size) + " want=" + hexBytes(want.data() + bad * size, size))
                                  .c_str());
          }
        }
      }
    }
  }
}

void checkScaleDivide(DataType dtype, std::mt19937_64& rng) {
  const size_t size = elementSize(dtype);
  const size_t perPack = kPackBytes / size;
  for (size_t divisor : {size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{1000}}) {
    for (size_t count : kSizes) {
      const size_t bytes = count * size;
      std::vector<uint8_t> in(bytes);
      for (auto& v : in) v = static_cast<uint8_t>(rng());
      std::vector<uint8_t> want(in);
      scaleDivide(want.data(), count, dtype, divisor);
      for (size_t offset = 0; offset <= perPack; ++offset) {
        for (size_t threads : kThreads) {
          Buffer buffer(bytes);
          uint8_t* p = buffer.at(kSlack + offset * size);
          if (bytes) std::memcpy(p, in.data(), bytes);
          auto run = [&](auto type, auto f) {
            using T = typename decltype(type)::type;
            const Split split = splitForPacks(count, sizeof(T), {p});
            if (!splitIsSound(split, count, perPack, true)) return false;
            for (size_t t = 0; t < threads; ++t) unaryRange<T>(t, threads, reinterpret_cast<T*>(p), split, f);
            return true;
          };
          ++g_cases;
          const long bad =
              visitScaleDivide(dtype, divisor, run, false) ? firstMismatch(dtype, p, want.data(), count) : -2;
          if (bad != -1 && ++g_failures <= 20) {
            std::printf("FAIL scale_divide %s /%zu count=%zu offset=%zu threads=%zu: element %ld\n",
                        dataTypeName(dtype), divisor, count, offset, threads, bad);
          }
        }
      }
    }
  }
}

// Every supported pair is in the table and every refused one is not.
void checkTableCoverage() {
  for (int d = 0; d < kNumDataTypes; ++d) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto dtype = static_cast<DataType>(d);
      const auto op = static_cast<ReduceOp>(o);
      auto found = [](auto, auto) { return true; };
      const bool inTable = isFloatingPoint(dtype) ? visitFloatingReduce(dtype, op, found, false)
                                                  : visitIntegralReduce(dtype, op, found, false);
      const bool supported = reduceUnsupportedReason(dtype, op).empty();
      ++g_cases;
      if (inTable != supported && ++g_failures <= 20) {
        std::printf("FAIL table: %s %s is %s but %s\n", dataTypeName(dtype), reduceOpName(op),
                    supported ? "supported" : "refused", inTable ? "in the table" : "missing");
      }
    }
  }
}

}  // namespace

int main() {
  std::mt19937_64 rng(20240601);
  checkTableCoverage();
  for (int d = 0; d < kNumDataTypes; ++d) {
    const auto dtype = static_cast<DataType>(d);
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto op = static_cast<ReduceOp>(o);
      if (reduceUnsupportedReason(dtype, op).empty()) checkReduce(dtype, op, rng);
    }
    if (isFloatingPoint(dtype)) checkScaleDivide(dtype, rng);
  }
  std::printf("%ld cases, %d failures\n", g_cases, g_failures);
  return g_failures == 0 ? 0 : 1;
}
