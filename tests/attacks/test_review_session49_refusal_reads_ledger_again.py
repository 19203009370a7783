"""Review session 49 (commit 81d5aa7, the continuation refactor), a finding of low severity: a budget refusal of a
task that has no budget hint now takes the ledger's lock again, and can end as a lock timeout instead.

Before 81d5aa7, ``release.path._with_hint`` probed ``getattr(task, "budget_hint", None)`` and returned the
refusal at once for a task without one (``sql``, ``tabulate``, ``stream-replay``). The refactor gives every task a
``budget_hint`` (``TaskDefaults``: None), and ``release.steps.with_hint`` now reads the ledger (under its
exclusive lock, :func:`dpcli.state.ledger.read_ledger`) *before* asking the task, so every such refusal, after the
debit refused it, waits for the ledger's lock once more. When another process of the analyst holds that lock
(here: taken right after the refused debit, as a concurrent job would), the run that was refused for budget
(exit 77, "alert" in docs/cron.md) ends instead as a lock timeout (exit 75, "retry"), and its words change. No
privacy rule is broken (nothing is debited or read either way), but the refactor was to change no behaviour.

Fix: in ``with_hint`` read the ledger only when the task's hint asks whether a cost pays (a lazy ``pays``), or
skip the read when ``budget_hint`` is the default.
"""

from __future__ import annotations

import fcntl
import os

from dptest import cli, init_ledger

Q = "SELECT WITH ANONYMIZATION dept, ANON_COUNT(*, 5) AS c FROM Employee E JOIN Order O USING(uid) GROUP BY dept"


def test_a_budget_refusal_without_a_hint_stays_a_budget_refusal_when_the_ledger_is_busy(tmp_path, state_dir,
                                                                                         monkeypatch):
    from dpcli.state import ledger
    from dpcli.state.ledger import document

    init_ledger("approx", "--epsilon", "1", "--delta", "1e-5")
    emp, orders = tmp_path / "employee.csv", tmp_path / "order.csv"
    emp.write_text("uid,dept\n" + "".join(f"e{i},{'ab'[i % 2]}\n" for i in range(40)))
    orders.write_text("uid,item\n" + "".join(f"e{i % 40},x\n" for i in range(80)))
    held: list[int] = []
    real_debit = ledger.debit

    def debit_then_busy(*args, **kwargs):
        try:
            return real_debit(*args, **kwargs)
        except Exception:
            # another job of this analyst takes the ledger's lock just after the refusal (and holds it a while)
            fd = os.open(document.lock_path(state_dir, "default"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            held.append(fd)
            raise

    monkeypatch.setattr(ledger, "debit", debit_then_busy)
    try:
        r = cli("--lock-timeout", "0.2", "sql", Q, "--table", f"Employee={emp}", "--table", f"Order={orders}",
                "--privacy-unit", "Employee.uid", "--privacy-unit", "Order.uid", "--epsilon", "5", "--delta", "1e-7")
    finally:
        for fd in held:
            os.close(fd)
    assert held, "the debit was not reached (the refusal came earlier than this probe expects)"
    assert r.exit_code == 77 and "budget refused" in r.stderr, (r.exit_code, r.stderr)
