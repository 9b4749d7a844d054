"""engines.backends package."""
