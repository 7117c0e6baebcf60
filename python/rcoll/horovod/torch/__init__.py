"""Horovod's PyTorch API on rcoll: `import rcoll.horovod.torch as hvd` in
place of `import horovod.torch as hvd` (docs/horovod.md)."""
from ..common.basics import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ..common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from ..common.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set  # noqa: F401
from . import elastic  # noqa: F401
from .compression import Compression  # noqa: F401
from .functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters  # noqa: F401
from .mpi_ops import (  # noqa: F401
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from .optimizer import DistributedOptimizer  # noqa: F401
from .sync_batch_norm import SyncBatchNorm  # noqa: F401
