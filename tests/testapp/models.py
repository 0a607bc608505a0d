from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    stock = models.IntegerField(default=0)
    # Highest fencing token that wrote this row (see django_redislock.fencing).
    fence = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    product = models.ForeignKey(Product, on_delete=models.CASCADE)

    def __str__(self) -> str:
        return f"order {self.pk} of {self.product_id}"


class GiftCard(Product):
    """Multi-table inheritance: its fence lives in the parent's table."""

    code = models.CharField(max_length=20, default="")


class Ticket(models.Model):
    """Fields whose values the database hands back in their own types.

    No JSONField: its system check queries SQLite for JSON support, which
    Django 6.1 runs in every test that runs the checks."""

    fence = models.BigIntegerField(default=0)
    code = models.SlugField(unique=True, default="")
    sold_at = models.DateTimeField(null=True)
    paid = models.BooleanField(default=False)
    price = models.DecimalField(max_digits=8, decimal_places=2, default=0)
    uid = models.UUIDField(null=True)

    def __str__(self) -> str:
        return self.code
