from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from rank_dataset.cli import cli


def test_index_command(write_meta, tmp_path: Path) -> None:
    a, b = write_meta(n=10), write_meta(["x", "", "y"])
    result = CliRunner().invoke(cli, ["index", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"10\t{a}", f"2\t{b}", "12\ttotal"]
    missing = CliRunner().invoke(cli, ["index", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 1
    assert "meta file not found" in missing.output and "nope.txt" in missing.output
