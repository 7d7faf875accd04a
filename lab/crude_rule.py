"""The crude rule of shared/reference/h200-e2e-crude-rule.md as a table, for the end-to-end A/B baseline.

"At the top of ggml_cuda_mul_mat, quantized weights with M >= 384 go to cuBLAS and 5 <= M <= 8 go to
mmq; everything else stock." Expressed as per-type default rules (N = K = 0) for every quantized weight
type, weight layout only, so it is compiled into a second build of the same tree exactly as a measured
table is. Its provenance says it is declared, not measured; it never goes under tables/.

    python lab/crude_rule.py -o DIR     -> DIR/table.json and DIR/ggml-dispatch-table.h
"""

from __future__ import annotations

import argparse
from pathlib import Path

from codegen import render, table
from ggml_dispatch import fileio, schema

GPU = schema.GpuId("NVIDIA H200", 900, 132)
M_MAX = 2**31 - 1
# quantized types a model's weights use (q8_1 / q8_K are activation formats)
WEIGHT_TYPES = sorted(
    t.name for t in schema.GGML_TYPES.values() if t.quantized and t.name not in {"q8_1", "q8_K"}
)


def crude_table() -> dict[str, object]:
    rules = []
    for t in WEIGHT_TYPES:
        base = {
            "op": "MUL_MAT",
            "layout": "weight",
            "src0_type": t,
            "src1_type": "f32",
            "N": 0,
            "K": 0,
            "B": 1,
        }
        rules.append({**base, "M_lo": 5, "M_hi": 8, "route": "mmq", "kind": "declared"})
        rules.append({**base, "M_lo": 384, "M_hi": M_MAX, "route": "cublas", "kind": "declared"})
    t = table.empty_table()
    t["gpu"] = {"name": GPU.name, "cc": GPU.cc, "sm_count": GPU.sm_count}
    t["upstream_commit"] = schema.PINNED_UPSTREAM_COMMIT
    t["provenance"] = {"source": table.SOURCE_DECLARED, "rule": "shared/reference/h200-e2e-crude-rule.md"}
    t["rules"] = rules
    return table.validate(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", type=Path, required=True)
    out = ap.parse_args().out
    t = crude_table()
    fileio.write_text_atomic(out / table.TABLE_FILENAME, table.dumps(t))
    fileio.write_text_atomic(out / table.HEADER_FILENAME, render.render_header(t))
    print(out / table.TABLE_FILENAME)


if __name__ == "__main__":
    main()
