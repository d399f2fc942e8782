"""Regenerate the Python protobuf/gRPC modules (and their type stubs) from the .proto files.

    python protos/generate.py          # write protos/apexrl/proto/*_pb2*.py{,i}
    python protos/generate.py --check  # exit 1 when the checked-in code differs from a fresh generation

The generated code is checked in so that installing apexrl needs no code generator; CI runs --check so it can
never go stale. Requires the `dev` extra (grpcio-tools, mypy-protobuf).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parent
PACKAGE_DIR = PROTO_ROOT / "apexrl" / "proto"
GENERATED_GLOBS = ("*_pb2.py", "*_pb2.pyi", "*_pb2_grpc.py", "*_pb2_grpc.pyi")


def generate(out_root: Path) -> list[Path]:
    """Run protoc (from grpcio-tools) on every .proto; return the generated files, relative to out_root."""
    from grpc_tools import protoc  # imported here: only this script needs grpcio-tools

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in PACKAGE_DIR.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    bin_dir = Path(sys.executable).parent  # mypy-protobuf installs its protoc plugins beside the interpreter
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    out_pkg = out_root / "apexrl" / "proto"
    return sorted(p.relative_to(out_pkg) for g in GENERATED_GLOBS for p in out_pkg.glob(g))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 when stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        fresh_pkg = Path(tmp) / "apexrl" / "proto"
        current = sorted(p.relative_to(PACKAGE_DIR) for g in GENERATED_GLOBS for p in PACKAGE_DIR.glob(g))
        if args.check:
            stale = [
                str(p)
                for p in fresh
                if not (PACKAGE_DIR / p).exists()
                or not filecmp.cmp(fresh_pkg / p, PACKAGE_DIR / p, shallow=False)
            ]
            stale += [str(p) for p in current if p not in fresh]
            if stale:
                print(
                    "generated protobuf code is stale; run: python protos/generate.py\n  "
                    + "\n  ".join(stale)
                )
                return 1
            print(f"generated protobuf code is up to date ({len(fresh)} files)")
            return 0
        for p in current:
            (PACKAGE_DIR / p).unlink()
        for p in fresh:
            shutil.copyfile(fresh_pkg / p, PACKAGE_DIR / p)
        print(f"wrote {len(fresh)} files to {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
