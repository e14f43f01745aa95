"""The isolated virtual environment VBench runs in.

VBench pins ``numpy<2`` and ``transformers==4.33.2`` (and more), which cannot share jbkv's
environment, so it gets its own venv, built once and cached under
``$JBKV_VBENCH_ENV`` (default ``~/.cache/jbkv/vbench-env``) in a folder named by a hash of
everything that defines it (requirements, lock file, long-mode configs, Python and torch). A
second ``setup_env`` with the same inputs finds the marker file and returns at once.

Layout of ``<root>/<key>/``::

    venv/        python -m venv; vbench and what its long mode imports (versions: the lock)
    torch-link/  symlinks to jbkv's own torch, torchvision, triton, nvidia-*, cuda-* (reuse mode)
    env.json     the marker, written last: key, versions, timings, import check
    setup.log    pip's output

Torch reuse: a CUDA torch is ~5.5 GB; instead of copying it, ``torch-link/`` links the heavy
distributions (code and ``*.dist-info``) of the interpreter running jbkv, and a ``.pth`` file
appends that folder to the venv's ``sys.path``. The venv's own site-packages come first, so
nothing else of jbkv's environment is visible; pip sees torch as installed *outside* the
environment (it never uninstalls there), and the exact torch/torchvision versions are pinned as
constraints so pip never tries to. ``reuse_torch=False`` installs torch into the venv instead.

The VBench wheel lacks ``vbench2_beta_long/configs/*.yaml`` and ``VBench_full_info.json`` there;
setup writes them from ``vbench_data/long_configs.json`` and the wheel's own ``vbench`` copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jbkv_cli.utils.errors import JbkvError

ENV_VAR = "JBKV_VBENCH_ENV"
SETUP_VERSION = 1
DATA_DIR = Path(__file__).resolve().parent / "vbench_data"
LOCK_FILE = DATA_DIR / "vbench_env_lock.txt"
LONG_CONFIGS = DATA_DIR / "long_configs.json"
RUNNER = Path(__file__).resolve().parent / "vbench_runner.py"

REQUIREMENTS: tuple[str, ...] = (
    "vbench==0.1.5",
    # imported by vbench2_beta_long at import time, not declared by the wheel:
    "scenedetect>=0.6.4,<0.7",  # 0.7 moved scenedetect.video_splitter
    "moviepy==1.0.3",  # 2.x removed moviepy.editor
    "dreamsim==0.2.1",
    "peft==0.6.2",  # dreamsim imports peft; newer peft needs transformers > 4.33.2
    "setuptools>=77.0.3,<81",  # openai-clip imports pkg_resources (gone in setuptools 81)
    "av>=12,<19",  # PyAV for jbkv's torchvision.io.write_video shim
)
HEAVY_PREFIXES = ("nvidia-", "cuda-")
HEAVY_NAMES = ("torch", "torchvision", "triton")
DEFAULT_TORCH = ("2.14.1", "0.29.1")

Log = Callable[[str], None]


def default_root() -> Path:
    """``$JBKV_VBENCH_ENV`` or ``~/.cache/jbkv/vbench-env``."""
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "jbkv" / "vbench-env"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class TorchSource:
    """jbkv's own torch installation, to be linked into the VBench env."""

    torch: str
    torchvision: str
    site: Path
    dists: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "torch": self.torch,
            "torchvision": self.torchvision,
            "site": str(self.site),
            "dists": [list(d) for d in self.dists],
        }


def find_torch() -> TorchSource | None:
    """torch + torchvision of this interpreter and the heavy distributions beside them."""
    try:
        torch = md.distribution("torch")
        vision = md.distribution("torchvision")
    except md.PackageNotFoundError:
        return None
    site = Path(str(torch.locate_file(""))).resolve()
    if Path(str(vision.locate_file(""))).resolve() != site:
        return None
    dists = []
    for d in md.distributions(path=[str(site)]):
        name = _norm(d.metadata["Name"] or "")
        if name in HEAVY_NAMES or name.startswith(HEAVY_PREFIXES):
            dists.append((name, d.version))
    return TorchSource(torch.version, vision.version, site, tuple(sorted(set(dists))))


