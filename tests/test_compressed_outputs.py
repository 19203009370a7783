"""``-o x.csv.gz`` (issue 39, item 9): an output named ``.gz`` is written gzip-compressed, byte-deterministic
(gzip level 9, a modification time of 0, no file name in its header), so a replay writes the same bytes and its
digest is the one the ledger recorded with the charge (``dpcli plot`` in service mode draws only such files).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json

import polars as pl
import pytest
from dptest import PV_SMALL, cli, init_ledger

import dpcli
from dpcli.errors import UsageError
from dpcli.io.outputs import GZIP_LEVEL, compressed, output_compression, output_format_for

ARGS = ["histogram", PV_SMALL, "--by", "country", "--privacy-unit", "user_id", "--max-contributions", "1",
        "--max-partitions", "1", "--epsilon", "1", "--delta", "1e-7"]


def test_a_gz_name_is_its_formats_compressed_and_parquet_is_not_compressed_again():
    assert output_format_for("x.csv.gz", None) == "csv" and output_compression("x.csv.gz") == "gzip"
    assert output_format_for("x.json.gz", None) == "json" and output_format_for("daily.gz", None) == "csv"
    assert output_format_for("x.gz", "json") == "json" and output_compression("x.csv") is None
    assert output_compression(None) is None and output_compression("-") is None
    for name, fmt in (("x.parquet.gz", None), ("x.gz", "parquet"), ("x.txt.gz", None)):
        with pytest.raises(UsageError):
            output_format_for(name, fmt)


def test_compression_is_byte_deterministic_and_names_no_file_and_no_time():
    data = b"country,count\nBR,12\n" * 50
    one, two = compressed(data, "gzip"), compressed(data, "gzip")
    assert one == two and gzip.decompress(one) == data
    # RFC 1952 header: ID1 ID2 CM FLG MTIME(4) XFL OS; FLG 0 (no FNAME, no FCOMMENT), MTIME 0, XFL 2 (level 9)
    assert one[:3] == b"\x1f\x8b\x08" and one[3] == 0 and one[4:8] == b"\0\0\0\0" and one[8] == 2
    assert GZIP_LEVEL == 9 and compressed(data, None) == data


def test_a_replay_writes_the_same_bytes_and_the_ledger_holds_their_digest(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    first, again, plain = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz", tmp_path / "c.csv"
    for path in (first, again, plain):
        r = cli(*ARGS, "-o", path)
        assert r.exit_code == 0, r.stderr
    assert first.read_bytes() == again.read_bytes()  # the replay: byte for byte
    assert gzip.decompress(first.read_bytes()) == plain.read_bytes()  # the CSV the plain name gets, compressed
    digest = "sha256:" + hashlib.sha256(first.read_bytes()).hexdigest()
    outputs = [e.get("output") for e in dpcli.read_ledger(state_dir, "default").entries]
    assert outputs.count(digest) == 2, outputs  # the first run's completion and the replay
    table = pl.read_csv(io.BytesIO(gzip.decompress(first.read_bytes())))
    assert table.columns == ["country", "count"] and table.height > 0
    r = cli("plot", first)  # a compressed release is drawn like a plain one
    assert r.exit_code == 0 and "count by country" in r.stdout, r.stderr


def test_json_outputs_compress_too_and_a_compressed_parquet_name_is_refused_before_any_charge(tmp_path, state_dir):
    init_ledger("approx", "--epsilon", "10", "--delta", "1e-5")
    r = cli(*ARGS, "-o", tmp_path / "r.json.gz")
    assert r.exit_code == 0, r.stderr
    assert json.loads(gzip.decompress((tmp_path / "r.json.gz").read_bytes()))[0].keys() == {"country", "count"}
    before = len(dpcli.read_ledger(state_dir, "default").entries)
    r = cli(*ARGS, "-o", tmp_path / "r.parquet.gz")
    assert r.exit_code == 2 and "drop .gz" in r.stderr, r.stderr
    assert len(dpcli.read_ledger(state_dir, "default").entries) == before and not (tmp_path / "r.parquet.gz").exists()


def test_a_service_mode_analyst_plots_the_compressed_release_dpcli_wrote_for_them(tmp_path, monkeypatch):
    """In service mode ``plot`` draws only a file whose digest the analyst's ledger recorded: the digest of the
    compressed bytes, taken before they are decompressed, so a .csv.gz written for them is drawn, and the same
    release recompressed otherwise (other bytes) is not."""
    from dptest import Service

    svc = Service(tmp_path, monkeypatch)
    svc.setup()
    out = svc.out / "alice" / "pages.csv.gz"
    r = svc.run("alice", "histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6", "-o", out)
    assert r.exit_code == 0, r.stderr
    r = svc.run("alice", "plot", out)
    assert r.exit_code == 0 and "count by page" in r.stdout, r.stderr
    other = svc.out / "alice" / "other.csv.gz"
    other.write_bytes(gzip.compress(gzip.decompress(out.read_bytes()), compresslevel=1, mtime=1))
    r = svc.run("alice", "plot", other)
    assert r.exit_code != 0 and "count by page" not in r.stdout, r.stderr
