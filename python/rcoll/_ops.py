"""The collectives, reduce ops and dtypes as the core defines them, and the one
translation of a caller's reduce op into the core's code.

Every front end (the numpy API, the torch backend, rcoll.cuda) reads these
tables, which the core publishes (rcoll._core.OPS, REDUCE_OPS, DTYPES), so a
collective or reduce op added to the core needs no table here.
"""
from __future__ import annotations

from . import _core

# name -> {"code", "reduces", "rooted", "per_rank_blocks", "on_device"}
OPS = {name: dict(row) for name, row in _core.OPS.items()}
REDUCE_OPS = dict(_core.REDUCE_OPS)  # name -> code
DTYPES = dict(_core.DTYPES)  # name (numpy's and torch's spelling) -> code

ALLREDUCE = OPS["allreduce"]["code"]
ALLGATHER = OPS["allgather"]["code"]
REDUCE_SCATTER = OPS["reduce_scatter"]["code"]
BROADCAST = OPS["broadcast"]["code"]
REDUCE = OPS["reduce"]["code"]
GATHER = OPS["gather"]["code"]
SCATTER = OPS["scatter"]["code"]
BARRIER = OPS["barrier"]["code"]
ADASUM = OPS["adasum"]["code"]
_OP_NAMES_BY_CODE = {row["code"]: name for name, row in OPS.items()}

# Other spellings of the core's names: torch's ReduceOp calls prod PRODUCT.
_ALIASES = {"product": "prod"}
_NAMES_BY_CODE = {code: name for name, code in REDUCE_OPS.items()}
SUM = REDUCE_OPS["sum"]
AVG = REDUCE_OPS["avg"]


def reduce_op_code(op, where: str, *, codes: bool = False) -> int:
    """The core's code of `op`: a name ("sum", "MAX", "product"), or an object
    with such a `name` (torch.distributed.ReduceOp and similar enums); with
    `codes`, also a code itself. `where` starts the error's message (the rank
    and the op, or the module)."""
    if codes and isinstance(op, int) and not isinstance(op, bool) and op in _NAMES_BY_CODE:
        return op
    name = getattr(op, "name", op)
    if isinstance(name, str):
        name = name.lower()
        code = REDUCE_OPS.get(_ALIASES.get(name, name))
        if code is not None:
            return code
    raise _core.InvalidArgumentError(f"{where}: unknown reduce op {op!r} (use one of {', '.join(REDUCE_OPS)})")


def op_name(code: int) -> str:
    """A collective's name from its code."""
    return _OP_NAMES_BY_CODE[code]


def reduce_op_name(code: int) -> str:
    return _NAMES_BY_CODE[code]


def codes_by_enum_value(members) -> dict:
    """{int(member.value): code} for the members of a reduce-op enum that the
    core knows by name: an int key hashes in nanoseconds where an enum costs
    about a microsecond, on the small-op path."""
    table = {}
    for member in members:
        try:
            table[int(member.value)] = reduce_op_code(member, "")
        except _core.InvalidArgumentError:
            pass  # PREMUL_SUM and other ops the core has no code for
    return table
