"""Running a test's body on real gloo ranks: spawned once, bounded in time, each rank's failure re-raised.

``spawn(body, world_size, *args)`` starts ``world_size`` processes, each of which takes the test process's
environment as it is then, joins a gloo process group, pins one thread (and one inductor compile thread), and calls
``body(rank, world_size, *args)``; the test fails with the failing rank's traceback. A hung rank is
bounded by the process group's ``COLLECTIVE_TIMEOUT_S`` and by ``JOIN_DEADLINE_S`` on the join, after
which every rank is killed. ``body`` must be importable by name (a module-level function).

The ranks are forked from a server process (``forkserver``, where the platform has it) that has imported torch,
gradwise and the tests' registry once, where a rank started by ``spawn`` imports them anew (seconds of CPU each):
the eight modules that start ranks took 124.9 s on two cores (``pytest -n 2``) where they took 197.6 s with
``spawn`` (a warm compile cache; an empty one: 140.7 s against 220.1 s).
"""
from __future__ import annotations

import json
import os
import socket
import time
import traceback
import warnings
from datetime import timedelta
from typing import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: seconds a collective may wait before gloo raises (a rank that died or diverged)
COLLECTIVE_TIMEOUT_S = 60
#: seconds a whole spawn may take before its ranks are killed and the test fails
JOIN_DEADLINE_S = 300

needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo")


#: the modules every rank imports, loaded once in the server the ranks are forked from
PRELOAD = ["torch", "torch.distributed.fsdp", "torch.distributed.checkpoint", "gradwise", "tests.registry"]
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
if START_METHOD == "forkserver":
    mp.set_forkserver_preload(PRELOAD)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, environment: dict[str, str], body: Callable,
               args: tuple) -> None:
    os.environ.clear()  # the test process's environment now, not the fork server's when it started
    os.environ.update(environment, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # no compile worker pool per rank
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    try:
        body(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(body: Callable, world_size: int, *args, deadline_s: float = JOIN_DEADLINE_S) -> None:
    """Run ``body(rank, world_size, *args)`` on ``world_size`` gloo ranks; fail the test if one fails.

    A rank killed by a signal with no Python exception (gloo's transport aborting, ``terminate called
    without an active exception``, seen once in CI on a loaded machine) gets the whole spawn run once
    more; a second such death, any Python exception in a rank, and a hang fail the test. Bodies must
    therefore be safe to run twice (they write their results, they do not append)."""
    failure, signalled = _spawn_once(body, world_size, args, deadline_s)
    if signalled:
        warnings.warn(f"a rank died by a signal ({failure.splitlines()[-1]}); running the spawn once more")
        failure, _ = _spawn_once(body, world_size, args, deadline_s)
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def _spawn_once(body: Callable, world_size: int, args: tuple, deadline_s: float) -> tuple[str | None, bool]:
    """(what failed, or None; whether it was a rank killed by a signal)."""
    context = mp.start_processes(_rank_main, args=(world_size, _free_port(), dict(os.environ), body, args),
                                 nprocs=world_size, join=False, start_method=START_METHOD)
    deadline = time.monotonic() + deadline_s
    failure, signalled = None, False
    try:
        # join raises ProcessRaisedException (with the rank's traceback) or ProcessExitedException as
        # soon as one rank fails, after terminating the others
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                failure = f"ranks still running after {deadline_s} s; killed them"
                break
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
        failure = f"a rank failed:\n{error}"
        signalled = isinstance(error, mp.ProcessExitedException) and error.signal_name is not None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)
    return failure, signalled


def labelled(error: BaseException, rank: int, case: str) -> None:
    """Name the rank and case in the traceback the test re-raises."""
    if hasattr(error, "add_note"):
        error.add_note(f"(rank {rank}, case {case})")


# --------------------------------------------------------------------------- many cases in one spawn
def run_cases(cases: dict[str, Callable[[int], None]], rank: int, directory: str) -> None:
    """Every case in the same order on every rank, a barrier after each; each rank's outcomes ("ok" or
    the traceback) written to ``rank<r>.json`` in ``directory``."""
    outcomes = {}
    for name, case in cases.items():
        try:
            case(rank)
            outcomes[name] = "ok"
        except Exception as error:
            labelled(error, rank, name)
            outcomes[name] = "".join(traceback.format_exception(error))
        dist.barrier()
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as f:
        json.dump(outcomes, f)


def raise_on_purpose(directory: str, message: str) -> None:
    """Note the time, then raise ``message``: the spawn's last act, to see the other ranks stopped."""
    with open(os.path.join(directory, "raised_at"), "w") as f:
        f.write(repr(time.time()))
    raise RuntimeError(message)


def went_on(directory: str, what: str) -> None:
    """Rank 0 got past the collective the raising rank never joined (it must not)."""
    with open(os.path.join(directory, "rank0_went_on"), "w") as f:
        f.write(what)


def spawn_failing_on_purpose(worker: Callable, world_size: int, directory) -> dict:
    """Spawn ``worker`` (which ends in ``run_cases`` then ``raise_on_purpose``); each rank's outcomes, the
    failure the spawn reported, how long after the raise it returned, and whether rank 0 went on."""
    with pytest.raises(pytest.fail.Exception) as failed:
        spawn(worker, world_size, str(directory))
    returned = time.time()
    ranks = []
    for rank in range(world_size):
        with open(directory / f"rank{rank}.json") as f:
            ranks.append(json.load(f))
    raised_at = float((directory / "raised_at").read_text())
    return {"ranks": ranks, "failure": str(failed.value), "stopped_after_s": returned - raised_at,
            "rank0_went_on": (directory / "rank0_went_on").exists()}


def case_failures(outcomes: dict, case: str) -> str:
    """Each rank's traceback of ``case``, or "" if it passed on every rank."""
    return "\n".join(f"rank {rank}:\n{o[case]}" for rank, o in enumerate(outcomes["ranks"]) if o[case] != "ok")


def assert_stopped_with_error(outcomes: dict, message: str, source: str) -> None:
    """The spawn failed with the raising rank's ``message`` or with rank 0's collective (in ``source``'s
    ``step``) failing on it, rank 0 went no further, and the stop came from the error, not from gloo's collective
    timeout: the failure names no timeout and the spawn ended before that timeout could have fired (a bound by
    construction, not a speed figure: the machine's load does not move it)."""
    failure = outcomes["failure"]
    # whichever rank the harness hears from first (the raising rank's group closes as its error unwinds)
    assert message in failure or ("Process 0" in failure and source in failure and "in step" in failure), failure
    assert not outcomes["rank0_went_on"]
    assert "timed out" not in failure.lower() and "timeout" not in failure.lower(), failure
    assert outcomes["stopped_after_s"] < COLLECTIVE_TIMEOUT_S, outcomes["stopped_after_s"]
