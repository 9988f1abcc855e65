"""Trainyard's platform: the five services, what they share, and the local stack.

Everything the platform distribution installs lives under this one name, so it never
collides with a user's own ``shared`` or ``services`` package. The source stays where the
project's layout puts it (``services/``, ``shared/`` and ``deploy/`` at the repository's top
level); ``trainyard_platform/`` holds links to those folders, which Python, mypy and the wheel
build all follow. Import them as ``trainyard_platform.shared``, ``trainyard_platform.services``
and ``trainyard_platform.deploy``; importing ``shared`` or ``services`` bare would load a second
copy of every module (a test forbids it).
"""
