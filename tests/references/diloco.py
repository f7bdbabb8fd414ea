"""DiLoCo's rules written out, every worker simulated in turn in one process.

``simulate``: Douillard et al. 2023 and Streaming DiLoCo (2025): each worker's pseudo-gradient is the synced
copy minus its parameters; their mean steps the outer Nesterov (torch.optim.SGD's, op for op: ``b = d`` first,
then ``b = mu b + d``; ``theta <- theta - lr (d + mu b)``); fragments sync at staggered steps; an overlapped
all-reduce applies ``overlap`` steps late, the workers then merged with ``alpha``.

``simulate_stale``: the outer step a whole phase late, as Kale et al. 2025 write it ("Eager Updates For
Overlapped Communication and Computation in DiLoCo"). At each sync ``t`` every worker ``m`` has moved
``delta_m = theta_m - x_m`` from its own outer copy ``theta_m``; the all-reduce of those runs during the next
phase, so the outer step at sync ``t`` uses

* delayed outer gradients: the last phase's average ``delta_bar(t - 1)`` (none at the first sync);
* eager updates: ``(1/M) delta_m(t) + (1/M) sum over the other workers k of delta_k(t - 1)``;

then the outer Nesterov on ``theta_m``, and the worker restarts from it: ``x_m <- theta_m``. CO2 (Sun et al.
2024) corrects the delayed average by its staleness gap and clips it (``penalty``, ``clip``).
"""
from __future__ import annotations

import torch


