// Python's pickle format (protocol 2), written from C++: the flight
// recorder's dumps are read by torch's flight-recorder analyzer, which loads
// them with pickle.load. Only what those dumps hold: dicts, lists, tuples,
// str, int, float, bool and None, written in order (a value after each key).
#pragma once

#include <cstdint>
#include <string>

namespace rcoll {

class PickleWriter {
 public:
  PickleWriter();
  // Containers: begin, the items (a dict's as key, value, key, value...), end.
  void beginDict();
  void endDict();
  void beginList();
  void endList();
  void beginTuple();
  void endTuple();
  void str(const std::string& text);  // UTF-8
  void integer(int64_t value);
  void real(double value);
  void boolean(bool value);
  void none();
  // The whole pickle (with its STOP); the writer is done after this.
  std::string finish();

 private:
  void byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void littleEndian(uint64_t value, int bytes);

  std::string out_;
};

}  // namespace rcoll
