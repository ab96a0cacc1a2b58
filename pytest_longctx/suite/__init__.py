"""The sweep, shipped: ``pytest --pyargs pytest_longctx.suite`` runs it in any project."""
