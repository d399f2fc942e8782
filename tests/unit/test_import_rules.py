"""The module map's import rules (docs/architecture.md §10 points here), enforced by parsing the imports of every
module.

Roles stand side by side on the SDK: clients live beside their services, the learner and the actor never import
each other, only the wire edge (the replay shard's server, client and wire floors, the parameter service's clients,
servicers and wire module, the codec and common's gRPC helpers) touches gRPC or generated code, the replay shard is
built in floors, one folder each (REPLAY_FLOORS: a new file inherits its folder's floor), the replay shard never
imports torch, the launcher starts processes without loading models, and no two modules import each other, even
lazily. A violation names the module, the line and the rule, so the structure cannot silently decay.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Repository folder -> package (pyproject.toml's package-dir).
PACKAGES = {
    "apexrl": "apexrl",
    "common": "apexrl.common",
    "replay_server": "apexrl.replay_server",
    "replay_server/core": "apexrl.replay_server.core",
    "replay_server/durability": "apexrl.replay_server.durability",
    "replay_server/server": "apexrl.replay_server.server",
    "replay_server/client": "apexrl.replay_server.client",
    "parameter_server": "apexrl.parameter_server",
    "actor": "apexrl.actor",
    "learner": "apexrl.learner",
    "launcher": "apexrl.launcher",
    "algorithms": "apexrl.algorithms",
    "algorithms/dqn": "apexrl.algorithms.dqn",
    "algorithms/dpg": "apexrl.algorithms.dpg",
    "algorithms/r2d2": "apexrl.algorithms.r2d2",
}
# The replay shard's floors, one folder each: a module's floor is its folder, so a new file inherits the floor and
# its rules. A floor may import its own modules and those of the floors listed for it, nothing else of the shard.
# The package's root folder ("wire") holds wire.py, the encodings both sides share, and the lazy public names.
REPLAY_FLOORS = {
    "core": (),  # the pure data structures and the table
    "durability": ("core",),  # snapshots, checkpoints, the write-ahead log: the table's public interface only
    "wire": ("core",),  # the root: wire.py
    "server": ("core", "durability", "wire"),  # the servicer and its edge, the shard's settings and main
    "client": ("core", "wire"),  # the SDK: ReplayClient, its streams, ShardedWriter
}
REPLAY_PACKAGE = "apexrl.replay_server"
# Floors that never load grpc or protobuf (checked in a fresh interpreter); the others are the shard's wire edge.
GRPC_FREE_FLOORS = ("core", "durability")
# The only modules outside the replay shard's edge floors that may import grpc (and grpc_health / grpc_reflection)
# or the generated apexrl.proto code.
WIRE_EDGE = {
    "apexrl.common.codec",
    "apexrl.common.aio_grpc",
    "apexrl.common.grpc_util",
    "apexrl.common.tls_reload",
    "apexrl.parameter_server.client",
    "apexrl.parameter_server.service",
    "apexrl.parameter_server.wire",
}
GRPC = ("grpc", "grpc_health", "grpc_reflection", "apexrl.proto")
MODEL_LIBRARIES = (
    "torch",
    "apexrl.learner.learner",
    "apexrl.algorithms.checkpoint",
    "apexrl.learner.evaluate",
    "apexrl.learner.policy",
    "apexrl.learner.export",
    "apexrl.algorithms.torsos",
    "apexrl.algorithms.torch_forward",
)
# The learner's half of every algorithm (torch networks, losses, updates): never in an actor's process.
LEARNING_SIDE = (
    "apexrl.algorithms.torsos",
    "apexrl.algorithms.dqn.learning",
    "apexrl.algorithms.dqn.networks",
    "apexrl.algorithms.dqn.losses",
    "apexrl.algorithms.dpg.learning",
    "apexrl.algorithms.dpg.networks",
    "apexrl.algorithms.dpg.losses",
    "apexrl.algorithms.r2d2.learning",
    "apexrl.algorithms.r2d2.losses",
    "apexrl.algorithms.r2d2.networks",
)
# Modules an actor of vector environments loads: no torch at import (convolutional policies import it lazily).
TORCH_FREE_ACTING = (
    "apexrl.algorithms",
    "apexrl.algorithms.nstep",
    "apexrl.algorithms.registry",
    "apexrl.algorithms.base",
    "apexrl.algorithms.torso_specs",
    "apexrl.algorithms.forward",
    "apexrl.algorithms.dqn",
    "apexrl.algorithms.dqn.acting",
    "apexrl.algorithms.dqn.exploration",
    "apexrl.algorithms.dqn.policy_base",
    "apexrl.algorithms.dpg",
    "apexrl.algorithms.dpg.acting",
    "apexrl.algorithms.dpg.exploration",
    "apexrl.algorithms.dpg.policy_base",
    "apexrl.algorithms.r2d2",
    "apexrl.algorithms.r2d2.acting",
    "apexrl.algorithms.r2d2.rescaling",
    "apexrl.algorithms.r2d2.writing",
)
# Import cycles between apexrl modules that are allowed for now, each with its reason; every other cycle fails
# test_no_import_cycles_between_apexrl_modules, lazy imports (inside functions, under TYPE_CHECKING) included.
ALLOWED_CYCLES: set[frozenset[str]] = set()  # none: a cycle that must stay is listed here with its reason


def modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found[name] = path
    return found


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported module) for every import in the file, inside functions too (lazy imports count)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    result = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            result += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            result.append((node.lineno, node.module))
            # `from apexrl.x import y` may name a submodule y.
            result += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return result


def under(name: str, prefixes: tuple[str, ...] | str) -> bool:
    prefixes = (prefixes,) if isinstance(prefixes, str) else prefixes
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rule) -> list[str]:
    found = []
    for module, path in modules().items():
        for line, target in imports(path):
            why = rule(module, target)
            if why:
                found.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target}: {why}")
    return sorted(set(found))


def test_the_tree_is_what_the_rules_describe():
    folders = {str(p.parent.relative_to(ROOT)) for f in PACKAGES for p in (ROOT / f).glob("*/__init__.py")}
    assert folders <= set(PACKAGES), f"packages the rules do not read: {sorted(folders - set(PACKAGES))}"
    # An installed (non-editable) apexrl carries exactly pyproject.toml's packages: a package missing there is
    # missing from every image and wheel (r2d2 once was: the images' build failed on its import).
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert set(PACKAGES.values()) <= listed, (
        f"not in pyproject.toml's packages: {sorted(set(PACKAGES.values()) - listed)}"
    )
    names = set(modules())
    assert names >= WIRE_EDGE, f"wire-edge modules missing: {sorted(WIRE_EDGE - names)}"
    replay_folders = {p.name for p in (ROOT / "replay_server").iterdir() if (p / "__init__.py").exists()}
    assert replay_folders == set(REPLAY_FLOORS) - {"wire"}, "every folder of replay_server/ is a floor"
    assert {"apexrl.replay_server.client.replay_client", "apexrl.parameter_server.client"} <= names
    assert len(names) > 40


def test_learner_and_actor_are_siblings():
    def rule(module: str, target: str) -> str | None:
        if under(module, "apexrl.learner") and under(target, "apexrl.actor"):
            return "the learner may not import the actor (share through common/ or the SDK)"
        if under(module, "apexrl.actor") and under(target, "apexrl.learner"):
            return "the actor may not import the learner"
        return None

    assert violations(rule) == []


def test_the_algorithms_sit_below_the_roles_and_their_acting_half_never_loads_the_learning_half():
    """docs/architecture.md: actor and learner are sibling roles on one seam, `apexrl.algorithms`; an actor process
    reaches only the acting half of an algorithm, and the wiring (learner loop, actor loop, launcher) never names
    an algorithm's modules: it goes through the registry."""

    def rule(module: str, target: str) -> str | None:
        if under(module, "apexrl.algorithms") and under(
            target,
            (
                "apexrl.actor",
                "apexrl.learner",
                "apexrl.launcher",
                "apexrl.replay_server",
                "apexrl.parameter_server",
            ),
        ):
            return "algorithms sit below the roles and the services"
        if under(module, "apexrl.actor") and under(target, LEARNING_SIDE):
            return "the actor process never loads an algorithm's learning half"
        if (
            module not in LEARNING_SIDE
            and not module.endswith(".learning")
            and under(module, "apexrl.algorithms")
            and under(target, LEARNING_SIDE)
        ):
            return "an algorithm's acting half never imports its learning half"
        if under(module, ("apexrl.actor", "apexrl.learner", "apexrl.launcher")) and under(
            target, ("apexrl.algorithms.dqn", "apexrl.algorithms.dpg", "apexrl.algorithms.r2d2")
        ):
            return "the wiring reaches an algorithm through apexrl.algorithms.registry, never by name"
        return None

    assert violations(rule) == []


