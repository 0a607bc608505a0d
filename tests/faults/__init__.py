"""Fault injection: private Redis servers, a TCP fault proxy, oracles and scenarios.

``python -m tests.faults.report [--long]`` runs the scenarios and rewrites
``docs/reliability.rst`` with the figures they measure.
"""
