"""The Dockerfiles, checked without Docker (CI has no daemon; the images are NOT built here).

A small parser reads each Dockerfile (continuation lines, ARG defaults) and checks what can be checked
statically: pinned base images and packages, a non-root numeric USER, HOME and caches set, the CUDA
arch list for the Mamba-2 kernels, and that every COPY source exists and survives .dockerignore.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import py_compile
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ("trainer", "runtime")


def instructions(name: str) -> list[tuple[str, str]]:
    return parse((ROOT / "images" / name / "Dockerfile").read_text())


def parse(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def args_and_env(steps) -> tuple[dict[str, str], dict[str, str]]:
    args, env = {}, {}
    for keyword, rest in steps:
        if keyword == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value.strip('"')
        if keyword == "ENV":
            for token in shlex.split(rest):
                key, _, value = token.partition("=")
                env[key] = value
    return args, env


def expand(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)


def pip_requirements(steps, values) -> list[str]:
    """Every requirement named in a `pip install` (flags and their values dropped)."""
    reqs = []
    for keyword, rest in steps:
        if keyword != "RUN":
            continue
        lexer = shlex.shlex(expand(rest, values), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        commands, current = [], []
        for token in lexer:
            if token in ("&&", ";", "||", "(", ")"):
                commands.append(current)
                current = []
            else:
                current.append(token)
        for tokens in [*commands, current]:
            while tokens and "=" in tokens[0] and not tokens[0].startswith("-"):
                tokens = tokens[1:]  # VAR=value prefixes
            if tokens[:2] != ["pip", "install"]:
                continue
            skip = False
            for token in tokens[2:]:
                if skip:
                    skip = False
                elif token in ("--index-url", "--extra-index-url", "-r", "-c"):
                    skip = True
                elif not token.startswith("-"):
                    reqs.append(token)
    return reqs


@pytest.mark.parametrize("name", IMAGES)
def test_base_image_pinned_and_user_non_root(name):
    steps = instructions(name)
    args, env = args_and_env(steps)
    (base,) = [expand(rest, args) for keyword, rest in steps if keyword == "FROM"]
    image, _, tag = base.rpartition(":")
    assert image and tag and tag != "latest" and re.search(r"\d+\.\d+", tag), base
    users = [rest for keyword, rest in steps if keyword == "USER"]
    assert users and users[-1].isdigit() and int(users[-1]) != 0, users
    assert env["HOME"].startswith("/home/") and env["XDG_CACHE_HOME"].startswith(env["HOME"])
    # The home is created for that UID (and group 0, for arbitrary-UID clusters) before USER.
    run = " ".join(rest for keyword, rest in steps if keyword == "RUN")
    assert f"--uid {users[-1]}" in run and f"--home-dir {env['HOME']}" in run and "chmod -R g=u" in run


def test_parser_sees_unpinned_packages():
    steps = parse(
        'ARG V=1.0\nRUN apt-get update \\\n  && A="x;y" pip install --index-url "$U" torch "numpy==${V}" /opt/flashdraft/src\n'
    )
    assert pip_requirements(steps, args_and_env(steps)[0]) == ["torch", "numpy==1.0", "/opt/flashdraft/src"]


@pytest.mark.parametrize("name", IMAGES)
def test_every_package_pinned(name):
    steps = instructions(name)
    args, env = args_and_env(steps)
    reqs = pip_requirements(steps, {**args, **env})
    assert reqs
    for req in reqs:
        local = req.startswith(("/opt/flashdraft/src", "/tmp/kernel-wheels/"))  # built in an earlier step
        assert local or re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.+]*", req), f"{name}: unpinned {req!r}"
    assert "torch==2.13.0" in reqs


def test_trainer_builds_mamba_kernels_for_h100_h200():
    steps = instructions("trainer")
    args, env = args_and_env(steps)
    arches = set(args["TORCH_CUDA_ARCH_LIST"].split(";"))
    assert {"8.0", "9.0"} <= arches
    build = [rest for keyword, rest in steps if keyword == "RUN" and "build_kernels.sh" in rest]
    assert len(build) == 1
    # The wheels are built for exactly the listed architectures, from the pinned sources.
    assert 'build_kernels.sh "${TORCH_CUDA_ARCH_LIST}"' in build[0]
    assert args["MAMBA_SSM_VERSION"] == "2.3.2.post1" and args["CAUSAL_CONV1D_VERSION"] == "1.7.0"
    for pin in ('MAMBA_SSM_VERSION="${MAMBA_SSM_VERSION}"', 'CAUSAL_CONV1D_VERSION="${CAUSAL_CONV1D_VERSION}"'):
        assert pin in build[0]
    assert any(
        keyword == "RUN" and "check_kernels.py" in rest and "TORCH_CUDA_ARCH_LIST" in rest for keyword, rest in steps
    )
    base = expand([rest for keyword, rest in steps if keyword == "FROM"][0], args)
    assert "devel" in base and "cuda" in base  # nvcc for the build, a compiler for Triton at run time
    assert args["TORCH_INDEX_URL"].endswith("/cu128") and "12.8" in base  # wheel CUDA == toolkit CUDA
    assert env["TRITON_CACHE_DIR"].startswith(env["HOME"]) and env["HF_HOME"].startswith(env["HOME"])


def test_runtime_has_no_cuda():
    steps = instructions("runtime")
    args, _ = args_and_env(steps)
    assert "cuda" not in expand(steps[[k for k, _ in steps].index("FROM")][1], args).lower()
    assert args["TORCH_INDEX_URL"].endswith("/cpu")
    assert "mamba" not in " ".join(rest for _, rest in steps)


def dockerignore_allows(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    allowed = True
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].rstrip("/") if negate else line.rstrip("/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(p, pattern.replace("**/", "")) for p in prefixes):
            allowed = negate
    return allowed


@pytest.mark.parametrize("name", IMAGES)
def test_copy_sources_exist_and_pass_dockerignore(name):
    for keyword, rest in instructions(name):
        if keyword != "COPY":
            continue
        *sources, _dest = shlex.split(rest)
        for source in sources:
            assert (ROOT / source).exists(), source
            assert dockerignore_allows(source), f"{source} is excluded by .dockerignore"
    assert not dockerignore_allows(".git") and not dockerignore_allows(".venv/bin/python")
    assert not dockerignore_allows("src/flashdraft/__pycache__/cli.cpython-311.pyc")
    assert dockerignore_allows("src/flashdraft/launch/jobs.py")


def test_kernel_check_script_compiles():
    py_compile.compile(str(ROOT / "images" / "trainer" / "check_kernels.py"), doraise=True)


def _narrow_gencode():
    spec = importlib.util.spec_from_file_location("narrow_gencode", ROOT / "images" / "trainer" / "narrow_gencode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The layout of causal-conv1d 1.7.0's and mamba-ssm 2.3.2's setup.py around their -gencode lists.
_SETUP_PY = """
if not SKIP_CUDA_BUILD:
    cc_flag = []
    if True:
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_75,code=sm_75")
        cc_flag.append("-gencode")
        cc_flag.append("arch=compute_80,code=sm_80")
        if bare_metal_version >= Version("11.8"):
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_90,code=sm_90")
        if bare_metal_version >= Version("12.8"):
            cc_flag.append("-gencode")
            cc_flag.append("arch=compute_100,code=sm_100")
