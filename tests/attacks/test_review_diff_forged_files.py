"""Review of ``dpcli diff`` (personal mode): a release or summary no dpcli wrote is refused in dpcli's own words.

A ``--json`` document edited by hand (a summary that is not an object, a record that is not one, a count of
2⁷⁰ or a text, a sum of 10³⁰⁸, a noise scale of 0 or below, bounds up to 10³⁰⁸) made diff stop with an internal
error (exit 1, "please report"), and a sum of 10³⁰⁸ printed numpy's RuntimeWarning, a library's text, on stderr
(rule 9). Trusting the user's own files is fine in personal mode (they can only mislead themselves); each is now a
refusal (exit 65) in one line dpcli wrote.
"""

from __future__ import annotations

import copy
import json

from dptest import cli, init_ledger

QUERY = ["--by", "g", "--privacy-unit", "user", "--agg", "count,sum,mean", "--value", "v", "--bounds", "0:10",
         "--max-contributions", "1", "--max-partitions", "1", "--delta", "1e-7", "--json"]


def _set(doc, path, value):
    at = doc
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value


def test_attack_forged_documents_are_refused_in_dpclis_own_words(tmp_path):
    init_ledger("approx", "--epsilon", "50", "--delta", "1e-3")
    data = tmp_path / "d.csv"
    data.write_text("user,g,v\n" + "".join(f"u{i},{'abcde'[i % 5]},{i % 7}\n" for i in range(2000)))
    docs = []
    for eps in ("0.5", "0.7"):
        r = cli("histogram", data, *QUERY, "--epsilon", eps)
        assert r.exit_code == 0, r.stderr
        docs.append(json.loads(r.stdout))
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(docs[0]))
    forgeries = [(("summary",), "x"), (("result", 0), 5), (("result", 0, "count"), 2**70),
                 (("result", 0, "count"), "x"), (("result", 0, "count"), {}), (("result", 0, "sum_v"), 1e308),
                 (("result", 0, "mean_v"), 1e308), (("summary", "measurements", "rows"), 0),
                 (("summary", "measurements", "sum"), -1), (("summary", "measurements", "csum"), -1),
                 (("summary", "measurements", "csum"), 1e308), (("summary", "bounds", 1), 1e308)]
    for path, value in forgeries:
        doc = copy.deepcopy(docs[1])
        _set(doc, path, value)
        new.write_text(json.dumps(doc))
        r = cli("diff", old, new)
        assert r.exit_code in (0, 65), (path, value, r.exit_code, r.stderr)
        assert "Warning" not in r.stderr and "internal error" not in r.stderr, (path, value, r.stderr)
