"""Start-up time of the commands people type most: ``dpcli --help`` and ``dpcli budget show``.

Wall time of the installed console script (the venv's ``bin/dpcli``), median and best of 15
runs after two warm-ups, with bytecode caching on (as after an install). Target: ≤ 0.15 s.
Run with ``make bench-startup``; record the figures in bench/results.md.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.15
RUNS = 15


def _time(argv: list[str], env: dict[str, str]) -> list[float]:
    out = []
    for i in range(RUNS + 2):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i >= 2:
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    dpcli = str(Path(sys.executable).with_name("dpcli"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as state:
        env["DPCLI_STATE_DIR"] = state
        subprocess.run([dpcli, "budget", "init", "default", "--epsilon", "1"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{'command':<22}{'median s':>10}{'best s':>10}  target ≤ {TARGET_S} s")
        for argv in (["--help"], ["budget", "show"]):
            times = _time([dpcli, *argv], env)
            med = statistics.median(times)
            verdict = "met" if med <= TARGET_S else "missed"
            print(f"{'dpcli ' + ' '.join(argv):<22}{med:>10.3f}{min(times):>10.3f}  {verdict}")


if __name__ == "__main__":
    main()
