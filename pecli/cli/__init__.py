"""The shell: the Typer app (app.py), the flags every command shares (flags.py), what commands
share (shared.py: the console and the one writer of results), and one module per command or
command group, each with `register(app)`.

The top layer: it may import any package of pecli. Nothing below imports it.
"""
