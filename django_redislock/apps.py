from django.apps import AppConfig


class RedisLockConfig(AppConfig):
    name = "django_redislock"
    verbose_name = "Redis locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Importing registers the system checks (throttling rules included).
        from . import checks, metrics, throttle  # noqa: F401

        # Connects the metrics backends REDISLOCK["METRICS"] names, if any.
        metrics.sync()
