from __future__ import annotations

from django.urls import path

from tests.testapp import views_throttle as v

urlpatterns = [
    path("ok/", v.ok, name="ok"),
    path("reports/slow/", v.slow, name="slow"),
    path("reports/aslow/", v.aslow, name="aslow"),
    path("boom/", v.boom, name="boom"),
    path("stream/", v.stream, name="stream"),
    path("astream/", v.astream, name="astream"),
    path("pid/", v.pid, name="pid"),
    path("download/", v.download, name="download"),
    path("named/<int:n>/", v.slow, name="named-view"),
    path("deco/", v.decorated, name="deco"),
    path("adeco/", v.adecorated, name="adeco"),
    path("deco-boom/", v.decorated_boom, name="deco-boom"),
    path("peak/", v.peak, name="peak"),
]
