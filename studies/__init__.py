"""Studies beside the product: short readers of the store (``calibseg-store``) that measure a shipped model's
fitted rules on the out-of-fold and test patients. Nothing here is installed; run from the repository root with
``python -m studies.<name>``."""
