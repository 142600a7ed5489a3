"""robomimic windows of a converted set: which record fills each frame, cache modes, and items as arrays.

:class:`RoboWindows` holds what ``SequenceDataset`` and ``WindowDataset`` share:
the checked configuration (robomimic's parameters and failures), the window
numbering (``torchrecord._order.window_plan``), the frame store with the cache mode,
and :meth:`RoboWindows.leaves` / :meth:`RoboWindows.assemble`, which turn a
list of window indices into robomimic's item structure with a leading window
axis, every array gathered in one step per key.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchrecord._order.window_plan import Windows, WindowSpec
from torchrecord._robomimic.episodes import SHIFT, STORED, RoboSet, field_name
from torchrecord._robomimic.frame_store import Block, FrameStore
from torchrecord._shards.open import SetLike, open_set
from torchrecord._store.checked import Check, checks_crc
from torchrecord.errors import ArgumentError, MissingDatasetKeyWarning

__all__ = ["CACHE_MODES", "Leaf", "RoboWindows"]

#: robomimic's hdf5_cache_mode values.
CACHE_MODES = ("all", "low_dim", None)


@dataclass(frozen=True)
class Leaf:
    """One array of an item, for n windows: a field at records ``rec`` [n, ...], or a constant."""

    path: tuple[str, ...]
    field: str | None
    rec: np.ndarray | None = None
    const: np.ndarray | None = None

    def select(self, sel: slice | np.ndarray) -> Leaf:
        """The same leaf for the windows ``sel``."""
        rec = None if self.rec is None else self.rec[sel]
        const = None if self.const is None else self.const[sel]
        return Leaf(self.path, self.field, rec, const)


class RoboWindows:
    """The windows robomimic's SequenceDataset gives for these parameters, over a converted set.

    Raises ValueError wherever robomimic fails at construction (and where it
    would fail on the first item): bad parameters, an unknown filter or key, a
    demo shorter than the windows need, next_obs asked of a set without it.
    """

    def __init__(
        self,
        path: SetLike,
        obs_keys: Sequence[str],
        dataset_keys: Sequence[str],
        *,
        spec: WindowSpec,
        get_pad_mask: bool,
        goal_mode: str | None,
        cache: str | None,
        filter_by_attribute: str | None,
        load_next_obs: bool,
        check: Check | None = None,
    ) -> None:
        if cache not in CACHE_MODES:
            raise ArgumentError(f"frame_cache (hdf5_cache_mode) must be 'all', 'low_dim' or None, got {cache!r}")
        if goal_mode not in (None, "last"):
            raise ArgumentError(f"goal_mode must be None or 'last', got {goal_mode!r}")
        if goal_mode == "last" and not load_next_obs:
            raise ArgumentError("goal_mode='last' needs load_next_obs=True (the goal is the demo's last next_obs)")
        file = open_set(path, check=check)
        robo = RoboSet.open(file)
        self.path, self.robo, self.spec = file.path, robo, spec
        self.obs_keys, self.dataset_keys = tuple(obs_keys), tuple(dataset_keys)
        self.get_pad_mask, self.goal_mode, self.load_next_obs = get_pad_mask, goal_mode, load_next_obs
        self.cache = cache
        self.filter_by_attribute = filter_by_attribute
        for k in self.obs_keys:
            if k not in robo.obs_keys:
                raise ArgumentError(f"{self.path}: no obs key {k!r} (its obs keys: {', '.join(robo.obs_keys)})")
        self.zero_keys: set[str] = set()  # keys the source file lacks: robomimic reads zeros under a cache mode
        for k in self.dataset_keys:
            if k not in robo.dataset_keys:
                self._absent_key(k, cache)
        if load_next_obs and self.obs_keys and not robo.next_obs:
            raise ArgumentError(f"{self.path}: the source had no next_obs; pass load_next_obs=False")
        self.selected = robo.select(filter_by_attribute)
        names = [robo.demos[i] for i in self.selected]
        self.windows = Windows(spec, robo.lengths[self.selected], names, self.path)
        self.store = FrameStore(
            file, self._cached_fields(), self._cache_records(), verify=checks_crc(check), finals=robo.finals
        )
        file.close()

    def __len__(self) -> int:
        return len(self.windows)

    def _absent_key(self, key: str, cache: str | None) -> None:
        """A dataset key that was not converted: an error, or zeros with a warning where robomimic gives zeros."""
        robo = self.robo
        converted = ", ".join(robo.dataset_keys) or "none"
        source = robo.source_dataset_keys
        if source is not None and key in source:
            raise ArgumentError(
                f"{self.path}: dataset key {key!r} is in the source file but was not converted (converted: "
                f"{converted}); convert again with it in dataset_keys"
            )
        if source is None and key not in robo.missing_dataset_keys:
            raise ArgumentError(
                f"{self.path}: dataset key {key!r} was not converted (converted: {converted}), and this set, "
                "converted by an older torchrecord, does not say whether the source file has it: convert again "
                "(with it in dataset_keys if the file has it)"
            )
        if cache is None:
            raise ArgumentError(
                f"{self.path}: the source file has no dataset key {key!r}; robomimic reads zeros for it only under "
                "a cache mode (and fails without one): leave it out or use frame_cache='low_dim'"
            )
        warnings.warn(
            f"{self.path}: the source file has no dataset key {key!r}: it reads as float32 zeros [T, 1], "
            "as robomimic does",
            MissingDatasetKeyWarning,
            stacklevel=4,
        )
        self.zero_keys.add(key)

    # -- cache modes --------------------------------------------------------------
    def is_low_dim(self, key: str) -> bool:
        """Low-dimensional: frames of rank 0 or 1 (images are [H, W, C])."""
        return len(self.robo.frame_shape(key)) <= 1

    def _obs_fields(self, key: str) -> list[str]:
        fields = [field_name("obs", key)]
        if self.load_next_obs and self.robo.next_obs.get(key) == STORED:
            fields.append(field_name("next_obs", key))
        return fields

    def _cached_fields(self) -> dict[str, Any]:
        if self.cache is None:
            return {}
        cached: dict[str, Any] = {field_name(None, k): np.float32 for k in self.dataset_keys if k not in self.zero_keys}
        for k in self.obs_keys:
            if self.cache == "all" or self.is_low_dim(k):
                cached.update(dict.fromkeys(self._obs_fields(k)))
        return cached

    def _cache_records(self) -> np.ndarray:
        robo = self.robo
        parts = [np.arange(robo.first[d], robo.first[d] + robo.lengths[d]) for d in self.selected]
        if robo.tail_first is not None and self.load_next_obs:
            parts.append(robo.tail_first + self.selected)
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    @property
    def file_fields(self) -> list[str]:
        """Fields read from the file per item (not cached)."""
        needed = [field_name(None, k) for k in self.dataset_keys if k not in self.zero_keys]
        for k in self.obs_keys:
            needed += self._obs_fields(k)
        return [n for n in dict.fromkeys(needed) if not self.store.is_cached(n)]

    # -- items ----------------------------------------------------------------------
    def _next_records(self, key: str, demo: np.ndarray, t: np.ndarray) -> tuple[str, np.ndarray]:
        """Where next_obs frame ``t`` of ``key`` is stored, for demo positions ``demo`` (broadcast with t)."""
        robo = self.robo
        first = robo.first[demo]
        if robo.next_obs[key] == SHIFT:
            last = robo.lengths[demo] - 1
            assert robo.tail_first is not None
            return field_name("obs", key), np.where(t < last, first + t + 1, robo.tail_first + demo)
        return field_name("next_obs", key), first + t

    def leaves(self, index: np.ndarray) -> list[Leaf]:
        """The arrays of the items of windows ``index``, in robomimic's key order."""
        j, t, mask = self.windows.frames(index)
        demo = self.selected[j]
        n, steps = t.shape
        rec = self.robo.first[demo][:, None] + t
        out: list[Leaf] = []
        for k in self.dataset_keys:
            if k in self.zero_keys:
                out.append(Leaf((k,), None, const=np.zeros((n, steps, 1), np.float32)))
            else:
                out.append(Leaf((k,), field_name(None, k), rec))
        pad = mask[:, :, None]
        if self.get_pad_mask:
            out.append(Leaf(("pad_mask",), None, const=pad))
        out += [Leaf(("obs", k), field_name("obs", k), rec) for k in self.obs_keys]
        if self.get_pad_mask:
            out.append(Leaf(("obs", "pad_mask"), None, const=pad))
        if self.load_next_obs:
            for k in self.obs_keys:
                name, where = self._next_records(k, demo[:, None], t)
                out.append(Leaf(("next_obs", k), name, where))
            if self.get_pad_mask:
                out.append(Leaf(("next_obs", "pad_mask"), None, const=pad))
        if self.goal_mode == "last":
            goal = self.windows.goal_frame(j)
            for k in self.obs_keys:
                name, where = self._next_records(k, demo, goal)
                out.append(Leaf(("goal_obs", k), name, where))
            if self.get_pad_mask:
                out.append(Leaf(("goal_obs", "pad_mask"), None, const=np.ones((n, 1), bool)))
        return out

    def block(self, leaves: list[Leaf]) -> Block | None:
        """The file fields these leaves need, each record read once (None when all are cached)."""
        reads = [lf for lf in leaves if lf.field is not None and not self.store.is_cached(lf.field)]
        if not reads:
            return None
        names = list(dict.fromkeys(lf.field for lf in reads if lf.field is not None))
        return self.store.block([lf.rec for lf in reads if lf.rec is not None], names)

    def assemble(self, leaves: list[Leaf], block: Block | None) -> dict[str, Any]:
        """Robomimic's item structure, every array with a leading window axis."""
        item: dict[str, Any] = {}
        for lf in leaves:
            if lf.field is None:
                assert lf.const is not None
                value = lf.const.copy()
            else:
                assert lf.rec is not None
                value = self.store.take(lf.field, lf.rec, block)
            node = item
            for part in lf.path[:-1]:
                node = node.setdefault(part, {})
            node[lf.path[-1]] = value
        return item

    def items(self, index: np.ndarray) -> dict[str, Any]:
        """The items of windows ``index`` (read in one block)."""
        leaves = self.leaves(index)
        return self.assemble(leaves, self.block(leaves))
