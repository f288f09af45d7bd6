"""What every relation template provides (`view` is the window they all read).

A template turns a closed window into *sites*: places where one of its hypotheses
can be tested.  The same sites feed inference (count positive/negative examples per
hypothesis) and checking (look up the deployed invariants of that site's family and
report the ones that fail while their precondition holds), so the two can never
disagree about what a rule means.  Which of the two a call serves is its *mode*:
`INFER`, or a `Checking` holding the deployed families and their check plan.

Two kinds of site:

* a **boolean** site tests one hypothesis family directly: ``observed`` is True when
  the relation held there ("param X is equal on all ranks");
* a **value** site reports which values were observed (``observed`` is a frozenset):
  every value is its own hypothesis ("``Adam.step`` contains ``all_reduce``"), and a
  site is a negative example for every hypothesis of the family whose value is
  absent.  This is what lets inference see negatives for hypotheses it has not
  created yet, so merging traces stays order-independent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator, Mapping, Union

from ..precondition import needs_records
from ..window import FactPlan
from .view import Record, WindowView

@dataclass(slots=True)
class Site:
    """One testable place.  Hot loops build sites positionally: a keyword call costs
    about twice as much, and checking builds one per failing variable or call."""

    family: tuple
    observed: Any  # bool for boolean sites, frozenset for value sites
    #: the example's records, or a zero-argument function building them: checking
    #: only needs them where a rule failed, so most sites never build any
    records: Any
    ranks: list[int]
    stage: str
    #: what a violation at this site reports, or a zero-argument function building it:
    #: most failing sites are rejected by a precondition or exceed the evidence kept
    evidence: Any = field(default_factory=dict)
    #: template-private detail for `Template.applicable` (e.g. which variables exist)
    context: Any = None

    def get_records(self) -> list[Record]:
        if callable(self.records):
            self.records = self.records()
        return self.records

    def get_evidence(self) -> dict[str, Any]:
        if callable(self.evidence):
            self.evidence = self.evidence()
        return self.evidence


class Lazy:
    """Records built at most once, however many sites share them (a variable's effects,
    a call's properties).  A slotted callable: cheaper to create than a closure, and
    inference creates one per variable or call."""

    __slots__ = ("_build", "_records")

    def __init__(self, build: Callable[[], list[Record]]) -> None:
        self._build: Callable[[], list[Record]] | None = build
        self._records: list[Record] = []

    def __call__(self) -> list[Record]:
        if self._build is not None:
            self._records = self._build()
            self._build = None
        return self._records


@dataclass(frozen=True, slots=True)
class Inferring:
    """Inference: every family is wanted, and a site that holds is a positive example,
    so none may be skipped."""

    checking: ClassVar[bool] = False
    families: ClassVar[None] = None
    plan: ClassVar[None] = None

    def wants(self, family: tuple) -> bool:
        return True


INFER = Inferring()


@dataclass(frozen=True, slots=True)
class Checking:
    """Checking against deployed rules: only their families are wanted, and a boolean
    site that holds may be skipped, since no rule can fail there.

    Built once per invariant set and template (`of`): the plan holds what the families
    alone determine, so windows never rebuild it.  Hot loops read ``checking`` and
    ``families`` into locals instead of calling `wants` per site.
    """

    #: deployed family -> its compiled rules
    families: Mapping[tuple, Any]
    #: `Template.check_plan` of ``families``
    plan: Any

    checking: ClassVar[bool] = True

    @classmethod
    def of(cls, template: "Template", families: Mapping[tuple, Any]) -> "Checking":
        return cls(families, template.check_plan(families))

    def wants(self, family: tuple) -> bool:
        return family in self.families


Mode = Union[Inferring, Checking]


def reportable(families: Mapping[tuple, Any], family: tuple, records: list[Record]) -> bool:
    """Whether a deployed rule of a *boolean* family can report a site that failed it
    with these records: a failing boolean site is reported exactly where a rule's
    precondition accepts it.  Checking drops the others before building a site (on a
    healthy run, every parameter of an optimizer step fails "gradient cleared" and is
    excused by ``grad_nonzero = False``); the engine judges the kept ones as usual."""
    for compiled in families.get(family, ()):
        if not needs_records(compiled.predicate) or compiled.predicate(records):
            return True
    return False


class Template:
    """Base class of relation templates; subclasses fill in the hooks."""

    relation = ""
    min_support = 2
    #: value families must occur in at least this fraction of a trace's steps (per rank)
    #: in every trace where they occur at all (0 = no requirement)
    min_window_fraction = 0.0
    #: record fields inference may build preconditions from (None = all of them)
    inference_fields: frozenset[str] | None = None

    def windows_counted(self, view: "WindowView") -> int:
        """Rank-windows of this window that count towards ``min_window_fraction``."""
        return len(view.ranks())

    def sites(self, view: WindowView, mode: Mode) -> Iterator[Site]:
        """Every testable site ``mode`` wants (`INFER`: all of them; `Checking`: those
        of its families, less the boolean ones that held)."""
        return iter(())

    def check_plan(self, families: Any) -> Any:
        """Lookups derived from the deployed families alone (which APIs, pairs, points
        they name), kept in `Checking.plan` so that checking does not rebuild them for
        every window.  Nothing in a plan may depend on a window."""
        return None

    def is_value_family(self, family: tuple) -> bool:
        return False

    def allows_precondition(self, family: tuple) -> bool:
        return True

    def params(self, family: tuple, value: Any) -> dict[str, Any]:
        raise NotImplementedError

    def key(self, params: Mapping[str, Any]) -> tuple[tuple, Any]:
        """(family, value) of a deployed invariant; value None for boolean families."""
        raise NotImplementedError

    def needs(self, params: Mapping[str, Any]) -> FactPlan:
        raise NotImplementedError

    def apis(self, params: Mapping[str, Any]) -> list[str]:
        return sorted({v for k, v in params.items() if k in ("api", "child", "first", "then") and isinstance(v, str)})

    def describe(self, params: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def hint(self, params: Mapping[str, Any]) -> str:
        return ""

    def validate_params(self, params: Mapping[str, Any]) -> str | None:
        """None if well-formed, else the name of the first bad field."""
        try:
            self.key(params)
            self.describe(params)
        except (KeyError, TypeError, ValueError) as exc:
            return str(exc.args[0]) if exc.args else "params"
        return None

    def holds(self, value: Any, site: Site) -> bool:
        """Whether the value-family hypothesis ``value`` held at ``site``."""
        return value in site.observed

    def keeps_hypothesis(self, params: Mapping[str, Any]) -> bool:
        """Inference-time filter on an otherwise valid hypothesis."""
        return True

    def applicable(self, value: Any, site: Site) -> bool:
        """Whether a value-family hypothesis can be judged at this site at all."""
        return True

    def violation_evidence(self, params: Mapping[str, Any], site: Site) -> dict[str, Any]:
        return site.get_evidence()

    #: True for templates whose rules are not counted from sites but learned from
    #: whole-run observations (`infer_observe` per window, `infer_finish` at the end):
    #: "never after step K" needs the run's extent, not a per-site tally.
    custom_inference = False

    def infer_observe(self, view: WindowView, store: dict[str, Any]) -> None:
        """Record what this window says about the template's run-level hypotheses."""

    def infer_finish(self, store: dict[str, Any]) -> list[Any]:
        """The invariants the observations of `infer_observe` support."""
        return []
