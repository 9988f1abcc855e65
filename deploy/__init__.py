"""Deployment: the compose file, container image and the embedded local stack."""
