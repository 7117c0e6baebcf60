// The shared-memory transport (csrc/shm) on its own, no store, no communicator:
// transports of one process connected through their listenAddress(), driven by
// one thread each, and forked children for a peer that exits or is killed
// mid-transfer. Checks: sizes around the ring size both ways at once, many
// small messages in order (with a receiver that lags, so senders sleep for
// room), three ranks sharing one doorbell, a header mismatch caught before any
// payload lands, a dead peer named within a second, data delivered after the
// peer exited, abort text reaching the peer, interrupt(), an idle rank that
// sleeps, no descriptor left open. Then a timing printout (not an assertion):
// 8-byte ping-pong and 64 MiB one-way throughput.
//
// Built and run by tests/native/test_shm_cpp.py under ASan+UBSan and under TSan; by hand
// (one line): g++ -std=c++17 -O2 -pthread -Icsrc tests/native/cpp/test_shm_transport.cc
// csrc/shm/shm_transport.cc csrc/shm/shm_setup.cc csrc/peer_listener.cc csrc/socket_util.cc
// csrc/wire.cc csrc/dtype.cc csrc/error.cc csrc/log.cc csrc/config.cc -o /tmp/shm_test && /tmp/shm_test
#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "error.h"
#include "shm/shm_setup.h"
#include "shm/shm_transport.h"

using namespace rcoll;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::atomic<int> g_failures{0};

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                                 \
    }                                                                               \
  } while (0)

constexpr uint64_t kCommId = 0x5eed5eed12345678ull;

ConnectInfo makeInfo(int rank, int size) {
  ConnectInfo info;
  info.comm_id = kCommId;
  for (int i = 0; i < 16; ++i) info.token[i] = static_cast<uint8_t>(0xA0 + i);
  info.rank = rank;
  info.size = size;
  return info;
}

WireHeader header(int src, uint64_t seq, size_t bytes, uint64_t offset = 0) {
  OpDesc op;
  op.kind = OpKind::kPointToPoint;
  op.dtype = DataType::kUInt8;
  op.count = bytes;
  op.seq = seq;
  return makeHeader(op, kCommId, static_cast<uint32_t>(src), offset, bytes);
}

uint8_t pattern(int src, int msg, size_t i) {
  return static_cast<uint8_t>(i * 131 + static_cast<size_t>(msg) * 7 + static_cast<size_t>(src) * 31 + (i >> 9));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// CLOCK_MONOTONIC (steady_clock) is one clock for every process of the host.
int64_t monotonicNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

double threadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int openFdCount() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n - 3;  // ".", ".." and the directory's own descriptor
}

void setRingBytes(const char* value) {
  if (value == nullptr) {
    unsetenv("RCOLL_SHM_RING_BYTES");
  } else {
    setenv("RCOLL_SHM_RING_BYTES", value, 1);
  }
}

bool pending(const std::vector<Request*>& reqs) {
  return std::any_of(reqs.begin(), reqs.end(), [](Request* r) { return r->state == Request::State::kPending; });
}

// Drives `t` until no request in `reqs` is pending or `limit` passes.
bool waitAll(Transport& t, const std::vector<Request*>& reqs, milliseconds limit = milliseconds(60000)) {
  const auto deadline = Clock::now() + limit;
  while (pending(reqs)) {
    if (Clock::now() >= deadline) return false;
    t.progress(milliseconds(50));
  }
  return true;
}

bool allDone(const std::vector<Request*>& reqs) {
  return std::all_of(reqs.begin(), reqs.end(), [](Request* r) { return r->state == Request::State::kDone; });
}

using World = std::vector<std::unique_ptr<ShmTransport>>;

// `n` transports connected all to all: each rank dials the lower ranks, then
// accepts the higher ones, on its own thread.
World makeWorld(int n) {
  World world;
  for (int r = 0; r < n; ++r)
    world.push_back(std::make_unique<ShmTransport>(makeInfo(r, n), Config::fromEnvironment(), "127.0.0.1"));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        for (int p = 0; p < r; ++p)
          world[static_cast<size_t>(r)]->connect(p, world[static_cast<size_t>(p)]->listenAddress(), deadline);
        for (int k = r + 1; k < n; ++k) {
          int peer = world[static_cast<size_t>(r)]->accept(deadline);
          CHECK(peer > r && peer < n);
        }
        world[static_cast<size_t>(r)]->closeListener();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: set-up failed: %s\n", r, e.what());
        g_failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    for (int p = 0; p < n; ++p) CHECK(p == r || world[static_cast<size_t>(r)]->connected(p));
  }
  return world;
}

