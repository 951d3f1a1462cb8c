"""Generates holdfast/v1/locks_pb2*.py from the repository's proto/ (run after changing the proto).

Usage: python generate_proto.py [OUT_DIR]   (default: this directory, i.e. the checked-in package)

Needs grpcio-tools 1.62.3 (the `test` extra): tests/test_generated.py regenerates with this same function
and fails if the checked-in modules differ.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"
PROTO_FILE = PROTO_ROOT / "holdfast" / "v1" / "locks.proto"
# The generated files, relative to the output directory.
GENERATED = ("holdfast/v1/locks_pb2.py", "holdfast/v1/locks_pb2.pyi", "holdfast/v1/locks_pb2_grpc.py")


def generate(out_dir: Path) -> None:
    """Runs protoc (from grpcio-tools) on locks.proto, writing the modules under `out_dir/holdfast/v1/`."""
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