def test_the_acting_modules_import_torch_only_inside_functions():
    """A top-level torch import in these modules would load torch into every actor of a vector environment."""
    found = []
    for module in TORCH_FREE_ACTING:
        path = modules()[module]
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                for name in names
                if under(name, ("torch", "apexrl.algorithms.torch_forward", "apexrl.algorithms.torsos"))
            ]
    assert found == []


def test_services_and_common_do_not_import_the_roles_above_them():
    roles = ("apexrl.actor", "apexrl.learner", "apexrl.launcher", "apexrl.algorithms")

    def rule(module: str, target: str) -> str | None:
        if under(module, ("apexrl.common", "apexrl.replay_server", "apexrl.parameter_server")) and under(
            target, roles
        ):
            return "services and common/ sit below the roles"
        if under(module, "apexrl.common") and under(
            target, ("apexrl.replay_server", "apexrl.parameter_server")
        ):
            return "common/ holds what several roles share and imports no service"
        return None

    assert violations(rule) == []


def test_no_client_imports_a_servicer():
    """The replay client floor is held to this by REPLAY_FLOORS; the parameter client here."""

    def rule(module: str, target: str) -> str | None:
        if module == "apexrl.parameter_server.client" and target.endswith(".service"):
            return "a client shares wire helpers (wire.py) with its servicer, never the servicer itself"
        return None

    assert violations(rule) == []


