"""``gradwise.create``: every optimizer by name, in any case, and weight decay kept off biases, norms and
embeddings on request, for a module and for ``named_parameters()``."""
from __future__ import annotations

import pytest
import torch

import gradwise
from gradwise.by_name import optimizer_names
from tests.registry import ENTRIES


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.ln = torch.nn.LayerNorm(4)
        self.seq = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 2, bias=False))

    def forward(self, x):
        return self.seq[1](self.ln(self.proj(self.embed(x)) + self.seq[0](x % 5)))


def _groups(optimizer) -> list[tuple[list[str], float]]:
    return [(g["param_names"], g["weight_decay"]) for g in optimizer.param_groups]


@pytest.mark.parametrize("name, cls", [("adamw", gradwise.AdamW), ("ADAMW", gradwise.AdamW),
                                       ("torch.adamw", torch.optim.AdamW), ("Torch.SGD", torch.optim.SGD),
                                       ("galoreadamw", gradwise.GaLoreAdamW)])
def test_names_in_any_case(name, cls):
    assert gradwise.optimizer_class(name) is cls
    assert type(gradwise.create(name, Block(), lr=0.1)) is cls


FIRST_STEP_MOVES = {e.name: e.first_step_moves for e in ENTRIES}


def test_every_name_builds_and_steps():
    for name in optimizer_names():
        if name in ("torch.SparseAdam", "torch.LBFGS", "torch.Muon"):  # sparse gradients / a closure / 2-D only
            continue
        model = torch.nn.Linear(3, 2)
        budget = {"num_iterations": 10} if name == "Ranger21" else {}
        optimizer = gradwise.create(name, model.parameters(), lr=1e-2, **budget)
        before = model.weight.detach().clone()
        for _ in range(1 if FIRST_STEP_MOVES.get(name, True) else 2):  # ADOPT's first step fills v only
            model(torch.randn(4, 3)).square().sum().backward()  # LOMO and AdaLomo step inside backward
            optimizer.step()
        assert not torch.equal(before, model.weight), name


def test_unknown_name_lists_the_valid_ones_and_changes_nothing():
    with pytest.raises(ValueError, match=r"invalid name='Adagrad' \(torch's optimizer is spelled 'torch.Adagrad'\)"
                                         r": expected one of .*AdamW.*torch.SGD"):
        gradwise.create("Adagrad", Block())


def test_weight_decay_exclude_with_a_module():
    optimizer = gradwise.create("AdamW", Block(), lr=1e-3, weight_decay=0.1, weight_decay_exclude=True)
    assert _groups(optimizer) == [(["proj.weight", "seq.1.weight"], 0.1),
                                  (["embed.weight", "proj.bias", "ln.weight", "ln.bias", "seq.0.weight"], 0.0)]


def test_weight_decay_exclude_with_named_parameters_and_a_pattern():
    named = list(Block().named_parameters())
    by_name = gradwise.create("torch.AdamW", named, lr=1e-3, weight_decay=0.1, weight_decay_exclude=True)
    # no module: the Sequential's embedding (seq.0) is not known to be one by its name
    assert _groups(by_name) == [(["proj.weight", "seq.0.weight", "seq.1.weight"], 0.1),
                                (["embed.weight", "proj.bias", "ln.weight", "ln.bias"], 0.0)]
    pattern = gradwise.create("Lion", named, lr=1e-3, weight_decay=0.1, weight_decay_exclude=r"^seq\.")
    assert _groups(pattern) == [(["embed.weight", "proj.weight"], 0.1),
                                (["proj.bias", "ln.weight", "ln.bias", "seq.0.weight", "seq.1.weight"], 0.0)]


def test_weight_decay_exclude_with_plain_parameters_uses_dimensions():
    model = Block()
    optimizer = gradwise.create("SGD", model.parameters(), lr=0.1, weight_decay=0.1, weight_decay_exclude=True)
    assert [len(g["params"]) for g in optimizer.param_groups] == [4, 3]
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]


@pytest.mark.parametrize("params, exclude, message", [
    (lambda m: m.parameters(), r"bias", r"invalid weight_decay_exclude='bias': a name pattern needs named"),
    (lambda m: [{"params": list(m.parameters())}], True, r"invalid weight_decay_exclude=True with param groups"),
    (lambda m: m, "(", r"invalid weight_decay_exclude='\(': missing \), unterminated subpattern"),
    (lambda m: m, 1, r"invalid weight_decay_exclude=1: expected True, False or a regular expression"),
])
def test_weight_decay_exclude_errors(params, exclude, message):
    with pytest.raises(ValueError, match=message):
        gradwise.create("AdamW", params(Block()), lr=1e-3, weight_decay_exclude=exclude)


def test_weight_decay_exclude_needs_weight_decay():
    with pytest.raises(ValueError, match=r"optimizer 'torch.Rprop' has no weight_decay"):
        gradwise.create("torch.rprop", Block(), weight_decay_exclude=True)