// --- a peer that dies -----------------------------------------------------------

// A child process is rank 1. It sends part of a 1 MiB message and then either
// _exits (kill = false) or is SIGKILLed by the parent (kill = true). The
// parent's pending receive and its send (into the full ring towards the
// child) must fail naming rank 1, within a second of the death.
void testPeerDies(bool kill) {
  setRingBytes("64K");
  auto t0 = std::make_unique<ShmTransport>(makeInfo(0, 2), Config::fromEnvironment(), "127.0.0.1");
  const std::string address = t0->listenAddress();
  const size_t big = size_t{1} << 20;
  int pipe_fds[2];
  CHECK(pipe(pipe_fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    ::close(pipe_fds[0]);
    try {
      ShmTransport t1(makeInfo(1, 2), Config::fromEnvironment(), "127.0.0.1");
      t1.connect(0, address, Clock::now() + std::chrono::seconds(20));
      std::vector<uint8_t> data(big, 7);
      t1.isend(0, header(1, 1, big), data.data(), big);
      for (int i = 0; i < 4; ++i) {  // a few ring-fulls go out; the rest never will
        t1.progress(milliseconds(0));
        ::usleep(20000);
      }
      const int64_t now = monotonicNs();
      if (::write(pipe_fds[1], &now, sizeof(now)) != sizeof(now)) _exit(3);
      if (kill) {
        for (;;) ::pause();  // the parent kills us
      }
      _exit(0);
    } catch (...) {
      _exit(2);
    }
  }
  ::close(pipe_fds[1]);
  const int peer = t0->accept(Clock::now() + std::chrono::seconds(20));
  CHECK(peer == 1);
  std::vector<uint8_t> in(big, 0);
  std::vector<uint8_t> out(3 * t0->ringBytes(), 1);
  Request* recv = t0->irecv(1, header(1, 1, big), in.data(), big);
  Request* send = t0->isend(1, header(0, 1, out.size()), out.data(), out.size());  // never received
  // Consume what the child writes while it lives; learn from the pipe when it dies (or kill it then).
  const auto limit = Clock::now() + std::chrono::seconds(10);
  int64_t death_ns = 0, failed_ns = 0;
  while ((recv->state == Request::State::kPending || send->state == Request::State::kPending) && Clock::now() < limit) {
    t0->progress(milliseconds(20));
    if (recv->state != Request::State::kPending && failed_ns == 0) failed_ns = monotonicNs();
    pollfd p{pipe_fds[0], POLLIN, 0};
    int64_t t = 0;
    if (death_ns == 0 && ::poll(&p, 1, 0) == 1 && ::read(pipe_fds[0], &t, sizeof(t)) == sizeof(t)) {
      if (kill) {
        ::kill(pid, SIGKILL);
        t = monotonicNs();
      }
      death_ns = t;
    }
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(kill ? (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) : (WIFEXITED(status) && WEXITSTATUS(status) == 0));
  CHECK(recv->state == Request::State::kFailed);
  CHECK(send->state == Request::State::kFailed);
  const TransportFailure f = t0->failure(recv);
  CHECK(f.kind == ErrorKind::kPeer);
  CHECK(contains(f.message, "rank 1 closed its connection (its process exited, crashed or was killed)"));
  CHECK(contains(t0->failure(send).message, "rank 1 closed its connection"));
  CHECK(t0->lostPeers() == std::vector<int>{1});   // what a shrink leaves out without waiting
  CHECK(std::count(in.begin(), in.end(), 7) > 0);  // it was mid-transfer
  const double latency = static_cast<double>(failed_ns - death_ns) * 1e-9;
  std::printf("peer %s mid-transfer: the pending receive failed %.1f ms later: %s\n", kill ? "SIGKILLed" : "_exited",
              latency * 1e3, f.message.c_str());
  CHECK(death_ns > 0 && failed_ns > 0 && latency < 1.0);
  // Later requests fail at once, with the same cause.
  Request* again = t0->irecv(1, header(1, 2, 8), in.data(), 8);
  CHECK(again->state == Request::State::kFailed && contains(t0->failure(again).message, "rank 1 closed"));
  t0->release(again);
  t0->release(recv);
  t0->release(send);
  ::close(pipe_fds[0]);
  setRingBytes(nullptr);
}

// A child sends two complete messages and exits; the parent, having noticed
// the exit, can still receive them (as from a TCP socket after the FIN); the
// receive after them fails naming the rank.
void testDeliveredAfterExit() {
  auto t0 = std::make_unique<ShmTransport>(makeInfo(0, 2), Config::fromEnvironment(), "127.0.0.1");
  const std::string address = t0->listenAddress();
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      ShmTransport t1(makeInfo(1, 2), Config::fromEnvironment(), "127.0.0.1");
      t1.connect(0, address, Clock::now() + std::chrono::seconds(20));
      std::vector<uint8_t> a(1000), b(0);
      for (size_t i = 0; i < a.size(); ++i) a[i] = pattern(1, 1, i);
      std::vector<Request*> reqs = {t1.isend(0, header(1, 1, a.size()), a.data(), a.size()),
                                    t1.isend(0, header(1, 2, 0), nullptr, 0)};
      _exit(waitAll(t1, reqs, milliseconds(10000)) && allDone(reqs) ? 0 : 4);
    } catch (...) {
      _exit(2);
    }
  }
  CHECK(t0->accept(Clock::now() + std::chrono::seconds(20)) == 1);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  t0->progress(milliseconds(100));  // sees the EOF with nothing posted
  std::vector<uint8_t> a(1000, 0);
  Request* ra = t0->irecv(1, header(1, 1, a.size()), a.data(), a.size());
  Request* rb = t0->irecv(1, header(1, 2, 0), nullptr, 0);
  Request* rc = t0->irecv(1, header(1, 3, 8), a.data(), 8);
  CHECK(ra->state == Request::State::kDone && rb->state == Request::State::kDone);
  bool same = true;
  for (size_t i = 0; i < a.size(); ++i) same = same && a[i] == pattern(1, 1, i);
  CHECK(same);
  CHECK(rc->state == Request::State::kFailed && contains(t0->failure(rc).message, "rank 1 closed its connection"));
  for (Request* r : {ra, rb, rc}) t0->release(r);
}

