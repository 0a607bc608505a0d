from __future__ import annotations

from django.db import models


class Product(models.Model):
    stock = models.PositiveIntegerField(default=0)
    # Fencing token of the last lock holder that wrote the row.
    fence = models.BigIntegerField(default=0)

    class Meta:
        app_label = "purchasesite"

    def __str__(self) -> str:
        return f"product {self.pk}"


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    fence = models.BigIntegerField(default=0)

    class Meta:
        app_label = "purchasesite"

    def __str__(self) -> str:
        return f"order {self.pk} of {self.product_id}"
