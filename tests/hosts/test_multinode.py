"""Multi-node launch, end to end: `torchrun --nnodes 2 --nproc-per-node 2` with
the c10d rendezvous, one torchrun per emulated host (a network namespace each,
joined by a veth pair shaped with tbf, addresses from 198.18.0.0/15), running
the DDP job of tests/torch_backend/journeys/ddp.py with backend="rcoll". Inside a host the
ranks share memory; between the hosts they talk TCP over the shaped link, and
the allreduces take the hierarchical algorithm where they are large enough.
Judged as users judge a job: both launchers exit 0, every rank printed the
job's last line and nothing else on stderr (tests/support/launch.py).

Skipped, saying why, where namespaces cannot be made (not root, no iproute2);
CI is root. The recipe for real hosts is in docs/launching.md."""

import pytest
from support import launch
from support.emulated_hosts import TwoHosts, needs_netns, torchrun_on_hosts
from support.paths import JOURNEYS

pytestmark = [pytest.mark.slow, needs_netns()]  # two torchrun agents, four torch ranks

torch = pytest.importorskip("torch")

ADDRS = ["198.18.7.1", "198.18.7.2"]
# torch's TCPStore (torchrun's rendezvous, the Gloo replica) warns that no name
# resolves for these addresses; it is torch's line, not rcoll's.
TORCH_WARNINGS = (r"\[c10d\] The hostname of the client socket cannot be retrieved",)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("options", [[], ["--hook", "fp16", "--no-sync"]], ids=["ddp", "fp16_hook_no_sync"])
def test_torchrun_two_nodes_ddp_job_exits_cleanly(tmp_path, options):
    # Gloo (the job's reference replica) finds its interface by name; rcoll
    # binds to the address that reaches the rendezvous store by itself.
    with TwoHosts(addrs=ADDRS) as hosts:
        outputs = torchrun_on_hosts(hosts, JOURNEYS / "ddp.py", tmp_path, nproc=2, host_args=[options, options],
                                    env={"GLOO_SOCKET_IFNAME": "eth0"})
    ranks = []
    for node in range(2):
        for d in sorted((tmp_path / f"node{node}").glob("*/attempt_*/*"), key=lambda p: int(p.name)):
            out = (d / "stdout.log").read_text() if (d / "stdout.log").exists() else ""
            err = (d / "stderr.log").read_text() if (d / "stderr.log").exists() else ""
            ranks.append((node, d.name, out, err))
    for node, (code, err) in enumerate(outputs):
        assert code == 0, (f"node {node}'s torchrun exited {code}\n{err[-4000:]}\n" +
                           "\n".join(f"--- node {n} local rank {r} stderr:\n{e[-2000:]}" for n, r, _, e in ranks))
        launch.check_launcher_output(f"node {node}'s torchrun", err)
    assert len(ranks) == 4, [(n, r) for n, r, _, _ in ranks]
    for node, local, out, err in ranks:
        launch.check_rank_output(f"node {node} local rank {local}", out, err, allow=TORCH_WARNINGS)
