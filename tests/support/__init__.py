"""Test tooling shared by the suite (and the benchmarks): harnesses, waits, ports, certificates, proxies.

Product packages never import it (tests/test_product_imports.py checks that).
"""
