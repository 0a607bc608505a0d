from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    stock = models.PositiveIntegerField(default=0)
    # Fencing token of the last lock holder that wrote this row. A write under
    # a lock only lands if its token is higher, so a holder whose lease ran out
    # (a long GC pause, a stalled worker) cannot overwrite a newer holder's work.
    fence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    created = models.DateTimeField(auto_now_add=True)
    # The fence of the lock the order was placed under (0: placed without one).
    fence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"order {self.pk} of {self.product_id}"
