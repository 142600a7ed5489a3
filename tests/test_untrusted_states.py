"""The resume-state mutation campaign, a deterministic subset (the whole: scripts/mutation_campaign.py --states).

Every state kind, real states at four points of an epoch, each field given crafted values
(see tests/untrusted_states.py); every eighth crafted state is loaded into a fresh dataset
and iterated in a forked child with 1 GiB of address space and a 20 s timeout.
"""

from __future__ import annotations

from pathlib import Path

from tests.untrusted_states import BAD, run_state_campaign


def test_resume_state_campaign_subset(tmp_path: Path) -> None:
    campaign = run_state_campaign(str(tmp_path), every=8)
    table = campaign.table()
    assert len(table) == 13 and len(campaign.results) > 3000
    assert all(row["error"] > 100 and row["correct"] >= 4 for row in table.values()), campaign.render()
    failures = campaign.failures()
    assert all(failures[o] == 0 for o in BAD), campaign.render()
