"""The loss each state format costs AdamW on the arena's workloads (issue 3's quality check on fixed
training runs): every workload trained for its step budget with the same hyperparameters (AdamW's
target-setting point from ``targets.json``: lr 2.45e-3, 1 - beta1 0.105, weight decay 0.0146, 10%
warmup then cosine decay), each format kept by ``StatePolicy(fmt, min_numel=...)``: 0 (the default
here) encodes every buffer, 4096 is the policy's own default, which keeps the many small tensors of
these models in float32. Printed: the final validation loss (and metric), mean over seeds, and each
format's over float32's. Run with ``python bench/memory.py --arena-quality --formats ''
--quality-formats '' [--arena-quality-min-numel 4096] [--arena-quality-formats fp32,int8,fp8]``.
"""
from __future__ import annotations

import statistics

HYPERPARAMETERS = {"lr": 0.0024519470038049883, "one_minus_beta1": 0.10510186540336922,
                   "weight_decay": 0.014598065960959354, "warmup_factor": 0.1}
WORKLOADS = ("digits_cnn", "teacher_student", "mnist1d_cnn")
FORMATS = ("fp32", "bf16", "int8", "int4", "fp8")


def final_validation(workload_name: str, state: str, seed: int, steps: int | None = None,
                     min_numel: int = 0) -> dict[str, float]:
    """Validation loss (and metric) after ``steps`` (default: the workload's step budget) with AdamW
    keeping ``state``."""
    import itertools

    from gradwise.arena.submissions import build_optimizer
    from gradwise.arena.workloads import get_workload
    from gradwise.state import StatePolicy

    workload = get_workload(workload_name)
    model = workload.init_model(seed)
    policy = None if state == "fp32" else StatePolicy(state, min_numel=min_numel)
    steps = workload.step_hint if steps is None else steps
    optimizer, schedule = build_optimizer("AdamW", {**HYPERPARAMETERS, "state": policy}, model.parameters(), steps)
    for x, y in itertools.islice(workload.batches(workload.batch_size, seed), steps):
        optimizer.zero_grad()
        workload.loss(model(x), y).backward()
        optimizer.step()
        schedule.step()
    return workload.evaluate(model)


def compare(workloads=WORKLOADS, seeds=(0, 1, 2), steps: int | None = None, min_numel: int = 0,
            log=print, formats=FORMATS) -> list[dict]:
    """One row per workload and format (``formats``: fp32 first, the baseline of the ratios)."""
    rows = []
    for name in workloads:
        base = None
        for state in formats:
            log(f"arena quality: {name} {state}")
            results = [final_validation(name, state, seed, steps, min_numel) for seed in seeds]
            loss = statistics.fmean(r["loss"] for r in results)
            metric = next((k for k in ("accuracy", "mse") if k in results[0]), "loss")
            base = loss if state == "fp32" else base
            rows.append({"workload": name, "format": state, "loss": loss, "vs_fp32": loss / base, "metric": metric,
                         "metric_value": statistics.fmean(r[metric] for r in results),
                         "losses": [r["loss"] for r in results]})
    return rows


def print_table(rows: list[dict], min_numel: int = 0) -> None:
    print(f"\nAdamW on the arena's workloads, state buffers of at least {min_numel} elements in the format:"
          " final validation loss, mean of seeds")
    print(f"{'workload':<18}{'format':<8}{'loss':>10}{'vs fp32':>10}{'metric':>20}   per seed")
    for r in rows:
        metric = f"{r['metric']} {r['metric_value']:.4f}"
        print(f"{r['workload']:<18}{r['format']:<8}{r['loss']:>10.5f}{r['vs_fp32']:>10.4f}{metric:>20}"
              f"   {[round(v, 5) for v in r['losses']]}")
