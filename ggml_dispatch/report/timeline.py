"""Kernel timelines of llama-bench runs -> where a step's time goes, per A/B arm.

A profile is a set of ``<arm>.<test>.ktl`` files (``ggml_dispatch/report/native/kernel_timeline.cpp``: every
kernel, memcpy
and memset the GPU ran in one llama-bench process, GPU timestamps from CUPTI) each with the llama-bench
JSON Lines output of that same process beside it (``<arm>.<test>.jsonl``). ``<test>`` is the ubatch of
a pp run (``512``: pp2048 at ubatch 512), ``tg128``, or a test at a prefilled depth with its KV cache
types when not f16 (``tg32@d16384``, ``pp2@d49152-kvq8_0``). A depth test's process also holds
llama-bench's fill of the KV cache before every repetition, so its split here counts the fills;
lab/attn_profile_summary.py takes the per-token split from two lengths' difference instead.

Per run, the kernels' GPU time is split into categories: the matmul routes (mmvq, mmq, mmvf, mmf,
cuBLAS's own kernels), the conversions the cuBLAS route adds (weight dequantization to f16, the f32->f16
and f16->f32 casts of activations and results), FlashAttention, other kernels, and copies. What is
left of llama-bench's wall time is *idle*: the GPU waiting on the host (graph launch, sync, sampling).

A process runs llama-bench's warm-up before its repetitions: a whole prompt for pp (so the timeline
holds ``reps + 1`` runs), one token for tg (``reps + 1/n_gen``). Per-run times divide by that.

Everything here is pure except :func:`load_profile`, which reads files and turns bad input into one
:class:`~ggml_dispatch.errors.InputError` naming the file and line.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ggml_dispatch.artifacts import timeline as timeline_artifact
from ggml_dispatch.artifacts.timeline import FORMAT as FORMAT
from ggml_dispatch.artifacts.timeline import BenchRun, Timeline, parse_bench
from ggml_dispatch.errors import InputError

ARMS: Final = ("stock", "table", "crude", "cached", "hook")
MATMUL_CATEGORIES: Final = ("mmvq", "mmq", "mmvf", "mmf", "cublas", "conversion")
CATEGORIES: Final = (*MATMUL_CATEGORIES, "attention", "other", "copy")

# ggml-cuda's kernels are free functions: the Itanium-mangled name starts _Z<length><name>.
_MANGLED: Final = re.compile(r"_Z(\d+)")
_BASE_CATEGORY: Final = {
    "mul_mat_q": "mmq",
    "mul_mat_q_stream_k_fixup": "mmq",
    "quantize_mmq_q8_1": "mmq",
    "mul_mat_vec_q": "mmvq",
    "quantize_q8_1": "mmvq",
    "mul_mat_vec_f": "mmvf",
    "mul_mat_f": "mmf",
    "mul_mat_f_ids": "mmf",
    "convert_unary": "conversion",
    "convert_unary_cont": "conversion",
    "convert_unary_cont_vec4": "conversion",
    "k_compute_batched_ptrs": "conversion",
}
_CUBLAS: Final = re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas", re.IGNORECASE)


def base_name(kernel: str) -> str:
    """The function name of a mangled free-function kernel (``_Z9mul_mat_qIL...`` -> ``mul_mat_q``)."""
    m = _MANGLED.match(kernel)
    if m is None:
        return kernel
    start = m.end()
    return kernel[start : start + int(m.group(1))]


def classify(kernel: str) -> str:
    """The category of a kernel name (one of :data:`CATEGORIES` except ``copy``)."""
    base = base_name(kernel)
    if base in _BASE_CATEGORY:
        return _BASE_CATEGORY[base]
    if base.startswith("dequantize_block"):
        return "conversion"
    if base.startswith("flash_attn"):
        return "attention"
    if kernel == base and _CUBLAS.search(kernel):  # cuBLAS kernels are not mangled
        return "cublas"
    if kernel.startswith("_ZN") and _CUBLAS.search(kernel):
        return "cublas"
    return "other"


def parse_ktl(lines: Iterable[str], path: Path) -> Timeline:
    """A ``.ktl`` file with every kernel classified (the one reader: ggml_dispatch.artifacts.timeline)."""
    return timeline_artifact.parse_ktl(lines, path, classify)


def runs_in_timeline(bench: BenchRun) -> float:
    """How many runs' worth of work the timeline holds: the repetitions plus llama-bench's warm-up."""
    if bench.n_prompt > 0 and bench.n_gen == 0:
        return bench.reps + 1.0
    if bench.n_gen > 0 and bench.n_prompt == 0:
        return bench.reps + 1.0 / bench.n_gen
    raise ValueError("profiled tests are pp or tg, not both")


def union_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """Nanoseconds covered by at least one of the intervals."""
    total = 0
    covered_to = None  # end of the time already counted
    for start, end in sorted(intervals):
        if covered_to is not None:
            start = max(start, covered_to)
        if end > start:
            total += end - start
            covered_to = end
    return total


@dataclass(frozen=True)
class Breakdown:
    """One profiled process: per-run milliseconds by category, wall time and idle."""

    arm: str
    test: str
    bench: BenchRun
    ms: Mapping[str, float]  # category -> GPU ms per run
    busy_ms: float  # union of all intervals, per run
    wall_ms: float  # llama-bench's mean time per run
    dropped: int

    @property
    def matmul_ms(self) -> float:
        return sum(self.ms[c] for c in MATMUL_CATEGORIES)

    @property
    def idle_ms(self) -> float:
        return self.wall_ms - self.busy_ms

    @property
    def overlap_ms(self) -> float:
        """Kernel time that ran concurrently with other kernels (ggml-cuda's parallel streams)."""
        return sum(self.ms.values()) - self.busy_ms

    def share(self, ms: float) -> float:
        return ms / self.wall_ms


def copies_in_span(tl: Timeline) -> list[tuple[int, int, int]]:
    """(start, end, bytes) of the copies made while kernels run (the model upload, before the first kernel,
    is left out)."""
    if not tl.kernels:
        return []
    first, last = min(s for s, _, _ in tl.kernels), max(e for _, e, _ in tl.kernels)
    return [(s, e, b) for (s, e), b in zip(tl.copies, tl.copy_bytes, strict=True) if s >= first and e <= last]


def breakdown(arm: str, test: str, tl: Timeline, bench: BenchRun) -> Breakdown:
    runs = runs_in_timeline(bench)
    ns: dict[str, int] = dict.fromkeys(CATEGORIES, 0)
    for start, end, cat in tl.kernels:
        ns[cat] += end - start
    intervals = [(s, e) for s, e, _ in tl.kernels]
    inside = [(s, e) for s, e, _ in copies_in_span(tl)]
    ns["copy"] = sum(e - s for s, e in inside)
    intervals += inside
    busy = union_ns(intervals)
    return Breakdown(
        arm,
        test,
        bench,
        {c: v / runs / 1e6 for c, v in ns.items()},
        busy / runs / 1e6,
        bench.avg_ns / 1e6,
        tl.dropped,
    )


@dataclass(frozen=True)
class ArmDelta:
    """One arm against stock on one test: what its matmul savings predict, and what llama-bench saw."""

    test: str
    arm: str
    matmul_saved_ms: float  # stock matmul ms (incl. conversions) - arm's
    other_delta_ms: float  # arm's non-matmul kernels + copies - stock's
    idle_delta_ms: float  # arm's idle - stock's
    predicted: float  # stock wall / (stock wall - matmul saved): if only the matmuls changed
    measured: float  # stock wall / arm wall (these profiled processes)


def arm_deltas(rows: Sequence[Breakdown]) -> list[ArmDelta]:
    by = {(b.arm, b.test): b for b in rows}
    out: list[ArmDelta] = []
    for (arm, test), b in sorted(by.items(), key=lambda kv: (test_order(kv[0][1]), kv[0][0])):
        stock = by.get(("stock", test))
        if arm == "stock" or stock is None:
            continue
        saved = stock.matmul_ms - b.matmul_ms
        other = sum(b.ms[c] - stock.ms[c] for c in CATEGORIES if c not in MATMUL_CATEGORIES)
        idle = b.idle_ms - stock.idle_ms
        out.append(
            ArmDelta(
                test,
                arm,
                saved,
                other,
                idle,
                stock.wall_ms / (stock.wall_ms - saved),
                stock.wall_ms / b.wall_ms,
            )
        )
    return out


# a test at a prefilled depth, with its KV cache types when not f16: tg32@d16384, pp2@d49152-kvq8_0
_DEPTH_TEST: Final = re.compile(r"(pp\d+|tg\d+)@d(\d+)(?:-kv([A-Za-z0-9_]+(?:/[A-Za-z0-9_]+)?))?")


def _depth_test(test: str) -> re.Match[str] | None:
    return _DEPTH_TEST.fullmatch(test)


def test_case(test: str) -> tuple[str, int | None]:
    """(llama-bench test, ubatch): ``512`` -> ("pp2048", 512); ``tg128`` -> ("tg128", None); a depth test
    ``pp2@d16384-kvq8_0`` -> the A/B's own name ("pp2 @ d16384 kv q8_0", None)."""
    m = _depth_test(test)
    if m is not None:
        kv = m.group(3)
        return (f"{m.group(1)} @ d{m.group(2)}" + (f" kv {kv}" if kv else ""), None)
    return (test, None) if test.startswith("tg") else ("pp2048", int(test))


def profile_model(note: str) -> str | None:
    """The model a profile's README names (``model llama8b-L16 reps 3``)."""
    m = re.search(r"\bmodel (\S+)", note)
    return m.group(1) if m else None


def test_order(test: str) -> tuple[int, int, str]:
    """pp2048 runs by ubatch, then tg, then the depth tests by depth."""
    m = _depth_test(test)
    if m is not None:
        return (2, int(m.group(2)), test)
    return (1, 0, test) if test.startswith("tg") else (0, int(test), "")


def ordered(rows: Iterable[Breakdown]) -> list[Breakdown]:
    """Tests by ubatch (decode last), arms stock, table, crude within a test."""
    return sorted(rows, key=lambda b: (test_order(b.test), ARMS.index(b.arm)))


def test_label(test: str) -> str:
    if _depth_test(test) is not None:
        return test_case(test)[0]
    return test if test.startswith("tg") else f"pp2048 ub{test}"


@dataclass
class Profile:
    rows: list[Breakdown] = field(default_factory=list)
    note: str = ""  # the profile's README (model, repetitions)
    source: str = ""


_FILE: Final = re.compile(
    rf"^(?:.*/)?({'|'.join(ARMS)})\.(\d+|tg\d+|(?:pp|tg)\d+@d\d+(?:-kv[A-Za-z0-9_]+)?)\.(ktl|jsonl)$"
)


def profile_from_files(files: Mapping[str, tuple[Path, str]], source: str) -> Profile:
    """``name -> (path for messages, text)`` of a profile folder or archive -> :class:`Profile`."""
    pairs: dict[tuple[str, str], dict[str, tuple[Path, str]]] = {}
    note = ""
    for name, (path, text) in files.items():
        if Path(name).name == "README":
            note = text.strip()
            continue
        m = _FILE.match(name)
        if m is not None:
            pairs.setdefault((m.group(1), m.group(2)), {})[m.group(3)] = (path, text)
    rows: list[Breakdown] = []
    for (arm, test), got in sorted(pairs.items()):
        if "ktl" not in got or "jsonl" not in got:
            missing = "jsonl" if "ktl" in got else "ktl"
            raise InputError(
                Path(source),
                f"{arm}.{test}.{missing} is missing (each timeline needs its llama-bench output)",
            )
        kpath, ktext = got["ktl"]
        bpath, btext = got["jsonl"]
        rows.append(
            breakdown(arm, test, parse_ktl(ktext.splitlines(), kpath), parse_bench(btext.splitlines(), bpath))
        )
    if not rows:
        raise InputError(Path(source), "no <arm>.<test>.ktl timelines found")
    return Profile(rows, note, source)


def profile_files(path: Path) -> dict[str, tuple[Path, str]]:
    """The text files of a profile folder or archive by name, each with the path an error names."""
    files: dict[str, tuple[Path, str]] = {}
    if path.is_dir():
        for f in sorted(path.iterdir()):
            if f.is_file():
                files[f.name] = (f, f.read_text(encoding="utf-8", errors="replace"))
    elif path.is_file():
        try:
            with tarfile.open(path, "r:*") as tar:
                for member in tar.getmembers():
                    if not member.isfile():
                        continue
                    fh = tar.extractfile(member)
                    assert fh is not None
                    text = io.TextIOWrapper(fh, encoding="utf-8", errors="replace").read()
                    name = member.name.removeprefix("./")
                    files[name] = (Path(f"{path}:{name}"), text)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise InputError(path, f"not a profile archive: {e}") from None
    else:
        raise InputError(path, "no such profile folder or archive")
    return files


def load_profile(path: Path) -> Profile:
    """A profile folder or a ``.tar.gz`` of one (what ``lab/e2e.sh`` packs)."""
    return profile_from_files(profile_files(path), str(path))
