"""Namespaced keys: a chain keeps each link's state and scalars under ``"<namespace>.<key>"``; a link sees its
own under their own names (``strip_namespace``, ``scoped``)."""
from __future__ import annotations

from typing import Any, Mapping

from gradwise.core.context import Context


def strip_namespace(namespace: str, entries: Mapping[str, Any]) -> Mapping[str, Any]:
    """The entries under ``namespace`` with it taken off their keys (namespace ``""``: all, as they are);
    of a ``Namespaced`` mapping, the ones it took off once."""
    if not namespace:
        return entries
    if type(entries) is Namespaced:
        return entries.under(namespace)
    prefix = namespace + "."
    return {k[len(prefix):]: v for k, v in entries.items() if k.startswith(prefix)}


class Namespaced(dict):
    """Entries under namespaced keys that nobody changes once they are made (a constants buffer's unpacked
    scalars, kept with it; a steady bucket's state lists, ``core/steady.py``): each namespace's entries are
    taken apart once (``under``), not at every step of every link. (Eager only: traced code gets plain dicts.)"""

    __slots__ = ("_parts",)

    def under(self, namespace: str) -> dict[str, Any]:
        """``strip_namespace(namespace, self)``, made at the first call."""
        parts = getattr(self, "_parts", None)
        if parts is None:
            parts = self._parts = {}
        part = parts.get(namespace)
        if part is None:
            prefix = namespace + "."
            part = parts[namespace] = {k[len(prefix):]: v for k, v in self.items() if k.startswith(prefix)}
        return part


def scoped(namespace: str, ctx: Context) -> Context:
    """``ctx`` as the link under ``namespace`` sees it: its own scalars, under their own names."""
    return ctx.but(scalars=strip_namespace(namespace, ctx.scalars)) if namespace else ctx
