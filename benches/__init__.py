"""OrbitKV's host-level qualification scripts (run from the repository root: python -m benches.gds)."""