// --- sizes, order, three ranks -------------------------------------------------------

// Every size around the ring size, both directions at once, each rank on its own thread.
void testSizesBothWays(const char* ring) {
  setRingBytes(ring);
  const int fds_before = openFdCount();
  {
    World w = makeWorld(2);
    const size_t R = w[0]->ringBytes();
    const std::vector<size_t> sizes = {0, 1, 63, 64, 4095, R - 1, R, 3 * R + 17};
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        ShmTransport& t = *w[static_cast<size_t>(rank)];
        const int peer = 1 - rank;
        std::vector<std::vector<uint8_t>> out(sizes.size()), in(sizes.size());
        std::vector<Request*> reqs;
        for (size_t k = 0; k < sizes.size(); ++k) {
          out[k].resize(sizes[k]);
          for (size_t i = 0; i < sizes[k]; ++i) out[k][i] = pattern(rank, static_cast<int>(k), i);
          in[k].assign(sizes[k], 0);
          reqs.push_back(t.irecv(peer, header(peer, k + 1, sizes[k]), in[k].data(), sizes[k]));
          reqs.push_back(t.isend(peer, header(rank, k + 1, sizes[k]), out[k].data(), sizes[k]));
        }
        CHECK(waitAll(t, reqs));
        CHECK(allDone(reqs));
        for (size_t k = 0; k < sizes.size(); ++k) {
          bool same = true;
          for (size_t i = 0; i < sizes[k]; ++i) same = same && in[k][i] == pattern(peer, static_cast<int>(k), i);
          if (!same) std::fprintf(stderr, "rank %d: message %zu (%zu bytes) arrived corrupted\n", rank, k, sizes[k]);
          CHECK(same);
        }
        for (Request* r : reqs) t.release(r);
      });
    }
    for (auto& th : threads) th.join();
  }
  CHECK(openFdCount() == fds_before);  // sockets, eventfds and memfds all closed
  setRingBytes(nullptr);
}

