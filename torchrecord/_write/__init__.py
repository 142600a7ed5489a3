"""Writing a record set: write_record, RecordWriter and the parts of one write session;
write_shard and finalize_shards."""
