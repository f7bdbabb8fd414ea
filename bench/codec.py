#!/usr/bin/env python
"""What the codecs cost on their own, against a whole torch AdamW step: the floor under an
encoded-state step.

One buffer of ``--numel`` float32 elements (default: the 25m set's token embedding, its largest
tensor). Each code map that ``int8``, ``int4`` and ``fp8`` use is compiled (``torch.compile``, static shapes)
into three single-pass kernels writing into preallocated outputs: decoding codes to float32 in units
of one scale, rounding float32 to the nearest code, and rounding stochastically. A compiled scaled
copy gives the memory-traffic baseline, and ``torch.optim.AdamW(fused=True)`` stepping a parameter of
the same size is the reference; every item runs once per round, rounds interleaved, and the median
of each is reported over the reference's median.

An AdamW step with both moments encoded decodes two buffers and encodes two, so the sum of those
four medians is a floor under its compiled step (before the update itself, the scale reductions
and any second pass they need). ``fp8``'s maps (an e4m3 conversion, and for the second moment a
square root before it and a square after) take a few instructions where the dynamic map takes a few
dozen. In one fused kernel their memory traffic could overlap; the
compute-only floor takes it out: each item's median less the copy's time for the bytes it moves
(1 or 0.5 byte of codes and 4 bytes of float32 per element, where the copy moves 8).
Run as ``python bench/codec.py``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root: bench.* and its gradwise

#: (codec, buffer, map kind, bits, signed, rounding) for each map the codecs use by default.
MAPS = (
    ("int8", "first moment", "dynamic", 8, True, "nearest"),
    ("int8", "second moment", "dynamic", 8, False, "nearest"),
    ("int4", "first moment", "dynamic", 4, True, "stochastic"),
    ("int4", "second moment", "linear", 4, False, "nearest"),
    ("fp8", "first moment", "e4m3", 8, True, "nearest"),
    ("fp8", "second moment", "sqrt e4m3", 8, False, "nearest"),
)
WTE_25M = 50257 * 384  # the 25m set's token embedding


def measure(numel: int = WTE_25M, rounds: int = 7, log=print) -> dict:
    import torch

    from gradwise.core.hashing import hash32, unsigned
    from gradwise.state import codec_from

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(numel, generator=gen).clamp(-4, 4) / 4 * torch.rand(numel, generator=gen) ** 4
    uniform = unsigned(hash32(torch.arange(numel, dtype=torch.int32), torch.tensor(7))).float() / 2**32
    floats, codes = torch.empty(numel), torch.empty(numel, dtype=torch.uint8)
    unit = torch.ones(())
    items = {"copy (memory baseline)": (torch.compile(lambda a, out: out.copy_(a * 0.5), dynamic=False), (x, floats))}
    for codec, buffer, kind, bits, signed, rounding in MAPS:
        cm = codec_from(codec).maps[signed]  # compiled, the integer maps use their closed forms
        values = x if signed else x.abs()
        stored = torch.randint(0, 2**bits - 1, (numel,), dtype=torch.uint8, generator=gen)
        label = f"{codec} {buffer} ({kind} {bits}-bit, {'signed' if signed else 'non-negative'})"
        items[f"{label}: decode"] = (torch.compile(lambda c, out, cm=cm: out.copy_(cm.value(c) * 0.5),
                                                   dynamic=False), (stored, floats))
        if hasattr(cm, "codes"):  # a float8 map rounds by its own conversion, in units of a scale (here 1)
            encode = torch.compile(lambda a, out, cm=cm: out.copy_(cm.codes(a, unit)), dynamic=False)
            items[f"{label}: encode nearest"] = (encode, (values, codes))
        elif rounding == "nearest":
            encode = torch.compile(lambda a, out, cm=cm: out.copy_(cm.nearest(a).to(torch.uint8)), dynamic=False)
            items[f"{label}: encode nearest"] = (encode, (values, codes))
        else:
            encode = torch.compile(lambda a, u, out, cm=cm: out.copy_(cm.stochastic(a, u).to(torch.uint8)),
                                   dynamic=False)
            items[f"{label}: encode stochastic"] = (encode, (values, uniform, codes))
    param = torch.nn.Parameter(torch.randn(numel, generator=gen))
    param.grad = torch.randn(numel, generator=gen) * 1e-2
    reference = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.1, fused=True)
    load_start = os.getloadavg()
    for name, (fn, args) in items.items():  # compile and warm up
        log(f"compiling {name}")
        fn(*args)
    reference.step()
    times: dict[str, list[float]] = {name: [] for name in ["torch AdamW fused step", *items]}
    for r in range(rounds):
        start = time.perf_counter()
        reference.step()
        times["torch AdamW fused step"].append(time.perf_counter() - start)
        for name, (fn, args) in items.items():
            start = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    ref = medians["torch AdamW fused step"]
    rows = [{"item": name, "median_ms": ms, "vs_fused": ms / ref} for name, ms in medians.items()]
    per_byte = medians["copy (memory baseline)"] / 8
    floors = {}
    for codec, bits in (("int8", 8), ("int4", 4), ("fp8", 8)):
        parts = [ms for name, ms in medians.items() if name.startswith(f"{codec} ")]
        compute = sum(parts) - len(parts) * per_byte * (4 + bits / 8)
        floors[codec] = {"ms": sum(parts), "vs_fused": sum(parts) / ref,
                         "compute_ms": compute, "compute_vs_fused": compute / ref}
    return {"numel": numel, "rounds": rounds, "threads": 1, "loadavg_start": list(load_start),
            "loadavg_end": list(os.getloadavg()), "rows": rows, "floors": floors}


def print_result(result: dict) -> None:
    print(f"\n{result['numel']:,} float32 elements, 1 thread, median of {result['rounds']} interleaved rounds;"
          f" load average {result['loadavg_start'][0]:.2f} at start, {result['loadavg_end'][0]:.2f} at end")
    print(f"{'item':<78}{'median ms':>10}{'x fused':>9}")
    for r in result["rows"]:
        print(f"{r['item']:<78}{r['median_ms']:>10.1f}{r['vs_fused']:>9.2f}")
    for codec, floor in result["floors"].items():
        print(f"floor of a compiled {codec} AdamW step (decode both moments + encode both): "
              f"{floor['ms']:.1f} ms = {floor['vs_fused']:.2f}x torch's fused step; compute only "
              f"{floor['compute_ms']:.1f} ms = {floor['compute_vs_fused']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    from gradwise.help_format import HelpFormatter

    parser = argparse.ArgumentParser(prog="bench/codec.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--numel", type=int, default=WTE_25M, help="elements in the buffer")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    args = parser.parse_args(argv)
    if args.numel < 1 or args.rounds < 1:
        parser.error(f"--numel {args.numel} and --rounds {args.rounds} must be at least 1")
    print_result(measure(args.numel, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
