"""Whether the Hugging Face hub answers: asked once per process by datasets and models alike."""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse


@cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the HF hub answers at all (so an offline run fails in seconds, not after retries)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        return False
    from huggingface_hub import constants

    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
