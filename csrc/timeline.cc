#include "timeline.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <set>

#include "error.h"

namespace rcoll {

namespace {

// The timelines that are open in this process. A job that exits without
// shutting its communicators down (no destroy_process_group(), as DeepSpeed's
// and many users' scripts end) still gets complete files: an exit handler
// closes each one's array, so the file is strict JSON, not only what Chrome's
// lenient reader accepts.
struct OpenTimelines {
  std::mutex mutex;
  std::set<Timeline*> open;
};

OpenTimelines& openTimelines() {
  static auto* registry = new OpenTimelines();  // never destroyed: the exit handler may run after static destructors
  return *registry;
}

void closeTimelinesAtExit() {
  auto& registry = openTimelines();
  std::lock_guard<std::mutex> lock(registry.mutex);
  for (Timeline* timeline : registry.open) timeline->close();
}

}  // namespace

std::unique_ptr<Timeline> Timeline::open(const std::string& base, int rank) {
  if (base.empty()) return nullptr;
  // One file per communicator: torch sub-groups live in the same process as
  // the default group, and two writers of one file would interleave. Ranks
  // create their groups in the same order, so the numbers match across ranks.
  static std::atomic<int> opened{0};
  const int k = ++opened;
  return std::make_unique<Timeline>(k == 1 ? strFormat("%s.rank%d.json", base.c_str(), rank)
                                           : strFormat("%s.rank%d.comm%d.json", base.c_str(), rank, k),
                                    rank);
}

Timeline::Timeline(const std::string& path, int rank) : path_(path), rank_(rank), steady_origin_(Clock::now()) {
  wall_origin_us_ =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  file_ = std::fopen(path_.c_str(), "w");
  if (file_ == nullptr) {
    throwError(ErrorKind::kConfig, strFormat("RCOLL_TIMELINE: cannot create %s", path_.c_str()));
  }
  std::fprintf(file_, "[\n");
  // Names for the process and its two rows in the viewer.
  std::fprintf(file_,
               "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n"
               "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": "
               "\"collectives\"}},\n"
               "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": "
               "\"send/recv\"}}",
               rank_, rank_, rank_, rank_);
  first_ = false;
  auto& registry = openTimelines();
  std::lock_guard<std::mutex> lock(registry.mutex);
  static const bool handler_registered = std::atexit(closeTimelinesAtExit) == 0;
  (void)handler_registered;
  registry.open.insert(this);
}

Timeline::~Timeline() {
  {
    auto& registry = openTimelines();
    std::lock_guard<std::mutex> lock(registry.mutex);
    registry.open.erase(this);
  }
  close();
}

void Timeline::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;
  std::fprintf(file_, "\n]\n");
  std::fclose(file_);
  file_ = nullptr;
}

void Timeline::label(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;
  std::fprintf(file_, ",\n{\"name\": \"process_labels\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"labels\": \"%s\"}}",
               rank_, jsonEscape(text).c_str());
}

long long Timeline::micros(Clock::time_point t) const {
  return wall_origin_us_ + std::chrono::duration_cast<std::chrono::microseconds>(t - steady_origin_).count();
}

void Timeline::slice(int row, const std::string& name, const char* category, Clock::time_point start,
                     Clock::time_point end, const std::string& args) {
  const long long ts = micros(start);
  const long long dur = std::max<long long>(0, micros(end) - ts);
  std::lock_guard<std::mutex> lock(mutex_);
  if (file_ == nullptr) return;  // closed at exit while an op was still finishing
  std::fprintf(file_,
               "%s{\"name\": \"%s\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, "
               "\"ts\": %lld, \"dur\": %lld, \"args\": {%s}}",
               first_ ? "" : ",\n", jsonEscape(name).c_str(), category, rank_, row, ts, dur, args.c_str());
  first_ = false;
}

std::string jsonEscape(const std::string& text) {
  std::string out;
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      out += strFormat("\\u%04x", c);
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace rcoll
