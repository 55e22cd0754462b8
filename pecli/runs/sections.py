"""Sections of a page that `make docs` writes between two marker comments (README's table of
commands, docs/positions.md's table of families); tests/cli/test_docs.py checks they are current."""

from __future__ import annotations


def with_section(page: str, start: str, end: str, text: str,
                 error: type[Exception] = ValueError) -> str:
    """`page` with what lies between the markers `start` and `end` replaced by `text` (ending
    in a newline); `error` when the page lacks either marker."""
    head, found_start, rest = page.partition(start)
    _, found_end, tail = rest.partition(end)
    if not found_start or not found_end:
        raise error(f"the page has no {start} ... {end} section")
    return f"{head}{start}\n{text}{end}{tail}"
