"""The rollout buffer's bookkeeping by column: admission, removal of whole groups, abort and readmission."""

import pytest

from oppo.core.buffer import RolloutBuffer, SeqState


def test_fill_admits_whole_groups_of_consecutive_ids():
    b = RolloutBuffer(max_new_tokens=16, group_size=3)
    assert b.fill(2, step=0) == [0, 1, 2, 3, 4, 5] and b.groups == {0: [0, 1, 2], 1: [3, 4, 5]}
    assert b.fill(3, step=1) == [6, 7, 8] and b.group_id[6:] == [2, 2, 2] and b.admitted_step[5:7] == [0, 1]
    assert b.fill(3, step=2) == []  # full: never evicts
    assert b.seq(7) == SeqState(7, 1, 2, 0, False, None, None) and list(b.seqs) == list(range(9))


def test_a_group_leaves_with_its_last_sequence_even_given_its_own_member_list():
    b = RolloutBuffer(max_new_tokens=16, group_size=4)
    b.fill(2, step=0)
    b.finish_rank[1] = (0, 3, 1)
    b.remove(b.groups[0])  # the list remove empties as it goes
    assert b.groups == {1: [4, 5, 6, 7]} and list(b.ids) == [4, 5, 6, 7]
    assert b.finish_rank[1] is None  # dropped with the sequence: a long run admits millions
    b.remove([5, 6])
    assert b.groups == {1: [4, 7]}
    with pytest.raises(KeyError):
        b.remove([5])  # not held


def test_abort_discards_tokens_and_readmit_puts_the_group_back_at_the_end():
    b = RolloutBuffer(max_new_tokens=16, group_size=2)
    b.fill(2, step=0)
    b.generated[2], b.finished[3], b.first_version[2], b.finish_rank[3] = 5, True, 0, (0, 4, 3)
    aborted = b.groups[1]
    b.abort(aborted)
    assert list(b.ids) == [0, 1] and b.seq(2) == SeqState(2, 0, 1, 0, False, None, None)
    assert b.seq(3) == SeqState(3, 0, 1, 0, False, None, None)
    assert b.readmit([2, 3]) == [2, 3] and list(b.ids) == [0, 1, 2, 3] and b.groups[1] == [2, 3]
    with pytest.raises(KeyError):
        b.readmit([0])  # held, never aborted


def test_admission_steps_never_go_back():
    """The starvation bound (``admitted_after``) reads the admission steps as sorted by id."""
    b = RolloutBuffer(max_new_tokens=10)
    b.fill(2, step=3)
    assert b.admitted_after(2) == 0 and b.admitted_after(3) == 2
    with pytest.raises(ValueError, match="admission at step 2 after one at step 3"):
        b.fill(4, step=2)
