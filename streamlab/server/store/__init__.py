"""The store: conversations and answers in one SQLite file, written as they stream."""
