// Tests for rcoll's TCP store (csrc/tcp_store.{h,cc}). Standalone: exits nonzero
// on failure. Every wait is bounded, and an alarm kills the process if something
// hangs anyway.
//
//   g++ -O1 -g -std=c++17 -Wall -Wextra -Werror -fsanitize=address,undefined -pthread
//       -Icsrc tests/native/cpp/test_tcp_store.cc csrc/tcp_store.cc csrc/error.cc -o /tmp/tts

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "error.h"
#include "tcp_store.h"

using namespace std::chrono_literals;
using rcoll::ErrorKind;
using rcoll::RcollError;
using rcoll::TcpStoreClient;
using rcoll::TcpStoreServer;
using Clock = std::chrono::steady_clock;

namespace {

std::atomic<int> g_failures{0};

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                                  \
    }                                                                                \
  } while (0)

const char* kHost = "127.0.0.1";

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

double msSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Runs fn; returns the RcollError kind it threw, or -1 if it threw nothing (or
// something else). Prints the message so a failing run shows what went on.
int thrownKind(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const RcollError& e) {
    if (message) *message = e.what();
    return static_cast<int>(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    return -2;
  }
  return -1;
}

// A port that was free a moment ago (bound to port 0 and released).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("freePort");
    std::exit(2);
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

int rawConnect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, kHost, &addr.sin_addr);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("rawConnect");
    std::exit(2);
  }
  return fd;
}

void rawSend(int fd, const std::vector<uint8_t>& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may already have dropped us; that is fine
    done += static_cast<size_t>(n);
  }
}

// True if the server closes `fd` (EOF or reset) within `timeout`.
bool closedByPeer(int fd, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, left) <= 0) continue;
    char buf[256];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
}

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// ---------------------------------------------------------------------------

void testConcurrentClients(int port) {
  constexpr int kThreads = 8;
  constexpr int kIters = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, port] {
      try {
        TcpStoreClient client(kHost, port, 5000ms);
        for (int i = 0; i < kIters; ++i) {
          std::string key = "conc/" + std::to_string(t) + "/" + std::to_string(i);
          std::string value = "v" + std::to_string(t * 1000 + i);
          client.set(key, bytes(value));
          EXPECT(text(client.get(key, 5000ms)) == value);
          EXPECT(client.check(key));
          client.add("conc/counter", 1);
          // A key another thread sets: wait for it (bounded).
          std::string other = "conc/" + std::to_string((t + 1) % kThreads) + "/" + std::to_string(i);
          EXPECT(text(client.get(other, 5000ms)) == "v" + std::to_string(((t + 1) % kThreads) * 1000 + i));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "thread %d: %s\n", t, e.what());
        g_failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  TcpStoreClient client(kHost, port, 5000ms);
  EXPECT(client.add("conc/counter", 0) == kThreads * kIters);
  EXPECT(!client.check("conc/missing"));
  EXPECT(!client.localAddress().empty());
  EXPECT(client.localAddress() == "127.0.0.1");
}

void testGetWaitsForSet(int port) {
  TcpStoreClient waiter(kHost, port, 5000ms);
  TcpStoreClient setter(kHost, port, 5000ms);
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    setter.set("late/key", bytes("hello"));
  });
  auto start = Clock::now();
  std::string got;
  int kind = thrownKind([&] { got = text(waiter.get("late/key", 5000ms)); });
  double ms = msSince(start);
  later.join();
  EXPECT(kind == -1);
  EXPECT(got == "hello");
  EXPECT(ms >= 150 && ms < 3000);
}

void testGetTimeout(int port) {
  TcpStoreClient client(kHost, port, 5000ms);
  auto start = Clock::now();
  std::string message;
  int kind = thrownKind([&] { client.get("timeout/missing", 300ms); }, &message);
  double ms = msSince(start);
  EXPECT(kind == static_cast<int>(ErrorKind::kTimeout));
  EXPECT(ms >= 290 && ms < 2000);
  EXPECT(message.find("timeout/missing") != std::string::npos);
  std::printf("  timeout message: %s\n", message.c_str());
  // The client reconnects and carries on; the abandoned parked GET on the old
  // connection must not swallow or misroute anything.
  client.set("timeout/missing", bytes("now here"));
  EXPECT(text(client.get("timeout/missing", 5000ms)) == "now here");
  client.set("timeout/other", bytes("x"));
  EXPECT(text(client.get("timeout/other", 5000ms)) == "x");
}

