#include "emulated_device_api.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>

#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "dtype.h"
#include "reduce_kernels.h"

namespace rcoll {
namespace testing {
namespace {

thread_local std::string t_last_error;

int failWith(const std::string& message) {
  t_last_error = "emulated device: " + message;
  return 1;
}

// An event: the number of times it was recorded, and of records whose work
// finished. Shared with the tasks that refer to it: as in CUDA, an event may
// be destroyed while work queued on a stream still waits for it.
struct EventState {
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
};
struct Event {
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

// A stream: a worker thread running tasks in order, some after a random delay
// (one in 64 a millisecond, about one in 4 up to 60 microseconds, the rest
// none) so that two streams' events complete in an order nobody planned, and
// a copy the core forgot to wait for is often still running when it reads.
// Not every task sleeps: the suites issue hundreds of thousands of tasks, and a
// sleep for each (a timer and two context switches) made most of the device
// suites' system time. The thread's timer slack is 1 ns: Linux's default 50 us
// would more than double every short delay.
class Stream {
 public:
  Stream() : rng_(std::random_device{}()), thread_([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void push(std::function<void()> task, std::chrono::microseconds extra_delay = {}) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back({std::move(task), extra_delay});
    }
    cv_.notify_all();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    idle_cv_.wait(lock, [&] { return tasks_.empty() && !busy_; });
  }

 private:
  struct Task {
    std::function<void()> fn;
    std::chrono::microseconds extra_delay;
  };

