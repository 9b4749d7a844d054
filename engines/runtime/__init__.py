"""engines.runtime package."""
