"""Processes that used rcoll end cleanly: exit code 0, nothing on stderr.

The bug these tests pin down: a daemon thread (the torch backend's completion
thread, or any user thread) waiting inside the core with the GIL released took
the GIL back in a destructor while the interpreter finalized; CPython ended the
thread with a forced unwind, the unwind met the noexcept destructor, and the
process aborted ("terminate called without an active exception", SIGABRT) after
a job that had computed everything right. Busy CPUs made it likely (every rank
of a DDP job, 6 runs of 6); an idle machine hid it. See csrc/python/gil.h.
"""
import subprocess
import sys
import textwrap

import pytest
from support import launch
from support.paths import JOURNEYS

REPEATS = 20


def _run_python(code: str):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


# Threads that keep entering and leaving the core while the interpreter exits:
# one through a normal return (the completion queue's pop), one through an
# exception (a store read that times out).
_THREADS_IN_THE_CORE_AT_EXIT = """
    import threading, time
    from rcoll import _core

    queue = _core.CompletionQueue()
    server = _core.TcpStoreServer("127.0.0.1", 0)
    store = _core.TcpStore("127.0.0.1", server.port, 10.0)

    def popping():
        while True:
            queue.pop(0.001)

    def timing_out():
        while True:
            try:
                store.get("never-set", 0.001)
            except Exception:
                pass

    for target in (popping, popping, timing_out, timing_out):
        threading.Thread(target=target, daemon=True).start()
    time.sleep(0.05)
    print("main thread done", flush=True)
"""


def test_daemon_threads_inside_the_core_do_not_abort_the_exit():
    with launch.busy_cpus():
        for trial in range(REPEATS):
            proc = _run_python(_THREADS_IN_THE_CORE_AT_EXIT)
            assert proc.returncode == 0 and proc.stderr == "", (trial, proc.returncode, proc.stderr[-2000:])
            assert "main thread done" in proc.stdout


def test_closed_completion_queue_wakes_its_consumer_at_once():
    proc = _run_python("""
        import threading, time
        from rcoll import _core
        q = _core.CompletionQueue()
        result = []
        t = threading.Thread(target=lambda: result.append(q.pop(60.0)))
        t.start()
        time.sleep(0.05)
        start = time.monotonic()
        q.close()
        t.join(5)
        assert not t.is_alive() and result == [None] and q.closed, result
        assert time.monotonic() - start < 2
        start = time.monotonic()
        assert q.pop(10.0) is None and time.monotonic() - start < 2  # closed: no wait
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


torch = pytest.importorskip("torch")



@pytest.mark.slow  # 10 torchrun jobs
@pytest.mark.parametrize("destroy", [True, False], ids=["destroy_process_group", "no_destroy"])
def test_ddp_job_under_torchrun_exits_cleanly_with_busy_cpus(destroy, tmp_path):
    # 5 jobs each, 10 in all (20 rank exits), beside the ~10 DDP jobs of
    # test_user_journeys.py, judged the same way: the race above showed in 6
    # jobs of 6; one that shows 1 time in 10 still fails this. The exit itself
    # is repeated 20 times by test_daemon_threads_inside_the_core_do_not_abort_the_exit.
    with launch.busy_cpus(ranks=2):
        for _ in range(5):
            launch.torchrun(JOURNEYS / "ddp.py", 2, tmp_path, args=[] if destroy else ["--no-destroy"])
