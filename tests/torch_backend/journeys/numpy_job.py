"""The numpy API as a launcher starts it: rcoll.init() with no arguments reads
rank and world size from torchrun's, Slurm's or Open MPI's variables (and
MASTER_ADDR / MASTER_PORT). Every rank checks its results exactly."""
import numpy as np

import rcoll

comm = rcoll.init()
rank, world = comm.rank, comm.size

x = np.arange(1000, dtype=np.float32) + rank
comm.allreduce(x)
expect = world * np.arange(1000, dtype=np.float32) + sum(range(world))
assert np.array_equal(x, expect), (rank, x[:4], expect[:4])

gathered = comm.allgather(np.full(3, rank, dtype=np.int64))
assert np.array_equal(gathered.reshape(world, 3), np.repeat(np.arange(world), 3).reshape(world, 3)), gathered

b = np.full(5, rank, dtype=np.float64)
comm.broadcast(b, root=world - 1)
assert np.all(b == world - 1), b

handle = comm.allreduce(np.ones(7, dtype=np.int32), op="max", async_op=True)
handle.wait()
comm.barrier()
comm.shutdown()
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
