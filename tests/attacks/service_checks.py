"""What the service-mode attacks share (issue 29): a query by catalog name, one-line refusals, catalog
entries added by the operator, and the private column's values that no output may hold.

The deployment itself is :class:`dptest.Service` (the ``svc`` fixture of ``conftest.py``).
"""

from __future__ import annotations

from dptest import Service

#: A histogram of the catalog dataset ``visits`` by page, as an analyst types it.
QUERY = ["histogram", "visits", "--by", "page", "--epsilon", "1", "--delta", "1e-6"]

#: Values of the private column of ``visits.csv``: none may ever be printed.
SECRET_VALUES = ("s17", "s42", "s299")


def _one_line(result) -> str:
    """The one line of a run's stderr (asserted to be one)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def _add(svc: Service, section: str, name: str, location: object, unit: str | None = "user") -> None:
    """The operator adds ``[section.name]`` at ``location`` (every analyst may use it) and reinstalls."""
    svc.catalog_toml += (f'[{section}.{name}]\nlocation = "{location}"\n'
                         + (f'privacy_unit = "{unit}"\n' if section == "datasets" else "") + 'analysts = ["*"]\n')
    svc.setup(ledgers=False)


def _nothing_private(result, *extra: str) -> None:
    """No value of the private column (nor any of ``extra``) in what the run printed."""
    text = result.stdout + result.stderr
    for secret in (*SECRET_VALUES, *extra):
        assert secret not in text, text
