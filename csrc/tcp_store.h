// rcoll's own key-value store over TCP, for use without torch.
//
// Rank 0 (or whoever is told to) hosts a TcpStoreServer on MASTER_ADDR:MASTER_PORT;
// every rank, rank 0 included, talks to it through a TcpStoreClient. Torchrun's
// environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) is enough to set it up.
//
// Wire protocol (little-endian, one request then one reply per round trip):
//   request  = u8 command, u32 key length, key bytes, u32 value length, value bytes
//   commands = 1 SET (reply: u8 0), 2 GET (reply when the key exists: u32 length, bytes),
//              3 ADD (value = 8-byte signed delta; reply: i64 new value),
//              4 CHECK (reply: u8 1 if the key exists, else 0)
// GET waits on the server side, so a client polls nothing; the client bounds the
// wait with its own deadline and then closes its connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "store.h"

namespace rcoll {

class TcpStoreServer {
 public:
  // Binds host:port (host "" or "0.0.0.0" = all interfaces; port 0 = any free port)
  // and serves from a background thread until destroyed. Throws RcollError
  // (kConfig) with the address and errno text if the port cannot be bound.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }

 private:
  void serve();
  struct State;
  std::unique_ptr<State> state_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that stops serve()
  std::thread thread_;
};

class TcpStoreClient : public Store {
 public:
  // Connects to host:port, retrying until `connect_timeout` (the server may start
  // after its clients). Throws RcollError(kTimeout) naming the address.
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds connect_timeout);
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key);

  // The local IP address of the connection to the store: the address through
  // which this host reaches rank 0, a good default for binding data sockets.
  std::string localAddress() const { return local_address_; }
  std::string address() const;  // the store's, "host:port" ("[v6]:port")

 private:
  using Clock = std::chrono::steady_clock;

  // All of these expect mutex_ to be held.
  void connectLocked();  // (re)opens fd_, retrying until connect_timeout_
  void closeLocked();    // drops fd_; the next call reconnects
  void sendLocked(const std::vector<uint8_t>& request);
  // Reads exactly n bytes; false if `deadline` passes first (the caller reports it).
  bool recvLocked(void* buf, size_t n, Clock::time_point deadline);
  [[noreturn]] void lostConnectionLocked(const std::string& detail);

  std::mutex mutex_;  // one request at a time on the connection
  int fd_ = -1;       // -1 after a timeout or a lost connection: reconnect lazily
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds connect_timeout_;
  std::string local_address_;  // set once by the constructor, read without the lock
};

}  // namespace rcoll
