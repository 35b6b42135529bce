"""What a user reads when an object URL cannot be read for want of the client or of credentials: the
documented ImportError naming the cloud extra (from the API and the CLI, in a process where obstore
cannot be imported), and the documented PermissionError when no credentials are given at all, saying
what obstore did (asked the instance metadata service; retried or not) as it happened."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rank_dataset import MetaFile, RankDataset
from rank_dataset.files.io import payloads as payload_io
from rank_dataset.files.io.object import ObjectFile

#: Run first in a child: obstore cannot be imported, as when it is not installed (the same
#: ModuleNotFoundError, with the module's name).
BLOCK_OBSTORE = """
import sys
class _NoObstore:
    def find_spec(self, name, path=None, target=None):
        if name == "obstore" or name.startswith("obstore."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoObstore())
"""

EXTRA = "pip install 'rank-dataset[cloud]'"


def _child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_OBSTORE + code], capture_output=True, text=True, timeout=120)


def test_without_obstore_the_api_names_the_extra() -> None:
    code = (
        "try:\n"
        "    import obstore\n"
        "except ModuleNotFoundError as exc:\n"
        "    print('blocked', exc.name)\n"
        "from rank_dataset import MetaFile\n"
        "from rank_dataset.files.io.base import ObjectKey\n"
        "from rank_dataset.files.io.object import ObjectFile\n"
        "from rank_dataset import Payloads\n"
        "key = ObjectKey('gs://bucket/m.txt', 10, 'e', None)\n"
        "for make in (lambda: MetaFile('s3://bucket/meta/train.txt'),\n"
        "             lambda: ObjectFile('gs://bucket/m.txt', key).read(0, 4),\n"
        "             lambda: Payloads('s3://bucket/images'),\n"
        "             lambda: Payloads(None, allow=['https://host/images/'])):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print(type(exc).__name__, '|', exc)\n"
    )
    out = _child(code)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "blocked obstore"
    # Each an ImportError proper (not its ModuleNotFoundError subclass), naming the URL and the extra.
    assert len(lines) == 5
    assert lines[1].startswith("ImportError | s3://bucket/meta: ") and lines[1].endswith(EXTRA)
    assert lines[2].startswith("ImportError | gs://bucket: ") and lines[2].endswith(EXTRA)
    # Payloads of a bucket (or of allowed URLs) say it when made, not as every sample's failure.
    assert lines[3].startswith("ImportError | s3://bucket/images: ") and lines[3].endswith(EXTRA)
    assert lines[4].startswith("ImportError | https://host/images/: ") and lines[4].endswith(EXTRA)
    assert "No module named" not in out.stdout


def test_without_obstore_the_cli_names_the_extra() -> None:
    code = "from rank_dataset.cli import main\nsys.argv = ['rank-dataset', 'index', 's3://bucket/meta/train.txt']\nmain()\n"
    out = _child(code)
    assert out.returncode == 1, out.stderr
    assert out.stderr.startswith("Error: s3://bucket/meta: reading from object storage")
    assert EXTRA in out.stderr and "No module named" not in out.stderr and "Traceback" not in out.stderr


@pytest.fixture
def no_credentials(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The environment of a user who set the endpoint but no credentials at all: obstore then asks
    the instance metadata service for some. Its address is pointed at loopback (AWS_METADATA_ENDPOINT)
    so that the test does not depend on what 169.254.169.254 does on this machine."""
    pytest.importorskip("obstore", reason="the cloud extra (obstore) is not installed")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    yield s3


def test_no_credentials_and_a_metadata_service_that_refuses(
    no_credentials: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = no_credentials
    url = s3.put("messages/meta.txt", b"a 1\nb 2\n")
    # SeaweedFS refuses the unsigned token request (403 AccessDenied), as a metadata service that
    # will not serve this machine does; obstore does not retry a 403.
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", s3.endpoint)
    with pytest.raises(PermissionError) as got:
        RankDataset(url, rank=0, world_size=1, timeout=20)
    said = str(got.value)
    assert said.startswith(f"meta file {url}: access denied: no credentials were found")
    assert f"HTTP 403 Forbidden from {s3.endpoint}/latest/api/token, not retried" in said
    assert "AWS_ACCESS_KEY_ID" in said and "retries within" not in said
    # With the credentials, the same object reads: the refusal was about credentials alone.
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    assert len(MetaFile(url)) == 2


def test_no_credentials_and_no_metadata_service(no_credentials: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = no_credentials.put("messages/meta2.txt", b"a 1\n")
    with socket.socket() as closed:  # a loopback port that nothing listens on: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{port}")
        with pytest.raises(PermissionError) as got:
            ObjectFile(url, timeout=4)  # obstore retries refused connections for a quarter of it
    said = str(got.value)
    assert said.startswith(f"meta file {url}: access denied: no credentials were found")
    assert f"from http://127.0.0.1:{port}/latest/api/token, " in said
    retried = said.split("/latest/api/token, ", 1)[1]
    assert retried.split(" ", 1)[0].isdigit() and int(retried.split(" ", 1)[0]) >= 1
    assert " retries within timeout=4 s)" in said


def test_no_credentials_from_the_cli(no_credentials: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url = no_credentials.put("messages/meta3.txt", b"a 1\n")
    from click.testing import CliRunner

    from rank_dataset.cli import cli

    monkeypatch.setenv("AWS_METADATA_ENDPOINT", no_credentials.endpoint)
    out = CliRunner().invoke(cli, ["index", url])
    assert out.exit_code == 1
    assert out.output.startswith(f"Error: meta file {url}: access denied: no credentials were found")


def test_no_credentials_for_payloads(no_credentials: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A payload read with no credentials at all fails as that sample's PayloadError, saying so."""
    from rank_dataset import PayloadError, Payloads

    s3 = no_credentials
    s3.put("messages/img/a.bin", b"abc")
    meta = tmp_path / "meta.txt"
    meta.write_text("a.bin 1\n")
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", s3.endpoint)
    ds = RankDataset(meta, payloads=Payloads("s3://meta/messages/img", timeout=20), is_test=True)
    asked = payload_io.COUNTS["objects"]
    with pytest.raises(PayloadError) as got:
        ds[0]
    assert payload_io.COUNTS["objects"] - asked == 1  # as the message says: not asked again until the timeout
    said = str(got.value)
    assert "s3://meta/messages/img/a.bin: access denied: no credentials were found" in said
    assert f"HTTP 403 Forbidden from {s3.endpoint}/latest/api/token, not retried" in said
    assert "retries within" not in said and "retried within" not in said
