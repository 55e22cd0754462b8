"""Data parallel through accelerate: each process scores a shard of the batches, the main
process gets every result back in the original order and alone writes.

Start N processes with `torchrun --nproc_per_node N -m pecli ...` or `accelerate launch
--num_processes N -m pecli ...` (on CPU add `--cpu`; the gloo backend is used). Without a
launcher everything here is the identity: one process, world size 1.

Tables equal a single-process run's: the batch plan is made from all the texts before
sharding, and results are put back in batch order before any aggregation. Every process gets
work wherever there are as many texts as processes: a plan of fewer batches than processes
is split first (`spread`; then equal to float noise, else exactly). Each process's share of
the padded tokens goes into the tables (`process_tokens`) and the header.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TypeVar

from pecli.runs.provenance import SHARES  # process -> padded tokens it was given (every plan)

T = TypeVar("T")


def launched() -> bool:
    """Started by torchrun / accelerate launch with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@cache
def state():
    """accelerate's PartialState (initialises torch.distributed once: gloo on CPU, nccl on CUDA)."""
    import torch
    from accelerate import PartialState

    # accelerate only picks gloo (MULTI_CPU) when told to run on CPU; `accelerate launch --cpu`
    # says so through ACCELERATE_USE_CPU, torchrun on a machine without CUDA does not.
    cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") \
        or not torch.cuda.is_available()
    return PartialState(cpu=cpu)


def world_size() -> int:
    return state().num_processes if launched() else 1


def rank() -> int:
    return state().process_index if launched() else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if launched():
        state().wait_for_everyone()


def local_device(device: str) -> str:
    """`auto`/`cuda` -> this process's own GPU (cuda:<local rank>) when launched on CUDA."""
    import torch

    if launched() and device in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{state().local_process_index}"
    return device


def balance(costs: list[int], world: int) -> list[list[int]]:
    """Indices of `costs` split into `world` shards of near-equal total cost.

    Greedy longest-processing-time: the costliest item goes to the least-loaded shard (ties
    to the lowest shard, so the split is deterministic); each shard keeps ascending order.
    """
    loads = [0] * world
    shards: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        shards[r].append(i)
        loads[r] += costs[i]
    return [sorted(s) for s in shards]


def spread(batches: list[list[int]]) -> list[list[int]]:
    """The plan with a batch for every process wherever there are as many rows as processes:
    the largest batches are halved (rows keep their order) until each process gets one.
    The identity in one process; numbers stay equal to float noise (halves pad less)."""
    out = [list(b) for b in batches]
    while len(out) < world_size():
        big = max(range(len(out)), key=lambda i: len(out[i]), default=None)
        if big is None or len(out[big]) < 2:
            break
        rows = out.pop(big)
        out[big:big] = [rows[:len(rows) // 2], rows[len(rows) // 2:]]
    return out


def shards(batches: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Every process's batches (indices into `batches`), balanced by padded tokens.

    A batch costs len(batch) * its longest text: what its forward pass computes. Each
    process's cost is added to SHARES (every process knows every share: the plan is shared).
    """
    world = world_size()
    if world == 1:
        return [list(range(len(batches)))]
    costs = [len(b) * max(lengths[i] for i in b) for b in batches]
    parts = balance(costs, world)
    for process, part in enumerate(parts):
        SHARES[process] = SHARES.get(process, 0) + sum(costs[b] for b in part)
    return parts


def launch_note() -> str | None:
    """One line when `accelerate launch` was asked for more processes than it started (on a
    machine without GPUs it starts one and says nothing); None otherwise."""
    if launched() or "ACCELERATE_MIXED_PRECISION" not in os.environ:  # not under accelerate
        return None
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return None
    asked = None
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag in ("--num_processes", "--num-processes"):
            value = value or (argv[i + 1] if i + 1 < len(argv) else "")
            asked = int(value) if value.isdigit() else None
    if not asked or asked < 2:
        return None
    return (f"accelerate launch was asked for {asked} processes but started 1 (it does on a "
            f"machine without GPUs); to run {asked} on CPU: torchrun --standalone "
            f"--nproc_per_node {asked} -m pecli ...")


def shard(batches: list[list[int]], lengths: list[int]) -> list[int]:
    """This process's batches (indices into `batches`): its part of `shards`."""
    return shards(batches, lengths)[rank()]


def gather(local: dict[int, T]) -> dict[int, T]:
    """Every process's {global index: result}, merged and sorted by index, on every process."""
    if not launched():
        return dict(sorted(local.items()))
    from accelerate.utils import gather_object

    merged: dict[int, T] = {}
    for part in gather_object([local]):
        merged.update(part)
    return dict(sorted(merged.items()))


def from_main(obj: T) -> T:
    """The main process's `obj` on every process (e.g. what a checkpoint held, which only
    the main process reads: the others must skip the same work)."""
    if not launched():
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj], from_process=0)[0]
