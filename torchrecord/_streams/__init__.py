"""Sequence streams: StreamDataset and StreamLoader."""