// Many small messages each way, posted in windows, by ranks that sometimes
// stop receiving for a while (so the other side fills the ring and sleeps for room).
void testManySmallInOrder(const World& w, const std::vector<int>& ranks, int messages) {
  std::vector<std::thread> threads;
  for (int rank : ranks) {
    threads.emplace_back([&, rank] {
      ShmTransport& t = *w[static_cast<size_t>(rank)];
      struct Flight {
        int peer;
        int index;
        Request* request;
        std::vector<uint8_t> buf;
      };
      std::vector<int> peers;
      for (int p : ranks) {
        if (p != rank) peers.push_back(p);
      }
      auto size_of = [](int src, int i) { return static_cast<size_t>((i * 37 + src * 11) % 300); };
      std::vector<std::vector<Flight>> sends(peers.size()), recvs(peers.size());
      std::vector<int> next_send(peers.size(), 0), next_recv(peers.size(), 0), got(peers.size(), 0),
          sent(peers.size(), 0);
      const auto deadline = Clock::now() + std::chrono::seconds(120);
      bool ok = true;
      auto harvest = [&](std::vector<Flight>& flights, int* count, bool verify) {
        size_t keep = 0;
        for (size_t idx = 0; idx < flights.size(); ++idx) {
          Flight& f = flights[idx];
          if (f.request->state == Request::State::kPending) {
            if (idx != keep) flights[keep] = std::move(f);  // (a self-move would empty the buffer)
            ++keep;
            continue;
          }
          if (f.request->state == Request::State::kFailed) {
            std::fprintf(stderr, "rank %d: message %d with rank %d failed: %s\n", rank, f.index, f.peer,
                         t.failure(f.request).message.c_str());
            ok = false;
          } else if (verify) {
            CHECK(f.index == *count);  // in order
            bool same = f.buf.size() == size_of(f.peer, f.index);
            for (size_t i = 0; same && i < f.buf.size(); ++i) same = f.buf[i] == pattern(f.peer, f.index, i);
            CHECK(same);
          }
          ++*count;
          t.release(f.request);
        }
        flights.resize(keep);
      };
      for (;;) {
        bool finished = true;
        for (size_t k = 0; k < peers.size(); ++k) {
          const int p = peers[k];
          while (next_send[k] < messages && sends[k].size() < 64) {
            const int i = next_send[k]++;
            Flight f{p, i, nullptr, std::vector<uint8_t>(size_of(rank, i))};
            for (size_t j = 0; j < f.buf.size(); ++j) f.buf[j] = pattern(rank, i, j);
            f.request =
                t.isend(p, header(rank, static_cast<uint64_t>(i) + 1, f.buf.size()), f.buf.data(), f.buf.size());
            sends[k].push_back(std::move(f));
          }
          // Every 2000 messages this rank stops receiving for a moment.
          const bool lag = next_recv[k] % 2000 == 1999 && recvs[k].empty();
          if (lag) std::this_thread::sleep_for(milliseconds(20));
          while (next_recv[k] < messages && recvs[k].size() < 100) {
            const int i = next_recv[k]++;
            Flight f{p, i, nullptr, std::vector<uint8_t>(size_of(p, i), 0)};
            f.request = t.irecv(p, header(p, static_cast<uint64_t>(i) + 1, f.buf.size()), f.buf.data(), f.buf.size());
            recvs[k].push_back(std::move(f));
          }
          harvest(recvs[k], &got[k], true);
          harvest(sends[k], &sent[k], false);
          finished = finished && got[k] == messages && sent[k] == messages;
        }
        if (finished || !ok) break;
        if (Clock::now() > deadline) {
          std::fprintf(stderr, "rank %d: many-small timed out\n", rank);
          ok = false;
          break;
        }
        t.progress(milliseconds(50));
      }
      CHECK(ok);
    });
  }
  for (auto& th : threads) th.join();
}

// --- failures ---------------------------------------------------------------------

// Drives two transports from this thread until `r` (on `t`) is final.
void driveBoth(World& w, Request* r, milliseconds limit = milliseconds(10000)) {
  const auto deadline = Clock::now() + limit;
  while (r->state == Request::State::kPending && Clock::now() < deadline) {
    w[0]->progress(milliseconds(1));
    w[1]->progress(milliseconds(1));
  }
}

