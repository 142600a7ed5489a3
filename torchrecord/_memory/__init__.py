"""Record sets in memory: load, BatchIter, GroupBatchIter."""
