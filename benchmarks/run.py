"""Run every loader side by side on the same generated data: ``python -m benchmarks.run``.

For each workload: load (or generate and cache) its samples, build every
loader's format from them (cached), time cold epochs of ``--cold-loaders`` for
the ``--cold-workloads`` (files evicted before each epoch, checked with
mincore, each epoch in a fresh process), run ``--warmup-epochs`` untimed and
then time ``--epochs`` interleaved warm epochs of every configuration (each
loader at each ``--workers`` setting; the limits once, in-process), print a table and each peer against torchrecord at
the same workers, then time writes (per-sample source, TensorDataset, K > 1,
against a raw LMDB append). At the end, print the summary, the peers against
torchrecord, and issue 17's, 28's and 40's figures against their targets, and
write ``<out>.json`` and ``<out>.png``.

Quick run: ``python -m benchmarks.run --scale 0.1``. Full run: no arguments.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import cold, report
from benchmarks.loaders import Epochs, LoaderOptions, disk_bytes, ensure_built, read_through, registry
from benchmarks.loaders import base as loaders_base
from benchmarks.machine import describe_machine, load_average, versions
from benchmarks.timing import Measurement, run_rounds, time_epoch
from benchmarks.workloads import WORKLOADS, WorkloadData, load_workload
from benchmarks.writespeed import WriteResult, measure_writes

__all__ = ["main", "parse_args"]

RATIO_NOTE = (
    "x raw limit = samples/s / raw-limit's samples/s (raw-limit: one process copying one LMDB value per "
    "sample, no decoding).\nPacked sets hold K samples per value, so torchrecord-packed can pass it; "
    "raw-limit-packed is its own ceiling."
)


PEER_NOTE = (
    "torchrecord / peer = torchrecord's samples/s over the peer's, torchrecord being its fastest batch-mode "
    "loader\n(torchrecord-batch, torchrecord-loader, torchrecord-packed, torchrecord-packed-loader) at the peer's "
    "workload and num_workers."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    names = list(registry())
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="multiply every workload's size (0.1: quick run)")
    p.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--loaders", nargs="+", choices=names, default=names)
    p.add_argument("--workers", nargs="+", type=int, default=[0, 2, 4], help="DataLoader num_workers settings")
    p.add_argument(
        "--fresh-workers",
        action="store_true",
        help="start DataLoader workers afresh each epoch (default: persistent_workers=True, as in training)",
    )
    p.add_argument(
        "--transform-us",
        type=float,
        default=0.0,
        help="a per-sample transform spinning this many microseconds in the torchrecord loaders (0: none)",
    )
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per configuration (median; >= 3)")
    p.add_argument(
        "--warmup-epochs",
        type=int,
        default=1,
        help="untimed epochs of every configuration first (persistent workers start there; 0: none)",
    )
    p.add_argument("--batch-size", type=int, default=None, help="override every workload's batch size")
    p.add_argument("--shuffle-buffer", type=int, default=2048, help="torchrecord and WebDataset buffer")
    p.add_argument(
        "--samples-per-record",
        type=int,
        default=0,
        help="K for torchrecord-packed (0: as write_record chooses it); needs write_record(samples_per_record=)",
    )
    p.add_argument("--data-dir", type=Path, default=Path("bench-data"), help="cache of generated data")
    p.add_argument("--out", type=Path, default=Path("results/bench"), help="writes OUT.json and OUT.png")
    p.add_argument("--rebuild", action="store_true", help="rebuild every cached format (not the samples)")
    p.add_argument("--no-write", action="store_true", help="skip the write-speed measurement")
    p.add_argument(
        "--cold-workloads",
        nargs="*",
        choices=list(WORKLOADS),
        default=["large-images"],
        help="workloads also read with a cold page cache (files evicted before each epoch); none: skip",
    )
    p.add_argument(
        "--cold-loaders",
        nargs="+",
        choices=names,
        default=["raw-limit", "torchrecord-batch", "npy-folder"],
        help="loaders timed cold (each in a fresh process after eviction)",
    )
    p.add_argument("--cold-workers", nargs="+", type=int, default=[0], help="num_workers settings of cold epochs")
    p.add_argument("--cold-epochs", type=int, default=2, help="cold epochs per configuration (median)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated samples")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads of this process, where the workers=0 loaders and the limits run "
        "(DataLoader workers always use 1)",
    )
    args = p.parse_args(argv)
    if args.epochs < 1:
        p.error("--epochs must be at least 1")
    if args.warmup_epochs < 0:
        p.error("--warmup-epochs must be at least 0")
    return args


def _log(message: str) -> None:
    print(message, flush=True)


def _prepare(
    data: WorkloadData, names: list[str], args: argparse.Namespace, rebuilt: set[str]
) -> tuple[list[tuple[Measurement, Epochs]], list[dict[str, str]]]:
    """Build (or find) every selected loader's format and open its configurations."""
    loaders = registry(LoaderOptions(args.shuffle_buffer, args.samples_per_record, args.transform_us))
    configs: list[tuple[Measurement, Epochs]] = []
    skipped: list[dict[str, str]] = []
    warmed: set[str | None] = set()
    for name in names:
        loader = loaders[name]
        reason = loader.unavailable(data)
        if reason:
            _log(f"  {name}: skipped ({reason})")
            skipped.append({"loader": name, "reason": reason})
            continue
        key = loader.format_key(data)
        rebuild = args.rebuild and key is not None and key not in rebuilt
        if key is not None and (rebuild or not (data.root / key).exists()):
            _log(f"  {name}: building {key} ...")
        path, seconds = ensure_built(loader, data, rebuild)
        if key is not None:
            rebuilt.add(key)
        size = disk_bytes(path) if path is not None else None
        if seconds is not None:
            _log(f"  {name}: built in {seconds:.1f} s ({(size or 0) / 1e6:,.1f} MB on disk)")
        if path is not None and key not in warmed:
            read_through(path)  # every format starts warm, however recently it was built
            warmed.add(key)
        settings: list[int | None] = list(args.workers) if loader.uses_workers else [None]
        for workers in settings:
            m = Measurement(data.name, name, workers, data.batch_size, data.count, loader.is_limit, size, seconds)
            configs.append((m, loader.open(data, path, workers or 0)))
    return configs, skipped


