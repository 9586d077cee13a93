"""The engine: replaying a run's journal and executing the rest of it."""
