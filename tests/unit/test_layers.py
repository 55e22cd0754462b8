"""Imports run one way: down the layers of pecli, never back up.

The packages, bottom (0) to top, in the order data flows through a run
(config -> model and data -> intervention -> run -> metrics -> tables and plots -> files):

    0 runs          options, names, presets, output folders, tables, provenance, processes
    1 data          datasets and item files
    2 models        loading, architecture specs
    3 positions     interventions, masks, sinusoids, rope scaling
    4 measures, plots   the science; figures (independent of each other: .importlinter)
    5 experiments   one run: model + data + intervention -> tidy tables; reproduce; compare
    6 integrations  pecli inside other tools (the lm-eval model `pecli`, `pecli lm-eval`'s run)
    7 cli           the shell

A module may import its own layer or any layer below, never above, at module level or
inside a function. Late binding by name (`importlib.import_module` of a "module:function"
string, as experiments name their figures) is how a module refers to one it must not import.
The same contract is kept by import-linter (.importlinter, `make lint`, and the last test).
names, options (the experiments' too), config, io, tables and plots never
import torch or transformers, directly or through what they import (checked on the AST and at
run time).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pecli

ROOT = Path(pecli.__file__).parent
LAYERS = [
    {"pecli", "runs"},
    {"data"},
    {"models"},
    {"positions", "conditions"},
    {"measures", "plots"},
    {"experiments"},
    {"integrations"},
    {"cli", "__main__"},
]
TORCH_FREE = ("pecli.runs.names", "pecli.runs.fields", "pecli.runs.options", "pecli.experiments.options",
              "pecli.runs.config", "pecli.runs.io", "pecli.runs.tables", "pecli.plots")
HEAVY = ("torch", "transformers")


def module_name(path: Path) -> str:
    parts = ("pecli", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    """The layer of a pecli module, by its first name below `pecli`."""
    top = module.split(".")[1] if "." in module else "pecli"
    found = [i for i, names in enumerate(LAYERS) if top in names]
    assert found, f"{module} has no layer: add it to LAYERS in {__file__}"
    return found[0]


def imports(path: Path, typing_only: bool = True) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth, relative ones resolved;
    `from pecli.x import y` also yields pecli.x.y (y may be a submodule). `typing_only`: with
    those under `if TYPE_CHECKING:` (for annotations; they never run)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set() if typing_only else {
        id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
        and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for statement in block.body for n in ast.walk(statement)}
    found = []
    for node in (n for n in ast.walk(tree) if id(n) not in skipped):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def graph(typing_only: bool = True) -> dict[str, list[tuple[int, str]]]:
    return {module_name(p): imports(p, typing_only) for p in sorted(ROOT.rglob("*.py"))}


def test_every_module_has_a_layer():
    for module in graph():
        layer(module)


def test_no_import_goes_back_up():
    modules = graph()
    back = []
    for module, found in modules.items():
        for line, target in found:
            if target.split(".")[0] != "pecli" or target not in modules:
                continue
            if layer(target) > layer(module):
                back.append(f"{module}:{line} imports {target} "
                            f"(layer {layer(module)} -> {layer(target)})")
    assert not back, "imports going back up:\n" + "\n".join(back)


def test_config_io_tables_plots_never_import_torch():
    modules = graph(typing_only=False)  # an annotation's import never runs
    bad = []
    for start in (m for m in modules if m.startswith(TORCH_FREE)):
        seen, todo = {start}, [(start, start)]
        while todo:  # everything `start` imports, directly or through other pecli modules
            module, chain = todo.pop()
            for _, target in modules[module]:
                if target.split(".")[0] in HEAVY:
                    bad.append(f"{chain} -> {target}")
                elif target in modules and target not in seen:
                    seen.add(target)
                    todo.append((target, f"{chain} -> {target}"))
    assert not bad, "torch/transformers reached from a torch-free module:\n" + "\n".join(bad)


def test_torch_free_modules_load_without_torch():
    plots = [module_name(p) for p in sorted((ROOT / "plots").glob("*.py"))]
    code = ("import sys\n" + "".join(f"import {m}\n" for m in ["pecli.runs.config", "pecli.runs.io",
                                                               "pecli.runs.tables", *plots])
            + "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_walk_sees_imports_inside_functions(tmp_path):
    path = ROOT / "runs" / "tables.py"  # resolved against the real package; only the text is ours
    source = "def f():\n    from pecli.plots.style import color_of\n    from . import io\n"
    tree_imports = [t for _, t in ast_imports_of(source, path)]
    assert "pecli.plots.style" in tree_imports and "pecli.runs.io" in tree_imports


def ast_imports_of(source: str, path: Path) -> list[tuple[int, str]]:
    original = Path.read_text
    try:
        Path.read_text = lambda self, **kw: source if self == path else original(self, **kw)
        return imports(path)
    finally:
        Path.read_text = original


def test_import_linter_keeps_the_contracts():
    """.importlinter's layers and acyclic-siblings contracts, as `make lint` runs them."""
    linter = Path(sys.executable).parent / "lint-imports"
    if not linter.exists():
        import pytest
        pytest.skip("lint-imports is not installed (make setup installs it with the dev extra)")
    out = subprocess.run([str(linter)], capture_output=True, text=True, cwd=ROOT.parent)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