void testMismatch() {
  setRingBytes("64K");
  {
    // Another op: rank 1 sends op #5 where rank 0 expects op #6.
    World w = makeWorld(2);
    std::vector<uint8_t> payload(100, 0x11), dst(100, 0xEE);
    Request* s = w[1]->isend(0, header(1, 5, payload.size()), payload.data(), payload.size());
    Request* r = w[0]->irecv(1, header(1, 6, dst.size()), dst.data(), dst.size());
    driveBoth(w, r);
    driveBoth(w, s);
    CHECK(s->state == Request::State::kDone);  // it is in the ring: the sender saw nothing wrong
    CHECK(r->state == Request::State::kFailed);
    const TransportFailure f = w[0]->failure(r);
    CHECK(f.kind == ErrorKind::kMismatch);
    CHECK(contains(f.message, "op #5") && contains(f.message, "op #6") && contains(f.message, "rank 1"));
    CHECK(std::count(dst.begin(), dst.end(), 0xEE) == static_cast<long>(dst.size()));  // untouched
    std::printf("mismatch: %s\n", f.message.c_str());
    Request* again = w[0]->irecv(1, header(1, 6, dst.size()), dst.data(), dst.size());
    CHECK(again->state == Request::State::kFailed && w[0]->failure(again).kind == ErrorKind::kMismatch);
    for (Request* q : {r, again}) w[0]->release(q);
    w[1]->release(s);
  }
  {
    // A larger segment than expected (a message bigger than the ring): the
    // destination, smaller, is never written.
    World w = makeWorld(2);
    const size_t n = 3 * w[0]->ringBytes();
    std::vector<uint8_t> payload(n, 0x22), dst(100, 0xEE);
    Request* s = w[1]->isend(0, header(1, 1, n), payload.data(), n);
    Request* r = w[0]->irecv(1, header(1, 1, dst.size()), dst.data(), dst.size());
    driveBoth(w, r);
    CHECK(r->state == Request::State::kFailed && w[0]->failure(r).kind == ErrorKind::kMismatch);
    CHECK(std::count(dst.begin(), dst.end(), 0xEE) == static_cast<long>(dst.size()));
    CHECK(s->state == Request::State::kPending);  // the receiver stopped reading
    // The communicator would now abort: the sender learns why.
    w[0]->abortPeers(ErrorKind::kMismatch, w[0]->failure(r).message);
    driveBoth(w, s);
    CHECK(s->state == Request::State::kFailed && w[1]->failure(s).kind == ErrorKind::kMismatch &&
          contains(w[1]->failure(s).message, "rank 0 failed: "));
    w[0]->release(r);
    w[1]->release(s);
  }
  {
    // A header that does not match its own payload length is refused at once.
    World w = makeWorld(2);
    uint8_t byte = 1;
    Request* s = w[1]->isend(0, header(1, 1, 2), &byte, 1);
    CHECK(s->state == Request::State::kFailed && w[1]->failure(s).kind == ErrorKind::kInvalidArgument);
    w[1]->release(s);
  }
  setRingBytes(nullptr);
}

void testAbort() {
  World w = makeWorld(2);
  const std::string text =
      "rank 0 saw trouble: \xC3\xBC\xC3\xB1\xC3\xAF\xC3\xA7\xC3\xB6"
      "d\xC3\xA9 (op #7)";
  std::vector<uint8_t> dst(1000);
  TransportFailure seen;
  double waited = 0;
  std::thread peer([&] {
    Request* r = w[1]->irecv(0, header(0, 7, dst.size()), dst.data(), dst.size());
    const auto start = Clock::now();
    waitAll(*w[1], {r}, milliseconds(10000));
    waited = seconds(Clock::now() - start);
    if (r->state == Request::State::kFailed) seen = w[1]->failure(r);
    w[1]->release(r);
  });
  std::vector<uint8_t> mine(64);
  Request* own = w[0]->irecv(1, header(1, 7, mine.size()), mine.data(), mine.size());
  std::this_thread::sleep_for(milliseconds(200));  // the peer is asleep in progress() by now
  w[0]->abortPeers(ErrorKind::kMismatch, text);
  peer.join();
  CHECK(seen.kind == ErrorKind::kMismatch);
  CHECK(seen.message == "rank 0 failed: " + text);
  CHECK(w[1]->lostPeers().empty());  // it told us: not lost
  std::printf("abort reached the peer after %.0f ms: %s\n", waited * 1e3 - 200, seen.message.c_str());
  CHECK(waited < 2.0);
  CHECK(own->state == Request::State::kFailed && w[0]->failure(own).kind == ErrorKind::kAborted);
  Request* after = w[0]->isend(1, header(0, 8, 0), nullptr, 0);
  CHECK(after->state == Request::State::kFailed && w[0]->failure(after).kind == ErrorKind::kAborted);
  w[0]->release(own);
  w[0]->release(after);

  // A long text is cut at 4 KiB without splitting a character; any kind but a mismatch reads as a peer failure.
  World v = makeWorld(2);
  std::string long_text;
  while (long_text.size() < 10000) long_text += "\xE2\x82\xAC";  // euro signs, 3 bytes each
  Request* r = v[1]->irecv(0, header(0, 1, 0), nullptr, 0);
  v[0]->abortPeers(ErrorKind::kTimeout, long_text);
  waitAll(*v[1], {r}, milliseconds(10000));
  CHECK(r->state == Request::State::kFailed);
  const TransportFailure f = v[1]->failure(r);
  CHECK(f.kind == ErrorKind::kPeer);
  CHECK(f.message.size() <= std::string("rank 0 failed: ").size() + 4096 && f.message.size() > 4000);
  CHECK(f.message.find("\xEF\xBF\xBD") == std::string::npos);  // no broken character
  CHECK(v[1]->lostPeers().empty());
  v[1]->release(r);
}

