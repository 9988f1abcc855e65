"""Trainyard's user package: the in-job SDK (``trainyard.sdk``) and the command line."""

__version__ = "0.1.0"
