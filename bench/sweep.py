#!/usr/bin/env python3
"""The nccl-tests style sweep from a checkout: `python -m rcoll bench` (rcoll/bench/).

    python3 bench/sweep.py --ops allreduce -b 4K -e 64M -f 4 --world 2 --backends rcoll,gloo --json /tmp/s.json

Measures this checkout's rcoll (python/, built in place) unless PYTHONPATH says
otherwise; an installed rcoll that would shadow it is named on stderr.
"""
import os
import sys

CHECKOUT_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")

if __name__ == "__main__":
    if "PYTHONPATH" not in os.environ:
        # The ranks an outside launcher starts (mpirun) import rcoll too.
        os.environ["PYTHONPATH"] = CHECKOUT_PYTHON
        sys.path.insert(0, CHECKOUT_PYTHON)
    import rcoll
    from rcoll import bench

    imported = os.path.dirname(os.path.abspath(rcoll.__file__))
    if os.path.realpath(imported) != os.path.realpath(os.path.join(CHECKOUT_PYTHON, "rcoll")):
        print(f"note: measuring the rcoll in {imported}, not this checkout's", file=sys.stderr)
    sys.exit(bench.main())
