"""Regenerate tinker_sync/_wire/tinker_public_pb2.py (+ .pyi) from tinker_public.proto.

Usage::

    python scripts/regen_proto.py            # rewrite the checked-in modules
    python scripts/regen_proto.py --check    # exit 1 if they are stale (CI)

Needs ``pip install grpcio-tools``. The generated module is checked in so that installing
tinker_sync never needs protoc; the runtime codec (``_wire/_proto.py``) does not import it at
all, only the tests do (to parse our bytes with a real protobuf implementation).
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import tempfile
from pathlib import Path

WIRE = Path(__file__).resolve().parent.parent / "tinker_sync" / "_wire"
PROTO = WIRE / "tinker_public.proto"
_DEFAULT_POOL = "_descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "_descriptor_pool.DescriptorPool().AddSerializedFile("


def _generate(out_dir: Path) -> dict[str, str]:
    """Run protoc into ``out_dir``; return {file name: text} with the pool patched."""
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{WIRE}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO),
    ]
    subprocess.check_call(cmd)
    files = {p.name: p.read_text() for p in out_dir.glob("tinker_public_pb2.py*")}
    # The official `tinker` SDK registers a file of the same name and package in protobuf's
    # default pool; ours lives in a private pool so that both can be imported in one process
    # (the conformance tests do exactly that). The wire format is unaffected.
    module = files["tinker_public_pb2.py"]
    if _DEFAULT_POOL not in module:
        raise SystemExit("unexpected protoc output: no default-pool registration found")
    files["tinker_public_pb2.py"] = module.replace(_DEFAULT_POOL, _PRIVATE_POOL)
    return files


def _descriptor_bytes(module_text: str) -> bytes:
    """The serialized FileDescriptorProto embedded in a generated module."""
    start = module_text.index(_PRIVATE_POOL) + len(_PRIVATE_POOL)
    end = module_text.index("')\n", start) + 1
    value = ast.literal_eval(module_text[start:end])
    assert isinstance(value, bytes)
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the checked-in module instead"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        files = _generate(Path(tmp))
    if args.check:
        current = (WIRE / "tinker_public_pb2.py").read_text()
        fresh = files["tinker_public_pb2.py"]
        if _descriptor_bytes(current) != _descriptor_bytes(fresh):
            print("tinker_public_pb2.py is stale: run python scripts/regen_proto.py")
            return 1
        print("tinker_public_pb2.py matches tinker_public.proto")
        return 0
    for name, text in files.items():
        (WIRE / name).write_text(text)
        print(f"regenerated {WIRE / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
