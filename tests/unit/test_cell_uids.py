"""The host uids a root harness's served cells take: the reserved range, what overrides it,
and that a range holding a real user or group, or crossing a subordinate id range, is refused
with the reason (the cells are then ``nobody``, as under bubblewrap)."""

from __future__ import annotations

import os
import pwd

from cumatrix.core.options import CELL_UIDS, uid_range
from cumatrix.execute import forkserver


def test_the_range_is_the_reserved_one_unless_the_environment_names_a_valid_one() -> None:
    assert uid_range({}) == CELL_UIDS
    assert uid_range({"CUMATRIX_SANDBOX_UIDS": "3000000000:16"}) == (3_000_000_000, 16)
    for bad in ("", "x:1", "5", "0:10", "10:0", "4294967290:100", "-5:10"):
        assert uid_range({"CUMATRIX_SANDBOX_UIDS": bad}) == CELL_UIDS, bad
    low, count = CELL_UIDS
    assert low > 1_879_048_191  # above the containers' ranges
    assert low + count - 1 < 2**31  # below what some tools read as negative


def test_a_range_holding_a_real_user_is_refused_and_says_whose_id() -> None:
    me = pwd.getpwuid(os.getuid())
    ids, why = forkserver._check_uids((me.pw_uid, 1))
    assert ids is None
    assert why is not None
    assert me.pw_name in why
    assert str(me.pw_uid) in why


def test_the_reserved_range_is_free_here() -> None:
    ids, why = forkserver._check_uids(CELL_UIDS)
    assert why is None, why
    assert ids == CELL_UIDS
