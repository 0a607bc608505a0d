from django.apps import AppConfig
from django.core import checks as django_checks


class RedisLockConfig(AppConfig):
    name = "django_redislock"
    verbose_name = "Redis locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The throttling rules, idempotency and metrics add their settings
        # validators to the checks when imported.
        from . import checks, idempotency  # noqa: F401
        from .ops import metrics
        from .throttling import checks as throttle_checks
        from .throttling import rules, scope_checks, scopes  # noqa: F401

        django_checks.register(checks.check_settings, django_checks.Tags.compatibility)
        django_checks.register(
            throttle_checks.check_throttle_setup, django_checks.Tags.compatibility
        )
        django_checks.register(throttle_checks.check_url_names, django_checks.Tags.urls)
        django_checks.register(scope_checks.check_scopes_used, django_checks.Tags.urls)
        # Connects the metrics backends REDISLOCK["METRICS"] names, if any.
        metrics.sync()
