"""Which hook features a tree takes: every hunk located by content, each feature applied or skipped. Pure.

A feature is applied when it is asked for, every hunk that names it fits the tree (:func:`patch.locate`) and
every feature it requires is applied. A hunk shared by several features (an include, say) is applied when any
of them is. ``core`` is the seam itself: without it nothing is installed. The reason a feature is skipped is
the first hunk that does not fit, with the first anchor line that differs from the tree's line there.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from ggml_dispatch import registry
from ggml_dispatch.hook import patch

APPLIED = "applied"
SKIPPED = "skipped"


@dataclass(frozen=True)
class FeatureStatus:
    status: str  # APPLIED or SKIPPED
    reason: str | None = None
    lines: int = 0  # lines its hunks insert into upstream files (a shared hunk counts for each feature)

    def to_json(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "lines": self.lines}


@dataclass
class Fit:
    """The features' statuses and, per target file, the effective hunks to apply (in spec order)."""

    features: dict[str, FeatureStatus] = field(default_factory=dict)
    hunks: dict[str, list[patch.Hunk]] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)  # feature -> every hunk that does not fit

    @property
    def applied(self) -> frozenset[str]:
        return frozenset(n for n, s in self.features.items() if s.status == APPLIED)

    @property
    def mask(self) -> int:
        return sum(1 << registry.FEATURES[n].bit for n in self.applied)


def parse_features(text: str | None) -> frozenset[str]:
    """``--features``: None or "all" = every feature; else names separated by commas (core is always in)."""
    if text is None or text.strip() == "all":
        return frozenset(registry.FEATURES)
    names = [n.strip() for n in text.split(",")]
    if any(not n for n in names):
        raise ValueError(f"--features {text!r}: an empty name")
    unknown = [n for n in names if n not in registry.FEATURES]
    if unknown:
        raise ValueError(
            f"--features: unknown feature {unknown[0]!r} (features: {', '.join(registry.FEATURES)})"
        )
    return frozenset({registry.CORE_FEATURE, *names})


def fit(
    sources: Mapping[str, str], specs: Mapping[str, list[patch.Hunk]], wanted: Collection[str] | None = None
) -> Fit:
    """Locate every hunk of ``specs`` (target name -> hunks) in ``sources`` (target name -> pristine text)."""
    wanted = frozenset(registry.FEATURES) if wanted is None else frozenset(wanted)
    out = Fit()
    located: dict[str, dict[str, patch.Hunk]] = {t: {} for t in specs}
    misfits: list[tuple[patch.Hunk, str]] = []
    fitted_groups: set[str] = set()
    lines: dict[str, int] = dict.fromkeys(registry.FEATURES, 0)
    for target, hunks in specs.items():
        index = patch.index_lines(sources[target])
        for h in hunks:
            unknown = [f for f in h.features if f not in registry.FEATURES]
            if unknown:
                raise patch.PatchError(f"names an unknown feature {unknown[0]!r}", h.name, h.function)
            if h.group and h.group in fitted_groups:
                continue  # another form of this edit already fits the tree
            try:
                located[target][h.name] = patch.locate(sources[target], h, index)
            except patch.PatchError as e:
                misfits.append((h, f"{target}: {e}"))
                continue
            if h.group:
                fitted_groups.add(h.group)
            for f in h.features:
                lines[f] += h.inserted_lines
    failed: dict[str, list[str]] = {name: [] for name in registry.FEATURES}
    for h, why in misfits:  # a form of a grouped edit that does not fit fails only if no form does
        if not (h.group and h.group in fitted_groups):
            for f in h.features:
                failed[f].append(why)
    # a feature is applied once its own hunks fit and what it requires is applied (the order of FEATURES
    # lists a required feature before the ones that need it)
    for name, spec in registry.FEATURES.items():
        if failed[name]:
            out.features[name] = FeatureStatus(SKIPPED, failed[name][0], lines[name])
            out.problems[name] = failed[name]
        elif name not in wanted:
            out.features[name] = FeatureStatus(SKIPPED, "not asked for (--features)", lines[name])
        elif missing := [r for r in spec.requires if out.features[r].status != APPLIED]:
            out.features[name] = FeatureStatus(
                SKIPPED, f"needs feature {missing[0]!r}, which is skipped", lines[name]
            )
        else:
            out.features[name] = FeatureStatus(APPLIED, None, lines[name])
    applied = out.applied
    for target, hunks in specs.items():
        chosen = [
            located[target][h.name] for h in hunks if h.name in located[target] and applied & set(h.features)
        ]
        # a file whose applied hunks only require its content is no target: install leaves it alone
        out.hunks[target] = chosen if any(h.kind != "require" for h in chosen) else []
    return out
