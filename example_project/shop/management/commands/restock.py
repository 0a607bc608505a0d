from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from shop.jobs import restock


class Command(BaseCommand):
    help = (
        "Top every product's stock up to --level. Safe to schedule every minute: "
        "a run that finds the previous one still going skips."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--level", type=int, default=100, help="Stock to restore (100).")

    def handle(self, *args: Any, level: int, **options: Any) -> None:
        restocked = restock(level)
        if restocked is None:
            self.stdout.write("Another restock is running: skipped.")
        else:
            self.stdout.write(f"Restocked {restocked} product(s) to {level}.")