def replay_floor(module: str) -> str | None:
    """The floor of a replay shard module (its folder; "wire" for the package's root), or None outside the shard."""
    if not under(module, REPLAY_PACKAGE):
        return None
    folder = module[len(REPLAY_PACKAGE) + 1 :].split(".")[0] if module != REPLAY_PACKAGE else ""
    return folder if folder in REPLAY_FLOORS else "wire"


def in_wire_edge(module: str) -> bool:
    floor = replay_floor(module)
    return module in WIRE_EDGE or (floor is not None and floor not in GRPC_FREE_FLOORS)


def test_every_replay_module_has_its_folder_as_its_floor():
    floors = {module: replay_floor(module) for module in modules() if under(module, REPLAY_PACKAGE)}
    assert len(floors) > 30 and set(floors.values()) == set(REPLAY_FLOORS)
    assert replay_floor("apexrl.replay_server.core.anything_new") == "core"
    assert replay_floor("apexrl.replay_server.wire") == replay_floor("apexrl.replay_server") == "wire"


def replay_floor_lines() -> list[str]:
    """docs/architecture.md's list of the replay floors, as REPLAY_FLOORS says it."""
    return [
        f"- `replay_server/{'' if floor == 'wire' else floor + '/'}`{' (wire.py)' if floor == 'wire' else ''}: "
        + (", ".join(below) or "no other floor")
        for floor, below in REPLAY_FLOORS.items()
    ]


def test_the_architecture_document_draws_the_floors_from_the_rule():
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("<!-- replay floors:")[1].split("<!-- end of replay floors -->")[0]
    assert block.splitlines()[1:] == replay_floor_lines(), (
        "update docs/architecture.md §10 from REPLAY_FLOORS"
    )


