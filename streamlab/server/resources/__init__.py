"""Answers that outlive a connection: the resumable registry, the shared log in Redis, its worker."""