void testAddFromManyThreads(int port) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([port] {
      try {
        TcpStoreClient client(kHost, port, 5000ms);
        for (int i = 0; i < 100; ++i) client.add("add/counter", 1);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "add thread: %s\n", e.what());
        g_failures++;
      }
    });
  }
  // One client shared by several threads too: its mutex keeps requests whole.
  TcpStoreClient shared(kHost, port, 5000ms);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&shared] {
      try {
        for (int i = 0; i < 50; ++i) shared.add("add/shared", 2);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "shared add thread: %s\n", e.what());
        g_failures++;
      }
    });
  }
  for (auto& th : threads) th.join();
  TcpStoreClient client(kHost, port, 5000ms);
  EXPECT(client.add("add/counter", 0) == 800);
  EXPECT(shared.add("add/shared", 0) == 400);
  // Counters read back as decimal text, like torch's TCPStore.
  EXPECT(text(client.get("add/counter", 1000ms)) == "800");
  EXPECT(client.add("add/neg", -5) == -5);
  EXPECT(client.add("add/neg", 7) == 2);
}

void testValueSizes(int port) {
  TcpStoreClient client(kHost, port, 5000ms);
  client.set("size/empty", {});
  EXPECT(client.check("size/empty"));
  EXPECT(client.get("size/empty", 1000ms).empty());

  std::vector<uint8_t> big(1 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  client.set("size/big", big);
  EXPECT(client.get("size/big", 5000ms) == big);

  // Overwrite with something smaller.
  client.set("size/big", bytes("small"));
  EXPECT(text(client.get("size/big", 1000ms)) == "small");

  // Oversized keys are refused locally instead of getting us disconnected.
  EXPECT(thrownKind([&] { client.set(std::string(64 * 1024 + 1, 'k'), {}); }) ==
         static_cast<int>(ErrorKind::kInvalidArgument));
  client.set("size/after", bytes("ok"));
  EXPECT(text(client.get("size/after", 1000ms)) == "ok");
}

void testBadClients(int port) {
  TcpStoreClient good(kHost, port, 5000ms);

  // Unknown command.
  int garbage = rawConnect(port);
  rawSend(garbage, bytes("GET /index.html HTTP/1.1\r\n\r\n"));
  // Key length over the limit (valid command byte).
  int long_key = rawConnect(port);
  std::vector<uint8_t> req{1};
  putU32(req, 64 * 1024 + 1);
  rawSend(long_key, req);
  // Value length over the limit.
  int long_value = rawConnect(port);
  req = {1};
  putU32(req, 1);
  req.push_back('k');
  putU32(req, 64u * 1024 * 1024 + 1);
  rawSend(long_value, req);
  // ADD whose delta is not 8 bytes.
  int bad_add = rawConnect(port);
  req = {3};
  putU32(req, 1);
  req.push_back('k');
  putU32(req, 3);
  req.insert(req.end(), {1, 2, 3});
  rawSend(bad_add, req);

  EXPECT(closedByPeer(garbage, 2000ms));
  EXPECT(closedByPeer(long_key, 2000ms));
  EXPECT(closedByPeer(long_value, 2000ms));
  EXPECT(closedByPeer(bad_add, 2000ms));
  ::close(garbage);
  ::close(long_key);
  ::close(long_value);
  ::close(bad_add);

  // Half a request, then silence: must not hold anyone else up.
  int half = rawConnect(port);
  req = {1};
  putU32(req, 10);
  req.insert(req.end(), {'h', 'a', 'l'});
  rawSend(half, req);

  // A client that parks in GET and then vanishes.
  int vanishing = rawConnect(port);
  req = {2};
  putU32(req, 12);
  for (char ch : std::string("bad/vanished")) req.push_back(static_cast<uint8_t>(ch));
  putU32(req, 0);
  rawSend(vanishing, req);
  std::this_thread::sleep_for(50ms);
  ::close(vanishing);
  std::this_thread::sleep_for(50ms);

  auto start = Clock::now();
  good.set("bad/vanished", bytes("v"));  // wakes nobody alive; must not crash
  good.set("bad/k", bytes("fine"));
  EXPECT(text(good.get("bad/k", 2000ms)) == "fine");
  EXPECT(text(good.get("bad/vanished", 2000ms)) == "v");
  EXPECT(msSince(start) < 1000);

  // The idle half-request is still connected (not dropped, not answered).
  pollfd pfd{half, POLLIN, 0};
  EXPECT(::poll(&pfd, 1, 100) == 0);
  ::close(half);

  // Fresh clients still work.
  TcpStoreClient fresh(kHost, port, 5000ms);
  EXPECT(text(fresh.get("bad/k", 2000ms)) == "fine");
}

void testPipelinedRaw(int port) {
  // Two requests in one write, second split across two writes: the server
  // must parse only complete requests and answer both in order.
  int fd = rawConnect(port);
  std::vector<uint8_t> req;
  auto addSet = [&req](const std::string& key, const std::string& value) {
    req.push_back(1);
    putU32(req, static_cast<uint32_t>(key.size()));
    req.insert(req.end(), key.begin(), key.end());
    putU32(req, static_cast<uint32_t>(value.size()));
    req.insert(req.end(), value.begin(), value.end());
  };
  addSet("pipe/a", "1");
  addSet("pipe/b", "2");
  size_t split = req.size() - 3;
  rawSend(fd, std::vector<uint8_t>(req.begin(), req.begin() + static_cast<std::ptrdiff_t>(split)));
  std::this_thread::sleep_for(50ms);
  rawSend(fd, std::vector<uint8_t>(req.begin() + static_cast<std::ptrdiff_t>(split), req.end()));
  uint8_t replies[2] = {9, 9};
  size_t got = 0;
  auto deadline = Clock::now() + 2000ms;
  while (got < 2 && Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, replies + got, 2 - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  EXPECT(got == 2 && replies[0] == 0 && replies[1] == 0);
  ::close(fd);
  TcpStoreClient client(kHost, port, 5000ms);
  EXPECT(text(client.get("pipe/b", 1000ms)) == "2");
}

void testSlowReader(int port) {
  // A client that asks for a 1 MiB value 32 times and never reads the replies
  // must not stall the server or make it buffer without bound.
  TcpStoreClient good(kHost, port, 5000ms);
  good.set("slow/big", std::vector<uint8_t>(1 << 20, 0x5a));
  int fd = rawConnect(port);
  std::vector<uint8_t> req;
  for (int i = 0; i < 32; ++i) {
    req.push_back(2);
    putU32(req, 8);
    for (char ch : std::string("slow/big")) req.push_back(static_cast<uint8_t>(ch));
    putU32(req, 0);
  }
  rawSend(fd, req);
  std::this_thread::sleep_for(100ms);
  auto start = Clock::now();
  good.set("slow/k", bytes("v"));
  EXPECT(text(good.get("slow/k", 2000ms)) == "v");
  EXPECT(msSince(start) < 1000);
  // Reading everything now gets all 32 replies in order.
  size_t want = 32 * (4 + (1u << 20)), got = 0;
  std::vector<uint8_t> buf(1 << 16);
  bool ok = true;
  auto deadline = Clock::now() + 5000ms;
  while (got < want && Clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      size_t at = (got + static_cast<size_t>(i)) % (4 + (1u << 20));
      uint8_t expect = at == 2 ? 0x10 : at < 4 ? 0 : 0x5a;  // u32 length 1 MiB = 00 00 10 00
      if (buf[static_cast<size_t>(i)] != expect) ok = false;
    }
    got += static_cast<size_t>(n);
  }
  EXPECT(got == want);
  EXPECT(ok);
  ::close(fd);
}

void testClientBeforeServer() {
  int port = freePort();
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server.reset(new TcpStoreServer(kHost, port));
  });
  auto start = Clock::now();
  std::unique_ptr<TcpStoreClient> client;
  int kind = thrownKind([&] { client.reset(new TcpStoreClient(kHost, port, 5000ms)); });
  double ms = msSince(start);
  starter.join();
  EXPECT(kind == -1);
  EXPECT(ms >= 250 && ms < 3000);
  if (client) {
    client->set("early/k", bytes("v"));
    EXPECT(text(client->get("early/k", 1000ms)) == "v");
  }
  client.reset();
  server.reset();
}

