"""`tiergate bench spec` rejects bad arguments with exit 2 and one line (no model is loaded)."""

from __future__ import annotations

import pytest

from gateway.cli import main


@pytest.mark.parametrize("args, message", [
    (["--per-task", "0"], "--per-task"),
    (["--max-tokens", "1"], "--max-tokens"),
    (["--batch-sizes", "16,x"], "--batch-sizes"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, args, message):
    assert _exit_code(["bench", "spec", "--json", str(tmp_path / "out.json"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def _exit_code(argv: list[str]) -> int:
    """main's return value, or argparse's exit status for a value its converter refused."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code
