"""Adds the "Held locks" page to the default admin site (no model, no migration).

A project with its own ``AdminSite`` calls
``django_redislock.ops.admin.install(my_site)`` instead.
"""

from django.contrib import admin

from .ops.admin import install

install(admin.site)
