"""No function over 60 lines without a reason written beside it (issue 29 item 3): every function and method of the
production packages is measured (from its `def` line to its last line, decorators excluded), and one longer than
MAX_LINES must be in ALLOWED with the reason that length is right. The list only shrinks: an allowance for a
function that is gone or now short enough fails too, so it is removed with the split that earned it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit.test_import_rules import ROOT, modules

MAX_LINES = 60
# "file.py::Class.method" (the path from the repository root, then the enclosing classes and functions) -> why that
# length is right.
ALLOWED = {
    "learner/learner_metrics.py::LearnerMetrics.__init__": "a flat table of Prometheus metric declarations, one "
    "statement each: the learner's metrics read (and are documented) in one place",
    "replay_server/durability/durability_metrics.py::DurabilityCollector.collect": "two flat tables of "
    "(name, help, value), one entry per durability counter and gauge: the help texts make it long, not logic",
    "actor/apex_actor.py::ApeXActor.__init__": "the constructor: every attribute of the actor is set here, in the "
    "order they depend on each other (environments, algorithm and defaults, explorer, clients, counters), so the "
    "actor's state reads in one place",
    "actor/apex_actor.py::ApeXActor._evaluate": "one loop over evaluation rounds: pacing, playing the round and "
    "offering it to the kept policy share the round's state (returns, lengths, playing, finished, limit), which "
    "separate methods would pass back and forth",
    "learner/learner.py::Learner.run": "the training loop and the finally that always ends it (final checkpoint, "
    "prefetcher stop, priority flush) share the prefetcher and must stay in one try; the rest is its metric "
    "hookup and one progress log call",
    "learner/evaluate.py::run": "`apexrl evaluate` top to bottom: load, build and check the environment, play, "
    "summarise; every refusal closes the environment it holds, and the play loop's finally closes it for the rest",
    "replay_server/durability/reshard.py::_reshard": "one reshard in order (check the sources, plan the targets, "
    "deal the rows, drop the old files); dealing must sit inside the try whose finally closes every target's "
    "writer, and the plan's values (n, chunk_rows, outs) feed each later step",
    "replay_server/core/table.py::ReplayTable.insert": "one insert's critical section: resend check, admission, "
    "the listeners' journal and the store happen under one lock with one failure path (the broken flag), which a "
    "split would spread over methods that each assume the lock",
}


def long_functions(tree: ast.AST, min_lines: int = MAX_LINES + 1) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function in `tree` at least `min_lines` long, nested ones included."""

    def walk(node: ast.AST, prefix: tuple[str, ...]) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = (*prefix, child.name)
                lines = child.end_lineno - child.lineno + 1  # lineno is the `def` line: decorators excluded
                if lines >= min_lines:
                    yield ".".join(name), lines
                yield from walk(child, name)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, (*prefix, child.name))
            else:
                yield from walk(child, prefix)

    yield from walk(tree, ())


def measured(path: Path) -> dict[str, int]:
    """The qualified name ("file.py::Class.method") -> lines of every function over MAX_LINES in the module at `path`."""
    where = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), filename=str(path))
    return {f"{where}::{name}": lines for name, lines in long_functions(tree)}


def all_long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for path in modules().values():
        found.update(measured(path))
    return found


def test_no_function_is_over_60_lines_without_a_reason():
    unexplained = {name: lines for name, lines in all_long_functions().items() if name not in ALLOWED}
    assert not unexplained, (
        f"functions over {MAX_LINES} lines: split them by phase, or add each to ALLOWED with the reason its length "
        f"is right: " + ", ".join(f"{name} ({lines} lines)" for name, lines in sorted(unexplained.items()))
    )


def test_every_allowance_still_names_a_long_function():
    found = all_long_functions()
    stale = sorted(name for name in ALLOWED if name not in found)
    assert not stale, (
        f"ALLOWED names functions that are gone or now {MAX_LINES} lines or fewer; remove them: "
        + ", ".join(stale)
    )
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_counts_from_the_def_line(tmp_path):
    def function(name: str, lines: int, indent: str = "") -> str:
        body = "".join(f"{indent}    x = {i}\n" for i in range(lines - 1))
        return f"{indent}@decorator\n{indent}def {name}():\n{body}"

    source = (
        function("sixty_one", 61)
        + function("sixty", 60)
        + "class Outer:\n"
        + function("method", 61, "    ")
        + function("short_method", 60, "    ")
    )
    path = tmp_path / "module.py"
    path.write_text(source)
    assert dict(long_functions(ast.parse(path.read_text()))) == {"sixty_one": 61, "Outer.method": 61}
