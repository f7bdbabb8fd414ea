"""The README's Python examples run as written and take a step."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize("code", EXAMPLES, ids=lambda c: c.splitlines()[0])
def test_readme_example_steps(code):
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - the README's own example
    model, optimizer = scope["model"], scope["optimizer"]
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.randn(3, model.in_features, dtype=model.weight.dtype)).sum().backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
