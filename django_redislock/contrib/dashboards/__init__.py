"""A Grafana dashboard and Prometheus alerting rules for the library's metrics, shipped with it.

``grafana.json`` (import it into Grafana: Dashboards, New, Import) and
``alerts.yml`` (a Prometheus rule file: list it under ``rule_files``) are
built on the metrics of ``contrib/prometheus.py`` as they are; see
docs/metrics.rst, "Dashboard and alerts". Find them with ``path()``, or
print them with ``python -m django_redislock.contrib.dashboards``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["FILES", "path", "text"]

# What each file is, by the name the command line takes.
FILES = {
    "grafana": "grafana.json",
    "alerts": "alerts.yml",
}


def path(which: str) -> Path:
    """Where the installed file is: ``path("grafana")``, ``path("alerts")``."""
    try:
        filename = FILES[which]
    except KeyError:
        raise ValueError(f"which must be one of {sorted(FILES)}, not {which!r}") from None
    # Installed as plain files (zip_safe = False): a path on disk.
    return Path(str(resources.files(__name__).joinpath(filename)))


def text(which: str) -> str:
    """The file's content."""
    return path(which).read_text(encoding="utf-8")
