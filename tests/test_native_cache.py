"""The weight cache's bookkeeping (ggml_dispatch/hook/native/ggml-dispatch-cache.h), compiled with g++ and
driven by
tests/native/cache_unit.cpp as ggml-dispatch-cache-impl.cuh drives it (host allocator in place of
cudaMalloc, a fill callback in place of the to-f16 converter). The CUDA side needs a GPU: lab/cache.sh."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ggml_dispatch.hook.install import NATIVE_DIR

UNIT = Path(__file__).parent / "native" / "cache_unit.cpp"
CXX = shutil.which("g++") or shutil.which("c++")

pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) on PATH")

# acquire() results, in ggml-dispatch-cache.h's order
HIT, MADE, CAPTURING, NO_BUDGET, ALLOC_FAIL, MUTABLE, REFRESHED = range(7)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    exe = tmp_path_factory.mktemp("cache") / "cache_unit"
    flags = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-fsanitize=address,undefined"]
    subprocess.run([str(CXX), *flags, f"-I{NATIVE_DIR}", str(UNIT), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_a_tensor_used_twice_has_one_copy(seen: dict[str, Any]) -> None:
    assert (seen["w0_first"], seen["w0_second"]) == (MADE, HIT)
    assert seen["w0_same_copy"] == 1 and seen["fills_after_reuse"] == 1


def test_the_budget_is_never_exceeded(seen: dict[str, Any]) -> None:
    assert seen["w1"] == MADE and seen["w2_over_budget"] == NO_BUDGET and seen["w2_copy_null"] == 1
    assert seen["bytes_full"] == 800 and seen["other_device_over_budget"] == NO_BUDGET
    assert seen["peak_bytes"] <= 1000
    assert seen["budget0"] == NO_BUDGET


def test_a_write_over_a_cached_weight_frees_it_and_it_stays_uncached(seen: dict[str, Any]) -> None:
    assert seen["written_freed"] == 1 and seen["w1_after_write"] == MUTABLE
    assert seen["w0_still_hit"] == HIT and seen["bytes_after_write"] == 400
    assert seen["written_other_buffer"] == 0 and seen["written_adjacent"] == 0
    assert seen["invalidated"] == 1


def test_no_copy_is_made_under_capture(seen: dict[str, Any]) -> None:
    assert seen["w2_capturing"] == CAPTURING and seen["w2_pending"] == 1
    assert seen["allocs_during_capture"] == 0
    assert seen["w2_direct"] == MADE and seen["w2_pending_after"] == 0


def test_copies_live_as_long_as_their_buffer(seen: dict[str, Any]) -> None:
    assert seen["freed_with_buffer"] == 1 and seen["bytes_after_free"] == 400  # w2 of the other buffer stays
    assert seen["w1_after_buffer_reuse"] == MADE  # a new buffer at the same address starts clean
    assert (
        seen["live_after_clear"] == 0 and seen["allocs"] == seen["frees"] and seen["empty_after_clear"] == 1
    )


def test_a_failed_allocation_runs_uncached_and_is_not_retried(seen: dict[str, Any]) -> None:
    assert seen["w3_alloc_fail"] == ALLOC_FAIL and seen["w3_retry"] == ALLOC_FAIL
    assert seen["allocs_on_retry"] == 0 and seen["w4_fill_fail"] == ALLOC_FAIL


def test_the_environment_only_lowers_the_budget(seen: dict[str, Any]) -> None:
    assert seen["budget_unset_table"] == 3 << 20 and seen["budget_unset_forced_unlimited"] == 1
    assert seen["budget_off"] == 0
    assert seen["budget_lowered"] == 512 << 20 and seen["budget_not_raised"] == 3 << 20
    assert seen["budget_bad"] == 0 and "GGML_CUDA_DISPATCH_CACHE=lots" in seen["bad_error"]
    assert seen["neg_capped"] == 1


def test_a_kv_shadow_is_refilled_after_outside_writes_and_refreshed_where_that_failed(
    seen: dict[str, Any],
) -> None:
    assert seen["kv_made"] == MADE and seen["kv_lookup_same"] == 1
    assert seen["kv_written_before_nothing"] == 0  # the weight cache's hook leaves shadows alone
    assert seen["kv_refilled_none_stale"] == 0 and seen["kv_refill_range"] == 10 * 1000 + 14
    assert seen["kv_refill_clipped"] == 0 and seen["kv_refill_clipped_range"] == 90 * 1000 + 100
    assert seen["kv_refill_outside"] == 0 and seen["kv_refill_other_buffer"] == 0
    assert seen["kv_refills"] == 2 and seen["kv_refilled_stat"] == 2
    assert seen["kv_hit_after_refill"] == HIT
    assert seen["kv_refill_failed_marks"] == 1 and seen["kv_refill_failed_again"] == 0
    assert seen["kv_lookup_while_stale"] == 1  # the in-graph mirror still finds it
    assert seen["kv_stale_under_capture"] == CAPTURING and seen["kv_capture_copy_null"] == 1
    assert seen["kv_refreshed"] == REFRESHED and seen["kv_refreshed_in_place"] == 1
    assert seen["kv_fills"] == 2 and seen["kv_hit_after_refresh"] == HIT and seen["kv_bytes"] == 200
    assert seen["kv_freed_with_buffer"] == 1 and seen["kv_lookup_after_free"] == 1
    assert seen["kv_empty_after_free"] == 1
