"""The docs match the code: every shell example in README.md and docs/ runs as written, man/ is what the
CLI generates, and every docs page the code points to exists.

Each Markdown file's ```sh blocks run in order as one bash script (``set -euo pipefail``) in a fresh
directory holding ``sample_data/`` and a fresh state directory. Blocks fenced as ```shell are shown,
not run (installation, cron lines on paths that do not exist here); ```text blocks are sample output.

``dpcli`` in the scripts is this test's own process by default: a shim on ``PATH`` hands each command
line (its arguments, working directory, ``DPCLI_*`` variables and standard input) to
:func:`dpcli.cli.app.main` here and hands back its output and exit code, so a doc costs its commands,
not one interpreter start-up each. Under ``make audit`` every doc runs again with the installed console
script (the one next to this interpreter: the clone's ``.venv``), which ``make test`` runs in
``test_cli.py``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from dptest import console

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def sh_blocks(path: Path) -> list[str]:
    """The runnable examples of a Markdown file, in order."""
    return SH_BLOCK.findall(path.read_text())


#: The ``dpcli`` the scripts run in process: it sends its command line to the test and prints the answer.
SHIM = r'''
import json, os, socket, struct, sys

def send(sock, data):
    sock.sendall(struct.pack("!Q", len(data)) + data)

def receive(sock):
    size = b""
    while len(size) < 8:
        size += sock.recv(8 - len(size)) or sys.exit("dpcli shim: the test went away")
    (n,), data = struct.unpack("!Q", size), b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data

sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["DPCLI_DOCS_SHIM"])
env = {k: v for k, v in os.environ.items() if k.startswith("DPCLI_") and k != "DPCLI_DOCS_SHIM"}
send(sock, json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": env}).encode())
send(sock, sys.stdin.buffer.read())
code, out, err = int(receive(sock)), receive(sock), receive(sock)
try:
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
finally:
    sys.stderr.buffer.write(err)
    sys.stderr.flush()
sys.exit(code)
'''


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!Q", len(data)) + data)


def _receive(sock: socket.socket) -> bytes:
    size = b""
    while len(size) < 8:
        size += sock.recv(8 - len(size))
    (n,), data = struct.unpack("!Q", size), b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


def _run_here(sock: socket.socket) -> None:
    """One command line from the shim, run by :func:`dptest.console` in this process, in its directory and
    with its ``DPCLI_*`` variables (any other of this process's unset); the exit code and output back."""
    request, stdin = json.loads(_receive(sock)), _receive(sock)
    env = {k: None for k in os.environ if k.startswith("DPCLI_")} | request["env"]
    r = console(*request["argv"], input=stdin, env=env, cwd=request["cwd"], text=False)
    _send(sock, str(r.returncode).encode())
    _send(sock, r.stdout)
    _send(sock, r.stderr)


def run_examples(path: Path, work: Path, in_process: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``path``'s examples in ``work`` (a fresh directory with ``sample_data``) and a fresh state dir,
    with ``dpcli`` run in this process (``in_process``) or the installed console script."""
    (work / "sample_data").symlink_to(ROOT / "sample_data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCLI_")}
    env["DPCLI_STATE_DIR"] = str(work / "state")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = "set -euo pipefail\n" + "\n".join(sh_blocks(path))
    if not in_process:
        return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    shim = work / ".shim"
    shim.mkdir()
    (shim / "dpcli").write_text(f"#!{sys.executable} -I\n{SHIM}")
    (shim / "dpcli").chmod(0o755)
    env["PATH"] = f"{shim}{os.pathsep}{env['PATH']}"
    env["DPCLI_DOCS_SHIM"] = str(shim / "socket")
    server = socket.socket(socket.AF_UNIX)
    server.bind(env["DPCLI_DOCS_SHIM"])
    server.listen()
    server.settimeout(0.05)
    out, err = (work / ".stdout").open("w+"), (work / ".stderr").open("w+")
    with server, out, err:
        bash = subprocess.Popen(["bash", "-c", script], cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, text=True)
        try:
            while bash.poll() is None:
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                with sock:
                    sock.settimeout(600)
                    _run_here(sock)
        finally:
            if bash.poll() is None:
                bash.kill()
            bash.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(bash.args, bash.returncode, out.read(), err.read())


def _examples_ran(doc: Path, r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"{doc.name}: exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


WITH_EXAMPLES = [d for d in DOCS if sh_blocks(d)]


@pytest.mark.parametrize("doc", WITH_EXAMPLES, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_shell_example_runs(doc, tmp_path):
    _examples_ran(doc, run_examples(doc, tmp_path))


@pytest.mark.audit  # make test runs the console script in test_cli.py's entry-point test
@pytest.mark.parametrize("doc", WITH_EXAMPLES, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_shell_example_runs_with_the_console_script(doc, tmp_path):
    _examples_ran(doc, run_examples(doc, tmp_path, in_process=False))


def test_the_quick_start_fits_a_screen_and_ends_with_its_output():
    """Issue 17: one ledger, three commands, then what they print; set-up lines are shown, not run."""
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [ln for ln in sh_blocks_text(quick) if ln.startswith("dpcli ")]
    assert len(commands) == 4 and commands[0].startswith("dpcli budget init default")
    assert "```text" in quick and "make demo" in quick and ". .venv/bin/activate" in quick
    assert len(quick.splitlines()) <= 60


def sh_blocks_text(markdown: str) -> list[str]:
    return [ln for block in SH_BLOCK.findall(markdown) for ln in block.splitlines()]


def test_every_command_page_has_examples():
    for name in ("histogram", "sql", "topk", "tabulate", "stream-replay", "budget", "schedules"):
        assert sh_blocks(ROOT / "docs" / "commands" / f"{name}.md"), name


def test_man_pages_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_man.py"), str(ROOT / "man"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_docs_the_code_points_to_exist():
    for path in (ROOT / "dpcli").rglob("*.py"):
        for name in re.findall(r"docs/([a-z_]+\.md)", path.read_text()):
            assert (ROOT / "docs" / name).exists(), (path, name)
