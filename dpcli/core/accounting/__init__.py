"""Privacy accounting, in one place: a ledger's limits and spend (:mod:`~dpcli.core.accounting.budget`),
one accountant per mode (:mod:`~dpcli.core.accounting.accountants`), and the conversions and
composition theorems they use (:mod:`~dpcli.core.accounting.composition`), all in exact arithmetic
where a limit is compared."""
