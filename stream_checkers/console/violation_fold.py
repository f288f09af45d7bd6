"""Which violations a live console shows, so that a persistent bug stays readable.

A silent error rarely breaks one rule once: replicas that drift apart at step 3 violate
the same five cross-rank rules at every step after it.  Printing each (invariant, step)
pair buries the first, most useful line under hundreds of repeats.  The console shows
the first violation of every invariant in full, then a short reminder when the count
of violating steps reaches 2, 4, 8, 16, ... (so a run with a persistent bug prints
O(log steps) lines per invariant; reminders of one step share a line), and a
per-invariant roll-up at the end.  Nothing
is dropped from the violations topic or the metrics: this is presentation only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..report import violation_line


@dataclass
class InvariantTally:
    """What the console has seen of one invariant in one run."""

    first: dict[str, Any]
    steps: int = 0
    first_step: int = 0
    last_step: int = 0
    shown: int = 0  # violations of this invariant that got a line (full or reminder)


def _step(violation: dict[str, Any]) -> int:
    step = violation.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else 0


_REMINDER_MARK = "repeats are folded"


def _rule_key(violation: dict[str, Any]) -> str:
    return str(violation.get("invariant") or violation.get("relation") or "?")


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class RepeatFolder:
    """Turns a stream of (deduplicated) violations into console lines."""

    def __init__(self, *, fold: bool = True) -> None:
        self.fold = fold
        self.tallies: dict[str, InvariantTally] = {}

    def lines_for(self, violation: dict[str, Any]) -> list[str]:
        """Lines to print for one newly seen violation (possibly none)."""
        step = _step(violation)
        key = _rule_key(violation)
        tally = self.tallies.get(key)
        if tally is None:
            self.tallies[key] = InvariantTally(violation, 1, step, step, shown=1)
            return [violation_line(violation)]
        tally.steps += 1
        tally.last_step = max(tally.last_step, step)
        if step < tally.first_step or not self.fold:
            # Windows close out of order across partitions: an earlier step arriving
            # late is the invariant's real onset, the most useful line of all.
            if step < tally.first_step:
                tally.first, tally.first_step = violation, step
            tally.shown += 1
            return [violation_line(violation)]
        if not _is_power_of_two(tally.steps):
            return []
        tally.shown += 1
        return [self._reminder(violation)]

    def lines_for_step(self, violations: list[dict[str, Any]]) -> list[str]:
        """Lines for the newly seen violations of one step: reminders share one line."""
        lines: list[str] = []
        reminded: list[dict[str, Any]] = []
        for violation in violations:
            for line in self.lines_for(violation):
                if line.endswith(f"{_REMINDER_MARK})"):
                    reminded.append(violation)
                else:
                    lines.append(line)
        if len(reminded) == 1:
            lines.append(self._reminder(reminded[0]))
        elif reminded:
            lines.append(self._shared_reminder(reminded))
        return lines

    def _reminder(self, violation: dict[str, Any]) -> str:
        tally = self.tallies[_rule_key(violation)]
        kind = "TREND" if str(violation.get("relation", "")).startswith("Trend:") else "VIOLATION"
        ranks = ",".join(str(r) for r in violation.get("ranks") or []) or "-"
        return (f"{kind} run={violation.get('run')} step={_step(violation)} ranks={ranks} "
                f"[{violation.get('relation')}] still violated: {tally.steps} steps since step "
                f"{tally.first_step} (invariant {_rule_key(violation)}; {_REMINDER_MARK})")

    def _shared_reminder(self, violations: list[dict[str, Any]]) -> str:
        tallies = [self.tallies[_rule_key(v)] for v in violations]
        counts = sorted({t.steps for t in tallies})
        steps = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        relations = ",".join(sorted({str(v.get("relation")) for v in violations}))
        ranks = sorted({r for v in violations for r in (v.get("ranks") or [])})
        first = violations[0]
        return (f"VIOLATION run={first.get('run')} step={_step(first)} ranks={','.join(map(str, ranks)) or '-'} "
                f"[{relations}] still violated: {len(violations)} invariants, {steps} steps each since step "
                f"{min(t.first_step for t in tallies)} ({_REMINDER_MARK})")

    def folded(self) -> int:
        """How many violations were not printed live."""
        return sum(t.steps - t.shown for t in self.tallies.values())

    def rollup(self) -> list[str]:
        """One line per violated invariant, the earliest first."""
        ordered = sorted(self.tallies.values(), key=lambda t: (t.first_step, str(t.first.get("relation"))))
        lines = []
        for tally in ordered:
            span = f"step {tally.first_step}" if tally.steps == 1 else \
                f"steps {tally.first_step}-{tally.last_step}"
            description = str(tally.first.get("description") or "").strip()
            lines.append(f"  {tally.steps:>4} step(s), {span}: [{tally.first.get('relation')}] {description} "
                         f"(invariant {_rule_key(tally.first)})")
        return lines
