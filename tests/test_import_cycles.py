"""No import circles between the modules of ``agentrl``.

Builds the import graph of ``agentrl`` with grimp (what import-linter builds its contracts on;
imports inside functions and under ``TYPE_CHECKING`` count too) and fails on every strongly
connected component of more than one module, printing one cycle of each.
"""

from __future__ import annotations

from collections.abc import Iterable

import grimp

#: Circles tolerated for now, each as the set of its modules: none. Listed explicitly so that
#: any circle fails unless it is named here with its reason (a listed circle that no longer
#: exists fails too, so the list cannot go stale).
ALLOWED_CYCLES: list[frozenset[str]] = []


def strongly_connected(graph: grimp.ImportGraph) -> list[set[str]]:
    """The graph's strongly connected components with more than one module (Tarjan's,
    iterative)."""
    modules = sorted(graph.modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(root, iter(()))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work[-1] = (root, iter(sorted(graph.find_modules_directly_imported_by(root))))
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def one_cycle(graph: grimp.ImportGraph, component: set[str]) -> list[str]:
    """A shortest circle through the component's first module, as a path of imports."""
    start = min(component)
    for importer in sorted(graph.find_modules_that_directly_import(start) & component):
        path = graph.find_shortest_chain(importer=start, imported=importer)
        if path:
            return [*path, start]
    return sorted(component)


def describe(graph: grimp.ImportGraph, component: set[str]) -> str:
    lines = [" -> ".join(one_cycle(graph, component))]
    for module in sorted(component):
        for imported in sorted(graph.find_modules_directly_imported_by(module) & component):
            details = graph.get_import_details(importer=module, imported=imported)
            where = ", ".join(f"line {d['line_number']}" for d in details)
            lines.append(f"    {module} imports {imported} ({where})")
    return "\n".join(lines)


def test_no_import_cycles() -> None:
    graph = grimp.build_graph("agentrl", cache_dir=None)
    components = strongly_connected(graph)
    found = {frozenset(c) for c in components}
    unexpected = [c for c in components if frozenset(c) not in ALLOWED_CYCLES]
    stale = [c for c in ALLOWED_CYCLES if c not in found]
    report = "\n\n".join(describe(graph, c) for c in unexpected)
    assert not unexpected, f"import circles in agentrl:\n{report}"
    assert not stale, f"allowed circles that no longer exist (remove them): {stale}"


def test_the_check_finds_a_circle() -> None:
    """The component search itself: a two-module circle and a self-contained module."""
    graph = grimp.ImportGraph()
    for name in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(name)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.a")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    assert strongly_connected(graph) == [{"pkg.a", "pkg.b"}]
    assert one_cycle(graph, {"pkg.a", "pkg.b"}) == ["pkg.a", "pkg.b", "pkg.a"]
