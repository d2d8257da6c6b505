"""An import-linter contract type of our own (pyproject.toml, [tool.importlinter]): the layers of
docs/architecture.md, with every module placed on one of them.

import-linter's `layers` contract checks only the modules its layers name: a new module that no
layer names imports what it likes, unseen. Its `exhaustive` option closes that gap only within
one container, and the broker's layers cut across its three apps. This contract is `layers` and,
besides, breaks while any module of the root packages sits on no layer, unless `outside_layers`
says it may (the migrations; a package of its own contract).
"""

from __future__ import annotations

from collections.abc import Iterable

import grimp
from importlinter.application import output
from importlinter.contracts.layers import LayersContract
from importlinter.domain import fields
from importlinter.domain.contract import ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules


class LayersOfEveryModule(LayersContract):
    """`layers`, and every module of the root packages on one of them.

    Configuration options: those of `layers`, and
        - outside_layers: module expressions of the modules allowed on no layer. (Optional.)
    """

    outside_layers = fields.ListField(subfield=fields.ModuleExpressionField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        check = super().check(graph, verbose)
        unplaced = sorted(self._modules_on_no_layer(graph))
        check.metadata["modules_on_no_layer"] = unplaced
        check.kept = check.kept and not unplaced
        return check

    def render_broken_contract(self, check: ContractCheck) -> None:
        super().render_broken_contract(check)
        unplaced = check.metadata["modules_on_no_layer"]
        if unplaced:
            output.print("These modules sit on no layer (docs/architecture.md places each):")
            output.new_line()
            for module in unplaced:
                output.print_error(f"- {module}", bold=False)
            output.new_line()

    def _modules_on_no_layer(self, graph: grimp.ImportGraph) -> Iterable[str]:
        placed = {tail.name for tail in self.all_module_tails}
        allowed = module_expressions_to_modules(graph, self.outside_layers or [])  # type: ignore[arg-type]
        excused = {module.name for module in allowed}
        roots: list[str] = self.session_options["root_packages"]
        for module in graph.modules:
            if module.split(".")[0] not in roots or module in excused:
                continue
            if not any(module == layer or module.startswith(f"{layer}.") for layer in placed):
                yield module
