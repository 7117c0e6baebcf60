#include "flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "error.h"
#include "log.h"
#include "pickle_writer.h"

namespace rcoll {

namespace {

// The dump format's version: torch's analyzer reads "major.minor" and picks
// its matching rules by it (2.10 is what torch 2.13 writes).
constexpr const char* kTraceVersion = "2.10";
// torch's analyzer accepts a fixed set of library names before the ':' of an
// op's name; rcoll's ops take Gloo's (the library whose ops they replace) and
// say "rcoll" in comm_lib_version.
constexpr const char* kLibraryTag = "gloo";

int64_t wallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void sizes(PickleWriter& w, int64_t elements) {
  w.beginList();
  w.beginList();
  w.integer(elements);
  w.endList();
  w.endList();
}

void dtypes(PickleWriter& w, DataType dtype) {
  w.beginList();
  w.str(torchDtypeName(dtype));
  w.endList();
}

std::string ranksText(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

int signal_pipe[2] = {-1, -1};

void onDumpSignal(int) {
  const int saved = errno;
  const char b = 1;
  const ssize_t n = ::write(signal_pipe[1], &b, 1);  // async-signal-safe; a full pipe means a dump is due anyway
  (void)n;
  errno = saved;
}

// SIGUSR1 dumps, from a thread of its own (a signal handler may do almost
// nothing). A handler someone else installed is left alone.
void installDumpSignal() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGUSR1, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) {
      RCOLL_INFO("SIGUSR1 has a handler already: the flight recorder does not dump on it");
      return;
    }
    if (::pipe2(signal_pipe, O_CLOEXEC) != 0) return;
    ::fcntl(signal_pipe[1], F_SETFL, O_NONBLOCK);
    std::thread([] {
      for (;;) {
        char b;
        const ssize_t n = ::read(signal_pipe[0], &b, 1);
        if (n > 0) {
          FlightRecorder::process().dumpNow("SIGUSR1");
        } else if (n < 0 && errno == EINTR) {
          continue;
        } else {
          return;
        }
      }
    }).detach();
    struct sigaction sa {};
    sa.sa_handler = onDumpSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &sa, nullptr);
  });
}

}  // namespace

FlightRecorder& FlightRecorder::process() {
  // Never destroyed: ops may still finish on other threads while the process exits.
  static FlightRecorder* recorder = new FlightRecorder();
  return *recorder;
}

int FlightRecorder::addGroup(Group group, int rank, size_t capacity, const std::string& dir) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (groups_.empty()) {
    rank_ = group.ranks.empty() ? rank : group.ranks[static_cast<size_t>(rank)];
    capacity_ = capacity;
    ring_.assign(capacity, Entry{});
    dir_ = dir;
    if (!dir_.empty() && capacity > 0) installDumpSignal();
  }
  groups_.push_back(std::move(group));
  group_ranks_.push_back(rank);
  p2p_counts_.push_back(0);
  last_enqueued_.push_back(-1);
  last_started_.push_back(-1);
  last_completed_.push_back(-1);
  arrivals_.emplace_back();
  return static_cast<int>(groups_.size() - 1);
}

void FlightRecorder::setGroup(int id, Group group) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id < 0 || static_cast<size_t>(id) >= groups_.size()) return;
  if (id == 0 && !group.ranks.empty()) rank_ = group.ranks[static_cast<size_t>(group_ranks_[0])];
  groups_[static_cast<size_t>(id)] = std::move(group);
}

uint64_t FlightRecorder::scheduled(const Op& op) {
  if (capacity_ == 0) return kNoRecord;
  const int64_t now = wallNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t record = next_record_++;
  Entry& e = ring_[record % capacity_];
  // Field by field: no temporary Entry (its string) on every op.
  e.record = record;
  e.op = op;
  e.created_ns = now;
  e.started_ns = 0;
  e.finished_ns = 0;
  e.failed = false;
  e.algorithm = "";
  e.path = "";
  e.error.clear();
  const size_t g = static_cast<size_t>(op.group);
  if (op.kind == OpKind::kPointToPoint) {
    e.p2p_seq = ++p2p_counts_[g];
    e.collective_seq = std::max<int64_t>(last_enqueued_[g], 0);
  } else {
    e.p2p_seq = p2p_counts_[g];
    e.collective_seq = static_cast<int64_t>(op.seq);
    last_enqueued_[g] = static_cast<int64_t>(op.seq);
  }
  return record;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t record) {
  if (record == kNoRecord || capacity_ == 0) return nullptr;
  Entry& e = ring_[record % capacity_];
  return e.record == record ? &e : nullptr;  // else overwritten by newer ops
}

void FlightRecorder::started(uint64_t record) {
  if (record == kNoRecord) return;
  const int64_t now = wallNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(record)) {
    e->started_ns = now;
    if (e->op.kind != OpKind::kPointToPoint) last_started_[static_cast<size_t>(e->op.group)] = e->op.seq;
  }
}

