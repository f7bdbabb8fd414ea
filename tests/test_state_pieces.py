"""A block codec's buffer stepped in the parameter's shape (int8's and int4's first moment beside a rank-1
second moment) is encoded into new tensors, one per piece of whole blocks and the short last block, copied into
its parts after the step (``Codec.encode_pieces``, ``fused.store_pieces``): the codes ``encode`` writes in place."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.state import StatePolicy, engine
from gradwise.state.codec import codec_from
from gradwise.state.fused import store_pieces


@pytest.mark.parametrize("tag", ["int8-b64", "int4-b64", "fp8-b64", "int8-b64-stochastic"])
@pytest.mark.parametrize("shape", [(7, 30), (5, 31), (3, 64), (40,), (210,)])
@pytest.mark.parametrize("signed", [True, False])
def test_pieces_are_the_codes_encode_writes(tag, shape, signed):
    codec = codec_from(tag)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    x = x if signed else x.square()
    x.view(-1)[3] = float("nan")
    seed = torch.tensor(12345)
    in_place = codec.empty(torch.Size(shape), signed, x.device)
    codec.encode(x, in_place, signed, seed)
    pieces = codec.encode_pieces(x, signed, seed)
    numel, rank1 = x.numel(), codec.layout(torch.Size(shape), signed)[0]
    if rank1 or numel % 64 == 0 or numel < 64:  # one piece, or rank-1 scales: encoded in place
        assert pieces is None
        return
    assert [name for name, _, _ in pieces] == ["codes", "absmax", "codes", "absmax"]
    stored = {name: torch.full_like(value, 7) for name, value in in_place.items()}
    store_pieces({"b": stored}, {"b": pieces})
    for name, value in in_place.items():
        assert torch.equal(stored[name], value), name


def _steps(compile: bool, steps: int, spy=None):
    """A 7 x 30 parameter (210 = 3 x 64 + 18 elements) after ``steps`` AdamW steps with int8-b64 state, ``spy``
    in place of the engine's ``store_pieces`` for the last step."""
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(7, 30))
    opt = gradwise.AdamW([param], lr=1e-2, state=StatePolicy("int8-b64", min_numel=0), compile=compile)
    for step in range(steps):
        param.grad = torch.randn(7, 30, generator=torch.Generator().manual_seed(step))
        if spy is not None and step == steps - 1:
            spy(opt)
        opt.step()
    return param, opt


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_the_in_shape_step_leaves_the_pieces_to_its_caller(compile, monkeypatch):
    """The rank-1 second moment is written in the step, the first moment's codes after it; compiled, the
    parameter and state agree with the eager step's (codes equal but at rounding ties)."""
    stored, before = [], {}

    def spy(opt):
        state = opt.state[opt.param_groups[0]["params"][0]]
        before["key"] = next(k for k in state if k.startswith("adam.exp_avg@") and k.endswith(".codes"))
        before["codes"] = state[before["key"]].clone()

        def store(parts, later):
            assert torch.equal(parts["adam.exp_avg"]["codes"], before["codes"]), "stored after the step, not in it"
            stored.append(sorted(later))
            store_pieces(parts, later)

        monkeypatch.setattr(engine, "store_pieces", store)

    param, opt = _steps(compile, 3, spy)
    state = opt.state[param]
    assert stored == [["adam.exp_avg"]]
    assert not torch.equal(state[before["key"]], before["codes"])
    if compile:
        monkeypatch.undo()
        eager, eager_opt = _steps(False, 3)
        torch.testing.assert_close(param, eager, rtol=1e-5, atol=1e-6)
        for key, value in eager_opt.state[eager].items():
            if value.dtype == torch.uint8:
                assert (value != state[key]).float().mean() < 1e-2, key
            else:
                torch.testing.assert_close(value, state[key], rtol=1e-5, atol=1e-7)
