"""No import circle anywhere in the product: a module that imports another is never imported back by it,
directly or through others, at the top of a file or inside a function (grimp counts both: it is the graph
lint-imports checks the layering on). An import circle means two modules are one concern split in two, or
that one of them holds what both need."""

from __future__ import annotations

import grimp

PACKAGES = ("worker", "sweeps", "dashboards", "service", "cli")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """One chain per pair of modules that reach each other: [a, b, ..., a]."""
    found: dict[frozenset[str], list[str]] = {}
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back and frozenset((module, imported)) not in found:
                found[frozenset((module, imported))] = [module, *back]
    return list(found.values())


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert circles(grimp.build_graph(*PACKAGES)) == []


def test_a_circle_is_found_where_there_is_one() -> None:
    graph = grimp.ImportGraph()
    for module in ("p", "p.a", "p.b", "p.c"):
        graph.add_module(module)
    graph.add_import(importer="p.a", imported="p.b")
    graph.add_import(importer="p.b", imported="p.c")
    graph.add_import(importer="p.c", imported="p.a")
    # each import of the circle, with the way back
    assert circles(graph) == [["p.a", "p.b", "p.c", "p.a"], ["p.b", "p.c", "p.a", "p.b"], ["p.c", "p.a", "p.b", "p.c"]]
    graph.remove_import(importer="p.c", imported="p.a")
    assert circles(graph) == []
