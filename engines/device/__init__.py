"""engines.device package."""
