"""Send many requests to the shop at once, and say what happened.

Run it next to manage.py, while the server runs:

    python load.py buy 1 --requests 60 --concurrency 20
    python load.py report --requests 10 --concurrency 10

``buy`` also reads product 1's stock and orders from the database, before and
after, and exits with status 1 unless exactly the units sold left the stock.
"""

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor


def send(url, method):
    """One request: its status and whether it said when to retry."""
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, False
    except urllib.error.HTTPError as error:
        return error.code, "Retry-After" in error.headers


def fire(url, method, requests, concurrency):
    """Send ``requests`` requests, ``concurrency`` at a time; count the answers."""
    with ThreadPoolExecutor(concurrency) as pool:
        answers = list(pool.map(lambda _: send(url, method), range(requests)))
    print(f"{requests} x {method} {url}, {concurrency} at a time:")
    statuses = Counter(status for status, _ in answers)
    for status, count in sorted(statuses.items()):
        print(f"  {status}: {count}")
    return statuses, sum(retry for _, retry in answers)


def buy(args):
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    django.setup()
    from shop.models import Product

    def counts():
        product = Product.objects.get(pk=args.product)
        return product.stock, product.orders.count()

    stock_before, orders_before = counts()
    url = f"{args.server}/products/{args.product}/buy"
    statuses, _ = fire(url, "POST", args.requests, args.concurrency)
    stock_after, orders_after = counts()
    sold = orders_after - orders_before
    print(f"Stock {stock_before} -> {stock_after}, orders {orders_before} -> {orders_after}.")
    if statuses[200] == sold == stock_before - stock_after and set(statuses) <= {200, 410}:
        print(f"OK: sold {sold}, and the stock went down by exactly {sold}.")
        return 0
    print("WRONG: every sale should be one 200, one order and one unit less in stock.")
    return 1


def report(args):
    statuses, with_retry_after = fire(
        f"{args.server}/reports/sales", "GET", args.requests, args.concurrency
    )
    print(f"Throttled (503): {statuses[503]}, {with_retry_after} of them with Retry-After.")
    return 0 if set(statuses) <= {200, 503} else 1


def main():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", default="http://127.0.0.1:8000")
    common.add_argument("--requests", type=int, default=60)
    common.add_argument("--concurrency", type=int, default=20)
    parser = argparse.ArgumentParser(description="Send many requests to the shop at once.")
    commands = parser.add_subparsers(required=True)
    buying = commands.add_parser("buy", parents=[common], help="buy a product, many times")
    buying.add_argument("product", type=int)
    buying.set_defaults(run=buy)
    reporting = commands.add_parser("report", parents=[common], help="get the sales report")
    reporting.set_defaults(run=report)
    args = parser.parse_args()
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
