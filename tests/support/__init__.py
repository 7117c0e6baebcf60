"""What the tests of several areas share: helpers, and the worker modules whose
functions more than one area runs on its ranks.

Imported as `from support import launch` (or `from support.launch import ...`),
with tests/ on sys.path: tests/conftest.py puts it there for the test process,
and every process a test starts gets it from there (rcoll.spawn's fork server
and torch's spawned ranks inherit sys.path; subprocesses that run code of the
tests get tests/ as their working directory or on PYTHONPATH; a script started
by path, e.g. collectives/netns_rank.py, inserts it itself).

  paths           the checkout's and tests/' directories
  common          settings and checks many tests use (SMALL_CHUNKS, every_rank_passed, ...)
  launch          jobs run as users run them (torchrun, launcher environments), judged by exit and stderr
  ports           each test process's own range of TCP ports
  rank_threads    a test body on N ranks as threads of the test process
  reference       inputs and exact references of the collective matrices
  emulated_hosts  hosts emulated by network namespaces
  optional        skip, or fail where CI requires it
  cpu_ledger      RCOLL_TEST_CPU_LOG: each test's CPU time (a pytest plugin)
  softroce        the Soft-RoCE QEMU guest
  guest_suite     the verbs suite in that guest, started with the session
  torch_features  what the installed torch can do
  *_workers       rank functions run by tests of several areas
"""
