from django.urls import path

from shop import views

app_name = "shop"

urlpatterns = [
    path("", views.index, name="index"),
    path("healthz", views.healthz, name="healthz"),
    path("products/<int:product_id>/buy", views.buy, name="buy"),
    path("async/products/<int:product_id>/buy", views.buy_async, name="buy-async"),
    # The same purchase without a lock, kept for comparison: it oversells.
    path("unsafe/products/<int:product_id>/buy", views.buy_unsafe, name="buy-unsafe"),
    # One unit of each product in a JSON body {"products": [3, 1, 2]}, or none.
    path("checkout", views.checkout, name="checkout"),
    # The same cart without locks or idempotency, for comparison.
    path("unsafe/checkout", views.checkout_unsafe, name="checkout-unsafe"),
    path("reports/sales", views.sales_report, name="sales-report"),
]
