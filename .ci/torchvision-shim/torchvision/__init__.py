"""Import-only stand-in for torchvision in the CPU test environment (see ../README.md)."""
__version__ = "0.0.0+import-only"


class Unavailable:
    """Any name imported from the shim: attribute access works (for module-level tables), calls raise."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> "Unavailable":
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Unavailable(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"torchvision.{self._name} was called, but this environment only has the import-only "
            "torchvision shim from .ci/torchvision-shim (text-only models)."
        )


def module_getattr(prefix: str):
    def __getattr__(name: str) -> Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{prefix}.{name}")
    return __getattr__
