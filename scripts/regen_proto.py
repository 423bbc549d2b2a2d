"""Regenerate tinker_sync/_wire/tinker_public_pb2.py (+ .pyi) from tinker_public.proto.

Usage: python scripts/regen_proto.py        (needs `pip install grpcio-tools`)

The generated module is checked in so that installing tinker_sync never needs protoc.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WIRE = Path(__file__).resolve().parent.parent / "tinker_sync" / "_wire"


def main() -> int:
    cmd = [
        sys.executable, "-m", "grpc_tools.protoc", f"-I{WIRE}",
        f"--python_out={WIRE}", f"--pyi_out={WIRE}", str(WIRE / "tinker_public.proto"),
    ]
    subprocess.check_call(cmd)
    # The official `tinker` SDK registers a file of the same name and package in protobuf's
    # default pool; ours lives in a private pool so that both can be imported in one process
    # (the conformance tests do exactly that). The wire format is unaffected.
    module = WIRE / "tinker_public_pb2.py"
    text = module.read_text()
    default = "_descriptor_pool.Default().AddSerializedFile("
    assert default in text, "unexpected protoc output"
    text = text.replace(
        default,
        "_descriptor_pool.DescriptorPool().AddSerializedFile(",
    )
    module.write_text(text)
    print(f"regenerated {WIRE / 'tinker_public_pb2.py'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
