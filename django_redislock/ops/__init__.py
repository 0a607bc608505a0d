"""What operators see: the admin page, ``manage.py redislocks`` and metrics.

* ``admin.py``: the "Held locks" admin page (``install(site)``).
* ``display.py``: lock rows made printable, as the command and the page show them.
* ``metrics.py``: which metrics backends are on, and what they share.

The management command stays at ``management/commands/redislocks.py``, where
Django finds it; it only parses arguments and prints what ``display.py`` renders.
"""
