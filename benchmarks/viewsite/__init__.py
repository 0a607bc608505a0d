"""A minimal Django site for ``benchmarks.views``; not the test settings."""
