"""Present benchmark results: text tables, the JSON file and the PNG bar chart."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.cold import ColdResult
from benchmarks.timing import Measurement
from benchmarks.writespeed import WriteResult

__all__ = [
    "COLD_HEADERS",
    "MEASUREMENT_HEADERS",
    "PEER_HEADERS",
    "TARGET_HEADERS",
    "WORKER_HEADERS",
    "WRITE_HEADERS",
    "best_per_loader",
    "cold_json",
    "cold_rows",
    "format_table",
    "handover_targets",
    "measurement_rows",
    "peer_rows",
    "peer_targets",
    "ratio_to_raw",
    "targets",
    "torchrecord_against",
    "write_chart",
    "write_json",
    "worker_rows",
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
        rows.append(
            [
                m.loader,
                "-" if m.workers is None else str(m.workers),
                f"{m.samples_per_second:,.0f}",
                f"{m.median_seconds:.2f}",
                "-" if ratio is None else f"{ratio:.3f}",
                _mb(m.disk_bytes),
                "yes" if m.complete else "NO",
            ]
        )
    return rows


MEASUREMENT_HEADERS = ["loader", "workers", "samples/s", "epoch s", "x raw limit", "disk MB", "all samples"]


def write_rows(results: Sequence[WriteResult]) -> list[list[str]]:
    """Rows for :data:`WRITE_HEADERS`: one per workload and writer."""
    rows = []
    for r in results:
        mb = r.value_bytes / 1e6
        entries = [("raw LMDB append (1 value per sample)", r.raw_lmdb_seconds, "1.00")]
        if r.source_seconds:
            ratio = f"{r.raw_lmdb_seconds / r.source_seconds:.2f}"
            entries.append(("source alone: dataset[i] for every i", r.source_seconds, ratio))
        entries += [(f"write_record: {k}", s, f"{r.ratio(k):.2f}") for k, s in r.writes.items()]
        for who, seconds, ratio in entries:
            rate = f"{r.samples / seconds:,.0f}"
            rows.append([r.workload, who, rate, f"{mb / seconds:,.1f}", f"{seconds:.2f}", ratio])
    return rows


WRITE_HEADERS = ["workload", "writer", "samples/s", "MB/s", "seconds", "x raw append"]


COLD_HEADERS = ["workload", "loader", "workers", "samples/s", "x raw cold", "evicted"]


def _cold_ratio(result: ColdResult, everything: Sequence[ColdResult], loader: str) -> float | None:
    for c in everything:
        if c.loader == loader and c.workload == result.workload and c.seconds:
            return result.samples_per_second / c.samples_per_second
    return None


def cold_rows(results: Sequence[ColdResult]) -> list[list[str]]:
    """Rows for :data:`COLD_HEADERS` (x raw cold: against the raw cursor's cold read of the same workload)."""
    rows = []
    for c in results:
        ratio = _cold_ratio(c, results, RAW_LIMIT)
        workers = "-" if c.workers is None else str(c.workers)
        worked = "yes" if c.evicted else "NO: " + "; ".join(e.describe() for e in c.evictions if not e.worked)
        rows.append(
            [
                c.workload,
                c.loader,
                workers,
                f"{c.samples_per_second:,.0f}",
                "-" if ratio is None else f"{ratio:.2f}",
                worked,
            ]
        )
    return rows


def cold_json(c: ColdResult, everything: Sequence[ColdResult]) -> dict[str, Any]:
    return {
        "loader": c.loader,
        "workers": c.workers,
        "samples_per_second": c.samples_per_second,
        "ratio_to_raw_cold": _cold_ratio(c, everything, RAW_LIMIT),
        "epoch_seconds": c.seconds,
        "epoch_samples": c.samples,
        "evictions": [{"resident_before": e.before, "resident_after": e.after} for e in c.evictions],
        "evicted": c.evicted,
    }


TARGET_HEADERS = ["figure", "measured", "target", "met"]


def _best(ms: Sequence[Measurement], workload: str, loader: str) -> float | None:
    rates = [m.samples_per_second for m in ms if m.workload == workload and m.loader == loader and m.seconds]
    return max(rates) if rates else None


def _target_row(figure: str, value: float | None, target: float, unit: str = "x") -> list[str] | None:
    if value is None:
        return None
    return [figure, f"{value:.2f}{unit}", f">= {target:g}{unit}", "yes" if value >= target else "MISSED"]


def targets(
    measurements: Sequence[Measurement], writes: Sequence[WriteResult], colds: Sequence[ColdResult]
) -> list[list[str]]:
    """Issue 17's figures against their targets, for what this run measured."""
    rows: list[list[str] | None] = []
    large = "large-images"
    batch, sample = _best(measurements, large, "torchrecord-batch"), _best(measurements, large, "torchrecord")
    raw, fresh = _best(measurements, large, RAW_LIMIT), _best(measurements, large, "raw-limit-fresh")
    pickle = _best(measurements, large, "lmdb-pickle")
    if batch is not None and raw:
        rows.append(_target_row("large images: batch mode / raw limit", batch / raw, 0.7))
    if batch is not None and fresh:
        rows.append(_target_row("large images: batch mode / raw limit with a new array per batch", batch / fresh, 0.7))
    if sample is not None and pickle:
        rows.append(_target_row("large images: per-sample mode / pickle + txn.get", sample / pickle, 1.0))
    for c in colds:
        if c.loader != "torchrecord-batch":
            continue
        raw_cold = _cold_ratio(c, colds, RAW_LIMIT)
        npy_cold = _cold_ratio(c, colds, "npy-folder")
        note = "" if c.evicted else " (eviction did NOT work)"
        rows.append(_target_row(f"{c.workload} cold: batch mode w={c.workers} / raw cursor cold{note}", raw_cold, 0.8))
        rows.append(_target_row(f"{c.workload} cold: batch mode w={c.workers} / .npy folder cold{note}", npy_cold, 3.0))
    for w in writes:
        if w.workload != "tiny-vectors":
            continue
        for variant in w.writes:
            rows.append(_target_row(f"tiny writes: {variant} / raw append", w.ratio(variant), 0.4))
    return [r for r in rows if r is not None]


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


WORKER_HEADERS = ["workload", "loader", "workers", "samples/s", "x 0 workers", "x in-memory"]
_TORCHRECORD = (
    "torchrecord",
    "torchrecord-sample-loader",
    "torchrecord-batch",
    "torchrecord-loader",
    "torchrecord-packed",
    "torchrecord-packed-loader",
)
IN_MEMORY = "in-memory-limit"
IN_MEMORY_DATALOADER = "in-memory-limit-dataloader"


def _at(ms: Sequence[Measurement], workload: str, loader: str, workers: int | None) -> float | None:
    for m in ms:
        if m.workload == workload and m.loader == loader and (m.workers or 0) == (workers or 0) and m.seconds:
            return m.samples_per_second
    return None


def worker_rows(measurements: Sequence[Measurement]) -> list[list[str]]:
    """The torchrecord loaders at each num_workers: samples/s, against 0 workers and the in-memory gather."""
    rows = []
    for m in measurements:
        if m.loader not in _TORCHRECORD or not m.seconds:
            continue
        zero = _at(measurements, m.workload, m.loader, 0)
        memory = _at(measurements, m.workload, IN_MEMORY, None)
        rate = m.samples_per_second
        rows.append(
            [
                m.workload,
                m.loader,
                str(m.workers or 0),
                f"{rate:,.0f}",
                "-" if not zero else f"{rate / zero:.2f}x",
                "-" if not memory else f"{rate / memory:.2f}x",
            ]
        )
    return rows


def handover_targets(measurements: Sequence[Measurement], transform_us: float) -> list[list[str]]:
    """Issue 28's figures against their targets, for what this run measured."""
    rows: list[list[str] | None] = []
    for workload in sorted({m.workload for m in measurements}):
        batch0 = _at(measurements, workload, "torchrecord-batch", 0)
        batch2 = _at(measurements, workload, "torchrecord-batch", 2)
        sample0 = _at(measurements, workload, "torchrecord", 0)
        sample2 = _at(measurements, workload, "torchrecord", 2)
        # RecordLoader (bundles) against the same batch mode at 0 workers, where it is a plain DataLoader
        loader0 = _at(measurements, workload, "torchrecord-loader", 0) or batch0
        loader2 = _at(measurements, workload, "torchrecord-loader", 2)
        if loader0 and loader2:
            what = f"{workload}: batch mode, RecordLoader 2 workers / 0 workers"
            rows.append(_target_row(what, loader2 / loader0, 1.7 if transform_us else 0.9))
        packed_loader0 = _at(measurements, workload, "torchrecord-packed-loader", 0)
        packed_loader2 = _at(measurements, workload, "torchrecord-packed-loader", 2)
        if packed_loader0 and packed_loader2:
            what = f"{workload}: batch mode, packed set, RecordLoader 2 workers / 0 workers"
            rows.append(_target_row(what, packed_loader2 / packed_loader0, 1.7 if transform_us else 0.9))
        sampled0 = _at(measurements, workload, "torchrecord-sample-loader", 0) or sample0
        sampled2 = _at(measurements, workload, "torchrecord-sample-loader", 2)
        if transform_us and sampled0 and sampled2:
            what = f"{workload}: per-sample, RecordLoader 2 workers / 0 workers"
            rows.append(_target_row(what, sampled2 / sampled0, 1.7))
        if transform_us:
            if batch0 and batch2:
                rows.append(_target_row(f"{workload}: batch mode, 2 workers / 0 workers", batch2 / batch0, 1.7))
            if sample0 and sample2:
                rows.append(_target_row(f"{workload}: per-sample, 2 workers / 0 workers", sample2 / sample0, 1.7))
            continue
        if batch0 and batch2:
            rows.append(_target_row(f"{workload}: batch mode, 2 workers / 0 workers", batch2 / batch0, 0.9))
        rows.extend(_memory_rows(measurements, workload))
        if batch0 and sample0:
            rows.append(_target_row(f"{workload}: per-sample / batch mode, 0 workers", sample0 / batch0, 0.5))
        if batch0 and _at(measurements, workload, "torchrecord-sample-loader", 0):
            what = f"{workload}: per-sample RecordLoader / batch mode, 0 workers"
            rows.append(_target_row(what, sampled0 / batch0, 0.5))
    return [r for r in rows if r is not None]


def _memory_rows(measurements: Sequence[Measurement], workload: str) -> list[list[str] | None]:
    """Batch mode at 0 workers against the in-memory gather, like for like: a plain DataLoader against the gather
    read through the same DataLoader (when measured; else the bare gather), RecordLoader against the bare gather
    (its iterator leaves out torch's per-batch profiler span). One file, and the set packed as write_record packs
    it by default."""
    memory = _at(measurements, workload, IN_MEMORY, None)
    through = _at(measurements, workload, IN_MEMORY_DATALOADER, None)
    rows: list[list[str] | None] = []
    for packing, suffix in (("", "batch"), ("packed set, ", "packed")):
        plain0 = _at(measurements, workload, f"torchrecord-{suffix}", 0)
        reference = through or memory
        if plain0 and reference:
            what = f"{workload}: batch mode, {packing}DataLoader 0 workers / in-memory gather" + (
                " through DataLoader" if through else ""
            )
            rows.append(_target_row(what, plain0 / reference, 0.8))
        loader0 = _at(
            measurements, workload, "torchrecord-loader" if suffix == "batch" else "torchrecord-packed-loader", 0
        )
        if loader0 and memory:
            what = f"{workload}: batch mode, {packing}RecordLoader 0 workers / in-memory gather"
            rows.append(_target_row(what, loader0 / memory, 0.8))
    return rows


PEER_HEADERS = ["workload", "peer", "workers", "samples/s", "torchrecord", "samples/s", "torchrecord / peer"]
#: the torchrecord loaders a peer is compared with: batch mode, one file or packed, DataLoader or RecordLoader
_BATCH_MODE = ("torchrecord-batch", "torchrecord-loader", "torchrecord-packed", "torchrecord-packed-loader")


def _is_peer(m: Measurement) -> bool:
    return not m.is_limit and m.loader not in _TORCHRECORD and bool(m.seconds)


def torchrecord_against(peer: Measurement, measurements: Sequence[Measurement]) -> tuple[Measurement, float] | None:
    """torchrecord's fastest batch-mode loader at the peer's workload and workers, and how many times faster it is."""
    if not _is_peer(peer):
        return None
    same = [
        m
        for m in measurements
        if m.loader in _BATCH_MODE and m.workload == peer.workload and (m.workers or 0) == (peer.workers or 0)
    ]
    timed = [m for m in same if m.seconds]
    if not timed:
        return None
    best = max(timed, key=lambda m: m.samples_per_second)
    return best, best.samples_per_second / peer.samples_per_second


def peer_rows(measurements: Sequence[Measurement]) -> list[list[str]]:
    """Rows for :data:`PEER_HEADERS`: every peer configuration against torchrecord at the same workers."""
    rows = []
    for m in measurements:
        against = torchrecord_against(m, measurements)
        if against is None:
            continue
        best, ratio = against
        rows.append(
            [
                m.workload,
                m.loader,
                str(m.workers or 0),
                f"{m.samples_per_second:,.0f}",
                best.loader,
                f"{best.samples_per_second:,.0f}",
                f"{ratio:.2f}x",
            ]
        )
    return rows


def peer_targets(measurements: Sequence[Measurement], peer: str = "lance") -> list[list[str]]:
    """Issue 40's figure: torchrecord ahead of ``peer`` on every workload and workers setting (ratio >= 1)."""
    rows: list[list[str] | None] = []
    for m in measurements:
        against = torchrecord_against(m, measurements) if m.loader == peer else None
        if against is not None:
            what = f"{m.workload}: torchrecord ({against[0].loader}) / {peer}, {m.workers or 0} workers"
            rows.append(_target_row(what, against[1], 1.0))
    return [r for r in rows if r is not None]
