"""Integrations with training frameworks, each imported explicitly (``sparse_compile.integrations.hf``):
importing ``sparse_compile`` or this package never imports the frameworks themselves."""
