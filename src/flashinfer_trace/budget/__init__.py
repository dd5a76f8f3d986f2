"""A GPU's memory, handed out by one owner to every process that allocates there (docs/matrix-sessions.md,
"Device memory"): the ledger (ledger.py), this process's view of it (device.py), a case's plan (plan.py) and
the engine's cases run within it (guard.py)."""

from .device import DeviceBudget, budget_root, device_budget, is_out_of_memory
from .ledger import BudgetTimeout, Lease, Ledger

__all__ = ["BudgetTimeout", "DeviceBudget", "Lease", "Ledger", "budget_root", "device_budget", "is_out_of_memory"]
