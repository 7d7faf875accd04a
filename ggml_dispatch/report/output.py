"""Writing one report: every file of it goes through :func:`write_report`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path

from ggml_dispatch import fileio
from ggml_dispatch.report.markdown import PLOTS_DIR, REPORT_NAME, Report


def write_report(out_dir: Path, result: Report, inputs: Sequence[Path] = ()) -> Path:
    """OUT/plots/*.png and OUT/REPORT.md as one output set: all of them are written, or none (every
    target checked first, none may be an input). Stale PNGs of an earlier report are removed after;
    other files in OUT are left alone. Returns the path of REPORT.md."""
    plots = out_dir / PLOTS_DIR
    md_path = out_dir / REPORT_NAME
    pngs = {plots / name: png for name, png in sorted(result.figures.items())}
    with fileio.output_set([*pngs, md_path], inputs) as outputs:
        for target, png in pngs.items():
            outputs.path(target).write_bytes(png)
            outputs.path(target).chmod(0o644)
        outputs.path(md_path).write_text(result.markdown, encoding="utf-8")
        outputs.path(md_path).chmod(0o644)
    for stale in sorted(plots.glob("*.png")):
        if stale.name not in result.figures:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    return md_path
