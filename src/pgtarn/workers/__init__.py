"""Worker processes (workers = N): the messages between them and their supervisor."""