void FlightRecorder::finished(uint64_t record, bool ok, const char* algorithm, const char* path,
                              const std::string& error) {
  if (record == kNoRecord) return;
  const int64_t now = wallNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  Entry* e = find(record);
  if (e == nullptr) return;
  if (e->started_ns == 0) e->started_ns = now;
  e->finished_ns = now;
  e->failed = !ok;
  e->algorithm = algorithm ? algorithm : "";
  e->path = path ? path : "";
  e->error = error;
  if (ok && e->op.kind != OpKind::kPointToPoint) {
    last_completed_[static_cast<size_t>(e->op.group)] = e->op.seq;
    if (const OpTraits* traits = findOpTraits(e->op.kind)) {
      arrivals_[static_cast<size_t>(e->op.group)].finished(e->op.seq, traits->rooted, e->created_ns, now);
    }
  }
}

void FlightRecorder::writeEntry(PickleWriter& w, const Entry& e) const {
  const Op& op = e.op;
  const Group& g = groups_[static_cast<size_t>(op.group)];
  const int me = group_ranks_[static_cast<size_t>(op.group)];
  const int64_t world = static_cast<int64_t>(g.ranks.size());
  const int64_t count = static_cast<int64_t>(op.count);
  const bool p2p = op.kind == OpKind::kPointToPoint;
  std::string name = std::string(kLibraryTag) + ":";
  if (p2p) {
    name += op.is_send ? "send " + std::to_string(me) + "->" + std::to_string(op.root)
                       : "recv " + std::to_string(me) + "<-" + std::to_string(op.root);
  } else {
    const OpTraits* traits = findOpTraits(op.kind);
    name += traits ? traits->trace_name : "barrier";
  }
  int64_t in = count, out = count;
  switch (op.kind) {
    case OpKind::kAllgather:
    case OpKind::kGather:
      out = count * world;
      break;
    case OpKind::kReduceScatter:
    case OpKind::kScatter:
      in = count * world;
      break;
    default:
      break;
  }
  const bool completed = e.finished_ns != 0 && !e.failed;
  w.beginDict();
  w.str("record_id");
  w.integer(static_cast<int64_t>(e.record));
  w.str("pg_id");
  w.integer(op.group);
  w.str("process_group");
  w.beginTuple();
  w.str(g.name);
  w.str(g.desc);
  w.endTuple();
  w.str("collective_seq_id");
  w.integer(e.collective_seq);
  w.str("p2p_seq_id");
  w.integer(static_cast<int64_t>(e.p2p_seq));
  w.str("op_id");
  w.integer(static_cast<int64_t>(e.record));
  w.str("profiling_name");
  w.str(name);
  w.str("time_created_ns");
  w.integer(e.created_ns);
  w.str("input_sizes");
  sizes(w, in);
  w.str("input_dtypes");
  dtypes(w, op.dtype);
  w.str("output_sizes");
  sizes(w, out);
  w.str("output_dtypes");
  dtypes(w, op.dtype);
  w.str("state");
  w.str(completed ? "completed" : e.started_ns != 0 ? "started" : "scheduled");
  w.str("time_discovered_started_ns");
  if (e.started_ns != 0) {
    w.integer(e.started_ns);
  } else {
    w.none();
  }
  w.str("time_discovered_completed_ns");
  if (completed) {
    w.integer(e.finished_ns);
  } else {
    w.none();
  }
  if (completed) {
    w.str("duration_ms");
    w.real(static_cast<double>(e.finished_ns - e.started_ns) / 1e6);
  }
  w.str("retired");
  w.boolean(e.finished_ns != 0);
  w.str("timeout_ms");
  w.integer(op.timeout_ms);
  w.str("is_p2p");
  w.boolean(p2p);
  w.str("frames");
  w.beginList();
  w.endList();
  // rcoll's own: its state names, what ran the op, and why it failed.
  w.str("rcoll_state");
  w.str(e.finished_ns == 0 ? (e.started_ns != 0 ? "started" : "queued") : e.failed ? "failed" : "finished");
  w.str("rcoll_op");
  w.str(opKindName(op.kind));
  w.str("rcoll_root");
  w.integer(op.root);
  w.str("rcoll_algorithm");
  w.str(e.algorithm);
  w.str("rcoll_path");
  w.str(e.path);
  w.str("rcoll_error");
  w.str(e.error);
  w.endDict();
}

void FlightRecorder::failed() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++failures_;
  }
  failure_cv_.notify_all();
}

uint64_t FlightRecorder::waitForFailure(uint64_t seen, std::chrono::milliseconds timeout, uint64_t woken) {
  std::unique_lock<std::mutex> lock(mutex_);
  failure_cv_.wait_for(lock, timeout, [&] { return failures_ > seen || wakes_ != woken; });
  return failures_;
}

