"""vllm-luce's version (pyproject.toml's): a module of its own, so that any module may read it without importing the
plugin's entry point."""

__version__ = "0.1.0"
