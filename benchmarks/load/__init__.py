"""Open-loop streaming load against the real daemon (`python -m benchmarks.load --help`)."""
