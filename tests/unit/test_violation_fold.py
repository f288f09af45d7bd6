"""The console folding of repeated violations (presentation only; no broker needed)."""

from stream_checkers.console.violation_fold import RepeatFolder


def _violation(step: int, invariant: str = "inv-a", relation: str = "Consistent") -> dict:
    return {"id": f"{invariant}:{step}", "run": "r", "step": step, "ranks": [0, 1], "relation": relation,
            "invariant": invariant, "description": f"rule {invariant}"}


def test_first_violation_in_full_then_reminders_at_powers_of_two():
    folder = RepeatFolder()
    printed = {step: folder.lines_for(_violation(step)) for step in range(3, 23)}  # 20 violating steps
    assert printed[3][0].startswith("VIOLATION run=r step=3 ranks=0,1 [Consistent] rule inv-a")
    reminders = [step for step, lines in printed.items() if lines and step != 3]
    assert reminders == [4, 6, 10, 18]  # the 2nd, 4th, 8th and 16th violating step
    assert "still violated: 16 steps since step 3" in printed[18][0]
    assert sum(len(lines) for lines in printed.values()) == 5
    assert folder.folded() == 15


def test_each_invariant_is_folded_on_its_own_and_rolled_up_in_order_of_first_step():
    folder = RepeatFolder()
    counts = [len(folder.lines_for(_violation(step, "inv-late", "APISequence"))) for step in range(5, 8)]
    assert counts == [1, 1, 0]  # in full, the 2nd step's reminder, folded
    first_b = folder.lines_for(_violation(2, "inv-early"))
    assert first_b and "step=2" in first_b[0]
    rollup = folder.rollup()
    assert len(rollup) == 2
    assert "1 step(s), step 2: [Consistent] rule inv-early" in rollup[0]
    assert "3 step(s), steps 5-7: [APISequence] rule inv-late" in rollup[1]


def test_unfolded_prints_every_violation():
    folder = RepeatFolder(fold=False)
    assert all(len(folder.lines_for(_violation(step))) == 1 for step in range(10))
    assert folder.folded() == 0
    assert "10 step(s), steps 0-9" in folder.rollup()[0]


def test_reminders_of_one_step_share_a_line():
    folder = RepeatFolder()
    rules = ["inv-a", "inv-b", "inv-c"]
    first = folder.lines_for_step([_violation(3, r) for r in rules])
    assert len(first) == 3 and all("still violated" not in line for line in first)
    second = folder.lines_for_step([_violation(4, r) for r in rules])
    assert len(second) == 1
    assert "step=4" in second[0] and "still violated: 3 invariants, 2 steps each since step 3" in second[0]
    assert folder.lines_for_step([_violation(5, r) for r in rules]) == []


def test_an_earlier_step_arriving_late_is_printed_in_full_as_the_onset():
    folder = RepeatFolder()
    assert "step=4" in folder.lines_for(_violation(4))[0]
    late_onset = folder.lines_for(_violation(3))
    assert len(late_onset) == 1 and "step=3" in late_onset[0] and "still violated" not in late_onset[0]
    assert "steps 3-4" in folder.rollup()[0]
    assert folder.folded() == 0
