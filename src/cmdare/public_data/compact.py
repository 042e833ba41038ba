"""How the bundled ``lifetimes/gce_cpu_preemptions.json`` was made from the upstream file.

Upstream (github.com/kadupitiya/goog-preemption-data) keeps each VM's full GCE operation records
(self links, operation ids, user e-mail: 2.6 MB). The bundled copy keeps, per VM, exactly the fields
cmdare's preemption importer reads, in the same layout, so the one parser reads both files and
gives the same rows (``tests/measure`` checks this on a slice of the original)::

    python -m cmdare.public_data.compact UPSTREAM.json BUNDLED.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["compact_preemptions"]

_TOP_FIELDS = ("instance_data", "time_in_sec", "hr_of_day", "idle_vs_nonidle")
_OPERATIONS = ("insert", "stop", "compute.instances.preempted")
_OPERATION_FIELDS = ("insertTime", "startTime")


def compact_preemptions(vms: dict[str, Any]) -> dict[str, Any]:
    """The VMs with only the fields the importer reads (non-dict entries are kept as they are)."""
    out: dict[str, Any] = {}
    for name, vm in vms.items():
        if not isinstance(vm, dict):
            out[name] = vm
            continue
        kept = {k: vm[k] for k in _TOP_FIELDS if k in vm}
        for op in _OPERATIONS:
            if isinstance(vm.get(op), dict):
                kept[op] = {k: vm[op][k] for k in _OPERATION_FIELDS if k in vm[op]}
        out[name] = kept
    return out


def main(argv: list[str] | None = None) -> None:
    """Write the compact copy of an upstream preemption JSON."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise SystemExit("usage: python -m cmdare.public_data.compact UPSTREAM.json BUNDLED.json")
    src, dst = Path(args[0]), Path(args[1])
    data = compact_preemptions(json.loads(src.read_text(encoding="utf-8")))
    dst.write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{src} ({src.stat().st_size:,} B) -> {dst} ({dst.stat().st_size:,} B), {len(data)} VMs")


if __name__ == "__main__":
    main()
