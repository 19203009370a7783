"""TOML specs for the tabulate tests and audits: the parts every test spec shares, written once."""

from __future__ import annotations

from pathlib import Path

#: Alone / alone-or-in-combination race iterations plus a TotalOnly ethnicity one.
REG_ITERATIONS = '''[iterations.reg]
"W" = { race = ["1000-1999"], alone = true }
"WC" = { race = ["1000-1999"] }
"B" = { race = ["2000-2999"] }
"H" = { ethnicity = ["2"], total_only = true }'''

#: The nation, its states (2-character block prefixes) and an AIANNH-like area column.
NATION_STATE_AREA = '''levels.nation = { prefix = 0 }
levels.state = { prefix = 2 }
levels.area = { column = "aiannh" }'''

BLOCKS = "block,aiannh\n01001,A1\n01002,\n02001,\n"


def spec_toml(levels: str, iterations: str = REG_ITERATIONS, geography: str = NATION_STATE_AREA,
              gamma: str = "0.1", thresholds: tuple[int, int, int] = (20, 100, 500), extra: str = "") -> str:
    """A geometric-noise spec over ``blocks.csv`` (next to it) with the SafeTab 4/9/23 age bins."""
    return f'''noise = "geometric"
gamma = {gamma}
thresholds = [{", ".join(map(str, thresholds))}]
age_bins = [[0, 18, 45, 65], [0, 5, 18, 25, 35, 45, 55, 65, 75], [0, 5, 10, 15, 18, 20, 21, 22, 25, 30, 35, 40, 45, 50, 55, 60, 62, 65, 67, 70, 75, 80, 85]]
{extra}
[columns]
block = "block"
race = "race"
ethnicity = "eth"
sex = "sex"
age = "age"
[geography]
blocks = "blocks.csv"
{geography}
{iterations}
{levels}
'''


def write_spec(directory: Path, levels: str, iterations: str | None = None, extra: str = "",
               blocks: str = BLOCKS) -> Path:
    """``blocks.csv`` and ``spec.toml`` in ``directory``; returns the spec's path."""
    (directory / "blocks.csv").write_text(blocks)
    path = directory / "spec.toml"
    path.write_text(spec_toml(levels, iterations or REG_ITERATIONS, extra=extra))
    return path


def block_frame(spec: object) -> object:
    """A spec's public block list as a lazy frame, opened as the release path opens it (text columns)."""
    from dpcli.io.inputs import open_input
    from dpcli.tasks.tabulate import block_columns

    return open_input(str(spec.blocks_file), text_columns=tuple(block_columns(spec))).frame  # type: ignore[attr-defined]