  void loop() {
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stop_ and drained
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      const uint32_t draw = rng_() % 64;  // 0: a millisecond; 1-15: up to 60 us; else none
      const auto jitter = std::chrono::microseconds(draw == 0 ? 1000 : draw < 16 ? rng_() % 60 : 0);
      lock.unlock();
      if (jitter.count() + task.extra_delay.count() > 0) std::this_thread::sleep_for(jitter + task.extra_delay);
      task.fn();
      lock.lock();
      busy_ = false;
      if (tasks_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_, idle_cv_;
  std::deque<Task> tasks_;
  bool busy_ = false;
  bool stop_ = false;
  std::minstd_rand rng_;
  std::thread thread_;  // last: started once the members above exist
};

// Work on the default streams (0, and CUDA's special handles 1 = legacy and
// 2 = per-thread, which __cuda_array_interface__ may name) runs at once, as if
// they were always idle: tests that pass no stream need no worker.
bool isDefaultStream(void* stream) { return reinterpret_cast<uintptr_t>(stream) <= 2; }

void enqueue(void* stream, std::function<void()> task) {
  if (isDefaultStream(stream)) {
    task();
  } else {
    static_cast<Stream*>(stream)->push(std::move(task));
  }
}

int setDevice(int device) { return device == 0 ? 0 : failWith("only device 0 exists"); }
int pointerDevice(const void*, int* device) {
  *device = 0;
  return 0;
}
int streamCreate(int device, void** stream) {
  if (device != 0) return failWith("only device 0 exists");
  *stream = new Stream();
  return 0;
}
int streamDestroy(void* stream) {
  delete static_cast<Stream*>(stream);
  return 0;
}
int streamSynchronize(void* stream) {
  if (!isDefaultStream(stream)) static_cast<Stream*>(stream)->synchronize();
  return 0;
}
int allocAligned(size_t bytes, void** ptr) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *ptr != nullptr ? 0 : failWith("out of memory");
}
int freeMemory(void* ptr) {
  std::free(ptr);
  return 0;
}

// "Device" memory is a shared mapping of a memfd, so that another process can
// map it (ipc_open) as CUDA IPC maps a GPU block: the handle names the owner's
// pid and descriptor, opened through /proc/<pid>/fd (same user).
struct Mapping {
  int fd;  // -1: an imported mapping (ipc_open)
  size_t bytes;
};
std::mutex g_mappings_mutex;
std::unordered_map<void*, Mapping> g_mappings;

struct EmulatedIpcHandle {
  uint64_t magic;
  int64_t pid;
  int64_t fd;
  uint64_t bytes;
};
static_assert(sizeof(EmulatedIpcHandle) <= RCOLL_IPC_HANDLE_BYTES, "the handle fits");
constexpr uint64_t kIpcMagic = 0x4350494d45444352ull;  // "RCDEMIPC"

int deviceAlloc(int device, size_t bytes, void** ptr) {
  if (device != 0) return failWith("only device 0 exists");
  *ptr = nullptr;
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  // Sealed against shrinking: what /dev/udmabuf asks of a memfd before it
  // exports it as a dma-buf (dmabuf_export, the GPUDirect RDMA tests).
  const int fd = memfd_create("rcoll-emulated-device", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return failWith(std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    const int err = errno;
    close(fd);
    return failWith(std::string("ftruncate/F_ADD_SEALS: ") + std::strerror(err));
  }
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return failWith(std::string("mmap: ") + std::strerror(errno));
  }
  std::lock_guard<std::mutex> lock(g_mappings_mutex);
  g_mappings[p] = Mapping{fd, rounded};
  *ptr = p;
  return 0;
}
int unmap(void* ptr, bool imported) {
  Mapping m{};
  {
    std::lock_guard<std::mutex> lock(g_mappings_mutex);
    auto it = g_mappings.find(ptr);
    if (it == g_mappings.end() || (it->second.fd < 0) != imported) {
      return failWith(imported ? "ipc_close of an address ipc_open did not return"
                               : "device_free of an address device_alloc did not return");
    }
    m = it->second;
    g_mappings.erase(it);
  }
  munmap(ptr, m.bytes);
  if (m.fd >= 0) close(m.fd);
  return 0;
}
int deviceFree(void* ptr) { return unmap(ptr, false); }
int ipcHandle(void* ptr, void* handle) {
  EmulatedIpcHandle h{kIpcMagic, static_cast<int64_t>(getpid()), -1, 0};
  {
    std::lock_guard<std::mutex> lock(g_mappings_mutex);
    auto it = g_mappings.find(ptr);
    if (it == g_mappings.end() || it->second.fd < 0)
      return failWith("ipc_handle of an address device_alloc did not return");
    h.fd = it->second.fd;
    h.bytes = it->second.bytes;
  }
  std::memset(handle, 0, RCOLL_IPC_HANDLE_BYTES);
  std::memcpy(handle, &h, sizeof(h));
  return 0;
}
int ipcOpen(int device, const void* handle, void** ptr) {
  if (device != 0) return failWith("only device 0 exists");
  *ptr = nullptr;
  EmulatedIpcHandle h{};
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kIpcMagic) return failWith("ipc_open: not an emulated IPC handle");
  if (h.pid == static_cast<int64_t>(getpid())) return failWith("ipc_open: a process cannot open its own handle");
  const std::string path = "/proc/" + std::to_string(h.pid) + "/fd/" + std::to_string(h.fd);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return failWith("ipc_open: " + path + ": " + std::strerror(errno));
  void* p = mmap(nullptr, h.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return failWith(std::string("ipc_open: mmap: ") + std::strerror(errno));
  std::lock_guard<std::mutex> lock(g_mappings_mutex);
  g_mappings[p] = Mapping{-1, h.bytes};
  *ptr = p;
  return 0;
}
int ipcClose(void* ptr) { return unmap(ptr, true); }

// GPUDirect RDMA, emulated: "device" memory is host memory, which any RDMA
// device registers with plain ibv_reg_mr (the peer-memory route). Its
// dma-buf comes from the kernel's udmabuf driver (/dev/udmabuf), where the
// kernel has one, so the dma-buf route runs too (a provider without dma-buf
// support, such as rxe, then refuses it and the peer-memory route is taken).
int gdrSupport(int device, int* supported) {
  if (device != 0) return failWith("only device 0 exists");
  *supported = 1;
  return 0;
}
int dmabufExport(void* ptr, size_t bytes, int* fd, unsigned long long* offset) {
  *fd = -1;
  *offset = 0;
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (p % page != 0 || bytes % page != 0 || bytes == 0) return failWith("dmabuf_export of a range not page-aligned");
  udmabuf_create create{};
  {
    std::lock_guard<std::mutex> lock(g_mappings_mutex);
    bool found = false;
    for (const auto& [base, m] : g_mappings) {
      const uintptr_t b = reinterpret_cast<uintptr_t>(base);
      if (m.fd >= 0 && p >= b && p + bytes <= b + m.bytes) {
        create.memfd = static_cast<uint32_t>(m.fd);
        create.offset = p - b;
        found = true;
        break;
      }
    }
    if (!found) return failWith("dmabuf_export of a range device_alloc did not return");
  }
  create.size = bytes;
  create.flags = UDMABUF_FLAGS_CLOEXEC;
  const int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
  if (dev < 0) return failWith(std::string("/dev/udmabuf: ") + std::strerror(errno) + " (the kernel has no udmabuf)");
  const int made = ioctl(dev, UDMABUF_CREATE, &create);
  const int err = errno;
  close(dev);
  if (made < 0) return failWith(std::string("UDMABUF_CREATE: ") + std::strerror(err));
  *fd = made;
  return 0;
}
int flushRdmaWrites(int device) {
  if (device != 0) return failWith("only device 0 exists");
  // The NIC wrote host memory and its completion was seen; the streams'
  // tasks are handed over under a mutex, which orders them after it. A
  // counter stands for the flush (and shows the call in a debugger).
  static std::atomic<uint64_t> flushes{0};
  flushes.fetch_add(1, std::memory_order_seq_cst);
  return 0;
}

// Every emulated process has one GPU, "emulated:0" unless
// EMULATED_DEVICE_ID names it otherwise; two different names are
// two GPUs without peer access (tests of the CUDA IPC fallback).
std::string emulatedDeviceId() {
  // A test's own variable, not one of rcoll's settings (config.cc).
  const char* id = std::getenv("EMULATED_DEVICE_ID");
  return id != nullptr && *id != '\0' ? id : "emulated:0";
}
int deviceId(int device, char* id, size_t bytes) {
  if (device != 0) return failWith("only device 0 exists");
  const std::string mine = emulatedDeviceId();
  if (bytes == 0 || mine.size() >= bytes) return failWith("device id buffer too small");
  std::memcpy(id, mine.c_str(), mine.size() + 1);
  return 0;
}
int peerAccess(int device, const char* peer_id, int* access) {
  if (device != 0) return failWith("only device 0 exists");
  *access = emulatedDeviceId() == peer_id ? RCOLL_PEER_SAME_DEVICE : RCOLL_PEER_NO_ACCESS;
  return 0;
}
int copyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return failWith("copy with a null pointer");
  enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return 0;
}
int reduceAsync(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream) {
  if (!isValidDataType(dtype) || !isValidReduceOp(op)) return failWith("bad dtype or op code");
  std::string why = reduceUnsupportedReason(static_cast<DataType>(dtype), static_cast<ReduceOp>(op));
  if (!why.empty()) return failWith(why);
  enqueue(stream, [=] { reduceInto(dst, a, b, count, static_cast<DataType>(dtype), static_cast<ReduceOp>(op)); });
  return 0;
}
int scaleDivideAsync(void* buf, size_t count, int dtype, size_t divisor, void* stream) {
  if (!isValidDataType(dtype) || !isFloatingPoint(static_cast<DataType>(dtype))) {
    return failWith("scale_divide needs a floating-point dtype");
  }
  enqueue(stream, [=] { scaleDivide(buf, count, static_cast<DataType>(dtype), divisor); });
  return 0;
}
int eventCreate(int device, void** event) {
  if (device != 0) return failWith("only device 0 exists");
  *event = new Event();
  return 0;
}
int eventRecord(void* event, void* stream) {
  std::shared_ptr<EventState> e = static_cast<Event*>(event)->state;
  const uint64_t generation = e->recorded.fetch_add(1) + 1;
  enqueue(stream, [e, generation] {
    uint64_t seen = e->completed.load();
    while (seen < generation && !e->completed.compare_exchange_weak(seen, generation)) {
    }
  });
  return 0;
}
int eventQuery(void* event) {
  const EventState* e = static_cast<Event*>(event)->state.get();
  return e->completed.load() >= e->recorded.load() ? RCOLL_EVENT_DONE : RCOLL_EVENT_PENDING;
}
int eventDestroy(void* event) {
  delete static_cast<Event*>(event);
  return 0;
}
int streamWaitEvent(void* stream, void* event) {
  std::shared_ptr<EventState> e = static_cast<Event*>(event)->state;
  const uint64_t target = e->recorded.load();  // the record that precedes this call, as in CUDA
  enqueue(stream, [e, target] {
    while (e->completed.load() < target) std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return 0;
}
const char* lastError() { return t_last_error.c_str(); }

const rcoll_device_api kEmulatedApi = {
    RCOLL_DEVICE_API_VERSION,
    "emulated (host memory, for tests)",
    setDevice,
    pointerDevice,
    streamCreate,
    streamDestroy,
    streamSynchronize,
    deviceAlloc,
    deviceFree,
    allocAligned,
    freeMemory,
    copyAsync,
    copyAsync,
    copyAsync,
    reduceAsync,
    scaleDivideAsync,
    eventCreate,
    eventRecord,
    eventQuery,
    eventDestroy,
    streamWaitEvent,
    lastError,
    ipcHandle,
    ipcOpen,
    ipcClose,
    deviceId,
    peerAccess,
    gdrSupport,
    dmabufExport,
    flushRdmaWrites,
};

}  // namespace

const rcoll_device_api* emulatedDeviceApi() { return &kEmulatedApi; }

int emulatedDelayedCopy(void* stream, void* dst, const void* src, size_t bytes, double delay_seconds) {
  if (isDefaultStream(stream)) return failWith("the delayed copy needs an emulated stream");
  static_cast<Stream*>(stream)->push([=] { std::memmove(dst, src, bytes); },
                                     std::chrono::microseconds(static_cast<long long>(delay_seconds * 1e6)));
  return 0;
}

}  // namespace testing
}  // namespace rcoll
