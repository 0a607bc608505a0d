"""Adds the "Held locks" page to the default admin site (no model, no migration).

A project with its own ``AdminSite`` calls
``django_redislock.admin_views.install(my_site)`` instead.
"""

from django.contrib import admin

from .admin_views import install

install(admin.site)
