"""The carry for lab/upstream.sh: a tree of the compatibility matrix, whole, with the hook installed.

``python -m lab.upstream_carry b11549 -o .carry/upstream.tar.xz`` takes the tree's line of
ggml_dispatch/hook/compat.tsv,
downloads its sdist (sha256-checked, cached), extracts the llama.cpp folder whole (the GPU machine builds
test-backend-ops and llama-bench from it), installs the hook with every feature that fits, writes
``install-check.json`` beside it and packs it without the folders a build does not read.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from ggml_dispatch import fetch
from ggml_dispatch.hook import compat
from ggml_dispatch.hook import install as inst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a tree's name in ggml_dispatch/hook/compat.tsv (e.g. b11549)")
    ap.add_argument("-o", "--out", type=Path, required=True, help="the .tar.xz to write")
    args = ap.parse_args(argv)
    trees = {t.name: t for t in compat.load_trees(compat.TREES_TSV)}
    if args.name not in trees:
        print(f"error: no tree {args.name!r} in {compat.TREES_TSV} ({', '.join(trees)})", file=sys.stderr)
        return 2
    tree = trees[args.name]
    sdist = fetch._download(tree.project, tree.version, ".tar.gz", tree.sha256, fetch.CACHE / "dl")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "llama.cpp"
        prefix = tree.prefix + "/"
        with tarfile.open(sdist) as tar:
            members = []
            for m in tar.getmembers():
                if m.name.startswith(prefix) and (m.isfile() or m.isdir()):
                    m.name = m.name[len(prefix) :]
                    members.append(m)
            tar.extractall(root, members=members, filter="data")
        if tree.upstream:
            (root / "UPSTREAM_COMMIT").write_text(tree.upstream + "\n", encoding="utf-8")
        check = inst.check(root)
        plan = inst.install(root)
        print("\n".join(plan.messages))
        (root / "install-check.json").write_text(json.dumps(check, indent=2) + "\n", encoding="utf-8")
        fetch.pack_trimmed(root, args.out)
        shutil.rmtree(root)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
