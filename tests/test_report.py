"""`ckptio report`: results from different machines/sites merge into one report."""

import json
import math

import pytest

from ckptio.cli import main


def _no_nan(token: str) -> None:
    raise AssertionError(f"not valid JSON: {token}")


RUN = ["--preset", "llama3-8b", "--total-size", "4MiB", "--object-size", "1MiB"]


@pytest.fixture
def two_sites(tmp_path):
    """One result directory written "on another machine" (--site lab, emulated cloud-s3 with
    fast figures), one local (--site laptop, file://)."""
    lab, here = tmp_path / "from-lab", tmp_path / "here"
    assert (
        main(
            [
                "run",
                "memory://lab",
                *RUN,
                "--site",
                "lab",
                "--emulate",
                "cloud-s3",
                "--option",
                "request_latency=5ms",
                "--option",
                "metadata_latency=5ms",
                "--out",
                str(lab),
            ]
        )
        == 0
    )
    assert (
        main(["run", f"file://{tmp_path / 'data'}", *RUN, "--site", "laptop", "--out", str(here)])
        == 0
    )
    return lab, here


def test_results_from_two_sites_merge_into_one_report(two_sites, tmp_path, capsys) -> None:
    lab, here = two_sites
    capsys.readouterr()
    out = tmp_path / "merged"
    assert (
        main(
            ["report", str(lab), str(here), "--out", str(out), "--json", "--project", "llama3-70b"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out, parse_constant=_no_nan)  # strict JSON
    assert result["sites"] == ["lab", "laptop"]
    by_site = {s["site"]: s for s in result["summary"]}
    assert by_site["lab"]["kind"] == "emulated" and by_site["laptop"]["kind"] == "measured"
    assert all("@" in s["target"] for s in result["summary"])  # site shown beside the target
    md = (out / "report.md").read_text()
    assert "@ lab" in md and "@ laptop" in md
    html = (out / "index.html").read_text()
    assert "throughput.png" in html and "emulated" in html
    proj = result["projections"]
    assert {p["preset"] for p in proj} == {"llama3-70b"}
    assert all(p["binding_detail"] for p in proj)


def test_model_calibrates_from_measured_results(two_sites, capsys) -> None:
    _, here = two_sites
    capsys.readouterr()
    assert main(["model", "--from", str(here), "--preset", "gpt3-175b", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cal = out["calibration"][0]
    assert cal["stream_bandwidth"] > 0 and cal["requests"] > 0 and not cal["emulated"]
    # one round of 4 MiB: fitted, but too little to project (no spread between rounds, no
    # steady state), and it says what would do
    t = out["targets"][0]
    assert t["kind"] == "measured" and "write_seconds" not in t
    assert "round" in t["refusal"] and "--iterations" in t["refusal"]


def test_report_of_nothing_is_an_error(tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert "nope" in capsys.readouterr().err


def test_sweep_results_give_the_concurrency_plot(tmp_path, capsys) -> None:
    sweep_dir = tmp_path / "sweep"
    assert (
        main(
            [
                "sweep",
                "memory://sweep",
                *RUN,
                "--emulate",
                "cloud-s3",
                "--streams",
                "1,4",
                "--part-size",
                "512KiB",
                "--option",
                "request_latency=5ms",
                "--option",
                "metadata_latency=5ms",
                "--out",
                str(sweep_dir),
            ]
        )
        == 0
    )
    capsys.readouterr()
    out = tmp_path / "r"
    assert main(["report", str(sweep_dir), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert str(out / "sweep.png") in result["files"]
    assert "sweep.png" in (out / "report.md").read_text()


def test_plot_axes_fit_the_data_and_name_their_units(two_sites, tmp_path, monkeypatch) -> None:
    """The latency plot's x-axis spans the data (not decades past it); the cost axis says its
    price is in units per GPU-hour, with no currency assumed."""
    from matplotlib.figure import Figure

    seen: dict[str, Figure] = {}
    real = Figure.savefig

    def savefig(self, path, *args, **kwargs):
        seen[str(path).rsplit("/", 1)[-1]] = self
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    lab, here = two_sites
    assert main(["report", str(lab), str(here), "--out", str(tmp_path / "rep")]) == 0
    import pyarrow.parquet as pq

    slowest = max(
        max(pq.read_table(p).column("seconds").to_pylist())
        for d in (lab, here)
        for p in d.glob("*.requests.parquet")
    )
    _lo, hi = seen["latency.png"].axes[0].get_xlim()
    assert hi <= slowest * 1e3 * 100, (hi, slowest)  # ms; room for the labels, not 3 decades
    labels = [a.get_ylabel() for ax in seen["cost.png"].axes for a in (ax, *ax.child_axes)]
    assert any("price units per GPU-hour" in label for label in labels), labels


@pytest.fixture(scope="module")
def small_compare(tmp_path_factory):
    """A compare of every kind of target the plots draw: a measured one with intervals (4
    rounds; its rounds are far too short to be projected for real, so this fixture lets every
    round count and no interval refuse: the steady-state rules have tests of their own), an
    emulated one and a tiered one."""
    from ckptio import calibration
    from ckptio.compare import CompareWorkload, compare

    mp = pytest.MonkeyPatch()
    mp.setattr(calibration, "MIN_ROUND_BYTES", 0)
    mp.setattr(calibration, "MIN_ROUND_SECONDS", 0.0)
    mp.setattr(calibration, "MIN_ROUND_REQUESTS", 0)
    mp.setattr(calibration, "HALVES_TOLERANCE", math.inf)
    mp.setattr(calibration, "MAX_RELATIVE_INTERVAL", math.inf)
    try:
        out = tmp_path_factory.mktemp("plots") / "report"
        result = compare(
            targets=["local"],
            profiles=["cloud-s3"],
            tiered=["cloud-s3+local-nvme"],
            workload=CompareWorkload(total_size="4MiB", object_size="1MiB", iterations=4),
            out=str(out),
            say=lambda _line: None,
        )
    finally:
        mp.undo()
    return out, result


def test_every_plot_shows_the_figures_of_the_table_beside_it(small_compare) -> None:
    """One model, one answer: each plot's figures (the report returns what each one drew)
    are the table's, figure for figure; the cost curve at the chosen interval is the table's
    lost cost; the tornado's middle is the table's answer."""
    out, result = small_compare
    plots = result["plots"]
    assert {"summary", "latency", "breakdown", "cost", "timeline", "tornado"} <= set(plots)
    proj = {p["name"]: p for p in result["projections"] if p.get("write_seconds")}
    local = proj["local"]
    assert local["write_seconds_low"] < local["write_seconds"] < local["write_seconds_high"]
    assert set(proj) == {"local", "cloud-s3", "cloud-s3+local-nvme"}
    for s in result["summary"]:
        drawn = plots["summary"][f"{s['label']} {s['point']}".strip()]
        for key in ("write_GBps", "read_GBps"):
            assert drawn[key] == s[key], (s["target"], key)
    for name, p in proj.items():
        for part in ("stall", "rework", "restart", "lost"):
            key = f"{part}_cost_per_day"
            assert plots["breakdown"][name][key] == p[key], (name, key)
        assert plots["cost"][name]["lost_cost_per_day"] == pytest.approx(
            p["lost_cost_per_day"], rel=1e-9
        ), name
        for key, value in plots["timeline"][name].items():
            assert value == p[key], (name, key)
        tornado = plots["tornado"][name]
        assert tornado["base"] == pytest.approx(p["lost_cost_per_day"], rel=1e-9)
        for row in result["sensitivity"][name]:
            assert tornado[f"{row['assumption']} low"] == row["low"]
            assert tornado[f"{row['assumption']} high"] == row["high"]
    # the table in the report shows the same figures, with the interval beside them
    from ckptio.report.tables import figure_text

    md = (out / "report.md").read_text()
    assert figure_text(local, "lost_cost_per_day", "money") in md
    assert " to " in figure_text(local, "stall_seconds", "s")


def test_the_report_writes_its_tables_as_parquet_with_units(small_compare) -> None:
    import pyarrow.parquet as pq

    out, result = small_compare
    proj = pq.read_table(out / "projections.parquet")
    rows = {r["name"]: r for r in proj.to_pylist()}
    assert rows["local"]["stall_seconds_low"] == result["projections"][0]["stall_seconds_low"]
    assert rows["cloud-s3"]["stall_seconds_low"] is None  # emulated: deterministic
    assert rows["cloud-s3"]["basis"].startswith("deterministic")
    units = {f.name: f.metadata[b"unit"].decode() for f in proj.schema}
    assert units["stall_seconds_high"] == "seconds"
    assert units["lost_cost_per_day"].startswith("price units per day")
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    assert any(r["write_seconds_low"] is not None for r in summary)
    assert pq.read_table(out / "sensitivity.parquet").num_rows >= 5


def test_two_compares_are_two_sessions_never_rounds_of_one(tmp_path, monkeypatch) -> None:
    """Each compare writes a directory of its own; a report of the folder of both shows each
    target once per session, labelled, and never averages one with the other. A compare
    asked to write where another one's results are refuses before it runs."""
    from ckptio import errors
    from ckptio.compare import CompareWorkload, compare

    monkeypatch.chdir(tmp_path)
    kw = dict(
        targets=["local"],
        profiles=[],
        tiered=[],
        workload=CompareWorkload(total_size="4MiB", object_size="1MiB", iterations=2),
        say=lambda _line: None,
    )
    first, second = compare(**kw), compare(**kw)
    assert first["session"] != second["session"]
    assert first["out"] != second["out"] and first["out"].startswith("ckptio-report")
    assert (tmp_path / first["out"] / "index.html").exists()
    with pytest.raises(errors.InvalidArgumentError, match="already holds the results"):
        compare(**kw, out=first["out"])
    from ckptio.report import build_report

    merged = build_report(["ckptio-report"], "merged")
    local = [s for s in merged["summary"] if s["target"].startswith("local")]
    assert len(local) == 2 and all(s["rounds"] <= 2 for s in local)
    assert len({s["session"] for s in local}) == 2
    assert all("UTC]" in s["target"] for s in local)
    assert (
        "2 separate sessions merged on purpose" in (tmp_path / "merged" / "report.md").read_text()
    )
