# Lab module: serves one GPU-lending arrangement (the GPU machine starts bare every call); see lab/README.md.
"""The seed workload through llama-server: stock vs table, paired, with and without MTP speculation.

The seed user serves a qwen35 model with ``llama-server --ctx-size 50000 --parallel 4 --kv-unified -b 2048
-ub 1024`` and a Q8_0 K/V cache, drafting with the model's own MTP head (``--spec-type draft-mtp
--spec-draft-n-max 2``, so each slot verifies up to 3 rows). This module starts that server (one process
per arm and mode, side by side on their own ports), sends requests straight to it and turns the server's
own timings into A/B records (:mod:`ggml_dispatch.artifacts.ab`, one per request group):

- ``pp1024 d<D> s<S>``: prefill tokens/s of S concurrent prompts of D tokens (ubatch 1024), the TTFT side;
- ``mtp2 tg<G> d<D> s<S>``: committed tokens/s while S slots generate G tokens each with MTP draft 2
  (the server's ``predicted_n`` counts only accepted tokens; rejected drafts are never output);
- ``tg<G> d<D> s<S>``: the same without speculation.

Prompts are token ids (the lab model's vocabulary is synthetic), sampling is greedy and ``ignore_eos`` holds
every request to G tokens, so both arms do the same work; the draft acceptance rate of every request is
kept in ``requests.jsonl`` (it must match between arms: a table changes kernels, not results).

    python3 -m lab.serve_ab ab --server build/bin/llama-server --model q35.gguf --name qwen35-L8 \\
        --pairs 5 -o out/serve          # arms stock (GGML_CUDA_DISPATCH=off) and table
    python3 -m lab.serve_ab trace --server ... --model ... -o out/trace    # route traces, one pass each
    python3 -m lab.serve_ab profile --server ... --model ... --timeline .carry/libkernel_timeline.so -o ...

``profile`` runs prefill and decode as separate requests with idle gaps between them, so that
:func:`phases` can cut a kernel timeline into load/warm-up, prefill and decode (lab.qwen35_attrib).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED_FLAGS = (
    "-ngl", "99", "-fa", "on", "-c", "50000", "-np", "4", "-kvu", "-b", "2048", "-ub", "1024",
    "-ctk", "q8_0", "-ctv", "q8_0", "--no-webui",
)  # fmt: skip
MTP_FLAGS = ("--spec-type", "draft-mtp", "--spec-draft-n-max", "2")
UBATCH = 1024
FIRST_TOKEN = 3 + 256  # lab.qwen35.SPM_FIRST_WORD: the synthetic vocabulary's first ordinary word
GAP_S = 2.0  # idle time between the profiled phases (the timeline is cut at gaps of half this)


@dataclass(frozen=True)
class Workload:
    depth: int  # prompt tokens per slot
    slots: int  # concurrent requests
    gen: int  # tokens generated per request

    def tests(self, mode: str) -> tuple[str, str]:
        """(prefill test, generation test) names of this workload in ``mode`` (mtp | plain)."""
        gen = f"mtp2 tg{self.gen}" if mode == "mtp" else f"tg{self.gen}"
        return f"pp{UBATCH} d{self.depth} s{self.slots}", f"{gen} d{self.depth} s{self.slots}"


def prompt_ids(depth: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_TOKEN, vocab) for _ in range(depth)]


def payload(prompt: Sequence[int], gen: int, cache_prompt: bool = False) -> dict[str, Any]:
    return {
        "prompt": list(prompt),
        "n_predict": gen,
        "ignore_eos": True,
        "temperature": 0.0,
        "cache_prompt": cache_prompt,
        "stream": False,
    }


@dataclass(frozen=True)
class Timings:
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int
    draft_accepted: int

    @staticmethod
    def from_response(obj: Mapping[str, Any]) -> Timings:
        t = obj["timings"]
        return Timings(
            int(t["prompt_n"]), float(t["prompt_ms"]), int(t["predicted_n"]), float(t["predicted_ms"]),
            int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)),
        )  # fmt: skip


def group_tps(timings: Sequence[Timings], wall_prefill_ms: float | None = None) -> tuple[float, float]:
    """(prefill tokens/s, generated tokens/s) of requests served together. Concurrent slots are batched
    by the server, so a group's rate is its tokens over the longest request's time, not a sum of rates."""
    pre_ms = wall_prefill_ms if wall_prefill_ms is not None else max(t.prompt_ms for t in timings)
    gen_ms = max(t.predicted_ms for t in timings)
    return (
        sum(t.prompt_n for t in timings) / pre_ms * 1e3,
        sum(t.predicted_n for t in timings) / gen_ms * 1e3,
    )


def acceptance(timings: Sequence[Timings]) -> float | None:
    drafted = sum(t.draft_n for t in timings)
    return sum(t.draft_accepted for t in timings) / drafted if drafted else None


# --- the server process ---------------------------------------------------------------------------


_REASON_MARKS = ("unknown model architecture", "error loading model", "failed to", "error:", "exception")


def log_reason(text: str) -> str | None:
    """The first line of a server log that says why it stopped (llama.cpp's loader and server errors)."""
    for line in text.splitlines():
        low = line.lower()
        if any(m in low for m in _REASON_MARKS):
            return line.strip()
    return None


def model_problem(model: Path, modes: Sequence[str]) -> str | None:
    """Why ``model`` cannot serve ``modes`` (checked before any server starts), or None."""
    from ggml_dispatch.census import gguf_meta
    from ggml_dispatch.errors import InputError

    try:
        m = gguf_meta.read_gguf(model)
    except InputError as e:
        return str(e)
    if not m.architecture:
        return f"{model}: no general.architecture"
    if "mtp" in modes and (problem := m.mtp_problem()) is not None:
        return f"{model}: {problem}; mode mtp drafts with the model's own MTP head (--modes plain without it)"
    return None


@dataclass
class Server:
    binary: Path
    model: Path
    port: int
    mode: str  # mtp | plain
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    _line: tuple[Any] | None = None  # dispatch_line's answer, once found (None inside: no line anywhere)

    def command(self) -> list[str]:
        cmd = [str(self.binary), "-m", str(self.model), *SEED_FLAGS, "--host", "127.0.0.1", "--port"]
        # a slot-save path enables the slot erase action (nothing is saved): see erase_slots
        cmd += [str(self.port), "--slot-save-path", str(self.log.parent / "slots")]
        return cmd + (list(MTP_FLAGS) if self.mode == "mtp" else [])

    def start(self, timeout_s: float = 300.0) -> None:
        (self.log.parent / "slots").mkdir(exist_ok=True)
        with self.log.open("ab") as logf:
            self.proc = subprocess.Popen(
                self.command(), stdout=logf, stderr=subprocess.STDOUT, env={**os.environ, **self.env}
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                reason = log_reason(self.log.read_text(errors="replace")) or "no reason in its log"
                rc = self.proc.returncode
                raise RuntimeError(f"llama-server exited with {rc}: {reason} (see {self.log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise RuntimeError(f"llama-server not ready in {timeout_s:.0f} s: see {self.log}")

    def dispatch_line(self) -> Any:  # ggml_dispatch.artifacts.ab.DispatchLine | None
        """The hook's start-up line: from this server's log, else from a start of the same binary under the
        same environment with ``-lv 4 --list-devices``. Newer llama-server trees pass ggml's INFO lines to
        their log only at verbosity 4 and above, so the timed server's own log may not hold the line; the
        list command initialises the CUDA backend, where the hook prints it, and exits."""
        from ggml_dispatch.artifacts import ab as ab_format

        if self._line is None:
            line = ab_format.find_dispatch_line(self.log.read_text(errors="replace"))
            if line is None:
                res = subprocess.run(
                    [str(self.binary), "-lv", "4", "--list-devices"], capture_output=True, text=True,
                    env={**os.environ, **self.env}, timeout=300, check=False,
                )  # fmt: skip
                line = ab_format.find_dispatch_line(res.stdout + res.stderr)
            self._line = (line,)
        return self._line[0]

    def complete(self, body: Mapping[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            out: dict[str, Any] = json.loads(r.read())
        return out

    def erase_slots(self, n: int = 4) -> None:
        """Drop every slot's cached prompt: the 4 slots share one 50000-cell KV cache (--kv-unified), so a
        48k prompt fits only once the previous group's prompts are gone."""
        for i in range(n):
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/slots/{i}?action=erase", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                r.read()

    def group(self, prompts: Sequence[Sequence[int]], gen: int, cache_prompt: bool = False) -> list[Timings]:
        """Send the prompts concurrently (one slot each) and wait for all."""
        results: list[Timings | BaseException] = [RuntimeError("not run")] * len(prompts)

        def one(i: int) -> None:
            try:
                results[i] = Timings.from_response(self.complete(payload(prompts[i], gen, cache_prompt)))
            except BaseException as e:  # re-raised in the caller's thread
                results[i] = e

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            if isinstance(r, BaseException):
                raise RuntimeError(f"request to port {self.port} failed: {r}") from r
        return [r for r in results if isinstance(r, Timings)]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


def workloads(args: argparse.Namespace) -> list[Workload]:
    out = [Workload(args.depth1, 1, args.gen)]
    if args.depth4 > 0:
        out.append(Workload(args.depth4, 4, args.gen))
    return out


def warm(server: Server, vocab: int) -> None:
    server.group([prompt_ids(64, 99, vocab)], 8)


# --- A/B ------------------------------------------------------------------------------------------


def run_ab(args: argparse.Namespace) -> int:
    from ggml_dispatch.artifacts import ab as ab_format
    from ggml_dispatch.report import abrun

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    gpu = abrun.query_gpu()
    if gpu is None:
        print("no GPU visible (nvidia-smi)", file=sys.stderr)
        return 2
    arms = dict(a.split("=", 1) for a in args.arm)
    records: list[ab_format.Record] = []
    raw = (out / "requests.jsonl").open("a")
    port = args.port
    for mode in args.modes.split(","):
        servers: dict[str, Server] = {}
        peaks: dict[str, abrun.VramPeak] = {}
        for arm, dispatch in arms.items():
            env = {"GGML_CUDA_DISPATCH": dispatch}
            servers[arm] = Server(args.server, args.model, port, mode, env, out / f"server-{mode}-{arm}.log")
            port += 1
        try:
            for arm, s in servers.items():
                # the device's rise over what was in use before this server: the servers start one by
                # one, so each rise is its own (nvidia-smi may not list processes in a container)
                before = abrun.parse_memory_used(_smi("--query-gpu=memory.used"))
                s.start()
                warm(s, args.vocab)
                peaks[arm] = abrun.VramPeak(s.pid(), "nvidia-smi", before)
                peaks[arm].start()
            lib = abrun.resolve_lib(args.server, os.environ)
            run = RunInfo(lib, ab_format_sha(lib), gpu)
            for pair in range(args.pairs):
                order = list(servers) if pair % 2 == 0 else list(reversed(servers))
                for w in workloads(args):
                    prompts = [prompt_ids(w.depth, 1000 * pair + i, args.vocab) for i in range(w.slots)]
                    for arm in order:
                        s = servers[arm]
                        s.erase_slots()
                        started = time.time()
                        t = s.group(prompts, w.gen)
                        records += group_records(
                            args.name, mode, w, arm, pair, t, s, started, run, peaks[arm]
                        )
                        raw.write(json.dumps({
                            "model": args.name, "mode": mode, "arm": arm, "pair": pair,
                            "depth": w.depth, "slots": w.slots, "gen": w.gen,
                            "acceptance": acceptance(t), "timings": [dataclasses.asdict(x) for x in t],
                        }) + "\n")  # fmt: skip
                        raw.flush()
                        pre, gen = group_tps(t)
                        label = f"{mode} {pair} {arm} d{w.depth} s{w.slots}"
                        rates = f"pp {pre:.0f} t/s, gen {gen:.1f} t/s, acceptance {acceptance(t)}"
                        print(f"{label}: {rates}", flush=True)
                ab_format.write_records(out / f"ab-{args.name}-serve.jsonl", records)
        finally:
            for arm, s in servers.items():
                if arm in peaks:
                    peaks[arm].stop()
                s.stop()
    raw.close()
    return 0


@dataclass(frozen=True)
class RunInfo:
    lib: Path
    lib_sha256: str
    gpu: Any  # ggml_dispatch.report.abrun.Gpu


def group_records(
    name: str, mode: str, w: Workload, arm: str, pair: int, t: Sequence[Timings], s: Server,
    started: float, run: RunInfo, peak: Any,
) -> list[Any]:  # fmt: skip
    """The two A/B records (prefill, generation) of one request group, with the server's provenance."""
    from ggml_dispatch.artifacts import ab as ab_format

    line = s.dispatch_line()
    prov = ab_format.Provenance(
        command=tuple(s.command()),
        env=tuple(sorted(s.env.items())),
        dispatch_line=line.text if line else "",
        table_hash=line.table_hash if line else None,
        table_applied=line.applied if line else False,
        lib_path=str(run.lib),
        lib_sha256=run.lib_sha256,
        gpu_name=run.gpu.name,
        gpu_uuid=run.gpu.uuid,
        driver=run.gpu.driver,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        **_vram(peak),
    )
    return [
        ab_format.Record(name, test, UBATCH, arm, pair, tps, (tps,), prov)
        for test, tps in zip(w.tests(mode), group_tps(t), strict=True)
    ]


def _smi(query: str) -> str:
    res = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=False
    )
    return res.stdout


def _vram(peak: Any) -> dict[str, Any]:
    if peak.process_mib is not None:
        return {"peak_vram_mib": peak.process_mib, "vram_source": "process"}
    if peak.device_mib is not None:
        return {"peak_vram_mib": peak.device_mib, "vram_source": "device"}
    return {}


def ab_format_sha(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- trace and profile ----------------------------------------------------------------------------


def run_phased(args: argparse.Namespace, extra_env: Mapping[str, str], tag: str) -> int:
    """One server per mode: prefill each workload (1 generated token), then its generation from the cached
    prompt, with an idle gap before each phase; ``phases.jsonl`` lists them in order."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    port = args.port
    failed = False
    for mode in args.modes.split(","):
        env = {"GGML_CUDA_DISPATCH": args.dispatch, **{k: v.format(mode=mode) for k, v in extra_env.items()}}
        s = Server(args.server, args.model, port, mode, env, out / f"server-{tag}-{mode}.log")
        port += 1
        phases = []
        try:
            s.start()
            warm(s, args.vocab)
            for w in workloads(args):
                s.erase_slots()
                prompts = [prompt_ids(w.depth, 7 + i, args.vocab) for i in range(w.slots)]
                for phase, gen in (("prefill", 1), ("decode", w.gen)):
                    time.sleep(GAP_S)
                    t = s.group(prompts, gen, cache_prompt=True)
                    phases.append({
                        "mode": mode, "phase": phase, "depth": w.depth, "slots": w.slots, "gen": gen,
                        "acceptance": acceptance(t), "timings": [dataclasses.asdict(x) for x in t],
                    })  # fmt: skip
                    print(f"{tag} {mode} {phase} d{w.depth} s{w.slots}: {t}", flush=True)
            time.sleep(GAP_S)
        except (RuntimeError, OSError) as e:  # the other mode still runs; the log says what failed
            print(f"{tag} {mode}: {e}", file=sys.stderr, flush=True)
            failed = True
        finally:
            s.stop()
        with (out / f"phases-{mode}.jsonl").open("w") as f:
            f.writelines(json.dumps(p) + "\n" for p in phases)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.serve_ab", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("what", choices=("ab", "trace", "profile"))
    ap.add_argument("--server", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--name", default="qwen35", help="model name in the records")
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--arm", action="append", default=None, help="NAME=GGML_CUDA_DISPATCH value (ab)")
    ap.add_argument("--dispatch", default="off", help="GGML_CUDA_DISPATCH of trace/profile (default off)")
    ap.add_argument("--modes", default="mtp,plain")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--depth1", type=int, default=48000, help="prompt tokens of the 1-slot workload")
    ap.add_argument("--depth4", type=int, default=12000, help="prompt tokens per slot, 4 slots (0: none)")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--port", type=int, default=8190)
    ap.add_argument("--timeline", type=Path, help="libkernel_timeline.so (profile)")
    args = ap.parse_args(argv)
    modes = args.modes.split(",")
    if bad := sorted(set(modes) - {"mtp", "plain"}):
        ap.error(f"--modes: {', '.join(bad)} is not mtp or plain")
    if (problem := model_problem(args.model, modes)) is not None:
        ap.error(problem)
    if args.what == "ab":
        args.arm = args.arm or ["stock=off", "table=table"]
        return run_ab(args)
    if args.what == "trace":
        return run_phased(args, {"GGML_CUDA_ROUTE_TRACE": str(args.out / "trace-{mode}.jsonl")}, "trace")
    if args.timeline is None:
        ap.error("profile needs --timeline")
    env = {"CUDA_INJECTION64_PATH": str(args.timeline), "KERNEL_TIMELINE_OUT": str(args.out / "{mode}.ktl")}
    return run_phased(args, env, "profile")


if __name__ == "__main__":
    sys.exit(main())
