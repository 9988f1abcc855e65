"""Trainyard's common library: settings, events, bus, database, storage, telemetry, auth.

Every service imports from here; nothing here imports a service.
"""
