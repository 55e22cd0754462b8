"""Absolute position tables past their rows, where that is exact (`pecli length`).

A learned table has no row for a position it never saw: evaluating past it is not
applicable, never clamped. Three tables pecli itself trains (pecli.measures.training,
`config.pecli_position`) are defined at every position and extend exactly: `sinusoidal`
(the sinusoid, at the scale it was trained with), `none` and `alibi` (zero rows: their
positions are nowhere, or in the attention's bias).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from pecli.models.architectures import position_embedding
from pecli.positions.sinusoid import sinusoidal_at
from pecli.runs.errors import ModelError

EXTENDS = ("sinusoidal", "none", "alibi")  # table kinds defined at every position


def table_kind(loaded) -> str:
    """rotary, or the kind of an absolute table: learned (a hub model's, or pecli's `learned`),
    sinusoidal, none or alibi (pecli-trained)."""
    if loaded.spec.position != "learned":
        return loaded.spec.position
    return getattr(loaded.model.config, "pecli_position", "learned")


def not_applicable(loaded, length: int) -> str | None:
    """Why a window of `length` tokens cannot be evaluated on this model, or None."""
    rows = loaded.max_positions
    if loaded.spec.position == "learned" and length > rows and table_kind(loaded) not in EXTENDS:
        return f"not applicable: {rows} learned positions"
    if loaded.spec.fixed_table and length > rows:
        return f"not applicable: {rows} positions ({loaded.spec.family}'s own position table)"
    return None


def _rows(kind: str, n: int, dim: int, config) -> torch.Tensor:
    if kind == "sinusoidal":
        scale = float(getattr(config, "pecli_sinusoid_scale", 1.0))
        return torch.from_numpy(sinusoidal_at(np.arange(n), dim)).float() * scale
    return torch.zeros(n, dim)


@contextmanager
def extended(loaded, length: int) -> Iterator[int]:
    """Within the block, a pecli-trained sinusoidal / none / alibi table holds at least
    `length` rows (the trained rows kept, checked to be the table's own); yields the rows the
    model had. Nothing changes for rotary models or lengths within the table."""
    rows = loaded.max_positions
    if loaded.spec.position != "learned" or length <= rows:
        yield rows
        return
    kind = table_kind(loaded)
    if kind not in EXTENDS:
        raise ModelError(f"{loaded.name}: not applicable: {rows} learned positions (no row past them)")
    table = position_embedding(loaded.model, loaded.spec)
    old = table.weight
    new = _rows(kind, length + loaded.spec.pos_offset, old.shape[1], loaded.model.config).to(old)
    if not torch.allclose(new[:old.shape[0]], old.detach(), atol=1e-6):
        raise ModelError(f"{loaded.name}: its {kind} position table is not the one pecli trains with "
                         "(config.pecli_position); it cannot be extended exactly")
    table.weight = torch.nn.Parameter(torch.cat([old.detach(), new[old.shape[0]:]]), requires_grad=False)
    table.num_embeddings = new.shape[0]
    try:
        yield rows
    finally:
        table.weight, table.num_embeddings = old, old.shape[0]
