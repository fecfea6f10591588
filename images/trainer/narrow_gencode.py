"""Narrow a CUDA extension's setup.py to the wanted GPU architectures.

causal-conv1d's and mamba-ssm's setup.py append a fixed list of `-gencode arch=compute_N,code=sm_N`
pairs (sm_75 up to sm_121 under CUDA 13) whatever TORCH_CUDA_ARCH_LIST says. This rewrites the file in
place so that only the wanted pairs remain, and fails if one of them is not offered at all.

    python narrow_gencode.py SETUP_PY "8.0;9.0"
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_GENCODE = 'cc_flag.append("-gencode")'
_ARCH = re.compile(r'^(\s*)cc_flag\.append\("arch=compute_(\d+),code=sm_\2"\)\s*$')


def parse_arch_list(arch_list: str) -> set[str]:
    """TORCH_CUDA_ARCH_LIST syntax ("8.0;9.0", "9.0+PTX", "8.0 9.0") -> {"80", "90"}."""
    return {a.removesuffix("+PTX").replace(".", "") for a in re.split(r"[;,\s]+", arch_list) if a}


def narrow(source: str, wanted: set[str], name: str = "setup.py") -> str:
    lines = source.split("\n")
    offered = set()
    for i, line in enumerate(lines):
        match = _ARCH.match(line)
        if not match:
            continue
        if i == 0 or lines[i - 1].strip() != _GENCODE:
            raise SystemExit(f"{name}:{i + 1}: an architecture line without its -gencode line before it; "
                             "this layout is not the one narrow_gencode.py knows")
        offered.add(match.group(2))
        if match.group(2) not in wanted:
            # `pass` keeps the enclosing `if cuda_version >= ...:` blocks valid Python.
            lines[i - 1] = lines[i - 1].replace(_GENCODE, "pass")
            lines[i] = match.group(1) + "pass"
    missing = wanted - offered
    if missing:
        raise SystemExit(f"{name} offers no build for sm_{', sm_'.join(sorted(missing))} "
                         f"(it knows sm_{', sm_'.join(sorted(offered)) or '(none)'})")
    return "\n".join(lines)


def main(path: str, arch_list: str) -> None:
    setup = Path(path)
    wanted = parse_arch_list(arch_list)
    if not wanted:
        raise SystemExit(f"no architectures in {arch_list!r}; give e.g. \"9.0\" or \"8.0;9.0\"")
    setup.write_text(narrow(setup.read_text(), wanted, str(setup)))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.rstrip().splitlines()[-1].strip())
    main(sys.argv[1], sys.argv[2])
