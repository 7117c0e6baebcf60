"""What `python -m rcoll demo` and `python -m rcoll train` run: collectives between
local ranks, checked and timed (collectives.py), and a DDP training run on rcoll
beside Gloo (training.py)."""
