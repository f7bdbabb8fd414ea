#!/usr/bin/env python
"""The Markdown table of ``bench/gpu.sh``: one row per recipe from ``bench/step.py --json`` runs (one run per
recipe, each with torch's fused AdamW measured in it), achieved memory bandwidth as a share of the device's copy
bandwidth, and notes for the rows that failed or ran out of time.

achieved bandwidth = bytes moved per parameter x parameters / median step time; the copy bandwidth is
(read + write) / time of a device-to-device ``dst.copy_(src)``, measured in the same run as the row.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ("recipe", "path", "median ms", "x torch fused AdamW", "bytes moved / param", "achieved GB/s",
           "x copy bandwidth", "state B/param", "compile s")


def _cells(row: dict, header: dict) -> list[str]:
    achieved = row["bytes_moved_per_param"] * header["params"] / (row["median_ms"] / 1e3) / 1e9
    compile_s = f"{row['compile_s']:.1f}" if row["compiles"] else "-"
    return [row["recipe"], row["path"], f"{row['median_ms']:.2f}", f"{row['vs_fused']:.2f}",
            str(row["bytes_moved_per_param"]), f"{achieved:.0f}", f"{achieved / header['copy_bandwidth_gbs']:.2f}",
            f"{row['state_bytes_per_param']:.2f}", compile_s]


def table(results: list[dict], tests: str, notes: list[str]) -> str:
    """The Markdown text: a heading line, the device and the tests' outcome, the table, the notes."""
    lines = []
    if results:
        h = results[0]["header"]
        copies = ", ".join(f"{r['header']['copy_bandwidth_gbs']:.0f}" for r in results)
        lines += [f"Optimizer step on {h['device']}, GPT-2-shaped {h['params_label']} parameters (fp32, "
                  f"{h['tensors']} tensors), torch {h['torch']}: median of {h['steps']} steps per row.",
                  "", f"Copy bandwidth (read + write of a {h['copy_mb']} MiB device-to-device copy), GB/s, per run: "
                  f"{copies}.", ""]
    lines += [f"Tests: {tests}", "", "| " + " | ".join(COLUMNS) + " |",
              "|" + "---|" * len(COLUMNS)]
    fused = None
    for result in results:
        for row in result["rows"]:
            if row["recipe"] != "torch AdamW":
                lines.append("| " + " | ".join(_cells(row, result["header"])) + " |")
            elif row["path"] == "fused" and fused is None:
                fused = "| " + " | ".join(_cells(row, result["header"])) + " |"
    if fused:
        lines.append(fused)
    lines += [""] + [f"- {note}" for note in notes]
    lines.append("- x torch fused AdamW: over torch.optim.AdamW(fused=True) timed in the same run, interleaved.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/_gpu_table.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the Markdown file written")
    parser.add_argument("--tests", default="not run", help="the outcome of the tests, one line")
    parser.add_argument("--note", action="append", default=[], help="a note under the table (repeatable)")
    parser.add_argument("runs", nargs="*", help="bench/step.py --json files, in row order")
    args = parser.parse_args(argv)
    results = [json.loads(Path(run).read_text()) for run in args.runs]
    Path(args.out).write_text(table(results, args.tests, args.note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
