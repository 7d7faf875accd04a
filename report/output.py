"""Writing one report: every file of it goes through :func:`write_report`."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ggml_dispatch import fileio
from report.markdown import PLOTS_DIR, REPORT_NAME, Report


def write_report(out_dir: Path, result: Report) -> Path:
    """OUT/plots/*.png (stale PNGs of an earlier report removed), then OUT/REPORT.md, each file
    written atomically; other files in OUT are left alone. Returns the path of REPORT.md."""
    plots = out_dir / PLOTS_DIR
    plots.mkdir(parents=True, exist_ok=True)
    for name, png in sorted(result.figures.items()):
        with fileio.atomic_path(plots / name) as tmp:
            tmp.write_bytes(png)
            tmp.chmod(0o644)
    for stale in sorted(plots.glob("*.png")):
        if stale.name not in result.figures:
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    with fileio.atomic_path(out_dir / REPORT_NAME) as tmp:
        tmp.write_text(result.markdown, encoding="utf-8")
        tmp.chmod(0o644)
    return out_dir / REPORT_NAME