uint64_t FlightRecorder::wakes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return wakes_;
}

void FlightRecorder::wake() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++wakes_;
  }
  failure_cv_.notify_all();
}

FlightRecorder::Status FlightRecorder::status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Status st;
  st.rank = rank_;
  for (const Group& g : groups_) st.groups.push_back(g.name);
  st.last_completed = last_completed_;
  const uint64_t first = next_record_ > capacity_ ? next_record_ - capacity_ : 0;
  for (uint64_t r = first; r < next_record_; ++r) {
    const Entry& e = ring_[r % capacity_];
    if (e.record != r || e.finished_ns != 0) continue;
    Pending p;
    p.group = e.op.group;
    p.seq = e.op.kind == OpKind::kPointToPoint ? e.p2p_seq : e.op.seq;
    p.kind = e.op.kind;
    p.dtype = e.op.dtype;
    p.count = e.op.count;
    p.root = e.op.root;
    p.is_send = e.op.is_send;
    p.started = e.started_ns != 0;
    p.created_ns = e.created_ns;
    p.started_ns = e.started_ns;
    st.pending.push_back(std::move(p));
  }
  for (size_t g = 0; g < arrivals_.size(); ++g) {
    for (const ArrivalLog::Sample& sample : arrivals_[g].samples())
      st.arrivals.push_back({static_cast<int>(g), sample});
  }
  return st;
}

std::string FlightRecorder::pickled(const std::string& reason) const {
  std::lock_guard<std::mutex> lock(mutex_);
  PickleWriter w;
  w.beginDict();
  w.str("version");
  w.str(kTraceVersion);
  w.str("comm_lib_version");
  w.str("rcoll");
  w.str("rcoll_reason");
  w.str(reason);
  w.str("rank");
  w.integer(rank_);
  w.str("pg_config");
  w.beginDict();
  for (const Group& g : groups_) {
    w.str(g.name);
    w.beginDict();
    w.str("name");
    w.str(g.name);
    w.str("desc");
    w.str(g.desc);
    w.str("ranks");
    w.str(ranksText(g.ranks));
    w.endDict();
  }
  w.endDict();
  w.str("pg_status");
  w.beginDict();
  for (size_t g = 0; g < groups_.size(); ++g) {
    w.str(std::to_string(g));
    w.beginDict();
    w.str("last_enqueued_collective");
    w.integer(last_enqueued_[g]);
    w.str("last_started_collective");
    w.integer(last_started_[g]);
    w.str("last_completed_collective");
    w.integer(last_completed_[g]);
    w.endDict();
  }
  w.endDict();
  // Oldest first, as torch writes them.
  w.str("entries");
  w.beginList();
  const uint64_t first = next_record_ > capacity_ ? next_record_ - capacity_ : 0;
  for (uint64_t r = first; r < next_record_; ++r) {
    const Entry& e = ring_[r % capacity_];
    if (e.record == r) writeEntry(w, e);
  }
  w.endList();
  w.endDict();
  return w.finish();
}

std::string FlightRecorder::dump(const std::string& reason, const std::string& path) {
  std::string target = path;
  if (target.empty()) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dir_.empty()) return "";
    target = dir_ + "/rcoll_trace_rank_" + std::to_string(rank_);
  }
  const std::string data = pickled(reason);
  // Written whole under another name, then renamed: an analyzer (or a second
  // dump) never reads half a file. One dump at a time, and a temporary name
  // that torch's analyzer does not take for a rank's file if a kill leaves it.
  static std::mutex dumping;
  static uint64_t dumps = 0;
  std::lock_guard<std::mutex> one_at_a_time(dumping);
  const size_t slash = target.rfind('/');
  const std::string partial = target.substr(0, slash == std::string::npos ? 0 : slash + 1) + ".rcoll-tmp-" +
                              std::to_string(::getpid()) + "-" + std::to_string(++dumps) + ".part";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) {
    throwError(ErrorKind::kConfig,
               strFormat("cannot write the flight recorder's dump to %s: %s", partial.c_str(), std::strerror(errno)));
  }
  const bool written = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(partial.c_str(), target.c_str()) != 0) {
    const int err = errno;
    std::remove(partial.c_str());
    throwError(ErrorKind::kConfig,
               strFormat("cannot write the flight recorder's dump to %s: %s", target.c_str(), std::strerror(err)));
  }
  return target;
}

void FlightRecorder::dumpNow(const std::string& reason) noexcept {
  try {
    const std::string path = dump(reason);
    if (!path.empty()) RCOLL_WARN("the flight recorder's last ops are in %s", path.c_str());
  } catch (const std::exception& e) {
    RCOLL_WARN("%s", e.what());
  }
}

}  // namespace rcoll
