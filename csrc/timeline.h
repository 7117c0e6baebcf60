// RCOLL_TIMELINE: a Chrome-trace (JSON array format) of what each op spent its
// time on, for chrome://tracing or ui.perfetto.dev.
//
// One file per rank (RCOLL_TIMELINE=/tmp/rcoll -> /tmp/rcoll.rank3.json), pid =
// rank, so files of all ranks can be loaded together. Row (tid) 0 holds the
// collectives in order, row 1 point-to-point messages. Each collective is one
// slice with nested phases: "queue" (enqueued, waiting for earlier ops),
// "wait for peers" (running, nothing arrived yet), "transfer" (data moving) and
// "reduce" slices inside it. Timestamps are wall-clock microseconds, so ranks
// line up as well as their clocks do.
//
// Events are written as they end (buffered by stdio) and the closing bracket is
// added when the communicator closes, or at the process's exit for a
// communicator still open then; a file cut short by a crash still opens in
// Chrome's viewer, which accepts a missing bracket.
#pragma once

#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

namespace rcoll {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // The trace of one communicator under the prefix `base` (RCOLL_TIMELINE), or
  // null when `base` is empty; throws RcollError(kConfig) if the file cannot be created.
  static std::unique_ptr<Timeline> open(const std::string& base, int rank);

  Timeline(const std::string& path, int rank);
  ~Timeline();  // closes the array
  // Closes the array and the file; later slices are dropped. Idempotent.
  void close();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Thread-safe. `args` is a JSON object body ("\"count\": 3") or empty.
  void slice(int row, const std::string& name, const char* category, Clock::time_point start, Clock::time_point end,
             const std::string& args = "");
  // Thread-safe: a label the viewer shows under the rank's name (here: the
  // transport of each of its edges).
  void label(const std::string& text);
  const std::string& path() const { return path_; }

 private:
  long long micros(Clock::time_point t) const;

  std::string path_;
  int rank_;
  std::FILE* file_ = nullptr;
  bool first_ = true;
  std::mutex mutex_;
  Clock::time_point steady_origin_;
  long long wall_origin_us_ = 0;
};

// JSON string escaping for names and args.
std::string jsonEscape(const std::string& text);

}  // namespace rcoll