def test_each_replay_floor_imports_only_the_floors_below_it():
    def rule(module: str, target: str) -> str | None:
        floor, reached = replay_floor(module), replay_floor(target)
        if floor is None or reached is None or REPLAY_PACKAGE in (module, target) or reached == floor:
            return None  # the package's __init__ is its public face: it names every floor's public types
        if reached not in REPLAY_FLOORS[floor]:
            allowed = ", ".join(REPLAY_FLOORS[floor]) or "no other floor"
            return f"replay_server's {floor} floor may import {allowed} (REPLAY_FLOORS)"
        return None

    assert violations(rule) == []


def test_only_the_wire_edge_touches_grpc_and_generated_code():
    def rule(module: str, target: str) -> str | None:
        if not in_wire_edge(module) and under(target, GRPC):
            return "only clients, servicers, wire modules, the codec and common's gRPC helpers may"
        return None

    assert violations(rule) == []


def test_the_replay_shard_and_the_sdk_never_import_torch_or_gymnasium():
    torch_free = ("apexrl.common", "apexrl.replay_server", "apexrl.parameter_server")
    allowed = {
        "apexrl.common.environments",
        "apexrl.common.env_adapters",
    }  # gymnasium: actor and learner only

    def rule(module: str, target: str) -> str | None:
        if under(module, torch_free) and module not in allowed and under(target, ("torch", "gymnasium")):
            return "the shard image and the SDK carry no torch or gymnasium"
        return None

    assert violations(rule) == []


def test_the_launcher_starts_processes_and_loads_no_model():
    def rule(module: str, target: str) -> str | None:
        if under(module, "apexrl.launcher") and under(target, MODEL_LIBRARIES):
            return "the launcher starts processes; models load in the roles"
        return None

    assert violations(rule) == []


