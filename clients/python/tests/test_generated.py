"""The checked-in generated modules are what the proto generates: they cannot drift from it."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from generate_proto import GENERATED, generate  # noqa: E402


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    generate(tmp_path)
    for relative in GENERATED:
        fresh = (tmp_path / relative).read_text()
        checked_in = (HERE.parent / relative).read_text()
        assert fresh == checked_in, f"{relative} differs from the proto: run `python generate_proto.py`"
