"""Turn ``DATABASE_URL`` into a Django ``DATABASES`` entry.

Small on purpose: it knows the databases this project is run with.

* ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db``
* ``postgres://user:password@host:5432/name?sslmode=require`` (also
  ``postgresql://``);
* ``mysql://user:password@host:3306/name`` for MySQL or MariaDB (also
  ``mariadb://``; needs mysqlclient), for instance
  ``?isolation_level=repeatable+read`` for another level than Django's READ COMMITTED.

Query parameters become connection ``OPTIONS``, and a percent-encoded host
such as ``%2Fvar%2Frun%2Fpostgresql`` is a socket (directory, for PostgreSQL).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

__all__ = ["parse"]

_SERVERS = {
    "postgres": "django.db.backends.postgresql",
    "postgresql": "django.db.backends.postgresql",
    "pgsql": "django.db.backends.postgresql",
    "mysql": "django.db.backends.mysql",
    "mariadb": "django.db.backends.mysql",
}


def _host_and_port(netloc: str) -> tuple[str, str]:
    hostport = netloc.rpartition("@")[2]
    if hostport.startswith("["):  # IPv6 literal: [::1]:5432
        host, _, rest = hostport[1:].partition("]")
        return host, rest.lstrip(":")
    host, _, port = hostport.partition(":")
    return unquote(host), port


def parse(url: str) -> dict[str, Any]:
    """The ``DATABASES["default"]`` entry for ``url``; ValueError when unsupported."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        # Three slashes then a relative path, four for an absolute one.
        name = unquote(parts.path[1:]) if parts.path else ""
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": name or ":memory:"}
    if scheme in _SERVERS:
        host, port = _host_and_port(parts.netloc)
        entry: dict[str, Any] = {
            "ENGINE": _SERVERS[scheme],
            "NAME": unquote(parts.path[1:]),
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": host,
            "PORT": port,
        }
        options = dict(parse_qsl(parts.query))
        if options:
            entry["OPTIONS"] = options
        return entry
    raise ValueError(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported here: use "
        "sqlite:///path/to/db.sqlite3, postgres://user:password@host:5432/name "
        "or mysql://user:password@host:3306/name"
    )
