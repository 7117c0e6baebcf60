#include "response_slots.h"

#include <stdexcept>

namespace rcoll {

ResponseSlots::ResponseSlots(size_t capacity) : capacity_(capacity) { by_slot_.reserve(capacity); }

std::optional<ResponseSlots::Found> ResponseSlots::find(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return Found{it->second->slot, &it->second->key};
}

std::optional<size_t> ResponseSlots::slotWithKey(const std::string& name, const std::string& key) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end() || !it->second->key || *it->second->key != key) return std::nullopt;
  return it->second->slot;
}

ResponseSlots::Ran ResponseSlots::ran(const std::string& name, std::optional<std::string> key) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    it->second->key = std::move(key);
    order_.splice(order_.end(), order_, it->second);
    return {it->second->slot, std::nullopt};
  }
  if (capacity_ == 0) throw std::logic_error("ResponseSlots::ran with a capacity of 0");
  Ran result{0, std::nullopt};
  if (by_name_.size() < capacity_) {
    result.slot = by_slot_.size();
    order_.push_back(Entry{name, result.slot, std::move(key)});
    by_slot_.push_back(std::prev(order_.end()));
  } else {
    // The least recently run gives up its slot: the same choice on every rank.
    auto oldest = order_.begin();
    result.slot = oldest->slot;
    result.evicted = std::move(oldest->name);
    by_name_.erase(*result.evicted);
    oldest->name = name;
    oldest->key = std::move(key);
    order_.splice(order_.end(), order_, oldest);
  }
  by_name_[name] = by_slot_[result.slot];
  return result;
}

bool ResponseSlots::ranAgain(const std::string& name) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return false;
  order_.splice(order_.end(), order_, it->second);
  return true;
}

const std::string& ResponseSlots::nameAt(size_t slot) const {
  if (slot >= by_slot_.size()) throw std::out_of_range("ResponseSlots: slot " + std::to_string(slot) + " is free");
  return by_slot_[slot]->name;
}

std::string allreduceCacheKey(int dtype, int op, const std::vector<int64_t>& shape) {
  std::string key = "allreduce:" + std::to_string(dtype) + ":" + std::to_string(op) + ":";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) key += 'x';
    key += std::to_string(shape[i]);
  }
  return key;
}

}  // namespace rcoll