def _python_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@dataclass
class EnvPlan:
    """Everything that defines an environment; its hash names the folder."""

    python: str
    python_version: str
    torch: TorchSource | None
    torch_pins: tuple[str, str]
    requirements: tuple[str, ...] = REQUIREMENTS
    lock: str = field(default_factory=lambda: LOCK_FILE.read_text())
    long_configs: str = field(default_factory=lambda: LONG_CONFIGS.read_text())

    @property
    def key(self) -> str:
        doc = {
            "setup_version": SETUP_VERSION,
            "python": ".".join(self.python_version.split(".")[:2]),
            "torch": {"linked": [list(d) for d in self.torch.dists]}
            if self.torch
            else {"install": list(self.torch_pins)},
            "requirements": list(self.requirements),
            "lock": self.lock,
            "long_configs": self.long_configs,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def plan_env(python: str | None = None, reuse_torch: bool = True) -> EnvPlan:
    """The environment ``setup_env`` would build: interpreter and torch source."""
    python = python or sys.executable
    version = _python_version(python)
    torch = find_torch() if reuse_torch else None
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if torch is not None and not version.startswith(mine + "."):
        torch = None  # compiled for another Python
    if reuse_torch and torch is None:
        raise JbkvError(
            "cannot reuse torch: torch and torchvision for Python "
            f"{'.'.join(version.split('.')[:2])} not found beside jbkv; "
            "use `jbkv vbench setup --install-torch`"
        )
    pins = (torch.torch, torch.torchvision) if torch else DEFAULT_TORCH
    return EnvPlan(python=python, python_version=version, torch=torch, torch_pins=pins)


@dataclass(frozen=True)
class VBenchEnv:
    """A built environment."""

    path: Path
    info: dict[str, Any]

    @property
    def python(self) -> Path:
        return self.path / "venv" / "bin" / "python"

    @property
    def key(self) -> str:
        return str(self.info["key"])

    def problems(self) -> list[str]:
        """Why this environment cannot be used any more (empty: usable)."""
        out = []
        if not self.python.exists():
            out.append(f"{self.python} is missing")
        link_dir = self.path / "torch-link"
        if link_dir.is_dir():
            broken = [p.name for p in link_dir.iterdir() if not p.exists()]
            if broken:
                out.append(f"linked torch files are gone ({', '.join(sorted(broken)[:3])}, ...)")
        return out


def _links_ok(link_dir: Path, site: Path) -> bool:
    links = list(link_dir.iterdir()) if link_dir.is_dir() else []
    return bool(links) and all(
        p.exists() and p.is_symlink() and Path(os.readlink(p)).parent == site for p in links
    )


def relink_torch(env: VBenchEnv, source: TorchSource) -> None:
    """Point ``torch-link/`` at ``source`` (same versions, e.g. another checkout's venv)."""
    recorded = [tuple(d) for d in env.info.get("torch", {}).get("dists", [])]
    if recorded != list(source.dists):
        raise JbkvError(
            "jbkv's torch differs from the VBench environment's; run `jbkv vbench setup`"
        )
    link_dir = env.path / "torch-link"
    shutil.rmtree(link_dir, ignore_errors=True)
    _link_torch(source, link_dir)
    env.info["torch"] = {"mode": "linked", **source.to_json()}
    _write_json(env.path / "env.json", env.info)


def _read_env(path: Path) -> VBenchEnv | None:
    marker = path / "env.json"
    if not marker.is_file():
        return None
    try:
        return VBenchEnv(path, json.loads(marker.read_text()))
    except (OSError, json.JSONDecodeError):
        return None


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def locate_env(root: Path | None = None) -> VBenchEnv | None:
    """The environment the last successful setup under ``root`` activated, if still built."""
    root = root or default_root()
    try:
        active = json.loads((root / "active.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return _read_env(root / str(active.get("key", "")))


def require_env(root: Path | None = None) -> VBenchEnv:
    """:func:`locate_env` or a :class:`JbkvError` saying how to build it."""
    root = root or default_root()
    env = locate_env(root)
    if env is None:
        raise JbkvError(f"VBench environment not set up in {root}; run `jbkv vbench setup`")
    source = find_torch()
    if env.info.get("torch", {}).get("mode") == "linked" and source is not None:
        with _locked(root):
            if not _links_ok(env.path / "torch-link", source.site):
                with contextlib.suppress(JbkvError):
                    relink_torch(env, source)
    problems = env.problems()
    if problems:
        raise JbkvError(
            f"VBench environment {env.path} is broken ({problems[0]}); run `jbkv vbench setup`"
        )
    return env


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _run(cmd: list[str], log_file: Path, log: Log, what: str) -> None:
    """Run ``cmd``, appending its output to ``log_file`` and its last line to ``log``."""
    with open(log_file, "a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            if line.strip():
                log(f"{what}: {line.strip()[:100]}")
        rc = proc.wait()
    if rc != 0:
        raise JbkvError(f"VBench environment setup failed while {what} (see {log_file})")


def _link_torch(source: TorchSource, link_dir: Path) -> list[str]:
    """Symlink the top-level entries of the heavy distributions into ``link_dir``."""
    link_dir.mkdir(parents=True, exist_ok=True)
    wanted = {n for n, _ in source.dists}
    tops: set[str] = set()
    for d in md.distributions(path=[str(source.site)]):
        if _norm(d.metadata["Name"] or "") not in wanted:
            continue
        for f in d.files or []:
            top = Path(str(f)).parts[0]
            if top not in ("..", "__pycache__") and not top.endswith(".pth"):
                tops.add(top)
    for top in sorted(tops):
        src = source.site / top
        if src.exists() and not (link_dir / top).exists():
            (link_dir / top).symlink_to(src)
    return sorted(tops)


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(out.stdout.strip())


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return json.dumps(value)
    text = repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, float) and ("e" in text or "." not in text):
        text = f"{value:.20f}".rstrip("0")  # PyYAML only reads floats written with a dot
    return text


def long_config_texts() -> dict[str, str]:
    """The YAML files VBench-Long reads from ``vbench2_beta_long/configs/``, as text."""
    doc = json.loads(LONG_CONFIGS.read_text())
    out = {}
    for name, spec in doc["files"].items():
        pairs = spec["pairs"] if spec["kind"] == "table" else list(spec["values"].items())
        out[name] = "".join(f"{_yaml_scalar(k)}: {_yaml_scalar(v)}\n" for k, v in pairs)
    return out


def _write_long_configs(site: Path) -> list[str]:
    long_pkg = site / "vbench2_beta_long"
    (long_pkg / "configs").mkdir(exist_ok=True)
    written = []
    for name, text in long_config_texts().items():
        (long_pkg / "configs" / name).write_text(text)
        written.append(f"vbench2_beta_long/configs/{name}")
    shutil.copyfile(site / "vbench" / "VBench_full_info.json", long_pkg / "VBench_full_info.json")
    written.append("vbench2_beta_long/VBench_full_info.json")
    return written


def check_env(python: Path) -> dict[str, Any]:
    """Run the runner's import check in the environment; its JSON report."""
    out = subprocess.run(
        [str(python), str(RUNNER), "--check"],
        capture_output=True,
        text=True,
        env=runner_environ(),
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("@@jbkv ")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise JbkvError(f"VBench environment import check failed: {tail[0][:200]}")
    return json.loads(lines[-1][len("@@jbkv ") :])


def runner_environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for processes in the VBench env: offline hubs, no user site, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONNOUSERSITE="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.update(extra or {})
    return env


def setup_env(
    root: Path | None = None,
    python: str | None = None,
    reuse_torch: bool = True,
    log: Log | None = None,
    force: bool = False,
) -> tuple[VBenchEnv, bool]:
    """Build (or find) the VBench environment; returns it and whether it was built now."""
    log = log or (lambda _msg: None)
    root = (root or default_root()).expanduser().resolve()
    plan = plan_env(python, reuse_torch)
    path = root / plan.key
    with _locked(root):
        env = _read_env(path)
        if (
            env is not None
            and not force
            and plan.torch is not None
            and env.python.exists()
            and not _links_ok(path / "torch-link", plan.torch.site)
        ):
            log(f"relinking torch from {plan.torch.site}")
            relink_torch(env, plan.torch)
        if env is not None and not force and not env.problems():
            _write_json(root / "active.json", {"key": plan.key})
            return env, False
        t0 = time.perf_counter()
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        log_file = path / "setup.log"
        venv_python = path / "venv" / "bin" / "python"
        log(f"creating venv with Python {plan.python_version}")
        _run([plan.python, "-m", "venv", str(path / "venv")], log_file, log, "creating venv")
        site = _site_packages(venv_python)
        linked: list[str] = []
        if plan.torch is not None:
            log(f"linking torch {plan.torch.torch} from {plan.torch.site}")
            linked = _link_torch(plan.torch, path / "torch-link")
            (site / "zz_jbkv_torch_link.pth").write_text(str(path / "torch-link") + "\n")
        pins = path / "torch-pins.txt"
        pins.write_text(f"torch=={plan.torch_pins[0]}\ntorchvision=={plan.torch_pins[1]}\n")
        reqs = list(plan.requirements)
        if plan.torch is None:
            reqs += [f"torch=={plan.torch_pins[0]}", f"torchvision=={plan.torch_pins[1]}"]
        pip = [str(venv_python), "-m", "pip", "install", "--disable-pip-version-check"]
        _run(
            [*pip, "--constraint", str(LOCK_FILE), "--constraint", str(pins), *reqs],
            log_file,
            log,
            "installing packages",
        )
        written = _write_long_configs(site)
        log("checking imports")
        report = check_env(venv_python)
        info = {
            "key": plan.key,
            "setup_version": SETUP_VERSION,
            "python": plan.python_version,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "setup_seconds": round(time.perf_counter() - t0, 1),
            "torch": {"mode": "linked", **plan.torch.to_json()}
            if plan.torch
            else {"mode": "installed", "torch": plan.torch_pins[0]},
            "linked": linked,
            "requirements": list(plan.requirements),
            "site_packages": str(site),
            "written": written,
            "check": report,
        }
        _write_json(path / "env.json", info)
        _write_json(root / "active.json", {"key": plan.key})
        _prune(root, keep=path, log=log)
        return VBenchEnv(path, info), True


def _prune(root: Path, keep: Path, log: Log) -> None:
    """The cache holds one environment: remove the others (older builds, unfinished ones)."""
    for other in root.iterdir():
        if other != keep and other.is_dir() and re.fullmatch(r"[0-9a-f]{16}", other.name):
            log(f"removing old environment {other}")
            shutil.rmtree(other, ignore_errors=True)
