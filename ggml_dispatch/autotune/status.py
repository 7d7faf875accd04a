"""``ggml-dispatch status``: is a tree hooked, which table it compiles in, does it apply on this GPU, and
what a short run's ``ggml_cuda_dispatch:`` start-up line says."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ggml_dispatch.artifacts import ab
from ggml_dispatch.autotune import env as env_mod
from ggml_dispatch.autotune import plan as plan_mod
from ggml_dispatch.hook import install as inst


@dataclass(frozen=True)
class HeaderTable:
    rules: int
    table_hash: str  # "" when no table
    gpu_name: str
    cc: int
    sm_count: int
    # the VRAM budget (codegen --vram-budget), what its admitted rules cost as planned, and its split into
    # the hook's two caps; 0 where the header predates the budget or the table has none
    vram_budget: int = 0
    vram_planned: int = 0
    cache_cap: int = 0
    kv_shadow_cap: int = 0

    def budget_line(self) -> str | None:
        """What status says of the budget (None: the table has no memory-for-time budget)."""
        if not (self.vram_budget or self.cache_cap or self.kv_shadow_cap):
            return None
        head = (
            f"VRAM budget {_mib(self.vram_budget)}, {_mib(self.vram_planned)} planned by its rules"
            if self.vram_budget
            else "VRAM budget: none stamped (a table made before the one budget)"
        )
        return (
            f"table: {head}; caps: weight cache {_mib(self.cache_cap)}, KV shadow {_mib(self.kv_shadow_cap)}"
        )


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def parse_table_header(text: str) -> HeaderTable | None:
    """The table identity in a rendered ggml-dispatch-table.h; None when the text is not one."""

    def define(name: str) -> int | None:
        m = re.search(rf"^#define {name} (-?\d+)\s*$", text, re.M)
        return int(m.group(1)) if m else None

    def string(name: str) -> str | None:
        m = re.search(rf'^static const char {name}\[\] = "((?:[^"\\]|\\.)*)";', text, re.M)
        return m.group(1) if m else None

    rules = define("GGML_DISPATCH_TABLE_RULE_COUNT")
    if rules is None:
        return None
    return HeaderTable(
        rules,
        string("ggml_dispatch_table_hash") or "",
        string("ggml_dispatch_table_gpu_name") or "",
        define("GGML_DISPATCH_TABLE_GPU_CC") or 0,
        define("GGML_DISPATCH_TABLE_GPU_SM_COUNT") or 0,
        define("GGML_DISPATCH_TABLE_VRAM_BUDGET_BYTES") or 0,
        define("GGML_DISPATCH_TABLE_VRAM_PLANNED_BYTES") or 0,
        define("GGML_DISPATCH_TABLE_CACHE_BUDGET_BYTES") or 0,
        define("GGML_DISPATCH_TABLE_KV_SHADOW_BUDGET_BYTES") or 0,
    )


def lib_has(lib: Path, needle: str) -> bool:
    """The library's bytes contain ``needle`` (the table hash string the hook compiles in)."""
    data = lib.read_bytes()
    return needle.encode() in data


def find_lib(build_dir: Path) -> Path | None:
    bins = plan_mod.bin_dir(build_dir)
    for cand in (bins / "libggml-cuda.so", build_dir / "bin" / "libggml-cuda.so"):
        if cand.is_file():
            return cand
    found = sorted(build_dir.rglob("libggml-cuda.so"))
    return found[0] if found else None


def tree_lines(tree: Path) -> tuple[list[str], HeaderTable | None]:
    lines = []
    try:
        manifest = inst.read_manifest(tree)
    except inst.InstallError as e:
        return [f"hook: {e}"], None
    target = tree / inst.CUDA_DIR / inst.TARGET
    if not target.is_file():
        return [f"{tree}: not a llama.cpp tree (no {inst.CUDA_DIR / inst.TARGET})"], None
    if manifest is None:
        lines.append(f"hook: not installed in {tree} (ggml-dispatch install --llama-cpp {tree})")
        return lines, None
    current = inst.sha256_bytes(target.read_bytes())
    intact = current == manifest.get("target_patched_sha256")
    lines.append(
        f"hook: installed (upstream {str(manifest.get('upstream_commit'))[:12]}, "
        f"patch {str(manifest.get('patch_hash'))[:12]})"
        + ("" if intact else f"; {inst.TARGET} changed since install: re-run ggml-dispatch install")
    )
    header_path = tree / inst.CUDA_DIR / inst.TABLE_HEADER
    header = parse_table_header(header_path.read_text(encoding="utf-8")) if header_path.is_file() else None
    if header is None:
        lines.append(f"table: {header_path} missing or unreadable")
    elif header.rules == 0:
        lines.append("table: none in the tree (stock dispatch)")
    else:
        lines.append(
            f"table: {header.table_hash[:12]} in the tree ({header.rules} rules, "
            f"measured on {header.gpu_name}, cc {header.cc}, {header.sm_count} SMs)"
        )
        budget = header.budget_line()
        if budget is not None:
            lines.append(budget)
    return lines, header


