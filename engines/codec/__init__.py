"""engines.codec package."""
