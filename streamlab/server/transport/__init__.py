"""HTTP on one connection: reading requests, writing responses and event streams, the guards at the door."""
