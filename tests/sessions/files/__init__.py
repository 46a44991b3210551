"""Tests of the run-folder backend (sessions.files)."""
