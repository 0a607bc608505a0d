from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("buy/<str:variant>/<int:slow_ms>/<int:pk>/", views.buy),
    path("product/<int:pk>/", views.page),
]
