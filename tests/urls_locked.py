from __future__ import annotations

from django.urls import path

from tests.testapp import views_locked as v

urlpatterns = [
    path("purchase/<str:db>/<int:product_id>/", v.purchase),
    path("apurchase/<str:db>/<int:product_id>/", v.apurchase),
    path("purchase-own-atomic/<str:db>/<int:product_id>/", v.purchase_own_atomic),
    path("purchase-unlocked/<str:db>/<int:product_id>/", v.purchase_unlocked),
    path("purchase-naive/<str:db>/<int:product_id>/", v.purchase_naive),
    path("purchase-fenced/<str:db>/<int:product_id>/", v.purchase_fenced),
    path("item/<str:name>/", v.item),
    path("aitem/<str:name>/", v.aitem),
    path("item-fail-open/<str:name>/", v.item_fail_open),
    path("aitem-fail-open/<str:name>/", v.aitem_fail_open),
    path("item-custom-busy/<str:name>/", v.item_custom_busy),
    path("aitem-custom-busy/<str:name>/", v.aitem_custom_busy),
    path("item-boom/<str:name>/", v.item_boom),
    path("aitem-boom/<str:name>/", v.aitem_boom),
    path("item-outlives-lease/<str:name>/", v.item_outlives_lease),
    path("item-gated/<str:name>/", v.item_gated),
    path("aitem-db/<str:name>/", v.aitem_db),
    path("item-lost-midway/<str:name>/", v.item_lost_midway),
    path("aitem-lost-midway/<str:name>/", v.aitem_lost_midway),
    path("acart/", v.acart),
    path("buy-current-fence/<int:product_id>/", v.buy_current_fence),
    path("abuy-current-fence/<int:product_id>/", v.abuy_current_fence),
    path("cbv/dispatch/<int:pk>/", v.DispatchLocked.as_view()),
    path("cbv/self/<int:pk>/", v.SelfLocked.as_view()),
    path("cbv/self-then-fails/<int:pk>/", v.SelfLockedThenFails.as_view()),
    path("cbv/method-decorator/<int:pk>/", v.MethodDecorated.as_view()),
    path("cbv/method-decorator-self/<int:pk>/", v.MethodDecoratedSelf.as_view()),
    path("cbv/async/<int:pk>/", v.AsyncHandler.as_view()),
]
