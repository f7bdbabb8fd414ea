"""``gradwise.state.byte_loads``: the encoded step's AVX2 kernels load 8-bit codes 8 bytes at once
(``loadu_one_fourth``), not through ATen's stack-buffer path for a partial count, and step to the same bits as
the kernels inductor generates without the patch; the patch lives for one compile and keys inductor's cache."""
from __future__ import annotations

import contextlib
import re

import pytest
import torch
from torch._inductor import config
from torch._inductor.codegen.cpp import CppVecKernel
from torch._inductor.custom_graph_pass import CustomGraphPass

import gradwise
from gradwise.state import byte_loads, fused
from gradwise.state.byte_loads import VERSION, ByteLoadsKey, full_width_byte_loads
from tests.generated_code import keep_generated_code

AVX2 = torch.backends.cpu.get_cpu_capability() == "AVX2"
#: An 8-lane load of bytes through the partial-count path, outside a loop's tail (whose count is an expression).
_PARTIAL_BYTE_LOAD = re.compile(r"Vectorized<u?int8_t>::loadu\([^;]*static_cast<int64_t>\(8\)\)")


def _compiled_steps(monkeypatch, state: str, patched: bool = True):
    """Two compiled AdamW steps with ``state`` on a matrix of two blocks (one graph): the parameter, the optimizer's
    state and the generated code of each graph (compiled here, none loaded from the disk store). ``patched=False``:
    inductor's own loads."""
    monkeypatch.setattr(byte_loads, "full_width_byte_loads",
                        byte_loads.full_width_byte_loads if patched else contextlib.nullcontext)
    sources = keep_generated_code(monkeypatch, fused.CompiledCodedStep)
    gen = torch.Generator().manual_seed(0)
    param = torch.nn.Parameter(torch.randn(16, 256, generator=gen))
    optimizer = gradwise.AdamW([param], lr=1e-2, weight_decay=0.1, state=state, compile=True)
    for _ in range(2):
        param.grad = torch.randn(param.shape, generator=gen)
        optimizer.step()
    assert sources, "nothing compiled"
    return param, optimizer.state_dict()["state"][0], "\n".join(sources)


@pytest.mark.skipif(not AVX2, reason="the patch changes AVX2 kernels only")
def test_int8_step_loads_codes_eight_bytes_at_once(monkeypatch):
    code = _compiled_steps(monkeypatch, "int8")[2]
    assert "Vectorized<uint8_t>::loadu_one_fourth(" in code
    assert not _PARTIAL_BYTE_LOAD.findall(code)


@pytest.mark.skipif(not AVX2, reason="the patch changes AVX2 kernels only")
def test_fp8_step_loads_codes_eight_bytes_at_once_to_the_bits_of_inductors_own_loads(monkeypatch):
    """fp8's step with the patch and without it (where the partial loads are): the same parameter and state bits."""
    param, saved, code = _compiled_steps(monkeypatch, "fp8")
    assert "Vectorized<uint8_t>::loadu_one_fourth(" in code
    assert not _PARTIAL_BYTE_LOAD.findall(code)
    unpatched_param, unpatched_saved, unpatched_code = _compiled_steps(monkeypatch, "fp8", patched=False)
    assert _PARTIAL_BYTE_LOAD.findall(unpatched_code) and "loadu_one_fourth" not in unpatched_code
    assert torch.equal(param, unpatched_param)
    assert saved.keys() == unpatched_saved.keys()
    for name, value in unpatched_saved.items():
        assert torch.equal(saved[name], value), name


class UserPass(CustomGraphPass):
    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return "a user's pass"


def test_the_patch_lives_for_the_block_and_keys_inductors_cache(monkeypatch):
    """Inside: the code generator's load is gradwise's and the post-grad passes end with ``ByteLoadsKey`` (its
    uuid ``VERSION``), a user's pass kept before it; nested blocks change nothing; after the block, even one that
    raised, inductor's method and the user's setting are back."""
    assert byte_loads.SUPPORTED  # torch 2.13's code generator, the one the Makefile installs
    user = UserPass()
    monkeypatch.setattr(config, "post_grad_custom_post_pass", user)
    generated = CppVecKernel._get_vec_load_line
    with pytest.raises(RuntimeError, match="inside"):
        with full_width_byte_loads():
            passes = config.post_grad_custom_post_pass
            assert CppVecKernel._get_vec_load_line is not generated
            assert passes[0] is user and isinstance(passes[-1], ByteLoadsKey) and passes[-1].uuid() == VERSION
            with full_width_byte_loads():
                assert config.post_grad_custom_post_pass == passes
            assert CppVecKernel._get_vec_load_line is not generated
            raise RuntimeError("inside")
    assert CppVecKernel._get_vec_load_line is generated
    assert config.post_grad_custom_post_pass is user


def test_another_code_generator_is_left_as_it_is(monkeypatch):
    """Where the private method is not torch 2.13's (``SUPPORTED`` false), the block patches nothing."""
    monkeypatch.setattr(byte_loads, "SUPPORTED", False)
    generated, passes = CppVecKernel._get_vec_load_line, config.post_grad_custom_post_pass
    with full_width_byte_loads():
        assert CppVecKernel._get_vec_load_line is generated
        assert config.post_grad_custom_post_pass is passes
