"""The guide's rule, held: contract.py's `_id_offset` is the only place a layer id is shifted.

Every module of src/eaglewire but contract.py is parsed (nothing imported) and each constant added to or taken
from a layer id, a tap or a boundary is reported: `b - 1` on a tap, `[i + 1 for i in ids]`, `i + 1 in taps` over
a layer index, `aux[0] - 1`. Such a shift is one engine's numbering written a second time, where the next release
or engine will not look: read the ids through the engine record's convention and `contract.renumber` /
`from_engine` / `to_engine` instead (`contract.misnumbered` for a deliberate off-by-one candidate).

What counts as a layer id: a name (variable, attribute, keyword) with a word of ID_WORDS in it (split at `_`) and
no word of COUNT_WORDS (num_layers is a count, its `- 1` the last layer), an item of one (`ids[0]`), and a loop
variable over one (`for b in taps`, `for i, layer in enumerate(self.layers)`). Counts, lengths and positions in a
sequence are no layer ids and are not reported.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
HOME = "eaglewire/contract.py"  # the one module allowed to shift ids (its `_id_offset`)
ID_WORDS = {"id", "ids", "tap", "taps", "boundary", "boundaries", "layer", "layers", "aux", "delivered"}
STEP_WORDS = {"shift", "offset", "plus", "minus"}
COUNT_WORDS = {"num", "n", "count", "len", "size", "width", "token", "tokens", "sample", "draft", "input", "target"}
# Shifts left in modules another change rewrites now (the loader rewrite): each is routed through contract when that
# lands (renumber with the engine record's conventions; misnumbered for the doctor's ±1 candidates). Path -> the
# exact source text of each. Stale entries fail below, so this list only shrinks.
PENDING: dict[str, list[str]] = {}


def _words(name: str) -> set[str]:
    return {w for w in name.lower().split("_") if w}


def _id_name(name: str) -> bool:
    words = _words(name)
    return bool(words & ID_WORDS) and not words & COUNT_WORDS


def _is_step(node: ast.AST) -> bool:
    """A shift's amount: a nonzero int, or a value named as one (`shift`, `offset`, `plus`, `SHIFT[rule]`)."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int and node.value != 0
    if isinstance(node, ast.Subscript):
        return _is_step(node.value)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return bool(_words(name) & STEP_WORDS)


class _Scan(ast.NodeVisitor):
    """Collects (line, source) of each constant shift of a layer id; loop variables over ids are ids."""

    def __init__(self, text: str) -> None:
        self.text, self.found, self.ids = text, [], set()  # type: ignore[var-annotated]

    def is_id(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.ids or _id_name(node.id)
        if isinstance(node, ast.Attribute):
            return _id_name(node.attr)
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            return self.is_id(node.value)
        if isinstance(node, ast.BoolOp):  # `ids or ()`
            return any(self.is_id(v) for v in node.values)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("int", "enumerate", "sorted", "tuple", "list")
        ):
            return any(self.is_id(a) for a in node.args)
        return False

    def bind(self, target: ast.AST, iterable: ast.AST) -> None:
        """`for target in iterable`: the target's names are ids if the iterable holds ids (enumerate: both)."""
        if self.is_id(iterable):
            self.ids |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        outer, self.ids = self.ids, set(self.ids)  # a loop variable is an id in its own function only
        self.generic_visit(node)
        self.ids = outer

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_For(self, node: ast.For) -> None:
        self.bind(node.target, node.iter)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.bind(node.target, node.iter)
        self.generic_visit(node)

    def _visit_scope(self, node: ast.AST) -> None:
        # comprehension targets are bound before the element is visited: visit generators first
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for gen in node.generators:
                self.visit(gen)
        self.generic_visit(node)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_scope

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, (ast.Add, ast.Sub)):
            for step, other in ((node.left, node.right), (node.right, node.left)):
                if _is_step(step) and self.is_id(other):
                    self.found.append((node.lineno, ast.get_source_segment(self.text, node) or ""))
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, (ast.Add, ast.Sub)) and _is_step(node.value) and self.is_id(node.target):
            self.found.append((node.lineno, ast.get_source_segment(self.text, node) or ""))
        self.generic_visit(node)


def shifts(text: str) -> list[tuple[int, str]]:
    """(line, source) of every constant added to or taken from a layer id in a module's text."""
    scan = _Scan(text)
    scan.visit(ast.parse(text))
    return sorted(set(scan.found))


def _found() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted((SRC / "eaglewire").rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel != HOME and (found := shifts(path.read_text())):
            out[rel] = found
    return out


def test_no_layer_id_is_shifted_outside_the_contract() -> None:
    found = _found()
    new = {p: [f"{line}: {src}" for line, src in f if src not in PENDING.get(p, [])] for p, f in found.items()}
    new = {p: f for p, f in new.items() if f}
    assert not new, (
        "a layer id shifted outside contract.py's _id_offset (read it through the engine record's "
        f"convention and contract.renumber / from_engine / to_engine): {new}"
    )
    stale = {p: [s for s in srcs if s not in {src for _, src in found.get(p, [])}] for p, srcs in PENDING.items()}
    stale = {p: s for p, s in stale.items() if s}
    assert not stale, f"PENDING lists shifts that are gone: drop them: {stale}"


def test_the_scan_sees_the_shifts_it_exists_for() -> None:
    """The forms this repo had (SGLang's DFlash shift, the doctor's vLLM +1, the hook on layer b-1, the runtime's
    layer index), each seen; counts, lengths, batch rows and token positions not."""
    planted = """
def f(ids, taps, target, aux, layers, rule, delivered):
    a = tuple(int(i) + SHIFT[rule] for i in ids)
    b = [i - 1 for i in aux] + [i + plus for i in ids or ()]
    for t in taps:
        target.layers[t - 1]
    for i, layer in enumerate(layers):
        if i + 1 in taps:
            pass
    c = ids[0] + 1
    d = tuple(x - 1 for x in delivered)
    layer_id = 3
    layer_id += 1
"""
    assert shifts(planted) == [
        (3, "int(i) + SHIFT[rule]"),
        (4, "i + plus"),
        (4, "i - 1"),
        (6, "t - 1"),
        (8, "i + 1"),
        (10, "ids[0] + 1"),
        (11, "x - 1"),
        (13, "layer_id += 1"),
    ]
    innocent = """
def g(num_layers, taps, n, tokens, ctx, rows, target, input_ids, label_offset):
    last = num_layers - 1
    width = (len(taps) - 1) * 4
    for b, anchors in rows:
        ctx[b:b + 1]
    x = list(range(1, n + 1))
    y = tokens.index(2) + 1
    z = target.num_layers + 1
    p = input_ids.shape[1] + 1
    q = 1 - label_offset + len(taps)
"""
    assert shifts(innocent) == []


def test_the_contract_itself_is_where_the_shift_lives() -> None:
    """The scan run on contract.py finds its offset arithmetic: the rule has a home, and the scan can see it."""
    found = {src for _, src in shifts((SRC / HOME).read_text())}
    assert {"b - offset", "i + offset"} <= found, found  # to_engine and from_engine apply _id_offset's answer
