"""Every ```python block of the README runs as written, and what its comments and the text around it claim is
checked. A check is attached to a block by a marker, a piece of that block's code (``@claim(marker)``); each
marker must name exactly one block. A block no check names (a new one, say) still runs, and if it leaves a
``model`` and an ``optimizer`` behind, a step must change a parameter. ```bash blocks are not run."""
from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from pathlib import Path
from typing import Callable

import pytest
import torch

import gradwise

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
CLAIMS: dict[str, Callable[[dict, str], None]] = {}


def claim(marker: str):
    def register(check: Callable[[dict, str], None]):
        CLAIMS[marker] = check
        return check
    return register


def run(code: str) -> dict:
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - the README's own example
    return scope


def _close(a, b) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-7) for x, y in zip(a, b, strict=True))


def _clones(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@claim('"gradwise-fsdp2-example"')
def fsdp2_training_resumes_from_dcp_bit_identically(scope, code):
    """The Distributed example, run as one process: Muon's int8 state goes through DCP and the resumed run
    equals the uninterrupted one, bit for bit (several ranks: tests/test_fsdp2.py and tests/test_dcp.py)."""
    import torch.distributed as dist

    assert scope["same"] is True and not dist.is_initialized()
    encoded = [k for st in scope["resumed_optimizer"].state.values() for k in st if "@int8" in k]
    assert encoded, "the example's int8 state holds no encoded buffer: the claim would be vacuous"


@claim("gradwise.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)")
def usage_is_a_drop_in_for_torch_adamw(scope, code):
    """The usage example with torch.optim.AdamW in place of gradwise's gives the same weights and learning rate."""
    torch_run = run(code.replace("gradwise.AdamW(", "torch.optim.AdamW("))
    assert _close(scope["model"].parameters(), torch_run["model"].parameters())
    assert not _close(scope["model"].parameters(), run("import torch\nm = torch.nn.Linear(512, 512)")["m"].parameters())
    lr = 3e-4 * (1 + math.cos(math.pi / 1000)) / 2  # CosineAnnealingLR after one step
    assert scope["optimizer"].param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12)
    assert torch_run["optimizer"].param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12)


@claim("gradwise.DiLoCo(inner, outer_lr=0.7, sync_every=50)")
def diloco_synced_twice_and_sent_nothing(scope, code):
    """After 100 steps the model is the synced copy (the second sync just ran); one process sends nothing;
    the bytes per sync the text names are the model's (2 gloo ranks: tests/test_diloco.py)."""
    optimizer, model = scope["optimizer"], scope["model"]
    assert optimizer.comm_stats == {"collectives": 0, "bytes_sent": 0, "steps": 100, "bytes_sent_per_step": 0.0}
    assert all(torch.equal(p, s) for p, s in zip(model.parameters(), optimizer.synced))
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == 272


@claim("gradwise.DeMo(model.parameters(), lr=1e-3, chunk=64, topk=32, weight_decay=0.1)")
def demo_sent_nothing_alone_and_the_text_names_its_bytes(scope, code):
    """One process sends nothing and every step moves the weights; the 576 and 33024 bytes the text names
    are this model's blocks x 32 components x (4 + 2) bytes, and its gradients' (2 gloo ranks:
    tests/test_demo.py)."""
    from gradwise.distributed.dct import ChunkedDCT

    optimizer, model = scope["optimizer"], scope["model"]
    assert optimizer.comm_stats == {"collectives": 0, "bytes_sent": 0, "steps": 10, "bytes_sent_per_step": 0.0}
    assert sum(ChunkedDCT.of(p, 64).blocks * 32 * 6 for p in model.parameters()) == 576
    assert sum(p.numel() * p.element_size() for p in model.parameters()) == 33024
    assert all(optimizer.state[p]["momentum"].abs().max() > 0 for p in model.parameters())


@claim("ScheduleLR(optimizer, warmup(100, start=0.01) + cosine(900))")
def schedule_warms_up_then_decays_to_zero(scope, code):
    optimizer, scheduler = scope["optimizer"], scope["scheduler"]
    lrs = []
    for _ in range(1001):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()  # no gradients: nothing moves, the schedule advances
        scheduler.step()
    assert lrs[0] == pytest.approx(1e-5)  # 1e-3 x start
    assert lrs[50] == pytest.approx(1e-3 * (0.01 + 0.99 * 50 / 100))
    assert lrs[100] == pytest.approx(1e-3) and max(lrs) == pytest.approx(1e-3)
    assert lrs[550] == pytest.approx(5e-4)  # half way through the cosine
    assert lrs[1000] == 0.0 and all(a >= b for a, b in zip(lrs[100:], lrs[101:]))


