"""conversations."""
