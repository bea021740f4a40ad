"""The chapters' experiments, one module per thing measured: each runs against live servers and returns tidy rows."""