"""


def _gencode_flags(source: str) -> list[str]:
    scope = {"SKIP_CUDA_BUILD": False, "bare_metal_version": (13, 0),
             "Version": lambda v: tuple(int(x) for x in v.split("."))}
    exec(source, scope)
    return scope["cc_flag"]


def test_kernel_build_keeps_only_the_listed_architectures():
    narrow = _narrow_gencode()
    assert narrow.parse_arch_list("8.0;9.0+PTX") == {"80", "90"}
    assert _gencode_flags(_SETUP_PY).count("-gencode") == 4
    for arch_list, kept in (("9.0", ["arch=compute_90,code=sm_90"]),
                            ("8.0;10.0", ["arch=compute_80,code=sm_80", "arch=compute_100,code=sm_100"])):
        flags = _gencode_flags(narrow.narrow(_SETUP_PY, narrow.parse_arch_list(arch_list)))
        assert flags == [f for arch in kept for f in ("-gencode", arch)]


def test_kernel_build_refuses_an_architecture_the_sources_do_not_offer():
    narrow = _narrow_gencode()
    with pytest.raises(SystemExit, match=r"offers no build for sm_89 \(it knows sm_100, sm_75, sm_80, sm_90\)"):
        narrow.narrow(_SETUP_PY, {"89", "90"})
