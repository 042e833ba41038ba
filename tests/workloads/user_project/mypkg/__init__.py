"""A practitioner's own package, outside cmdare (tests put its parent directory on PYTHONPATH)."""
