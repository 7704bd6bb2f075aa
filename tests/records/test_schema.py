"""Trained records held by column read, compare, grow and copy as a sequence of TrainedSeq does."""

import copy
import pickle

import pytest

from oppo.records.schema import TrainedColumns, TrainedSeq

A = TrainedSeq(3, 10, 10, 2, 1, 40, 12, True, 1)
B = A._replace(seq_id=11, group_id=11, response_tokens=7, finished=False)


def test_read_as_the_records_it_holds():
    t = TrainedColumns.of([A, B])
    assert len(t) == 2 and t[1] == B and t[-1] is not B and list(t) == [A, B]
    assert t[1:] == [B] and isinstance(t[1:], TrainedColumns)
    assert t.column("seq_id") == [10, 11] and t.column("finished") == [True, False]
    assert list(t.tuples()) == [tuple(A), tuple(B)]
    assert B in t and t.index(B) == 1


def test_compares_as_a_sequence_of_its_records():
    t = TrainedColumns.of([A, B])
    assert t == [A, B] and t == (A, B) and t == TrainedColumns.of((A, B))
    assert t != [A] and t != [B, A] and t != [A, B, A] and t != [A, "not a record"]
    assert TrainedColumns() == [] and TrainedColumns.of([]) == ()


def test_extend_copies_and_copy_is_independent():
    step = TrainedColumns.of([A])
    log = TrainedColumns()
    log.extend(step)
    log.extend([B])  # records one by one too
    assert log == [A, B] and step == [A]  # the step's columns are not the log's
    twin = copy.copy(log)
    twin.extend([A])
    assert len(twin) == 3 and len(log) == 2
    assert pickle.loads(pickle.dumps(log)) == log


def test_records_are_not_mistaken_for_columns():
    nine = [A._replace(seq_id=i) for i in range(len(TrainedSeq._fields))]  # as many rows as there are fields
    with pytest.raises(ValueError, match="TrainedColumns.of"):
        TrainedColumns(nine)
    with pytest.raises(ValueError, match="one length"):
        TrainedColumns([[1], [1, 2], *[[0]] * (len(TrainedSeq._fields) - 2)])
    with pytest.raises(ValueError):  # a row of another length
        TrainedColumns.of([A, (*B, 0)])
