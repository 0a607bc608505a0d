"""The hot-product shop of ``benchmarks.purchase``; not the test settings."""