def _run_cold(data: WorkloadData, args: argparse.Namespace, rebuilt: set[str]) -> list[cold.ColdResult]:
    """Time cold epochs of the chosen loaders, each in a fresh process after evicting its files."""
    why = cold.available()
    if why is not None:
        _log(f"  cold reads: skipped ({why})")
        return []
    loaders = registry(LoaderOptions(args.shuffle_buffer, args.samples_per_record, args.transform_us))
    configs: list[tuple[cold.ColdResult, Any, Path]] = []
    for name in args.cold_loaders:
        loader = loaders[name]
        if loader.unavailable(data) or loader.format_key(data) is None:
            continue
        path, _ = ensure_built(loader, data, args.rebuild and loader.format_key(data) not in rebuilt)
        assert path is not None
        settings: list[int | None] = list(args.cold_workers) if loader.uses_workers else [None]
        for workers in settings:
            configs.append((cold.ColdResult(data.name, name, workers, data.count), loader, path))
    _log(f"  cold page cache: {args.cold_epochs} epochs of {len(configs)} configurations, files evicted before each")
    for r in range(args.cold_epochs):
        for result, loader, path in configs:

            def epoch(
                loader: Any = loader, path: Path = path, result: cold.ColdResult = result, r: int = r
            ) -> tuple[float, int]:
                return time_epoch(loader.open(data, path, result.workers or 0), r)

            eviction = cold.time_cold(result, cold.files_of(path), epoch)
            seconds, count = result.seconds[-1], result.samples[-1]
            _log(
                f"  cold epoch {r + 1}/{args.cold_epochs}  {result.label:<24} {seconds:7.2f} s  "
                f"{count / seconds:>10,.0f} samples/s  ({eviction.describe()})"
            )
    results = [result for result, _, _ in configs]
    _log(report.format_table(report.COLD_HEADERS, report.cold_rows(results)))
    return results


