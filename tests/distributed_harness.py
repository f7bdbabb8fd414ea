"""Running a test's body on real gloo ranks: spawned once, bounded in time, each rank's failure re-raised.

``spawn(body, world_size, *args)`` starts ``world_size`` processes (``spawn`` start method), each of
which joins a gloo process group, pins one thread (and one inductor compile thread), and calls
``body(rank, world_size, *args)``; the test fails with the failing rank's traceback. A hung rank is
bounded by the process group's ``COLLECTIVE_TIMEOUT_S`` and by ``JOIN_DEADLINE_S`` on the join, after
which every rank is killed. ``body`` must be importable by name (a module-level function).
"""
from __future__ import annotations

import os
import socket
import time
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, body: Callable, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
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
    context = mp.start_processes(_rank_main, args=(world_size, _free_port(), body, args), nprocs=world_size,
                                 join=False, start_method="spawn")
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