// interrupt() from another thread wakes a progress() that sleeps, at once; an
// idle progress() costs no CPU.
void testInterruptAndIdle() {
  World w = makeWorld(2);
  std::vector<uint8_t> dst(8);
  Request* r = w[0]->irecv(1, header(1, 1, 8), dst.data(), 8);
  double slept = 0, cpu = 0, idle_cpu = 0, idle_wall = 0;
  std::thread sleeper([&] {
    // Idle: nothing arrives for one second.
    double c0 = threadCpuSeconds();
    auto t0 = Clock::now();
    w[0]->progress(milliseconds(1000));
    idle_wall = seconds(Clock::now() - t0);
    idle_cpu = threadCpuSeconds() - c0;
    // Interrupted after ~200 ms of a 20 s wait.
    c0 = threadCpuSeconds();
    t0 = Clock::now();
    w[0]->progress(milliseconds(20000));
    slept = seconds(Clock::now() - t0);
    cpu = threadCpuSeconds() - c0;
  });
  std::this_thread::sleep_for(milliseconds(1200));
  w[0]->interrupt();
  sleeper.join();
  CHECK(r->state == Request::State::kPending);
  std::printf(
      "idle progress(1000 ms): returned after %.0f ms, %.2f ms of CPU; interrupted progress(): woke after "
      "%.0f ms, %.2f ms of CPU\n",
      idle_wall * 1e3, idle_cpu * 1e3, slept * 1e3, cpu * 1e3);
  CHECK(idle_wall >= 0.99 && idle_wall < 3.0);
  CHECK(idle_cpu < 0.05);  // asleep, not spinning
  CHECK(slept < 5.0);
  // An interrupt that comes before progress() is not lost.
  w[0]->interrupt();
  const auto t0 = Clock::now();
  w[0]->progress(milliseconds(20000));
  CHECK(seconds(Clock::now() - t0) < 1.0);
  w[0]->release(r);  // pending: recycled only when it leaves its queue (here: never, the transport goes)
}

