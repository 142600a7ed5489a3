"""The structural mutation campaign (issue 20): damage LMDB's page structure of real record
sets, one seeded mutation per file, and read each file with every read path in a forked
child (address-space limit, timeout); print a table per read path, mutation kind and outcome.

    python scripts/mutation_campaign.py --files 2000            # about 3 minutes on 2 cores (162 s for 2,025)
    python scripts/mutation_campaign.py --files 100 --json out.json
    python scripts/mutation_campaign.py --files 0 --manifests 1000   # crafted manifests only

    python scripts/mutation_campaign.py --states                 # resume states: every kind, every field

Exit status 1 if verify, the structural check or a reader with check="structure" crashed
or hung, if any read path raised anything but a torchrecord error or returned wrong data, or
if the structural check passed a file on which a liblmdb read path crashed, hung or read
wrong data. The mutations and the classification are in tests/lmdb_mutations.py.

With --states, the resume-state part runs instead (tests/untrusted_states.py): real states of
every kind at several points of an epoch, every field given crafted values, each loaded into a
fresh dataset and iterated in a forked child; exit status 1 on any crash, hang, wrong data,
exception other than torchrecord's, unclear message or MemoryError within the memory limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.lmdb_mutations import PATHS, FileResult, run_campaign


def states_part(args: argparse.Namespace) -> int:
    """The resume-state campaign (issue 30): its own part, beside the file campaign."""
    from tests.untrusted_states import run_state_campaign

    directory = args.dir or tempfile.mkdtemp(prefix="torchrecord-states-")
    campaign = run_state_campaign(
        directory,
        points=args.points,
        timeout=args.timeout,
        memory_limit=args.memory_limit,
        progress=None if args.quiet else lambda line: print(line, flush=True),
    )
    print(campaign.render())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": campaign.seconds, "states": [dataclasses.asdict(r) for r in campaign.results]}, f)
    return 1 if any(campaign.failures().values()) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000, help="mutated files (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per read path and file")
    parser.add_argument("--memory-limit", type=int, default=2 << 30, help="bytes of address space per child")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"read paths (default {','.join(PATHS)})")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed)")
    parser.add_argument("--keep", action="store_true", help="keep the mutated files")
    parser.add_argument("--json", help="write every file's result here")
    parser.add_argument("--quiet", action="store_true", help="no per-file progress")
    parser.add_argument("--states", action="store_true", help="run the resume-state campaign instead")
    parser.add_argument("--points", type=int, default=4, help="--states: real states per kind (default 4)")
    parser.add_argument("--manifests", type=int, default=0, help="crafted sharded-set manifests (default 0)")
    args = parser.parse_args(argv)
    if args.states:
        if "--memory-limit" not in (argv if argv is not None else sys.argv):
            args.memory_limit = 1 << 30
        return states_part(args)
    failed = run_manifests(args) if args.manifests else False
    if not args.files:
        return 1 if failed else 0
    paths = tuple(p for p in args.paths.split(",") if p)
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown read paths {sorted(unknown)}; choose from {PATHS}")

    def progress(result: FileResult) -> None:
        if not args.quiet and (result.index % 100 == 99 or result.missed):
            flag = "  MISSED" if result.missed else ""
            print(f"[{result.index + 1}/{args.files}] {result.kind}: {result.description}{flag}", flush=True)

    directory = args.dir or tempfile.mkdtemp(prefix="torchrecord-mutations-")
    campaign = run_campaign(
        args.files,
        directory,
        seed=args.seed,
        paths=paths,
        timeout=args.timeout,
        memory_limit=args.memory_limit,
        progress=progress,
        keep=args.keep or bool(args.dir),
    )
    print(campaign.render())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"seconds": campaign.seconds, "files": [dataclasses.asdict(r) for r in campaign.files]}, f, indent=1
            )
    return 1 if failed or any(campaign.failures().values()) else 0


def run_manifests(args: argparse.Namespace) -> bool:
    """The manifest part: ``args.manifests`` crafted manifests, each opened by every path; True if any failed."""
    from tests.manifest_mutations import run_campaign as run_manifest_campaign

    directory = tempfile.mkdtemp(prefix="torchrecord-manifests-")
    campaign = run_manifest_campaign(
        args.manifests, directory, seed=args.seed, timeout=args.timeout, memory_limit=min(args.memory_limit, 1 << 30)
    )
    print(campaign.render())
    return any(campaign.failures().values())


if __name__ == "__main__":
    sys.exit(main())
