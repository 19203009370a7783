"""Continual DP histograms over a timestamped stream (DP-SQLP, paper 001), split by concern.

* :mod:`.query`: the public parameters of a release and their limits;
* :mod:`.plan`: the privacy split and the calibration of every tree (no data);
* :mod:`.events`: records → bounded events in time order (drops, per-unit cap);
* :mod:`.algorithm`: the windows, their keys' trees and triggers (Alg. 2-4);
* :mod:`.run`: a whole replay, or one incremental advance of a persisted stream;
* :mod:`.state`: the JSON codec of a stream's state and the ``--state`` document body;
* :mod:`.task`: a whole replay as a :class:`dpcli.tasks.Task` (runs against a ``--state`` file:
  :mod:`dpcli.release.streams`).

:mod:`dpcli.tasks.stream_replay` re-exports the public names.
"""
