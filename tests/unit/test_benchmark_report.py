"""benchmarks/report.py: the dated markdown report each benchmark writes into docs/benchmarks/."""

from __future__ import annotations

import argparse
import re
import sys
from datetime import UTC, datetime

import pytest
from repo_paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from report import REPORT_DIR, Report, add_report_args  # noqa: E402


def _report(tmp_path, quick=False) -> Report:
    args = argparse.Namespace(report_dir=tmp_path, quick=quick)
    report = Report.start("cascade_attention", "Cascade vs standard", args, argv=["benchmarks/x.py", "--quick"])
    report.add("main point", point="op 16/16", ratio="6.73x", limit="11.00x", **{"std KV read GB/s": 9.87})
    report.add("main point", point="op 32/8", ratio="5.10x", limit="11.00x")
    report.note("ratio = standard / cascade")
    return report


def test_report_is_a_dated_file_with_machine_load_ratio_limit_and_rates(tmp_path):
    path = _report(tmp_path).write()
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert path == tmp_path / f"cascade_attention-{today}.md"
    text = path.read_text()
    assert text.startswith("# Cascade vs standard\n")
    assert f"- date: {today} " in text
    assert "- cpu: " in text and "logical cores" in text and "- memory: " in text
    assert "- cpu flags: " in text  # bf16 and matmul speed follow them: machines differ here
    assert re.search(
        r"load average \(1, 5, 15 min\): [\d.]+ / [\d.]+ / [\d.]+ at the start, [\d.]+ / [\d.]+ / [\d.]+ at the end",
        text,
    )
    assert "| point | ratio | limit | std KV read GB/s |" in text
    assert "| op 16/16 | 6.73x | 11.00x | 9.87 |" in text
    assert "| op 32/8 | 5.10x | 11.00x |  |" in text  # a column a row lacks stays empty
    assert "quick run" not in text
    assert "ratio = standard / cascade" in text
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_same_day_runs_do_not_overwrite_and_quick_runs_are_labelled(tmp_path):
    first, second = _report(tmp_path).write(), _report(tmp_path).write()
    assert second.name == first.name.replace(".md", "-2.md")
    quick = _report(tmp_path, quick=True).write()
    assert quick.name.endswith("-quick.md")
    assert "**quick run**" in quick.read_text()


def test_report_dir_defaults_to_docs_benchmarks():
    parser = argparse.ArgumentParser()
    add_report_args(parser)
    assert parser.parse_args([]).report_dir == REPORT_DIR == REPO / "docs" / "benchmarks"


@pytest.mark.parametrize("name", ["", "../escape", ".hidden"])
def test_report_name_must_be_a_plain_stem(tmp_path, name):
    with pytest.raises(ValueError, match="plain file stem"):
        Report.start(name, "t", argparse.Namespace(report_dir=tmp_path))
