"""op=hvd.Adasum and the negotiation's response cache, checked on every rank
(tests/horovod/test_horovod.py runs it under torchrun at 1, 2 and 4 ranks, and at 3 for the refusals)."""
import numpy as np
import torch

import rcoll.horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def adasum_reference(vectors):
    """Horovod's Adasum over the ranks' vectors (float64), paired along the
    binary tree over the rank order: adasum(adasum(x0, x1), adasum(x2, x3))."""
    level = [np.asarray(v, dtype=np.float64) for v in vectors]
    while len(level) > 1:
        pairs = []
        for a, b in zip(level[0::2], level[1::2]):
            dot, aa, bb = a @ b, a @ a, b @ b
            ca = 1.0 if aa < np.sqrt(np.finfo(np.float64).tiny) else 1 - dot / aa / 2
            cb = 1.0 if bb < np.sqrt(np.finfo(np.float64).tiny) else 1 - dot / bb / 2
            pairs.append(ca * a + cb * b)
        level = pairs
    return level[0]


if size & (size - 1):
    # Horovod refuses what it cannot do, with its own error types.
    try:
        hvd.allreduce(torch.ones(4), op=hvd.Adasum)
        raise AssertionError("Adasum ran on a world that is not a power of two")
    except NotImplementedError as e:
        assert "power of 2" in str(e) and f"rank {rank}" in str(e), e
else:
    generator = np.random.default_rng(7)
    everyone = generator.normal(size=(size, 1001))
    for dtype, rtol in [(torch.float64, 1e-12), (torch.float32, 1e-5)]:
        mine = torch.tensor(everyone[rank], dtype=dtype)
        expected = adasum_reference(everyone.astype(np.float32) if dtype == torch.float32 else everyone)
        out = hvd.allreduce(mine, op=hvd.Adasum)
        np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=rtol)
        same = hvd.allgather(out.reshape(1, -1))
        assert all(torch.equal(same[0], same[r]) for r in range(size))  # the same bits everywhere
        # in place, with pre- and postscale
        x = mine.clone()
        assert hvd.allreduce_(x, op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25) is x
        np.testing.assert_allclose(x.numpy(), adasum_reference(2.0 * everyone.astype(x.numpy().dtype)) * 0.25,
                                   rtol=rtol, atol=rtol)
    # orthogonal vectors sum, equal ones average
    basis = torch.zeros(size * 3)
    basis[rank * 3:rank * 3 + 3] = 1.0
    assert torch.allclose(hvd.allreduce(basis, op=hvd.Adasum), torch.ones(size * 3))
    assert torch.allclose(hvd.allreduce(torch.full((5,), 3.0), op=hvd.Adasum), torch.full((5,), 3.0))
    # grouped: each tensor gets its own coefficients, as if reduced alone
    a, b = torch.tensor(everyone[rank][:10]), torch.full((4,), float(rank + 1))
    ga, gb = hvd.grouped_allreduce([a, b], op=hvd.Adasum)
    assert torch.equal(ga, hvd.allreduce(a, op=hvd.Adasum)) and torch.equal(gb, hvd.allreduce(b, op=hvd.Adasum))
    for bad, error in [(torch.ones(3, dtype=torch.int32), ValueError)]:
        try:
            hvd.allreduce(bad, op=hvd.Adasum)
            raise AssertionError("Adasum ran on an integer tensor")
        except error as e:
            assert f"rank {rank}" in str(e), e
    if size > 1:
        ps = hvd.add_process_set([0])
        if rank == 0:
            try:
                hvd.allreduce(torch.ones(2), op=hvd.Adasum, process_set=ps)
                raise AssertionError("Adasum ran on a process set")
            except NotImplementedError as e:
                assert "process sets" in str(e), e
        hvd.remove_process_set(ps)

    # DistributedOptimizer(op=Adasum): Horovod's delta optimizer. Every rank
    # ends with start + adasum(every rank's own SGD step).
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 3)
    start = [p.detach().clone() for p in model.parameters()]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    torch.manual_seed(100 + rank)
    data = torch.randn(8, 6)
    model(data).pow(2).sum().backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    opt.step()
    for p, p0, g in zip(model.parameters(), start, grads):
        deltas = hvd.allgather((-0.1 * g).reshape(1, -1).double())
        expected = p0.double().reshape(-1) + torch.from_numpy(adasum_reference(deltas.numpy()))
        assert torch.allclose(p.detach().double().reshape(-1), expected, atol=1e-6), (p, expected)
        same = hvd.allgather(p.detach().reshape(1, -1))
        assert all(torch.equal(same[0], same[r]) for r in range(size))

# The response cache: named ops repeated with the same metadata agree in one
# small round; a shape change under the same name, or a new name, goes
# through the full negotiation again; results stay exact all along.
for step in range(60):
    n = 5 if step < 30 else 9
    handles = [hvd.allreduce_async(torch.full((n,), float(rank + i)), name=f"cached.{i}", op=hvd.Sum)
               for i in (range(4) if rank % 2 == 0 else reversed(range(4)))]
    results = [hvd.synchronize(h) for h in handles]
    order = list(range(4)) if rank % 2 == 0 else list(reversed(range(4)))
    for i, result in zip(order, results):
        assert torch.equal(result, torch.full((n,), float(sum(range(size)) + size * i))), (step, i, result)
# a cached name whose metadata changes on one rank only: every rank gets the mismatch, the job goes on
if size > 1:
    try:
        hvd.allreduce(torch.ones(9 if rank else 5), name="cached.0", op=hvd.Sum)
        raise AssertionError("a mismatched shape under a cached name ran")
    except hvd.HorovodInternalError as e:
        assert "cached.0" in str(e) and "shape" in str(e), e
    assert torch.equal(hvd.allreduce(torch.ones(9), name="cached.0", op=hvd.Sum), torch.full((9,), float(size)))
hvd.shutdown()
