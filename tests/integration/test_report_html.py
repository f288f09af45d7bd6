"""The HTML report on real traces, looked at the way a person would: rendered by headless Chromium.

A bundled example with a silent bug (a three-rank DDP run whose rank 1 nudges a weight
after step 12) is collected with `trainwatch collect`, `trainwatch report` draws the
page, and Chromium screenshots it: the screenshot must not be blank and must hold the
chart line and the red violation marks.  ``TRAINWATCH_UPDATE_SCREENSHOT=1`` copies it
to docs/img/report.png, the picture the README shows.  Chromium comes from
scripts/install-system-deps.sh; without it the screenshot test is skipped, or fails
when TRAINWATCH_REQUIRE_SYSTEM_DEPS=1 (CI).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.png import read_png
from tests.support.teardown import run_program

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "img" / "report.png"
WORLD, STEPS, PERTURB_RANK, PERTURB_STEP = 3, 30, 1, 12
WINDOW = (1200, 1600)

pytestmark = pytest.mark.slow


RUN_ID = "ddp-drift"


def trainwatch(*args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
    return run_program([sys.executable, "-m", "trainwatch.cli", *args], env=env, cwd=cwd, timeout=timeout)


def require_chromium() -> str:
    path = shutil.which("chromium")
    if path:
        return path
    reason = "chromium is not installed (bash scripts/install-system-deps.sh installs it)"
    if os.environ.get("TRAINWATCH_REQUIRE_SYSTEM_DEPS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWATCH_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
    return env


@pytest.fixture(scope="module")
def drifted_run(tmp_path_factory, env) -> Path:
    out = tmp_path_factory.mktemp("report") / "drifted"
    result = trainwatch("collect", "-o", str(out), "--run-id", RUN_ID, "--", sys.executable, "-m", "torch.distributed.run",
                        "--nproc-per-node", str(WORLD), "examples/ddp_gloo.py", "--steps", str(STEPS), "--seed", "1",
                        "--perturb-rank", str(PERTURB_RANK), "--perturb-step", str(PERTURB_STEP), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.fixture(scope="module")
def drifted_page(drifted_run, env) -> Path:
    # relative paths, so that the page (and the README's picture of it) names no temporary folder
    result = trainwatch("report", drifted_run.name, "-o", "report.html", env=env, cwd=drifted_run.parent)
    assert result.returncode == 1, result.stdout + result.stderr  # check's code for violations
    assert result.stdout.startswith(f"VIOLATION at step {PERTURB_STEP + 1} (run {RUN_ID}, ranks [{PERTURB_RANK}]")
    assert result.stdout.rstrip().endswith("report: report.html")
    return drifted_run.parent / "report.html"


def test_report_page_shows_signals_marks_and_the_rank_that_drifted(drifted_page):
    page = drifted_page.read_text(encoding="utf-8")
    assert "<script" not in page and "<link" not in page and "src=" not in page  # nothing fetched, nothing run
    assert page.count("<svg") >= 4  # three signal charts and a heat grid at least
    assert "Per-step signals" in page and "Which rank disagreed" in page
    marked = STEPS - PERTURB_STEP
    assert f"{marked} step(s) with violations marked in red" in page
    # the heat grid puts rank 1 apart and ranks 0 and 2 with the majority
    assert f"rank {PERTURB_RANK}, step {PERTURB_STEP + 1}: apart from the majority" in page
    assert f"rank 0, step {PERTURB_STEP + 1}: with the majority" in page


def test_check_report_html_draws_the_same_page(drifted_run, drifted_page, env, tmp_path):
    page = tmp_path / "check.html"
    result = trainwatch("check", drifted_run.name, "--report-html", str(page), env=env, cwd=drifted_run.parent)
    assert result.returncode == 1
    assert page.read_text(encoding="utf-8") == drifted_page.read_text(encoding="utf-8")


def test_report_into_a_bad_path_fails_on_one_line(drifted_run, env, tmp_path):
    for bad in (tmp_path / "no-such-dir" / "r.html", tmp_path):
        result = trainwatch("report", str(drifted_run), "-o", str(bad), env=env)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("trainwatch report: error: ")


def test_clean_run_report_says_what_was_checked(tmp_path, env):
    traces = tmp_path / "mlp"
    collected = trainwatch("collect", "-o", str(traces), "--", sys.executable, "examples/mlp.py", "--steps", "12",
                           env=env)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    page = tmp_path / "clean.html"
    result = trainwatch("report", str(traces), "-o", str(page), env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    text = page.read_text(encoding="utf-8")
    assert "No violation" in text and "What was checked" in text
    assert "<b>12</b><span>training iterations</span>" in text
    assert "<code>Consistent</code>" in text and "no violation to mark" in text


def colour_share(pixels: np.ndarray, rgb: tuple[int, int, int], tolerance: int = 40) -> float:
    distance = np.abs(pixels[..., :3].astype(np.int16) - np.array(rgb, dtype=np.int16)).max(axis=-1)
    return float((distance <= tolerance).mean())


def test_chromium_screenshot_of_the_report_is_not_blank(drifted_page, tmp_path):
    chromium = require_chromium()
    shot = tmp_path / "report.png"
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", drifted_page.as_uri()],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    pixels = read_png(shot)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    rgb = pixels[..., :3].reshape(-1, 3)
    not_white = float((rgb.min(axis=1) < 235).mean())
    coarse = np.unique((rgb // 32).astype(np.int32) @ np.array([64, 8, 1]))
    assert not_white > 0.05, f"only {not_white:.1%} of the screenshot is not white"
    assert len(coarse) >= 12, f"only {len(coarse)} distinct colours"
    assert colour_share(pixels, (0x1F, 0x6F, 0xB2)) > 0.0005  # the chart lines
    assert colour_share(pixels, (0xC6, 0x28, 0x28)) > 0.0005  # violation marks and the drifted rank
    if os.environ.get("TRAINWATCH_UPDATE_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
