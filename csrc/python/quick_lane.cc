#include "python/quick_lane.h"

#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agreed_reduce.h"
#include "communicator.h"
#include "dtype.h"
#include "python/gil.h"
#include "response_slots.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace rcoll::python {
namespace {

constexpr uint8_t kCachedOnly = 0xFF;  // a cached round's first byte when this rank has nothing else (controller.py)

class QuickLane {
 public:
  QuickLane(std::shared_ptr<Communicator> comm, uintptr_t offer, uintptr_t agreed, size_t cache_capacity,
            size_t inline_bytes)
      : comm_(std::move(comm)), slots_(cache_capacity), offer_(reinterpret_cast<uint8_t*>(offer)) {
    args_.offer = offer_;
    args_.agreed = reinterpret_cast<uint8_t*>(agreed);
    args_.candidates_at = 1;
    args_.payload_capacity = inline_bytes;
  }

  // -- the gate: one word that every thread driving a round claims ------------------
  bool tryDrive() { return (state_.fetch_or(kDriving) & kDriving) == 0; }
  void endDrive() { state_.fetch_and(~kDriving); }
  bool driving() const { return (state_.load() & kDriving) != 0; }
  void setIdle(bool idle) {
    if (idle)
      state_.fetch_or(kIdle);
    else
      state_.fetch_and(~kIdle);
  }

  ResponseSlots& slots() { return slots_; }

  // None: not taken (the controller is busy, the op has no slot under this
  // key, its input is too large): nothing was done. True: reduced into `out`
  // in a round of its own. (slot, offer bytes): the round ran without
  // folding it; this thread still drives, and the controller goes on from
  // what the round agreed (the agreed buffer). Throws what the round threw,
  // this thread still driving.
  py::object run(const std::string& name, py::handle shape, uintptr_t input, uintptr_t out, size_t count,
                 int dtype, int op) {
    std::optional<size_t> slot;
    try {
      slot = claim(name, shape, count, dtype, op);
    } catch (const std::exception&) {
      slot.reset();  // anything odd (a shape that is not a tuple of ints): the controller's own path
    }
    if (!slot) return py::none();
    const size_t offer_bytes = 1 + (slots_.size() + 7) / 8;
    offer_[0] = kCachedOnly;
    std::memset(offer_ + 1, 0, offer_bytes - 1);
    offer_[1 + *slot / 8] = static_cast<uint8_t>(1u << (*slot % 8));
    AgreedReduceArgs args = args_;
    args.offer_bytes = offer_bytes;
    args.tag = static_cast<int64_t>(*slot);
    args.input = reinterpret_cast<const void*>(input);
    args.out = reinterpret_cast<void*>(out);
    args.count = count;
    args.dtype = static_cast<DataType>(dtype);
    args.op = static_cast<ReduceOp>(op);
    const bool folded = withoutGil([&] { return agreeAndReduce(*comm_, args); });
    if (!folded) return py::make_tuple(*slot, offer_bytes);
    slots_.ranAgain(name);
    endDrive();
    return py::bool_(true);
  }

 private:
  static constexpr uint32_t kIdle = 1, kDriving = 2;

  // The op's slot, with this thread now driving; nullopt, nothing claimed.
  // The GIL is held throughout, so no round of another thread changes the
  // slots between the look-up and the claim (a round holds the gate).
  std::optional<size_t> claim(const std::string& name, py::handle shape, size_t count, int dtype, int op) {
    if (!isValidDataType(dtype) || !isValidReduceOp(op)) return std::nullopt;
    if (count * elementSize(static_cast<DataType>(dtype)) > args_.payload_capacity) return std::nullopt;
    if (!PyTuple_Check(shape.ptr())) return std::nullopt;
    const Py_ssize_t rank = PyTuple_GET_SIZE(shape.ptr());
    dims_.resize(static_cast<size_t>(rank));
    for (Py_ssize_t i = 0; i < rank; ++i) {
      const long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
      if (dim == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return std::nullopt;
      }
      dims_[static_cast<size_t>(i)] = dim;
    }
    const std::optional<size_t> slot = slots_.slotWithKey(name, allreduceCacheKey(dtype, op, dims_));
    if (!slot) return std::nullopt;
    uint32_t expected = kIdle;  // idle and nobody driving
    if (!state_.compare_exchange_strong(expected, kIdle | kDriving)) return std::nullopt;
    return slot;
  }

  std::shared_ptr<Communicator> comm_;
  ResponseSlots slots_;
  uint8_t* offer_;
  AgreedReduceArgs args_;
  std::vector<int64_t> dims_;
  std::atomic<uint32_t> state_{0};
};

}  // namespace

void bindQuickLane(py::module_& m) {
  m.def("allreduce_cache_key", &allreduceCacheKey, "dtype"_a, "op"_a, "shape"_a,
        "The response cache's key of a host allreduce of one tensor with no scaling (response_slots.h).");
  py::class_<QuickLane, std::shared_ptr<QuickLane>>(m, "QuickLane")
      .def(py::init<std::shared_ptr<Communicator>, uintptr_t, uintptr_t, size_t, size_t>(), "comm"_a, "offer"_a,
           "agreed"_a, "cache_capacity"_a, "inline_bytes"_a,
           "A fast lane over the controller's offer and agreed buffers (addresses; they must outlive it).")
      .def("try_drive", &QuickLane::tryDrive, "Claims the rounds for this thread; False if another thread drives.")
      .def("end_drive", &QuickLane::endDrive)
      .def_property_readonly("driving", &QuickLane::driving)
      .def("set_idle", &QuickLane::setIdle, "idle"_a,
           "Whether the controller has nothing but the lane's op to negotiate (set under its lock).")
      .def("run", &QuickLane::run, "name"_a, "shape"_a, "input"_a, "out"_a, "count"_a, "dtype"_a, "op"_a,
           "One synchronous allreduce through the lane: None (not taken), True (done) or (slot, offer bytes) "
           "(a round ran without folding it; the caller drives on).")
      // The response cache's slot table, for the controller.
      .def(
          "find",
          [](QuickLane& lane, const std::string& name) -> py::object {
            auto found = lane.slots().find(name);
            if (!found) return py::none();
            return py::make_tuple(found->slot, *found->key ? py::cast(**found->key) : py::none());
          },
          "name"_a, "(slot, key) of the op that ran under `name`, or None.")
      .def(
          "slot_with_key",
          [](QuickLane& lane, const std::string& name, const std::string& key) {
            return lane.slots().slotWithKey(name, key);
          },
          "name"_a, "key"_a)
      .def(
          "ran",
          [](QuickLane& lane, const std::string& name, std::optional<std::string> key) {
            ResponseSlots::Ran ran = lane.slots().ran(name, std::move(key));
            return py::make_tuple(ran.slot, ran.evicted ? py::cast(*ran.evicted) : py::none());
          },
          "name"_a, "key"_a, "Records that an op ran: (its slot, the name evicted from that slot or None).")
      .def(
          "ran_again", [](QuickLane& lane, const std::string& name) { return lane.slots().ranAgain(name); },
          "name"_a)
      .def(
          "name_at", [](QuickLane& lane, size_t slot) { return lane.slots().nameAt(slot); }, "slot"_a)
      .def("__len__", [](QuickLane& lane) { return lane.slots().size(); });
}

}  // namespace rcoll::python
