"""Audit of ``dpcli sql``'s ownership through foreign keys: the stability bound on 2,000 random depth-3 datasets.

:func:`test_sql_owners.most_changed` adds one unit u to random data whose keys collide across units at every
level (and dangle), and asserts that the units other than u whose resolved rows change are at most
A = (S − 1)/2, the bound the release's noise is calibrated to (:mod:`dpcli.tasks.sql.owners`).
"""

from __future__ import annotations

import pytest
from test_sql_owners import most_changed

pytestmark = pytest.mark.audit


def test_one_more_unit_never_changes_more_than_a_other_units():
    assert most_changed(range(25, 2025)) >= 4
