"""`ckptio report`: results from different machines/sites merge into one report."""

import json

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
