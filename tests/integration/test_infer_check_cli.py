"""`trainwatch infer` and `trainwatch check` on trace directories: exit codes, reports, damaged input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from invariants.invariant_file import dumps
from invariants.model import Invariant
from invariants.synthetic import Fault, SyntheticRun
from trainwatch.cli import main
from trainwatch.tracedir import write_trace_dir


def write_trace(directory: Path, run: SyntheticRun) -> Path:
    """One file per rank, as `trainwatch collect` writes them."""
    write_trace_dir(directory, run.batches())
    return directory


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    refs = [write_trace(root / "ref1", SyntheticRun(run="ref1", world=2, steps=8)),
            write_trace(root / "ref2", SyntheticRun(run="ref2", world=2, steps=8, seed=1))]
    inv = root / "inv.json"
    assert main(["infer", *map(str, refs), "-o", str(inv)]) == 0
    return {
        "root": root,
        "refs": refs,
        "inv": inv,
        "ok": write_trace(root / "ok", SyntheticRun(run="ok", world=2, steps=8, seed=2)),
        "bad": write_trace(root / "bad", SyntheticRun(run="bad", world=2, steps=8, seed=2, faults=[Fault("drift", 5, 1)])),
    }


def test_infer_is_deterministic_and_filters_relations(traces, tmp_path):
    again = tmp_path / "again.json"
    assert main(["infer", *map(str, reversed(traces["refs"])), "-o", str(again)]) == 0
    assert again.read_bytes() == traces["inv"].read_bytes()
    only = tmp_path / "only.json"
    assert main(["infer", str(traces["refs"][0]), "-o", str(only), "--enable-relation", "Consistent",
                 "--enable-relation", "APIArg", "--disable-relation", "APIArg"]) == 0
    relations = {inv["relation"] for inv in json.loads(only.read_text())["invariants"]}
    assert relations == {"Consistent"}


def test_infer_rejects_unknown_relation(traces, tmp_path, capsys):
    assert main(["infer", str(traces["refs"][0]), "-o", str(tmp_path / "x.json"), "--disable-relation", "Bogus"]) == 2
    assert "unknown relation 'Bogus'" in capsys.readouterr().err


def test_check_healthy_run_exits_zero(traces, capsys):
    assert main(["check", "-i", str(traces["inv"]), str(traces["ok"])]) == 0
    assert capsys.readouterr().out.startswith("OK: no violation")


def test_check_broken_run_reports_first_violation_and_writes_reports(traces, tmp_path, capsys):
    report_json, report_html = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["check", "-i", str(traces["inv"]), str(traces["bad"]), "--report-json", str(report_json),
                 "--report-html", str(report_html)])
    assert code == 1
    out = capsys.readouterr().out
    assert out.startswith("VIOLATION at step 5 (run bad, ranks [1]")
    assert "likely cause:" in out and "evidence:" in out
    report = json.loads(report_json.read_text())
    assert report["summary"]["first_violation_step"] == 5
    assert report["summary"]["violations"] == len(report["violations"]) > 0
    for v in report["violations"]:
        assert {"invariant", "relation", "description", "run", "step", "ranks", "evidence"} <= set(v)
        assert v["step"] >= 5 and v["run"] == "bad"
    page = report_html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert "http" not in page.split("<body>")[0]  # no external assets
    assert "First violation" in page and "step <b>5</b>" in page


def test_check_without_invariants_uses_shipped_default_set(traces, tmp_path):
    from invariants.invariant_file import load_default_set

    # the shipped set is regenerated from the reference pipelines; only rely on it
    # holding a cross-rank consistency rule, which the drifted replica breaks
    report = tmp_path / "default.json"
    assert main(["check", str(traces["bad"]), "--report-json", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["summary"]["invariants_checked"] == len(load_default_set())
    assert any(v["relation"] == "Consistent" and v["step"] == 5 for v in data["violations"])


def test_html_report_escapes_content(traces, tmp_path):
    hostile = write_trace(tmp_path / "hostile", SyntheticRun(run="<script>alert(1)</script>", world=2, steps=2,
                                                             faults=[Fault("missing_rank", 1, 0)]))
    page = tmp_path / "r.html"
    only_ranks = tmp_path / "ranks.json"
    only_ranks.write_text(dumps([Invariant("AllRanksReport", {})]))
    assert main(["check", "-i", str(only_ranks), str(hostile), "--report-html", str(page)]) == 1
    text = page.read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text


def test_truncated_last_record_is_reported_and_skipped(traces, tmp_path, capsys):
    damaged = write_trace(tmp_path / "torn", SyntheticRun(run="torn", world=1, steps=4, seed=2))
    trace = damaged / "rank0.twtrace"
    data = trace.read_bytes()
    trace.write_bytes(data[:-7])
    rules = tmp_path / "rules.json"
    rules.write_text(dumps([Invariant("AllRanksReport", {}), Invariant(
        "EventContain", {"form": "state", "api": "torch.optim.Optimizer.zero_grad", "attr": "grad_digest", "effect": "cleared"})]))
    assert main(["check", "-i", str(rules), str(damaged)]) == 0
    out = capsys.readouterr().out
    assert "torn last record" in out and str(trace) in out


def test_corruption_inside_a_file_names_file_and_offset(traces, tmp_path, capsys):
    damaged = write_trace(tmp_path / "corrupt", SyntheticRun(run="c", world=1, steps=4))
    trace = damaged / "rank0.twtrace"
    data = bytearray(trace.read_bytes())
    first_len = int.from_bytes(data[8:12], "big")
    second = 8 + 8 + first_len
    data[second + 8 + 3] ^= 0xFF  # flip a payload byte of the second frame: checksum mismatch
    trace.write_bytes(bytes(data))
    assert main(["check", str(damaged)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert str(trace) in err and f"offset {second}" in err


@pytest.mark.parametrize("content, words", [
    ('{"format": "trainwatch-invariants", "version": 7, "invariants": []}', "unsupported version 7"),
    ("[1, 2", "not valid JSON"),
])
def test_invalid_invariant_file_exits_two_with_one_line(traces, tmp_path, capsys, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["check", "-i", str(bad), str(traces["ok"])]) == 2
    err = capsys.readouterr().err
    assert words in err and str(bad) in err and err.count("\n") == 1


def test_missing_trace_dir_and_empty_dir_exit_two(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope")]) == 2
    assert main(["check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no such trace directory" in err and "no .twtrace files" in err


def test_console_entry_point_exit_codes(traces):
    cmd = [sys.executable, "-m", "trainwatch.cli", "check", "-i", str(traces["inv"])]
    assert subprocess.run(cmd + [str(traces["ok"])], capture_output=True).returncode == 0
    bad = subprocess.run(cmd + [str(traces["bad"])], capture_output=True, text=True)
    assert bad.returncode == 1 and "VIOLATION at step 5" in bad.stdout
    usage = subprocess.run([sys.executable, "-m", "trainwatch.cli", "check"], capture_output=True, text=True)
    assert usage.returncode == 2


def test_worker_process_files_join_their_rank_step_window(tmp_path, capsys):
    """DataLoader workers write their own trace files; their step-0 batches arrive after
    rank 0 already ended step 0 in its own file, and must still be checked."""
    from invariants.events import make_batch

    trace = write_trace(tmp_path / "workers", SyntheticRun(run="w", world=1, steps=3, workers=0, eval_every=0))
    for worker in range(2):
        event = {"kind": "call", "t": 1, "pid": 5000 + worker, "tid": 1, "stage": "train", "phase": "post", "cid": 1,
                 "name": "torch.utils.data._utils.worker._worker_loop", "api": "torch.utils.data.worker_init",
                 "parent": None, "args": {"worker_id": worker, "torch_seed": 7, "numpy_state_digest": "same"}}
        write_trace_dir(trace, [make_batch(run="w", rank=0, world=1, step=0, seq=0, events=[event])],
                        prefix=f"zz-worker{worker}-")
    rules = tmp_path / "workers.json"
    rules.write_text(dumps([Invariant("APIArg", {"form": "distinct", "api": "torch.utils.data.worker_init",
                                                 "arg": "numpy_state_digest"})]))
    report = tmp_path / "r.json"
    assert main(["check", "-i", str(rules), str(trace), "--report-json", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["summary"]["late_batches"] == 0
    assert {(v["step"], v["relation"]) for v in data["violations"]} == {(0, "APIArg")}
    assert "never repeats" in capsys.readouterr().out
