// Messages that came before their receive was posted, by their number on the
// pair (WireHeader::message).
//
// Where a pair's messages are spread over several networks, every socket is
// read as soon as bytes arrive: the acknowledgements and failure reports that
// share the stream with the data (lane_control.h) must never wait behind a
// message nobody has asked for yet. Such a message is held here until its
// receive is posted, up to a bound; past it the socket is left unread, which
// pushes back on the sender as a full socket buffer would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

#include "wire.h"

namespace rcoll {

class MessageStash {
 public:
  struct Message {
    WireHeader header{};
    std::unique_ptr<char[]> data;
    size_t done = 0;  // payload bytes read so far
  };

  explicit MessageStash(size_t bound = size_t{64} << 20) : bound_(bound) {}

  // Whether a message of `bytes` may be held now.
  bool fits(uint64_t bytes) const { return held_ <= bound_ && bytes <= bound_ - held_; }  // no overflow

  // A buffer for an incoming message, counted against the bound at once.
  std::unique_ptr<Message> start(const WireHeader& header) {
    auto m = std::make_unique<Message>();
    m->header = header;
    m->data.reset(new char[header.bytes > 0 ? header.bytes : 1]);
    held_ += header.bytes;
    return m;
  }
  // A started message that will not be completed (its socket failed).
  void drop(const Message& m) { held_ -= m.header.bytes; }

  void put(std::unique_ptr<Message> m) {
    const uint32_t number = m->header.message;
    held_by_number_[number] = std::move(m);
  }
  const Message* find(uint32_t number) const {
    auto it = held_by_number_.find(number);
    return it == held_by_number_.end() ? nullptr : it->second.get();
  }
  void erase(uint32_t number) {
    auto it = held_by_number_.find(number);
    if (it == held_by_number_.end()) return;
    held_ -= it->second->header.bytes;
    held_by_number_.erase(it);
  }
  void clear() {
    held_by_number_.clear();
    held_ = 0;
  }

 private:
  size_t bound_;
  size_t held_ = 0;  // payload bytes held or being read
  std::unordered_map<uint32_t, std::unique_ptr<Message>> held_by_number_;
};

}  // namespace rcoll
