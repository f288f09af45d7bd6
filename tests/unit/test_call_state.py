"""The tracer's own-work regions nest: an inner region (a snapshot taken while a step's
contracts are evaluated) must not switch recording back on for the rest of the outer one."""

from __future__ import annotations

from producers.call_state import ThreadState


def test_own_work_regions_nest_and_restore_what_they_found():
    state = ThreadState()
    with state.own_work():
        with state.own_work():
            assert state.busy
        assert state.busy
    assert not state.busy


def test_own_work_restores_the_flag_when_the_work_raises():
    state = ThreadState()
    try:
        with state.own_work():
            raise ValueError("snapshot failed")
    except ValueError:
        pass
    assert not state.busy
