from django.urls import path

from tests.testapp import views_green as v

urlpatterns = [
    path("ok/", v.ok),
    path("buy/<int:product_id>/", v.buy),
    path("buy-cpu/<int:product_id>/", v.buy_cpu),
    path("buy-now/<int:product_id>/", v.buy_now),
]
