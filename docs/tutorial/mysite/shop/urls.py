from django.urls import path

from . import views

urlpatterns = [
    path("products/<int:product_id>/buy", views.buy, name="buy"),
    path("reports/sales", views.sales_report, name="sales-report"),
]
