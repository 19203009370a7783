"""Inputs and outputs: opening files once (:mod:`~dpcli.io.opening`), reading them
(:mod:`~dpcli.io.inputs`, :mod:`~dpcli.io.ndjson`), and writing results (:mod:`~dpcli.io.outputs`)."""