def _run_workload(
    name: str, args: argparse.Namespace, rebuilt: set[str]
) -> tuple[dict[str, Any], list[Measurement], WriteResult | None, list[cold.ColdResult]]:
    workload = WORKLOADS[name]
    count = workload.scaled_count(args.scale)
    _log(f"\n== {name}: {workload.describe(count)}")
    start = time.perf_counter()
    data = load_workload(workload, args.scale, args.data_dir, args.seed, args.batch_size)
    _log(f"  samples ready in {time.perf_counter() - start:.1f} s ({data.root})")
    configs, skipped = _prepare(data, args.loaders, args, rebuilt)
    # cold first: nothing of these files is mapped in this process yet (a mapped page cannot be evicted)
    colds = _run_cold(data, args, rebuilt) if name in (args.cold_workloads or []) else []
    _log(
        f"  timing {args.epochs} interleaved epochs of {len(configs)} configurations, batch {data.batch_size}, "
        f"after {args.warmup_epochs} untimed"
    )
    run_rounds(configs, args.epochs, _log, warmup=args.warmup_epochs)
    measurements = [m for m, _ in configs]
    del configs
    gc.collect()
    _log("")
    _log(report.format_table(report.MEASUREMENT_HEADERS, report.measurement_rows(measurements, measurements)))
    _log(RATIO_NOTE)
    peers = report.peer_rows(measurements)
    if peers:
        _log("")
        _log(report.format_table(report.PEER_HEADERS, peers))
        _log(PEER_NOTE)
    write = None
    if not args.no_write:
        _log("  timing writes: write_record, then a raw LMDB append of the same encoded values ...")
        write = measure_writes(data, data.root / "scratch")
        _log(report.format_table(report.WRITE_HEADERS, report.write_rows([write])))
    info = {
        "name": name,
        "description": workload.describe(data.count),
        "count": data.count,
        "batch_size": data.batch_size,
        "sample_bytes": workload.sample_bytes,
        "skipped": skipped,
    }
    return info, measurements, write, colds


def _torchrecord_over(m: Measurement, everything: list[Measurement]) -> dict[str, Any] | None:
    """For a peer: torchrecord's loader at the same workers and how many times faster it read."""
    against = report.torchrecord_against(m, everything)
    return None if against is None else {"loader": against[0].loader, "ratio": against[1]}


def _measurement_json(m: Measurement, everything: list[Measurement]) -> dict[str, Any]:
    return {
        "loader": m.loader,
        "workers": m.workers,
        "batch_size": m.batch_size,
        "is_limit": m.is_limit,
        "samples_per_second": m.samples_per_second,
        "median_epoch_seconds": m.median_seconds,
        "ratio_to_raw_limit": report.ratio_to_raw(m, everything),
        "torchrecord_over_this": _torchrecord_over(m, everything),
        "epoch_seconds": m.seconds,
        "epoch_samples": m.samples,
        "all_samples_every_epoch": m.complete,
        "disk_bytes": m.disk_bytes,
        "build_seconds": m.build_seconds,
    }


Result = tuple[dict[str, Any], list[Measurement], WriteResult | None, list[cold.ColdResult]]


