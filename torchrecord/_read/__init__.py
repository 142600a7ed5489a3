"""A reader's share into items: ShareReader, collation, epoch and world, worker handover, resume, RecordDataset."""
