"""Read the repository's Dockerfile and .dockerignore the way a builder does, enough to check the recipe without a
container engine: stages and their parents, instructions (continuation lines joined, comments dropped), the
effective USER / ENTRYPOINT / labels of a target, and the build context the COPY lines see.

`build_context` copies exactly what the Dockerfile's COPY lines take (less what .dockerignore excludes) into a
folder: tests/integration/deploy/test_image_recipe.py installs from that folder with docker/install.sh, as the
image's build stages do.
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the (joined) line
    line: int

    def flags_and_words(self) -> tuple[dict[str, str], list[str]]:
        """`COPY --from=x a b` -> ({"from": "x"}, ["a", "b"]); JSON (exec) form is read as JSON."""
        words = json.loads(self.args) if self.args.startswith("[") else shlex.split(self.args)
        flags = {}
        while words and words[0].startswith("--"):
            name, _, value = words.pop(0)[2:].partition("=")
            flags[name] = value
        return flags, words


@dataclass
class Stage:
    name: str | None
    base: str
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        found = [s for s in self.stages if s.name == name]
        if len(found) != 1:
            raise KeyError(f"Dockerfile has {len(found)} stages named {name!r}")
        return found[0]

    def chain(self, name: str) -> list[Stage]:
        """The stage and its ancestors (through `FROM <stage>`), root first."""
        chain = [self.stage(name)]
        names = {s.name for s in self.stages}
        while chain[0].base in names:
            chain.insert(0, self.stage(chain[0].base))
        return chain

    def effective(self, name: str, keyword: str) -> Instruction | None:
        """The instruction of this kind that is in force in stage `name` (the last one along its chain)."""
        found = [i for s in self.chain(name) for i in s.all(keyword)]
        return found[-1] if found else None

    def labels(self, name: str) -> dict[str, str]:
        labels: dict[str, str] = {}
        for s in self.chain(name):
            for i in s.all("LABEL"):
                for word in shlex.split(i.args):
                    key, _, value = word.partition("=")
                    labels[key] = value
        return labels

    def args(self, name: str) -> dict[str, str | None]:
        """ARG defaults declared along the chain (None: declared without a default)."""
        result: dict[str, str | None] = {}
        for s in self.chain(name):
            for i in s.all("ARG"):
                key, eq, value = i.args.partition("=")
                result[key.strip()] = value.strip().strip('"') if eq else None
        return result

    def copies(self) -> list[tuple[Stage, Instruction, dict[str, str], list[str], str]]:
        """(stage, instruction, flags, sources, destination) of every COPY/ADD."""
        result = []
        for s in self.stages:
            for i in s.instructions:
                if i.keyword in ("COPY", "ADD"):
                    flags, words = i.flags_and_words()
                    result.append((s, i, flags, words[:-1], words[-1]))
        return result


def parse(path: Path = DOCKERFILE) -> Dockerfile:
    """Instructions with continuation lines joined and comment lines dropped (as BuildKit reads them)."""
    lines = path.read_text().splitlines()
    instructions: list[Instruction] = []
    buffer, start = "", 0
    for number, raw in enumerate(lines, 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buffer):
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1].rstrip() + " "
            continue
        buffer += stripped
        keyword, _, rest = buffer.partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip(), start))
        buffer = ""
    if buffer:
        raise ValueError(f"{path}: the last instruction ends with a line continuation")
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for i in instructions:
        if i.keyword == "FROM":
            words = i.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name, words[0]))
        elif not stages:
            if i.keyword != "ARG":
                raise ValueError(f"{path}:{i.line}: only ARG may come before the first FROM, not {i.keyword}")
            key, _, value = i.args.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append(i)
    return Dockerfile(global_args, stages)


def ignore_patterns(path: Path = DOCKERIGNORE) -> list[str]:
    patterns = [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    if any(p.startswith("!") for p in patterns):
        raise ValueError(
            ".dockerignore exceptions (!) are not understood by these tests; keep it a plain list"
        )
    return patterns


def ignored(relative: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps `relative` (a path in the context, with /) out of the build context: a pattern
    excludes a matching path and everything under it; `**/` matches any number of folders."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    for pattern in patterns:
        pattern = pattern.strip("/")
        bare = pattern[3:] if pattern.startswith("**/") else None
        for prefix in prefixes:
            if fnmatch.fnmatchcase(prefix, pattern):
                return True
            if bare is not None and fnmatch.fnmatchcase(prefix.rsplit("/", 1)[-1], bare):
                return True
    return False


def build_context(destination: Path, repo: Path = REPO) -> list[str]:
    """Copy what the COPY lines (those reading the context, not another stage) take into `destination`, skipping
    what .dockerignore excludes; return the COPY'd sources. A source that does not exist raises FileNotFoundError."""
    patterns = ignore_patterns(repo / ".dockerignore")
    recipe = parse(repo / "Dockerfile")
    sources = []
    for _stage, _instruction, flags, srcs, _dest in recipe.copies():
        if "from" in flags:
            continue
        for src in srcs:
            sources.append(src)
            origin = repo / src
            if not origin.exists():
                raise FileNotFoundError(f"Dockerfile COPYs {src}, which does not exist")
            files = [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
            for file in files:
                relative = file.relative_to(repo).as_posix()
                if ignored(relative, patterns):
                    continue
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
    return sources


def image_uid(name: str = "train") -> int:
    """The numeric user the image target runs as (USER uid[:gid])."""
    user = parse().effective(name, "USER")
    if user is None:
        raise ValueError(f"Dockerfile target {name} sets no USER")
    return int(user.args.split(":")[0])
