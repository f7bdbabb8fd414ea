"""Updates inside backward (``gradwise.fused_backward``): the same parameters as ordinary steps, one
optimizer and one state_dict, gradients freed as soon as they are used, clear errors for chains that
need every gradient first."""
from __future__ import annotations

import io
import weakref

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler

import gradwise


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 64), nn.Tanh(), nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 1))


def _batch(step):
    gen = torch.Generator().manual_seed(500 + step)
    x = torch.randn(16, 6, generator=gen)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def _train(model, optimizer, steps, first=0, scheduler=None):
    for step in range(first, first + steps):
        x, y = _batch(step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _adamw(model, compile=False):
    weights = [p for p in model.parameters() if p.dim() == 2]
    biases = [p for p in model.parameters() if p.dim() == 1]
    return gradwise.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0, "lr": 3e-3}],
                          lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, compile=compile)


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["eager", "compiled"])
def test_adamw_in_backward_is_identical_to_adamw_stepped(compile):
    fused_model, plain_model = _model(), _model()
    fused, plain = _adamw(fused_model, compile), _adamw(plain_model, compile)
    handle = gradwise.fused_backward(fused)
    fused_scheduler = lr_scheduler.StepLR(fused, step_size=3, gamma=0.5)
    plain_scheduler = lr_scheduler.StepLR(plain, step_size=3, gamma=0.5)
    _train(fused_model, fused, 10, scheduler=fused_scheduler)
    _train(plain_model, plain, 10, scheduler=plain_scheduler)
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
        assert set(fused.state[a]) == set(plain.state[b])
        for key in plain.state[b]:
            assert torch.equal(fused.state[a][key], plain.state[b][key]), key
        assert int(fused.state[a]["step"]) == 10, "one step per backward, none for optimizer.step()"
    assert fused.param_groups[0]["lr"] == plain.param_groups[0]["lr"] == 1e-2 * 0.5**3
    handle.remove()
    _train(fused_model, fused, 2, first=10)  # ordinary steps again
    _train(plain_model, plain, 2, first=10)
    assert all(torch.equal(a, b) for a, b in zip(fused_model.parameters(), plain_model.parameters()))


def test_gradients_are_freed_as_soon_as_used():
    x, y = _batch(0)
    model = _model()
    params = list(model.parameters())
    gradwise.fused_backward(gradwise.AdamW(params, lr=1e-3, compile=False))
    alive = []
    for p in params:  # hooks run in registration order: this one after p's update
        p.register_post_accumulate_grad_hook(lambda p: alive.append(sum(q.grad is not None for q in params)))
    nn.functional.mse_loss(model(x), y).backward()
    assert all(p.grad is None for p in params)
    assert alive == [0] * len(params), "no gradient survives its parameter's update"

    model = _model()
    used = []
    for p in model.parameters():  # this one before p's update: a weak reference to the gradient it uses
        p.register_post_accumulate_grad_hook(lambda p: used.append(weakref.ref(p.grad)))
    gradwise.fused_backward(gradwise.AdamW(model.parameters(), lr=1e-3, compile=False))
    nn.functional.mse_loss(model(x), y).backward()
    assert len(used) == len(params) and all(ref() is None for ref in used), "a used gradient is kept somewhere"


def _peak_gradient_bytes(model, fused: bool) -> tuple[int, int]:
    """The most gradient bytes alive at any moment of backward (seen from a hook on every parameter)
    and the bytes held right after backward."""
    params = list(model.parameters())
    optimizer = gradwise.AdamW(params, lr=1e-3, compile=False)
    peak = [0]

    def observe(p):
        live = sum(q.grad.numel() * q.grad.element_size() for q in params if q.grad is not None)
        peak[0] = max(peak[0], live)

    for p in params:  # before the fused hooks: sees the gradient p's update is about to use
        p.register_post_accumulate_grad_hook(observe)
    if fused:
        gradwise.fused_backward(optimizer)
    x, y = _batch(0)
    nn.functional.mse_loss(model(x), y).backward()
    after = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    return peak[0], after


def test_backward_never_holds_more_than_one_gradient():
    model = _model()
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    fused_peak, fused_after = _peak_gradient_bytes(model, fused=True)
    plain_peak, plain_after = _peak_gradient_bytes(_model(), fused=False)
    assert fused_peak <= largest and fused_after == 0
    assert plain_peak == plain_after == total


def test_checkpoint_resumes_bit_identically():
    model = _model()
    optimizer = _adamw(model)
    handle = gradwise.fused_backward(optimizer)
    _train(model, optimizer, 3)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": optimizer.state_dict()}, buffer)
    _train(model, optimizer, 4, first=3)
    handle.remove()

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    resumed_model = _model(seed=7)
    resumed_model.load_state_dict(saved["model"])
    resumed = _adamw(resumed_model)
    resumed.load_state_dict(saved["opt"])
    with gradwise.fused_backward(resumed):
        _train(resumed_model, resumed, 4, first=3)
    for a, b in zip(model.parameters(), resumed_model.parameters()):
        assert torch.equal(a, b)
        for key in optimizer.state[a]:
            assert torch.equal(optimizer.state[a][key], resumed.state[b][key]), key
    assert all(p._post_accumulate_grad_hooks in (None, {}) for p in resumed_model.parameters()), \
        "the with block removed them"


