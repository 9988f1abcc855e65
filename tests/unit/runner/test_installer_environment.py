"""What the installers see of the runner's environment: their settings, never its secrets."""

from __future__ import annotations

from trainyard_platform.services.runner.environments import installer_environment


def test_installers_get_their_settings_and_what_an_interpreter_needs_only() -> None:
    runner = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "UV_INDEX_URL": "https://pypi.internal/simple",
        "PIP_FIND_LINKS": "/opt/wheels",
        "https_proxy": "http://proxy:3128",
        "SSL_CERT_FILE": "/etc/ssl/ca.pem",
        # An interpreter built with a shared libpython (conda, /opt builds) needs it to start.
        "LD_LIBRARY_PATH": "/opt/python/lib",
        "TRAINYARD_NATS_PASSWORD": "secret",
        "TRAINYARD_STORAGE_SECRET_KEY": "secret",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "PYTHONPATH": "/somewhere",
        "PIP_USER": "1",
    }
    assert installer_environment(runner) == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "UV_INDEX_URL": "https://pypi.internal/simple",
        "PIP_FIND_LINKS": "/opt/wheels",
        "https_proxy": "http://proxy:3128",
        "SSL_CERT_FILE": "/etc/ssl/ca.pem",
        "LD_LIBRARY_PATH": "/opt/python/lib",
    }
