import time


def fail_fast(rank, world):
    if rank == 0:
        raise RuntimeError("rank 0 broke")
    time.sleep(60)
    return "finished"


def echo(rank, world, value):
    return (rank, world, value)


def hang(rank, world):
    time.sleep(600)


def surroundings(rank, world, name):
    """What a rank sees of its caller: a variable, the working directory, and
    where its stdout and stderr (Python's and the C level's) go."""
    import os
    import sys
    print(f"stdout of rank {rank}", flush=True)
    os.write(2, f"stderr of rank {rank}\n".encode())
    sys.stderr.flush()
    return os.environ.get(name), os.getcwd()
