"""Memory planning for a target + drafter pair, in four modules with one job each:

- :mod:`.planner`: the pure planner (layouts, placement on a budget, the Plan);
- :mod:`.probe`: what llama.cpp says (compute buffers, logged buffer sizes, device budgets);
- :mod:`.pair`: a real pair planned from its files, and the Engine keyword arguments from a plan;
- :mod:`.live`: what the loaded engine actually allocated, against its plan.

Nothing here prints; the CLI shows plans and notes. The runtime never imports this package.
The entry points below are imported on first use (the planner alone never loads llama.cpp).
"""

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "Layout": ".planner", "Plan": ".planner", "Part": ".planner", "DeviceBudget": ".planner",
    "DeviceUse": ".planner", "layout": ".planner", "plan_memory": ".planner",
    "plan_files": ".pair", "plan_engine": ".pair", "memory_report": ".live",
}

if TYPE_CHECKING:  # pragma: no cover
    from .live import memory_report
    from .pair import plan_engine, plan_files
    from .planner import DeviceBudget, DeviceUse, Layout, Part, Plan, layout, plan_memory

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec.memory' has no attribute '{name}'")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