void testNobodyServing() {
  int port = freePort();
  auto start = Clock::now();
  std::string message;
  int kind = thrownKind([&] { TcpStoreClient client(kHost, port, 500ms); }, &message);
  double ms = msSince(start);
  EXPECT(kind == static_cast<int>(ErrorKind::kTimeout));
  EXPECT(ms >= 450 && ms < 3000);
  EXPECT(message.find(std::to_string(port)) != std::string::npos);
  std::printf("  connect message: %s\n", message.c_str());
}

void testServerDiesWhileParked() {
  auto server = std::make_unique<TcpStoreServer>(kHost, 0);
  TcpStoreClient client(kHost, server->port(), 5000ms);
  std::atomic<int> kind{-3};
  std::string message;
  Clock::time_point thrown_at;
  std::thread waiter([&] {
    kind = thrownKind([&] { client.get("dies/never", 10000ms); }, &message);
    thrown_at = Clock::now();
  });
  std::this_thread::sleep_for(200ms);
  auto destroyed_at = Clock::now();
  server.reset();
  waiter.join();  // bounded: the get itself times out after 10 s at worst
  EXPECT(kind == static_cast<int>(ErrorKind::kPeer));
  double ms = std::chrono::duration<double, std::milli>(thrown_at - destroyed_at).count();
  EXPECT(ms < 1000);
  std::printf("  peer message: %s\n", message.c_str());
  // Afterwards the client fails fast-ish (connect timeout), never hangs.
}

