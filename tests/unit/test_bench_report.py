"""Benchmark output: the table, JSON without NaN, and plotting's one-line error."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlxd.bench import report
from mlxd.cli.main import main

ROW = {
    "concurrency": 1,
    "group": "all",
    "ok": 2,
    "failed": 0,
    "output_tok_s": 12.345,
    "ttft_p50_ms": math.nan,
    "speedup": 1.0,
}


def test_table_aligns_columns_and_shows_missing_values_as_dash() -> None:
    lines = report.table([ROW, {**ROW, "concurrency": 16, "output_tok_s": 150.0}]).splitlines()
    assert len({len(line) for line in lines}) == 1, "every line is as wide as the header"
    assert "group" not in lines[0], "a column holding only 'all' is left out"
    cells = lines[1].split()
    assert cells[:4] == ["1", "2", "0", "12.3"] and cells[cells.index("12.3") + 2] == "-"


def test_json_has_null_where_a_measurement_is_missing(tmp_path: Path) -> None:
    report.write_json(tmp_path / "r.json", report.meta(kind="http", rows=[ROW]))
    data = json.loads((tmp_path / "r.json").read_text())  # strict JSON: NaN would not parse
    assert data["rows"][0]["ttft_p50_ms"] is None and data["kind"] == "http" and data["date"]


def test_old_files_with_levels_read_as_rows(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps({"kind": "http", "levels": [ROW]}))
    assert report.read_json(tmp_path / "old.json")["rows"][0]["concurrency"] == 1


def test_plot_without_matplotlib_is_one_line_and_nonzero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report.write_json(tmp_path / "r.json", {"kind": "http", "rows": [ROW]})
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    result = CliRunner().invoke(
        main, ["bench", "plot", str(tmp_path / "r.json"), "--out", str(tmp_path / "r.png")]
    )
    assert result.exit_code == 1 and not (tmp_path / "r.png").exists()
    assert (
        result.output == "Error: plotting needs matplotlib: pip install 'mlxd[plot]' "
        "(or pip install matplotlib)\n"
    )
