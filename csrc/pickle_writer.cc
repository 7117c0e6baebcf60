#include "pickle_writer.h"

#include <cstring>

namespace rcoll {

namespace {

// The opcodes used here (Lib/pickletools.py has them all).
constexpr uint8_t kProto = 0x80;
constexpr uint8_t kStop = '.';
constexpr uint8_t kMark = '(';
constexpr uint8_t kEmptyDict = '}';
constexpr uint8_t kSetItems = 'u';
constexpr uint8_t kEmptyList = ']';
constexpr uint8_t kAppends = 'e';
constexpr uint8_t kTuple = 't';
constexpr uint8_t kBinUnicode = 'X';  // 4-byte little-endian length, UTF-8 bytes
constexpr uint8_t kBinInt = 'J';      // 4-byte signed little-endian
constexpr uint8_t kLong1 = 0x8a;      // 1-byte length, two's complement little-endian
constexpr uint8_t kBinFloat = 'G';    // 8-byte big-endian IEEE 754
constexpr uint8_t kNewTrue = 0x88;
constexpr uint8_t kNewFalse = 0x89;
constexpr uint8_t kNone = 'N';

}  // namespace

PickleWriter::PickleWriter() {
  byte(kProto);
  byte(2);
}

void PickleWriter::littleEndian(uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) byte(static_cast<uint8_t>(value >> (8 * i)));
}

// A MARK, then the items, then one opcode that takes everything above the
// mark: dicts and lists are filled in one step however long they are.
void PickleWriter::beginDict() {
  byte(kEmptyDict);
  byte(kMark);
}
void PickleWriter::endDict() { byte(kSetItems); }
void PickleWriter::beginList() {
  byte(kEmptyList);
  byte(kMark);
}
void PickleWriter::endList() { byte(kAppends); }
void PickleWriter::beginTuple() { byte(kMark); }
void PickleWriter::endTuple() { byte(kTuple); }

void PickleWriter::str(const std::string& text) {
  byte(kBinUnicode);
  littleEndian(text.size(), 4);
  out_ += text;
}

void PickleWriter::integer(int64_t value) {
  if (value >= INT32_MIN && value <= INT32_MAX) {
    byte(kBinInt);
    littleEndian(static_cast<uint32_t>(static_cast<int32_t>(value)), 4);
    return;
  }
  byte(kLong1);
  byte(8);
  littleEndian(static_cast<uint64_t>(value), 8);
}

void PickleWriter::real(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  byte(kBinFloat);
  for (int i = 7; i >= 0; --i) byte(static_cast<uint8_t>(bits >> (8 * i)));
}

void PickleWriter::boolean(bool value) { byte(value ? kNewTrue : kNewFalse); }
void PickleWriter::none() { byte(kNone); }

std::string PickleWriter::finish() {
  byte(kStop);
  return std::move(out_);
}

}  // namespace rcoll
