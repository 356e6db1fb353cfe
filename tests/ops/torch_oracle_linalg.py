"""(issue 17) PyTorch oracles for this area's ops: `ORACLE[name](torch, args, attrs)` for ops
in the table, `COMPOSITE_ORACLE[name]` for composites; merged by `harness.py`."""

ORACLE: dict = {}
COMPOSITE_ORACLE: dict = {}
