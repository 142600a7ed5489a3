"""Checking a record set: verify (isolated in a child process) and payload sizes."""
