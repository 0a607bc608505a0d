import time

from django.db import transaction
from django.db.models import Count
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from django_redislock import current_fence, fenced_get, fenced_update, redis_locked

from .models import Order, Product


@csrf_exempt  # an API for scripts and services, with no cookies to abuse
@require_POST
@redis_locked("purchase:{product_id}")
def buy(request, product_id):
    """Sell one unit: one purchase of a product at a time, in every worker."""
    fence = current_fence()
    with transaction.atomic():
        products = Product.objects.filter(pk=product_id)
        # Claim the row as we read it: from now on the database refuses
        # the writes of any older lock holder, so what we read stays true.
        try:
            product = fenced_get(products, fence)
        except Product.DoesNotExist:
            raise Http404("No such product.") from None
        if product.stock == 0:
            return JsonResponse({"error": "sold out"}, status=410)
        fenced_update(products, fence, stock=product.stock - 1)
        order = Order.objects.create(product=product)
    return JsonResponse({"order": order.pk, "stock": product.stock - 1})


@require_GET
def sales_report(request):
    """Units sold per product: the kind of heavy page a site runs a few at a time."""
    time.sleep(0.5)  # stands in for a slow query over a big table
    rows = Product.objects.annotate(sold=Count("orders")).values("name", "stock", "sold")
    return JsonResponse({"products": list(rows)})
