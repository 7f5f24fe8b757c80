"""Several processes, one computation: JAX's own distributed runtime (jax.distributed), and the mesh the
reference is sharded on.

`evalsuite --num-processes N --process-id I --coordinator HOST:PORT --mesh tp=..,dp=..,ep=.. COMMAND` starts
this process as one of N (the same command on every host or process, each with its own id; process 0's
HOST:PORT is the coordinator). jax.devices() then lists every process's devices, and a mesh spans them: the
reference's weights and KV cache are split over all processes, XLA inserts the collectives (gloo on CPU,
NCCL/ICI on accelerators), and every process reads back the same tokens (the head's outputs are replicated).
Every process prints its result; only process 0 writes files. Spreading a benchmark's ITEMS over workers is
`run --shard i/N` + `evalsuite merge` instead (independent processes, no collectives).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

from evalsuite.errors import SpecError

# Commands that run under several processes: each process computes the same result (the mesh's collectives
# keep them in step). The others write journals and run folders, one writer per folder: spread those with
# `run --shard i/N` instead.
MULTI_PROCESS_COMMANDS = ("generate", "diff", "golden")
# Seconds a process waits for the coordinator (and JAX for every process) before giving up (JAX's default is
# 300); EVALSUITE_JOIN_TIMEOUT_S overrides it.
JOIN_TIMEOUT_S = 120

_state = {"mesh": None, "processes": 1, "process_id": 0}


def set_mesh(text: str | None) -> None:
    """The mesh every engine that takes one (the reference: `evalsuite engines` lists `mesh`) is built on,
    unless its own --engine-option mesh=... says otherwise. Checked against the model when the engine is made."""
    if text:
        from evalsuite.plugins import check_mesh  # the judge's own parser (the plugin loader may import engines)

        check_mesh(text)
    _state["mesh"] = text or None


def default_mesh() -> str | None:
    return _state["mesh"]


def initialize(command: str | None, coordinator: str | None, num_processes: int | None,
               process_id: int | None) -> None:
    """jax.distributed.initialize when num_processes > 1 (before anything touches a JAX backend)."""
    if num_processes is None or num_processes <= 1:
        if process_id not in (None, 0):
            raise SpecError(f"--process-id {process_id} needs --num-processes above it")
        return
    if command not in MULTI_PROCESS_COMMANDS:
        raise SpecError(f"{command or 'this command'} does not run under several processes (it writes a run "
                        f"folder); those that do: {', '.join(MULTI_PROCESS_COMMANDS)}. Spread a benchmark's "
                        "items with run --shard i/N and evalsuite merge")
    if not coordinator or ":" not in coordinator:
        raise SpecError(f"--num-processes {num_processes} needs --coordinator HOST:PORT (process 0's address)")
    if process_id is None or not 0 <= process_id < num_processes:
        raise SpecError(f"--process-id must be in [0, {num_processes - 1}], got {process_id}")
    timeout = int(os.environ.get("EVALSUITE_JOIN_TIMEOUT_S", JOIN_TIMEOUT_S))
    if process_id != 0:
        _wait_for_coordinator(coordinator, timeout, process_id, num_processes)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices across processes
    try:
        with _stdout_to_stderr():  # gloo prints "[Gloo] Rank i is connected ..." on stdout: keep --json clean
            jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                       process_id=process_id, initialization_timeout=timeout)
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("evalsuite: every process joined")  # gloo connects here
    except Exception as e:  # noqa: BLE001 - JAX raises XlaRuntimeError/RuntimeError/ValueError here
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecError(f"jax.distributed.initialize (process {process_id} of {num_processes}, coordinator "
                        f"{coordinator}) failed: {first[:300]}") from None
    _state.update(processes=num_processes, process_id=process_id)


def _wait_for_coordinator(address: str, timeout: float, process_id: int, n: int) -> None:
    """Until process 0's coordinator accepts a TCP connection: JAX's own client aborts the process (a C++ fatal
    error, no Python exception) when it cannot register, so an absent coordinator is caught here first, as one
    line. (Process 0 hosts the coordinator; if the others never come, JAX aborts it after the timeout.)"""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise SpecError(f"process {process_id} of {n}: no coordinator at {address} after {timeout:.0f} s "
                                "(start process 0 with the same --coordinator; EVALSUITE_JOIN_TIMEOUT_S sets the wait)"
                                ) from None
            time.sleep(0.5)


@contextlib.contextmanager
def _stdout_to_stderr():
    """File descriptor 1 pointed at 2 for a while (C++ code writes to the descriptor, not to sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def writes_files() -> bool:
    """Only process 0 writes reports and files; the others compute the same result and print it."""
    return _state["process_id"] == 0


def describe() -> dict:
    """For result files: how many processes and which mesh."""
    return {"processes": _state["processes"], "process_id": _state["process_id"], "mesh": _state["mesh"]}
