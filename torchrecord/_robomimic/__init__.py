"""robomimic demonstrations: SequenceDataset, WindowDataset and their frame store."""
