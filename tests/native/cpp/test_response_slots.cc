// The response cache's slot table (csrc/response_slots.h): slots handed out
// in order, an op keeping its slot, the least recently run giving its slot up
// when the table is full (ranAgain counts as a run), keys compared exactly,
// and two tables fed the same runs ending the same (what every rank relies on).
#include <optional>
#include <stdexcept>
#include <string>

#include "response_slots.h"
#include "unit_check.h"

using rcoll::allreduceCacheKey;
using rcoll::ResponseSlots;
using unit::check;

namespace {

void slotsInOrder() {
  ResponseSlots slots(3);
  check(slots.ran("a", std::nullopt).slot == 0, "first op takes slot 0");
  check(slots.ran("b", std::string("kb")).slot == 1, "second op takes slot 1");
  auto again = slots.ran("a", std::string("ka"));
  check(again.slot == 0 && !again.evicted, "an op that runs again keeps its slot and evicts nothing");
  check(slots.size() == 2 && slots.nameAt(1) == "b", "size and nameAt");
  check(slots.slotWithKey("a", "ka") == std::optional<size_t>(0), "the key it ran with last finds it");
  check(!slots.slotWithKey("a", "kb"), "another key does not");
  check(!slots.slotWithKey("c", "ka"), "an op that never ran has no slot");
  auto found = slots.find("b");
  check(found && found->slot == 1 && *found->key == std::optional<std::string>("kb"), "find gives slot and key");
  slots.ran("b", std::nullopt);
  check(!slots.slotWithKey("b", "kb"), "an op that ran without a key matches no key");
  bool threw = false;
  try {
    slots.nameAt(2);
  } catch (const std::out_of_range&) {
    threw = true;
  }
  check(threw, "nameAt of a free slot throws");
}

void leastRecentlyRunGoes() {
  ResponseSlots slots(2);
  slots.ran("a", std::nullopt);
  slots.ran("b", std::nullopt);
  check(slots.ranAgain("a"), "ranAgain of a cached op");
  check(!slots.ranAgain("zz"), "ranAgain of an unknown op is refused");
  auto ran = slots.ran("c", std::nullopt);  // b ran least recently
  check(ran.slot == 1 && ran.evicted == std::optional<std::string>("b"), "c takes b's slot");
  check(!slots.find("b") && slots.nameAt(1) == "c" && slots.size() == 2, "b is gone, c holds slot 1");
  ran = slots.ran("d", std::nullopt);  // then a
  check(ran.slot == 0 && ran.evicted == std::optional<std::string>("a"), "d takes a's slot");
}

void sameRunsSameTable() {
  ResponseSlots one(4), other(4);
  for (int step = 0; step < 200; ++step) {
    const std::string name = "op" + std::to_string((step * 7) % 9);
    const auto a = one.ran(name, std::nullopt);
    const auto b = other.ran(name, std::string("a key of this rank's"));  // keys are per rank
    if (step % 5 == 0) {
      one.ranAgain(name);
      other.ranAgain(name);
    }
    check(a.slot == b.slot && a.evicted == b.evicted, "two ranks running the same ops keep the same slots");
  }
}

void keys() {
  check(allreduceCacheKey(6, 0, {2, 3}) == "allreduce:6:0:2x3", "key format");
  check(allreduceCacheKey(6, 0, {6}) != allreduceCacheKey(6, 0, {2, 3}), "another shape of as many elements differs");
  check(allreduceCacheKey(6, 0, {}) != allreduceCacheKey(6, 0, {1}), "a scalar differs from one element");
  check(allreduceCacheKey(6, 1, {2}) != allreduceCacheKey(6, 0, {2}), "another op differs");
}

void noCapacity() {
  ResponseSlots slots(0);
  bool threw = false;
  try {
    slots.ran("a", std::nullopt);
  } catch (const std::logic_error&) {
    threw = true;
  }
  check(threw && slots.size() == 0, "a table of no slots records nothing");
}

}  // namespace

int main() {
  slotsInOrder();
  leastRecentlyRunGoes();
  sameRunsSameTable();
  keys();
  noCapacity();
  return unit::finishUnit("test_response_slots");
}
