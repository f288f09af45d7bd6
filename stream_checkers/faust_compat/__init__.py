"""Where the checker reaches into Faust and aiokafka, and nowhere else.

Faust has no public hook for three things the checker needs: recovery that reads a
changelog to the broker's real end (`transport`), offset commits capped by what the
agent has really handled (`transport`, `commit_gates`, `input_order`), and a fetch
that stopped delivering records (`stall_guard`).  Those overrides use private members,
so they live here together: pyproject.toml bounds faust-streaming and aiokafka to the
releases they were written against, and tests/unit/test_faust_compat.py checks each member
by name.
"""
