"""docs/ARCHITECTURE.md's recipe for adding a reader holds: every reader supplies its part, and only that.

Every streaming dataset of the public face is a ``ReaderDataset`` that implements the hooks the
recipe names, writes none of what the base owns (iteration, state, resume, positions), names what
each of its plan keys is, and is a case of the conformance suite.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import torchrecord
from torchrecord._read.base import ReaderDataset
from torchrecord._read.state import STATE_KINDS

ROOT = Path(__file__).resolve().parent.parent
#: What a reader supplies (the recipe's steps), and what the base owns.
SUPPLIED = ("_epoch_plan", "_plan_keys", "_read", "_set_id", "_where", "_per_rank")
OWNED = ("__iter__", "state_dict", "load_state_dict", "position_after", "_start", "_take_resume", "_state_check")


def readers() -> list[type[ReaderDataset]]:
    found = [getattr(torchrecord, n) for n in torchrecord.__all__]
    return [c for c in found if inspect.isclass(c) and issubclass(c, ReaderDataset)]


def test_every_reader_supplies_the_recipes_hooks_and_only_those() -> None:
    assert {c.__name__ for c in readers()} >= {"RecordDataset", "MixedDataset", "StreamDataset", "WindowDataset"}
    for cls in readers():
        missing = [h for h in SUPPLIED if getattr(cls, h) is getattr(ReaderDataset, h)]
        assert not missing, f"{cls.__name__} does not implement {missing}"
        rewritten = [h for h in OWNED if h in vars(cls)]
        assert not rewritten, f"{cls.__name__} writes {rewritten} itself: the base owns them"
        assert cls.STATE_KIND in STATE_KINDS and cls.PLAN_KEYS, cls.__name__


def test_the_recipe_names_the_hooks_and_every_reader_is_a_conformance_case() -> None:
    page = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    recipe = page[page.index("## Adding a reader") :]
    for hook in SUPPLIED:
        assert f"`{hook}(" in recipe, f"the recipe does not name {hook}"
    cases = set(re.findall(r'"(\w+)": Case\(', (ROOT / "tests" / "test_conformance.py").read_text()))
    for cls in readers():
        assert cls.__name__ in cases, f"{cls.__name__} is not a case of tests/test_conformance.py"
