# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""The seed workload's Amdahl table as files beside a profile (lab/qwen35.sh's profile part): the phases of a
``lab.serve_ab profile`` folder, attributed by :mod:`ggml_dispatch.report.attribution` (which ``ggml-dispatch
report --attribution`` puts at the top of a report), written as Markdown and JSON.

    python3 -m lab.qwen35_attrib out/profile -o out/profile/attribution.md [--json ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ggml_dispatch.errors import InputError
from ggml_dispatch.report import attribution


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m lab.qwen35_attrib", description=(__doc__ or "").split("\n")[0]
    )
    ap.add_argument("folder", type=Path, help="lab.serve_ab profile's output folder (or an archive of it)")
    ap.add_argument("--modes", default="mtp,plain")
    ap.add_argument("-o", "--out", type=Path, help="Markdown to write (default: stdout)")
    ap.add_argument("--json", type=Path, help="the same as JSON")
    args = ap.parse_args(argv)
    try:
        phases = attribution.load(args.folder, args.modes.split(","))
    except InputError as e:
        print(f"error: {e.render()}", file=sys.stderr)
        return 2
    text = attribution.markdown(phases)
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    if args.json:
        args.json.write_text(json.dumps(attribution.as_json(phases), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