@claim("gradwise.ScheduleFreeAdamW(model.parameters(), lr=2.5e-3, warmup_steps=100)")
def schedule_free_eval_moves_to_x_and_train_back_to_y(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    for _ in range(3):
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    y = _clones(model)
    optimizer.eval()
    x = _clones(model)
    assert not _close(x, y)  # the model now holds the average x
    optimizer.eval()
    assert all(torch.equal(a, b) for a, b in zip(x, model.parameters()))  # idempotent
    model(torch.randn(8, 16)).square().mean().backward()
    with pytest.raises(RuntimeError):
        optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(x, model.parameters()))  # a refused step changed nothing
    optimizer.train()
    assert _close(model.parameters(), y)
    optimizer.train()
    assert _close(model.parameters(), y)


@claim('rule = lambda name, p: "sgd" if p.dim() == 2 else "adam"')
def route_sends_the_weight_to_sgd_and_the_bias_to_adam(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    routes = {g["route"]: g for g in optimizer.param_groups}
    assert [p is model.weight for p in routes["sgd"]["params"]] == [True]
    assert [p is model.bias for p in routes["adam"]["params"]] == [True]
    weight, bias = (p.detach().clone().requires_grad_() for p in (model.weight, model.bias))
    sgd = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    adam = torch.optim.Adam([bias], lr=1e-3)
    for _ in range(3):
        model(torch.randn(8, 16)).square().mean().backward()
        weight.grad, bias.grad = model.weight.grad.clone(), model.bias.grad.clone()
        optimizer.step(), sgd.step(), adam.step()
        optimizer.zero_grad()
    assert _close([model.weight, model.bias], [weight, bias])


@claim("class clip_by_value(Transform):")
def custom_transform_clips_before_adam(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    clipped, unclipped = _clones(model), _clones(model)
    references = [torch.optim.Adam(ps, lr=1e-3, betas=(0.9, 0.95)) for ps in (clipped, unclipped)]
    for scale in (3.0, 0.2, 5.0):
        grads = [scale * torch.randn_like(p) for p in model.parameters()]
        for p, c, u, g in zip(model.parameters(), clipped, unclipped, grads):
            p.grad, c.grad, u.grad = g.clone(), g.clamp(-0.5, 0.5), g.clone()
        optimizer.step()
        for r in references:
            r.step()
    assert _close(model.parameters(), clipped) and not _close(model.parameters(), unclipped)


@claim('state=StatePolicy("int4", rules={"bias": "bf16"})')
def state_policy_encodes_each_parameter_as_named(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    model(torch.randn(2, 512)).sum().backward()
    optimizer.step()
    assert all("@bf16" in k for k in optimizer.state[model.bias] if k != "step")
    assert all("@int4" in k for k in optimizer.state[model.weight] if k != "step")
    int4 = gradwise.AdamW(model.parameters(), lr=3e-4, state="int4")
    int4.step()  # the bias's and the weight's gradients are still there
    allocated = sum(v.numel() * v.element_size() for s in int4.state.values() for v in s.values())
    assert gradwise.estimate(model, gradwise.AdamW, state="int4").total == allocated


@claim("print(gradwise.estimate(model, gradwise.Adafactor))")
def adafactor_keeps_factors_and_a_full_bias_moment(scope, code):
    fp32 = gradwise.estimate(scope["model"], gradwise.Adafactor).by("format")["fp32"]
    assert fp32 == (1536 + 1024) * 4  # 1,536 row and column factors + 1,024 for the bias, float32


@claim("handle = gradwise.fused_backward(optimizer)")
def fused_backward_steps_inside_backward_once(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    torch.manual_seed(0)  # the example's model and batch again, stepped once by torch's AdamW
    reference = torch.nn.Linear(16, 4)
    torch_adamw = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    reference(torch.randn(8, 16)).square().mean().backward()
    torch_adamw.step()
    assert _close(model.parameters(), reference.parameters())  # one step, in backward; step() added none
    before = _clones(model)
    model(torch.randn(8, 16)).square().mean().backward()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # removed: backward only
    optimizer.step()
    assert not _close(model.parameters(), before)


@claim('{"params": [model.weight], "rank": 16, "update_proj_gap": 200, "scale": 0.25,')
def galore_keeps_the_weights_moments_projected(scope, code):
    model, optimizer = scope["model"], scope["optimizer"]
    model(torch.randn(3, 64)).sum().backward()
    optimizer.step()
    moments = [v for k, v in optimizer.state[model.weight].items() if "exp_avg" in k]
    assert moments and all(16 in v.shape and v.numel() < model.weight.numel() for v in moments)
    assert all(v.shape == model.bias.shape for k, v in optimizer.state[model.bias].items() if "exp_avg" in k)


@claim('ns_coefficients="polar_express")')
def normuon_keeps_one_second_moment_per_neuron(scope, code):
    model, optimizer, muon = scope["model"], scope["optimizer"], scope["muon"]
    assert optimizer.state[model.weight]["neuron_norm.second_momentum_buffer"].shape == (32, 1)
    assert [g["route"] for g in muon.param_groups] == ["matrix", "other"]
    assert muon.param_groups[0]["ns_coefficients"] == "polar_express"
    before = _clones(model)
    muon.step()  # the gradients of the example's backward
    assert not torch.equal(before[0], model.weight)


def _some_parameter_moves(scope: dict) -> None:
    if "model" not in scope or "optimizer" not in scope:
        return
    model, optimizer = scope["model"], scope["optimizer"]
    before = _clones(model)
    model(torch.randn(3, model.in_features, dtype=model.weight.dtype)).sum().backward()
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_every_claim_names_exactly_one_snippet():
    assert len(SNIPPETS) >= len(CLAIMS)
    for marker in CLAIMS:
        assert sum(marker in s for s in SNIPPETS) == 1, f"README snippets holding {marker!r}"


@pytest.mark.parametrize("code", SNIPPETS, ids=lambda c: c.splitlines()[0])
def test_readme_snippet_does_what_it_says(code):
    scope = run(code)
    checks = [check for marker, check in CLAIMS.items() if marker in code]
    for check in checks:
        check(scope, code)
    if not checks:
        _some_parameter_moves(scope)


#: the rows of the README's "state bytes / parameter, GPT-2 124M: fp32 / bf16 / int8" tables that name one recipe:
#: recipe -> its first figure (fp32)
STATE_ROWS = dict((name, value) for table in re.findall(r"\| state bytes / parameter, GPT-2 124M[^\n]*\n(.*?)\n\n",
                                                    README.read_text(), re.S)
              for name, value in re.findall(r"^\| `(\w+)`(?: \(for comparison\))? \|[^\n]*\| (\d+\.\d\d)\b[^|\n]*\|$",
                                            table, re.M))


def test_state_bytes_tables_are_what_gradwise_estimate_prints(capsys):
    """Each fp32 figure of those tables is ``gradwise estimate --size 124m --recipe NAME``'s bytes per parameter."""
    from gradwise import cli

    assert {"ADOPT", "AdEMAMix", "MARS", "SPAM", "AdamC", "NorMuon", "PSGDKron", "KLShampoo", "KLSOAP", "SubsetNorm",
            "FRUGAL", "MicroAdam"} <= set(STATE_ROWS)  # every recipe since 2024 that the command takes
    for name, value in STATE_ROWS.items():
        assert cli.main(["estimate", "--size", "124m", "--recipe", name]) == 0
        total = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("total"))
        assert f"{float(total.split()[2]):.2f}" == value, (name, total)


def code_lines(path: Path, name: str | None = None) -> int:
    """The README's count rule: the lines of ``path`` (or of its top-level class or function ``name``) that hold
    a token of code; docstrings (module, class, function), comments and blank lines are not counted."""
    source = path.read_text()
    tree = ast.parse(source)
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    docstrings = {line for n in nodes if n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant) and isinstance(n.body[0].value.value, str)
                  for line in range(n.body[0].lineno, n.body[0].end_lineno + 1)}
    span = range(1, len(source.splitlines()) + 1)
    if name is not None:
        node = next(n for n in tree.body if getattr(n, "name", None) == name)
        span = range(node.lineno - len(node.decorator_list), node.end_lineno + 1)
    skipped = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    code = {line for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skipped
            for line in range(t.start[0], t.end[0] + 1)}
    return len((code - docstrings) & set(span))


#: the sizes table's cells: `transforms/x.py` (N ...), `recipes/x.py:Name` (N ...) -> (path, name, N)
SIZES = re.findall(r"`((?:transforms|recipes)/\w+\.py|qk_clip\.py)(?::(\w+))?` \((\d+)\b",
                   re.search(r"\| method \| transform \(code lines\) \|.*?\n\n", README.read_text(), re.S).group())


def test_code_lines_follow_the_rule(tmp_path):
    """The rule on a file written for it: 3 code lines of 9 (a docstring, a comment, blank lines and a class
    docstring left out); the class alone: 1."""
    path = tmp_path / "m.py"
    path.write_text('"""Module."""\n\n# a comment\nx = (1,\n\n     2)  # a tail\n'
                    'class A:\n    """Doc\n    more."""\n')
    assert (code_lines(path), code_lines(path, "A")) == (3, 1)


def test_sizes_table_counts_code_lines():
    """Each file size in the README's table of the methods since 2024 is ``code_lines`` of that file."""
    assert len(SIZES) >= 20 and {"recipes/mezo.py", "transforms/psgd_kron.py"} <= {p for p, _, _ in SIZES}
    package = README.parent / "gradwise"
    counted = {(path, name): code_lines(package / path, name or None) for path, name, _ in SIZES}
    assert {(path, name): int(n) for path, name, n in SIZES} == counted
