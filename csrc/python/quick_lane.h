// A negotiating front end's fast lane (rcoll.horovod's controller): a
// synchronous allreduce of a small named host tensor that ran before under
// its name, agreed on and reduced in one cached round (agreed_reduce.h), in
// one call from Python.
//
// The controller (python/rcoll/horovod/common/controller.py) runs every
// round; this lane runs one only when the controller has said it is idle
// (nothing submitted, pending or joining, no timeline) and no thread is in a
// round. Both facts live here, in one atomic word, so that the lane claims
// the round without Python's lock, and every thread that drives a round
// claims it through the same word (tryDrive/endDrive). The response cache's
// slot table (response_slots.h) lives here too, so that the lane finds the
// op's slot without Python; the controller keeps every rank's metadata per
// slot and changes the table through the same object.
#pragma once

#include <pybind11/pybind11.h>

namespace rcoll::python {

// QuickLane (built over a Communicator, bound before it) and allreduce_cache_key.
void bindQuickLane(pybind11::module_& m);

}  // namespace rcoll::python
