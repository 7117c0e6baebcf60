#include "python/quick_lane.h"

#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
  // The driver lets go, saying in the same store whether the controller is
  // idle now: the lane must never see the gate open beside an IDLE bit from
  // before that round (a round can leave ops pending, or a table to settle).
  void endDrive(bool idle) { state_.store(idle ? kIdle : 0u); }
  bool driving() const { return (state_.load() & kDriving) != 0; }
  // Something to negotiate arrived (set before it is recorded). Only a
  // driver's endDrive() says idle again, and the lane's own fold, which
  // changes nothing else, keeps what was there.
  void notIdle() { state_.fetch_and(~kIdle); }
  // The first word, before any thread can drive.
  void start(bool idle) { state_.store(idle ? kIdle : 0u); }

  // What this thread's last run() left it holding, taken by asking: None
  // (nothing: it did not claim, or the round folded), True (the round threw;
  // it still drives), or (slot, offer bytes) (the round ran without folding;
  // it still drives). The front end asks when an exception reached it after
  // run() (an interrupt can land as run() returns) and the controller asks
  // as it takes the round over (Controller.answer_quick), so nothing stale
  // is left. Another thread's record is not this one's.
  py::object heldHere() {
    if (!held_ || held_->owner != std::this_thread::get_id()) return py::none();
    const Held held = *held_;
    held_.reset();
    if (held.failed) return py::bool_(true);
    return py::make_tuple(held.slot, held.offer_bytes);
  }

  ResponseSlots& slots() { return slots_; }

  // None: not taken (the controller is busy, the op has no slot under this
  // key, its input is too large): nothing was done. True: reduced into `out`
  // in a round of its own. (slot, offer bytes): the round ran without
  // folding it; this thread still drives, and the controller goes on from
  // what the round agreed (the agreed buffer). Throws what the round threw,
  // this thread still driving.
  py::object run(py::handle name_object, py::handle shape, uintptr_t input, uintptr_t out, size_t count, int dtype,
                 int op) {
    Py_ssize_t name_size = 0;
    const char* name_chars =
        PyUnicode_Check(name_object.ptr()) ? PyUnicode_AsUTF8AndSize(name_object.ptr(), &name_size) : nullptr;
    if (name_chars == nullptr) {  // not a str, or one UTF-8 cannot carry: the controller's own path
      PyErr_Clear();
      return py::none();
    }
    const std::string name(name_chars, static_cast<size_t>(name_size));
    // This thread's record of an earlier call is past (it got this far); another thread's is not.
    if (held_ && held_->owner == std::this_thread::get_id()) held_.reset();
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
    bool folded = false;
    try {
      folded = withoutGil([&] { return agreeAndReduce(*comm_, args); });
    } catch (const std::exception&) {
      held_ = Held{std::this_thread::get_id(), *slot, offer_bytes, true};  // the caller still drives (heldHere)
      throw;
    }
    if (!folded) {
      held_ = Held{std::this_thread::get_id(), *slot, offer_bytes, false};
      return py::make_tuple(*slot, offer_bytes);
    }
    slots_.ranAgain(name);
    state_.fetch_and(~kDriving);  // the round changed nothing but this op: IDLE stays as it is
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
  struct Held {
    std::thread::id owner;
    size_t slot;
    size_t offer_bytes;
    bool failed;
  };
  std::optional<Held> held_;  // written and read with the GIL held
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
      .def("end_drive", &QuickLane::endDrive, "idle"_a,
           "The driving thread lets go, with whether the controller has nothing but a lane's op to negotiate.")
      .def_property_readonly("driving", &QuickLane::driving)
      .def("not_idle", &QuickLane::notIdle, "Something to negotiate arrived: the lane stands aside.")
      .def("start", &QuickLane::start, "idle"_a, "The gate's first state, before any thread drives.")
      .def("held_here", &QuickLane::heldHere,
           "What this thread's last run() left it driving, taken: None, True (the round threw) or (slot, offer "
           "bytes) (it ran without folding).")
      .def("run", &QuickLane::run, "name"_a, "shape"_a, "input"_a, "out"_a, "count"_a, "dtype"_a, "op"_a,
           "One synchronous allreduce through the lane: None (not taken), True (done) or (slot, offer bytes) "
           "(a round ran without folding it; the caller drives on).")
      // The response cache's slot table, for the controller. Names go in
      // and come out as the UTF-8 bytes of the op's name (with surrogates
      // passed through: a name is whatever str the user gave); keys are str.
      .def(
          "find",
          [](QuickLane& lane, const std::string& name) -> py::object {
            auto found = lane.slots().find(name);
            if (!found) return py::none();
            return py::make_tuple(found->slot, *found->key ? py::cast(**found->key) : py::none());
          },
          "name"_a, "(slot, key) of the op that ran under `name`, or None.")
      .def(
          "ran",
          [](QuickLane& lane, const std::string& name, std::optional<std::string> key) {
            ResponseSlots::Ran ran = lane.slots().ran(name, std::move(key));
            return py::make_tuple(ran.slot, ran.evicted ? py::object(py::bytes(*ran.evicted)) : py::none());
          },
          "name"_a, "key"_a, "Records that an op ran: (its slot, the name evicted from that slot or None).")
      .def(
          "name_at", [](QuickLane& lane, size_t slot) { return py::bytes(lane.slots().nameAt(slot)); }, "slot"_a)
      .def("__len__", [](QuickLane& lane) { return lane.slots().size(); });
}

}  // namespace rcoll::python
