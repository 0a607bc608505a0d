from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    stock = models.PositiveIntegerField(default=0)
    # The fencing token of the last lock holder that wrote this row.
    fence = models.BigIntegerField(default=0)

    def __str__(self):
        return self.name


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self):
        return f"Order {self.pk} of {self.product}"
