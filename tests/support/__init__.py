"""Test support: a real local OpenAI-compatible server and the fixtures that start it."""
