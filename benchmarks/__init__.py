"""Benchmarks for django-redislock. Not part of the test suite.

* ``python -m benchmarks.locks`` compares ``django_redislock.Lock`` with other
  Redis lock implementations against one private Redis the harness starts.
* ``python -m benchmarks.views`` measures the cost of ``@redis_locked`` and of
  the concurrency-limit middleware on a small Django site served by gunicorn.
* ``python -m benchmarks.purchase`` sells one hot product on PostgreSQL under
  gunicorn through ``select_for_update``, a conditional UPDATE and
  ``@redis_locked``, with and without a slow call inside the critical section.

See ``docs/benchmarks.rst`` for the method and the latest results.
"""
