"""Example training jobs, runnable with or without the platform (``python -m examples.X``)."""
