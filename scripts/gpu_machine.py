"""What the lent GPU machine already has, and which of the GPU pack's distributions it can stand for
(scripts/gpu_pack.py leaves those out of the pack).

``MACHINE_PACKAGES`` is the machine image's package list, with the versions its pip-list row gives, from
``SOURCE``. A distribution of the pack that the machine has is left out when the machine's copy meets every
requirement the rest of the set (what stays in the pack, and the roots: vLLM's kept requirements, verl's, the
project's) places on it:

- version known (the pip-list row): it must satisfy every specifier (``packaging.specifiers``; pre-releases
  allowed); transformers 5.17.0 against verl's ``<5.11`` stays in the pack;
- version unknown (only the package list names it): left out only when every specifier is a lower bound
  (``>=``, ``>``) or there is none; any ``==``, ``~=``, ``<``, ``<=``, ``!=`` or ``===`` keeps it in the pack.
  That the machine's copy meets the lower bounds is an assumption (an image read in 2026-11 against bounds of
  2023 to 2026): the manifest lists them, and the GPU script's first step checks them, and the machine copies'
  own requirements, on the machine;
- asked for with extras (``pyjwt[crypto]``): stays in the pack, since the machine's install may lack what they
  bring.

Leaving a distribution out can leave its own requirements unreached: they are left out too (the machine's copy
brings its own), and each decision is taken again on the smaller set until nothing changes. Every left-out
distribution is listed with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

SOURCE = ("/work/.library/device/KINDS.md as read 2026-11-17: 'Python packages already there' (image 'cuda' of "
          "nvidia-h100-x1 and nvidia-h200) for the names, its 'pip list' row for the versions it gives")
_VERSIONS = {  # the pip-list row
    "accelerate": "1.15.0", "botorch": "0.18.1", "cupy-cuda13x": "14.2.0", "gpytorch": "1.15.2",
    "huggingface-hub": "1.33.0", "jax": "0.11.2", "jax-cuda13-pjrt": "0.11.2", "jax-cuda13-plugin": "0.11.2",
    "jaxlib": "0.11.2", "jaxtyping": "0.3.11", "numpy": "2.5.2", "numpyro": "0.21.0", "onnx": "1.23.1",
    "onnx-ir": "1.0.0", "onnxruntime": "1.30.0", "onnxscript": "0.7.2", "pytorch-lightning": "2.6.6",
    "safetensors": "0.8.0", "sentence-transformers": "6.0.1", "sentencepiece": "0.2.2", "tiktoken": "0.14.0",
    "tokenizers": "0.23.2", "torch": "2.11.0", "torch-geometric": "2.8.0.post1", "torchaudio": "2.11.0",
    "torchdiffeq": "0.2.5", "torchmetrics": "1.9.0", "torchvision": "0.26.0", "transformers": "5.17.0",
    "triton": "3.6.0",
}
_NAMES = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas
nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel
wrapt xarray xxhash yarl zipp"""
# name -> version (None: the list names it, the pip-list row gives no version)
MACHINE_PACKAGES: dict[str, str | None] = {canonicalize_name(n): _VERSIONS.get(canonicalize_name(n))
                                           for n in _NAMES.split()}
LOWER_BOUNDS = frozenset({">=", ">"})
RULE = ("left out where the machine has the distribution and its copy meets every requirement the rest of the set "
        "places on it: a known version (KINDS.md's pip-list row) must satisfy every specifier; an unknown version "
        "only where every specifier is a lower bound (>=, >) or there is none; never where extras are asked for. "
        "The GPU script checks the machine's versions against `requires` before it runs anything")


def placed_on(name: str, roots: Iterable[tuple[str, str]], packages: dict[str, dict]) -> list[tuple[str, Requirement]]:
    """(who, requirement) for every requirement on ``name``: from the roots (``(who, line)``) and from the
    ``specs`` (requirement lines that apply on the machine) of every package in ``packages``."""
    lines = [*roots, *((who, line) for who, info in packages.items() for line in info.get("specs", []))]
    return [(who, req) for who, req in ((who, Requirement(line)) for who, line in lines)
            if canonicalize_name(req.name) == name]


def verdict(name: str, placed: list[tuple[str, Requirement]],
            machine: dict[str, str | None] = MACHINE_PACKAGES) -> tuple[bool, str]:
    """(left out?, why) for one distribution of the pack, given what the rest of the set places on it."""
    if name not in machine:
        return False, "not on the machine"
    version = machine[name]
    specs = [(who, spec) for who, req in placed for spec in req.specifier]
    extras = sorted({f"{who}: {req}" for who, req in placed if req.extras})
    if extras:
        return False, f"asked for with extras ({'; '.join(extras)}): the machine's install may lack them"
    if version is not None:
        failed = [f"{who}: {spec}" for who, spec in specs if not spec.contains(Version(version), prereleases=True)]
        if failed:
            return False, f"the machine's {version} fails {'; '.join(sorted(set(failed)))}"
        return True, f"the machine's {version} satisfies every requirement"
    pinned = [f"{who}: {spec}" for who, spec in specs if spec.operator not in LOWER_BOUNDS]
    if pinned:
        return False, f"the machine's version is unknown and the set pins it ({'; '.join(sorted(set(pinned)))})"
    if specs:
        return True, "the machine's version is unknown; the set asks only for a lower bound"
    return True, "the machine's version is unknown; the set asks for any version"


def requirement_text(placed: list[tuple[str, Requirement]]) -> str:
    """The specifiers placed on one distribution, joined (``>=1.2,>=1.5``; empty: any version)."""
    return ",".join(sorted({str(spec) for _, req in placed for spec in req.specifier}))


def machine_leave_out(roots: list[tuple[str, str]], graph: dict[str, dict], reach, stop: set[str],
                      machine: dict[str, str | None] = MACHINE_PACKAGES) -> dict[str, dict]:
    """Which distributions the machine stands for: {name: {version (the machine's, or None), requires (the
    specifiers the final set places on it), reason}}. ``reach(stop)`` gives the pack's distributions when the
    distributions in ``stop`` are not followed; ``graph[name]["specs"]``: each one's requirement lines."""
    out: set[str] = set()
    while True:
        packages = reach(stop | out)
        roots_and_pack = {n: graph[n] for n in packages if n in graph}
        new = {name for name in packages if name in machine
               and verdict(name, placed_on(name, roots, roots_and_pack), machine)[0]}
        if not new:
            break
        out |= new
    final = {n: graph[n] for n in reach(stop | out) if n in graph}
    result = {}
    for name in sorted(out):
        placed = placed_on(name, roots, final)
        if not placed:  # nothing left in the pack asks for it: the machine's copies that do bring it
            continue
        result[name] = {"version": machine[name], "requires": requirement_text(placed),
                        "by": sorted({who for who, _ in placed}), "reason": verdict(name, placed, machine)[1]}
    return result


def kept_on_machine(roots: list[tuple[str, str]], graph: dict[str, dict], packages: Iterable[str],
                    machine: dict[str, str | None] = MACHINE_PACKAGES) -> dict[str, str]:
    """The pack's distributions that the machine has but cannot stand for: {name: why}."""
    pack = {n: graph[n] for n in packages if n in graph}
    return {name: verdict(name, placed_on(name, roots, pack), machine)[1] for name in sorted(packages)
            if name in machine}