void testHostKey() {
  const std::string key = shm::hostKey();
  CHECK(!key.empty() && key == shm::hostKey() && key.find('/') != std::string::npos);
  std::string from_child;
  int fds[2];
  CHECK(pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();  // another process of this host: the same key
  if (pid == 0) {
    const std::string k = shm::hostKey();
    _exit(::write(fds[1], k.data(), k.size()) == static_cast<ssize_t>(k.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  char buf[256];
  ssize_t n = 0;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) from_child.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(from_child == key);
}

void testBadRingSize() {
  setRingBytes("12 parsecs");
  bool threw = false;
  try {
    ShmTransport t(makeInfo(0, 2), Config::fromEnvironment(), "127.0.0.1");
  } catch (const RcollError& e) {
    threw = e.kind() == ErrorKind::kConfig && contains(e.what(), "RCOLL_SHM_RING_BYTES");
  }
  CHECK(threw);
  setRingBytes(nullptr);
}

// --- timing (printed, not asserted) ------------------------------------------------------

void timing(bool sanitized) {
  setRingBytes(nullptr);
  World w = makeWorld(2);
  // 8-byte ping-pong: rank 1 sends, rank 0 echoes.
  const int warmup = 1000, iters = sanitized ? 5000 : 50000;
  std::thread echo([&] {
    uint64_t v = 0;
    for (int i = 0; i < warmup + iters; ++i) {
      Request* r = w[0]->irecv(1, header(1, static_cast<uint64_t>(i) + 1, 8), &v, 8);
      waitAll(*w[0], {r});
      w[0]->release(r);
      Request* s = w[0]->isend(1, header(0, static_cast<uint64_t>(i) + 1, 8), &v, 8);
      waitAll(*w[0], {s});
      w[0]->release(s);
    }
  });
  uint64_t out = 42, back = 0;
  Clock::time_point start;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) start = Clock::now();
    Request* s = w[1]->isend(0, header(1, static_cast<uint64_t>(i) + 1, 8), &out, 8);
    Request* r = w[1]->irecv(0, header(0, static_cast<uint64_t>(i) + 1, 8), &back, 8);
    waitAll(*w[1], {s, r});
    CHECK(allDone({s, r}));
    w[1]->release(s);
    w[1]->release(r);
  }
  const double rtt = seconds(Clock::now() - start) / iters;
  echo.join();
  CHECK(back == 42);

  // 64 MiB one way, as one message and as 1 MiB segments (8 in flight, as the pipeline executor posts them).
  const size_t total = size_t{64} << 20;
  std::vector<uint8_t> src(total), dst(total);
  for (size_t i = 0; i < total; i += 4096) src[i] = static_cast<uint8_t>(i >> 12);
  std::memset(dst.data(), 0, total);
  auto transfer = [&](size_t segment) {
    const size_t n = total / segment;
    std::thread receiver([&] {
      std::vector<Request*> reqs;
      for (size_t k = 0; k < n; ++k) {
        reqs.push_back(w[0]->irecv(1, header(1, 1, segment, k), dst.data() + k * segment, segment));
        if (reqs.size() >= 8) {
          waitAll(*w[0], {reqs.front()});
          w[0]->release(reqs.front());
          reqs.erase(reqs.begin());
        }
      }
      waitAll(*w[0], reqs);
      for (Request* r : reqs) w[0]->release(r);
    });
    const auto t0 = Clock::now();
    std::vector<Request*> reqs;
    for (size_t k = 0; k < n; ++k) {
      reqs.push_back(w[1]->isend(0, header(1, 1, segment, k), src.data() + k * segment, segment));
      if (reqs.size() >= 8) {
        waitAll(*w[1], {reqs.front()});
        w[1]->release(reqs.front());
        reqs.erase(reqs.begin());
      }
    }
    waitAll(*w[1], reqs);
    for (Request* r : reqs) w[1]->release(r);
    receiver.join();
    return static_cast<double>(total) / seconds(Clock::now() - t0) / 1e9;
  };
  double best_whole = 0, best_seg = 0;
  for (int rep = 0; rep < (sanitized ? 2 : 5); ++rep) {
    best_whole = std::max(best_whole, transfer(total));
    best_seg = std::max(best_seg, transfer(size_t{1} << 20));
  }
  CHECK(std::memcmp(src.data(), dst.data(), total) == 0);
  std::printf(
      "timing%s (ring %zu KiB per direction): 8-byte ping-pong %.2f us round trip; 64 MiB one way: "
      "%.2f GB/s as one message, %.2f GB/s as 1 MiB segments\n",
      sanitized ? " under a sanitizer (not representative)" : "", w[0]->ringBytes() >> 10, rtt * 1e6, best_whole,
      best_seg);
}

}  // namespace

int main(int argc, char** argv) {
  const bool sanitized = argc > 1 && std::string(argv[1]) == "--sanitized";
  // The forked children first, while this process has no other thread.
  testPeerDies(/*kill=*/false);
  testPeerDies(/*kill=*/true);
  testDeliveredAfterExit();
  testHostKey();
  testBadRingSize();
  testSizesBothWays("64K");
  testSizesBothWays(nullptr);  // the default, 4M
  testSizesBothWays("4K");     // the smallest ring
  {
    setRingBytes("16K");
    World w = makeWorld(2);
    testManySmallInOrder(w, {0, 1}, sanitized ? 6000 : 20000);
    World three = makeWorld(3);  // three ranks: one doorbell serves two peers
    testManySmallInOrder(three, {0, 1, 2}, sanitized ? 3000 : 10000);
    setRingBytes(nullptr);
  }
  testMismatch();
  testAbort();
  testInterruptAndIdle();
  timing(sanitized);
  if (g_failures.load() != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures.load());
    return 1;
  }
  std::printf("all shm transport checks passed\n");
  return 0;
}