def _summary(results: list[Result], transform_us: float = 0.0) -> None:
    _log("\n== Summary: each loader's best configuration (median samples/s; x raw limit = ratio)")
    rows = []
    for info, ms, _, _ in results:
        for m in report.best_per_loader(ms):
            ratio = report.ratio_to_raw(m, ms)
            workers = "-" if m.workers is None else str(m.workers)
            ratio_text = "-" if ratio is None else f"{ratio:.3f}"
            rows.append([info["name"], m.loader, workers, f"{m.samples_per_second:,.0f}", ratio_text])
    _log(report.format_table(["workload", "loader", "workers", "samples/s", "x raw limit"], rows))
    _log(RATIO_NOTE)
    writes = [w for _, _, w, _ in results if w is not None]
    if writes:
        _log("\n== Write speed (MB/s of stored values)")
        _log(report.format_table(report.WRITE_HEADERS, report.write_rows(writes)))
    colds = [c for _, _, _, cs in results for c in cs]
    if colds:
        _log("\n== Cold page cache (files evicted before each epoch, read in a fresh process)")
        _log(report.format_table(report.COLD_HEADERS, report.cold_rows(colds)))
    everything = [m for _, ms, _, _ in results for m in ms]
    workers = report.worker_rows(everything)
    if workers:
        _log("\n== Workers: each torchrecord loader by num_workers (x 0 workers; x in-memory = / in-memory-limit)")
        _log(report.format_table(report.WORKER_HEADERS, workers))
    peers = report.peer_rows(everything)
    if peers:
        _log("\n== Peers against torchrecord (each peer configuration; torchrecord at the same workers)")
        _log(report.format_table(report.PEER_HEADERS, peers))
        _log(PEER_NOTE)
    lance = report.peer_targets(everything, "lance")
    if lance:
        _log("\n== Issue 40: torchrecord ahead of Lance")
        _log(report.format_table(report.TARGET_HEADERS, lance))
    handover = report.handover_targets(everything, transform_us)
    if handover:
        what = f"a {transform_us:g} us transform per sample" if transform_us else "no transform"
        _log(f"\n== Issue 28 targets ({what})")
        _log(report.format_table(report.TARGET_HEADERS, handover))
    targets = report.targets(everything, writes, colds)
    if targets:
        _log("\n== Issue 17 targets (figure against its limit)")
        _log(report.format_table(report.TARGET_HEADERS, targets))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    loaders_base.PERSISTENT_WORKERS = not args.fresh_workers
    if args.epochs < 3:
        _log(f"warning: --epochs {args.epochs}: medians of fewer than 3 epochs are not reported as such")
    machine, found = describe_machine(), versions()
    _log("Machine:  " + ", ".join(f"{k}={v}" for k, v in machine.items()))
    _log("Versions: " + ", ".join(f"{k}={v}" for k, v in found.items()))
    started = time.perf_counter()
    rebuilt: set[str] = set()
    results = [_run_workload(name, args, rebuilt) for name in args.workloads]
    _summary(results, args.transform_us)
    machine["load_average_at_end"] = load_average()
    config = {
        "scale": args.scale,
        "workers": args.workers,
        "epochs": args.epochs,
        "warmup_epochs": args.warmup_epochs,
        "batch_size": args.batch_size or "per workload",
        "shuffle_buffer": args.shuffle_buffer,
        "torch_threads": args.threads,
        "transform_us": args.transform_us,
        "persistent_workers": not args.fresh_workers,
        "samples_per_record": args.samples_per_record or "auto",
        "data_dir": str(args.data_dir),
        "cold_workloads": args.cold_workloads,
        "cold_loaders": args.cold_loaders,
        "cold_workers": args.cold_workers,
        "cold_epochs": args.cold_epochs,
    }
    payload = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.run", *(argv if argv is not None else sys.argv[1:])]),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": machine,
        "versions": found,
        "config": config,
        "method": {
            "page_cache": "warm: every format is read once before timing; cold section: every file of the "
            "format flushed and advised POSIX_FADV_DONTNEED before each epoch, residency checked with mincore, "
            "the epoch read in a freshly forked process",
            "order": "interleaved: round r times epoch r of every configuration",
            "clock": "from creating the epoch's iterator (DataLoader workers start) to its last batch",
            "samples_per_second": "median over epochs of samples delivered / epoch seconds",
            "ratio_to_raw_limit": "samples/s divided by raw-limit's on the same workload",
            "torchrecord_over_this": "peers only: samples/s of torchrecord's fastest batch-mode loader at the same "
            "workload and num_workers divided by the peer's",
            "write": "write_record from an in-memory map-style dataset vs a plain LMDB append loop of "
            "the values write_record stored (one big map, a commit per ~64 MB, a final sync)",
        },
        "workloads": [
            {
                **info,
                "results": [_measurement_json(m, ms) for m in ms],
                "best": [_measurement_json(m, ms) for m in report.best_per_loader(ms)],
                "write": None if w is None else w.to_json(),
                "cold": [report.cold_json(c, cs) for c in cs],
            }
            for info, ms, w, cs in results
        ],
    }
    json_path = args.out.with_suffix(".json")
    report.write_json(json_path, payload)
    chart_note = report.write_chart(
        args.out.with_suffix(".png"),
        [(f"{info['name']}: {info['description']}, batch {info['batch_size']}", ms) for info, ms, _, _ in results],
        machine,
        found,
        config,
    )
    _log(f"\nwrote {json_path}" + (f"; {chart_note}" if chart_note else f" and {args.out.with_suffix('.png')}"))
    _log(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
