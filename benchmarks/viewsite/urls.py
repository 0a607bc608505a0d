from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path

from . import views


def features(request: HttpRequest) -> JsonResponse:
    """What this site could wire in, so the load generator can say what it skips."""
    from django.conf import settings

    return JsonResponse(
        {"decorator": views.locked is not None, "middleware": settings.HAS_MIDDLEWARE}
    )


urlpatterns = [
    path("features/", features),
    path("plain/<str:key>/", views.plain),
    path("throttled/<str:key>/", views.throttled),
    path("pings/<str:key>/", views.two_pings),
    path("corelock/<str:key>/", views.core_lock),
]
if views.locked is not None:
    urlpatterns.append(path("locked/<str:key>/", views.locked))
