"""``dpcli plot``: pictures of what was released (never of true values, which dpcli does not keep).

* :mod:`~dpcli.plot.release_view`: read a release file dpcli wrote and recognise what it holds;
* :mod:`~dpcli.plot.budget_view`: a ledger's spending over time;
* :mod:`~dpcli.plot.terminal`: the same pictures as text, for a terminal;
* :mod:`~dpcli.plot.figure`: PNG and SVG with matplotlib (the ``plot`` extra), deterministic SVG.
"""