void testServerBindError() {
  TcpStoreServer first(kHost, 0);
  // Same address and port while the first one listens: SO_REUSEADDR does not
  // allow two listeners, so this must fail with kConfig.
  std::string message;
  int kind = thrownKind([&] { TcpStoreServer second(kHost, first.port()); }, &message);
  EXPECT(kind == static_cast<int>(ErrorKind::kConfig));
  std::printf("  bind message: %s\n", message.c_str());
}

struct Test {
  const char* name;
  std::function<void()> fn;
};

}  // namespace

int main() {
  // Backstop: if anything hangs despite the bounded waits, die loudly.
  ::alarm(120);

  auto server = std::make_unique<TcpStoreServer>("", 0);
  const int port = server->port();
  EXPECT(port > 0);
  std::printf("server on port %d\n", port);

  std::vector<Test> tests = {
      {"concurrent clients", [port] { testConcurrentClients(port); }},
      {"get waits for set", [port] { testGetWaitsForSet(port); }},
      {"get timeout", [port] { testGetTimeout(port); }},
      {"add from many threads", [port] { testAddFromManyThreads(port); }},
      {"value sizes", [port] { testValueSizes(port); }},
      {"bad clients", [port] { testBadClients(port); }},
      {"pipelined raw requests", [port] { testPipelinedRaw(port); }},
      {"slow reader", [port] { testSlowReader(port); }},
      {"client before server", [] { testClientBeforeServer(); }},
      {"nobody serving", [] { testNobodyServing(); }},
      {"server dies while parked", [] { testServerDiesWhileParked(); }},
      {"server bind error", [] { testServerBindError(); }},
  };
  for (const Test& t : tests) {
    int before = g_failures.load();
    auto start = Clock::now();
    try {
      t.fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: uncaught exception: %s\n", t.name, e.what());
      g_failures++;
    }
    std::printf("%s %s (%.0f ms)\n", g_failures.load() == before ? "PASS" : "FAIL", t.name, msSince(start));
  }
  server.reset();
  if (g_failures.load() != 0) {
    std::printf("%d failure(s)\n", g_failures.load());
    return 1;
  }
  std::printf("all tests passed\n");
  return 0;
}
