"""Generate the Python gRPC code under rpcgen/ from proto/*.proto.

`python -m tools.genproto rpcgen` writes it; `--check` generates into a temp
dir and fails if the committed files differ (CI runs that).
The virtual include path `rpcgen=proto` makes the generated modules import
each other as `rpcgen.x_pb2`, so no sys.path tricks are needed.
"""
from __future__ import annotations

import argparse
import filecmp
import glob
import os
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def generate(out_root: str) -> list[str]:
    protos = sorted(glob.glob(os.path.join(ROOT, "proto", "**", "*.proto"), recursive=True))
    args = ["protoc", f"-Irpcgen={os.path.join(ROOT, 'proto')}",
            f"--python_out={out_root}", f"--pyi_out={out_root}", f"--grpc_python_out={out_root}"]
    rel = ["rpcgen/" + os.path.relpath(p, os.path.join(ROOT, "proto")) for p in protos]
    if protoc.main(args + rel) != 0:
        raise SystemExit("protoc failed")
    generated = []
    for dirpath, _, files in os.walk(os.path.join(out_root, "rpcgen")):
        init = os.path.join(dirpath, "__init__.py")
        if not os.path.exists(init):
            open(init, "w").close()
        generated += [os.path.relpath(os.path.join(dirpath, f), out_root)
                      for f in set(files) | {"__init__.py"}]
    return sorted(generated)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target", help="the package directory to write (rpcgen)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(tmp)
        stale = [f for f in files
                 if not os.path.exists(os.path.join(ROOT, f))
                 or not filecmp.cmp(os.path.join(tmp, f), os.path.join(ROOT, f), shallow=False)]
        if args.check:
            if stale:
                sys.exit(f"generated code is stale: {', '.join(stale)}; run `make proto`")
            print(f"rpcgen/ is up to date ({len(files)} files)")
            return
        for f in files:
            os.makedirs(os.path.dirname(os.path.join(ROOT, f)), exist_ok=True)
            shutil.copyfile(os.path.join(tmp, f), os.path.join(ROOT, f))
        print(f"wrote {len(files)} files, {len(stale)} changed")


if __name__ == "__main__":
    main()
