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
