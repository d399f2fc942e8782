"""No module reads another's private fields: `x._name` is written only where x is `self` or `cls` (or `super()`),
so a class's underscored state can change without breaking code elsewhere (the table's durability hooks once read
thirteen of its private fields). Private names of the standard library and third-party packages count too, unless
listed in ALLOWED with the reason no public way exists. Tests are white-box and exempt.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_import_rules import ROOT, modules

# Folders of code that is not a package module but is read and run like it.
OTHER_CODE = ("bench", "scripts", "examples", "monitoring", "docker")
# namedtuple's public API starts with an underscore.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# (file, expression) -> why there is no public way.
ALLOWED = {
    ("common/arg_parser.py", "parser._actions"): "argparse lists a parser's actions nowhere else",
    ("common/arg_parser.py", "parser._option_string_actions"): "argparse maps option strings nowhere else",
    ("common/settings.py", "argparse._ArgumentGroup"): "argparse's argument group type, for a type hint",
    ("common/env_settings.py", "other._text"): "__eq__ of the same class",
    ("common/process.py", "os._exit"): "the documented way to end a forked child without cleanup",
    ("algorithms/torsos.py", "torch._foreach_lerp_"): "torch's fused in-place lerp has no public name",
    ("bench/sb3_worker.py", "super()._on_step"): "SB3's callback protocol: overriding its hook",
    ("scripts/metrics_doc.py", "registry._collector_to_names"): "prometheus_client lists a registry's "
    "collectors nowhere else",
    ("scripts/metrics_doc.py", "collector._labelnames"): "prometheus_client's metric label names",
    ("scripts/metrics_doc.py", "collector._name"): "prometheus_client's metric name",
}


def code_files() -> list[Path]:
    """The project's code: its modules, and the scripts under OTHER_CODE, less caches and benchmark results (where
    bench/solve_race.py keeps SB3's virtual environment)."""
    files = list(modules().values())
    for folder in OTHER_CODE:
        files += [
            p
            for p in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in p.parts and "results" not in p.relative_to(ROOT).parts
        ]
    return files


def private_reads(path: Path) -> list[tuple[int, str]]:
    """(line, expression) of every `x._name` in the file where x is neither self nor cls."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if node.attr in NAMEDTUPLE_API:
            continue
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_reads_another_ones_private_fields():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {expression}"
        for path in code_files()
        for line, expression in private_reads(path)
        if (str(path.relative_to(ROOT)), expression) not in ALLOWED
    ]
    assert found == [], (
        "private fields read from outside their class (give them a public name):\n" + "\n".join(found)
    )


def test_every_allowance_is_still_needed():
    present = {
        (str(path.relative_to(ROOT)), expression)
        for path in code_files()
        for _, expression in private_reads(path)
    }
    assert sorted(set(ALLOWED) - present) == []


def test_the_checker_finds_a_private_read_and_spares_self(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "class A:\n    def f(self, table):\n        self._x = 1\n        return table._rows, cls._y, p._replace()\n"
    )
    assert private_reads(module) == [(4, "table._rows")]
