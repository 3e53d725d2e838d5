"""The Python tools' imports among themselves (tools/*.py): no module imports, directly or through
others, a module that imports it back. Every import counts, at the top of a file or inside a function
(a deferred import still ties the two modules together). Reads the sources only (ast); runs nothing."""
import ast
import os
from pathlib import Path

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"


def tool_imports():
    """{module: set of tools modules it imports}, for every tools/*.py."""
    names = {p.stem for p in TOOLS.glob("*.py")}
    graph = {}
    for p in sorted(TOOLS.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[p.stem] = (found & names) - {p.stem}
    return graph


def find_cycle(graph):
    """One import cycle as [a, b, ..., a], or None (depth-first search with colours)."""
    colour, stack = {}, []

    def visit(m):
        colour[m] = "grey"
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if colour.get(n) == "grey":
                return stack[stack.index(n):] + [n]
            if n not in colour:
                c = visit(n)
                if c:
                    return c
        stack.pop()
        colour[m] = "black"
        return None

    for m in sorted(graph):
        if m not in colour:
            c = visit(m)
            if c:
                return c
    return None


def test_the_cycle_finder_finds_a_cycle():
    # The check below must be able to fail: a made-up graph with a cycle of three and one without.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_sees_the_tools_imports():
    g = tool_imports()
    # Known edges, so that a parser that sees nothing cannot pass the cycle test.
    assert "hub_tokenizer" in g["prep_common"]
    assert "wordpiece_vocab" in g["hub_tokenizer"] and "wordpiece_vocab" in g["prep_common"]
    assert "prep_common" in g["prep_ner"]


def test_no_import_cycle_among_the_tools():
    cycle = find_cycle(tool_imports())
    assert cycle is None, "tools/ modules import each other: " + " -> ".join(cycle)
