"""One module per command (group); each has `register(app)`."""

from rich.console import Console


def console(**kwargs) -> Console:
    """A Rich console; piped or captured output gets 150 columns, not a squeezed 80."""
    out = Console(**kwargs)
    if not out.is_terminal:
        out.width = 150
    return out