def test_encoded_state_and_unused_parameters():
    """int8 state works in backward; a parameter without a gradient this step is not stepped."""
    fused_model, plain_model = _model(), _model()
    fused = gradwise.AdamW(fused_model.parameters(), lr=1e-2, state="int8", compile=False)
    plain = gradwise.AdamW(plain_model.parameters(), lr=1e-2, state="int8", compile=False)
    gradwise.fused_backward(fused)
    for model, optimizer in ((fused_model, fused), (plain_model, plain)):
        for step in range(3):
            x, y = _batch(step)
            optimizer.zero_grad()
            head = model[:4](x) if step == 2 else model(x)  # the last layer gets no gradient at step 2
            nn.functional.mse_loss(head.sum(dim=1, keepdim=True) if step == 2 else head, y).backward()
            optimizer.step()
    for a, b in zip(fused_model.parameters(), plain_model.parameters()):
        assert torch.equal(a, b)
    assert int(fused.state[fused_model[4].weight]["step"]) == 2 and int(fused.state[fused_model[0].weight]["step"]) == 3


@pytest.mark.parametrize("make,pattern", [
    (lambda ps: gradwise.AdamW(ps, skip_nonfinite=True), r"fused_backward\(AdamW\): .*skip_nonfinite=True"),
    (lambda ps: gradwise.Muon(ps), r"fused_backward\(Muon\): .*batches matrices across parameters"),
    (lambda ps: gradwise.Shampoo(ps), r"fused_backward\(Shampoo\): .*batches matrices"),
    (lambda ps: gradwise.Ranger21(ps, lr=1e-3, num_iterations=10),
     r"fused_backward\(Ranger21\): its chain reduces \['second_moment_count', 'second_moment_sum'\]"),
    (lambda ps: torch.optim.AdamW(ps),
     r"invalid optimizer of type torch\.optim\.adamw\.AdamW: fused_backward\(\) takes a gradwise Optimizer"),
])
def test_chains_that_need_every_gradient_first_raise(make, pattern):
    params = list(_model().parameters())
    with pytest.raises((ValueError, TypeError), match=pattern):
        gradwise.fused_backward(make(params))
    assert all(p._post_accumulate_grad_hooks in (None, {}) for p in params)


def test_two_handles_on_one_parameter_raise():
    params = list(_model().parameters())
    first = gradwise.fused_backward(gradwise.AdamW(params))
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] is already updated in backward"):
        gradwise.fused_backward(gradwise.SGD(params[:2], lr=0.1))
    first.remove()
    gradwise.fused_backward(gradwise.SGD(params, lr=0.1)).remove()


def test_eval_mode_and_bad_hyperparameters_raise_in_backward():
    model = _model()
    optimizer = gradwise.ScheduleFreeAdamW(model.parameters(), lr=1e-3)
    gradwise.fused_backward(optimizer)
    optimizer.eval()
    x, y = _batch(0)
    with pytest.raises(RuntimeError, match=r"backward\(\) in eval mode with fused_backward"):
        nn.functional.mse_loss(model(x), y).backward()
    optimizer.train()
    optimizer.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match=r"lr=nan: expected a finite number >= 0"):
        nn.functional.mse_loss(model(x), y).backward()


def test_sparse_gradient_raises_in_backward_and_leaves_its_parameter_alone():
    torch.manual_seed(0)
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4, sparse=True), "dense": nn.Linear(4, 3)})
    optimizer = gradwise.AdamW(model.named_parameters(), lr=0.1, compile=False)
    gradwise.fused_backward(optimizer)
    before = model["emb"].weight.detach().clone()
    with pytest.raises(TypeError, match=r"parameter 'emb\.weight' has a sparse gradient"):
        model["dense"](model["emb"](torch.tensor([1, 2]))).sum().backward()
    assert torch.equal(model["emb"].weight, before) and model["emb"].weight not in optimizer.state


def test_a_value_changed_after_accepted_steps_is_refused_in_backward_until_fixed():
    """The hooks check a group's hyperparameters again only where they changed since the last accepted
    check (``core/hyper_check.py``), as ``step()`` does: a changed value is still refused, before the
    parameter it would step changes, at every backward until it is fixed."""
    model = nn.Linear(3, 1)
    optimizer = gradwise.AdamW(model.parameters(), lr=1e-2, betas=[0.9, 0.99], compile=False)
    gradwise.fused_backward(optimizer)
    x, y = _batch(0)
    x = x[:, :3]
    for _ in range(2):  # accepted: what the hooks keep
        nn.functional.mse_loss(model(x), y).backward()
    group = optimizer.param_groups[0]
    for key, bad, pattern in [("lr", -1.0, r"lr=-1\.0"), ("betas", 1.5, r"betas\[0\]=1\.5")]:
        if key == "betas":
            group["betas"][0] = bad  # the same list, changed in place
        else:
            group[key] = bad
        for _ in range(2):  # a refused value is not remembered
            before = [p.detach().clone() for p in model.parameters()]
            with pytest.raises(ValueError, match=pattern):
                nn.functional.mse_loss(model(x), y).backward()
            assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))  # the first hook raised
            model.zero_grad(set_to_none=True)
        group[key] = 1e-2 if key == "lr" else [0.9, 0.99]
    steps = int(optimizer.state[model.weight]["step"])
    nn.functional.mse_loss(model(x), y).backward()
    assert int(optimizer.state[model.weight]["step"]) == steps + 1
