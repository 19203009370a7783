"""Every shell example in README.md and docs/ runs as written, so the docs cannot drift.

Each Markdown file's ```sh blocks run in order as one bash script (``set -euo pipefail``) with the
installed ``dpcli`` (the console script next to this interpreter: the clone's ``.venv`` under
``make test``), in a fresh directory holding ``sample_data/`` and a fresh state directory.
Blocks fenced as ```shell are shown, not run (installation, cron lines on paths that do not
exist here); ```text blocks are sample output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def sh_blocks(path: Path) -> list[str]:
    """The runnable examples of a Markdown file, in order."""
    return SH_BLOCK.findall(path.read_text())


def run_examples(path: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """Run ``path``'s examples in ``work`` (a fresh directory with ``sample_data``) and a fresh state dir."""
    (work / "sample_data").symlink_to(ROOT / "sample_data")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DPCLI_")}
    env["DPCLI_STATE_DIR"] = str(work / "state")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script = "set -euo pipefail\n" + "\n".join(sh_blocks(path))
    return subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("doc", [d for d in DOCS if sh_blocks(d)], ids=lambda d: str(d.relative_to(ROOT)))
def test_every_shell_example_runs(doc, tmp_path):
    r = run_examples(doc, tmp_path)
    assert r.returncode == 0, f"{doc.name}: exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]


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
    for name in ("histogram", "topk", "tabulate", "stream-replay", "budget", "schedules"):
        assert sh_blocks(ROOT / "docs" / "commands" / f"{name}.md"), name
