"""Vocabulary with no file handles: sample structure, dtypes, the schema, the record codec,
compression, fixed layouts and the kinds a user wrote."""
