"""Pure unit tests of the HTML report's pictures (SVG charts, heat grids, sections, the page) and of the
PNG reader that judges its screenshot."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

from invariants.coverage import Coverage
from invariants.events import make_batch
from invariants.model import Violation
from invariants.report import CheckSummary
from invariants.report_html import render_html
from invariants.report_sections import checked_section, rank_grids, signals_section
from invariants.report_svg import MAX_POINTS, RankGrid, Series, line_chart, rank_heatmap
from invariants.step_summary import StepSeries, StepSummary

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "<script>alert('x')</script>&\""


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    assert root.tag == f"{SVG}svg"
    return root


def marks(root: ET.Element, tag: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{SVG}{tag}") if e.get("class") == "mark"]


def test_line_chart_marks_each_violation_step_on_the_line():
    points = [(s, 1.0 / s) for s in range(1, 21)]
    root = parse(line_chart(Series("loss", points), [5, 12]))
    rules, dots = marks(root, "line"), marks(root, "circle")
    assert len(rules) == 2 and len(dots) == 2
    # each dot sits on its rule, and the rules are at the marked steps, in order
    assert [r.get("x1") for r in rules] == [d.get("cx") for d in dots]
    assert float(rules[0].get("x1")) < float(rules[1].get("x1"))
    assert {d.find(f"{SVG}title").text.split(":")[0] for d in dots} == {"step 5", "step 12"}
    polyline = root.find(f"{SVG}polyline")
    assert len(polyline.get("points").split()) == 20


def test_nonfinite_values_break_the_line_and_are_flagged_on_top():
    points = [(1, 1.0), (2, 2.0), (3, math.nan), (4, math.inf), (5, 1.5), (6, 1.0)]
    root = parse(line_chart(Series("gradient norm", points, log=True), []))
    flagged = [e for e in root.iter(f"{SVG}path") if e.get("class") == "nonfinite"]
    assert [e.find(f"{SVG}title").text for e in flagged] == ["step 3: nan", "step 4: inf"]
    assert len(root.findall(f"{SVG}polyline")) == 2


def test_log_scale_keeps_zeros_below_the_smallest_value():
    root = parse(line_chart(Series("update ratio", [(1, 1e-3), (2, 0.0), (3, 1e-1)], log=True), [2]))
    dot = marks(root, "circle")[0]
    ys = [float(p.split(",")[1]) for p in root.find(f"{SVG}polyline").get("points").split()]
    assert float(dot.get("cy")) == max(ys)  # lowest on the chart
    assert "log scale" in "".join(root.itertext())


def test_long_series_is_thinned_but_keeps_its_marks():
    points = [(s, float(s % 7)) for s in range(10_000)]
    root = parse(line_chart(Series("loss", points), [4321]))
    assert len(root.find(f"{SVG}polyline").get("points").split()) <= MAX_POINTS + 2
    assert len(marks(root, "circle")) == 1


def test_a_rule_violated_on_every_step_is_one_band_not_thousands_of_marks():
    points = [(s, 1.0 + s % 3) for s in range(20_000)]
    svg = line_chart(Series("loss", points), range(5_000, 20_000))
    root = parse(svg)
    bands = marks(root, "rect")
    assert len(bands) == 1 and bands[0].find(f"{SVG}title").text == "violations at steps 5000..19999"
    assert len(marks(root, "line")) == 0 and len(svg) < 60_000


def test_empty_series_says_so():
    root = parse(line_chart(Series("loss", []), []))
    assert "not recorded" in "".join(root.itertext())


def test_hostile_text_is_escaped_in_charts_and_grids():
    chart = line_chart(Series(HOSTILE, [(1, 1.0), (2, 2.0)]), [2])
    grid = rank_heatmap(RankGrid(HOSTILE, ranks=[0, 1], steps=[3], cells={(0, 3): 0.0, (1, 3): 1.0},
                                 notes={(1, 3): HOSTILE}))
    for svg in (chart, grid):
        assert "<script" not in svg and "&lt;script&gt;" in svg
        assert HOSTILE in "".join(parse(svg).itertext()) or HOSTILE in parse(svg).get("aria-label")


def replica_violation(step: int, norms: dict[str, float], odd: list[int], run: str = "r") -> Violation:
    values = {rank: ("odd" if int(rank) in odd else "same") for rank in norms}
    return Violation(invariant="inv-ranks", relation="Consistent", description="replicas agree", run=run, step=step,
                     ranks=odd, stage="train", hint="",
                     evidence={"first": {"variable": "fc.weight", "attr": "data_digest", "values_by_rank": values,
                                         "data_norm_by_rank": norms}})


def test_rank_grid_shades_the_rank_that_walked_away():
    violations = [replica_violation(step, {"0": 2.0, "1": 2.0 + 0.1 * step, "2": 2.0}, [1]) for step in (4, 5, 6)]
    violations.append(Violation(invariant="inv-all", relation="AllRanksReport", description="every rank reports",
                                run="r", step=7, ranks=[2], stage="train", hint="",
                                evidence={"first": {"world": 3, "missing": [2], "reported": [0, 1]}}))
    grid, missing = rank_grids(violations)
    assert grid.ranks == [0, 1, 2] and grid.steps == [4, 5, 6]
    assert all(grid.cells[(rank, step)] == 0.0 for rank in (0, 2) for step in grid.steps)
    assert 0 < grid.cells[(1, 4)] < grid.cells[(1, 5)] < grid.cells[(1, 6)] == 1.0
    assert "fc.weight" in grid.title
    assert missing.cells == {(0, 7): 0.0, (1, 7): 0.0, (2, 7): 1.0}
    parse(rank_heatmap(grid))


def test_rank_grid_ignores_evidence_it_cannot_read():
    odd = replica_violation(3, {"0": "many", "1": 1.0}, [1])
    odd.evidence["first"]["values_by_rank"]["x"] = "?"
    odd.evidence["first"]["data_norm_by_rank"]["x"] = None
    grid, = rank_grids([odd, Violation("i", "APISequence", "d", "r", 3, [0], "train", {"first": {}}, "")])
    assert grid.ranks == [0, 1] and grid.cells[(1, 3)] > 0 and grid.cells[(0, 3)] == 0.0


def step(run: str, n: int, loss: float) -> StepSummary:
    return StepSummary(run=run, step=n, loss=loss, grad_norm=1.0 / n, update_ratio=1e-3, ranks=(0, 1))


def test_signals_section_draws_three_charts_per_run_with_its_own_marks():
    steps = [step("a", n, 1.0 / n) for n in range(1, 10)] + [step("b", n, 2.0) for n in range(1, 10)]
    html = signals_section(steps, [replica_violation(4, {"0": 1.0, "1": 2.0}, [1], run="a")])
    charts = re.findall(r"<svg.*?</svg>", html)
    assert len(charts) == 6
    assert [len(marks(parse(c), "line")) for c in charts] == [1, 1, 1, 0, 0, 0]


def test_checked_section_lists_rules_by_relation_steps_and_ranks():
    html = checked_section({"Consistent": 3, "APISequence": 1, HOSTILE: 1}, Coverage(), 12)
    assert "What was checked" in html and "<b>5</b>" in html and "<b>12</b>" in html
    assert html.index("Consistent") < html.index("APISequence")
    assert "<script" not in html


def test_clean_page_shows_what_was_checked_and_the_signals():
    summary = CheckSummary(invariants=4, runs=["r"], windows=9, rules_by_relation={"Consistent": 4},
                           steps=[step("r", n, 1.0 / n) for n in range(1, 10)])
    page = render_html([], summary)
    assert "What was checked" in page and "Per-step signals" in page
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")
    for svg in re.findall(r"<svg.*?</svg>", page):
        parse(svg)


def test_violation_page_escapes_hostile_names_everywhere():
    bad = replica_violation(2, {"0": 1.0, "1": 1.5, "2": 1.0}, [1], run=HOSTILE)
    bad.evidence["first"]["variable"] = HOSTILE
    summary = CheckSummary(runs=[HOSTILE], rules_by_relation={"Consistent": 1},
                           steps=[step(HOSTILE, n, 1.0) for n in range(1, 4)])
    page = render_html([bad], summary)
    assert "<script" not in page and "&lt;script&gt;" in page
    assert "Which rank disagreed" in page and "First violation" in page
    for svg in re.findall(r"<svg.*?</svg>", page):
        parse(svg)


def _batch(step_no: int, loss: float, seq: int) -> dict:
    events = [{"kind": "call", "t": 1, "pid": 1, "tid": 1, "stage": "train", "name": "torch.Tensor.backward",
               "api": "torch.Tensor.backward", "phase": "pre", "cid": 1,
               "args": {"self": {"T": "tensor", "shape": [], "dtype": "float32", "value": loss}}},
              {"kind": "step", "t": 1, "pid": 1, "tid": 1, "stage": "train", "phase": "end"}]
    return make_batch(run="r", rank=0, world=1, step=step_no, seq=seq, events=events)


def test_step_series_summarises_every_step_once_and_drops_late_batches():
    series = StepSeries()
    for seq, (n, loss) in enumerate([(1, 3.0), (2, 2.0), (3, 1.0), (1, 99.0), (4, 0.5)]):
        series.add_batch(_batch(n, loss, seq))
    got = series.summaries()
    assert [(s.step, s.loss) for s in got] == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.5)]


def _png(pixels, filters: list[int]) -> bytes:
    """A PNG whose rows use the given filters (the encoder side of `tests.support.png`)."""
    import struct
    import zlib

    height, width, bpp = pixels.shape
    rows, prev = [], [0] * (width * bpp)
    for y in range(height):
        line = pixels[y].reshape(-1).tolist()
        kind = filters[y % len(filters)]
        out = []
        for x, value in enumerate(line):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            p = a + b - c
            paeth = a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else (b if abs(p - b) <= abs(p - c) else c)
            out.append((value - (0, a, b, (a + b) >> 1, paeth)[kind]) & 255)
        rows.append(bytes([kind, *out]))
        prev = line

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2 if bpp == 3 else 6, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
            + chunk(b"IEND", b""))


def test_png_reader_undoes_every_row_filter(tmp_path):
    import numpy as np

    from tests.support.png import read_png

    for bpp in (3, 4):
        pixels = np.random.default_rng(bpp).integers(0, 256, size=(10, 7, bpp), dtype=np.uint8)
        path = tmp_path / f"{bpp}.png"
        path.write_bytes(_png(pixels, [0, 1, 2, 3, 4]))
        assert np.array_equal(read_png(path), pixels)
