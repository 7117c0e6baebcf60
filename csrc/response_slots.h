// The slots of a negotiating front end's response cache (Horovod's): the ops
// that ran before, each in a numbered slot, least recently run evicted first.
//
// A slot names the same op on every rank because the table changes only when
// an op runs, and ops run in one order everywhere; so a cached round can
// agree on a bit per slot (agreed_reduce.h) instead of on names. Each entry
// may carry a key, this rank's description of the op as it ran (dtype, op,
// shape): an op submitted again under its name with an equal key is the same
// op, without comparing every rank's metadata. What else the front end keeps
// per slot (every rank's metadata) it keeps itself, by slot number.
//
// Not thread-safe: its owner serializes calls (rcoll._core.QuickLane: the GIL).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace rcoll {

class ResponseSlots {
 public:
  explicit ResponseSlots(size_t capacity);

  struct Found {
    size_t slot;
    const std::optional<std::string>* key;  // valid until the next change
  };
  // The slot of `name`, if it ran before.
  std::optional<Found> find(const std::string& name) const;
  // The slot of `name` if it ran last with this key.
  std::optional<size_t> slotWithKey(const std::string& name, const std::string& key) const;

  struct Ran {
    size_t slot;
    std::optional<std::string> evicted;  // the name whose slot this one took
  };
  // Records that `name` ran (with `key`): it keeps its slot or takes a free
  // one, or the least recently run entry's when the table is full. It becomes
  // the most recently run.
  Ran ran(const std::string& name, std::optional<std::string> key);
  // Records that `name` ran again as it was (its key unchanged). False if it has no slot.
  bool ranAgain(const std::string& name);

  const std::string& nameAt(size_t slot) const;  // throws std::out_of_range for a free slot
  size_t size() const { return by_name_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    std::string name;
    size_t slot;
    std::optional<std::string> key;
  };
  size_t capacity_;
  std::list<Entry> order_;  // least recently run first
  std::unordered_map<std::string, std::list<Entry>::iterator> by_name_;
  std::vector<std::list<Entry>::iterator> by_slot_;  // slots in use, 0..size()-1
};

// The key of a host allreduce of one tensor with no scaling, as ResponseSlots
// stores it: dtype and reduce op codes and the shape, so a tensor of another
// shape (the same element count included) is another op.
std::string allreduceCacheKey(int dtype, int op, const std::vector<int64_t>& shape);

}  // namespace rcoll
