"""Build-time check of the trainer image: the Mamba-2 kernels import and carry code for every
architecture in TORCH_CUDA_ARCH_LIST (argv[1], e.g. "8.0;9.0"). Needs no GPU: it reads the
extensions' embedded cubins with cuobjdump."""

import importlib
import subprocess
import sys


def main(arch_list: str) -> None:
    # transformers takes the fast path only when these import cleanly; mamba_ssm's package init
    # imports the compiled extension, so a broken build shows up here.
    import mamba_ssm  # noqa: F401
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined  # noqa: F401
    from causal_conv1d import causal_conv1d_fn  # noqa: F401

    wanted = {"sm_" + a.strip().replace(".", "").removesuffix("+PTX") for a in arch_list.replace(",", ";").split(";") if a.strip()}
    for name in ("selective_scan_cuda", "causal_conv1d_cuda"):
        path = importlib.import_module(name).__file__
        listing = subprocess.run(["cuobjdump", "--list-elf", path], capture_output=True, text=True, check=True).stdout
        missing = sorted(arch for arch in wanted if f".{arch}." not in listing)
        if missing:
            sys.exit(f"{name} ({path}) has no code for {', '.join(missing)}; cubins:\n{listing}")
        print(f"{name}: {', '.join(sorted(wanted))} present")


if __name__ == "__main__":
    main(sys.argv[1])
