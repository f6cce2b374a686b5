"""Every ``curl`` line of README.md works when pasted, against a server started as ``make serve``.

The lines run in README order with the real ``curl`` (through ``bash``, for quoting such as
``$'...\\n'``), each against one server that has the example models preloaded, so a model
the README loads is there when a later line describes it. What a reader would have to fill
in is substituted from ``PLACEHOLDERS``, explicitly; a line with a placeholder the table
does not know fails, and so does a line whose status is not the one its trailing comment
starts with (200 when the comment names none). The only other change is the port:
``localhost:8080`` becomes the test server's.

The README's ``tritonclient`` examples (HTTP and gRPC) run the same way, against the same
server (``localhost:8081`` becoming its gRPC port): each ``print`` whose trailing comment shows
a value must print exactly that.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torchvision.io
from conftest import ROOT

from mmserver.harness.testing import ServerProcess, free_port

README = ROOT / "README.md"
README_PORT = 8080
README_GRPC_PORT = 8081
#: A trailing comment that starts like a printed value is the line's expected output.
PRINTED_VALUE = re.compile(r"^(True|False|\(|\[|\{|-?\d)")
#: README sections whose curl lines need something else than `make serve`'s server.
RUN_ELSEWHERE = {
    "Run as a container": "tests/test_container.py sends them to the image it builds",
    "Securing the management API": "tests/test_reliability.py runs a server with the token",
}
HTTP_METHODS = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS"}
DEFAULT_STATUS = 200


@dataclasses.dataclass
class Session:
    """What a reader has at hand when pasting the next line."""

    workdir: Path
    previous_body: bytes = b""

    def previous_json(self) -> dict:
        return json.loads(self.previous_body)


#: README text -> what a reader pastes instead (computed when the line runs).
PLACEHOLDERS: dict[str, Callable[[Session], str]] = {
    "TOKEN": lambda session: session.previous_json()["nextPageToken"],
    "[[...16 numbers...]]": lambda session: json.dumps([[0.25 * i for i in range(16)]]),
    "@digit.png": lambda session: "@" + str(session.workdir / "digit.png"),
}


@dataclasses.dataclass(frozen=True)
class CurlLine:
    line_number: int
    section: str
    command: str  # continuation lines joined, without the trailing comment
    comment: str

    @property
    def expected_status(self) -> int:
        match = re.match(r"(\d{3})\b", self.comment)
        return int(match.group(1)) if match else DEFAULT_STATUS

    def __str__(self) -> str:
        return f"README.md:{self.line_number}: {self.command}"


def split_comment(command: str) -> tuple[str, str]:
    """(command, comment) at the first ``#`` that starts a word outside quotes."""
    quote = None
    for index, char in enumerate(command):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or command[index - 1].isspace()):
            return command[:index].rstrip(), command[index + 1:].strip()
    return command.rstrip(), ""


