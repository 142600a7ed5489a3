"""One record set on disk: the format, opening and caching environments, the cursor walk,
identity, groups, subsets and RecordFile."""
