"""Present benchmark results: text tables, the JSON file and the PNG bar chart."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.timing import Measurement
from benchmarks.writespeed import WriteResult

__all__ = [
    "MEASUREMENT_HEADERS",
    "WRITE_HEADERS",
    "best_per_loader",
    "format_table",
    "measurement_rows",
    "ratio_to_raw",
    "write_chart",
    "write_json",
    "write_rows",
]

RAW_LIMIT = "raw-limit"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Align columns: the first left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells: Sequence[str]) -> str:
        parts = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def ratio_to_raw(measurement: Measurement, measurements: Sequence[Measurement]) -> float | None:
    """samples/s of ``measurement`` divided by the raw limit's on the same workload."""
    for m in measurements:
        if m.loader == RAW_LIMIT and m.workload == measurement.workload and m.seconds:
            return measurement.samples_per_second / m.samples_per_second
    return None


def best_per_loader(measurements: Sequence[Measurement]) -> list[Measurement]:
    """For each loader, its fastest configuration (by median samples/s), fastest first."""
    best: dict[str, Measurement] = {}
    for m in measurements:
        if m.seconds and (m.loader not in best or m.samples_per_second > best[m.loader].samples_per_second):
            best[m.loader] = m
    return sorted(best.values(), key=lambda m: -m.samples_per_second)


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def measurement_rows(measurements: Sequence[Measurement], everything: Sequence[Measurement]) -> list[list[str]]:
    """Rows for :data:`MEASUREMENT_HEADERS`."""
    rows = []
    for m in measurements:
        ratio = ratio_to_raw(m, everything)
        rows.append([
            m.loader,
            "-" if m.workers is None else str(m.workers),
            f"{m.samples_per_second:,.0f}",
            f"{m.median_seconds:.2f}",
            "-" if ratio is None else f"{ratio:.3f}",
            _mb(m.disk_bytes),
            "yes" if m.complete else "NO",
        ])
    return rows


MEASUREMENT_HEADERS = ["loader", "workers", "samples/s", "epoch s", "x raw limit", "disk MB", "all samples"]


def write_rows(results: Sequence[WriteResult]) -> list[list[str]]:
    """Rows for :data:`WRITE_HEADERS`: one per workload and writer."""
    rows = []
    for r in results:
        rates = r.rates()
        for who, key in (("write_record", "torchrecord"), ("raw LMDB append", "raw_lmdb")):
            rows.append([
                r.workload,
                who,
                f"{rates[key + '_samples_per_second']:,.0f}",
                f"{rates[key + '_mb_per_second']:,.1f}",
                f"{getattr(r, key + '_seconds'):.2f}",
            ])
    return rows


WRITE_HEADERS = ["workload", "writer", "samples/s", "MB/s", "seconds"]


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON, atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def _side_text(machine: dict[str, Any], versions: dict[str, str], config: dict[str, Any]) -> str:
    lines = ["machine"]
    lines += [f"  {k}: {v}" for k, v in machine.items()]
    lines += ["", "versions"]
    lines += [f"  {k}: {v}" for k, v in versions.items()]
    lines += ["", "settings"]
    lines += [f"  {k}: {v}" for k, v in config.items()]
    return "\n".join(lines)


def write_chart(
    path: Path,
    workloads: Sequence[tuple[str, Sequence[Measurement]]],
    machine: dict[str, Any],
    versions: dict[str, str],
    config: dict[str, Any],
) -> str | None:
    """Draw one log-scale bar panel per workload (every configuration), machine info beside them.

    Returns why no chart was drawn (matplotlib missing), or ``None``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no chart"
    panels = [(name, [m for m in ms if m.seconds]) for name, ms in workloads]
    panels = [(name, ms) for name, ms in panels if ms]
    if not panels:
        return "nothing was measured: no chart"
    heights = [max(2.0, 0.32 * len(ms) + 1.0) for _, ms in panels]
    fig = plt.figure(figsize=(15, sum(heights) + 0.5))
    grid = fig.add_gridspec(len(panels), 2, width_ratios=[3, 1], height_ratios=heights)
    colors = {None: "0.55", 0: "tab:blue", 2: "tab:orange", 4: "tab:green"}
    for row, (name, ms) in enumerate(panels):
        ax = fig.add_subplot(grid[row, 0])
        labels = [m.label for m in ms]
        values = [m.samples_per_second for m in ms]
        bar_colors = [colors.get(m.workers, "tab:purple") for m in ms]
        positions = range(len(ms))
        ax.barh(positions, values, color=bar_colors)
        ax.set_yticks(list(positions), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("samples/s (median of epochs, log scale)")
        ax.set_title(name, loc="left", fontsize=10)
        for y, m in enumerate(ms):
            ratio = ratio_to_raw(m, ms)
            note = f"{m.samples_per_second:,.0f}" + ("" if ratio is None else f"  ({ratio:.2f}x raw)")
            ax.text(m.samples_per_second, y, " " + note, va="center", fontsize=7)
        ax.set_xlim(right=max(values) * 8)
    text_ax = fig.add_subplot(grid[:, 1])
    text_ax.axis("off")
    text_ax.text(0, 1, _side_text(machine, versions, config), va="top", family="monospace", fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
