"""Trainyard's five services; each sub-package runs as its own process (``python -m``)."""
