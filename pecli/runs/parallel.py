"""Data parallel through accelerate: each process scores a shard of the batches, the main
process gets every result back in the original order and alone writes.

Start N processes with `torchrun --nproc_per_node N -m pecli ...` or `accelerate launch
--num_processes N -m pecli ...` (on CPU add `--cpu`; the gloo backend is used). Without a
launcher everything here is the identity: one process, world size 1.

Tables equal a single-process run's exactly: the batch plan is made from all the texts
before sharding, so every text is computed in the very same padded batch whatever the
process count, and results are put back in batch order before any aggregation.
"""

from __future__ import annotations

import os
from functools import cache
from typing import TypeVar

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


def shards(batches: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Every process's batches (indices into `batches`), balanced by padded tokens.

    A batch costs len(batch) * its longest text: what its forward pass computes.
    """
    world = world_size()
    if world == 1:
        return [list(range(len(batches)))]
    return balance([len(b) * max(lengths[i] for i in b) for b in batches], world)


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
