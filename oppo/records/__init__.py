"""What a run writes and how it is read, summarised and drawn: the same files for both backends.

- :mod:`~oppo.records.schema`: the record types (:class:`StepRecord`, :class:`TraceRow`, :class:`TrainedSeq`);
- :mod:`~oppo.records.optrace`: a trace kept once per operation of a device group, read row by row;
- :mod:`~oppo.records.io`: reading and writing ``steps.csv``, ``trace.csv``, ``sequences.csv``, ``summary.json``;
- :mod:`~oppo.records.metrics`: busy fractions, time per stage, MFU and the run's summary;
- :mod:`~oppo.records.perfetto`: the operations as a Perfetto timeline (``trace.json``);
- :mod:`~oppo.records.plots`: the PNGs (matplotlib, imported only by the modules that draw).

This file imports nothing: the scheduling core imports :mod:`oppo.records.schema` alone, and importing the package
for it must not pull in numpy's readers or matplotlib.
"""