def applies_lines(header: HeaderTable | None, gpus: Sequence[env_mod.GpuInfo]) -> list[str]:
    if not gpus:
        return ["GPU: none visible (nvidia-smi lists none): no run possible here"]
    lines = []
    for i, g in enumerate(gpus):
        cc = f"cc {g.cc}" if g.cc else "cc unknown"
        what = f"GPU {i}: {g.name} ({cc}, driver {g.driver})"
        if header is not None and header.rules > 0:
            ok = g.name == header.gpu_name and (g.cc is None or g.cc == header.cc)
            what += (
                ": the table applies (name and cc match; the SM count is checked at run time)"
                if ok
                else ": the table does not apply here (measured on another GPU): stock dispatch"
            )
        lines.append(what)
    return lines


def build_lines(build_dir: Path, header: HeaderTable | None) -> tuple[list[str], Path | None]:
    lib = find_lib(build_dir)
    if lib is None:
        return [f"build: no libggml-cuda.so under {build_dir}"], None
    lines = [f"build: {lib}"]
    if header is not None and header.rules > 0:
        has = lib_has(lib, header.table_hash)
        lines.append(
            f"build: table {header.table_hash[:12]} "
            + ("compiled in" if has else "NOT compiled in (rebuild: cmake --build BUILD)")
        )
    elif lib_has(lib, "ggml_cuda_dispatch"):
        lines.append("build: carries the hook")
    else:
        lines.append("build: no ggml-dispatch hook compiled in (rebuild after install)")
    return lines, lib


def short_run(build_dir: Path, model: Path | None, env: Mapping[str, str] | None = None) -> str:
    """The start-up line of a brief run: llama-bench on MODEL, else test-backend-ops' support mode."""
    bins = plan_mod.bin_dir(build_dir)
    e = dict(os.environ if env is None else env)
    e.pop("GGML_CUDA_ROUTE_TRACE", None)
    e["LD_LIBRARY_PATH"] = ":".join(p for p in (str(bins), e.get("LD_LIBRARY_PATH", "")) if p)
    if model is not None and (bins / "llama-bench").is_file():
        argv = [
            str(bins / "llama-bench"),
            "-m",
            str(model),
            "-p",
            "8",
            "-n",
            "0",
            "-r",
            "1",
            "-ngl",
            "99",
            "-v",
        ]
    elif (bins / "test-backend-ops").is_file():
        argv = [str(bins / "test-backend-ops"), "support", "-o", "MUL_MAT", "-b", "CUDA0"]
    else:
        return f"run: neither llama-bench (with --model) nor test-backend-ops in {bins}"
    try:
        res = subprocess.run(argv, capture_output=True, text=True, env=e, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"run: {argv[0]}: {err}"
    log = res.stdout + "\n" + res.stderr
    line = ab.find_dispatch_line(log)
    if line is None:
        name = os.path.basename(argv[0])
        return f"run: {name} exit {res.returncode}, no ggml_cuda_dispatch: line (hook not compiled in?)"
    use = store_use_lines(log)
    return "\n".join([f"run: ggml_cuda_dispatch: {line.text}", *(f"run: {u}" for u in use)])


# The hook's line when an evaluation made copies in one of its stores (ggml-dispatch-cache-impl.cuh,
# store_log_growth): the store, its tensors and bytes now, and its requests over budget / failed allocations.
_STORE_USE = re.compile(
    r"ggml_cuda_dispatch: (weight cache|KV shadow): (\d+) tensors, (\d+) bytes \([^)]*\) cached of a budget "
    r"of ([^;]+); (\d+) requests over budget, (\d+) failed allocations"
)


def store_use_lines(log: str) -> list[str]:
    """Run-time use of the VRAM budget, from the hook's store lines: the last line of each store."""
    last: dict[str, re.Match[str]] = {}
    for m in _STORE_USE.finditer(log):
        last[m.group(1)] = m
    return [
        f"{name}: {m.group(2)} tensors, {_mib(int(m.group(3)))} in use of {m.group(4).strip()}; "
        f"{m.group(5)} requests over budget, {m.group(6)} failed allocations"
        for name, m in sorted(last.items())
    ]
