"""Benchmark: `dpcli tabulate` on 1M synthetic persons × the 7 levels of sample_data/safetab_spec.toml.

Target (issue 5): under 30 s on a 2-core machine. Run by hand (``make bench``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(n: int = 1_000_000) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    from make_sample_data import persons

    dpcli = str(Path(sys.executable).with_name("dpcli"))
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        shutil.copy(ROOT / "sample_data" / "blocks.csv", d)
        shutil.copy(ROOT / "sample_data" / "safetab_spec.toml", d)
        persons(d, n)
        env = {**os.environ, "DPCLI_STATE_DIR": str(d / "state"), "DPCLI_ANALYST": "bench"}
        subprocess.run([dpcli, "budget", "init", "bench", "--mode", "pure", "--epsilon", "100"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        start = time.perf_counter()
        proc = subprocess.Popen([dpcli, "tabulate", str(d / "persons.parquet"), "--spec", str(d / "safetab_spec.toml"),
                                 "-o", str(d / "out.parquet")], env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        assert os.waitstatus_to_exitcode(status) == 0
        print(f"tabulate: {n:,} persons × 7 levels: {wall:.1f} s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB "
              f"(target < 30 s: {'met' if wall < 30 else 'missed'})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
