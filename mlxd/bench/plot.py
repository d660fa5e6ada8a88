"""PNG charts of benchmark JSON: throughput and latency vs concurrency, TTFT cold vs prefix hit.

matplotlib is optional (``pip install 'mlxd[plot]'``); plots can be drawn later, elsewhere, from
the JSON files (the GPU machine has no matplotlib).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlxd.bench.stats import ALL

MISSING = "plotting needs matplotlib: pip install 'mlxd[plot]' (or pip install matplotlib)"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot(results: list[tuple[str, dict[str, Any]]], out: Path) -> None:
    """Draw ``(label, result JSON)`` pairs into one PNG at ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, never a window
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(MISSING) from None
    curves = [(label, data) for label, data in results if not _is_prefix(data)]
    prefix = [(label, data) for label, data in results if _is_prefix(data)]
    n = 2 * bool(curves) + bool(prefix)
    fig, axes = plt.subplots(1, max(n, 1), figsize=(6.5 * max(n, 1), 4.8), squeeze=False)
    panels = list(axes[0])
    if curves:
        _throughput(panels.pop(0), curves)
        _latency(panels.pop(0), curves)
    if prefix:
        _prefix(panels.pop(0), prefix)
    fig.suptitle(_title(results), fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def label_for(data: dict[str, Any], fallback: str) -> str:
    """A series name: the JSON's ``label``, else what was measured."""
    if data.get("label"):
        return str(data["label"])
    return "engine (in-process)" if data.get("kind") == "engine" else fallback


# Internal helpers


def _is_prefix(data: dict[str, Any]) -> bool:
    return data.get("scenario") == "shared-prefix"


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(str(r.get("group", ALL)), []).append(r)
    return out


def _name(label: str, group: str) -> str:
    return label if group == ALL else f"{label} [{group}]"


def _colors(curves: list[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """One color per series, the same in every panel."""
    names = [_name(label, g) for label, data in curves for g in _series(data["rows"])]
    names += ["mlx-lm BatchGenerator"]
    return {n: f"C{i % 10}" for i, n in enumerate(dict.fromkeys(names))}


def _throughput(ax: Any, curves: list[tuple[str, dict[str, Any]]]) -> None:
    colors = _colors(curves)
    for label, data in curves:
        for group, rows in _series(data["rows"]).items():
            xs, name = [r["concurrency"] for r in rows], _name(label, group)
            ax.plot(
                xs, [r["output_tok_s"] for r in rows], marker="o", label=name, color=colors[name]
            )
        if data.get("mlx_lm"):
            ys, name = data["mlx_lm"], "mlx-lm BatchGenerator"
            ax.plot(
                [y["concurrency"] for y in ys],
                [y["output_tok_s"] for y in ys],
                marker="s",
                linestyle=":",
                label=name,
                color=colors[name],
            )
    _axes(ax, "output tokens/s (all requests)", log_y=False)
    ax.set_ylim(bottom=0)


def _latency(ax: Any, curves: list[tuple[str, dict[str, Any]]]) -> None:
    colors = _colors(curves)
    for label, data in curves:
        for group, rows in _series(data["rows"]).items():
            xs, name = [r["concurrency"] for r in rows], _name(label, group)
            ax.plot(
                xs,
                [r.get("ttft_p50_ms") for r in rows],
                marker="o",
                color=colors[name],
                label=f"{name} TTFT p50",
            )
            ax.plot(
                xs,
                [r.get("itl_p50_ms") for r in rows],
                marker="x",
                linestyle="--",
                color=colors[name],
                label=f"{name} ITL p50",
            )
    _axes(ax, "latency (ms)", log_y=True)


def _prefix(ax: Any, results: list[tuple[str, dict[str, Any]]]) -> None:
    bars: list[tuple[str, float]] = []
    for label, data in results:
        low = min(r["concurrency"] for r in data["rows"])  # the cleanest TTFT: least queueing
        for r in data["rows"]:
            if r["concurrency"] == low and r.get("group") in ("cold", "hit"):
                name = f"{label}\n{r['prefix_tokens']} {r['group']}"
                bars.append((name, r.get("ttft_p50_ms") or 0.0))
    colors = ["tab:blue" if "cold" in n else "tab:green" for n, _ in bars]
    ax.bar(range(len(bars)), [v for _, v in bars], color=colors)
    ax.set_xticks(range(len(bars)), [n for n, _ in bars], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.set_title("shared prefix: cold vs cache hit", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)


def _axes(ax: Any, ylabel: str, log_y: bool) -> None:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 64, not 2^6
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _title(results: list[tuple[str, dict[str, Any]]]) -> str:
    data = results[0][1]
    what = [str(data.get(k)) for k in ("model", "date", "host") if data.get(k)]
    shape = f"prompt {data.get('prompt_tokens')} tok, output {data.get('max_tokens')} tok"
    return " | ".join([*what, shape])
