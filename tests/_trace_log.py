"""Reading a TORCH_TRACE directory the way tlparse does: the artifacts that
upstream (and the C path, through upstream's sink) logged, in log order."""

from __future__ import annotations

import glob
import json
import os
import re


def split_blocks(payload: str) -> list:
    """An aot_autograd_runtime_wrappers payload (2.15's aggregated artifact)
    as [(name, text)]: blocks ``# <name>\\n<text>`` joined by a blank line."""
    parts = re.split(r"(?:\A|\n\n)# ([A-Za-z_][A-Za-z0-9_]*)\n", payload)
    assert parts[0] == "", payload[:200]
    return list(zip(parts[1::2], parts[2::2]))


def read_artifacts(trace_dir, names) -> list:
    """[(name, payload)] of the artifacts named in ``names``, in log order."""
    out = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "*.log"))):
        with open(path) as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            start = line.find("{")
            if start < 0 or '"artifact"' not in line:
                continue
            name = json.loads(line[start:])["artifact"]["name"]
            if name not in names:
                continue
            payload = []
            for more in lines[i + 1:]:
                if not more.startswith("\t"):
                    break
                payload.append(more[1:])
            out.append((name, "\n".join(payload)))
    return out