def readme_curl_lines(text: str) -> Iterator[CurlLine]:
    """The curl commands of the ``bash`` blocks, in order, with the ``##`` section of each."""
    section, in_bash, pending, first_line = "", False, "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_bash = not in_bash and line.strip() == "```bash"
            continue
        if not in_bash:
            if line.startswith("## "):
                section = line[3:].strip()
            continue
        if not pending:
            first_line = number
        pending += line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.startswith("curl "):
            yield CurlLine(first_line, section, *split_comment(pending))
        pending = ""


def unknown_placeholders(command: str) -> list[str]:
    """What still reads as something to fill in: ``...``, ``@file``, an upper-case word."""
    found = re.findall(r"\S*\.\.\.\S*|(?<!\S)@\S+|\b[A-Z][A-Z0-9_]{2,}\b", command)
    return [word for word in found if word not in HTTP_METHODS]


def pasted(line: CurlLine, session: Session, port: int) -> str:
    """The line as a reader pastes it: placeholders filled in, the test server's port."""
    without_known = line.command
    for placeholder in PLACEHOLDERS:
        without_known = without_known.replace(placeholder, "")
    unknown = unknown_placeholders(without_known)
    assert not unknown, f"{line}\nhas placeholders the test does not know: {unknown}"
    command = line.command.replace(f"localhost:{README_PORT}", f"localhost:{port}")
    for placeholder, value in PLACEHOLDERS.items():
        if placeholder in command:
            command = command.replace(placeholder, value(session))
    return command


def curl(command: str, session: Session) -> int:
    """Run a pasted curl line as bash would; its HTTP status, its body kept in ``session``."""
    body = session.workdir / "answer"
    observed = command.replace(
        "curl ", f"curl --silent --show-error --output {body} --write-out '%{{http_code}}' ", 1)
    result = subprocess.run(["bash", "-c", observed], cwd=session.workdir, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, f"{command}\ncurl exited {result.returncode}: {result.stderr}"
    session.previous_body = body.read_bytes() if body.exists() else b""
    return int(result.stdout)


# -- the server `make serve` starts --------------------------------------------------------


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("examples")
    subprocess.run([sys.executable, "-m", "mmserver", "examples", str(directory)], cwd=ROOT,
                   check=True, capture_output=True, timeout=600)
    return directory


@pytest.fixture(scope="module")
def make_serve(examples) -> Iterator[ServerProcess]:
    preload = [f"--preload={name}={examples / name / 'model'}"
               for name in ("digits", "resnet18", "tabular", "minilm")]
    grpc_port = free_port()
    with ServerProcess(["--model-root", str(examples), *preload, "--grpc-port", str(grpc_port)],
                       cwd=ROOT) as server:
        server.grpc_port = grpc_port
        yield server


def write_digit_png(path: Path) -> None:
    """A 32x32 grey '0' stroke, what a reader would have as digit.png."""
    image = torch.zeros(1, 32, 32, dtype=torch.uint8)
    image[0, 6:26, 8:12] = image[0, 6:26, 20:24] = 255
    image[0, 6:10, 8:24] = image[0, 22:26, 8:24] = 255
    path.write_bytes(bytes(torchvision.io.encode_png(image).numpy()))


# -- the tests ----------------------------------------------------------------------------


def test_the_readme_has_the_curl_lines_this_test_expects():
    lines = list(readme_curl_lines(README.read_text()))
    routes = " ".join(line.command for line in lines if line.section not in RUN_ELSEWHERE)
    for route in ("/ping", "/models/digits2", "/invocations", "/metrics", "next_page_token"):
        assert route in routes
    assert all(line.command.startswith("curl ") for line in lines)


def test_placeholders_are_found_when_unknown():
    assert unknown_placeholders("curl -X DELETE localhost:1/models/MODEL") == ["MODEL"]
    assert unknown_placeholders("curl -d '[[...3 numbers...]]' localhost:1") == [
        "'[[...3", "numbers...]]'"]
    assert unknown_placeholders("curl --data-binary @cat.jpg localhost:1") == ["@cat.jpg"]
    assert unknown_placeholders("curl -H 'Content-Type: text/csv' -X POST localhost:1") == []


def test_every_readme_curl_line_answers_what_its_comment_says(make_serve, tmp_path):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README's lines cannot be pasted")
    write_digit_png(tmp_path / "digit.png")
    session = Session(workdir=tmp_path)
    ran = 0
    for line in readme_curl_lines(README.read_text()):
        if line.section in RUN_ELSEWHERE:
            continue
        status = curl(pasted(line, session, make_serve.port), session)
        assert status == line.expected_status, (
            f"{line}\nanswered {status}, the comment says {line.expected_status}: "
            f"{session.previous_body[:300]!r}")
        ran += 1
    assert ran >= 10


def readme_client_examples(text: str) -> list[str]:
    """The ``python`` blocks of the README that talk to the server with ``tritonclient``."""
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return [block for block in blocks if "import tritonclient" in block]


def expected_prints(block: str) -> list[str | None]:
    """Per ``print(...)`` line of ``block``, the output its trailing comment states (None when
    the comment describes rather than shows it)."""
    expected = []
    for line in block.splitlines():
        if line.startswith("print("):
            comment = line.partition("  # ")[2].strip()
            expected.append(comment if PRINTED_VALUE.match(comment) else None)
    return expected


def test_every_readme_tritonclient_example_prints_what_its_comments_say(make_serve):
    blocks = readme_client_examples(README.read_text())
    assert any("tritonclient.http" in b for b in blocks) and any(
        "tritonclient.grpc" in b for b in blocks)
    for block in blocks:
        pasted = (block.replace(f"localhost:{README_PORT}", f"127.0.0.1:{make_serve.port}")
                  .replace(f"localhost:{README_GRPC_PORT}", f"127.0.0.1:{make_serve.grpc_port}"))
        done = subprocess.run([sys.executable, "-c", pasted], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, f"{block}\n{done.stderr[-2000:]}"
        printed = done.stdout.splitlines()
        expected = expected_prints(block)
        shown = expected[:expected.index(None)] if None in expected \
            else expected  # a described print may span lines: compare those before it
        assert len(shown) >= 2 and printed[:len(shown)] == shown, (block, printed[:len(shown)])
