"""The sweep journal: append-only lines, torn last line after a kill, identity of the sweep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ggml_dispatch.errors import InputError
from ggml_dispatch.tuner.journal import JOURNAL_SCHEMA, Journal, journal_records, read_journal

IDENT = {"census_sha256": "ab" * 32, "shard": "0/1"}


def rec(case: str, status: str = "done") -> dict[str, object]:
    return {"case": case, "status": status, "spec": {"case": case}, "trials": []}


def test_append_and_read_back(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    with Journal.open(p, IDENT) as j:
        j.append(rec("a"))
        j.append(rec("b", "failed:exit 3"))
    lines = p.read_text().splitlines()
    assert json.loads(lines[0])["schema"] == JOURNAL_SCHEMA and len(lines) == 3
    c = read_journal(p)
    assert c.done_ids() == {"a", "b"} and c.warnings == []
    assert c.header is not None and c.header["census_sha256"] == IDENT["census_sha256"]


def test_torn_last_line_is_ignored_and_the_next_append_starts_clean(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    with Journal.open(p, IDENT) as j:
        j.append(rec("a"))
    with p.open("ab") as f:
        f.write(b'{"kind": "case", "case": "b", "sta')  # killed mid-write
    c = read_journal(p)
    assert c.done_ids() == {"a"}
    assert c.warnings and "torn last line" in c.warnings[0]
    with Journal.open(p, IDENT) as j:
        assert j.contents.done_ids() == {"a"}
        j.append(rec("b"))
    c = read_journal(p)
    assert c.done_ids() == {"a", "b"} and c.warnings == []


def test_damage_before_the_last_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    with Journal.open(p, IDENT) as j:
        j.append(rec("a"))
        j.append(rec("b"))
    lines = p.read_text().splitlines()
    lines[1] = lines[1][:10]
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as e:
        read_journal(p)
    assert e.value.line == 2


def test_a_journal_of_another_sweep_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    with Journal.open(p, IDENT) as j:
        j.append(rec("a"))
    with pytest.raises(InputError) as e:
        Journal.open(p, {**IDENT, "shard": "1/2"})
    assert e.value.field == "shard" and "another sweep" in e.value.message


def test_a_later_record_of_a_case_replaces_the_earlier(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    with Journal.open(p, IDENT) as j:
        j.append(rec("a", "failed:timeout after 5 s"))
        j.append(rec("a"))
    (c,) = read_journal(p).cases
    assert c["status"] == "done"


def test_nan_never_reaches_the_journal(tmp_path: Path) -> None:
    with Journal.open(tmp_path / "j.jsonl", IDENT) as j, pytest.raises(ValueError):
        j.append({**rec("a"), "wall_s": float("nan")})


def test_unsound_cases_are_the_failed_and_those_with_a_wrong_trial(tmp_path: Path) -> None:
    p = tmp_path / "j.jsonl"
    wrong = rec("c") | {"trials": [{"status": "ok"}, {"status": "wrong"}]}
    with Journal.open(p, IDENT) as j:
        for r in (
            rec("a") | {"trials": [{"status": "ok"}, {"status": "pruned"}]},
            rec("b", "failed:exit 3"),
            wrong,
            # a candidate that killed the child: the case was measured again without it (tuner.run)
            rec("d") | {"trials": [{"status": "ok"}, {"status": "failed:killed by SIGABRT"}]},
        ):
            j.append(r)
        j.append(rec("b"))  # b measured again: its later record replaces the failed one
    assert read_journal(p).unsound_ids() == {"c", "d"}


REAL_JOURNAL = (
    Path(__file__).resolve().parent.parent / "tables/cuda-sm90-nvidia-h200/tuning/configs.journal.jsonl.gz"
)


def test_journal_records_reads_a_recorded_gzip_journal_line_by_line(tmp_path: Path) -> None:
    recs = journal_records(REAL_JOURNAL)
    assert recs[0]["kind"] == "journal" and recs[0]["schema"] == JOURNAL_SCHEMA
    assert len(recs) > 1 and {r["kind"] for r in recs[1:]} == {"case"}
    torn = tmp_path / "torn.jsonl"  # a killed run's last line, as read_journal leaves it out
    torn.write_text('{"kind": "journal"}\n{"kind": "case", "case": "a"}\n{"kind": "ca')
    assert [r["kind"] for r in journal_records(torn)] == ["journal", "case"]


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("j.jsonl", b'{"kind": "journal"}\nnot json\n{"kind": "case"}\n', ":2: not a JSON object"),
        ("j.jsonl", b'{"kind": "journal"}\n[1, 2]\n', ":2: not a journal record"),
        ("j.jsonl.gz", b'{"kind": "journal"}\n', "cannot read the journal (BadGzipFile"),
    ],
)
def test_journal_records_names_the_file_and_line_of_bad_input(
    tmp_path: Path, name: str, data: bytes, says: str
) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(InputError) as e:
        journal_records(path)
    assert str(e.value).startswith(str(path)) and says in str(e.value)
    with pytest.raises(InputError, match="no such file"):
        journal_records(tmp_path / "missing.jsonl")
