"""``kvfence.contracts.tables.TableContract``: the name table contracts were written against, kept for them.

Every contract is now written against ``kvfence.contract.Contract`` (its tables, an element oracle and a launcher
are the interface itself); this alias keeps an existing record's import working.
"""

from kvfence.contract import Contract as TableContract
from kvfence.contract import Launch, Mutant, Table

__all__ = ["Launch", "Mutant", "Table", "TableContract"]
