"""Launches of matmul and attention kernels that the seam does not see.

The seam decides at three places (MUL_MAT, MUL_MAT_ID and FLASH_ATTN_EXT nodes of a graph, and the fused
groups ggml_cuda_try_fuse makes, which it counts as such). A tree can launch the same kernels from elsewhere:
a new fusion, a chunked cuBLAS path. Such a launch runs whatever the tree picks, untraced and untouched by a
table. :func:`scan` lists every call of a kernel entry point in ggml-cuda's sources that is not one of the
calls the seam accounts for (:data:`SEEN`, each with why it is seen). The calls are compared by enclosing
function, callee and arguments, not by line, so code that only moved is still recognized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

CUDA_DIR: Final = Path("ggml") / "src" / "ggml-cuda"

# Entry points that launch matrix-multiplication or attention kernels.
ENTRY_POINTS: Final = (
    "ggml_cuda_mul_mat_vec_q",
    "ggml_cuda_mul_mat_vec_f",
    "ggml_cuda_mul_mat_q",
    "ggml_cuda_mul_mat_f",
    "ggml_cuda_mul_mat_cublas",
    "ggml_cuda_mul_mat_cublas_impl",
    "ggml_cuda_mul_mat_batched_cublas",
    "ggml_cuda_op_mul_mat",
    "ggml_cuda_flash_attn_ext",
    "cublasGemmEx",
    "cublasGemmStridedBatchedEx",
    "cublasGemmBatchedEx",
    "cublasSgemm",
    "cublasHgemm",
)
_CALL: Final = re.compile(r"\b(" + "|".join(ENTRY_POINTS) + r")\s*(<[^;(]*>)?\s*\(")
# a function definition starts in column 0 with a name and an opening parenthesis
_DEF: Final = re.compile(
    r"^(?:template\s*<.*>\s*)?(?:static\s+|inline\s+|__global__\s+|extern\s+\"C\"\s+)*"
    r"[A-Za-z_][\w:<>,\s\*&]*?\b([A-Za-z_]\w*)\s*\("
)

# Why the seam sees a call, by the function it is in (ggml-cuda.cu); other functions are not seen.
SEEN_FUNCTIONS: Final[dict[str, str]] = {
    "ggml_cuda_mul_mat": "stock MUL_MAT cascade (seam: MUL_MAT)",
    "ggml_cuda_mul_mat_id": "stock MUL_MAT_ID cascade and its per-expert fallback (seam: MUL_MAT_ID)",
    "ggml_cuda_mul_mat_cublas": "the cuBLAS route (seam: MUL_MAT, cublas)",
    "ggml_cuda_mul_mat_cublas_impl": "the cuBLAS route (seam: MUL_MAT, cublas)",
    "ggml_cuda_compute_forward": "FLASH_ATTN_EXT node (seam: FLASH_ATTN_EXT)",
    "ggml_cuda_try_fuse": "a fused group the seam counts as fused (the table never overrides one)",
}
# Functions whose GEMMs belong to other ops (not matmul or attention nodes): listed apart, by design untuned.
OTHER_OPS: Final = re.compile(r"conv|out_prod|ssm_scan|im2col|lightning|dsv4", re.IGNORECASE)
SEEN_FILE: Final = Path(__file__).resolve().parent / "native" / "seen-calls.tsv"


@dataclass(frozen=True)
class Call:
    file: str
    line: int
    function: str
    callee: str
    text: str  # the call's first line, whitespace collapsed

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.function, self.callee)

    @property
    def signature(self) -> tuple[str, str, str, str]:
        """What identifies the call across trees: where it is and what it passes, not its line."""
        return (self.file, self.function, self.callee, self.text)


@dataclass(frozen=True)
class Unhooked:
    call: Call
    why: str
    other_op: bool = False  # a GEMM inside another op (conv, out_prod, ssm_scan): not a matmul node

    def to_json(self) -> dict[str, Any]:
        c = self.call
        return {
            "file": str(CUDA_DIR / c.file),
            "line": c.line,
            "function": c.function,
            "call": c.text,
            "why": self.why,
            "kind": "other_op" if self.other_op else "node",
        }


def load_seen(path: Path = SEEN_FILE) -> frozenset[tuple[str, str, str, str]]:
    """The calls the seam was reviewed against (file, function, callee, call text; tab-separated)."""
    seen = set()
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 4:
            raise ValueError(f"{path}:{number}: expected 4 tab-separated fields, got {len(parts)}")
        seen.add((parts[0], parts[1], parts[2], parts[3]))
    return frozenset(seen)


def seen_lines(tree: Path) -> list[str]:
    """The TSV lines of every seen-by-function call of ``tree`` (``python -m ggml_dispatch.hook.unhooked
    --learn TREE``)."""
    out = []
    for c in _tree_calls(tree):
        if c.file == "ggml-cuda.cu" and c.function in SEEN_FUNCTIONS:
            out.append("\t".join(c.signature))
    return sorted(set(out))


_DECLARATION: Final = re.compile(r"^[A-Za-z_][\w\s\*&:<>,]*\s$")


def calls(name: str, text: str) -> list[Call]:
    """Every call of an entry point in one source file, with the function it is in (column-0 definitions)."""
    out: list[Call] = []
    function = "(file scope)"
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw[:1].isalpha() and not raw.rstrip().endswith(";"):
            m = _DEF.match(raw)
            if m:
                function = m.group(1)
        stripped = raw.strip()
        if stripped.startswith(("//", "*", "/*", "#")):
            continue
        for m in _CALL.finditer(stripped):
            callee = m.group(1)
            prefix = stripped[: m.start()]
            if function == callee or (_DECLARATION.match(prefix) and not prefix.startswith("return")):
                continue  # its definition or a declaration
            out.append(Call(name, number, function, callee, " ".join(stripped.split())))
    return out


def _tree_calls(tree: Path) -> list[Call]:
    folder = tree / CUDA_DIR
    out: list[Call] = []
    for path in sorted([*folder.glob("*.cu"), *folder.glob("*.cuh")]):
        if not path.name.startswith("ggml-dispatch"):
            out += calls(path.name, path.read_text(encoding="utf-8", errors="replace"))
    return out


def scan(tree: Path, seen: frozenset[tuple[str, str, str, str]] | None = None) -> list[Unhooked]:
    """The calls of entry points in ``tree``'s ggml-cuda sources that the seam does not account for: a call is
    seen where it is one of the reviewed calls (same function, callee and arguments), or is inside the kernel
    family's own file; GEMMs of other ops are listed with that reason."""
    seen = load_seen() if seen is None else seen
    found: list[Unhooked] = []
    for c in _tree_calls(tree):
        if c.signature in seen:
            continue
        if c.file != "ggml-cuda.cu" and c.function.startswith(
            ("ggml_cuda_mul_mat", "ggml_cuda_flash_attn", "launch_")
        ):
            continue  # inside the kernel family's own file: the entry point's own code
        other = bool(OTHER_OPS.search(c.function) or OTHER_OPS.search(c.file))
        if other:
            why = f"a GEMM inside another op ({c.function}); not a matmul node, the seam does not choose it"
        elif c.file == "ggml-cuda.cu" and c.function in SEEN_FUNCTIONS:
            why = f"a call in {c.function} that the seam was not reviewed against (a new path of the tree)"
        else:
            why = f"{c.callee} called from {c.function}, which the seam does not see"
        found.append(Unhooked(c, why, other))
    return found


def main(argv: list[str] | None = None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--learn":
        print(
            "usage: python -m ggml_dispatch.hook.unhooked --learn TREE\n"
            "(prints seen-calls.tsv for a reviewed tree)"
        )
        return 2
    print("# calls of kernel entry points the seam accounts for: file, function, callee, call")
    print("\n".join(seen_lines(Path(args[1]))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
