"""Side-by-side loader benchmarks for torchrecord: run ``python -m benchmarks.run --help``.

A command, not a test: it generates deterministic data under ``./bench-data``,
builds every competitor's on-disk format from the same samples, times epochs of
each in one process tree, and writes ``results/bench.json`` and ``results/bench.png``.
"""