def simulate(models, inners, backward, dtype, steps: int, sync_every: int, outer_lr: float, momentum: float,
             fragments: int = 1, comm_dtype=None, overlap: int = 0, alpha: float = 0.0,
             codec=None, compress=None) -> list[list[torch.Tensor]]:
    """Each worker's parameters after ``steps`` inner steps of DiLoCo (``backward(model, step, rank)`` fills
    the gradients). ``codec`` (a ``gradwise.state`` codec): each worker's pseudo-gradient of a fragment (its
    parameters flattened one after the other, as one buffer) encoded and decoded, the decoded values summed
    in worker order, then divided by the workers. ``compress`` (``tests/references/powersgd.py``'s
    ``PowerSGDMeans``): called as ``compress(indices, synced, worker_params)``, it gives each index's mean."""
    world = len(models)
    params = [list(m.parameters()) for m in models]
    n = len(params[0])
    synced = [p.detach().clone() for p in params[0]]
    momenta = [None] * n
    pending = []  # (apply after this step, fragment, {parameter index: averaged pseudo-gradient})
    for step in range(1, steps + 1):
        for rank in range(world):
            backward(models[rank], step - 1, rank)
            inners[rank].step()
            inners[rank].zero_grad()
        for f in range(fragments):
            if (step + f * sync_every // fragments) % sync_every == 0:
                indices = range(f * n // fragments, (f + 1) * n // fragments)
                if compress is not None:
                    means = compress(list(indices), synced, params)
                elif codec is None:
                    means = {i: mean_pseudo_gradient(synced[i], [p[i] for p in params], dtype, comm_dtype)
                             for i in indices}
                else:
                    means = decoded_mean(codec, [synced[i] for i in indices], [[p[i] for i in indices] for p in params])
                    means = dict(zip(indices, means))
                pending.append((step + overlap, f, means))
        with torch.no_grad():
            for _, _, averaged in [p for p in pending if p[0] == step]:
                for i, d in averaged.items():
                    if momentum:  # torch.optim.SGD's Nesterov, op for op: b = d first, then b = mu b + d
                        momenta[i] = d.clone() if momenta[i] is None else momenta[i].mul_(momentum).add_(d)
                        d = d.add(momenta[i], alpha=momentum)
                    synced[i].add_(d, alpha=-outer_lr)
                    for rank in range(world):  # the worker restarts from the synced copy, or merges
                        merged = synced[i] if not alpha else alpha * params[rank][i] + (1 - alpha) * synced[i]
                        params[rank][i].copy_(merged)
            pending = [p for p in pending if p[0] != step]
    return params


def mean_pseudo_gradient(synced, worker_params, dtype, comm_dtype) -> torch.Tensor:
    """The mean over the workers of ``synced - theta_worker``; summed in ``comm_dtype`` if given (two
    workers only: the order in which gloo sums more is its own)."""
    with torch.no_grad():
        deltas = [synced - p for p in worker_params]
        if comm_dtype is None:
            total = sum(deltas[1:], deltas[0])
        elif len(deltas) == 2:  # gloo adds two bfloat16 values in float32 and rounds the sum to bfloat16
            total = (deltas[0].to(comm_dtype).float() + deltas[1].to(comm_dtype).float()).to(comm_dtype)
        else:
            raise ValueError(f"a {comm_dtype} sum is simulated for two workers, not {len(deltas)}")
        return total.to(dtype) / len(worker_params)


def decoded_mean(codec, synced, worker_params) -> list[torch.Tensor]:
    """Per parameter, the mean over the workers of their flat pseudo-gradients encoded by ``codec`` and
    decoded, summed in worker order."""
    with torch.no_grad():
        total = None
        for params in worker_params:
            flat = torch.cat([(s - p).reshape(-1) for s, p in zip(synced, params)])
            parts = codec.empty(flat.shape, True, flat.device)
            codec.encode(flat, parts, True, torch.zeros((), dtype=torch.int64))
            decoded = codec.decode(parts, flat.shape, True, flat.dtype)
            total = decoded if total is None else total + decoded
        mean = total / len(worker_params)
        return [m.view_as(s) for m, s in zip(mean.split([s.numel() for s in synced]), synced)]


def simulate_stale(models, inners, backward, steps: int, sync_every: int, outer_lr: float, momentum: float,
                   eager: bool, penalty: float = 0.0, clip: float | None = None) -> list[list[torch.Tensor]]:
    """Each worker's parameters after ``steps`` inner steps (``backward(model, step, rank)`` fills grads).
    ``penalty`` and ``clip``: CO2's corrections as gradwise writes them (``gradwise.distributed.co2``): the
    stale average divided by ``1 + penalty |gap| / mean |gap|`` (``gap``: the last outer step of each
    parameter), then scaled to an L2 norm of at most ``clip`` over all the parameters."""
    world = len(models)
    params = [list(m.parameters()) for m in models]
    outer = [[p.detach().clone() for p in ps] for ps in params]
    momenta = [[None] * len(ps) for ps in params]
    gaps = [[torch.zeros_like(p) for p in ps] for ps in outer]
    last = None  # every worker's pseudo-gradients of the last sync
    for step in range(1, steps + 1):
        for rank in range(world):
            backward(models[rank], step - 1, rank)
            inners[rank].step()
            inners[rank].zero_grad()
        if step % sync_every:
            continue
        with torch.no_grad():
            deltas = [[theta - x for theta, x in zip(outer[m], params[m])] for m in range(world)]
            for m in range(world):
                n = len(params[m])
                if eager:
                    others = [sum(last[k][i] for k in range(world) if k != m) if last else 0 for i in range(n)]
                    ds = [(deltas[m][i] + others[i]) / world for i in range(n)]
                elif last:
                    ds = [sum(last[k][i] for k in range(world)) / world for i in range(n)]
                else:
                    ds = None
                if ds is not None:
                    if penalty:
                        ds = [d / (1 + penalty * g.abs() / g.abs().mean()) if g.abs().mean() > 0 else d
                              for d, g in zip(ds, gaps[m])]
                    norm = sum(d.square().sum() for d in ds).sqrt()
                    if clip is not None and norm > clip:
                        ds = [d * (clip / norm) for d in ds]
                    for i, d in enumerate(ds):
                        if momentum:
                            b = momenta[m][i]
                            momenta[m][i] = d.clone() if b is None else b.mul_(momentum).add_(d)
                            d = d + momentum * momenta[m][i]
                        before = outer[m][i].clone()
                        outer[m][i] -= outer_lr * d
                        gaps[m][i] = outer[m][i] - before
                for i in range(n):
                    params[m][i].copy_(outer[m][i])
            last = deltas
    return params
