from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from rank_dataset.cli import cli
from rank_dataset.server.local import wait_until_up


def test_index_command(write_meta, tmp_path: Path) -> None:
    a, b = write_meta(n=10), write_meta(["x", "", "y"])
    result = CliRunner().invoke(cli, ["index", str(a), str(b)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"10\t{a}", f"2\t{b}", "12\ttotal"]
    missing = CliRunner().invoke(cli, ["index", str(tmp_path / "nope.txt")])
    assert missing.exit_code == 1
    assert "meta file not found" in missing.output and "nope.txt" in missing.output


def test_version_option_prints_the_installed_version() -> None:
    import rank_dataset

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0, result.output
    from rank_dataset.core.native import describe

    assert result.output == f"rank-dataset, version {rank_dataset.__version__}\nkernels: {describe()}\n"


# A child process in which `blocked` cannot be imported (as on a machine without it: a None entry in
# sys.modules makes `import` raise ModuleNotFoundError), running the command line in-process with
# click's CliRunner, or for real through main().
_WITHOUT = """
import json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None
from click.testing import CliRunner
from rank_dataset.cli import cli
result = CliRunner().invoke(cli, sys.argv[2:])
print(json.dumps([result.exit_code, result.output, repr(result.exception)]))
"""


# What a user without the server extra is told to run: the form for an installed package, and the
# one for a clone of the repository.
SERVER_HINT = "pip install 'rank-dataset[server]' (from a clone: pip install -e '.[server]')"


def _run_without(blocked: str, *args: str) -> tuple[int, str, str]:
    out = subprocess.run(
        [sys.executable, "-c", _WITHOUT, blocked, *args], capture_output=True, text=True, timeout=120, check=True
    )
    code, output, exception = json.loads(out.stdout)
    return code, output, exception


@pytest.mark.parametrize("blocked", ["starlette", "uvicorn", "h11", "starlette,uvicorn,h11"])
def test_serve_without_the_server_extra_says_what_to_install(write_meta, blocked: str) -> None:
    code, output, exception = _run_without(blocked, "serve", str(write_meta(n=5)), "--port", "0")
    first = blocked.split(",")[0]
    assert code == 1, exception
    assert output == f"Error: this command needs {first}, which is not installed: {SERVER_HINT}\n"


@pytest.mark.slow  # a fresh interpreter per missing dependency
def test_demo_without_torch_or_the_server_says_what_to_install() -> None:
    code, output, _ = _run_without("torch", "demo", "--lines", "10", "--world-size", "1")
    assert (code, output) == (1, "Error: this command needs torch, which is not installed: pip install torch\n")
    code, output, _ = _run_without("uvicorn", "demo", "--server", "--lines", "10", "--world-size", "1")
    assert (code, output) == (
        1,
        f"Error: this command needs uvicorn, which is not installed: {SERVER_HINT}\n",
    )


def test_the_real_command_prints_one_line_not_a_traceback(write_meta) -> None:
    # The installed entry point, as a user runs it: one line on stderr, exit status 1.
    code = "import sys; sys.modules['starlette'] = None; from rank_dataset.cli import main; main()"
    out = subprocess.run(
        [sys.executable, "-c", code, "serve", str(write_meta(n=5)), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"Error: this command needs starlette, which is not installed: {SERVER_HINT}"]


def test_index_needs_no_optional_dependency(write_meta) -> None:
    code, output, exception = _run_without("torch,starlette,uvicorn,h11", "index", str(write_meta(n=7)))
    assert code == 0, exception
    assert output.split("\t")[0] == "7"


def test_a_missing_module_that_is_not_optional_still_raises(write_meta) -> None:
    # Only the optional dependencies are turned into an install hint; anything else (here one of the
    # package's own modules, which `serve` imports once starlette, uvicorn and h11 are found) is a real bug.
    code, output, exception = _run_without("rank_dataset.server.app", "serve", str(write_meta(n=5)), "--port", "0")
    assert code == 1 and "not installed" not in output
    assert exception.startswith("ModuleNotFoundError(") and "rank_dataset.server.app" in exception, exception


@pytest.mark.slow  # real server processes
def test_serve_on_a_port_in_use_says_so_before_serving(write_meta, start_server) -> None:
    busy = start_server([write_meta(n=5)])
    out = subprocess.run(
        [sys.executable, "-m", "rank_dataset", "serve", str(write_meta(n=3)), "--port", str(busy.port)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1 and "serving" not in out.stdout
    assert out.stderr.splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{busy.port}: Address already in use (another server there? --port 0 "
        "takes a free port)"
    ]


def test_serve_on_port_0_prints_the_port_it_took(write_meta) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rank_dataset", "serve", str(write_meta(n=3)), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"rank-dataset: serving 3 samples on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match and int(match[2]) > 0, line
        wait_until_up(f"{match[1]}/len", proc, timeout=60)
        with urllib.request.urlopen(f"{match[1]}/len", timeout=10) as answer:
            assert json.loads(answer.read())["num_samples"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _compressed(tmp_path: Path, n: int) -> dict[str, Path]:
    """The same ``n`` demo lines as text, gzip, one zstd frame and zstd frames of 1 MiB."""
    import gzip

    import zstandard

    from tests_helpers import imagenet_line

    raw = "".join(f"{imagenet_line(i)}\n" for i in range(n)).encode()
    frames = zstandard.ZstdCompressor(level=3)
    files = {
        "txt": raw,
        "gz": gzip.compress(raw, 6),
        "one.zst": zstandard.ZstdCompressor(level=3).compress(raw),
        "frames.zst": b"".join(frames.compress(raw[k : k + (1 << 20)]) for k in range(0, len(raw), 1 << 20)),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / f"meta.{name}"
        paths[name].write_bytes(data)
    return paths


def test_index_reads_gzip_and_zstd_and_advises_on_a_single_zstd_frame(tmp_path: Path) -> None:
    paths = _compressed(tmp_path, 400_000)  # over 8 MiB (ADVISED_ABOVE): one frame is one checkpoint for all of it
    assert paths["txt"].stat().st_size > 8 << 20
    out = subprocess.run(
        [sys.executable, "-m", "rank_dataset", "index", *(str(p) for p in paths.values())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"400000\t{p}" for p in paths.values()] + ["1600000\ttotal"]
    notes = out.stderr.splitlines()
    assert len(notes) == 1 and notes[0].startswith(f"note: {paths['one.zst']} is a single zstd frame"), out.stderr
    assert f"zstd -dc {paths['one.zst']} | pzstd -3 -p 2 -c > " in notes[0]  # the user's file, not meta.txt
    assert "decompresses it from the start" in notes[0]
    # Checked again (from the cache): the same counts, the same advice; a small single frame gets none.
    (tmp_path / "small").mkdir()
    small = _compressed(tmp_path / "small", 1000)
    again = CliRunner().invoke(cli, ["index", str(paths["one.zst"]), str(small["one.zst"])])
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == [f"400000\t{paths['one.zst']}", f"1000\t{small['one.zst']}", "401000\ttotal"]
    assert again.stderr.count("is a single zstd frame") == 1


def test_index_of_a_corrupt_gz_is_one_line_naming_file_and_offset(tmp_path: Path) -> None:
    path = _compressed(tmp_path, 20_000)["gz"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 32] = bytes(32)
    path.write_bytes(bytes(data))
    out = subprocess.run(
        [sys.executable, "-m", "rank_dataset", "index", str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 1 and out.stdout == ""
    assert re.fullmatch(
        rf"Error: meta file {re.escape(str(path))} cannot be decoded at or after compressed byte [\d,]+: .*\n",
        out.stderr,
    )


@pytest.mark.parametrize("name", ["gz", "frames.zst"])
def test_serve_reads_gzip_and_zstd(tmp_path: Path, name: str) -> None:
    paths = _compressed(tmp_path, 3000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rank_dataset", "serve", str(paths[name]), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"rank-dataset: serving 3000 samples on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line
        wait_until_up(f"{match[1]}/len", proc, timeout=60)
        lines = paths["txt"].read_text().splitlines()
        for i in (0, 1234, 2999):
            with urllib.request.urlopen(f"{match[1]}/sample/{i}", timeout=10) as answer:
                assert answer.read().decode() == lines[i]
    finally:
        proc.terminate()
        proc.wait(timeout=60)
