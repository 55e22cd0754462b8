"""Model sharding: one model over several devices (accelerate)."""

from __future__ import annotations

from pathlib import Path

import torch

from pecli.runs.errors import DeviceError


def parse_max_memory(text: str | None) -> dict | None:
    """`0=20GiB,1=20GiB,cpu=64GiB` -> {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}."""
    if not text:
        return None
    out: dict = {}
    for item in text.split(","):
        key, _, size = item.partition("=")
        key, size = key.strip(), size.strip()
        if not key or not size or not (key.isdigit() or key in ("cpu", "disk")):
            raise DeviceError(f"--max-memory {text!r}: give DEVICE=SIZE pairs, e.g. "
                              "0=20GiB,1=20GiB,cpu=64GiB (DEVICE: a GPU index, cpu or disk)")
        out[int(key) if key.isdigit() else key] = size
    return out


def dispatch(loaded, device_map: str | dict, max_memory: str | None = None,
             offload_folder: str | Path | None = None) -> torch.device:
    """Spread `loaded`'s model (a pecli.models.loading.LoadedModel) over devices with
    accelerate; return the device inputs go to.

    `device_map` "auto" fills `max_memory` in order (GPUs, then cpu, then disk), whole
    blocks at a time; a dict maps module names to devices ("disk": offloaded to
    `offload_folder`, read back layer by layer). The position-embedding table is kept on an
    execution device, so interventions edit it in place; rotations and masks follow each
    module's device through accelerate's hooks.
    """
    import tempfile

    from accelerate import dispatch_model, infer_auto_device_map

    from pecli.models.architectures import position_embedding

    model = loaded.model
    if device_map == "auto":
        device_map = infer_auto_device_map(model, max_memory=parse_max_memory(max_memory),
                                           no_split_module_classes=model._no_split_modules or [])
    elif not isinstance(device_map, dict):
        raise DeviceError(f"--device-map {device_map!r}: only auto is understood (with --max-memory)")
    device_map = dict(device_map)
    gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
    main = gpus[0] if gpus else "cpu"
    if set(device_map.values()) == {"disk"}:
        raise DeviceError("--max-memory leaves no room for any layer on a device; raise it")
    if loaded.spec.position == "learned":  # the table interventions rewrite: never offloaded
        table = position_embedding(model, loaded.spec)
        name = next(n for n, m in model.named_modules() if m is table)
        for key in device_map:
            if (key == "" or name == key or name.startswith(key + ".")) \
                    and device_map[key] in ("disk", "cpu" if gpus else "disk"):
                device_map[key] = main
    folder = offload_folder or (tempfile.mkdtemp(prefix="pecli-offload-")
                                if "disk" in device_map.values() else None)
    dispatch_model(model, device_map, main_device=main, offload_dir=folder)
    loaded.extra["device_map"] = {k: str(v) for k, v in device_map.items()}
    return torch.device(main if isinstance(main, str) else f"cuda:{main}")
