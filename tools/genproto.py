"""Generate the Python gRPC code under rpcgen/ from proto/**/*.proto.

`python -m tools.genproto rpcgen` writes it; `--check` generates into a temp
dir and fails if the committed files differ or if rpcgen/ holds generated
files that no .proto produces any more (CI runs that).

The virtual include path `rpcgen=proto` makes the generated modules import
each other as `rpcgen.<dirs>.x_pb2`, so no sys.path tricks are needed: a file
at proto/apache/rocketmq/v2/service.proto becomes the module
rpcgen.apache.rocketmq.v2.service_pb2, and protos import each other by their
virtual path (`import "rpcgen/apache/rocketmq/v2/definition.proto";`).
Google's well-known types (`google/protobuf/*.proto`) resolve from the copy
that grpcio-tools ships, and import as `google.protobuf.x_pb2`.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import sys
import tempfile
from importlib.resources import files

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(ROOT, "proto")
PACKAGE = "rpcgen"
# protoc's own main adds this include path; grpc_tools.protoc.main does not.
WELL_KNOWN_TYPES = str(files("grpc_tools") / "_proto")
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "__init__.py")


def proto_files() -> list[str]:
    """Every .proto under proto/, as the virtual path protoc is given."""
    found = []
    for dirpath, _, names in os.walk(PROTO_DIR):
        for name in names:
            if name.endswith(".proto"):
                rel = os.path.relpath(os.path.join(dirpath, name), PROTO_DIR)
                found.append(f"{PACKAGE}/{rel.replace(os.sep, '/')}")
    return sorted(found)


def generate(out_root: str) -> list[str]:
    """Write rpcgen/ under out_root; return the generated paths relative to it."""
    args = ["protoc", f"-I{PACKAGE}={PROTO_DIR}", f"-I{WELL_KNOWN_TYPES}",
            f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}"]
    if protoc.main(args + proto_files()) != 0:
        raise SystemExit("protoc failed")
    add_package_markers(os.path.join(out_root, PACKAGE))
    return generated_files(out_root)


def add_package_markers(package_dir: str) -> None:
    """protoc writes no __init__.py; every generated directory needs one to import."""
    for dirpath, _, _ in os.walk(package_dir):
        init = os.path.join(dirpath, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()


def generated_files(root: str) -> list[str]:
    """The files under root/rpcgen that this tool owns (ignores caches)."""
    owned = []
    for dirpath, dirnames, names in os.walk(os.path.join(root, PACKAGE)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        owned += [os.path.relpath(os.path.join(dirpath, n), root)
                  for n in names if n.endswith(GENERATED_SUFFIXES)]
    return sorted(owned)


def differences(fresh_root: str) -> tuple[list[str], list[str]]:
    """(files that are new or changed, committed files no proto produces any more)."""
    fresh = generated_files(fresh_root)
    changed = [f for f in fresh
               if not os.path.exists(os.path.join(ROOT, f))
               or not filecmp.cmp(os.path.join(fresh_root, f), os.path.join(ROOT, f), shallow=False)]
    orphaned = sorted(set(generated_files(ROOT)) - set(fresh))
    return changed, orphaned


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", help="the package directory to write (rpcgen)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if args.target.rstrip("/") != PACKAGE:
        sys.exit(f"the generated package must be {PACKAGE}/ (the protos import it by that name)")
    with tempfile.TemporaryDirectory() as tmp:
        files_ = generate(tmp)
        changed, orphaned = differences(tmp)
        if args.check:
            if changed or orphaned:
                sys.exit(f"generated code is stale: changed {changed}, orphaned {orphaned}; run `make proto`")
            print(f"{PACKAGE}/ is up to date ({len(files_)} files)")
            return
        for f in changed:
            os.makedirs(os.path.dirname(os.path.join(ROOT, f)), exist_ok=True)
            with open(os.path.join(tmp, f), "rb") as src, open(os.path.join(ROOT, f), "wb") as dst:
                dst.write(src.read())
        for f in orphaned:
            os.remove(os.path.join(ROOT, f))
        print(f"wrote {len(files_)} files, {len(changed)} changed, {len(orphaned)} removed")


if __name__ == "__main__":
    main()
