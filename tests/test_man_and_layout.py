"""man/ must match the CLI; the mechanism core must not import the CLI or I/O stacks."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_man_pages_are_fresh():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_man.py"), str(ROOT / "man"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_no_insecure_randomness_in_package():
    for path in (ROOT / "dpcli").rglob("*.py"):
        text = path.read_text()
        assert "import random" not in text and "np.random" not in text and "numpy.random" not in text, path


def test_docs_the_code_points_to_exist():
    for path in (ROOT / "dpcli").rglob("*.py"):
        for name in re.findall(r"docs/([a-z_]+\.md)", path.read_text()):
            assert (ROOT / "docs" / name).exists(), (path, name)
