"""Mixing many record sets by weight: MixedDataset, its sources, read-ahead, mixer and resume positions."""