def import_graph() -> dict[str, dict[str, str]]:
    """module -> {apexrl module it imports: "file:line" of the first such import}, lazy imports included. A
    module's imports of the packages it sits in are left out: Python runs a package's __init__ before any module
    in it, so `from apexrl.replay_server import wire` inside the package is a dependency on wire.py alone."""
    names = modules()
    graph: dict[str, dict[str, str]] = {}
    for module, path in names.items():
        edges = graph.setdefault(module, {})
        for line, target in imports(path):
            if target in names and target != module and not module.startswith(target + "."):
                edges.setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[frozenset[str]]:
    """The groups of modules that import each other, directly or round a loop (strongly connected components of
    more than one module; Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, {}):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_between_apexrl_modules():
    """Two modules that import each other, even one of them inside a function, can be read, tested and moved only
    together: share the piece both need from a third module, or invert the dependency. ALLOWED_CYCLES lists the
    exceptions, and an exception whose cycle is gone must leave the list."""
    graph = import_graph()
    found = cycles(graph)

    def described(group: frozenset[str]) -> str:
        edges = [
            f"{graph[a][b]}: {a} imports {b}" for a in sorted(group) for b in sorted(graph[a]) if b in group
        ]
        return "; ".join(edges)

    assert [described(group) for group in found if group not in ALLOWED_CYCLES] == []
    gone = [sorted(group) for group in ALLOWED_CYCLES - set(found)]
    assert gone == [], f"allowed cycles that no longer exist (remove them from ALLOWED_CYCLES): {gone}"


def test_the_cycle_finder_finds_a_loop_through_three_modules_and_nothing_else():
    graph = {"a": {"b": "a.py:3"}, "b": {"c": "b.py:9"}, "c": {"a": "c.py:12"}, "d": {"a": "d.py:1"}}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b": "a.py:3"}, "b": {}}) == []


def test_a_rule_violation_is_caught(tmp_path):
    """The checker itself: a module that imports grpc outside the edge is reported with its line."""
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy\n\ndef f():\n    import grpc\n")
    assert (4, "grpc") in imports(bad)


@pytest.mark.parametrize(
    "module",
    [
        "apexrl",
        "apexrl.replay_server.server.main",
        "apexrl.replay_server.server.service",
        "apexrl.parameter_server.main",
        "apexrl.actor",
        "apexrl.learner",
        "apexrl.launcher.cli",
        "apexrl.algorithms.registry",
        "apexrl.algorithms.dqn.acting",
        "apexrl.algorithms.dpg.acting",
    ],
)
def test_importing_the_shard_sdk_and_cli_loads_no_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules, 'gymnasium' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], f"{module} pulled in torch or gymnasium: {out.stdout}"


# Modules a shard, a tool or a test may import without the gRPC runtime, beside the replay shard's grpc-free floors:
# they raise apexrl errors, which the edge maps to gRPC status codes (common/aio_grpc.py).
PURE_CORES = [
    "apexrl.common.errors",
    "apexrl.parameter_server.weights",
    "apexrl.parameter_server.store",
    "apexrl.parameter_server.limits",
]


# The parameter service's cores (the weights format and version rules, the store, the limits) and its edge.
PARAMS_CORES = (
    "apexrl.parameter_server.weights",
    "apexrl.parameter_server.store",
    "apexrl.parameter_server.limits",
)
PARAMS_EDGE = tuple(
    f"apexrl.parameter_server.{name}" for name in ("wire", "service", "client", "config", "main")
)
STORE_NAMES = ("WeightStore", "Snapshot")  # what parameter_server/store.py defines


def test_the_parameter_cores_never_import_the_edge_and_the_format_comes_from_weights():
    """The weights format lives in parameter_server/weights.py: the store, the client, the wire module and the
    learner import it from there, and no core reaches protobuf through the codec or the wire module."""

    def rule(module: str, target: str) -> str | None:
        if module in PARAMS_CORES and under(target, (*PARAMS_EDGE, "apexrl.common.codec")):
            return "the weights, the store and the limits sit below the edge and the codec"
        store, _, name = target.rpartition(".")
        if store == "apexrl.parameter_server.store" and name not in STORE_NAMES:
            return "the weights format and the version rules come from weights.py"
        return None

    assert violations(rule) == []


GRPC_LOADED = "sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google') or m == 'apexrl.proto')"


@pytest.mark.parametrize("module", PURE_CORES)
def test_importing_a_pure_core_loads_neither_grpc_nor_protobuf(module):
    code = f"import sys, {module}\nprint({GRPC_LOADED})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", f"{module} pulled in: {out.stdout}"


@pytest.mark.parametrize("floor", GRPC_FREE_FLOORS)
def test_importing_any_module_of_a_grpc_free_replay_floor_loads_neither_grpc_nor_protobuf(floor):
    """Every module of the floor, one after another in one fresh interpreter: the first that loads grpc or protobuf
    is named."""
    members = sorted(m for m in modules() if replay_floor(m) == floor)
    code = (
        "import importlib, sys\n"
        f"for name in {members!r}:\n"
        "    importlib.import_module(name)\n"
        f"    if {GRPC_LOADED}:\n"
        f"        print(name, {GRPC_LOADED})\n"
        "        break\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert len(members) > 5 and out.stdout.strip() == "", f"{floor} floor: {out.stdout}"


def test_only_the_compression_module_imports_the_codecs_and_the_shard_never_loads_them():
    """A replay shard stores frames as they came: zstandard and lz4 are imported by common/compression.py alone,
    inside the functions that compress or decompress, and a shard that served compressed rows never loaded them."""

    def rule(module: str, target: str) -> str | None:
        if under(target, ("zstandard", "lz4")) and module != "apexrl.common.compression":
            return "only common/compression.py imports the codecs"
        return None

    assert violations(rule) == []
    code = (
        "import sys, numpy as np\n"
        "from apexrl.common import codec\n"
        "from apexrl.replay_server.core.table import ReplayTable, TableConfig\n"
        "from apexrl.common.compression import CompressedColumn\n"
        "frames = CompressedColumn('zstd', np.dtype('uint8'), (4,), b'\\x28\\xb5\\x2f\\xfd' * 2, np.array([4, 4]))\n"
        "t = ReplayTable(TableConfig(capacity=10))\n"
        "t.insert({'obs': codec.decode_tensor(codec.encode_tensor(frames)), 'a': np.zeros(2)})\n"
        "t.sample(2)\n"
        "print('zstandard' in sys.modules, 'lz4' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
