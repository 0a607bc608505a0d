"""``python -m django_redislock.contrib.dashboards [--path] [grafana|alerts]``.

Prints where the shipped Grafana dashboard and Prometheus rules are
(``--path``, the default without a name), or a file's content, to pipe into
a file or an API: ``python -m django_redislock.contrib.dashboards alerts >
/etc/prometheus/rules/redislock.yml``.
"""

from __future__ import annotations

import argparse
import sys

from . import FILES, path, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_redislock.contrib.dashboards",
        description="The Grafana dashboard and Prometheus alerting rules shipped with "
        "django-redislock.",
    )
    parser.add_argument("which", nargs="?", choices=sorted(FILES), help="print this file")
    parser.add_argument("--path", action="store_true", help="print its path instead")
    args = parser.parse_args(argv)
    if args.which is None:
        for which in sorted(FILES):
            print(f"{which}: {path(which)}")
        return 0
    print(path(args.which) if args.path else text(args.which), end="" if not args.path else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
