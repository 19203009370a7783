"""Make the pictures in docs/images from sample_data (``make docs-images``).

Each command runs once on the sample data in a throwaway state directory, and ``dpcli plot`` /
``dpcli budget show --plot`` draw what it released. The values are noisy, so a new run draws
slightly different bars; the pictures are checked in, and looked at before they are.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
IMAGES = ROOT / "docs" / "images"
PV = str(SAMPLE / "page_views.parquet")

RUNS = {
    "histogram": (["histogram", PV, "--by", "country", "--privacy-unit", "user_id", "--agg", "count-units,mean",
                   "--value", "duration_s", "--bounds", "0:600", "--epsilon", "0.5", "--delta", "1e-7", "--with-error"],
                  ["--value", "count_units"]),
    "topk": (["topk", PV, "--by", "page", "-k", "10", "--privacy-unit", "user_id", "--epsilon", "1", "--delta", "1e-7",
              "--with-error"], []),
    "stream": (["stream-replay", PV, "--time", "ts", "--by", "page", "--privacy-unit", "user_id", "--window", "7d",
                "--trigger-every", "1d", "--max-contributions", "8", "--epsilon", "6", "--delta", "1e-9",
                "--through", "2026-11-15", "--with-error"], ["--keys", "/p/002,/p/010,/p/030"]),
    "tabulate": (["tabulate", str(SAMPLE / "persons.parquet"), "--spec", str(SAMPLE / "safetab_spec.toml"),
                  "--with-error"], ["--level", "(state, detailed)", "--group", "05:11C"]),
}


def main() -> None:
    IMAGES.mkdir(parents=True, exist_ok=True)
    dpcli = [sys.executable, "-m", "dpcli"]
    with tempfile.TemporaryDirectory() as tmp:
        state = ["--state-dir", str(Path(tmp) / "state")]
        subprocess.run([*dpcli, *state, "budget", "init", "default", "--mode", "approx", "--epsilon", "40",
                        "--delta", "1e-5"], check=True)
        for name, (run, plot) in RUNS.items():
            release = Path(tmp) / f"{name}.csv"
            summary = Path(tmp) / f"{name}.json"
            done = subprocess.run([*dpcli, *state, "-q", *run, "-o", str(release), "--json"], check=True,
                                  capture_output=True, text=True)
            summary.write_text(json.dumps(json.loads(done.stdout)))
            subprocess.run([*dpcli, "plot", str(release), "--summary", str(summary), *plot, "-o",
                            str(IMAGES / f"{name}.png")], check=True)
        subprocess.run([*dpcli, *state, "budget", "show", "--plot", str(IMAGES / "budget.png")], check=True)
    print(f"pictures in {IMAGES}: look at them before committing")


if __name__ == "__main__":
    main()
