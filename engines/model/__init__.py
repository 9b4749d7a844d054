"""engines.model package."""
