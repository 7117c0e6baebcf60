"""rcoll run the way users run it: real jobs under torchrun (and the launch
environments of Slurm and Open MPI), with the CPUs busy beside them, judged by
every rank's exit code and stderr (tests/support/launch.py), each job checking its own
results. The job scripts are in tests/torch_backend/journeys/.

Repetitions: the DDP exit check runs 10 jobs (tests/failures/test_clean_exit.py); the
numpy-API launcher jobs 20 each (they are quick); the other torch jobs a few
times each (each costs seconds of torch start-up per rank)."""

import pytest
from support import launch
from support.paths import JOURNEYS

pytestmark = pytest.mark.slow  # whole jobs under torchrun and launchers, beside busy CPUs


# torch's own warnings for this model layout (Gloo's jobs print them too).
FSDP_TP_TORCH_WARNINGS = (r"returned a view tensor", r"output = self\._register_pre_backward_hook",
                          r"sequential all_gather operations will be performed")


def _numpy_job_envs(world, launcher):
    port = str(launch.free_port())
    envs = []
    for rank in range(world):
        common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        if launcher == "slurm":
            common.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(world), SLURM_LOCALID=str(rank),
                          SLURM_NODEID="0", SLURM_JOB_ID="4242")
        else:
            common.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(world),
                          OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(world))
        envs.append(common)
    return envs


@pytest.mark.parametrize("launcher", ["slurm", "openmpi"])
def test_numpy_api_under_launcher_environments(launcher):
    with launch.busy_cpus(ranks=4):
        for world in [1, 2, 3, 4] * 5:
            launch.run_ranks(JOURNEYS / "numpy_job.py", _numpy_job_envs(world, launcher))


torch = pytest.importorskip("torch")


def test_numpy_api_under_torchrun(tmp_path):
    with launch.busy_cpus(ranks=3):
        for nproc in [2, 3] * 3:
            launch.torchrun(JOURNEYS / "numpy_job.py", nproc, tmp_path)


@pytest.mark.parametrize("options", [["--hook", "allreduce"], ["--hook", "fp16", "--no-sync"], ["--static-graph"],
                                     ["--static-graph", "--no-destroy"], ["--sparse"], ["--sparse", "--no-sync"]],
                         # (static_graph with no_sync: torch's reducer asserts with Gloo too)
                         ids=["allreduce_hook", "fp16_hook_no_sync", "static_graph", "static_graph_no_destroy",
                              "sparse_embedding", "sparse_embedding_no_sync"])
def test_ddp_variants_at_world_2(options, tmp_path):
    with launch.busy_cpus(ranks=2):
        for _ in range(2):
            launch.torchrun(JOURNEYS / "ddp.py", 2, tmp_path, args=options)


@pytest.mark.parametrize("module_form", [False, True], ids=["torchrun", "python_-m_torch.distributed.run"])
def test_ddp_at_world_4(module_form, tmp_path):
    with launch.busy_cpus(ranks=4):
        for options in ([], ["--hook", "fp16", "--no-sync"]):
            launch.torchrun(JOURNEYS / "ddp.py", 4, tmp_path, args=options, module_form=module_form)


def test_fsdp2_with_tensor_parallel_on_a_2d_mesh(tmp_path):
    from support import torch_features
    torch_features.skip_unless_fsdp2_trains_on_cpu()
    with launch.busy_cpus(ranks=4):
        launch.torchrun(JOURNEYS / "fsdp_tp.py", 4, tmp_path, allow=FSDP_TP_TORCH_WARNINGS, timeout=300)



def test_functional_collectives_under_torch_compile(tmp_path):
    with launch.busy_cpus(ranks=2):
        launch.torchrun(JOURNEYS / "compiled_funcol.py", 2, tmp_path, timeout=400,
                        allow=[launch.CUDA_BUILD_WITHOUT_DRIVER])
