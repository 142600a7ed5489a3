"""Many files read as one set: the manifest, the remote shard cache, ShardedSet."""
