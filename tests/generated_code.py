"""The C++ inductor generates for a gradwise step, read by the tests that check its form."""
from __future__ import annotations


def keep_generated_code(monkeypatch, owner: type) -> list[str]:
    """A list that collects the generated code (the compiled graph's ``source_code``) of each graph that ``owner``'s
    ``_backend`` compiles from now on (the graph store off: a loaded graph would not call the backend)."""
    monkeypatch.setenv("GRADWISE_GRAPH_CACHE", "0")
    sources = []
    backend = owner._backend

    def keep(self, gm, example_inputs):
        compiled = backend(self, gm, example_inputs)
        sources.append(compiled.source_code)
        return compiled

    monkeypatch.setattr(owner, "_backend", keep)
    return sources
