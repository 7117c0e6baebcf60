"""Per-rank body of the kill -9 trials (importable by spawned ranks)."""
import os
import signal
import threading
import time

import numpy as np

import rcoll


def allreduce_until_killed(rank, world, victim, delay, kill_file, op_timeout, elements, device=False,
                           op="allreduce"):
    """Every rank loops large allreduces (op="broadcast": broadcasts from rank
    0); `delay` s after the first one, rank
    `victim` SIGKILLs itself, having written the kill time (time.time()) to
    `kill_file`. A survivor returns (error class, message, time.time() when the
    error reached it, allreduces completed); the victim never returns.
    `device`: the buffer as a device array (the emulated device runtime)."""
    comm = rcoll.init(timeout=op_timeout)
    x = np.ones(elements, np.float32)
    if device:
        from support.device_workers import dev
        x = dev(x)
    comm.allreduce(x, "max")  # every rank connected and its buffers allocated
    state = {"in_op": False, "ops": 0}
    if rank == victim:
        def kill():
            in_op = state["in_op"]  # read before the write, which takes a little while
            with open(kill_file + ".tmp", "w") as f:
                f.write(f"{time.time()!r} {int(in_op)} {state['ops']}\n")
            os.replace(kill_file + ".tmp", kill_file)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(delay, kill).start()
    # Bounded, so that a survivor that never hears of the death reports it
    # instead of hanging (the test's bound is far tighter than this).
    deadline = time.monotonic() + delay + op_timeout + 15
    while time.monotonic() < deadline:
        try:
            state["in_op"] = True
            if op == "broadcast":
                comm.broadcast(x, root=0)
            else:
                comm.allreduce(x, "max")  # max: the values stay 1
            state["in_op"] = False
        except rcoll.RcollError as e:
            return type(e).__name__, str(e), time.time(), state["ops"]
        state["ops"] += 1
    return "no error", f"rank {rank} completed {state['ops']} allreduces and never heard of the death", time.time(), \
        state["ops"]
