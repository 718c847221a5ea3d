"""Replacing attributes of another package's modules and classes, and putting them back: the
one mechanism behind each integration's patch() / unpatch()."""

from __future__ import annotations

import importlib


class Patches:
    """What was replaced, with the originals (each saved once: patching twice, then undoing,
    still restores the package's own)."""

    def __init__(self):
        self._saved: dict = {}  # (id(owner), attribute) -> (owner, original)

    def replace(self, owner, attribute: str, value) -> None:
        """``owner.attribute = value``, remembering the original (for a class, as it sits in
        its __dict__: a staticmethod stays one when restored)."""
        if (id(owner), attribute) not in self._saved:
            namespace = getattr(owner, "__dict__", {})
            original = namespace[attribute] if attribute in namespace else getattr(owner, attribute)
            self._saved[(id(owner), attribute)] = (owner, original)
        setattr(owner, attribute, value)

    def replace_in_modules(self, targets: dict) -> list[str]:
        """``{(module name, attribute): value}``, in the modules that exist and hold the
        attribute; returns the dotted names replaced."""
        replaced = []
        for (module_name, attribute), value in targets.items():
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # a version without that module: nothing captured there
                continue
            if hasattr(module, attribute):
                self.replace(module, attribute, value)
                replaced.append(f"{module_name}.{attribute}")
        return replaced

    def restore(self) -> None:
        """Put every original back."""
        for (_, attribute), (owner, original) in list(self._saved.items()):
            setattr(owner, attribute, original)
        self._saved.clear()
