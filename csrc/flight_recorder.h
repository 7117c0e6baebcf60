// The flight recorder: the last RCOLL_TRACE_BUFFER_SIZE ops of every
// communicator in this process (sequence number, op, dtype, count, root or
// peer, algorithm, path, state and times), kept always, so that when a job
// hangs or fails each rank can say what it was doing.
//
// A dump is one file per process, `RCOLL_TRACE_DIR/rcoll_trace_rank_<rank>`,
// in the format of torch's flight recorder (a pickled dict: version,
// pg_config, pg_status, entries), so torch's analyzer
// (`python -m torch.distributed.flight_recorder <dir>`) reads the dumps of a
// job and names the rank and the collective that do not match. It is written
// when a communicator fails (a timeout, a dead peer, a mismatch, an abort),
// on SIGUSR1 (when RCOLL_TRACE_DIR is set) and on request
// (rcoll.dump_trace()).
//
// As torch's does, it is one buffer for the whole process: the communicators
// are its "process groups" (pg_config: name, description, global ranks) and a
// record id orders ops across them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "arrival_log.h"
#include "dtype.h"
#include "op_kind.h"

namespace rcoll {

class FlightRecorder {
 public:
  static constexpr uint64_t kNoRecord = UINT64_MAX;

  // The one recorder of this process.
  static FlightRecorder& process();

  struct Group {
    std::string name;        // the same on every member, unique in the process
    std::string desc;        // "default_pg", or what the user named it
    std::vector<int> ranks;  // global ranks of the members, in group-rank order
  };
  // A communicator: `rank` is this process's rank in it. The first group sets
  // the process's rank (the dump file's name), the buffer's size and the
  // directory; returns the group's id.
  int addGroup(Group group, int rank, size_t capacity, const std::string& dir);
  void setGroup(int id, Group group);  // torch names its groups after creating them

  struct Op {
    int group = 0;
    OpKind kind = OpKind::kBarrier;
    DataType dtype = DataType::kUInt8;
    uint64_t count = 0;  // per rank, as the op's arguments give it
    int root = -1;       // rooted collectives; point-to-point: the peer (group rank)
    bool is_send = false;
    uint64_t seq = 0;  // the communicator's op number (collectives)
    int64_t timeout_ms = 0;
  };
  // The op was issued (state "scheduled"); kNoRecord when the recorder is off.
  uint64_t scheduled(const Op& op);
  void started(uint64_t record);
  // `algorithm` and `path`: static strings. A failed op keeps torch's state
  // "started" (it never completed); rcoll_state says "failed" and why.
  void finished(uint64_t record, bool ok, const char* algorithm, const char* path, const std::string& error = "");

  // What `python -m rcoll status` shows of this process, cheaply (a few
  // entries, not the whole buffer): per group its name and last completed
  // collective, and every op that has not finished. Groups go by id: torch
  // names a group after it is made, so a name may change under a reader.
  struct Pending {
    int group = 0;     // the group's id in this process (groups are made in the same order on every rank)
    uint64_t seq = 0;  // collectives: the op number; point-to-point: the group's p2p count
    OpKind kind = OpKind::kBarrier;
    DataType dtype = DataType::kUInt8;
    uint64_t count = 0;
    int root = -1;
    bool is_send = false;
    bool started = false;
    int64_t created_ns = 0;
    int64_t started_ns = 0;
  };
  // When this rank arrived at the group's collectives (arrival_log.h).
  struct Arrival {
    int group = 0;
    ArrivalLog::Sample sample;
  };
  struct Status {
    int rank = -1;
    std::vector<std::string> groups;      // names, by id
    std::vector<int64_t> last_completed;  // by group id
    std::vector<Pending> pending;         // oldest first
    std::vector<Arrival> arrivals;        // each group's kept samples, by group, then collective number
  };
  Status status() const;

  // Failures of this process's communicators, counted, so that the job's
  // watch round (python/rcoll/_watch.py) tells the other ranks at once:
  // failed() from the failure path; waitForFailure() returns the count once
  // it passes `seen`, or at `timeout`, or once wake() was called after the
  // caller read wakes() as `woken` (read before it checks whether to stop, so
  // that a wake between the check and the wait is not lost).
  void failed();
  uint64_t waitForFailure(uint64_t seen, std::chrono::milliseconds timeout, uint64_t woken);
  void wake();
  uint64_t wakes() const;

  // The dump, pickled; `reason` is kept in it (rcoll_reason).
  std::string pickled(const std::string& reason) const;
  // Writes the dump to `path` ("" = RCOLL_TRACE_DIR's file); returns the
  // path, or "" with no path to write to. Throws RcollError on I/O errors.
  std::string dump(const std::string& reason, const std::string& path = "");
  // dump() to RCOLL_TRACE_DIR, for failure paths and the signal: never
  // throws, logs where it wrote.
  void dumpNow(const std::string& reason) noexcept;

 private:
  FlightRecorder() = default;
  struct Entry {
    uint64_t record = kNoRecord;
    Op op;
    uint64_t p2p_seq = 0;
    int64_t collective_seq = 0;  // point-to-point: the group's last collective then (as torch records it)
    int64_t created_ns = 0;      // wall clock, as torch's
    int64_t started_ns = 0;      // 0: not yet
    int64_t finished_ns = 0;
    bool failed = false;
    const char* algorithm = "";
    const char* path = "";
    std::string error;
  };
  Entry* find(uint64_t record);  // with mutex_ held
  void writeEntry(class PickleWriter& w, const Entry& e) const;

  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  uint64_t next_record_ = 0;
  std::vector<Group> groups_;
  std::vector<int> group_ranks_;       // this process's rank in each group
  std::vector<uint64_t> p2p_counts_;   // per group: point-to-point ops so far
  std::vector<int64_t> last_started_;  // per group: pg_status
  std::vector<int64_t> last_completed_;
  std::vector<int64_t> last_enqueued_;
  std::vector<ArrivalLog> arrivals_;  // per group
  int rank_ = -1;
  std::string dir_;
  std::condition_variable failure_cv_;
  uint64_t failures_ = 0;
  uint64_t wakes_ = 0;
  size_t capacity_ = 0;
};

}  // namespace rcoll
