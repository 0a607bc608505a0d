from typing import ClassVar

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


# -- Every shape of queryset a fenced write can be given (tests/test_fencing_shapes.py): joins
# both ways, multi-table inheritance with the fence in the parent's table, in the child's and in
# a second parent's, proxies, and managers whose default filter joins.


class Shelf(models.Model):
    name = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return self.name


class Item(models.Model):
    name = models.CharField(max_length=40, default="")
    stock = models.IntegerField(default=0)
    fence = models.BigIntegerField(default=0)
    shelf = models.ForeignKey(Shelf, null=True, on_delete=models.SET_NULL)

    def __str__(self) -> str:
        return self.name


class Label(models.Model):
    """The reverse side of a join: ``Item.objects.filter(labels__text=...)``."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="labels")
    text = models.CharField(max_length=40, default="")

    def __str__(self) -> str:
        return self.text


class Parcel(Item):
    """Multi-table inheritance, the fence in the parent's table."""

    code = models.CharField(max_length=20, default="")


class Crate(models.Model):
    name = models.CharField(max_length=40, default="")
    stock = models.IntegerField(default=0)

    def __str__(self) -> str:
        return self.name


class SealedCrate(Crate):
    """Multi-table inheritance, the fence in the child's table."""

    fence = models.BigIntegerField(default=0)
    code = models.CharField(max_length=20, default="")


class Lid(models.Model):
    lid_id = models.AutoField(primary_key=True)
    seal = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"lid {self.lid_id}"


class LiddedItem(Item, Lid):
    """Multiple inheritance: the fence ``seal`` in the table of the parent that is not
    on the primary key's chain (``lid_ptr`` is not the primary key)."""

    colour = models.CharField(max_length=20, default="")


class InStockManager(models.Manager["Item"]):
    def get_queryset(self) -> models.QuerySet[Item]:
        return super().get_queryset().filter(stock__gte=0)


class OnOpenShelfManager(models.Manager["Item"]):
    def get_queryset(self) -> models.QuerySet[Item]:
        return super().get_queryset().filter(shelf__name="open")


class InStockItem(Item):
    """A proxy whose manager filters by default."""

    objects: ClassVar[InStockManager] = InStockManager()

    class Meta:
        proxy = True


class OpenShelfItem(Item):
    """A proxy whose manager's default filter joins another table."""

    objects: ClassVar[OnOpenShelfManager] = OnOpenShelfManager()

    class Meta:
        proxy = True
