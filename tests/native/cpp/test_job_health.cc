// What the job's health judgement is built on, without a network: the edge
// meter (csrc/edge_meter.h: overlapping transfers counted once, an end with
// no start ignored, a given-up transfer's time kept), the arrival log
// (csrc/arrival_log.h: waits and time away per collective, rooted ones only
// as the "previous", the three rings' numbers kept and merged) and the watch's
// wake-up (a wake between reading wakes() and waiting is not lost).
#include <chrono>
#include <thread>

#include "arrival_log.h"
#include "edge_meter.h"
#include "flight_recorder.h"
#include "unit_check.h"

using rcoll::ArrivalLog;
using rcoll::EdgeMeter;
using rcoll::FlightRecorder;
using unit::check;

namespace {

void sleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

void edgeMeter() {
  EdgeMeter meter(3);
  check(!EdgeMeter::metered(EdgeMeter::kMeteredBytes - 1) && EdgeMeter::metered(EdgeMeter::kMeteredBytes),
        "only large payloads are metered");
  meter.ended(1, 100);  // no start: nothing counts
  check(meter.sample(1).bytes == 0 && meter.sample(1).nanos == 0, "an end without a start is ignored");
  // Two overlapping transfers, 20 ms in all: counted once, not twice.
  meter.began(1);
  sleepMs(10);
  meter.began(1);
  sleepMs(10);
  meter.ended(1, 1000);
  meter.ended(1, 2000);
  const EdgeMeter::Sample s = meter.sample(1);
  check(s.bytes == 3000, "both transfers' bytes count");
  check(s.nanos >= 19'000'000 && s.nanos < 200'000'000, "overlapping time counts once: " + std::to_string(s.nanos));
  // Idle time between transfers does not count.
  sleepMs(30);
  meter.began(1);
  meter.ended(1, 0);  // given up: its (short) time counts, no bytes
  check(meter.sample(1).nanos - s.nanos < 20'000'000, "idle time does not count");
  check(meter.sample(1).bytes == 3000, "a given-up transfer adds no bytes");
  check(meter.sample(0).bytes == 0 && meter.sample(7).bytes == 0 && meter.sample(-1).bytes == 0,
        "other and unknown peers have nothing");
  meter.began(9);  // out of range: ignored, no crash
}

void arrivalLog() {
  ArrivalLog log;
  // seq 1 (allreduce) waits 5; seq 2 is a broadcast (rooted) ending at 40;
  // seq 3 is called at 70: 30 away from the broadcast's end.
  log.finished(1, false, 0, 5);
  log.finished(2, true, 10, 40);
  log.finished(3, false, 70, 100);
  log.finished(5, false, 200, 210);  // seq 4 not seen: time away unknown
  std::vector<ArrivalLog::Sample> s = log.samples();
  check(s.size() == 3, "rooted collectives are not samples: " + std::to_string(s.size()));
  check(s[0].seq == 1 && s[0].wait_ns == 5 && s[0].away_ns == ArrivalLog::kUnknown, "the first has no time away");
  check(s[1].seq == 3 && s[1].wait_ns == 30 && s[1].away_ns == 30, "away: from the previous collective's end");
  check(s[2].seq == 5 && s[2].away_ns == ArrivalLog::kUnknown, "a gap in the numbers: away unknown");

  // Many collectives: the last kPerRing of every number, and of the
  // multiples of 16 and 256, each number once, in order.
  ArrivalLog many;
  const uint64_t n = 100'000;
  for (uint64_t seq = 1; seq <= n; ++seq)
    many.finished(seq, false, static_cast<int64_t>(seq), static_cast<int64_t>(seq) + 1);
  s = many.samples();
  bool ordered = true;
  size_t by16 = 0, by256 = 0, recent = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0 && s[i].seq <= s[i - 1].seq) ordered = false;
    if (s[i].seq > n - ArrivalLog::kPerRing) ++recent;
    if (s[i].seq % 16 == 0 && s[i].seq > n - 16 * ArrivalLog::kPerRing) ++by16;
    if (s[i].seq % 256 == 0) ++by256;
  }
  check(ordered, "samples come once each, by number");
  check(recent == ArrivalLog::kPerRing, "the last kPerRing collectives are kept");
  check(by16 == ArrivalLog::kPerRing, "so are the last kPerRing multiples of 16: " + std::to_string(by16));
  check(by256 == ArrivalLog::kPerRing, "and of 256: " + std::to_string(by256));
  check(s.front().seq == n - n % 256 - 256 * (ArrivalLog::kPerRing - 1), "the oldest is the 256 ring's oldest");
}

void wakeIsNotLost() {
  FlightRecorder& recorder = FlightRecorder::process();
  // The watch reads wakes(), then a stop wakes it before it waits: the wait ends at once.
  const uint64_t woken = recorder.wakes();
  recorder.wake();
  const auto start = std::chrono::steady_clock::now();
  recorder.waitForFailure(0, std::chrono::seconds(10), woken);
  check(std::chrono::steady_clock::now() - start < std::chrono::seconds(5), "a wake before the wait is not lost");
  // With nothing new, the wait lasts its timeout.
  const auto again = std::chrono::steady_clock::now();
  recorder.waitForFailure(0, std::chrono::milliseconds(50), recorder.wakes());
  check(std::chrono::steady_clock::now() - again >= std::chrono::milliseconds(45), "no wake: the wait times out");
}

}  // namespace

int main() {
  edgeMeter();
  arrivalLog();
  wakeIsNotLost();
  return unit::finishUnit("test_job_health");
}
