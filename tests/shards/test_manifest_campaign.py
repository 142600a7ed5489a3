"""A fixed subset of the manifest mutation campaign (tests/manifest_mutations.py; the full run:
``python scripts/mutation_campaign.py --files 0 --manifests 1000``)."""

from __future__ import annotations

from pathlib import Path

from tests.manifest_mutations import BAD, KINDS, PATHS, run_campaign


def test_crafted_manifests_give_torchrecord_errors_or_the_right_data(tmp_path: Path) -> None:
    campaign = run_campaign(60, str(tmp_path / "campaign"), timeout=20, memory_limit=1 << 30)
    tested = [c for c in campaign.cases if c.outcomes]
    assert len(tested) >= 50 and {c.kind for c in tested} == set(KINDS)
    assert campaign.failures() == dict.fromkeys(BAD, 0), campaign.render()
    for path in PATHS:  # every path refused most crafted manifests and read the harmless ones
        totals = campaign.totals(path)
        assert totals["error"] >= 35 and totals["correct"] >= 1, (path, totals)
